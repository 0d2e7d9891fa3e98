"""The C++ tree is in the house format (.clang-format), as the clang-format pinned in scripts/dev.sh
writes it: `scripts/format.sh --check` finds no file to rewrite. `scripts/format.sh` rewrites them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BINARY = Path(sys.executable).parent / "clang-format"


def pinned_version() -> str:
    found = re.search(r"clang-format==([0-9.]+)", (ROOT / "scripts" / "dev.sh").read_text())
    assert found, "scripts/dev.sh pins no clang-format among the test tools"
    return found.group(1)


def test_cpp_files_are_formatted() -> None:
    if not BINARY.exists():
        pytest.skip("clang-format is not installed: scripts/dev.sh setup installs the pinned one")
    version = subprocess.run([str(BINARY), "--version"], capture_output=True, text=True).stdout
    if pinned_version() not in version:
        pytest.skip(f"clang-format {pinned_version()} is the one pinned; this is {version.strip()}")
    done = subprocess.run([str(ROOT / "scripts" / "format.sh"), "--check"], cwd=ROOT,
                          env={"CLANG_FORMAT": str(BINARY), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True)
    assert done.returncode == 0, f"not in the house format (scripts/format.sh rewrites them):\n" + \
        done.stderr[-4000:]


def test_the_check_finds_a_file_out_of_format(tmp_path: Path) -> None:
    # The check can fail: a line past 100 columns is reported, with its file.
    if not BINARY.exists():
        pytest.skip("clang-format is not installed: scripts/dev.sh setup installs the pinned one")
    (tmp_path / ".clang-format").write_text((ROOT / ".clang-format").read_text())
    bad = tmp_path / "bad.cpp"
    bad.write_text("int f(int a, int b) { return a + b + a + b + a + b + a + b + a + b + a + b + "
                   "a + b + a + b + a + b; }\n")
    done = subprocess.run([str(BINARY), "--dry-run", "-Werror", str(bad)], cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.returncode != 0 and "bad.cpp" in done.stderr
