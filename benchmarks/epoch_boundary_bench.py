"""What the pipeline did ahead across an epoch boundary: kept or thrown away, per training loop.

A job of several short epochs reads a set straight from the PFS emulator (no stage directory, so
every epoch reads every sample from the source), with a training step of `--step-ms` per batch, so
that the pipeline runs on into the next epoch while the last batches of one are used. Three loops:

- ``full``: ``set_epoch(e)``, then the whole iteration (to its StopIteration);
- ``steps``: ``len(loader)`` steps (``itertools.islice``), no ``set_epoch()``;
- ``early``: ``set_epoch(e)``, then ``len(loader) - --early`` steps (a loop leaving each epoch a few
  batches before its end).

Reported per loop, medians over `--runs` jobs: the time per epoch (epochs after the first), the
reads the emulator served per epoch and the loader's source reads, against one read per sample used.

    python benchmarks/epoch_boundary_bench.py --images 400 --epochs 5 --runs 5 --json out.json

Reproducible from the repository alone: the set is `prestage synth`'s (seed 0).
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import prestage
from prestage import synth
from prestage.bench import emulator


def opens(pfs) -> int:
    """Files the emulator has opened so far: one per sample read (one file per sample here)."""
    return sum(p["opens"] for p in pfs.stats()["paths"].values())


def run_job(catalog, loop: str, args) -> dict:
    options = dict(batch_size=args.batch_size, image_size=(64, 64), readers=args.readers,
                   lookahead=args.lookahead, depth=args.depth, autotune=False, seed=1)
    epoch_s, used, orders = [], 0, []
    with prestage.Loader(catalog, **options) as loader:
        steps = len(loader) - (args.early if loop == "early" else 0)
        for e in range(args.epochs):
            if loop != "steps":
                loader.set_epoch(e)
            batches = iter(loader) if loop == "full" else itertools.islice(loader, steps)
            start = time.perf_counter()
            first = None
            for batch in batches:
                used += len(batch.indices)
                if first is None:
                    first = batch.indices.tolist()
                del batch
                time.sleep(args.step_ms / 1e3)
            epoch_s.append(time.perf_counter() - start)
            orders.append(first)
    stats = loader.stats()
    return {"epoch_s": epoch_s, "source_reads": stats["source_reads"], "samples_used": used,
            "distinct_epoch_orders": len({tuple(o) for o in orders})}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--lookahead", type=int, default=4)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--step-ms", type=float, default=20.0, help="training step per batch")
    parser.add_argument("--early", type=int, default=3, help="batches the early loop leaves")
    parser.add_argument("--latency-ms", type=float, default=5.0)
    parser.add_argument("--bandwidth-mbs", type=float, default=100.0)
    parser.add_argument("--loops", nargs="+", default=["full", "steps", "early"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="prestage-boundary-"))
    try:
        source = work / "set"
        synth.make_synthetic_set(source, images=args.images, classes=10, seed=0)
        reason = emulator.unavailable_reason(emulator.find_emulator())
        if reason is not None:
            raise SystemExit(f"needs the PFS emulator: {reason}")
        results = {}
        with emulator.PfsEmulator(source, latency_ms=args.latency_ms,
                                  bandwidth_mbs=args.bandwidth_mbs, max_ops=16) as pfs:
            catalog = prestage.Catalog.from_folder(pfs.mountpoint)
            for loop in args.loops:
                runs = []
                for _ in range(args.runs):
                    before = opens(pfs)
                    job = run_job(catalog, loop, args)
                    job["pfs_reads"] = opens(pfs) - before
                    runs.append(job)
                epochs = args.epochs
                row = {
                    "epoch_s": statistics.median(statistics.median(r["epoch_s"][1:]) for r in runs),
                    "pfs_reads_per_epoch": statistics.median(r["pfs_reads"] for r in runs) / epochs,
                    "source_reads_per_epoch": statistics.median(r["source_reads"] for r in runs) / epochs,
                    "samples_used_per_epoch": runs[0]["samples_used"] / epochs,
                    "distinct_epoch_orders": runs[0]["distinct_epoch_orders"],
                    "runs": runs,
                }
                results[loop] = row
                print(f"{loop:6s} epoch {row['epoch_s']:.3f} s  PFS reads/epoch "
                      f"{row['pfs_reads_per_epoch']:.1f}  loader source reads/epoch "
                      f"{row['source_reads_per_epoch']:.1f}  samples used/epoch "
                      f"{row['samples_used_per_epoch']:.0f}  distinct orders "
                      f"{row['distinct_epoch_orders']}/{epochs}")
        if args.json:
            args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)},
                                             "machine": platform.node(), "results": results},
                                            indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
