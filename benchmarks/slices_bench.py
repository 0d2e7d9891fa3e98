"""Samples inside array files: prestage.Loader over ``Catalog.from_arrays`` against a NumPy reader of the
same samples, for samples along the first axis and along the last (DLIO's npz layout), in the same run.

The set: ``--files`` .npz archives (np.savez: stored members), each ``x`` holding ``--per-file`` uint8
samples of ``--shape`` and ``y`` one label per sample. The NumPy reader is what a map-style dataset
does per sample: ``np.load(path)["x"]`` and ``np.take`` of the sample, one process, no stage directory
(as prestage here); it reads the whole member for each sample. prestage reads only the slice (along
axis 0 one read, along the last axis the span the slice covers, i.e. the member). Each round times one
epoch of each of the four in turn (the order rotates); figures are medians of ``--runs`` rounds after a
warm-up round, with the files in the page cache.

    python benchmarks/slices_bench.py --files 32 --per-file 64 --shape 128,128 --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List

import numpy as np

import prestage


def write_set(root: Path, files: int, per_file: int, shape: List[int], axis: int) -> List[Path]:
    rng = np.random.default_rng(0)
    root.mkdir(parents=True)
    paths = []
    for f in range(files):
        x = rng.integers(0, 255, size=(per_file, *shape), dtype=np.uint8)
        if axis == -1:
            x = np.ascontiguousarray(np.moveaxis(x, 0, -1))
        path = root / f"{f:05d}.npz"
        np.savez(path, x=x, y=rng.integers(0, 1000, size=per_file))
        paths.append(path)
    return paths


def epoch_prestage(catalog: prestage.Catalog, batch_size: int, readers: int) -> int:
    samples = 0
    with prestage.Loader(catalog, batch_size=batch_size, readers=readers, seed=1) as loader:
        for batch in loader:
            samples += len(batch.labels)
            del batch
    return samples


def epoch_numpy(catalog: prestage.Catalog, axis: int, batch_size: int) -> int:
    """The same samples in a seeded random order, each loaded as a map-style dataset does."""
    order = np.random.default_rng(1).permutation(len(catalog))
    samples = 0
    for start in range(0, len(order), batch_size):
        batch = []
        for i in order[start:start + batch_size]:
            file, index, _ = catalog.locator(int(i))
            with np.load(catalog.source_path(int(i))) as archive:
                batch.append(np.take(archive["x"], index, axis=axis))
        np.stack(batch)
        samples += len(batch)
    return samples


def timed(run: Callable[[], int]) -> float:
    start = time.perf_counter()
    samples = run()
    return samples / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", type=int, default=32)
    p.add_argument("--per-file", type=int, default=64)
    p.add_argument("--shape", default="128,128", help="each sample's shape, comma-separated (uint8)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--readers", type=int, default=2)
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    shape = [int(v) for v in args.shape.split(",")]
    with tempfile.TemporaryDirectory(prefix="prestage-slices-bench-") as tmp:
        cases: Dict[str, Callable[[], int]] = {}
        for name, axis in (("first", 0), ("last", -1)):
            paths = write_set(Path(tmp) / name, args.files, args.per_file, shape, axis)
            catalog = prestage.Catalog.from_arrays(paths, axis=axis, member="x", labels="y")
            cases[f"prestage_{name}"] = (lambda c=catalog: epoch_prestage(c, args.batch_size, args.readers))
            cases[f"numpy_{name}"] = (lambda c=catalog, a=axis: epoch_numpy(c, a, args.batch_size))
        runs: Dict[str, List[float]] = {k: [] for k in cases}
        names = list(cases)
        for r in range(args.runs + 1):  # round 0 warms the page cache up
            for k in names[r % len(names):] + names[:r % len(names)]:
                rate = timed(cases[k])
                if r > 0:
                    runs[k].append(rate)
    median = {k: statistics.median(v) for k, v in runs.items()}
    print(json.dumps({
        "files": args.files, "per_file": args.per_file, "shape": shape, "batch_size": args.batch_size,
        "readers": args.readers, "runs": args.runs,
        "samples_per_s": {k: round(v) for k, v in median.items()},
        "prestage_over_numpy": {n: round(median[f"prestage_{n}"] / median[f"numpy_{n}"], 2)
                                for n in ("first", "last")},
        "prestage_last_over_first": round(median["prestage_last"] / median["prestage_first"], 3),
        "all_runs": {k: [round(x) for x in v] for k, v in runs.items()},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__},
    }, indent=1))


if __name__ == "__main__":
    main()
