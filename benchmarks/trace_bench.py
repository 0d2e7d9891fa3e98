"""What the I/O trace costs: samples/s with `trace=` on against off, in one process, runs alternating.

Two cases: the training path (`prestage synth` JPEGs, RandomResizedCrop(224), 2 readers), where a read
is small next to its decode; and the worst case for the trace, small raw files served from the page
cache, where a read costs a few microseconds and the trace's two clock reads and its append are
the largest share they can be. Medians of `--runs` pairs of epochs; the ratio is on/off.

    python benchmarks/trace_bench.py --images 2000 --raw-files 20000 --runs 7
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import prestage
from prestage.cli.synth import make_synthetic_set


def epoch_rate(catalog: prestage.Catalog, trace: Path | None, **options) -> float:
    with prestage.Loader(catalog, trace=trace, **options) as loader:
        start = time.perf_counter()
        samples = sum(len(batch.labels) for batch in loader)
        return samples / (time.perf_counter() - start)


def compare(name: str, catalog: prestage.Catalog, work: Path, runs: int, **options) -> None:
    epoch_rate(catalog, None, **options)  # warm the page cache
    off, on = [], []
    for r in range(runs):
        first_on = r % 2 == 1
        for traced in (first_on, not first_on):
            rate = epoch_rate(catalog, work / "run.trace" if traced else None, **options)
            (on if traced else off).append(rate)
    ratio = statistics.median(on) / statistics.median(off)
    print(f"| {name} | {statistics.median(off):,.0f} | {statistics.median(on):,.0f} | {ratio:.3f} "
          f"| {100 * (1 - ratio):+.1f}% |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--raw-files", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--work", default=None)
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="trace-bench-"))
    if not (work / "jpeg").exists():
        make_synthetic_set(work / "jpeg", images=args.images, classes=10, progress=False)
    raw = work / "raw"
    if not raw.exists():
        rng = np.random.default_rng(0)
        for i in range(args.raw_files):
            folder = raw / f"c{i % 10}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"s{i:07d}.bin").write_bytes(rng.bytes(256))
    print(f"medians of {args.runs} runs each, trace off and on alternating\n")
    print("| case | samples/s, no trace | samples/s, trace | ratio | cost |")
    print("|---|---:|---:|---:|---:|")
    compare(f"JPEG RandomResizedCrop(224), {args.images} images, 2 readers",
            prestage.Catalog.from_folder(work / "jpeg"), work, args.runs, batch_size=64,
            image_size=(224, 224), transform="random-resized-crop", readers=2)
    compare(f"raw 256-byte files, {args.raw_files}, page cache, 2 readers",
            prestage.Catalog.from_folder(raw, []), work, args.runs, batch_size=256, decode="raw", readers=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
