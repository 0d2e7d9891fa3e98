"""Checks a portable prestage wheel's ELF files against manylinux_2_28; prints the figures it reports.

    python scripts/wheel_libs.py WHEEL

scripts/wheel.sh links everything into the one extension module (oneTBB, libjpeg-turbo, zstd, HDF5,
zlib, libpng, libwebp and LLVM's libc++), so the wheel bundles no library (no prestage.libs/). For every ELF file in
the wheel: (1) it needs only system libraries every manylinux platform guarantees (and never
libstdc++ or libgcc_s: the C++ runtime is inside); (2) no symbol version it references is newer than
manylinux_2_28's policy allows (GLIBC 2.28, GLIBCXX 3.4.24, CXXABI 1.3.11, GCC 7.0.0, auditwheel's
policy table); (3) it exports nothing but ``PyInit_*`` (so no HDF5, zlib, oneTBB or C++ runtime symbol
can meet another copy in the process); no CUDA library. Prints the newest version of each kind per
ELF file. Exits 1 naming what is wrong.

Uses readelf (binutils), which a machine that built the wheel has.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Dict, List, Tuple

# The libraries of auditwheel's manylinux policies (the same list for every manylinux tag on x86_64),
# less the C++ runtime, which the portable wheel links in.
SYSTEM = {
    "libc.so.6", "libm.so.6", "libdl.so.2", "librt.so.1", "libpthread.so.0",
    "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1", "libcrypt.so.1", "libutil.so.1",
    "libnsl.so.1", "libresolv.so.2", "libX11.so.6", "libXext.so.6", "libXrender.so.1", "libICE.so.6",
    "libSM.so.6", "libGL.so.1", "libgobject-2.0.so.0", "libgthread-2.0.so.0", "libglib-2.0.so.0",
}
# manylinux_2_28's symbol version ceilings (auditwheel's policy for x86_64).
CEILING: Dict[str, Tuple[int, ...]] = {"GLIBC": (2, 28), "GLIBCXX": (3, 4, 24), "CXXABI": (1, 3, 11),
                                       "GCC": (7, 0, 0)}
EXPORTED = re.compile(r"^PyInit_\w+$")


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


def versions(path: Path) -> Dict[str, Tuple[int, ...]]:
    """The newest version of each kind (GLIBC, GLIBCXX, CXXABI, GCC) the file references."""
    out = subprocess.run(["readelf", "-W", "--version-info", str(path)], check=True, capture_output=True,
                         text=True).stdout
    newest: Dict[str, Tuple[int, ...]] = {}
    for kind, number in re.findall(r"Name: (GLIBC|GLIBCXX|CXXABI|GCC)_([0-9.]+)", out):
        v = tuple(int(x) for x in number.split("."))
        if v > newest.get(kind, ()):
            newest[kind] = v
    return newest


def dotted(v: Tuple[int, ...]) -> str:
    return ".".join(map(str, v))


def main(wheel: str) -> int:
    problems: List[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(wheel) as z:
            z.extractall(tmp)
        root = Path(tmp)
        elves = [p for p in root.rglob("*") if p.is_file() and is_elf(p)]
        print(f"wheel            {Path(wheel).name}")
        print(f"size             {Path(wheel).stat().st_size / 1e6:.2f} MB")
        if not elves:
            problems.append("no ELF file in the wheel")
        for elf in elves:
            name = str(elf.relative_to(root))
            if elf.parent.name.endswith(".libs"):
                problems.append(f"{name}: a bundled library (the portable wheel links everything in)")
            for lib in needed(elf):
                if lib not in SYSTEM:
                    problems.append(f"{name} needs {lib}, not a manylinux system library it may need")
            newest = versions(elf)
            for kind, v in sorted(newest.items()):
                if v > CEILING[kind]:
                    problems.append(f"{name} references {kind}_{dotted(v)}, newer than manylinux_2_28's "
                                    f"{kind}_{dotted(CEILING[kind])}")
            others = [n for n in exported(elf) if not EXPORTED.match(n)]
            if others:
                problems.append(f"{name} exports {len(others)} symbols besides PyInit_* ({others[:5]})")
            if re.search(r"cuda|nvjpeg|npp", elf.name):
                problems.append(f"{name}: a CUDA library in the wheel")
            print(f"elf              {name} ({elf.stat().st_size / 1e6:.2f} MB): newest "
                  + (", ".join(f"{k}_{dotted(v)}" for k, v in sorted(newest.items())) or "none")
                  + f"; exports {', '.join(exported(elf))}; needs {', '.join(needed(elf))}")
    for p in problems:
        print(f"wheel_libs: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
