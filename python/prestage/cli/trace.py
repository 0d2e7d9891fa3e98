"""``prestage trace FILE``: summarise an I/O trace written by a loader with ``trace=FILE`` and draw its
spatial and temporal access patterns and its per-thread timeline (see ``prestage.trace``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, cast

from prestage import trace as traces
from prestage.cli import summary


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``trace`` subcommand and return its parser."""
    parser = subparsers.add_parser(
        "trace",
        help=summary("trace"),
        description=("Print reads, bytes and mean time per read by tier and by kind, and draw "
                     "spatial.png (files and offsets read over time), temporal.png (reads and bytes per "
                     "second) and timeline.png (a row per thread, a bar per read) into --out."),
    )
    parser.add_argument("file", metavar="FILE", help="a trace written by Loader(..., trace=FILE)")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="folder for the figures (default: FILE's name without its suffix + '-figures')")
    parser.add_argument("--no-plots", action="store_true", help="print the summary only")
    return cast(argparse.ArgumentParser, parser)


def run(args: argparse.Namespace) -> int:
    """Run ``prestage trace``; return the exit code (0; 1 if the file cannot be read or drawn)."""
    try:
        header, records = traces.read(args.file)
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    s = traces.summary(records)
    print(f"{args.file}: {s['reads']:,} reads, {s['bytes'] / 1e6:,.1f} MB over {s['span_s']:.2f} s "
          f"({s['reads_per_s']:,.0f} reads/s), {s['files']:,} of {header.get('files', '?')} files, "
          f"{s['threads']} threads; root {header.get('root', '?')}")
    for title, groups in (("tier", s["by_tier"]), ("kind", s["by_kind"])):
        print(f"  by {title}:")
        for name, g in groups.items():
            print(f"    {name:<11} {g['reads']:>10,} reads {g['bytes'] / 1e6:>12,.1f} MB "
                  f"{g['mean_ms']:>9.3f} ms per read")
    tuning = header.get("tuning", [])
    if tuning:
        t0 = int(records["start_ns"].min()) if len(records) else 0
        print(f"  self-tuning: {len(tuning)} changes")
        for change in tuning:
            print(f"    {(change['t_ns'] - t0) / 1e9:8.2f} s  {change['knob']} "
                  f"{change['from']} -> {change['to']}")
    if args.no_plots or not s["reads"]:
        return 0
    out = Path(args.out) if args.out else Path(args.file).with_suffix("").with_name(
        Path(args.file).stem + "-figures")
    try:
        written = traces.plot(records, out, title=f"prestage I/O trace: {Path(args.file).name}",
                              tuning=tuning)
    except (ImportError, OSError) as error:
        print(f"error: cannot draw the figures: {error}", file=sys.stderr)
        return 1
    print("figures: " + ", ".join(str(p) for p in written))
    return 0
