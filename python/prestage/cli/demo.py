"""``prestage demo``: one epoch from a source folder through a stage directory, with the figures.

Without a source folder it generates a small synthetic ImageNet-like set first (``prestage synth``),
once, into ``$XDG_CACHE_HOME/prestage`` (``~/.cache/prestage``; about 200 MB), where the next demo finds
it; the report ends with its place and size. The stage directory is a new temporary one, removed after,
unless ``--stage-dir`` names one.
The source files are dropped from the page cache before the epoch (``posix_fadvise(DONTNEED)``), so
that stage 2 really reads the storage, as it would from a parallel file system.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from prestage.cli import summary
from prestage.cli.progress import progress

DEFAULT_IMAGES = 2000
DEFAULT_CLASSES = 10


def evict_from_page_cache(root: Path) -> int:
    """Asks the kernel to drop the cached pages of every file under ``root``; returns the file count."""
    count = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            try:
                fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                count += 1
            finally:
                os.close(fd)
    return count


def default_source(images: int, classes: int, quiet: bool) -> Path:
    """The synthetic set the demo uses when given none, generated once into the user's cache."""
    from prestage import synth

    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "prestage"
    out = cache / f"synth-{images}-{classes}"
    synth.make_synthetic_set(out, images=images, classes=classes, seed=0, progress=not quiet)
    return out


def run_demo(
    source: Path,
    stage_dir: Path,
    batch_size: int = 64,
    image_size: Optional[Tuple[int, int]] = (224, 224),
    readers: Optional[int] = None,
    prefetchers: Optional[int] = None,
    lookahead: Optional[int] = None,
    depth: int = 4,
    cold: bool = True,
    show_progress: bool = True,
) -> Dict[str, Any]:
    """Runs one epoch and returns its figures (images/s, stall time, per-stage stats)."""
    import prestage

    # A file is a catalog saved by `prestage catalog`: the set is not walked again.
    saved = Path(source).is_file()
    catalog = prestage.Catalog.load(source) if saved else prestage.Catalog.from_folder(source)
    if cold:
        evict_from_page_cache(catalog.root)
    start = time.perf_counter()
    images = 0
    nbytes = 0
    with prestage.Loader(
        catalog,
        batch_size=batch_size,
        image_size=image_size,
        stage_dir=stage_dir,
        readers=readers,
        prefetchers=prefetchers,
        lookahead=lookahead,
        depth=depth,
        seed=0,
    ) as loader:
        with progress(len(loader), desc="epoch", unit="batch", enabled=show_progress) as bar:
            for batch in loader:
                images += len(batch)
                bar.update(1)
        elapsed = time.perf_counter() - start
        stats = loader.stats(epochs=0)  # the epoch run, not the next one the pipeline began
        chosen = loader.options  # the values in effect: given, or sized to the machine
    nbytes = stats["missed_bytes"] + stats["bytes_from_stage"]
    return {
        "source": str(source),
        "images": images,
        "seconds": elapsed,
        "images_per_s": images / elapsed,
        "mb_per_s": nbytes / elapsed / 1e6,
        "consumer_stall_s": stats["consumer_stall_s"],
        "options": {
            "batch_size": batch_size,
            "image_size": list(image_size) if image_size else None,
            "readers": chosen.readers,
            "prefetchers": chosen.prefetchers,
            "lookahead": chosen.lookahead,
            "threads_why": stats["threads_why"],
            "depth": depth,
            "cold": cold,
        },
        "stats": stats,
    }


def epoch_figures(stats: Dict[str, Any]) -> Dict[str, Any]:
    """The first epoch of ``stats["epochs"]`` (the demo's one epoch), with ``samples``: the samples
    stage 3 decoded for it, which every split of them (hits and misses; stage 3's reads by where the
    bytes were) adds up to."""
    epoch = dict(stats["epochs"][0]) if stats["epochs"] else {
        k: 0 for k in ("epoch", "hits", "misses", "copies_made", "source_reads", "bytes_from_source",
                       "decoded_from_stage", "decoded_from_memory", "decoded_from_peers",
                       "decoded_from_source")}
    epoch["samples"] = sum(epoch[f"decoded_from_{t}"] for t in ("stage", "memory", "peers", "source"))
    return epoch


def _format_tuning(t: Dict[str, Any]) -> str:
    """Where the self-tuning took the values left out (stats()["tuning"])."""
    if not t.get("on"):
        return "self-tuning      off (the values above stayed fixed)"
    return (f"self-tuning      on: {t['readers']} readers, {t['reads_in_flight']} reads in flight, "
            f"lookahead {t['lookahead']} at the end ({t['steps_kept']} steps kept, "
            f"{t['steps_undone']} undone, settled at {t['settled_s']:.2f} s)")


def format_report(result: Dict[str, Any]) -> str:
    s = result["stats"]
    lines = [
        f"source           {result['source']}",
        f"images           {result['images']} in {result['seconds']:.2f} s",
        f"throughput       {result['images_per_s']:.0f} images/s, {result['mb_per_s']:.1f} MB/s",
        f"consumer stall   {result['consumer_stall_s']:.2f} s "
        f"({100 * result['consumer_stall_s'] / result['seconds']:.0f}% of the epoch)",
        f"threads          {result['options']['readers']} readers, "
        f"{result['options']['prefetchers']} prefetchers, lookahead {result['options']['lookahead']}"
        + (f" ({result['options']['threads_why']})" if result["options"]["threads_why"] else " (given)"),
        _format_tuning(s.get("tuning") or {}),
        "",
        f"{'stage':<10}{'busy s':>9}{'idle s':>9}{'items':>9}{'MB':>9}",
    ]
    for name in ("plan", "stage", "decode"):
        st = s[name]
        lines.append(
            f"{name:<10}{st['busy_s']:>9.2f}{st['idle_s']:>9.2f}{st['items']:>9}{st['bytes'] / 1e6:>9.1f}"
        )
    # The epoch run, alone: the pipeline has begun the next epoch too, whose batches the run-wide
    # totals (stats()["hits"], ["staged_files"]) also count.
    e = epoch_figures(s)
    lines += [
        "",
        f"epoch {e['epoch']}:          {e['samples']} samples: {e['hits']} found staged (hits), "
        f"{e['misses']} whose bytes came from the source (misses)",
        f"  stage 2        {e['copies_made']} files copied to the stage directory, "
        f"{e['source_reads']} reads of the source ({e['bytes_from_source'] / 1e6:.1f} MB)",
        f"  stage 3        {e['decoded_from_stage']} read from the stage directory, "
        f"{e['decoded_from_memory']} from memory (read ahead), {e['decoded_from_source']} from the source"
        + (f", {e['decoded_from_peers']} from peers" if e["decoded_from_peers"] else ""),
        f"batch buffers    {_PINNED[s['pinned']]} ({s['pinned_why']})",
    ]
    if s["stage_failures"]:
        lines.append(f"stage failures   {s['stage_failures']} copies failed (their samples were read "
                     "from the source)")
    if s["stage_dir_disabled"]:
        lines.append(f"stage directory  disabled: {s['stage_dir_error']}")
    return "\n".join(lines)


#: stats()["pinned"], in words.
_PINNED = {"cuda": "registered with the CUDA driver", "mlock": "page-locked", "none": "pageable"}


def _image_size(text: str) -> Optional[Tuple[int, int]]:
    if text.lower() == "none":
        return None
    parts = text.lower().replace("x", ",").split(",")
    try:
        if len(parts) == 1:
            return int(parts[0]), int(parts[0])
        if len(parts) == 2:
            return int(parts[0]), int(parts[1])
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected H, HxW or none, got {text!r}")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "demo",
        help=summary("demo"),
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("source", nargs="?", type=Path,
                   help="data set root (one folder per class), or a catalog saved by prestage catalog; "
                        "default: a synthetic set")
    p.add_argument("--images", type=int, default=DEFAULT_IMAGES,
                   help=f"images in the synthetic set when no source is given (default {DEFAULT_IMAGES})")
    p.add_argument("--stage-dir", type=Path,
                   help="stage directory on local SSD (default: a new temporary directory, removed after)")
    p.add_argument("--batch-size", type=int, default=64, help="images per batch (default 64)")
    p.add_argument("--image-size", type=_image_size, default=(224, 224),
                   help="output size in pixels: H, HxW, or none for no resize (default 224)")
    p.add_argument("--readers", type=int, default=None,
                   help="stage 3 (decode) threads (default: sized to the machine, as the loader does)")
    p.add_argument("--prefetchers", type=int, default=None,
                   help="stage 2 (copy) threads (default: sized to the machine)")
    p.add_argument("--lookahead", type=int, default=None,
                   help="batches stage 2 works on ahead of stage 3 (default: sized to the machine)")
    p.add_argument("--depth", type=int, default=4, help="batch buffers in the ring (default 4)")
    p.add_argument("--warm", action="store_true",
                   help="keep the source in the page cache (default: evict it before the epoch)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def run(args: argparse.Namespace) -> int:
    import prestage

    try:
        source = args.source or default_source(args.images, DEFAULT_CLASSES, args.quiet)
        temporary = args.stage_dir is None
        stage_dir = Path(tempfile.mkdtemp(prefix="prestage-demo-")) if temporary else args.stage_dir
        try:
            result = run_demo(
                source, stage_dir, batch_size=args.batch_size, image_size=args.image_size,
                readers=args.readers, prefetchers=args.prefetchers, lookahead=args.lookahead,
                depth=args.depth, cold=not args.warm, show_progress=not args.quiet,
            )
        finally:
            if temporary:
                shutil.rmtree(stage_dir, ignore_errors=True)
    except ModuleNotFoundError as e:  # Pillow or scikit-image, for the synthetic set: the message says
        print(f"prestage demo: {e}", file=sys.stderr)  # what to install (prestage.synth.INSTALL_SYNTH)
        return 1
    except (prestage.Error, ValueError, OSError) as e:
        print(f"prestage demo: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2) if args.json else format_report(result))
    if args.source is None and not args.json:
        # The set generated for the demo stays for the next run: say where, and what it takes.
        size = sum(f.stat().st_size for f in Path(source).rglob("*") if f.is_file())
        print(f"\nthe synthetic set stays in {source} ({size / 1e6:.0f} MB) for the next demo; "
              f"remove it with: rm -r {source}")
    return 0
