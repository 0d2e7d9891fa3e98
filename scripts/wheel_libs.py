"""Checks a repaired prestage wheel's shared libraries; prints the figures the wheel check reports.

    python scripts/wheel_libs.py WHEEL

Every ELF file in the wheel may need only (1) the libraries the wheel bundles (prestage.libs/, named
``<name>-<hash>.so...`` by auditwheel) and (2) the system libraries every manylinux platform
guarantees (libz.so.1 is one for auditwheel, not here: zlib is linked in). The bundled libraries must
be exactly the expected ones, once each: oneTBB, libjpeg-turbo (its two libraries) and zstd. zlib and
HDF5 are linked in statically with their symbols hidden (none exported by the extension), and nothing
from HDF5's network stack (curl, crypto, gnutls, ...) nor any CUDA library may appear. Exits 1 naming
what is wrong.

Uses readelf (binutils), which a machine that built the wheel has.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Dict, List

# The libraries of auditwheel's manylinux policies (the same list for every manylinux tag on x86_64).
SYSTEM = {
    "libc.so.6", "libm.so.6", "libdl.so.2", "librt.so.1", "libpthread.so.0", "libgcc_s.so.1",
    "libstdc++.so.6", "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1", "libcrypt.so.1", "libutil.so.1",
    "libnsl.so.1", "libresolv.so.2", "libX11.so.6", "libXext.so.6", "libXrender.so.1", "libICE.so.6",
    "libSM.so.6", "libGL.so.1", "libgobject-2.0.so.0", "libgthread-2.0.so.0", "libglib-2.0.so.0",
}
# Symbols of the statically linked libraries, which the extension must not export (HDF5's H5*, zlib's).
STATIC_EXPORTS = re.compile(r"^(H5\w*|deflate\w*|inflate\w*|crc32|adler32|zlibVersion|compress2?|uncompress)$")
# Bundled, by the name before auditwheel's hash: one copy of each.
EXPECTED = {"libtbb", "libturbojpeg", "libjpeg", "libzstd"}


def needed(path: Path) -> List[str]:
    out = subprocess.run(["readelf", "-d", str(path)], check=True, capture_output=True, text=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def exported(path: Path) -> List[str]:
    out = subprocess.run(["readelf", "--dyn-syms", "-W", str(path)], check=True, capture_output=True,
                         text=True).stdout
    names = []
    for line in out.splitlines():
        fields = line.split()
        # Num: Value Size Type Bind Vis Ndx Name; defined (Ndx not UND), global or weak.
        if len(fields) >= 8 and fields[0].endswith(":") and fields[6] != "UND" and fields[4] in ("GLOBAL", "WEAK"):
            names.append(fields[7].split("@")[0])
    return names


def is_elf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def main(wheel: str) -> int:
    problems: List[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(wheel) as z:
            z.extractall(tmp)
        root = Path(tmp)
        elves = [p for p in root.rglob("*") if p.is_file() and is_elf(p)]
        bundled: Dict[str, int] = {p.name: p.stat().st_size for p in elves if p.parent.name == "prestage.libs"}
        # auditwheel's names: the hash before the first dot (libtbb-4d79fbbd.so.12.8, libldap-2-062bb940.5.so.0).
        stems = [re.sub(r"-[0-9a-f]{8}(?=\.)", "", name).split(".so")[0] for name in bundled]
        for stem in sorted(set(stems)):
            if stem not in EXPECTED:
                problems.append(f"unexpected bundled library {stem}")
            if stems.count(stem) > 1:
                problems.append(f"{stem} bundled {stems.count(stem)} times")
        for stem in sorted(EXPECTED - set(stems)):
            problems.append(f"{stem} is not bundled")
        for elf in elves:
            for lib in needed(elf):
                if lib not in SYSTEM and lib not in bundled:
                    problems.append(f"{elf.relative_to(root)} needs {lib}, neither bundled nor a manylinux system library")
            if elf.parent.name != "prestage.libs":
                leaked = [n for n in exported(elf) if STATIC_EXPORTS.match(n)]
                if leaked:
                    problems.append(f"{elf.relative_to(root)} exports {len(leaked)} HDF5/zlib symbols ({leaked[:3]})")
            if re.search(r"cuda|nvjpeg|npp", elf.name):
                problems.append(f"{elf.relative_to(root)}: a CUDA library in the wheel")
        print(f"wheel            {Path(wheel).name}")
        print(f"size             {Path(wheel).stat().st_size / 1e6:.2f} MB")
        print("bundled          " + ", ".join(f"{n} ({s / 1e6:.2f} MB)" for n, s in sorted(bundled.items())))
        print(f"bundled, in all  {sum(bundled.values()) / 1e6:.2f} MB (uncompressed)")
    for p in problems:
        print(f"wheel_libs: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
