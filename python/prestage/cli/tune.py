"""prestage tune: the thread counts to use on this machine's file systems.

It searches the grid prefetchers x readers x lookahead for the pipelined loader on SOURCE (the data as
training reads it, e.g. on the parallel file system) through a stage directory on the node-local disk.
Each point reads --batches batches of an epoch of its own, from cold caches and an empty stage
directory, --repeat times; the point with the highest median images/s wins. It prints the options to use
and the throughput they gave, and with --write PATH saves them in the file prestage.Loader reads:

  prestage tune /pfs/imagenet/train --stage-dir /local/ssd --write tuned.json
  loader = prestage.Loader(catalog, batch_size=256, stage_dir="/local/ssd/stage", tuned="tuned.json")

Explicit arguments to prestage.Loader win over the file's values.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any, Dict

from prestage.bench import report
from prestage.bench.grid import add_grid_options, pipelined_jobs, run_jobs
from prestage.bench.session import add_data_options, add_emulator_options, machine, note, positive, session
from prestage.cli import summary
from prestage.options import load_tuned

DEFAULT_BATCHES = 20


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "tune",
        help=summary("tune"),
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_data_options(p, default_batches=DEFAULT_BATCHES)
    g = p.add_argument_group("grid")
    add_grid_options(g, "", lookahead=[2, 4, 8])
    g.add_argument("--repeat", type=positive, default=1, metavar="N",
                   help="runs of each point; the median counts (default 1)")
    g.add_argument("--top", type=positive, default=10, metavar="N",
                   help="grid points to print, fastest first (default 10)")
    add_emulator_options(p)
    g = p.add_argument_group("output")
    g.add_argument("--write", type=Path, metavar="PATH",
                   help="write the best options to PATH as JSON (prestage.Loader(..., tuned=PATH))")
    g.add_argument("--json", action="store_true", help="print the results as JSON")
    return p


def run(args: argparse.Namespace) -> int:
    import prestage

    try:
        with session(args, "tune") as (setup, info):
            jobs = pipelined_jobs(args.prefetchers, args.readers, args.lookahead)
            if not args.quiet:
                note(f"tuning on {info['images_in_set']} images: {len(jobs)} points x {args.repeat} "
                     f"run(s) x {args.batches} batches of {args.batch_size}; cold caches by "
                     f"{info['cache_method']}")
            grid = run_jobs(setup, jobs, args.batches, args.repeat, "tune")
            best = max(grid, key=lambda s: s["images_per_s"])
            options = {"prefetchers": best["prefetchers"], "readers": best["readers"],
                       "lookahead": best["lookahead"], "depth": args.depth}
            result: Dict[str, Any] = {
                "options": options,
                "images_per_s": best["images_per_s"],
                "mb_per_s": best["mb_per_s"],
                "stall_s": best["stall_s"],
                "measured": {"batches": args.batches, "batch_size": args.batch_size,
                             "image_size": args.image_size, "repeat": args.repeat,
                             "compute_ms": args.compute_ms, "cache": info["cache_method"],
                             "emulated": info["emulated"], "emulator": info.get("emulator")},
                "machine": machine({"source": setup.source, "stage": setup.work_dir}),
                "grid": [{k: v for k, v in s.items() if k != "runs"} for s in grid],
            }
            if args.write is not None:
                from prestage._paths import write_replacing

                args.write.parent.mkdir(parents=True, exist_ok=True)
                write_replacing(args.write, (json.dumps(result, indent=1, default=str) + "\n").encode())
                load_tuned(args.write)  # check that the Loader reads it back
    except KeyboardInterrupt:
        note("prestage tune: interrupted; the emulated PFS is unmounted and temporary files removed")
        return 130
    except (prestage.Error, ValueError, OSError, RuntimeError) as e:
        note(f"prestage tune: {e}")
        return 2
    if args.json:
        print(json.dumps(result, indent=1, default=str))
        return 0
    print(report.format_grid(grid, limit=args.top))
    print()
    print(f"best: prefetchers={options['prefetchers']} readers={options['readers']} "
          f"lookahead={options['lookahead']} depth={options['depth']}: "
          f"{best['images_per_s']:.0f} images/s, {best['mb_per_s']:.1f} MB/s "
          f"(median of {args.repeat} run(s) of {args.batches} batches)")
    if args.write is not None:
        print(f"written to {args.write}: prestage.Loader(..., tuned={str(args.write)!r})")
    else:
        print(f"use: prestage.Loader(..., prefetchers={options['prefetchers']}, "
              f"readers={options['readers']}, lookahead={options['lookahead']})")
    return 0
