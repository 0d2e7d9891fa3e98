"""Train a small CNN with PyTorch on a synthetic ImageNet-like JPEG set read through prestage.

    python examples/python/train_torch.py                       # one process (GPU if there is one)
    torchrun --nproc-per-node 2 examples/python/train_torch.py  # DistributedDataParallel

The first run writes the data set (``prestage synth``'s recipe: JPEGs of about 500x375 cut from real photos,
a learnable look per class) under the system's temporary folder, or under ``--data``; later runs reuse it.
Each epoch prints the training loss and accuracy, the validation accuracy, images/s and how long the training
loop waited for data.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import prestage
import prestage.torch
from prestage.synth import make_synthetic_set

# ImageNet's channel statistics, on the 0-1 scale (torchvision's Normalize).
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "prestage-examples",
                   help="folder for the synthetic sets (default: %(default)s)")
    p.add_argument("--images", type=int, default=2000, help="training images (default: %(default)s)")
    p.add_argument("--classes", type=int, default=10, help="classes (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=2, help="epochs (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=64, help="per process (default: %(default)s)")
    p.add_argument("--image-size", type=int, default=64,
                   help="side of the square crop (default: %(default)s)")
    p.add_argument("--stage-dir", type=Path, default=None, help="node-local folder to stage the files to")
    p.add_argument("--readers", type=int, default=2, help="decode threads (default: %(default)s)")
    return p.parse_args()


def synthetic_sets(args: argparse.Namespace, rank: int) -> tuple[prestage.Catalog, prestage.Catalog]:
    """Train and validation sets of the same classes (different seeds): written once, by rank 0."""
    train = args.data / f"train-{args.images}-{args.classes}"
    val = args.data / f"val-{args.images // 5}-{args.classes}"
    if rank == 0:
        make_synthetic_set(train, images=args.images, classes=args.classes, seed=0, overwrite=True)
        make_synthetic_set(val, images=args.images // 5, classes=args.classes, seed=1, overwrite=True)
    if dist.is_initialized():
        dist.barrier()
    return prestage.Catalog.from_folder(train), prestage.Catalog.from_folder(val)


def small_cnn(classes: int) -> nn.Module:
    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True)]

    return nn.Sequential(*block(3, 32), *block(32, 64), *block(64, 128), *block(128, 128),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, classes))


def to_device(images: torch.Tensor, labels: torch.Tensor, device: torch.device,
              mean: torch.Tensor, std: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 batch (a view of prestage's page-locked buffer) -> normalised float32 on the device.

    The copy is asynchronous on a GPU; converting there moves a quarter of the bytes a float32 batch
    would."""
    images = images.to(device, non_blocking=True).float().div_(255).sub_(mean).div_(std)
    return images, labels.to(device, non_blocking=True)


def main() -> None:
    args = parse_args()
    distributed = "WORLD_SIZE" in os.environ  # torchrun sets it
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if torch.cuda.is_available() \
        else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if distributed:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank = dist.get_rank() if distributed else 0
    train_set, val_set = synthetic_sets(args, rank)

    size = (args.image_size, args.image_size)
    # Rank and world size come from torch.distributed: each rank reads its own share of every batch.
    train = prestage.torch.Loader(train_set, args.batch_size, size, stage_dir=args.stage_dir,
                                  readers=args.readers, seed=0)
    val = prestage.torch.Loader(val_set, args.batch_size, size, shuffle=False, readers=args.readers)

    torch.manual_seed(0)
    model = small_cnn(args.classes).to(device, memory_format=torch.channels_last)  # as the batches are
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    steps = args.epochs * len(train)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.2, total_steps=steps)
    loss_fn = nn.CrossEntropyLoss()
    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1)
    if rank == 0:
        print(f"{len(train_set)} training and {len(val_set)} validation images, {args.classes} classes, "
              f"{train.world_size} process(es) on {device}, {len(train)} batches of {args.batch_size} "
              f"per epoch and process")

    for epoch in range(args.epochs):
        train.set_epoch(epoch)
        model.train()
        totals = torch.zeros(3, device=device)  # loss sum, correct, samples
        start = time.perf_counter()
        for images, labels in train:
            images, labels = to_device(images, labels, device, mean, std)
            logits = model(images)
            loss = loss_fn(logits, labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            totals += torch.stack([loss.detach() * len(labels), (logits.argmax(1) == labels).sum(),
                                   torch.tensor(len(labels), device=device)])
        seconds = time.perf_counter() - start
        stall = train.stats()["consumer_stall_s"]

        model.eval()
        correct = torch.zeros(2, device=device)  # correct, samples
        with torch.no_grad():
            for images, labels in val:
                images, labels = to_device(images, labels, device, mean, std)
                correct += torch.stack([(model(images).argmax(1) == labels).sum(),
                                        torch.tensor(len(labels), device=device)])
        if distributed:
            dist.all_reduce(totals)
            dist.all_reduce(correct)
        if rank == 0:
            loss_sum, right, n = totals.tolist()
            print(f"epoch {epoch + 1}/{args.epochs}: loss {loss_sum / n:.3f}, accuracy {right / n:.3f}, "
                  f"validation accuracy {correct[0].item() / correct[1].item():.3f}; "
                  f"{n / seconds:.0f} images/s, waited {stall:.1f} s for data in total")
    train.close()
    val.close()
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":  # make_synthetic_set starts worker processes
    main()
