"""scripts/wheel_libs.py, the check CI runs on the repaired wheel, on wheels made of the system's own
libraries: it passes the expected set and names each kind of fault (an extra or missing bundled library, a
dependency outside the wheel and the manylinux set, exported HDF5/zlib symbols, a CUDA library)."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIB = Path("/usr/lib/x86_64-linux-gnu")
SYSTEM = {"tbb": "libtbb.so.12", "turbojpeg": "libturbojpeg.so.0", "jpeg": "libjpeg.so.62", "zstd": "libzstd.so.1",
          "png": "libpng16.so.16", "z": "libz.so.1"}
CORE = "prestage/_core.cpython-311-x86_64-linux-gnu.so"

pytestmark = pytest.mark.skipif(
    shutil.which("readelf") is None or not all((LIB / f).exists() for f in SYSTEM.values()),
    reason="needs readelf and Debian's x86_64 libraries")


def bundled(name: str) -> str:
    """auditwheel's name for a bundled copy: libtbb.so.12 -> prestage.libs/libtbb-0123abcd.so.12."""
    stem, rest = SYSTEM[name].split(".so", 1)
    return f"prestage.libs/{stem}-0123abcd.so{rest}"


def wheel(tmp_path: Path, files: dict) -> Path:
    path = tmp_path / "prestage-0.1.0-cp311-cp311-manylinux_2_35_x86_64.whl"
    with zipfile.ZipFile(path, "w") as z:
        for arcname, source in files.items():
            z.write(LIB / SYSTEM[source], arcname)
        z.writestr("prestage/__init__.py", "")
    return path


def check(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "wheel_libs.py"), str(path)],
                          capture_output=True, text=True, timeout=60)


def good() -> dict:
    # The extension: any library that needs only the C library and exports no HDF5/zlib symbol.
    return {CORE: "zstd", **{bundled(n): n for n in ("tbb", "turbojpeg", "jpeg", "zstd")}}


def test_the_expected_libraries_pass(tmp_path):
    r = check(wheel(tmp_path, good()))
    assert r.returncode == 0, r.stderr
    assert "libtbb-0123abcd.so.12" in r.stdout and "size" in r.stdout


def test_an_extra_library_and_what_it_needs_are_named(tmp_path):
    r = check(wheel(tmp_path, {**good(), bundled("png"): "png"}))  # libpng needs libz.so.1
    assert r.returncode == 1
    assert "unexpected bundled library libpng16" in r.stderr
    assert "needs libz.so.1" in r.stderr


def test_a_missing_library_is_named(tmp_path):
    files = good()
    del files[bundled("zstd")]
    r = check(wheel(tmp_path, files))
    assert r.returncode == 1 and "libzstd is not bundled" in r.stderr


def test_an_extension_exporting_zlib_symbols_fails(tmp_path):
    r = check(wheel(tmp_path, {**good(), CORE: "z"}))
    assert r.returncode == 1 and "HDF5/zlib symbols" in r.stderr


def test_a_cuda_library_fails(tmp_path):
    r = check(wheel(tmp_path, {**good(), "prestage/libcudart.so.12": "jpeg"}))
    assert r.returncode == 1 and "a CUDA library in the wheel" in r.stderr
