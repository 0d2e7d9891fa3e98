"""The ``prestage`` command: one sub-command per module of this package.

Only the module of the sub-command that runs is imported, so that one sub-command's optional
dependencies (Pillow for ``synth`` and ``demo``, matplotlib for figures, PyTorch for a baseline) never
break another, nor ``prestage --help``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Dict, List, Optional

# Sub-command: its one-line help, as ``prestage --help`` lists it (each module's parser takes it
# from here). Its module is prestage.cli.<name> ('-' read as '_'), with add_parser(subparsers) and run(args).
COMMANDS: Dict[str, str] = {
    "synth": "write a synthetic ImageNet-like JPEG data set (class folders)",
    "demo": "run one epoch through a stage directory and print the figures",
    "bench": "compare direct, stage-all, pipelined and ideal loading, and PyTorch and tf.data",
    "tune": "search prefetchers x readers x lookahead on your own file systems; write the best",
    "catalog": "walk a data set once, save its catalog, report files, classes, bytes and sizes",
    "pack": "pack a set of small files into shards with an index (fewer PFS opens per epoch)",
    "trace": "summarise and draw an I/O trace (a loader's trace=FILE)",
    "simulate": "the peer tier on 1 to 1,024 nodes, simulated from the plan: PFS and peer bytes per epoch",
    "build-mpi-plugin": "compile the peer tier's MPI plugin against this site's MPI (mpicxx)",
}


def summary(command: str) -> str:
    """The one-line help of ``command``."""
    return COMMANDS[command]


def main(argv: Optional[List[str]] = None) -> int:
    args_list = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(
        prog="prestage",
        description="Stage training data from a parallel file system to local SSD while decoding.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    # The top-level parser has no option of its own but --help: the first other word is the command.
    chosen = next((word for word in args_list if not word.startswith("-")), None)
    module = None
    for name, help_line in COMMANDS.items():
        if name == chosen:
            module = importlib.import_module(f"prestage.cli.{name.replace('-', '_')}")
            module.add_parser(subparsers)
        else:
            subparsers.add_parser(name, help=help_line)
    args = parser.parse_args(args_list)  # exits on --help, and on an unknown command
    assert module is not None and args.command == chosen
    return int(module.run(args))


if __name__ == "__main__":
    sys.exit(main())
