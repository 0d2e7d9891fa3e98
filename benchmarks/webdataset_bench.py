"""WebDataset shards read by prestage (Catalog.from_webdataset) against webdataset's own pipeline.

An ImageNet-like set made by `prestage synth` (`--images` JPEGs) is written into `--shards` WebDataset
shards by webdataset's ShardWriter (a `.jpg` and a `.cls` member per sample, pax headers as TarWriter
writes them). Both readers then decode every image and apply torchvision's RandomResizedCrop(224) +
horizontal flip (uint8 NHWC batches of 64), with the same number of threads or worker processes
(`--workers`), from the page cache (one warm-up epoch each first):

- prestage: `prestage.Loader(Catalog.from_webdataset(pattern), image_size=(224, 224),
  transform="random-resized-crop", readers=W)`: a global shuffle, libjpeg-turbo decoding only the
  crop's rows and columns;
- webdataset: `wds.WebDataset(pattern).shuffle(1000).decode("pil")`, the crop with Pillow (box
  resize, bilinear) as torchvision's RandomResizedCrop does it on a PIL image, `.batched(64)`, in a
  `torch.utils.data.DataLoader(num_workers=W)` (its shards split over the workers).

Also the catalog: seconds to scan the shards' headers. Medians over `--runs` epochs, the two readers
interleaved within a round. Prints a table and, with `--json`, writes the figures.

    python benchmarks/webdataset_bench.py --images 2000 --shards 10 --workers 2 --runs 3
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
from PIL import Image

import prestage

BATCH = 64
SIZE = 224


def write_shards(data: Path, out: Path, shards: int) -> str:
    import webdataset as wds

    catalog = prestage.Catalog.from_folder(data)
    per_shard = math.ceil(len(catalog) / shards)
    order = list(range(len(catalog)))
    random.Random(0).shuffle(order)  # shards of mixed classes, as sets are shipped
    with wds.ShardWriter(str(out / "train-%06d.tar"), maxcount=per_shard, verbose=0) as sink:
        for i in order:
            sink.write({"__key__": f"s{i:07d}", "jpg": catalog.source_path(i).read_bytes(),
                        "cls": str(catalog.label(i)).encode()})
    return str(out / f"train-{{000000..{shards - 1:06d}}}.tar")


def random_resized_crop(image: Image.Image, rng: random.Random) -> np.ndarray:
    """torchvision's RandomResizedCrop(224, scale=(0.08, 1), ratio=(3/4, 4/3)) + RandomHorizontalFlip on a
    PIL image (its get_params, then a bilinear resize of the box)."""
    width, height = image.size
    area = width * height
    box = None
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        aspect = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            x, y = rng.randint(0, width - w), rng.randint(0, height - h)
            box = (x, y, x + w, y + h)
            break
    if box is None:
        side = min(width, height)
        box = ((width - side) // 2, (height - side) // 2, (width + side) // 2, (height + side) // 2)
    out = image.convert("RGB").resize((SIZE, SIZE), Image.BILINEAR, box=box)
    if rng.random() < 0.5:
        out = out.transpose(Image.FLIP_LEFT_RIGHT)
    return np.asarray(out)


def webdataset_epoch(pattern: str, workers: int, epoch: int) -> int:
    import torch
    import webdataset as wds

    rng = random.Random(epoch)
    pipeline = (wds.WebDataset(pattern, shardshuffle=100, seed=epoch, empty_check=False)
                .shuffle(1000).decode("pil").to_tuple("jpg", "cls")
                .map_tuple(lambda im: random_resized_crop(im, rng), int).batched(BATCH))
    loader = torch.utils.data.DataLoader(pipeline, batch_size=None, num_workers=workers)
    images = 0
    for batch_images, _ in loader:
        assert batch_images.shape[1:] == (SIZE, SIZE, 3)
        images += len(batch_images)
    return images


def prestage_epoch(catalog: prestage.Catalog, workers: int, epoch: int) -> int:
    images = 0
    with prestage.Loader(catalog, batch_size=BATCH, image_size=(SIZE, SIZE), seed=epoch,
                         transform="random-resized-crop", readers=workers) as loader:
        for batch in loader:
            images += len(batch.labels)
    return images


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--shards", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="wds-bench-") as tmp:
        work = Path(tmp)
        subprocess.run([str(Path(sys.executable).parent / "prestage"), "synth", str(work / "data"),
                        "--images", str(args.images), "--classes", "10", "--quiet"], check=True)
        (work / "shards").mkdir()
        pattern = write_shards(work / "data", work / "shards", args.shards)
        scans = []
        for _ in range(args.runs):
            start = time.perf_counter()
            catalog = prestage.Catalog.from_webdataset(pattern)
            scans.append(time.perf_counter() - start)
        assert len(catalog) == args.images
        readers = {"prestage": lambda e: prestage_epoch(catalog, args.workers, e),
                   "webdataset": lambda e: webdataset_epoch(pattern, args.workers, e)}
        for read in readers.values():
            read(0)  # warm-up: the page cache, the worker start
        rates: Dict[str, List[float]] = {name: [] for name in readers}
        for run in range(1, args.runs + 1):
            for name, read in readers.items():
                start = time.perf_counter()
                images = read(run)
                rates[name].append(images / (time.perf_counter() - start))
                assert images == args.images, (name, images)
    result: Dict[str, Any] = {
        "images": args.images, "shards": args.shards, "workers": args.workers, "runs": args.runs,
        "catalog_scan_s": statistics.median(scans),
        "images_per_s": {name: statistics.median(r) for name, r in rates.items()},
        "all_images_per_s": rates,
    }
    result["ratio"] = result["images_per_s"]["prestage"] / result["images_per_s"]["webdataset"]
    print(f"catalog: {result['catalog_scan_s']:.3f} s to scan {args.shards} shards "
          f"({args.images} samples)")
    print("| reader | images/s (median of %d) | runs |" % args.runs)
    print("|---|---:|---|")
    for name, r in rates.items():
        print(f"| {name} | {statistics.median(r):,.0f} | {', '.join(f'{x:,.0f}' for x in r)} |")
    print(f"prestage / webdataset: {result['ratio']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
