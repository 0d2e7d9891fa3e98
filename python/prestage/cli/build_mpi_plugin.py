"""``prestage build-mpi-plugin``: compile the peer tier's MPI plugin (``libprestage_mpi.so``) against this
site's MPI, with its own compiler wrapper (``mpicxx``).

The plugin is the only part of prestage that links MPI, and MPI must be the site's own (its launcher, its
network): a binary wheel cannot carry it. The wheel carries its source instead (``prestage/_mpi_plugin``,
one C++ file and one header, C++20), and this command builds it where the core looks first, beside the
extension module, or at ``--output`` (then point ``PRESTAGE_MPI_PLUGIN`` at it). A source build with MPI
found builds and installs the same plugin itself.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, List, Optional, cast

from prestage.cli import summary

PLUGIN = "libprestage_mpi.so"
START_SYMBOL = "prestage_transport_start"  # tiers/transport.hpp: kTransportStartSymbol
WRAPPERS = ("mpicxx", "mpic++", "mpiCC")


def source_dir() -> Path:
    """The plugin's sources shipped in the package (tiers/mpi_transport.cpp, tiers/transport.hpp)."""
    return Path(__file__).resolve().parent.parent / "_mpi_plugin"


def find_compiler(given: Optional[str]) -> Optional[str]:
    """``given``, else $MPICXX, else the first MPI C++ wrapper on PATH; None if that does not exist (what
    was named is never replaced by another MPI's wrapper)."""
    named = given or os.environ.get("MPICXX")
    if named:
        return named if shutil.which(shlex.split(named)[0]) else None
    return next((w for w in WRAPPERS if shutil.which(w)), None)


def command(compiler: str, output: Path, extra: List[str]) -> List[str]:
    src = source_dir()
    return [*shlex.split(compiler), "-std=c++20", "-O2", "-fPIC", "-shared", "-fvisibility=hidden",
            "-pthread", f"-I{src}", str(src / "tiers" / "mpi_transport.cpp"), "-o", str(output), "-ldl",
            *extra]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "build-mpi-plugin",
        help=summary("build-mpi-plugin"),
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--mpicxx", default=None, metavar="CMD",
                        help=f"the MPI C++ compiler wrapper (default: $MPICXX, else the first of "
                             f"{', '.join(WRAPPERS)} on PATH)")
    parser.add_argument("--output", "-o", type=Path, default=None, metavar="PATH",
                        help=f"where to write the plugin (default: {PLUGIN} beside the extension module, "
                             "where the loader finds it without PRESTAGE_MPI_PLUGIN)")
    parser.add_argument("extra", nargs="*", metavar="FLAG",
                        help="further compiler flags, after --, e.g. -- -march=native")
    return cast(argparse.ArgumentParser, parser)


def run(args: argparse.Namespace) -> int:
    compiler = find_compiler(args.mpicxx)
    if compiler is None:
        named = args.mpicxx or os.environ.get("MPICXX")
        missing = f"{named!r} not found" if named else f"no MPI C++ compiler wrapper ({', '.join(WRAPPERS)}) on PATH"
        print(f"prestage build-mpi-plugin: {missing}; load the site's MPI (module load openmpi, ...) or name "
              "its wrapper with --mpicxx", file=sys.stderr)
        return 2
    if args.output is not None:
        output = args.output
    else:
        from prestage import _core

        output = Path(cast(str, _core.__file__)).resolve().parent / PLUGIN
    # The folder resolved, not the file's own name: a link planted under it is replaced, not followed.
    output = output.parent.resolve() / output.name
    output.parent.mkdir(parents=True, exist_ok=True)
    from prestage._paths import check_folder

    try:
        check_folder(output.parent)
    except OSError as error:
        print(f"prestage build-mpi-plugin: {error}", file=sys.stderr)
        return 2
    if not os.access(output.parent, os.W_OK):
        print(f"prestage build-mpi-plugin: {output.parent} is not writable; write the plugin elsewhere with "
              f"--output PATH and set PRESTAGE_MPI_PLUGIN=PATH", file=sys.stderr)
        return 2
    # Compiled to a temporary name and moved into place: a process that has the old plugin open keeps it.
    with tempfile.TemporaryDirectory(dir=output.parent) as tmp:
        built = Path(tmp) / PLUGIN
        argv = command(compiler, built, list(args.extra))
        print(" ".join(shlex.quote(a) for a in argv), flush=True)
        r = subprocess.run(argv)
        if r.returncode != 0:
            print(f"prestage build-mpi-plugin: the compiler failed (exit {r.returncode})", file=sys.stderr)
            return 1
        try:
            library = ctypes.CDLL(str(built), mode=ctypes.RTLD_GLOBAL)
            getattr(library, START_SYMBOL)
        except (OSError, AttributeError) as error:
            print(f"prestage build-mpi-plugin: the plugin does not load: {error}", file=sys.stderr)
            return 1
        os.replace(built, output)
    default = output.parent == Path(__file__).resolve().parent.parent
    print(f"wrote {output}" + ("" if default else f"; set PRESTAGE_MPI_PLUGIN={output}"))
    return 0
