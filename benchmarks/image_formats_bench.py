"""Stage 3 by image format: the same pictures as JPEG, PNG, lossy and lossless WebP, each set
decoded by a loader with decode="image" (Resize + CenterCrop to 224 x 224), images/s per format and
its ratio to JPEG's, medians of several rounds, the formats interleaved in each round.

    python benchmarks/image_formats_bench.py OUT [--images 300] [--rounds 5] [--readers 2]

OUT receives the sets (written once from `prestage synth` photographs, resized to 320 x 240 so that
the JPEG path decodes at full scale as the others do) and results.json.
"""

import argparse
import json
import statistics
import time
from pathlib import Path

from PIL import Image

import prestage
from prestage import synth

FORMATS = {"jpeg": ("JPEG", {"quality": 90}, ".jpg"), "png": ("PNG", {}, ".png"),
           "webp_lossy": ("WEBP", {"quality": 80}, ".webp"),
           "webp_lossless": ("WEBP", {"lossless": True}, ".webp")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--readers", type=int, default=2)
    args = parser.parse_args()
    sets = args.out / "sets"
    if not sets.exists():
        photos = args.out / "photos"
        synth.make_synthetic_set(photos, images=args.images, classes=1, seed=0)
        pictures = [Image.open(p).convert("RGB").resize((320, 240))
                    for p in sorted(photos.rglob("*.jpg"))[:args.images]]
        for name, (fmt, options, ext) in FORMATS.items():
            (sets / name / "a").mkdir(parents=True)
            for i, picture in enumerate(pictures):
                picture.save(sets / name / "a" / f"{i}{ext}", fmt, **options)
    rates = {name: [] for name in FORMATS}
    for _ in range(args.rounds):
        for name in FORMATS:
            catalog = prestage.Catalog.from_folder(sets / name, extensions=[])
            with prestage.Loader(catalog, batch_size=50, decode="image", image_size=(224, 224),
                                 readers=args.readers, autotune=False) as loader:
                start = time.perf_counter()
                count = sum(len(b.indices) for b in loader)
                rates[name].append(count / (time.perf_counter() - start))
    base = statistics.median(rates["jpeg"])
    results = {name: {"median_images_per_s": statistics.median(r), "runs": r,
                      "ratio_to_jpeg": statistics.median(r) / base} for name, r in rates.items()}
    for name, r in results.items():
        print(f"{name:14s} {r['median_images_per_s']:7.0f} images/s   {r['ratio_to_jpeg']:.2f} x JPEG")
    (args.out / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
