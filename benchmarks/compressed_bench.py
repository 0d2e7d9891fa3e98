"""A WebDataset set in `.tar.gz` shards, staged decompressed, against the same set in plain `.tar`
shards, on the emulated PFS.

The same `--images` JPEGs (`--size` px, random content) are written by webdataset's ShardWriter into
`--shards` plain shards and into as many gzip shards (ShardWriter with a `.tar.gz` pattern), both under
one `prestage-pfs` mount (`--latency-ms` per operation, `--bandwidth-mbs`). For each layout, in one run,
with the same loader options, a fresh stage directory on local disk: the catalog's build over the PFS
(the plain shards' header scan, the gzip shards' two streaming passes), then the first epoch (stage 2
copies each shard once, the gzip ones decompressed as they are read; stage 3 decodes from the copies).
Reported per layout: bytes on the PFS, catalog seconds, first-epoch seconds and images/s, and the
ratio of the gzip set's first epoch to the plain set's within each run. Medians over `--runs` rounds,
layouts alternating first.

    python benchmarks/compressed_bench.py --images 20000 --shards 20 --runs 3
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
from PIL import Image

import prestage
from prestage.bench.emulator import PfsEmulator


def write_sets(root: Path, images: int, shards: int, size: int) -> None:
    import webdataset as wds  # a test extra: only this benchmark's set writer needs it

    per_shard = -(-images // shards)
    rng = np.random.default_rng(0)
    for layout, suffix in (("plain", ".tar"), ("gz", ".tar.gz")):
        (root / layout).mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(root / "plain" / "train-%06d.tar"), maxcount=per_shard, verbose=0) as plain, \
            wds.ShardWriter(str(root / "gz" / "train-%06d.tar.gz"), maxcount=per_shard, verbose=0) as gz:
        for i in range(images):
            small = rng.integers(0, 256, (size // 8, size // 8, 3), dtype=np.uint8)
            out = io.BytesIO()
            Image.fromarray(small).resize((size, size), Image.BICUBIC).save(out, format="JPEG", quality=90)
            sample = {"__key__": f"s{i:07d}", "jpg": out.getvalue(), "cls": str(i % 1000).encode()}
            plain.write(sample)
            gz.write(sample)


def run_layout(pfs: PfsEmulator, layout: str, stage_root: Path, args: argparse.Namespace) -> Dict[str, Any]:
    mount = pfs.mountpoint
    assert mount is not None
    suffix = ".tar" if layout == "plain" else ".tar.gz"
    start = time.perf_counter()
    catalog = prestage.Catalog.from_webdataset(str(mount / layout / f"train-*{suffix}"))
    catalog_s = time.perf_counter() - start
    stage_dir = tempfile.mkdtemp(dir=stage_root)
    with prestage.Loader(catalog, batch_size=args.batch, decode="jpeg", image_size=(args.size, args.size),
                         stage_dir=stage_dir, prefetchers=args.prefetchers, readers=args.readers,
                         seed=0) as loader:
        start = time.perf_counter()
        images = sum(len(batch.labels) for batch in loader)
        epoch_s = time.perf_counter() - start
        stats = loader.stats()
    return {"catalog_s": catalog_s, "epoch_s": epoch_s, "images_per_s": images / epoch_s,
            "images": images, "source_reads": stats["source_reads"],
            "staged_bytes": int(sum(catalog.file_sizes()))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--shards", type=int, default=10)
    parser.add_argument("--size", type=int, default=128, help="image side, px")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--prefetchers", type=int, default=4)
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--latency-ms", type=float, default=2.0)
    parser.add_argument("--bandwidth-mbs", type=float, default=200.0)
    parser.add_argument("--work", default=None, help="folder for the sets and the stage directories")
    parser.add_argument("--json", default=None, help="also write the raw figures here")
    args = parser.parse_args()

    work = Path(args.work or tempfile.mkdtemp(prefix="compressed-bench-"))
    source = work / "pfs"
    if not (source / "gz").exists():
        print(f"writing {args.images} images in {args.shards} shards, plain and gzip ...", file=sys.stderr)
        write_sets(source, args.images, args.shards, args.size)
    on_pfs = {layout: sum(p.stat().st_size for p in (source / layout).iterdir()) for layout in ("plain", "gz")}
    stage_root = work / "stage"
    stage_root.mkdir(exist_ok=True)
    runs: Dict[str, List[Dict[str, Any]]] = {"plain": [], "gz": []}
    ratios: List[float] = []
    with PfsEmulator(source, latency_ms=args.latency_ms, bandwidth_mbs=args.bandwidth_mbs, max_ops=0) as pfs:
        for r in range(args.runs):
            order = ("plain", "gz") if r % 2 == 0 else ("gz", "plain")
            for layout in order:
                runs[layout].append(run_layout(pfs, layout, stage_root, args))
            ratios.append(runs["gz"][-1]["epoch_s"] / runs["plain"][-1]["epoch_s"])
            print(f"run {r + 1}/{args.runs} done", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs, "ratios": ratios, "on_pfs": on_pfs}, indent=1))

    def med(layout: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[layout])

    print(f"\n{args.images} JPEGs of {args.size}x{args.size} px in {args.shards} shards; emulated PFS "
          f"{args.latency_ms} ms, {args.bandwidth_mbs:g} MB/s; batch {args.batch}, prefetchers "
          f"{args.prefetchers}, readers {args.readers}; medians of {args.runs} runs\n")
    print("| shards | bytes on the PFS | bytes staged | catalog s | first epoch s | images/s | PFS reads |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for layout, name in (("plain", ".tar"), ("gz", ".tar.gz, staged decompressed")):
        print(f"| {name} | {on_pfs[layout]:,} | {int(med(layout, 'staged_bytes')):,} | "
              f"{med(layout, 'catalog_s'):.2f} | {med(layout, 'epoch_s'):.2f} | "
              f"{med(layout, 'images_per_s'):,.0f} | {med(layout, 'source_reads'):.0f} |")
    print(f"\nfirst epoch, .tar.gz / .tar (per run, then median): "
          f"{', '.join(f'{x:.2f}' for x in ratios)}; median {statistics.median(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
