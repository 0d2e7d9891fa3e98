"""scripts/wheel_libs.py, the portable wheel's ELF check, on small wheels made here with this machine's
compiler: one that passes, and one for each way a wheel can miss manylinux_2_28 (a glibc symbol newer
than 2.28, GCC's C++ runtime needed, a symbol besides PyInit_* exported, a bundled library) or carry
what it must not (a CUDA library). The checks of the earlier, auditwheel-bundled wheel (which
libraries prestage.libs/ held) went with it: the portable wheel bundles none."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "wheel_libs.py"

pytestmark = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("c++") is None
                                or shutil.which("readelf") is None, reason="needs cc, c++ and readelf")

ENTRY = "#include <stdio.h>\nint PyInit__core(void) { return puts(\"x\"); }\n"
# pthread_create's default version is GLIBC_2.34 from glibc 2.34 on (libpthread merged into libc).
NEW_GLIBC = "#include <pthread.h>\nstatic void *f(void *a) { return a; }\n" \
            "int PyInit__core(void) { pthread_t t; return pthread_create(&t, 0, f, 0); }\n"
EXTRA = ENTRY + "int H5open(void) { return 1; }\n"
CXX = '#include <string>\nextern "C" int PyInit__core() { return (int)std::to_string(7).size(); }\n'


def wheel(tmp: Path, source: str, lang: str = "c", bundled: bool = False, hidden: bool = True,
          cuda: bool = False) -> Path:
    src = tmp / ("m.c" if lang == "c" else "m.cpp")
    src.write_text(source)
    so = tmp / "_core.so"
    cmd = ["cc" if lang == "c" else "c++", "-shared", "-fPIC", "-O1", str(src), "-o", str(so)]
    if hidden:
        (tmp / "v.map").write_text("{ global: PyInit_*; local: *; };\n")
        cmd.append(f"-Wl,--version-script={tmp / 'v.map'}")
    subprocess.run(cmd, check=True)
    path = tmp / "prestage-0.1.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.write(so, "prestage/_core.cpython-311-x86_64-linux-gnu.so")
        if bundled:
            z.write(so, "prestage.libs/libtbb-0a1b2c3d.so.12")
        if cuda:
            z.write(so, "prestage/libcudart.so.12")
    return path


def check(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(path)], capture_output=True, text=True)


def test_a_wheel_within_manylinux_2_28_passes(tmp_path: Path) -> None:
    r = check(wheel(tmp_path, ENTRY))
    assert r.returncode == 0, r.stderr
    assert "exports PyInit__core;" in r.stdout and "GLIBC_2." in r.stdout


def test_a_glibc_symbol_newer_than_2_28_fails(tmp_path: Path) -> None:
    import os
    major, minor = (int(x) for x in os.confstr("CS_GNU_LIBC_VERSION").split()[1].split(".")[:2])
    if (major, minor) < (2, 34):
        pytest.skip("needs glibc 2.34 or later to make a GLIBC_2.34 reference")
    r = check(wheel(tmp_path, NEW_GLIBC))
    assert r.returncode == 1
    assert "references GLIBC_2.34, newer than manylinux_2_28's GLIBC_2.28" in r.stderr


def test_gccs_cpp_runtime_needed_fails(tmp_path: Path) -> None:
    r = check(wheel(tmp_path, CXX, lang="c++"))
    assert r.returncode == 1
    assert "needs libstdc++.so.6, not a manylinux system library it may need" in r.stderr


def test_a_symbol_besides_pyinit_exported_fails(tmp_path: Path) -> None:
    r = check(wheel(tmp_path, EXTRA, hidden=False))
    assert r.returncode == 1
    assert "symbols besides PyInit_*" in r.stderr and "H5open" in r.stderr


def test_a_bundled_library_fails(tmp_path: Path) -> None:
    r = check(wheel(tmp_path, ENTRY, bundled=True))
    assert r.returncode == 1
    assert "prestage.libs/libtbb-0a1b2c3d.so.12: a bundled library" in r.stderr


def test_a_cuda_library_in_the_wheel_fails(tmp_path: Path) -> None:
    r = check(wheel(tmp_path, ENTRY, cuda=True))
    assert r.returncode == 1
    assert "prestage/libcudart.so.12: a CUDA library in the wheel" in r.stderr
