"""`prestage pack` and Catalog.from_shards: shards hold the original bytes (or zstd frames of them), the
index is exact against the files it was packed from, an interrupted pack resumes, bad input is refused."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zstandard

import prestage
from prestage import pack as packing
from prestage.cli import main as cli_main


def crc32c_reference(data: bytes) -> int:
    """CRC-32C bit by bit (Castagnoli, reflected 0x82F63B78): an oracle independent of the core's."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def make_set(root: Path, classes: int = 3, per_class: int = 7, seed: int = 0) -> list:
    """Class folders of files of random bytes and sizes; returns [(relative path, label, bytes)]."""
    rng = np.random.default_rng(seed)
    files = []
    for c in range(classes):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(per_class):
            data = rng.integers(0, 256, int(rng.integers(1, 5000)), dtype=np.uint8).tobytes()
            rel = f"c{c}/f{i:03d}.bin"
            (root / rel).write_bytes(data)
            files.append((rel, c, data))
    return files


def read_index(out: Path):
    lines = (out / "index.tsv").read_text().splitlines()
    assert lines[0] == "# prestage pack 1"
    return [line.split("\t") for line in lines if not line.startswith("#")]


@pytest.mark.parametrize("zstd_level", [None, 5])
def test_shards_hold_every_file_exactly(tmp_path, zstd_level):
    files = make_set(tmp_path / "src")
    summary = packing.pack(tmp_path / "src", tmp_path / "out", shard_bytes=20_000, zstd_level=zstd_level,
                           workers=3)
    rows = read_index(tmp_path / "out")
    assert [(r[5], int(r[3])) for r in rows] == [(rel, label) for rel, label, _ in files]
    assert summary["complete"] and summary["samples"] == len(files)
    assert summary["shards"] == len({r[0] for r in rows}) > 1
    for (shard, offset, length, _, crc, _), (_, _, data) in zip(rows, files):
        with open(tmp_path / "out" / shard, "rb") as f:
            f.seek(int(offset))
            stored = f.read(int(length))
        assert len(stored) == int(length)
        original = stored if zstd_level is None else zstandard.ZstdDecompressor().decompress(stored)
        assert original == data
        assert int(crc, 16) == crc32c_reference(data)
    catalog = prestage.Catalog.from_shards(tmp_path / "out")
    assert len(catalog) == len(files)
    assert catalog.classes == ["c0", "c1", "c2"]
    assert [catalog.label(i) for i in range(len(catalog))] == [label for _, label, _ in files]


def test_packed_jpegs_decode_to_the_same_batches(tmp_path):
    from prestage.synth import make_synthetic_set

    make_synthetic_set(tmp_path / "src", images=40, classes=4, seed=3, workers=1, progress=False)
    source = prestage.Catalog.from_folder(tmp_path / "src")
    for level in (None, 3):
        out = tmp_path / f"out{level}"
        packing.pack(source, out, shard_bytes=300_000, zstd_level=level)
        packed = prestage.Catalog.from_shards(out)
        options = dict(batch_size=8, image_size=(48, 48), shuffle=True, seed=1)
        with prestage.Loader(packed, stage_dir=tmp_path / f"stage{level}", **options) as a, \
                prestage.Loader(source, **options) as b:
            for x, y in zip(a, b):
                np.testing.assert_array_equal(x.images, y.images)
                np.testing.assert_array_equal(x.labels, y.labels)
            stats = a.stats(epochs="all")
        # Staged a shard at a time: no more copies than shards.
        copies = sum(e["copies_made"] for e in stats["epochs"])
        assert 0 < copies <= len(list(out.glob("shard-*.bin")))


def test_an_interrupted_pack_resumes_from_its_last_complete_shard(tmp_path):
    files = make_set(tmp_path / "src", per_class=10)
    catalog = prestage.Catalog.from_folder(tmp_path / "src", [])
    missing = tmp_path / "src" / files[17][0]
    saved = missing.read_bytes()
    missing.unlink()  # listed, then gone: the pack stops at it
    with pytest.raises(FileNotFoundError, match=files[17][0]):
        packing.pack(catalog, tmp_path / "out", shard_bytes=15_000, workers=2)
    done = {p.name[:-4] for p in (tmp_path / "out").glob("shard-*.tsv")}
    assert done, "the shards before the failure are complete"
    inodes = {name: (tmp_path / "out" / f"{name}.bin").stat().st_ino for name in done}
    assert not (tmp_path / "out" / "index.tsv").exists()
    missing.write_bytes(saved)
    packing.pack(catalog, tmp_path / "out", shard_bytes=15_000, workers=2)
    for name, inode in inodes.items():
        assert (tmp_path / "out" / f"{name}.bin").stat().st_ino == inode, f"{name} was written again"
    packing.pack(catalog, tmp_path / "clean", shard_bytes=15_000, workers=1)
    assert (tmp_path / "out" / "index.tsv").read_text() == (tmp_path / "clean" / "index.tsv").read_text()
    assert not list((tmp_path / "out").glob("*.part"))


def test_a_complete_pack_is_not_redone_and_other_parameters_are_refused(tmp_path):
    make_set(tmp_path / "src")
    first = packing.pack(tmp_path / "src", tmp_path / "out", shard_bytes=10_000)
    mtime = (tmp_path / "out" / "index.tsv").stat().st_mtime_ns
    assert packing.pack(tmp_path / "src", tmp_path / "out", shard_bytes=10_000) == first
    assert (tmp_path / "out" / "index.tsv").stat().st_mtime_ns == mtime
    with pytest.raises(FileExistsError, match="other parameters"):
        packing.pack(tmp_path / "src", tmp_path / "out", shard_bytes=20_000)
    again = packing.pack(tmp_path / "src", tmp_path / "out", shard_bytes=20_000, overwrite=True)
    assert again["shard_bytes"] == 20_000
    assert len(read_index(tmp_path / "out")) == first["samples"]
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        packing.pack(tmp_path / "src", tmp_path / "other")


def test_bad_arguments_are_refused(tmp_path):
    make_set(tmp_path / "src")
    with pytest.raises(ValueError, match="shard_bytes"):
        packing.pack(tmp_path / "src", tmp_path / "out", shard_bytes=0)
    with pytest.raises(ValueError, match="workers"):
        packing.pack(tmp_path / "src", tmp_path / "out", workers=0)
    with pytest.raises(FileNotFoundError, match="neither a folder"):
        packing.pack(tmp_path / "nowhere", tmp_path / "out")
    with pytest.raises(prestage.ConfigError, match="zstd level"):
        packing.pack(tmp_path / "src", tmp_path / "out2", zstd_level=99)
    twice = prestage.Catalog.from_paths(tmp_path / "src", ["c0/f000.bin", "c1/f000.bin", "c0/f000.bin"])
    with pytest.raises(ValueError, match="names a sample twice"):
        packing.pack(twice, tmp_path / "twice")


@pytest.mark.parametrize("zstd_level", [None, 5])
def test_a_packed_set_packs_again_by_byte_range_and_frames_are_not_compressed_twice(tmp_path, zstd_level):
    # A packed set's samples are byte ranges of its shards: packed again (into other shard sizes),
    # each keeps its bytes, and a zstd frame stays the frame it is.
    files = make_set(tmp_path / "src")
    packing.pack(tmp_path / "src", tmp_path / "packed", shard_bytes=20_000, zstd_level=zstd_level)
    first = prestage.Catalog.from_shards(tmp_path / "packed")
    packing.pack(first, tmp_path / "again", shard_bytes=9_000, zstd_level=5)
    again = prestage.Catalog.from_shards(tmp_path / "again")
    rows = read_index(tmp_path / "again")
    assert len(rows) == len(files) and len({r[0] for r in rows}) > len({r[0] for r in read_index(
        tmp_path / "packed")})
    for i, ((shard, offset, length, label, _, path), (_, c, data)) in enumerate(zip(rows, files)):
        _, first_offset, first_length = first.locator(i)
        assert path == f"{first.path(i)}@{first_offset}+{first_length}" and int(label) == c
        with open(tmp_path / "again" / shard, "rb") as f:
            f.seek(int(offset))
            stored = f.read(int(length))
        assert zstandard.ZstdDecompressor().decompress(stored) == data  # one frame, never two
        assert again.label(i) == c


def test_a_range_past_the_end_of_its_file_is_an_io_error_naming_it(tmp_path):
    make_set(tmp_path / "src")
    packing.pack(tmp_path / "src", tmp_path / "packed", shard_bytes=20_000)
    cat = prestage.Catalog.from_shards(tmp_path / "packed")
    shard = cat.source_path(len(cat) - 1)
    os.truncate(shard, os.path.getsize(shard) - 1)  # the shard changed since its catalog was built
    with pytest.raises(prestage.IoError, match=rf"sample {len(cat) - 1} is bytes .* of '{shard}', which "
                       "ends at byte"):
        packing.pack(cat, tmp_path / "again")


def write_index(out: Path, body: str) -> None:
    out.mkdir(exist_ok=True)
    (out / "index.tsv").write_text(body)


def test_from_shards_refuses_a_bad_index_naming_the_line(tmp_path):
    with pytest.raises(prestage.IoError, match="prestage pack"):
        prestage.Catalog.from_shards(tmp_path)
    cases = {
        "hello\n": "not a prestage pack index",
        "": "empty index",
        "# prestage pack 1\ns.bin\t0\t4\t0\n": ":2: expected 6 tab-separated fields, found 4",
        "# prestage pack 1\ns.bin\tx\t4\t0\t0\tp\n": ":2: offset 'x'",
        "# prestage pack 1\ns.bin\t0\t-4\t0\t0\tp\n": ":2: length '-4'",
        "# prestage pack 1\ns.bin\t0\t4\tcat\t0\tp\n": ":2: label 'cat'",
        "# prestage pack 1\na.bin\t0\t1\t0\t0\tp\nb.bin\t0\t1\t0\t0\tq\na.bin\t1\t1\t0\t0\tr\n":
            "not on consecutive lines",
        "# prestage pack 1\n../a.bin\t0\t1\t0\t0\tp\n": "escapes the root",
    }
    for n, (body, message) in enumerate(cases.items()):
        write_index(tmp_path / str(n), body)
        with pytest.raises(prestage.ConfigError, match=message):
            prestage.Catalog.from_shards(tmp_path / str(n))


def test_a_truncated_shard_is_named(tmp_path):
    make_set(tmp_path / "src")
    packing.pack(tmp_path / "src", tmp_path / "out", shard_bytes=10_000)
    shard = tmp_path / "out" / "shard-00001.bin"
    os.truncate(shard, shard.stat().st_size - 1)
    with pytest.raises(prestage.DecodeError, match="shard-00001.bin.*truncated"):
        prestage.Catalog.from_shards(tmp_path / "out")


def test_cli(tmp_path, capsys):
    make_set(tmp_path / "src")
    assert cli_main(["pack", str(tmp_path / "src"), str(tmp_path / "out"), "--shard-size", "8K",
                     "--zstd", "--quiet"]) == 0
    summary = json.loads((tmp_path / "out" / "pack.json").read_text())
    assert summary["zstd_level"] == 3 and summary["shard_bytes"] == 8192 and summary["complete"]
    assert cli_main(["pack", str(tmp_path / "src"), str(tmp_path / "out"), "--quiet"]) == 2
    assert "other parameters" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        cli_main(["pack", str(tmp_path / "src"), str(tmp_path / "x"), "--shard-size", "lots"])
    assert exit_.value.code == 2
    # The installed entry point, as a user runs it.
    run = subprocess.run([sys.executable, "-m", "prestage", "pack", str(tmp_path / "src"),
                          str(tmp_path / "out3")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "packed 21 samples into" in run.stdout
