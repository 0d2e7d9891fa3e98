"""What ``prestage bench`` and ``prestage tune`` share: their common options, and a session that
mounts the emulated PFS (or not), builds the catalog, and cleans everything up on the way out, on
errors and on Ctrl+C or SIGTERM alike."""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from prestage.bench import cache
from prestage.bench.emulator import EmulatorError, PfsEmulator
from prestage.bench.modes import Setup

__all__ = ["add_data_options", "add_emulator_options", "session", "machine", "image_size", "note"]


def image_size(text: str) -> Optional[Tuple[int, int]]:
    """``224``, ``224x160`` or ``none`` (an argparse type)."""
    if text.lower() == "none":
        return None
    parts = text.lower().replace("x", ",").split(",")
    try:
        if len(parts) in (1, 2) and all(int(p) > 0 for p in parts):
            return int(parts[0]), int(parts[-1])
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected H, HxW or none, got {text!r}")


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def add_data_options(p: argparse.ArgumentParser, default_batches: Optional[int]) -> None:
    g = p.add_argument_group("data and loader")
    g.add_argument("source", nargs="?", type=Path, metavar="SOURCE",
                   help="data set root, one folder per class (ImageNet layout), on the file system to "
                        "measure (with --emulate: any local directory). Default: a synthetic "
                        "ImageNet-like set of --images images, generated once into ~/.cache/prestage")
    g.add_argument("--images", type=positive, default=2000, metavar="N",
                   help="images in the synthetic set used when no SOURCE is given (default 2000)")
    g.add_argument("--stage-dir", type=Path, metavar="DIR",
                   help="a directory on the node-local disk (SSD) for stage directories and copies; a "
                        "subdirectory is created in it and removed at the end (default: a temporary "
                        "directory under $TMPDIR, which may not be the local SSD)")
    g.add_argument("--batch-size", type=positive, default=64, metavar="N",
                   help="images per batch (default 64)")
    g.add_argument("--image-size", type=image_size, default=(224, 224), metavar="HxW",
                   help="output size in pixels: H, HxW, or none for no resize (default 224)")
    g.add_argument("--transform", choices=("center-crop", "random-resized-crop"), default="center-crop",
                   help="resize the shorter side and crop the centre (torchvision Resize + CenterCrop), "
                        "or RandomResizedCrop + flip (needs a prestage with that transform; PyTorch "
                        "baseline only) (default center-crop)")
    g.add_argument("--depth", type=positive, default=4, metavar="N",
                   help="batch buffers in prestage's ring (default 4)")
    g.add_argument("--batches", type=positive, default=default_batches, metavar="N",
                   help="batches read per run (default: " +
                        ("the whole epoch" if default_batches is None else str(default_batches)) + ")")
    g.add_argument("--compute-ms", type=non_negative_float, default=0.0, metavar="MS",
                   help="simulated training step per batch, in milliseconds: the consumer sleeps this "
                        "long after each batch (an accelerator's step leaves the CPU to the loader), so "
                        "that stall time is measured under overlap (default 0: pure loading speed)")
    g.add_argument("--seed", type=int, default=0, help="shuffle seed, a non-negative integer (default 0)")
    g.add_argument("--cold", choices=cache.METHODS, default=cache.DEFAULT,
                   help="how each run starts cold: fadvise = posix_fadvise(DONTNEED) on the source's "
                        "and the stage directory's files, only those (the default); drop = write "
                        "/proc/sys/vm/drop_caches as root, which empties the page cache of the WHOLE "
                        "machine, every other job's too: only on a machine of your own; auto = drop "
                        "where permitted, else fadvise; none = leave caches as they are. The report "
                        "says which was done")
    g.add_argument("--quiet", action="store_true", help="no progress bars")


def add_emulator_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "emulated parallel file system",
        "With --emulate, SOURCE is served through prestage-pfs (FUSE): every loader reads it with the "
        "latency, bandwidth and concurrency below. Without root or /dev/fuse, the benchmark says so and "
        "reads SOURCE directly.")
    g.add_argument("--emulate", action="store_true",
                   help="read SOURCE through the emulated PFS (mounted and unmounted by the command)")
    g.add_argument("--latency-ms", type=non_negative_float, default=2.0, metavar="MS",
                   help="latency of each PFS operation (open, read request, getattr/lookup, readdir), "
                        "in milliseconds (default 2)")
    g.add_argument("--bandwidth-mbs", type=non_negative_float, default=200.0, metavar="MB/s",
                   help="aggregate PFS read bandwidth in MB/s (10^6 bytes per second); 0 for no cap "
                        "(default 200)")
    g.add_argument("--max-ops", type=int, default=16, metavar="N",
                   help="PFS operations served at once, the others queue; 0 for no cap (default 16)")
    g.add_argument("--emulator", type=Path, metavar="PATH",
                   help="the prestage-pfs executable (default: the one installed with prestage, "
                        "$PRESTAGE_PFS_EMULATOR, or prestage-pfs on PATH)")


def note(message: str) -> None:
    """A line for the user on stderr (warnings are not printed with print() to stdout)."""
    sys.stderr.write(f"{message}\n")
    sys.stderr.flush()


def machine(paths: Dict[str, Path]) -> Dict[str, Any]:
    """The machine the results come from: CPU, cores, memory, kernel, and the file systems used."""
    info: Dict[str, Any] = {"cores": os.cpu_count(), "kernel": platform.release(),
                            "python": platform.python_version()}
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/meminfo") as f:
            info["memory_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
    mounts = []
    with contextlib.suppress(OSError):
        with open("/proc/self/mounts") as f:
            mounts = [line.split() for line in f]
    for name, path in paths.items():
        real = os.path.realpath(path)
        best = max((m for m in mounts if real == m[1] or real.startswith(m[1].rstrip("/") + "/")),
                   key=lambda m: len(m[1]), default=None)
        info[f"{name}_fs"] = best[2] if best else "?"
    import prestage

    info["prestage"] = prestage.__version__
    return info


def _default_source(images: int, quiet: bool) -> Path:
    from prestage.cli.demo import default_source

    return default_source(images, 10, quiet)


def _catalog(pfs_root: Path, source: Path) -> Tuple[Any, List[str], List[int], List[str], float]:
    """The catalog the loaders read the PFS with, built from the PFS itself as a training job would
    (once; then saved): it records each file's size and mtime, so that no stage has to stat the PFS
    again. Also the paths, labels and classes (to build the same catalog on other roots) and the mean
    file size (for the baselines' MB/s), taken from the full-speed ``source``."""
    import prestage

    catalog = prestage.Catalog.from_folder(pfs_root)
    if len(catalog) == 0:
        raise ValueError(f"{source} holds no JPEG files in class folders")
    paths = [catalog.path(i) for i in range(len(catalog))]
    labels = [catalog.label(i) for i in range(len(catalog))]
    sample = paths if len(paths) <= 5000 else random.Random(0).sample(paths, 5000)
    mean = sum(os.stat(source / p).st_size for p in sample) / len(sample)
    return catalog, paths, labels, list(catalog.classes), mean


def _raise_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def session(args: argparse.Namespace, purpose: str) -> Iterator[Tuple[Setup, Dict[str, Any]]]:
    """Source, work directory, emulator and catalog for one command; everything is undone on exit.

    Yields the Setup and a dict describing the session (``emulated``, ``emulator`` config or the
    reason it is off, ``catalog_s``, ``cache_method``).
    """
    previous = signal.signal(signal.SIGTERM, _raise_on_sigterm)  # run the finally blocks on SIGTERM
    emulator: Optional[PfsEmulator] = None
    work_dir: Optional[Path] = None
    try:
        source = args.source if args.source is not None else _default_source(args.images, args.quiet)
        source = Path(source).resolve()
        if not source.is_dir():
            raise ValueError(f"{source} is not a directory")
        if args.stage_dir is not None:
            args.stage_dir.mkdir(parents=True, exist_ok=True)
        work_dir = Path(tempfile.mkdtemp(prefix=f"prestage-{purpose}-", dir=args.stage_dir))
        info: Dict[str, Any] = {"source": str(source), "work_dir": str(work_dir), "emulated": False}
        pfs_root = source
        if args.emulate:
            emulator = PfsEmulator(source, latency_ms=args.latency_ms, bandwidth_mbs=args.bandwidth_mbs,
                                   max_ops=args.max_ops, binary=args.emulator)
            try:
                pfs_root = emulator.start()
                info["emulated"] = True
                info["emulator"] = dict(emulator.config, binary=str(emulator.binary))
                note(f"emulated PFS: {source} served at {pfs_root} with {args.latency_ms:g} ms per "
                     f"operation, {args.bandwidth_mbs:g} MB/s, {args.max_ops} operations at once")
            except EmulatorError as e:
                emulator = None
                info["emulator_error"] = str(e)
                note(f"prestage {purpose}: cannot emulate a PFS ({e}); reading {source} directly")
        if not args.quiet:
            note(f"building the catalog of {pfs_root} (one stat per file)")
        start = time.perf_counter()
        catalog, paths, labels, classes, mean = _catalog(pfs_root, source)
        info["catalog_s"] = time.perf_counter() - start
        info["images_in_set"] = len(paths)
        info["mean_file_bytes"] = mean
        setup = Setup(source=source, pfs_root=pfs_root, work_dir=work_dir, paths=paths, labels=labels,
                      classes=classes, mean_file_bytes=mean, batch_size=args.batch_size,
                      image_size=args.image_size, transform=args.transform, depth=args.depth,
                      seed=args.seed, compute_ms=args.compute_ms, cold=args.cold, emulator=emulator,
                      show_progress=not args.quiet)
        setup.keep_catalog(pfs_root, catalog)
        info["cache_method"] = cache.make_cold(args.cold, [source])  # also tells which one works
        yield setup, info
    finally:
        if emulator is not None:
            emulator.stop()
        if work_dir is not None:
            shutil.rmtree(work_dir, ignore_errors=True)
        signal.signal(signal.SIGTERM, previous)
