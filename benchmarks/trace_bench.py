"""What the I/O trace costs: samples/s with `trace=` on against off, in one process, runs alternating.

Two cases: the training path (`prestage synth` JPEGs, RandomResizedCrop(224), 2 readers), where a read
is small next to its decode; and the worst case for the trace, small raw files served from the page
cache, where a read costs a few microseconds and the trace's two clock reads and its append are
the largest share they can be. Wall-clock rates and the process's CPU time per sample are both
given: on a shared machine the CPU time is the steadier of the two. Each run is 3 epochs (JPEG) or 20 (raw) in one loader; medians of `--runs` pairs of runs; the
ratio is on/off.

    python benchmarks/trace_bench.py --images 2000 --raw-files 20000 --runs 9
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
from prestage.synth import make_synthetic_set


def epoch_rate(catalog: prestage.Catalog, trace: Path | None, epochs: int, **options) -> tuple:
    """(samples per second of wall time, CPU microseconds of the process per sample)."""
    with prestage.Loader(catalog, trace=trace, **options) as loader:
        start, start_cpu = time.perf_counter(), time.process_time()
        samples = 0
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            samples += sum(len(batch.labels) for batch in loader)
        return samples / (time.perf_counter() - start), (time.process_time() - start_cpu) / samples * 1e6


def compare(name: str, catalog: prestage.Catalog, work: Path, runs: int, epochs: int, **options) -> None:
    epoch_rate(catalog, None, 1, **options)  # warm the page cache
    off, on = [], []
    for r in range(runs):
        first_on = r % 2 == 1
        for traced in (first_on, not first_on):
            rate = epoch_rate(catalog, work / "run.trace" if traced else None, epochs, **options)
            (on if traced else off).append(rate)
    rate_off, rate_on = (statistics.median(r[0] for r in runs_) for runs_ in (off, on))
    cpu_off, cpu_on = (statistics.median(r[1] for r in runs_) for runs_ in (off, on))
    print(f"| {name} | {rate_off:,.0f} | {rate_on:,.0f} | {rate_on / rate_off:.3f} | {cpu_off:.2f} | "
          f"{cpu_on:.2f} | {cpu_on / cpu_off:.3f} |")


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
    print("| case | samples/s, no trace | samples/s, trace | ratio | CPU µs/sample, no trace | "
          "CPU µs/sample, trace | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    compare(f"JPEG RandomResizedCrop(224), {args.images} images, 2 readers",
            prestage.Catalog.from_folder(work / "jpeg"), work, args.runs, 3, batch_size=64,
            image_size=(224, 224), transform="random-resized-crop", readers=2)
    compare(f"raw 256-byte files, {args.raw_files}, page cache, 2 readers",
            prestage.Catalog.from_folder(raw, []), work, args.runs, 20, batch_size=256, decode="raw",
            readers=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
