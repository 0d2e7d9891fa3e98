"""Host-to-device benchmark: what the ring's CUDA-registered buffers buy on a GPU.

Three measurements, each the median of ``--runs`` timed runs after ``--warmup`` untimed ones:

1. ``copy``: host-to-device bandwidth (GB/s) of one batch-sized copy, from a batch buffer of prestage's ring,
   from a torch pinned tensor (``pin_memory=True``) and from a pageable one, timed with CUDA events.
2. ``overlap``: a compute kernel (matrix products sized to take about as long as the copy) on the default
   stream while the copy runs on a side stream, for each source: the overlap is
   ``(t_copy + t_compute - t_both) / min(t_copy, t_compute)``, 1 when the copy hides entirely behind the
   kernel, 0 when they serialise (a pageable source blocks the host and stages through the driver).
3. ``train``: images/s of a training step (ResNet-50 from torchvision when present, else a stand-in conv
   net; SGD, float32) fed by ``prestage.torch.Loader(device="cuda", normalize_on_device=True)`` and by
   ``torch.utils.data.DataLoader(pin_memory=True)`` over the same JPEG files with the same transform
   (decoded by PIL in ``--workers`` worker processes), normalised on the GPU as well.

Reproducible from the repository alone: the images come from ``prestage synth`` unless ``--data`` names an
ImageFolder tree. The JSON goes to ``--json`` (default stdout).

    python benchmarks/h2d_bench.py --images 4096 --batch-size 128 --runs 5 --json h2d.json

It needs a CUDA device and a CUDA build of torch; without one it exits with status 2 and says why.
``--cpu-check`` runs only the parts that need no GPU (the data, both input pipelines, the model's forward on
the CPU on a few samples) and writes their JSON: a check that the benchmark is wired up.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=None,
                   help="an ImageFolder tree of JPEG files (default: made by prestage synth)")
    p.add_argument("--images", type=int, default=2048, help="images to synthesise (default: 2048)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--image-size", type=int, default=224, help="square output side (default: 224)")
    p.add_argument("--transform", choices=("random-resized-crop", "center-crop"),
                   default="random-resized-crop")
    p.add_argument("--runs", type=int, default=5, help="timed runs per figure (default: 5)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs first (default: 1)")
    p.add_argument("--steps", type=int, default=0,
                   help="training steps per run (default 0: one epoch of the data)")
    p.add_argument("--readers", type=int, default=os.cpu_count() or 1, help="prestage decode threads")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="DataLoader worker processes")
    p.add_argument("--model", choices=("auto", "resnet50", "convnet"), default="auto",
                   help="auto: ResNet-50 where torchvision is installed, else the stand-in conv net")
    p.add_argument("--device", default="cuda", help="a CUDA device (default: cuda)")
    p.add_argument("--only", choices=("copy", "overlap", "train"), action="append",
                   help="run only these measurements (repeatable; default: all)")
    p.add_argument("--cpu-check", action="store_true",
                   help="run only the parts that need no GPU, on a few samples, and report them")
    p.add_argument("--json", type=Path, default=None, help="write the results here (default: stdout)")
    args = p.parse_args(argv)
    for name in ("images", "batch_size", "image_size", "runs", "readers", "workers"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup < 0 or args.steps < 0:
        p.error("--warmup and --steps must not be negative")
    if args.data is not None and not args.data.is_dir():
        p.error(f"--data {args.data}: not a directory")
    args.only = args.only or ["copy", "overlap", "train"]
    return args


def cuda_unavailable_reason(torch: Any, device: str) -> Optional[str]:
    """Why ``device`` cannot be used, or None."""
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        return f"--device {device!r}: {e}"
    if dev.type != "cuda":
        return f"--device {device!r} is not a CUDA device"
    if not torch.cuda.is_available():
        build = "a CPU-only build of torch" if torch.version.cuda is None else "no usable CUDA device"
        return (f"needs a CUDA device: torch.cuda.is_available() is False ({build}, "
                f"torch {torch.__version__})")
    return None


def median_of(runs: int, warmup: int, measure: Callable[[], float]) -> Dict[str, Any]:
    for _ in range(warmup):
        measure()
    values = [measure() for _ in range(runs)]
    return {"median": statistics.median(values), "all": values}


# ----------------------------------------------------------------------------------------- data

def synthesize(images: int, out: Path) -> Path:
    subprocess.run([sys.executable, "-m", "prestage", "synth", str(out), "--images", str(images),
                    "--classes", "10", "--quiet"], check=True)
    return out


def pil_transform(path: str, size: int, transform: str, rng: random.Random) -> Any:
    """The image as a uint8 (3, size, size) array: torchvision's RandomResizedCrop(size) + horizontal flip,
    or Resize(size) + CenterCrop(size), with PIL's bilinear resize (what DataLoader users run when
    torchvision is not there)."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as im:
        img = im.convert("RGB")
    w, h = img.size
    if transform == "random-resized-crop":
        box = (0, 0, w, h)
        for _ in range(10):  # torchvision's draw: scale (0.08, 1), log-uniform ratio (3/4, 4/3)
            area = w * h * rng.uniform(0.08, 1.0)
            ratio = pow(2.718281828, rng.uniform(-0.2876821, 0.2876821))
            cw, ch = int(round((area * ratio) ** 0.5)), int(round((area / ratio) ** 0.5))
            if 0 < cw <= w and 0 < ch <= h:
                left, top = rng.randint(0, w - cw), rng.randint(0, h - ch)
                box = (left, top, left + cw, top + ch)
                break
        img = img.resize((size, size), Image.BILINEAR, box=box)
        if rng.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
    else:
        scale = size / min(w, h)
        rw, rh = max(size, int(w * scale)), max(size, int(h * scale))
        img = img.resize((rw, rh), Image.BILINEAR)
        left, top = (rw - size) // 2, (rh - size) // 2
        img = img.crop((left, top, left + size, top + size))
    return np.asarray(img).transpose(2, 0, 1).copy()


def dataloader(torch: Any, root: Path, args: argparse.Namespace, pin_memory: bool) -> Any:
    files = sorted(root.glob("*/*.jpg"))
    classes = {c: i for i, c in enumerate(sorted({f.parent.name for f in files}))}

    class Folder(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(files)

        def __getitem__(self, i: int) -> Tuple[Any, int]:
            rng = random.Random(hash((i, time.perf_counter_ns())))
            image = pil_transform(str(files[i]), args.image_size, args.transform, rng)
            return torch.from_numpy(image), classes[files[i].parent.name]

    return torch.utils.data.DataLoader(Folder(), batch_size=args.batch_size, shuffle=True,
                                       num_workers=args.workers, pin_memory=pin_memory, drop_last=True,
                                       persistent_workers=args.workers > 0)


def prestage_loader(catalog: Any, args: argparse.Namespace, device: Optional[str]) -> Any:
    import prestage.torch

    kwargs: Dict[str, Any] = dict(batch_size=args.batch_size, image_size=(args.image_size,) * 2,
                                  transform=args.transform, readers=args.readers, drop_last=True)
    if device is not None:
        kwargs.update(device=device, dtype="float32", mean=MEAN, std=STD, normalize_on_device=True)
    return prestage.torch.Loader(catalog, **kwargs)


# ---------------------------------------------------------------------------------------- model

def make_model(torch: Any, name: str) -> Tuple[str, Any]:
    if name in ("auto", "resnet50"):
        try:
            import torchvision
        except ImportError:
            if name == "resnet50":
                raise SystemExit("h2d_bench: --model resnet50 needs torchvision") from None
        else:
            return "resnet50", torchvision.models.resnet50(weights=None, num_classes=10)
    nn = torch.nn
    # A stand-in with ResNet's shape of work (strided convolutions, batch norm, ReLU), far lighter.
    layers: List[Any] = []
    width, channels = 3, 64
    for _ in range(5):
        layers += [nn.Conv2d(width, channels, 3, stride=2, padding=1, bias=False),
                   nn.BatchNorm2d(channels), nn.ReLU(inplace=True)]
        width, channels = channels, min(channels * 2, 512)
    return "convnet", nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10))


# -------------------------------------------------------------------------------- GPU measurements

def ring_batch(torch: Any, catalog: Any, args: argparse.Namespace) -> Tuple[Any, Any, Dict[str, Any]]:
    """A batch buffer of prestage's ring, as a flat uint8 tensor (its loader, to keep it open)."""
    loader = prestage_loader(catalog, args, device=None)
    images, _ = next(iter(loader))
    stats = loader.stats()
    return images.reshape(-1), loader, {"pinned": stats["pinned"], "pinned_why": stats["pinned_why"],
                                        "is_pinned": bool(images.is_pinned())}


def time_copies(torch: Any, src: Any, dst: Any, stream: Any, repeat: int) -> float:
    """Seconds per copy of src into dst on `stream`, timed with events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        start.record(stream)
        for _ in range(repeat):
            dst.copy_(src, non_blocking=True)
        end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / repeat


def measure_copy(torch: Any, sources: Dict[str, Any], device: Any,
                 args: argparse.Namespace) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    stream = torch.cuda.Stream(device=device)
    for name, src in sources.items():
        dst = torch.empty_like(src, device=device)
        r = median_of(args.runs, args.warmup, lambda: time_copies(torch, src, dst, stream, repeat=10))
        out[name] = {"bytes": src.numel(), "seconds": r["median"],
                     "gb_per_s": src.numel() / r["median"] / 1e9, "seconds_all": r["all"]}
    return out


def measure_overlap(torch: Any, sources: Dict[str, Any], device: Any,
                    args: argparse.Namespace) -> Dict[str, Any]:
    side = torch.cuda.Stream(device=device)
    main = torch.cuda.current_stream(device)
    a = torch.randn(2048, 2048, device=device)

    def compute(k: int) -> None:
        for _ in range(k):
            torch.mm(a, a)

    def elapsed(work: Callable[[], None]) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        work()
        torch.cuda.synchronize()
        return time.perf_counter() - start

    out: Dict[str, Any] = {}
    for name, src in sources.items():
        dst = torch.empty_like(src, device=device)

        def copy() -> None:
            with torch.cuda.stream(side):
                for _ in range(5):
                    dst.copy_(src, non_blocking=True)

        t_copy = median_of(args.runs, args.warmup, lambda: elapsed(copy))["median"]
        per_mm = elapsed(lambda: compute(20)) / 20
        k = max(1, int(round(t_copy / per_mm)))  # a kernel about as long as the copies
        t_compute = median_of(args.runs, args.warmup, lambda: elapsed(lambda: compute(k)))["median"]

        def both() -> None:
            with torch.cuda.stream(main):
                compute(k)
            copy()

        t_both = median_of(args.runs, args.warmup, lambda: elapsed(both))["median"]
        out[name] = {"copy_s": t_copy, "compute_s": t_compute, "both_s": t_both,
                     "overlap": (t_copy + t_compute - t_both) / min(t_copy, t_compute)}
    return out


def train_rate(torch: Any, model: Any, batches: Callable[[], Any], device: Any, steps: int,
               normalize: Optional[Callable[[Any], Any]]) -> float:
    """Images per second over one run of `steps` training steps (0: the whole iterator)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    n, start = 0, None
    for step, (images, labels) in enumerate(batches()):
        if normalize is not None:
            images, labels = normalize(images), labels.to(device, non_blocking=True)
        loss = loss_fn(model(images), labels % 10)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if start is None:  # timed from the end of the first step: the iterators' start-up is not counted
            torch.cuda.synchronize()
            start = time.perf_counter()
        else:
            n += images.shape[0]
        if steps and step + 1 >= steps:
            break
    torch.cuda.synchronize()
    return n / (time.perf_counter() - start) if start is not None and n else 0.0


def measure_train(torch: Any, catalog: Any, root: Path, device: Any,
                  args: argparse.Namespace) -> Dict[str, Any]:
    model_name, model = make_model(torch, args.model)
    model = model.to(device).to(memory_format=torch.channels_last)
    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1) * 255

    def normalize(images: Any) -> Any:
        return (images.to(device, non_blocking=True).float() - mean) / std

    loader = prestage_loader(catalog, args, device=str(device))
    data = dataloader(torch, root, args, pin_memory=True)
    try:
        ours = median_of(args.runs, args.warmup,
                         lambda: train_rate(torch, model, lambda: loader, device, args.steps, None))
        theirs = median_of(args.runs, args.warmup,
                           lambda: train_rate(torch, model, lambda: data, device, args.steps, normalize))
    finally:
        loader.close()
    return {"model": model_name, "prestage_images_per_s": ours["median"], "prestage_all": ours["all"],
            "dataloader_images_per_s": theirs["median"], "dataloader_all": theirs["all"],
            "dataloader_workers": args.workers, "readers": args.readers}


# ------------------------------------------------------------------------------------- CPU check

def cpu_check(torch: Any, catalog: Any, root: Path, args: argparse.Namespace) -> Dict[str, Any]:
    """The parts with no GPU: one batch from each input pipeline and a forward pass of the model."""
    loader = prestage_loader(catalog, args, device=None)
    with loader:
        images, labels = next(iter(loader))
        stats = loader.stats()
    data = dataloader(torch, root, args, pin_memory=False)
    theirs, their_labels = next(iter(data))
    model_name, model = make_model(torch, args.model)
    with torch.no_grad():
        logits = model(images[:2].float())
    return {"prestage_batch": list(images.shape), "dataloader_batch": list(theirs.shape),
            "same_shape": images.shape == theirs.shape and labels.shape == their_labels.shape,
            "pinned": stats["pinned"], "pinned_why": stats["pinned_why"], "model": model_name,
            "logits": list(logits.shape)}


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    import torch

    import prestage

    reason = cuda_unavailable_reason(torch, args.device)
    if reason is not None and not args.cpu_check:
        print(f"h2d_bench: {reason}. --cpu-check runs the parts that need no GPU.", file=sys.stderr)
        return 2
    results: Dict[str, Any] = {
        "benchmark": "h2d", "prestage": prestage.__version__, "torch": torch.__version__,
        "python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }
    with tempfile.TemporaryDirectory(prefix="h2d-bench-") as tmp:
        root = args.data if args.data is not None else synthesize(args.images, Path(tmp) / "data")
        catalog = prestage.Catalog.from_folder(root)
        if len(catalog) < 2 * args.batch_size:
            print(f"h2d_bench: {len(catalog)} images are fewer than two batches of {args.batch_size}",
                  file=sys.stderr)
            return 2
        if args.cpu_check:
            results["cpu_check"] = cpu_check(torch, catalog, root, args)
            results["gpu"] = reason or "not measured (--cpu-check)"
        else:
            device = torch.device(args.device)
            results["gpu"] = torch.cuda.get_device_name(device)
            ring, ring_loader, ring_info = ring_batch(torch, catalog, args)
            results["ring"] = ring_info
            sources = {"prestage_ring": ring,
                       "torch_pinned": torch.empty(ring.numel(), dtype=torch.uint8, pin_memory=True),
                       "torch_pageable": torch.empty(ring.numel(), dtype=torch.uint8)}
            try:
                if "copy" in args.only:
                    results["copy"] = measure_copy(torch, sources, device, args)
                if "overlap" in args.only:
                    results["overlap"] = measure_overlap(torch, sources, device, args)
            finally:
                del sources, ring
                ring_loader.close()
            if "train" in args.only:
                results["train"] = measure_train(torch, catalog, root, device, args)
    text = json.dumps(results, indent=2)
    if args.json is not None:
        args.json.write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
