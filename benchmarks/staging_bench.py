"""A user's own Dataset with and without prestage's staging, on the emulated PFS.

torchvision's `ImageFolder` with a `transforms.v2` pipeline (decode, RandomResizedCrop(224), flip, to
float), in a `torch.utils.data.DataLoader` with `--workers` worker processes, reads a `prestage synth`
set behind `prestage-pfs` (`--latency-ms` per operation):

- `direct`: the DataLoader reads the PFS itself (its own shuffling sampler);
- `staged`: the same dataset object through `prestage.torch.StagedDataset(dataset=...)` and a
  `StagedSampler` (16 prefetchers staging to a local directory ahead of the workers): the workers
  open the staged copies, or the PFS for a sample not staged in time.

Same workers, batch size and transforms; each run a fresh stage directory; `--epochs` epochs each;
rounds interleaved, medians of `--runs`. Needs torchvision (`scripts/bench-setup.sh`).

    python benchmarks/staging_bench.py --images 2000 --workers 2 --epochs 2 --runs 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import torch
import torch.utils.data
from torchvision import datasets
from torchvision.transforms import v2

import prestage
import prestage.torch
from prestage.bench.emulator import PfsEmulator
from prestage.synth import make_synthetic_set


def pipeline() -> v2.Compose:
    return v2.Compose([v2.PILToTensor(), v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip(),
                       v2.ToDtype(torch.float32, scale=True)])


def run(mode: str, root: Path, stage_root: Path, args: argparse.Namespace) -> List[float]:
    folder = datasets.ImageFolder(root, transform=pipeline())
    rates = []
    if mode == "direct":
        loader = torch.utils.data.DataLoader(folder, batch_size=args.batch, shuffle=True,
                                             num_workers=args.workers)
        for _ in range(args.epochs):
            start = time.perf_counter()
            n = sum(len(labels) for _, labels in loader)
            rates.append(n / (time.perf_counter() - start))
        return rates
    catalog = prestage.torch.catalog_of(folder)
    with prestage.torch.StagedSampler(catalog, batch_size=args.batch, stage_dir=tempfile.mkdtemp(dir=stage_root),
                                      num_workers=args.workers, prefetchers=args.prefetchers) as sampler:
        loader = sampler.data_loader(prestage.torch.StagedDataset(sampler, dataset=folder))
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            start = time.perf_counter()
            n = sum(len(labels) for _, labels in loader)
            rates.append(n / (time.perf_counter() - start))
        stats = sampler.stats()
    print(f"  staged: workers read {stats['worker_staged']} staged copies, {stats['worker_source']} from the "
          f"PFS", file=sys.stderr)
    return rates


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prefetchers", type=int, default=16)
    parser.add_argument("--latency-ms", type=float, default=2.0)
    parser.add_argument("--work", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    work = Path(args.work or tempfile.mkdtemp(prefix="staging-bench-"))
    source = work / "set"
    if not source.exists():
        make_synthetic_set(source, images=args.images, classes=10, progress=False)
    (source / "SYNTH.json").unlink(missing_ok=True)  # ImageFolder wants class folders only
    stage_root = work / "stage"
    stage_root.mkdir(exist_ok=True)
    results: Dict[str, List[List[float]]] = {"direct": [], "staged": []}
    with PfsEmulator(source, latency_ms=args.latency_ms, bandwidth_mbs=0, max_ops=0) as pfs:
        assert pfs.mountpoint is not None
        for r in range(args.runs):
            for mode in ("direct", "staged") if r % 2 == 0 else ("staged", "direct"):
                results[mode].append(run(mode, pfs.mountpoint, stage_root, args))
                print(f"run {r + 1}/{args.runs} {mode}: " + ", ".join(f"{x:.0f}" for x in results[mode][-1]),
                      file=sys.stderr)
    print(f"\n{args.images} images, {args.workers} workers, batch {args.batch}, PFS {args.latency_ms} ms per "
          f"operation; images/s, medians of {args.runs} runs\n")
    print("| epoch | DataLoader + ImageFolder on the PFS | the same through prestage's staging | ratio |")
    print("|---|---:|---:|---:|")
    for e in range(args.epochs):
        direct = statistics.median(r[e] for r in results["direct"])
        staged = statistics.median(r[e] for r in results["staged"])
        print(f"| {e + 1} | {direct:,.0f} | {staged:,.0f} | {staged / direct:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
