"""``prestage synth``: write an ImageNet-like synthetic JPEG data set as class folders.

The set, its layout and its recipe are :mod:`prestage.synth`'s (``make_synthetic_set``), imported when
the command runs: Pillow and scikit-image are needed to write a set, not to parse its options.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, cast

from prestage.cli import summary

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``synth`` subcommand on an ``argparse`` sub-parsers object and return its parser."""
    parser = subparsers.add_parser(
        "synth",
        help=summary("synth"),
        description=(
            "Write an ImageNet-like set of JPEG files as class folders (OUT/class_000/img_000000.jpg, ...), "
            "cut from scikit-image's sample photos: sizes around 500x375, quality around 90, about 100 KB "
            "per file, 3%% greyscale, a learnable look per class. Deterministic for a given --seed."
        ),
    )
    parser.add_argument("out", metavar="OUT", help="output folder (created; must be empty or absent)")
    parser.add_argument(
        "--images", type=int, default=5000, metavar="N", help="number of images (files) (default: 5000)"
    )
    parser.add_argument(
        "--classes",
        type=int,
        default=10,
        metavar="K",
        help="number of classes (folders), at most N; image i goes to class i %% K (default: 10)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="random seed, a non-negative integer (default: 0)"
    )
    parser.add_argument(
        "--quality",
        type=int,
        default=90,
        metavar="Q",
        help="JPEG quality (1-100) at the centre of the per-image draw Q-2..Q+2 (default: 90)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="W",
        help=f"number of worker processes (default: the number of CPUs, {os.cpu_count() or 1} here)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a set made with other parameters, or an interrupted one, in OUT",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar and no summary line")
    return cast(argparse.ArgumentParser, parser)


def run(args: argparse.Namespace) -> int:
    """Run ``prestage synth`` with parsed arguments; return the exit code (0, 1 on failure, 2 on bad args)."""
    quiet = bool(getattr(args, "quiet", False))
    try:
        from prestage import synth  # Pillow: needed to write a set, not to parse the options
    except ModuleNotFoundError as error:  # Pillow: its message says what to install
        _error(f"error: {error}")
        return 1
    try:
        written = synth.make_synthetic_set(
            args.out,
            args.images,
            args.classes,
            getattr(args, "seed", 0),
            getattr(args, "quality", 90),
            getattr(args, "workers", None),
            not quiet,
            bool(getattr(args, "overwrite", False)),
        )
    except ValueError as error:
        _error(f"error: {error}")
        return 2
    except (ModuleNotFoundError, OSError, RuntimeError) as error:
        _error(f"error: {error}")
        return 1
    except KeyboardInterrupt:
        _error(f"interrupted: {args.out} is incomplete (no {synth.SUMMARY_NAME}); rerun with --overwrite")
        return 130
    if not quiet:
        count, total = written["count"], written["total_bytes"]
        if "seconds" not in written:  # the same set was there already: nothing written
            print(f"{args.out}: already there ({count} images, {total / 1e6:.1f} MB)")
        else:
            seconds = written["seconds"]
            print(
                f"wrote {count} images in {written['parameters']['classes']} classes to {args.out}: "
                f"{total / 1e6:.1f} MB, {total / count / 1e3:.1f} KB/image, "
                f"{seconds:.1f} s ({count / max(seconds, 1e-9):.0f} images/s)"
            )
    return 0


def _error(message: str) -> None:
    sys.stderr.write(f"prestage synth: {message}\n")
