"""``prestage pack SRC OUT``: aggregate a set of small files into a few large shards with an index, so
that an epoch opens a few files on the parallel file system instead of one per sample. See
``prestage.pack`` for the layout; load the result with ``prestage.Catalog.from_shards(OUT)``."""

from __future__ import annotations

import argparse
import sys
from typing import Any, cast

from prestage import pack as packing
from prestage.bench.cache_study import resolve_size
from prestage.cli import summary
from prestage.errors import Error


def _size(text: str) -> int:
    """Bytes, with an optional K, M, G or T suffix: the grammar of `prestage bench --cache-bytes`
    (cache_study.resolve_size), less its percentages, which mean nothing for a shard."""
    if text.strip().endswith("%"):
        raise argparse.ArgumentTypeError(f"'{text}': a shard size is bytes (e.g. 256M, 1G), not a share")
    try:
        return resolve_size(text, 0)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``pack`` subcommand and return its parser."""
    parser = subparsers.add_parser(
        "pack",
        help=summary("pack"),
        description=(
            "Pack the samples of SRC (a class-folder tree, or a catalog saved by Catalog.save: of files, "
            "or of byte ranges such as WebDataset, MDS and Hugging Face sets) into shards "
            "of about --shard-size bytes in OUT, with OUT/index.tsv (shard, offset, length, label, "
            "CRC-32C, original path). Load it with prestage.Catalog.from_shards(OUT). Resumable: run the "
            "same command again after an interruption."
        ),
    )
    parser.add_argument("src", metavar="SRC", help="data set folder (class sub-folders) or saved catalog")
    parser.add_argument("out", metavar="OUT", help="output folder (created)")
    parser.add_argument("--shard-size", type=_size, default=256 << 20, metavar="BYTES",
                        help="target shard size, e.g. 64M, 1G (default: 256M)")
    parser.add_argument("--zstd", type=int, nargs="?", const=3, default=None, metavar="LEVEL",
                        help="compress each sample as a zstd frame (level 3 when no LEVEL is given); "
                             "without it, each sample keeps its original bytes exactly")
    parser.add_argument("--workers", type=int, default=16, metavar="W",
                        help="reader threads (default: 16; a PFS wants many reads in flight)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a pack made with other parameters in OUT")
    parser.add_argument("--quiet", action="store_true", help="no progress bar and no summary line")
    return cast(argparse.ArgumentParser, parser)


def run(args: argparse.Namespace) -> int:
    """Run ``prestage pack``; return the exit code (0; 1 on failure; 2 on bad arguments; 130 on Ctrl+C)."""
    try:
        summary = packing.pack(args.src, args.out, shard_bytes=args.shard_size, zstd_level=args.zstd,
                               workers=args.workers, overwrite=args.overwrite, progress=not args.quiet)
    except (ValueError, FileExistsError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (OSError, Error) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"interrupted: run the same command again to resume packing into {args.out}",
              file=sys.stderr)
        return 130
    if not args.quiet:
        print(f"packed {summary['samples']} samples into {summary['shards']} shards "
              f"({summary['bytes'] / 1e6:.1f} MB) in {args.out}: "
              f"prestage.Catalog.from_shards({str(args.out)!r})")
    return 0
