"""Hugging Face datasets sets read by prestage (Catalog.from_hf) against datasets' own reader.

A set of `--images` JPEGs (photo-like, 160x120, labels of 10 classes) is written by `datasets` itself:
`save_to_disk` (Arrow files, `--shards` of them) and `to_parquet` (one file per shard). Then:

- catalog: seconds for `Catalog.from_hf` on the Arrow folder and on the Parquet files, against
  reading the image column whole with pyarrow (`pq.read_table(files, columns=["image"])`, what a
  reader that loads the column pays);
- epoch: images/s decoding every image to a 112x112 center crop, uint8 NHWC batches of 64, with
  `--workers` threads or worker processes, from the page cache (one warm-up epoch each first):
  prestage `Loader(Catalog.from_hf(arrow folder), image_size=(112, 112), transform="center-crop",
  readers=W)` against `datasets.load_from_disk(...)` with `Image(decode=False)`, each image opened
  by Pillow, shorter side resized to 112 (bilinear), center-cropped, in a
  `torch.utils.data.DataLoader(num_workers=W, batch_size=64)`.

Medians over `--runs` rounds, the readers interleaved within a round.

    python benchmarks/hf_bench.py --images 4000 --shards 4 --workers 2 --runs 3
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
from PIL import Image

import prestage

SIDE = 112


def _jpeg(rng: np.random.Generator) -> bytes:
    small = rng.integers(0, 255, size=(6, 8, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(small).resize((160, 120), Image.BICUBIC).save(out, format="JPEG", quality=85)
    return out.getvalue()


def write_sets(root: Path, images: int, shards: int) -> Dict[str, Any]:
    import datasets

    datasets.disable_progress_bars()
    rng = np.random.default_rng(0)
    features = datasets.Features({"image": datasets.Image(),
                                  "label": datasets.ClassLabel(names=[f"c{i}" for i in range(10)])})
    ds = datasets.Dataset.from_dict({"image": [{"bytes": _jpeg(rng), "path": None} for _ in range(images)],
                                     "label": [i % 10 for i in range(images)]}, features=features)
    ds.save_to_disk(str(root / "arrow"), num_shards=shards)
    parquet = []
    for k in range(shards):
        parquet.append(str(root / f"train-{k:05d}.parquet"))
        ds.shard(shards, k, contiguous=True).to_parquet(parquet[-1])
    return {"arrow": str(root / "arrow"), "parquet": parquet}


def _crop(data: bytes) -> np.ndarray:
    img = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = img.size
    scale = SIDE / min(w, h)
    img = img.resize((max(SIDE, round(w * scale)), max(SIDE, round(h * scale))), Image.BILINEAR)
    w, h = img.size
    left, top = (w - SIDE) // 2, (h - SIDE) // 2
    return np.array(img.crop((left, top, left + SIDE, top + SIDE)))


class _Rows:
    """datasets' rows, each decoded and cropped by Pillow (a map-style dataset for DataLoader)."""

    def __init__(self, path: str):
        import datasets

        self.ds = datasets.load_from_disk(path).cast_column("image", datasets.Image(decode=False))

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int):
        row = self.ds[i]
        return _crop(row["image"]["bytes"]), row["label"]


def epoch_datasets(path: str, workers: int) -> float:
    import torch

    loader = torch.utils.data.DataLoader(_Rows(path), batch_size=64, shuffle=True, num_workers=workers)
    start, n = time.perf_counter(), 0
    for images, _ in loader:
        n += len(images)
    return n / (time.perf_counter() - start)


def epoch_prestage(catalog: Any, workers: int) -> float:
    start, n = time.perf_counter(), 0
    with prestage.Loader(catalog, batch_size=64, image_size=(SIDE, SIDE), transform="center-crop",
                         readers=workers, seed=1) as loader:
        for batch in loader:
            n += len(batch.labels)
    return n / (time.perf_counter() - start)


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=4000)
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory(prefix="prestage-hf-bench-") as tmp:
        sets = write_sets(Path(tmp), args.images, args.shards)
        times: Dict[str, List[float]] = {k: [] for k in ("from_hf arrow", "from_hf parquet",
                                                         "pyarrow read_table parquet")}
        rates: Dict[str, List[float]] = {"prestage": [], "datasets + Pillow": []}
        catalog = prestage.Catalog.from_hf(sets["arrow"])
        epoch_prestage(catalog, args.workers)  # warm-up: the page cache, both readers
        epoch_datasets(sets["arrow"], args.workers)
        for _ in range(args.runs):
            for name, build in (("from_hf arrow", lambda: prestage.Catalog.from_hf(sets["arrow"])),
                                ("from_hf parquet", lambda: prestage.Catalog.from_hf(sets["parquet"])),
                                ("pyarrow read_table parquet",
                                 lambda: pq.read_table(sets["parquet"], columns=["image"]))):
                start = time.perf_counter()
                build()
                times[name].append(time.perf_counter() - start)
            rates["prestage"].append(epoch_prestage(catalog, args.workers))
            rates["datasets + Pillow"].append(epoch_datasets(sets["arrow"], args.workers))
    out = {"images": args.images, "shards": args.shards, "workers": args.workers, "runs": args.runs,
           "catalog_s": {k: statistics.median(v) for k, v in times.items()},
           "images_per_s": {k: statistics.median(v) for k, v in rates.items()}}
    base = out["catalog_s"]["pyarrow read_table parquet"]
    print(f"{args.images} images in {args.shards} shards, {args.workers} workers, medians of {args.runs}")
    for k, v in out["catalog_s"].items():
        print(f"  {k:28s} {v * 1000:8.1f} ms  ({v / base:.2f}x the pyarrow read)")
    ref = out["images_per_s"]["datasets + Pillow"]
    for k, v in out["images_per_s"].items():
        print(f"  epoch {k:22s} {v:8.0f} images/s  ({v / ref:.2f}x datasets + Pillow)")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
