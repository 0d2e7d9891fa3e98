"""The baselines ``prestage bench`` compares against, each run in a process of its own.

- ``torch``: PyTorch ``DataLoader`` over torchvision's ``ImageFolder`` with the same transform as the
  prestage modes (``Resize`` + ``CenterCrop``, or ``RandomResizedCrop`` + flip) and ``PILToTensor``
  (uint8, as prestage's output), ``shuffle=True``, ``num_workers`` = the number of cores unless given,
  ``pin_memory=True`` (effective only where CUDA is present: the JSON's ``pinned`` says ``"cuda"`` or
  ``"none"``, as prestage's ``stats()["pinned"]`` does).
- ``tf``: ``tf.data``: the ImageFolder file list, ``shuffle``, ``map(read_file + decode_jpeg + resize +
  crop, num_parallel_calls=AUTOTUNE)`` (or ``--workers`` calls), ``batch``, ``prefetch(AUTOTUNE)``.

Both read the root they are given (the emulated PFS in a benchmark). The class-folder walk is timed
apart (``index_s``); ``epoch_s`` runs from the creation of the iterator to the last batch, with the
same consumer loop as the prestage modes (``--compute-ms`` of sleep per batch; ``stall_s`` is the time
spent waiting for batches).

Usage (what :func:`prestage.bench.modes.run_mode` runs)::

    python -m prestage.bench.baselines torch ROOT --batch-size 64 --image-size 224 --out result.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from typing import Any, Dict, Iterator, List, Optional, Tuple

from prestage.cli.progress import progress


def _consume(batches: Iterator[Any], count: Optional[int], compute_s: float, desc: str,
             show_progress: bool) -> Tuple[int, float, float]:
    images = 0
    stall = 0.0
    start = time.perf_counter()
    with progress(count or 0, desc=desc, unit="batch", enabled=show_progress) as bar:
        while True:
            t = time.perf_counter()
            try:
                images_part = next(batches)[0]
            except StopIteration:
                break
            stall += time.perf_counter() - t
            images += int(images_part.shape[0])
            del images_part
            if compute_s > 0:
                time.sleep(compute_s)
            bar.update(1)
    return images, time.perf_counter() - start, stall


def run_torch(root: str, batch_size: int, image_size: Optional[Tuple[int, int]], transform: str,
              workers: Optional[int], batches: Optional[int], seed: int, compute_ms: float,
              show_progress: bool) -> Dict[str, Any]:
    import itertools

    import torch
    import torchvision
    from torch.utils.data import DataLoader
    from torchvision import datasets, transforms

    steps: List[Any] = []
    if image_size is not None:
        if transform == "random-resized-crop":
            steps += [transforms.RandomResizedCrop(image_size), transforms.RandomHorizontalFlip()]
        else:
            steps += [transforms.Resize(min(image_size)), transforms.CenterCrop(image_size)]
    steps.append(transforms.PILToTensor())
    start = time.perf_counter()
    dataset = datasets.ImageFolder(root, transform=transforms.Compose(steps))
    index_s = time.perf_counter() - start
    workers = (os.cpu_count() or 1) if workers is None else workers
    generator = torch.Generator()
    generator.manual_seed(seed)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
                        pin_memory=True, generator=generator)
    count = len(loader) if batches is None else min(batches, len(loader))
    start = time.perf_counter()
    iterator = iter(loader)
    images, _, stall = _consume(itertools.islice(iterator, count), count, compute_ms / 1e3, "torch",
                                show_progress)
    epoch_s = time.perf_counter() - start
    del iterator  # shuts the workers down (not timed: a training loop would go on)
    return {"framework": "torch", "version": f"torch {torch.__version__}, torchvision "
            f"{torchvision.__version__}", "workers": workers, "images": images, "epoch_s": epoch_s,
            "stall_s": stall, "index_s": index_s,
            "pinned": "cuda" if torch.cuda.is_available() else "none"}


def _image_folder(root: str) -> Tuple[List[str], List[int]]:
    """torchvision's ImageFolder order: sorted class folders, sorted files, JPEG extensions."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    paths: List[str] = []
    labels: List[int] = []
    for label, name in enumerate(classes):
        for dirpath, _, files in sorted(os.walk(os.path.join(root, name), followlinks=True)):
            for file in sorted(files):
                if file.lower().endswith((".jpg", ".jpeg")):
                    paths.append(os.path.join(dirpath, file))
                    labels.append(label)
    return paths, labels


def _import_tensorflow() -> Any:
    """TensorFlow, imported with stderr closed: its C++ start-up log (oneDNN notes, absl warnings)
    would break the progress bars; an ImportError still surfaces as an exception."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        import tensorflow as tf
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
    return tf


def run_tf(root: str, batch_size: int, image_size: Optional[Tuple[int, int]], transform: str,
           workers: Optional[int], batches: Optional[int], seed: int, compute_ms: float,
           show_progress: bool) -> Dict[str, Any]:
    tf = _import_tensorflow()

    start = time.perf_counter()
    paths, labels = _image_folder(root)
    index_s = time.perf_counter() - start
    if image_size is not None and transform == "random-resized-crop":
        raise SystemExit("the tf baseline implements the center-crop transform only")

    def load(path: Any, label: Any) -> Tuple[Any, Any]:
        image = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
        if image_size is not None:
            height, width = image_size
            shape = tf.cast(tf.shape(image)[:2], tf.float32)
            scale = tf.cast(min(height, width), tf.float32) / tf.reduce_min(shape)
            new = tf.cast(tf.math.ceil(shape * scale), tf.int32)
            new = tf.maximum(new, [height, width])
            resized = tf.image.resize(image, new, method="bilinear", antialias=True)
            top = (new[0] - height) // 2
            left = (new[1] - width) // 2
            cropped = tf.image.crop_to_bounding_box(resized, top, left, height, width)
            image = tf.cast(tf.clip_by_value(tf.round(cropped), 0, 255), tf.uint8)
        return image, label

    calls = tf.data.AUTOTUNE if workers is None else workers
    dataset = (tf.data.Dataset.from_tensor_slices((paths, labels))
               .shuffle(len(paths), seed=seed, reshuffle_each_iteration=True)
               .map(load, num_parallel_calls=calls)
               .batch(batch_size)
               .prefetch(tf.data.AUTOTUNE))
    total = -(-len(paths) // batch_size)
    count = total if batches is None else min(batches, total)
    dataset = dataset.take(count)
    start = time.perf_counter()
    iterator = iter(dataset)
    images, _, stall = _consume(iterator, count, compute_ms / 1e3, "tf.data", show_progress)
    epoch_s = time.perf_counter() - start
    return {"framework": "tf", "version": f"tensorflow {tf.__version__}",
            "workers": "AUTOTUNE" if workers is None else workers, "images": images,
            "epoch_s": epoch_s, "stall_s": stall, "index_s": index_s, "pinned": "none"}


def _size(text: str) -> Optional[Tuple[int, int]]:
    if text.lower() == "none":
        return None
    parts = text.lower().replace("x", ",").split(",")
    return (int(parts[0]), int(parts[-1]))


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prestage.bench.baselines",
                                     description="Run one baseline epoch; write its figures as JSON.")
    parser.add_argument("framework", choices=("torch", "tf"))
    parser.add_argument("root", help="data set root (one folder per class)")
    parser.add_argument("--batch-size", type=int, default=64, help="images per batch (default 64)")
    parser.add_argument("--image-size", type=_size, default=(224, 224),
                        help="output size in pixels, H, HxW or none (default 224)")
    parser.add_argument("--transform", choices=("center-crop", "random-resized-crop"),
                        default="center-crop", help="the image transform (default center-crop)")
    parser.add_argument("--workers", type=int, default=None,
                        help="DataLoader workers / tf.data map calls (default: cores / AUTOTUNE)")
    parser.add_argument("--batches", type=int, default=None,
                        help="batches to read (default: one epoch)")
    parser.add_argument("--seed", type=int, default=0, help="shuffle seed (default 0)")
    parser.add_argument("--compute-ms", type=float, default=0.0,
                        help="simulated training step per batch, in ms (default 0)")
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")  # pin_memory without CUDA, TensorFlow's deprecations
    run = run_torch if args.framework == "torch" else run_tf
    try:
        result = run(args.root, args.batch_size, args.image_size, args.transform, args.workers,
                     args.batches, args.seed, args.compute_ms, not args.quiet)
    except ImportError as e:
        print(f"the {args.framework} baseline needs {e.name or e}: see scripts/bench-setup.sh",
              file=sys.stderr)
        return 3
    with open(args.out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
