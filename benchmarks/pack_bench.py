"""Small files loose against packed (`prestage pack`), on the emulated PFS.

A set of `--files` small `.npy` arrays (32x32x3 uint8 by default: CIFAR-sized samples, about 3 KB each,
where the cost per file, not per byte, dominates) is written once, then packed into shards with
`prestage.pack.pack`. Both lie under one `prestage-pfs` mount (`--latency-ms` per operation, as a
loaded metadata server answers). For each layout, in one run, with the same loader options:

- catalog: building the catalog over the PFS (`Catalog.from_folder` walks the tree; `from_shards`
  reads the index): seconds and PFS operations;
- epochs 1..E with a stage directory on local disk (`stage`): epoch 1 stages the set (loose: a copy per
  file; packed: a copy per shard), later epochs are served from it;
- one epoch without one (`direct`): every sample is read from the PFS (each epoch alike).

Per epoch: the PFS's opens, metadata operations (open + getattr + readdir, as the emulator counts them)
and reads, and samples/s. Medians over `--runs` rounds, layouts interleaved within a round.

    python benchmarks/pack_bench.py --files 20000 --runs 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

import numpy as np

import prestage
from prestage import pack as packing
from prestage.bench.emulator import PfsEmulator

METADATA_OPS = ("open", "getattr", "readdir")


def write_set(root: Path, files: int, classes: int, shape: tuple) -> None:
    rng = np.random.default_rng(0)
    for i in range(files):
        folder = root / f"class_{i % classes:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / f"sample_{i:07d}.npy", rng.integers(0, 256, shape, dtype=np.uint8))


def ops(pfs: PfsEmulator) -> Dict[str, int]:
    return dict(pfs.stats()["ops"])


def delta(after: Dict[str, int], before: Dict[str, int]) -> Dict[str, int]:
    d = {k: after[k] - before.get(k, 0) for k in after}
    return {"opens": d["open"], "metadata": sum(d[k] for k in METADATA_OPS), "reads": d["read"]}


def run_layout(pfs: PfsEmulator, layout: str, stage_root: Path, args: argparse.Namespace) -> Dict[str, Any]:
    mount = pfs.mountpoint
    assert mount is not None
    before = ops(pfs)
    start = time.perf_counter()
    catalog = (prestage.Catalog.from_folder(mount / "loose", [".npy"]) if layout == "loose"
               else prestage.Catalog.from_shards(mount / "packed"))
    result: Dict[str, Any] = {"catalog": dict(delta(ops(pfs), before),
                                              seconds=time.perf_counter() - start)}
    for mode in ("stage", "direct"):
        stage_dir = tempfile.mkdtemp(dir=stage_root) if mode == "stage" else None
        epochs: List[Dict[str, Any]] = []
        with prestage.Loader(catalog, batch_size=args.batch, decode="npy", stage_dir=stage_dir,
                             prefetchers=args.prefetchers, readers=args.readers, seed=0) as loader:
            for epoch in range(args.epochs if mode == "stage" else 1):
                loader.set_epoch(epoch)
                before = ops(pfs)
                start = time.perf_counter()
                samples = sum(len(batch.labels) for batch in loader)
                seconds = time.perf_counter() - start
                epochs.append(dict(delta(ops(pfs), before), samples_per_s=samples / seconds))
        result[mode] = epochs
    return result


def median_of(runs: List[Dict[str, Any]], path: List[Any]) -> float:
    values = []
    for run in runs:
        v: Any = run
        for key in path:
            v = v[key]
        values.append(v)
    return statistics.median(values)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=20000)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--shard-size", type=int, default=16 << 20, help="bytes (default: 16 MiB)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--prefetchers", type=int, default=16)
    parser.add_argument("--readers", type=int, default=8)
    parser.add_argument("--latency-ms", type=float, default=2.0)
    parser.add_argument("--work", default=None, help="folder for the set and the stage directories")
    parser.add_argument("--json", default=None, help="also write the raw figures here")
    args = parser.parse_args()

    work = Path(args.work or tempfile.mkdtemp(prefix="pack-bench-"))
    source = work / "pfs"
    if not (source / "loose").exists():
        print(f"writing {args.files} files ...", file=sys.stderr)
        write_set(source / "loose.part", args.files, args.classes, (32, 32, 3))
        (source / "loose.part").rename(source / "loose")
    summary = packing.pack(source / "loose", source / "packed", shard_bytes=args.shard_size, workers=8)
    print(f"packed {summary['samples']} files into {summary['shards']} shards", file=sys.stderr)
    stage_root = work / "stage"
    stage_root.mkdir(exist_ok=True)
    runs: Dict[str, List[Dict[str, Any]]] = {"loose": [], "packed": []}
    with PfsEmulator(source, latency_ms=args.latency_ms, bandwidth_mbs=0, max_ops=0) as pfs:
        for r in range(args.runs):
            for layout in ("loose", "packed") if r % 2 == 0 else ("packed", "loose"):
                runs[layout].append(run_layout(pfs, layout, stage_root, args))
                print(f"run {r + 1}/{args.runs} {layout} done", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))

    print(f"\n{args.files} files of 32x32x3 uint8 .npy, {summary['shards']} shards; PFS latency "
          f"{args.latency_ms} ms per operation; medians of {args.runs} runs\n")
    print("| layout | what | PFS opens | PFS metadata ops | PFS reads | samples/s |")
    print("|---|---|---:|---:|---:|---:|")
    for layout in ("loose", "packed"):
        r = runs[layout]
        print(f"| {layout} | catalog ({median_of(r, ['catalog', 'seconds']):.2f} s) | "
              f"{median_of(r, ['catalog', 'opens']):,.0f} | {median_of(r, ['catalog', 'metadata']):,.0f} | "
              f"{median_of(r, ['catalog', 'reads']):,.0f} | |")
        for mode in ("stage", "direct"):
            for e in range(args.epochs if mode == "stage" else 1):
                p = [mode, e]
                print(f"| {layout} | {mode}, epoch {e + 1} | {median_of(r, p + ['opens']):,.0f} | "
                      f"{median_of(r, p + ['metadata']):,.0f} | {median_of(r, p + ['reads']):,.0f} | "
                      f"{median_of(r, p + ['samples_per_s']):,.0f} |")
    columns = [("stage", e) for e in range(args.epochs)] + [("direct", 0)]
    print("\n| ratio packed / loose | " + " | ".join(f"{m}, epoch {e + 1}" for m, e in columns) + " |")
    print("|---|" + "---:|" * len(columns))
    print("| samples/s | " + " | ".join(
        f"{median_of(runs['packed'], [m, e, 'samples_per_s']) / median_of(runs['loose'], [m, e, 'samples_per_s']):.2f}x"
        for m, e in columns) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
