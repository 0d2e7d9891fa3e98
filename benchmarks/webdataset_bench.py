"""WebDataset shards over an emulated parallel file system: prestage (Catalog.from_webdataset, a stage
directory on local disk) against webdataset's own ``WebDataset`` pipeline and against wids.

The set: ``--images`` small JPEGs (cut from ``prestage synth``'s photos: a random crop of one of 500
of them, its long side 160 to 320 px, quality 85, about 10-20 KB) written by webdataset's
``ShardWriter`` into ``--shards`` shards (a ``.jpg`` and a ``.cls`` member per sample, pax headers as
TarWriter writes them). The shards are served by ``prestage-pfs`` at ``--latency-ms`` per operation
and ``--bandwidth-mbs`` (2 ms, 200 MB/s; every open drops the kernel's cached pages, so each epoch
reads the emulated PFS). Every reader decodes every image and applies a RandomResizedCrop(224) +
horizontal flip into uint8 NHWC batches of 64, with ``--workers`` threads or worker processes:

- prestage: ``Catalog.from_webdataset`` (scanned over the PFS once, and saved: its time and opens are
  reported apart), ``prestage.Loader(..., transform="random-resized-crop", readers=W,
  stage_dir=<new folder on local disk>)``: a global shuffle; stage 2 copies each shard whole, and
  stage 3 waits for the copies (each shard is read from the PFS once: a catalog of shards waits for
  its copies whatever ``stage_patience`` says); libjpeg-turbo decodes only the crop's rows and
  columns;
- webdataset: ``wds.WebDataset(pattern, shardshuffle=100).shuffle(1000).decode("pil")`` over the
  mount, the crop with Pillow (box resize, bilinear) as torchvision does it on a PIL image,
  ``.batched(64)``, in a ``torch.utils.data.DataLoader(num_workers=W)`` (shards split over the workers);
- wids: ``wids.ShardListDataset`` (the package ``wids``, split out of webdataset, which no longer ships
  it) over the mount, with a new cache folder on local disk (it copies each shard there whole, then
  maps it), ``wids.ChunkedSampler`` (its documented sampler: shuffles within chunks of 2,000 samples),
  the same Pillow decode and crop, ``DataLoader(batch_size=64, num_workers=W)``.

Each epoch is a new job: a new stage directory or cache folder, the kernel's cached names expired.
Per epoch: images/s, and the opens (and bytes) the emulated PFS served. Medians over ``--runs``
epochs, the readers interleaved within a round; the load average beside each run. Prints a table and,
with ``--json``, writes the figures.

    python benchmarks/webdataset_bench.py --images 50000 --shards 50 --workers 2 --runs 3

Needs torch, webdataset and wids (``pip install webdataset wids``; ``--readers prestage,webdataset``
leaves wids out) and FUSE for the emulator. About 12 minutes on 2 cores at 50,000 images.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import numpy as np
from PIL import Image

import prestage
from prestage.bench.emulator import PfsEmulator

BATCH = 64
SIZE = 224
BASES = 500


def write_shards(work: Path, images: int, shards: int) -> Tuple[List[str], List[int]]:
    """The set's shards (paths under work/shards) and their sample counts."""
    import webdataset as wds

    subprocess.run([str(Path(sys.executable).parent / "prestage"), "synth", str(work / "photos"),
                    "--images", str(BASES), "--classes", "10", "--quiet"], check=True)
    photos = prestage.Catalog.from_folder(work / "photos")
    bases = []
    for i in range(len(photos)):
        with Image.open(photos.source_path(i)) as im:
            bases.append((im.convert("RGB"), photos.label(i)))
    rng = random.Random(0)
    per_shard = math.ceil(images / shards)
    (work / "shards").mkdir()
    with wds.ShardWriter(str(work / "shards" / "train-%06d.tar"), maxcount=per_shard, verbose=0) as sink:
        for i in range(images):
            base, label = bases[rng.randrange(len(bases))]
            width, height = base.size
            w, h = int(width * rng.uniform(0.5, 1)), int(height * rng.uniform(0.5, 1))
            x, y = rng.randrange(width - w + 1), rng.randrange(height - h + 1)
            side = rng.randint(160, 320)
            scale = side / max(w, h)
            small = base.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.BILINEAR,
                                box=(x, y, x + w, y + h))
            out = io.BytesIO()
            small.save(out, format="JPEG", quality=85)
            sink.write({"__key__": f"s{i:07d}", "jpg": out.getvalue(), "cls": str(label).encode()})
    paths = sorted(str(p) for p in (work / "shards").glob("train-*.tar"))
    counts = [min(per_shard, images - k * per_shard) for k in range(len(paths))]
    return paths, counts


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
    return np.array(out)  # writable, as DataLoader's collation wants it


def webdataset_epoch(pattern: str, workers: int, epoch: int, scratch: Path) -> int:
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


class _WidsCrop:
    """wids' transformation: the sample's JPEG decoded by Pillow, cropped; and its label."""

    def __init__(self, epoch: int) -> None:
        self.rng = random.Random(epoch)

    def __call__(self, sample: Dict[str, Any]) -> Tuple[np.ndarray, int]:
        data = sample[".jpg"]
        data = data.read() if hasattr(data, "read") else bytes(data)
        label = sample[".cls"]
        label = label.read() if hasattr(label, "read") else bytes(label)
        with Image.open(io.BytesIO(data)) as image:
            return random_resized_crop(image, self.rng), int(label)


def wids_epoch(shards: List[Tuple[str, int]], workers: int, epoch: int, scratch: Path) -> int:
    import contextlib

    import torch
    import wids

    with contextlib.redirect_stderr(io.StringIO()):  # it prints the shard list's summary
        dataset = wids.ShardListDataset([{"url": url, "nsamples": n} for url, n in shards],
                                        cache_dir=str(scratch / "wids-cache"),
                                        transformations=[_WidsCrop(epoch)])
    sampler = wids.ChunkedSampler(dataset, chunksize=2000, seed=epoch, shuffle=True)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler, num_workers=workers)
    images = 0
    for batch_images, _ in loader:
        assert tuple(batch_images.shape[1:]) == (SIZE, SIZE, 3)
        images += len(batch_images)
    return images


def prestage_epoch(catalog: prestage.Catalog, workers: int, epoch: int, scratch: Path) -> int:
    images = 0
    with prestage.Loader(catalog, batch_size=BATCH, image_size=(SIZE, SIZE), seed=epoch,
                         transform="random-resized-crop", readers=workers,
                         stage_dir=str(scratch / "stage")) as loader:
        for batch in loader:
            images += len(batch.labels)
    return images


def _opens(emulator: PfsEmulator) -> Tuple[int, int]:
    """(opens, bytes read) of the shards so far."""
    paths = emulator.stats()["paths"]
    return (sum(p["opens"] for name, p in paths.items() if name.endswith(".tar")),
            sum(p["bytes"] for name, p in paths.items() if name.endswith(".tar")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=50000)
    parser.add_argument("--shards", type=int, default=50)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--latency-ms", type=float, default=2.0)
    parser.add_argument("--bandwidth-mbs", type=float, default=200.0)
    parser.add_argument("--readers", default="prestage,webdataset,wids",
                        help="which readers, comma-separated")
    parser.add_argument("--work", type=Path, default=None,
                        help="folder for the set and the scratch folders (default: a new temporary one)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="wds-bench-", dir=args.work) as tmp:
        work = Path(tmp)
        started = time.perf_counter()
        paths, counts = write_shards(work, args.images, args.shards)
        set_bytes = sum(os.path.getsize(p) for p in paths)
        print(f"set: {args.images} images in {len(paths)} shards, {set_bytes / 1e6:.0f} MB, written in "
              f"{time.perf_counter() - started:.0f} s", flush=True)
        emulator = PfsEmulator(work / "shards", latency_ms=args.latency_ms, bandwidth_mbs=args.bandwidth_mbs)
        mount = emulator.start()
        try:
            on_pfs = [str(mount / Path(p).name) for p in paths]
            pattern = str(mount / f"train-{{000000..{len(paths) - 1:06d}}}.tar")
            time.sleep(1.2)
            before = _opens(emulator)
            start = time.perf_counter()
            catalog = prestage.Catalog.from_webdataset(pattern)
            scan_s = time.perf_counter() - start
            scan_opens = _opens(emulator)[0] - before[0]
            catalog.save(work / "set.catalog")
            catalog = prestage.Catalog.load(work / "set.catalog")
            assert len(catalog) == args.images
            print(f"catalog: {scan_s:.2f} s, {scan_opens} opens to scan the shards over the PFS "
                  "(once; saved)", flush=True)
            every: Dict[str, Callable[[int, Path], int]] = {
                "prestage": lambda e, s: prestage_epoch(catalog, args.workers, e, s),
                "webdataset": lambda e, s: webdataset_epoch(pattern, args.workers, e, s),
                "wids": lambda e, s: wids_epoch(list(zip(on_pfs, counts)), args.workers, e, s),
            }
            readers = {name: every[name] for name in args.readers.split(",")}
            runs: Dict[str, List[Dict[str, float]]] = {name: [] for name in readers}
            for run in range(1, args.runs + 1):
                for name, read in readers.items():
                    scratch = work / f"scratch-{name}-{run}"
                    scratch.mkdir()
                    time.sleep(1.2)  # the kernel's cached names and attributes expire
                    opens0, bytes0 = _opens(emulator)
                    load0 = os.getloadavg()[0]
                    start = time.perf_counter()
                    images = read(run, scratch)
                    seconds = time.perf_counter() - start
                    opens1, bytes1 = _opens(emulator)
                    assert images == args.images, (name, images)
                    runs[name].append({"images_per_s": images / seconds, "seconds": seconds,
                                       "pfs_opens": opens1 - opens0, "pfs_bytes": bytes1 - bytes0,
                                       "load_before": load0, "load_after": os.getloadavg()[0]})
                    print(json.dumps({"reader": name, "run": run, **runs[name][-1]}), flush=True)
                    subprocess.run(["rm", "-rf", str(scratch)], check=True)
        finally:
            emulator.stop()
    median = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    result: Dict[str, Any] = {
        "images": args.images, "shards": len(paths), "set_bytes": set_bytes, "workers": args.workers,
        "runs": args.runs, "latency_ms": args.latency_ms, "bandwidth_mbs": args.bandwidth_mbs,
        "catalog_scan_s": scan_s, "catalog_scan_opens": scan_opens, "median": median, "all": runs,
    }
    if "prestage" in median:
        result["ratio"] = {name: median["prestage"]["images_per_s"] / m["images_per_s"]
                           for name, m in median.items() if name != "prestage"}
    print(f"catalog: {scan_s:.2f} s and {scan_opens} PFS opens to scan {len(paths)} shards (once)")
    print(f"| reader | images/s (median of {args.runs}) | runs | PFS opens per epoch | load average |")
    print("|---|---:|---|---:|---|")
    for name, rs in runs.items():
        rates = ", ".join(f"{r['images_per_s']:,.0f}" for r in rs)
        opens = ", ".join(str(r["pfs_opens"]) for r in rs)
        loads = ", ".join(f"{r['load_before']:.1f}" for r in rs)
        print(f"| {name} | {median[name]['images_per_s']:,.0f} | {rates} | {opens} | {loads} |")
    for name, ratio in result.get("ratio", {}).items():
        print(f"prestage / {name}: {ratio:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
