"""The ``prestage`` command: one sub-command per module."""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from prestage.cli import bench, catalog, demo, pack, simulate, synth, trace, tune


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="prestage",
        description="Stage training data from a parallel file system to local SSD while decoding.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    commands = {"synth": synth, "demo": demo, "bench": bench, "tune": tune, "catalog": catalog, "pack": pack,
                "trace": trace, "simulate": simulate}
    for module in commands.values():
        module.add_parser(subparsers)
    args = parser.parse_args(argv)
    return commands[args.command].run(args)


if __name__ == "__main__":
    sys.exit(main())
