"""Training with a Dataset of your own, its reading code unchanged, fed from prestage's stage directory.

Your `Dataset` decodes (here: PIL, a crop and a flip of your choosing, a label from the folder); prestage
plans the epoch and stages each batch's files from the (slow, shared) source to a local directory ahead
of your `DataLoader` workers, which then open the local copies. Only indices cross into the workers.

    .venv/bin/python examples/python/own_dataset.py [--data DIR] [--stage DIR] [--workers 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

import prestage
import prestage.torch
from prestage.synth import make_synthetic_set


def read(sample: prestage.torch.StagedSample, label: int):
    """Your own decoding: any code that opens a path (or takes bytes: sample.bytes())."""
    with sample.open() as f:
        image = Image.open(f).convert("RGB").resize((64, 64))
    pixels = np.asarray(image, dtype=np.float32) / 255.0
    if torch.rand(()) < 0.5:  # your own augmentation
        pixels = pixels[:, ::-1]
    return torch.from_numpy(pixels.transpose(2, 0, 1).copy()), label


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "prestage-example-own"))
    parser.add_argument("--stage", default=None, help="stage directory (default: a temporary one)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    if not (Path(args.data) / "SYNTH.json").exists():
        make_synthetic_set(args.data, images=1000, classes=10, seed=0, progress=True)
    catalog = prestage.Catalog.from_folder(args.data)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 5, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4),
                                torch.nn.Flatten(), torch.nn.Linear(256, len(catalog.classes)))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    # A stage directory of our own making is removed at the end (about 100 MB); one given is kept.
    stage = args.stage or tempfile.mkdtemp(prefix="prestage-stage-")
    try:
        train(args, catalog, model, optimizer, stage)
    finally:
        if args.stage is None:
            shutil.rmtree(stage, ignore_errors=True)
    print(f"the data set stays in {args.data} for the next run (rm -r it when done)")


def train(args: argparse.Namespace, catalog: prestage.Catalog, model: torch.nn.Module,
          optimizer: torch.optim.Optimizer, stage: str) -> None:
    with prestage.torch.StagedSampler(catalog, batch_size=50, stage_dir=stage, seed=0,
                                      num_workers=args.workers) as sampler:
        loader = sampler.data_loader(prestage.torch.StagedDataset(sampler, read=read))
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            start, seen, correct, total_loss = time.perf_counter(), 0, 0, 0.0
            for images, labels in loader:
                logits = model(images)
                loss = torch.nn.functional.cross_entropy(logits, labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                seen += len(labels)
                correct += int((logits.argmax(1) == labels).sum())
                total_loss += loss.item() * len(labels)
            stats = sampler.stats()
            print(f"epoch {epoch + 1}/{args.epochs}: loss {total_loss / seen:.3f}, accuracy {correct / seen:.3f}, "
                  f"{seen / (time.perf_counter() - start):.0f} images/s; workers read {stats['worker_staged']} "
                  f"staged copies and {stats['worker_source']} source files so far")


if __name__ == "__main__":
    main()
