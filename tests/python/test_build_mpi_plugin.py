"""``prestage build-mpi-plugin``: the MPI plugin compiled from the source the package ships, with the site's
MPI compiler wrapper, as a user of the binary wheel (which cannot carry MPI) builds it."""

import ctypes
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from prestage.cli import build_mpi_plugin

needs_mpicxx = pytest.mark.skipif(shutil.which("mpicxx") is None, reason="needs an MPI C++ compiler wrapper")


def _prestage(*argv: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prestage", *argv], capture_output=True, text=True,
                          timeout=300, env=env)


def test_the_package_ships_the_plugin_source():
    src = build_mpi_plugin.source_dir()
    assert (src / "tiers" / "mpi_transport.cpp").is_file()
    assert (src / "tiers" / "transport.hpp").is_file()
    # The symbol the core looks up is the one the command checks for.
    assert f'kTransportStartSymbol = "{build_mpi_plugin.START_SYMBOL}"' in (src / "tiers" / "transport.hpp").read_text()


@needs_mpicxx
def test_builds_a_plugin_that_loads_and_exports_the_start_symbol(tmp_path):
    out = tmp_path / "lib" / "libprestage_mpi.so"
    r = _prestage("build-mpi-plugin", "--output", str(out))
    assert r.returncode == 0, r.stderr
    assert f"PRESTAGE_MPI_PLUGIN={out.resolve()}" in r.stdout
    library = ctypes.CDLL(str(out), mode=ctypes.RTLD_GLOBAL)
    assert getattr(library, build_mpi_plugin.START_SYMBOL) is not None
    # Exactly the one entry point is exported (hidden visibility), as the CMake build does.
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(out)], capture_output=True, text=True,
                             check=True).stdout
    exported = [line.split()[-1] for line in symbols.splitlines() if " T " in line]
    assert exported == [build_mpi_plugin.START_SYMBOL]


def test_a_missing_compiler_is_named_and_nothing_is_written(tmp_path):
    out = tmp_path / "libprestage_mpi.so"
    r = _prestage("build-mpi-plugin", "--mpicxx", str(tmp_path / "no-such-mpicxx"), "--output", str(out))
    assert r.returncode == 2
    assert "no-such-mpicxx" in r.stderr and "--mpicxx" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()


def test_a_compiler_error_fails_and_leaves_no_plugin(tmp_path):
    out = tmp_path / "libprestage_mpi.so"
    # A "wrapper" that fails like a compiler without MPI's headers would.
    fake = tmp_path / "fake-mpicxx"
    fake.write_text("#!/bin/sh\necho 'mpi.h: No such file or directory' >&2\nexit 1\n")
    fake.chmod(0o755)
    r = _prestage("build-mpi-plugin", "--mpicxx", str(fake), "--output", str(out))
    assert r.returncode == 1 and "compiler failed" in r.stderr
    assert not out.exists() and list(Path(tmp_path).glob("tmp*")) == []
