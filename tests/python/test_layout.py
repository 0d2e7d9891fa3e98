"""cpp/src reads top-down: a file of one room (a folder of cpp/src) includes only the headers of its own
room, of rooms below it, and public ones (prestage/...); never one of a room above it or beside it.

The levels, top first, follow what each room uses (at link level too: tiers/ and staging/ call Catalog,
implemented in catalog/, so catalog/ must not use them or what uses them):

    pipeline/                the flow graph, the Loader
    decode/  staging/        stage 3's codecs and batch decoder; stage 2's stager and cache
    tiers/   memory/         where a sample's bytes come from; the batch buffers
    catalog/ plan/           the Catalog (from files of any format); stage 1's plan
    formats/                 file formats: .npy/.npz/HDF5/TFRecord headers, records, rows, members
    util/                    files, byte sources, CRC-32C, PRNG, I/O trace

A new room must be placed here before it is used. No build is needed: the check reads the sources.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List

import pytest

SRC = Path(__file__).resolve().parents[2] / "cpp" / "src"

LEVELS = (
    ("pipeline",),
    ("decode", "staging"),
    ("tiers", "memory"),
    ("catalog", "plan"),
    ("formats",),
    ("util",),
)
RANK: Dict[str, int] = {room: depth for depth, rooms in enumerate(LEVELS) for room in rooms}

# "room/..." in quotes, or <room/...> for a name that is a room (so <memory> is not one).
INCLUDE = re.compile(r'^\s*#\s*include\s*(?:"([^"]+)"|<([^>]+)>)', re.MULTILINE)


def violations(src: Path) -> List[str]:
    """Every include under `src` that goes up or sideways, or names no room, as 'file: why' lines."""
    found = []
    rooms = sorted(p.name for p in src.iterdir() if p.is_dir())
    for room in rooms:
        if room not in RANK:
            found.append(f"{room}/: a room with no level in test_layout.LEVELS")
    for path in sorted(p for p in src.rglob("*") if p.suffix in (".hpp", ".cpp", ".h", ".c")):
        rel = path.relative_to(src)
        room = rel.parts[0] if len(rel.parts) > 1 else None  # None: a file at the top (error.cpp)
        for quoted, angled in INCLUDE.findall(path.read_text()):
            name = quoted or angled
            head = name.split("/")[0] if "/" in name else None
            if head == "prestage":
                continue
            if angled and head not in RANK:
                continue  # a system or third-party header
            if head is None or head not in RANK:
                found.append(f"{rel}: includes \"{name}\", which names no room")
            elif room is None:
                found.append(f"{rel}: includes \"{name}\" from the top of cpp/src")
            elif head != room and (room not in RANK or RANK[head] <= RANK[room]):
                found.append(f"{rel}: {room}/ includes \"{name}\", not below it")
    return found


def test_cpp_src_includes_run_top_down() -> None:
    assert violations(SRC) == []


def test_every_level_names_a_room_that_exists() -> None:
    rooms = {p.name for p in SRC.iterdir() if p.is_dir()}
    assert set(RANK) == rooms


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A cpp/src of every room, each file including only what the levels allow."""
    for room in RANK:
        write(tmp_path, f"{room}/a.hpp", '#include "util/x.hpp"\n#include "prestage/error.hpp"\n')
    write(tmp_path, "util/x.hpp", "#include <memory>\n#include <zstd.h>\n")
    write(tmp_path, "error.cpp", '#include "prestage/error.hpp"\n')
    write(tmp_path, "pipeline/b.cpp", '#include "decode/a.hpp"\n#include "pipeline/a.hpp"\n')
    write(tmp_path, "catalog/b.cpp", '#  include "formats/a.hpp"\n')
    return tmp_path


def test_the_check_passes_a_tree_that_runs_top_down(tree: Path) -> None:
    assert violations(tree) == []


@pytest.mark.parametrize(
    "rel, text, why",
    [
        # catalog/ reading formats through decode/ (as before formats/ existed).
        ("catalog/catalog.cpp", '#include "decode/npz.hpp"\n', 'catalog/ includes "decode/npz.hpp"'),
        ("formats/npz.cpp", '#include "decode/zstd.hpp"\n', 'formats/ includes "decode/zstd.hpp"'),
        ("util/y.cpp", '#include "tiers/a.hpp"\n', 'util/ includes "tiers/a.hpp"'),
        # sideways: a room of the same level
        ("decode/y.cpp", '#include "staging/a.hpp"\n', 'decode/ includes "staging/a.hpp"'),
        ("decode/y.cpp", "#include <pipeline/a.hpp>\n", 'decode/ includes "pipeline/a.hpp"'),
        ("decode/y.cpp", '#include "a.hpp"\n', 'includes "a.hpp", which names no room'),
        ("error.cpp", '#include "util/x.hpp"\n', "from the top of cpp/src"),
        ("shards/y.cpp", "", "shards/: a room with no level"),
    ],
)
def test_the_check_refuses_an_include_up_or_sideways(tree: Path, rel: str, text: str, why: str) -> None:
    write(tree, rel, text)
    found = violations(tree)
    assert len(found) == 1 and why in found[0], found
