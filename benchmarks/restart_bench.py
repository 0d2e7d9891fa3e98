"""Time to the first batch after a restart, with the node's stage directory warm against cold.

A first job runs epoch 0 of a `prestage synth` set behind the emulated PFS (every file staged: the
set fits the stage directory) and `--into` batches of epoch 1, saves its state and ends (preempted).
Then, `--runs` times each, in turn, the job restarts from that state:

- cold: an empty stage directory (the job requeued on another node);
- warm: the directory the first job left (index, copies, node table), the same bound (none);
- warm, smaller bound: the same directory with `cache_bytes` half the set, so the restart evicts
  first (the copies the resumed plan uses last).

Each restart starts from a fresh copy of the first job's directory (cold: none) with the page
cache of the directory and of the source dropped (posix_fadvise; the machine's other users keep
theirs), and times, from before the loader is made: the start-up (``Loader(...)`` and
``load_state_dict``: the directory's index read and its copies taken stock of), the first batch and
`--batches` batches; the PFS opens counted by the emulator until the loader is closed (its stage 2
runs `lookahead` batches ahead). Medians over the runs. The decode is the training path's:
``image_size=(224, 224)``.

    python benchmarks/restart_bench.py --images 2000 --runs 5 --json restart.json

Reproducible from the repository alone: the set is `prestage synth`'s (seed 0). Needs FUSE for the
emulator.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

import prestage
from prestage import synth
from prestage.bench import emulator
from prestage.bench.cache import make_cold

MODES = ("cold", "warm", "warm, half the room")


def restart(mode: str, catalog: prestage.Catalog, state: Dict[str, Any], stage: Path, left: Path,
            source: Path, pfs: emulator.PfsEmulator, args: argparse.Namespace,
            set_bytes: int) -> Dict[str, float]:
    shutil.rmtree(stage, ignore_errors=True)
    if mode != "cold":
        shutil.copytree(left, stage)
    cold = make_cold("fadvise", [stage, source])
    opens_before = pfs.stats()["ops"]["open"]
    start = time.perf_counter()
    loader = prestage.Loader(catalog, args.batch_size, image_size=(224, 224), seed=0, stage_dir=stage,
                             cache_bytes=set_bytes // 2 if mode.endswith("half the room") else 0,
                             readers=args.readers, prefetchers=args.prefetchers,
                             lookahead=args.lookahead, autotune=False, stage_patience=None)
    try:
        loader.load_state_dict(state)
        started = time.perf_counter()
        batches = iter(loader)
        batch = next(batches)
        first = time.perf_counter()
        del batch
        for _ in range(args.batches - 1):
            next(batches)
        done = time.perf_counter()
        stats = loader.stats(epochs="all")
    finally:
        loader.close()
    epoch = next(e for e in stats["epochs"] if e["epoch"] == state["epoch"])
    return {"startup_s": started - start, "first_batch_s": first - start, "batches_s": done - start,
            "pfs_opens": pfs.stats()["ops"]["open"] - opens_before, "hits": epoch["hits"], "cold": cold}


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--into", type=int, default=5, help="batches of epoch 1 the first job ran")
    p.add_argument("--batches", type=int, default=10, help="batches timed after the restart")
    p.add_argument("--readers", type=int, default=2)
    p.add_argument("--prefetchers", type=int, default=16)
    p.add_argument("--lookahead", type=int, default=4)
    p.add_argument("--latency-ms", type=float, default=2.0, help="the PFS's, per operation")
    p.add_argument("--bandwidth-mbs", type=float, default=200.0, help="the PFS's")
    p.add_argument("--work", type=Path, help="where the set and the stage directories go (a temporary "
                   "directory by default)")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if min(args.images, args.runs, args.batch_size, args.batches, args.readers, args.prefetchers,
           args.lookahead) < 1 or args.into < 0:
        p.error("counts must be >= 1 (--into >= 0)")
    reason = emulator.unavailable_reason(emulator.find_emulator())
    if reason is not None:
        print(f"restart_bench: the emulated PFS cannot be mounted here: {reason}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="restart-bench-", dir=args.work) as tmp:
        work = Path(tmp)
        source = work / "source"
        synth.make_synthetic_set(source, images=args.images, classes=10, seed=0, progress=False)
        set_bytes = sum(f.stat().st_size for f in source.rglob("*.jpg"))
        pfs = emulator.PfsEmulator(source, latency_ms=args.latency_ms, bandwidth_mbs=args.bandwidth_mbs)
        mount = pfs.start()
        try:
            catalog = prestage.Catalog.from_folder(mount)
            left = work / "left"  # the stage directory the first job leaves
            with prestage.Loader(catalog, args.batch_size, image_size=(224, 224), seed=0, stage_dir=left,
                                 cache_bytes=0, readers=args.readers, prefetchers=args.prefetchers,
                                 lookahead=args.lookahead, autotune=False, stage_patience=None) as first:
                for _ in first:
                    pass
                for n, _ in enumerate(first):
                    if n + 1 == args.into:
                        break
                state = first.state_dict()
            runs: Dict[str, List[Dict[str, float]]] = {mode: [] for mode in MODES}
            for run in range(args.runs):
                for mode in MODES:
                    runs[mode].append(restart(mode, catalog, state, work / "stage", left, source, pfs,
                                              args, set_bytes))
                print(f"run {run + 1}/{args.runs}: " + ", ".join(
                    f"{mode} {runs[mode][-1]['first_batch_s'] * 1e3:.0f} ms" for mode in MODES),
                    file=sys.stderr, flush=True)
        finally:
            pfs.stop()
    keys = ("startup_s", "first_batch_s", "batches_s", "pfs_opens", "hits")
    medians = {mode: {k: statistics.median(r[k] for r in runs[mode]) for k in keys} for mode in MODES}
    print(f"{args.images} images ({set_bytes / 1e6:.0f} MB), batch {args.batch_size}, restart {args.into} "
          f"batches into epoch 1; PFS {args.latency_ms:g} ms, {args.bandwidth_mbs:g} MB/s; medians of "
          f"{args.runs}")
    print(f"{'stage directory':<22}{'start-up':>10}{'1st batch':>11}{f'{args.batches} batches':>12}"
          f"{'PFS opens':>11}{'hits':>7}")
    for mode in MODES:
        m = medians[mode]
        print(f"{mode:<22}{m['startup_s'] * 1e3:>8.0f}ms{m['first_batch_s'] * 1e3:>9.0f}ms"
              f"{m['batches_s'] * 1e3:>10.0f}ms{m['pfs_opens']:>11.0f}{m['hits']:>7.0f}")
    if args.json is not None:
        args.json.write_text(json.dumps({
            "images": args.images, "set_bytes": set_bytes, "batch_size": args.batch_size,
            "into": args.into, "batches": args.batches, "latency_ms": args.latency_ms,
            "bandwidth_mbs": args.bandwidth_mbs, "readers": args.readers,
            "prefetchers": args.prefetchers, "lookahead": args.lookahead,
            "machine": platform.machine(), "medians": medians, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
