"""GPU decode benchmark (issue 25): what decoding JPEGs on the GPU (nvJPEG + NPP, decode_device="cuda")
beside the CPU decoders buys on a GPU node.

Two measurements, each the median of ``--runs`` timed runs after ``--warmup`` untimed ones:

1. ``rrc``: RandomResizedCrop(``--image-size``) + flip, uint8, images/s over whole epochs of
   ``prestage.Loader`` with ``--readers`` readers: CPU only (``decode_device="cpu"``), GPU only
   (``decode_device="cuda"``, ``gpu_cpu_share=0``) and both: ``both_auto`` (the share sized at run
   time, the default; its JSON gives the share it settled at and why) next to ``both_<share>`` for
   each fixed ``gpu_cpu_share`` of ``--shares``.
   The GPU's epochs end with ``torch.cuda.synchronize()``: every decode is counted done.
2. ``train``: images/s of training steps (torchvision ResNet-18 and ResNet-50, bf16 autocast,
   channels_last, SGD, ``--batch-size``) on a resident batch (the model alone), fed by
   ``prestage.torch.Loader(device="cuda", normalize_on_device=True)`` (CPU decode, one copy) and by
   ``prestage.torch.Loader(device="cuda", decode_device="cuda")`` (the share sized at run time,
   ``prestage_gpu_decode_auto``, and each share of ``--shares`` and 0).

Reproducible from the repository alone: the images come from ``prestage synth`` unless ``--data`` names an
ImageFolder tree. The JSON goes to ``--json`` (default stdout), with the machine (GPU, CPUs, versions) and
``stats()["gpu_decode"]`` of each GPU run (where the samples went; the CPU's share and why; which way the
crop boxes were applied, ``crop`` and ``crop_why``: ``--gpu-crop`` picks one, default ``auto``).

    python benchmarks/gpu_decode_bench.py --images 8192 --readers 16 --runs 3 --json gpu_decode.json

It needs a CUDA device, a CUDA build of torch (and torchvision for ``train``) and the nvJPEG and NPP
libraries prestage opens at run time (``PRESTAGE_NVJPEG``, ``PRESTAGE_NPP`` name them); without any of
them it exits with status 2 and says what is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from h2d_bench import cuda_unavailable_reason, median_of  # the same checks and medians

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=None,
                   help="an ImageFolder tree of JPEG files (default: made by prestage synth)")
    p.add_argument("--images", type=int, default=8192, help="images to synthesise (default: 8192)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--image-size", type=int, default=224, help="square output side (default: 224)")
    p.add_argument("--readers", type=int, default=16, help="prestage decode threads (default: 16)")
    p.add_argument("--depth", type=int, default=6, help="batch buffers in the ring (default: 6)")
    p.add_argument("--shares", type=float, nargs="+", default=[0.25, 0.5],
                   help="gpu_cpu_share values for CPU + GPU together (default: 0.25 0.5)")
    p.add_argument("--gpu-crop", choices=("auto", "resize", "roi"), default="auto",
                   help="where the hardware engine's crop boxes are applied (default: auto)")
    p.add_argument("--runs", type=int, default=3, help="timed runs per figure (default: 3)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs first (default: 1)")
    p.add_argument("--steps", type=int, default=60, help="training steps per run (default: 60)")
    p.add_argument("--models", nargs="+", choices=("resnet18", "resnet50"),
                   default=["resnet18", "resnet50"])
    p.add_argument("--device", default="cuda", help="a CUDA device (default: cuda)")
    p.add_argument("--only", choices=("rrc", "train"), action="append",
                   help="run only these measurements (repeatable; default: both)")
    p.add_argument("--json", type=Path, default=None, help="write the results here (default: stdout)")
    args = p.parse_args(argv)
    for name in ("images", "batch_size", "image_size", "readers", "runs", "steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.depth < 2 or args.warmup < 0:
        p.error("--depth must be at least 2 and --warmup not negative")
    if any(not 0 <= s < 1 for s in args.shares):
        p.error("--shares must be in [0, 1)")
    if args.data is not None and not args.data.is_dir():
        p.error(f"--data {args.data}: not a directory")
    args.only = args.only or ["rrc", "train"]
    return args


def unavailable(reason: str) -> int:
    print(f"gpu_decode_bench: {reason}", file=sys.stderr)
    return 2


def synthesize(images: int, out: Path) -> Path:
    subprocess.run([sys.executable, "-m", "prestage", "synth", str(out), "--images", str(images),
                    "--classes", "10", "--seed", "0", "--quiet"], check=True)
    return out


# ------------------------------------------------------------------------------------- 1. rrc

def rrc_figures(torch: Any, prestage: Any, catalog: Any, args: argparse.Namespace) -> Dict[str, Any]:
    """images/s of whole epochs, CPU only, GPU only and both."""
    common = dict(batch_size=args.batch_size, image_size=(args.image_size, args.image_size),
                  transform="random-resized-crop", readers=args.readers, depth=args.depth, seed=0)
    gpu = {"decode_device": "cuda", "gpu_crop": args.gpu_crop}
    configs: List[tuple] = [("cpu", {"decode_device": "cpu"}),
                            ("gpu", {**gpu, "gpu_cpu_share": 0.0}),
                            ("both_auto", gpu)]  # sized at run time
    configs += [(f"both_{share:g}", {**gpu, "gpu_cpu_share": share}) for share in args.shares]
    out: Dict[str, Any] = {}
    for name, extra in configs:
        with torch.cuda.device(torch.device(args.device)), prestage.Loader(catalog, **common,
                                                                            **extra) as loader:
            def epoch() -> float:
                start = time.perf_counter()
                n = 0
                for batch in loader:
                    n += len(batch)
                    del batch
                torch.cuda.synchronize()
                return n / (time.perf_counter() - start)

            out[name] = median_of(args.runs, args.warmup, epoch)
            out[name]["gpu_decode"] = loader.stats()["gpu_decode"]
            print(f"rrc {name}: {out[name]['median']:,.0f} images/s", file=sys.stderr, flush=True)
    cpu = out["cpu"]["median"]
    out["ratio_to_cpu"] = {k: v["median"] / cpu for k, v in out.items() if k != "cpu"}
    return out


# ----------------------------------------------------------------------------------- 2. train

def make_model(torch: Any, name: str, device: Any) -> Any:
    import torchvision

    model = getattr(torchvision.models, name)(weights=None, num_classes=1000)
    return model.to(device).to(memory_format=torch.channels_last)


def train_figures(torch: Any, pt: Any, catalog: Any, args: argparse.Namespace) -> Dict[str, Any]:
    device = torch.device(args.device)
    size = (args.image_size, args.image_size)
    out: Dict[str, Any] = {}
    for name in args.models:
        model = make_model(torch, name, device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        loss_fn = torch.nn.CrossEntropyLoss()

        def step(images: Any, labels: Any) -> None:
            images = images.contiguous(memory_format=torch.channels_last)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = loss_fn(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

        resident = torch.randn(args.batch_size, 3, *size, device=device)
        resident_labels = torch.randint(0, 1000, (args.batch_size,), device=device)

        def alone() -> float:
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(args.steps):
                step(resident, resident_labels)
            torch.cuda.synchronize()
            return args.steps * args.batch_size / (time.perf_counter() - start)

        figures: Dict[str, Any] = {"alone": median_of(args.runs, args.warmup, alone)}
        print(f"train {name} alone: {figures['alone']['median']:,.0f} images/s", file=sys.stderr,
              flush=True)
        feeds: List[tuple] = [("prestage_cpu_decode", {"normalize_on_device": True})]
        gpu = {"decode_device": "cuda", "gpu_crop": args.gpu_crop}
        feeds += [("prestage_gpu_decode_auto", gpu)]  # sized at run time
        feeds += [(f"prestage_gpu_decode_{share:g}", {**gpu, "gpu_cpu_share": share})
                  for share in [0.0, *args.shares]]
        for feed, extra in feeds:
            with pt.Loader(catalog, batch_size=args.batch_size, image_size=size,
                           transform="random-resized-crop", readers=args.readers, depth=args.depth,
                           dtype=torch.float32, mean=MEAN, std=STD, device=device,
                           drop_last=True, **extra) as loader:
                batches = iter(loader)

                def fed() -> float:
                    nonlocal batches
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                    for _ in range(args.steps):
                        try:
                            images, labels = next(batches)
                        except StopIteration:
                            batches = iter(loader)
                            images, labels = next(batches)
                        step(images, labels)
                    torch.cuda.synchronize()
                    return args.steps * args.batch_size / (time.perf_counter() - start)

                figures[feed] = median_of(args.runs, args.warmup, fed)
                figures[feed]["gpu_decode"] = loader.stats()["gpu_decode"]
                print(f"train {name} {feed}: {figures[feed]['median']:,.0f} images/s",
                      file=sys.stderr, flush=True)
        base = figures["alone"]["median"]
        figures["ratio_to_alone"] = {k: v["median"] / base for k, v in figures.items() if k != "alone"}
        out[name] = figures
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        return unavailable("needs torch with CUDA (pip install torch torchvision)")
    reason = cuda_unavailable_reason(torch, args.device)
    if reason is not None:
        return unavailable(reason)
    if "train" in args.only:
        try:
            import torchvision  # noqa: F401
        except ImportError:
            return unavailable("train needs torchvision (or run --only rrc)")
    import prestage
    import prestage.torch as pt

    work = Path(tempfile.mkdtemp(prefix="prestage-gpu-decode-bench-"))
    root = args.data or synthesize(args.images, work / "imagenet-like")
    catalog = prestage.Catalog.from_folder(root)
    try:  # the libraries prestage opens at run time: a clear message, not a traceback
        with torch.cuda.device(torch.device(args.device)):
            prestage.Loader(catalog, batch_size=1, image_size=(8, 8), decode_device="cuda").close()
    except prestage.ConfigError as e:
        return unavailable(str(e))

    props = torch.cuda.get_device_properties(torch.device(args.device))
    results: Dict[str, Any] = {
        "machine": {"gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1),
                    "cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                    "python": platform.python_version(), "torch": torch.__version__,
                    "cuda": torch.version.cuda, "prestage": prestage.__version__},
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "gpu_resize": os.environ.get("PRESTAGE_GPU_RESIZE") or "each",  # the experiment's switch
        "images": len(catalog),
    }
    if "rrc" in args.only:
        results["rrc_images_per_s"] = rrc_figures(torch, prestage, catalog, args)
        if args.json is not None:  # kept if the training part fails or is stopped
            args.json.write_text(json.dumps(results, indent=2) + "\n")
    if "train" in args.only:
        results["train_images_per_s"] = train_figures(torch, pt, catalog, args)
    text = json.dumps(results, indent=2)
    if args.json is not None:
        args.json.write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
