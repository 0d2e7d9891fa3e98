"""WebDataset tar shards (Catalog.from_webdataset) written by the real writers (webdataset's TarWriter and
ShardWriter, whose float mtimes make Python's tarfile write a pax header before every member; GNU tar with
long names) read back through prestage sample for sample equal to webdataset's own reader: bytes, and
pixels against PIL. Then the loader's paths (save/load, shuffle and rank split, staging, torch, tf) and
hostile shards, each with on_error="raise" and "skip"."""

from __future__ import annotations

import gc
import io
import json
import shutil
import subprocess
import tarfile
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import prestage
from prestage.plan import epoch_batches

wds = pytest.importorskip("webdataset")

SIZE = (24, 40)  # every image of one size: batches are plain arrays


def _image(i: int) -> np.ndarray:
    rng = np.random.default_rng(i)
    small = rng.integers(0, 255, size=(4, 5, 3), dtype=np.uint8)
    return np.asarray(Image.fromarray(small).resize((SIZE[1], SIZE[0]), Image.BICUBIC))


def _jpeg(i: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(_image(i)).save(out, format="JPEG", quality=90)
    return out.getvalue()


def _sample(i: int) -> dict:
    return {"__key__": f"s{i:05d}", "jpg": _jpeg(i), "cls": str(i).encode(),
            "json": json.dumps({"label": 1000 + i, "caption": f"picture {i}"}).encode(),
            "npy": _npy(i)}


def _npy(i: int) -> bytes:
    out = io.BytesIO()
    np.save(out, np.arange(6, dtype=np.float32).reshape(2, 3) + i)
    return out.getvalue()


@pytest.fixture
def shards(tmp_path: Path):
    """shards(n, per_shard) -> the brace pattern of ShardWriter shards of n samples (keys s00000...)."""

    def write(n: int = 23, per_shard: int = 7) -> str:
        pattern = str(tmp_path / "train-%06d.tar")
        with wds.ShardWriter(pattern, maxcount=per_shard, verbose=0) as sink:
            for i in range(n):
                sink.write(_sample(i))
        last = (n - 1) // per_shard
        return str(tmp_path / f"train-{{000000..{last:06d}}}.tar")

    return write


def _reference(pattern: str) -> list:
    """Every sample as webdataset's own reader gives it, in order. (Its reader leaves each shard's file
    for the garbage collector to close: collected here, with the ResourceWarning that says so.)"""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        samples = list(wds.WebDataset(pattern, shardshuffle=False, empty_check=False))
        gc.collect()
    return samples


def _range(cat: prestage.Catalog, i: int) -> bytes:
    _, offset, length = cat.locator(i)
    with open(cat.source_path(i), "rb") as fh:
        fh.seek(offset)
        return fh.read(length)


def test_shardwriter_shards_read_back_equal_to_webdataset(shards):
    pattern = shards()
    raw = Path(pattern.replace("{000000..000003}", "000000")).read_bytes()
    assert b"PaxHeader" in raw  # tarfile wrote a pax header per member (float mtimes)
    reference = _reference(pattern)
    cat = prestage.Catalog.from_webdataset(pattern)
    assert len(cat) == len(reference) == 23
    assert cat.num_files == 4 and cat.kind == "files" and cat.damage == []
    for i, sample in enumerate(reference):
        assert _range(cat, i) == sample["jpg"]
        assert cat.label(i) == int(sample["cls"])
    unlabelled = prestage.Catalog.from_webdataset(pattern, fields={"image": "jpg", "label": None})
    assert [unlabelled.label(i) for i in range(len(unlabelled))] == [-1] * 23
    by_json = prestage.Catalog.from_webdataset(pattern, fields={"data": "npy", "label": "json:label"})
    for i, sample in enumerate(reference):
        assert _range(by_json, i) == sample["npy"]
        assert by_json.label(i) == json.loads(sample["json"])["label"]


def test_shard_names_are_globs_lists_and_brace_patterns(shards, tmp_path):
    pattern = shards()
    files = sorted(str(p) for p in tmp_path.glob("train-*.tar"))
    expect = [prestage.Catalog.from_webdataset(f).label(0) for f in files]
    for given in (pattern, str(tmp_path / "train-*.tar"), files, [Path(f) for f in files]):
        cat = prestage.Catalog.from_webdataset(given)
        assert len(cat) == 23
        assert [cat.label(i) for i in range(0, 23, 7)] == expect
    with pytest.raises(prestage.ConfigError, match="is named twice"):
        prestage.Catalog.from_webdataset([files[0], str(tmp_path / "train-00000{0,1}.tar")])
    with pytest.raises(prestage.ConfigError, match="no shard matches"):
        prestage.Catalog.from_webdataset(str(tmp_path / "nothing-*.tar"))
    with pytest.raises(prestage.IoError):
        prestage.Catalog.from_webdataset(str(tmp_path / "train-{000000..000009}.tar"))


def test_loader_decodes_the_jpegs_as_pil_does(shards):
    pattern = shards()
    cat = prestage.Catalog.from_webdataset(pattern)
    reference = _reference(pattern)
    seen = 0
    with prestage.Loader(cat, batch_size=5, shuffle=True, seed=3) as loader:
        for batch in loader:
            for k, index in enumerate(batch.indices):
                pil = np.asarray(Image.open(io.BytesIO(reference[index]["jpg"])).convert("RGB"))
                np.testing.assert_array_equal(batch.images[k], pil)
                assert batch.labels[k] == int(reference[index]["cls"])
                seen += 1
    assert seen == 23


def test_npy_members_decode_and_the_catalog_saves(shards, tmp_path):
    cat = prestage.Catalog.from_webdataset(shards(), fields={"data": "npy", "label": "cls"})
    cat.save(tmp_path / "wds.catalog")
    loaded = prestage.Catalog.load(tmp_path / "wds.catalog")
    assert [loaded.locator(i) for i in range(len(cat))] == [cat.locator(i) for i in range(len(cat))]
    with prestage.Loader(loaded, batch_size=4, decode="npy", seed=1) as loader:
        for batch in loader:
            for k, label in enumerate(batch.labels):
                np.testing.assert_array_equal(batch.arrays[k],
                                              np.arange(6, dtype=np.float32).reshape(2, 3) + label)


def test_ranks_split_the_shuffled_epoch_without_duplicates(shards):
    cat = prestage.Catalog.from_webdataset(shards(24, 6))
    seen = []
    for rank in range(2):
        with prestage.Loader(cat, batch_size=3, seed=5, rank=rank, world_size=2, decode="raw") as loader:
            batches = epoch_batches(24, 3, seed=5, epoch=0, rank=rank, world_size=2)
            for batch, plan in zip(loader, batches):
                assert list(batch.indices) == list(plan)
                seen += [int(x) for x in batch.labels]
    assert sorted(seen) == list(range(24))


def test_staging_copies_whole_shards(shards, tmp_path):
    cat = prestage.Catalog.from_webdataset(shards(20, 5))
    stage = tmp_path / "stage"
    labels = []
    with prestage.Loader(cat, batch_size=4, seed=2, stage_dir=str(stage)) as loader:
        for _ in range(2):
            for batch in loader:
                labels += [int(x) for x in batch.labels]
        stats = loader.stats()
    assert sorted(labels) == sorted(list(range(20)) * 2)
    assert stats["source_reads"] <= 2 * cat.num_files  # whole shards, not one read per sample
    copies = [p for p in stage.rglob("*") if p.is_file() and p.stat().st_size in set(cat.file_sizes())]
    assert len(copies) == cat.num_files


def _gnu_tar_set(tmp_path: Path, n: int = 6) -> Path:
    """A shard written by GNU tar --format=gnu, its member names longer than the 100 bytes of a header."""
    src = tmp_path / "src"
    deep = src / ("a-rather-long-folder-name-" * 5).rstrip("-") / "and-another-level-of-folders"
    deep.mkdir(parents=True)
    for i in range(n):
        (deep / f"sample-{i:04d}-with-a-long-key.jpg").write_bytes(_jpeg(i))
        (deep / f"sample-{i:04d}-with-a-long-key.cls").write_bytes(str(i).encode())
    names = sorted(str(p.relative_to(src)) for p in deep.iterdir())
    assert all(len(name) > 100 for name in names)
    out = tmp_path / "gnu.tar"
    subprocess.run(["tar", "--format=gnu", "-cf", str(out), "-C", str(src), *names], check=True)
    return out


@pytest.mark.skipif(shutil.which("tar") is None, reason="needs GNU tar")
def test_gnu_tar_long_names_read_back_equal_to_webdataset(tmp_path):
    shard = _gnu_tar_set(tmp_path)
    assert b"././@LongLink" in shard.read_bytes()
    reference = _reference(str(shard))
    cat = prestage.Catalog.from_webdataset(shard)
    assert len(cat) == len(reference) == 6
    for i, sample in enumerate(reference):
        assert len(sample["__key__"]) > 100
        assert _range(cat, i) == sample["jpg"]
        assert cat.label(i) == int(sample["cls"])


def test_missing_fields_error_skip_or_empty(tmp_path):
    with wds.TarWriter(str(tmp_path / "m.tar")) as sink:
        sink.write({"__key__": "a", "jpg": _jpeg(0), "cls": b"0"})
        sink.write({"__key__": "b", "cls": b"1"})                    # no image
        sink.write({"__key__": "c", "jpeg": _jpeg(2)})              # no label; .jpeg alternative
    shard = tmp_path / "m.tar"
    with pytest.raises(prestage.DecodeError, match=r"m\.tar.*sample 'b' has no member of extension jpg or jpeg"):
        prestage.Catalog.from_webdataset(shard)
    assert len(prestage.Catalog.from_webdataset(shard, missing="skip")) == 1
    empty = prestage.Catalog.from_webdataset(shard, missing="empty")
    assert [empty.label(i) for i in range(3)] == [0, 1, -1]
    assert empty.locator(1)[2] == 0 and _range(empty, 2) == _jpeg(2)
    with pytest.warns(RuntimeWarning, match="from_webdataset: 2 damaged samples"):
        skipped = prestage.Catalog.from_webdataset(shard, on_error="skip")
    assert len(skipped) == 1 and len(skipped.damage) == 2
    with prestage.Loader(empty, batch_size=3, decode="raw", shuffle=False) as loader:
        batch = next(iter(loader))
        assert batch.shapes[1] == (0,)
    with pytest.raises(prestage.ConfigError, match="missing must be"):
        prestage.Catalog.from_webdataset(shard, missing="maybe")
    with pytest.raises(prestage.ConfigError, match="fields takes"):
        prestage.Catalog.from_webdataset(shard, fields={"image": "jpg", "caption": "txt"})
    with pytest.raises(prestage.ConfigError, match="from_webdataset: fields needs one 'image' or 'data'"):
        prestage.Catalog.from_webdataset(shard, fields={"image": "jpg", "data": "npy"})


# ------------------------------------------------------------------------------------ hostile shards

N_HOSTILE = 8
DAMAGED = 4  # the sample each damage hits


def _hostile_base(tmp_path: Path) -> bytes:
    with wds.TarWriter(str(tmp_path / "base.tar")) as sink:
        for i in range(N_HOSTILE):
            sink.write({"__key__": f"s{i:05d}", "jpg": _jpeg(i), "cls": str(i).encode()})
    return (tmp_path / "base.tar").read_bytes()


def _headers(raw: bytes) -> list:
    """(offset of header, name, typeflag) of every header block, pax ones included, in order."""
    out, pos = [], 0
    while pos + 512 <= len(raw) and raw[pos:pos + 512] != bytes(512):
        name = raw[pos:pos + 100].split(b"\0")[0].decode()
        size = int(raw[pos + 124:pos + 136].split(b"\0")[0].strip() or b"0", 8)
        out.append((pos, name, raw[pos + 156:pos + 157]))
        pos += 512 + (size + 511) // 512 * 512
    return out


def _member(raw: bytes, name: str) -> int:
    return next(off for off, n, t in _headers(raw) if n == name)


def _fix_checksum(raw: bytearray, at: int) -> None:
    block = raw[at:at + 512]
    block[148:156] = b" " * 8
    raw[at + 148:at + 156] = b"%06o\0 " % sum(block)


def _truncated(raw: bytes) -> tuple:
    at = _member(raw, f"s{DAMAGED:05d}.jpg")
    return raw[:at + 512 + 100], set(range(DAMAGED)), f"s{DAMAGED:05d}.jpg"


def _bad_checksum(raw: bytes) -> tuple:
    out = bytearray(raw)
    at = _member(raw, f"s{DAMAGED:05d}.jpg")
    out[at + 100] ^= 0x01  # the mode field: the checksum no longer holds
    return bytes(out), set(range(N_HOSTILE)) - {DAMAGED}, "bad header checksum"


def _size_past_end(raw: bytes) -> tuple:
    out = bytearray(raw)
    at = _member(raw, f"s{DAMAGED:05d}.jpg")
    out[at + 124:at + 136] = b"%011o\0" % (len(raw) * 4)
    _fix_checksum(out, at)
    return bytes(out), set(range(DAMAGED)), "runs past the end"


def _interleaved(raw: bytes) -> tuple:
    # s00004's first member moved after s00005's members: key s00004 comes back.
    heads = _headers(raw)
    starts = [off for off, _, _ in heads] + [len(raw)]
    blocks = []  # (name of the member, its pax header + header + data)
    k = 0
    while k < len(heads):
        off, name, flag = heads[k]
        if flag == b"x":
            k += 1
            name = heads[k][1]
        blocks.append((name, raw[off:starts[k + 1]]))
        k += 1
    names = [n for n, _ in blocks]
    moved = blocks.pop(names.index(f"s{DAMAGED:05d}.cls"))
    after = max(j for j, (n, _) in enumerate(blocks) if n.startswith(f"s{DAMAGED + 1:05d}.")) + 1
    blocks.insert(after, moved)
    return (b"".join(b for _, b in blocks) + bytes(1024), set(range(N_HOSTILE)) - {DAMAGED},
            f"key 's{DAMAGED:05d}'")


def _pax_lies(raw: bytes) -> tuple:
    # The pax header before s00004.cls: its record's length no longer matches the record.
    heads = _headers(raw)
    k = next(j for j, (_, n, _) in enumerate(heads) if n == f"s{DAMAGED:05d}.cls")
    pax_at = heads[k - 1][0]
    assert heads[k - 1][2] == b"x"
    data = bytearray(raw)
    record = raw[pax_at + 512:pax_at + 1024]
    length = record.split(b" ")[0]
    data[pax_at + 512:pax_at + 512 + len(length)] = b"9" * len(length)
    return bytes(data), set(range(N_HOSTILE)) - {DAMAGED}, "pax record"


def _pax_size_lies(raw: bytes) -> tuple:
    # A pax size record that disagrees with the member's header.
    heads = _headers(raw)
    k = next(j for j, (_, n, _) in enumerate(heads) if n == f"s{DAMAGED:05d}.jpg")
    pax_at = heads[k - 1][0]
    data = bytearray(raw)
    size = int(raw[pax_at + 124:pax_at + 136].split(b"\0")[0], 8)
    record = raw[pax_at + 512:pax_at + 512 + size]
    lie = b"12 size=100\n"
    new = record + lie
    data[pax_at + 512:pax_at + 512 + len(new)] = new
    data[pax_at + 124:pax_at + 136] = b"%011o\0" % len(new)
    _fix_checksum(data, pax_at)
    assert len(new) <= 512
    return bytes(data), set(range(N_HOSTILE)) - {DAMAGED}, "pax size"


@pytest.mark.parametrize("damage", [_truncated, _bad_checksum, _size_past_end, _interleaved, _pax_lies,
                                    _pax_size_lies])
def test_hostile_shard_raises_naming_it_or_keeps_every_good_sample(tmp_path, damage):
    bad, good, what = damage(_hostile_base(tmp_path))
    shard = tmp_path / "hostile.tar"
    shard.write_bytes(bad)
    with pytest.raises(prestage.DecodeError) as raised:
        prestage.Catalog.from_webdataset(shard)
    assert str(shard) in str(raised.value) and what in str(raised.value)
    with pytest.warns(RuntimeWarning, match="from_webdataset"):
        cat = prestage.Catalog.from_webdataset(shard, on_error="skip")
    assert {cat.label(i) for i in range(len(cat))} == good
    assert len(cat) == len(good)
    assert all(d["path"] == str(shard) for d in cat.damage) and cat.damage
    for i in range(len(cat)):
        assert _range(cat, i) == _jpeg(cat.label(i))
    with prestage.Loader(cat, batch_size=4, shuffle=False) as loader:  # every kept sample decodes
        assert {int(x) for b in loader for x in b.labels} == good


# --------------------------------------------------------------------------------- framework adaptors

@pytest.mark.torch
def test_torch_loader_gives_the_pixels_pil_gives(shards):
    pytest.importorskip("torch")
    import prestage.torch as pt

    pattern = shards()
    reference = _reference(pattern)
    cat = prestage.Catalog.from_webdataset(pattern)
    labels = []
    with pt.Loader(cat, batch_size=4, seed=7, layout="NHWC") as loader:
        for images, batch_labels in loader:
            for k, label in enumerate(batch_labels.tolist()):
                pil = np.asarray(Image.open(io.BytesIO(reference[label]["jpg"])).convert("RGB"))
                np.testing.assert_array_equal(images[k].numpy(), pil)
                labels.append(label)
    assert sorted(labels) == list(range(23))


@pytest.mark.tf
def test_tf_dataset_gives_the_pixels_pil_gives(shards, tmp_path):
    pytest.importorskip("tensorflow")
    import prestage.tf

    pattern = shards()
    reference = _reference(pattern)
    prestage.Catalog.from_webdataset(pattern).save(tmp_path / "wds.catalog")
    labels = []
    for images, batch_labels in prestage.tf.dataset(tmp_path / "wds.catalog", batch_size=5, seed=2):
        for k, label in enumerate(batch_labels.numpy().tolist()):
            pil = np.asarray(Image.open(io.BytesIO(reference[label]["jpg"])).convert("RGB"))
            np.testing.assert_array_equal(images[k].numpy(), pil)
            labels.append(label)
    assert sorted(labels) == list(range(23))


@pytest.mark.torch
def test_staged_sampler_hands_users_decoders_each_members_bytes(shards, tmp_path):
    pytest.importorskip("torch")
    from conftest import sampler_reads

    pattern = shards(12, 4)
    reference = _reference(pattern)
    got = sampler_reads(prestage.Catalog.from_webdataset(pattern), tmp_path / "stage")
    assert all(data == reference[label]["jpg"] for data, label in got)
    assert sorted(label for _, label in got) == sorted(list(range(12)) * 2)


def test_a_shard_compressed_by_another_codec_than_gzip_or_zstd_is_refused_saying_so(tmp_path):
    # gzip and zstd shards are decompressed while staging (test_compressed_shards.py); bzip2 is not.
    with tarfile.open(tmp_path / "c.tar.bz2", "w:bz2") as tar:
        info = tarfile.TarInfo("a.jpg")
        data = _jpeg(0)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    for on_error in ("raise", "skip"):
        with pytest.raises(prestage.ConfigError, match=r"c\.tar\.bz2' is a tar compressed with bzip2"):
            prestage.Catalog.from_webdataset(tmp_path / "c.tar.bz2", on_error=on_error)


# ------------------------------------------------------------------------------ DALI index import

def _dali_index(shard: Path, version: str) -> str:
    """The `.idx` DALI's wds2idx writes for `shard` (its tarfile path: each regular member's data
    offset, size and name, grouped into samples by key as it groups them)."""
    samples: list = []
    last = None
    with tarfile.open(shard) as tar:
        for member in tar:
            if not member.isreg():
                continue
            slash = member.name.rfind("/") + 1
            dot = member.name.find(".", slash)
            base, ext = member.name[:dot], member.name[dot + 1:]
            parts = (ext, member.offset_data, member.size) + ((member.name,) if version == "v1.2" else ())
            if base != last:
                samples.append([parts])
                last = base
            else:
                samples[-1].append(parts)
    lines = [f"{version} {len(samples)}"] + [" ".join(" ".join(map(str, p)) for p in s) for s in samples]
    return "\n".join(lines) + "\n"


def _catalog_rows(cat) -> list:
    return [(cat.path(i), cat.locator(i), cat.label(i)) for i in range(len(cat))]


@pytest.mark.parametrize("version", ["v1.1", "v1.2"])
def test_a_dali_index_gives_the_catalog_a_scan_gives(shards, tmp_path, version):
    pattern = shards(23, 7)
    tars = sorted(tmp_path.glob("train-*.tar"))
    indexes = []
    for tar in tars:
        indexes.append(tar.with_suffix(".idx"))
        indexes[-1].write_text(_dali_index(tar, version))
    for fields in ({"image": "jpg", "label": "cls"}, {"image": "npy;jpg", "label": "json:label"}):
        scanned = prestage.Catalog.from_webdataset(pattern, fields)
        indexed = prestage.Catalog.from_webdataset(pattern, fields, index=indexes)
        assert _catalog_rows(indexed) == _catalog_rows(scanned) and len(indexed) == 23
    one = prestage.Catalog.from_webdataset(tars[1], index=indexes[1])
    assert [one.label(i) for i in range(len(one))] == list(range(7, 14))


def test_a_wrong_index_is_refused_naming_the_shard(shards, tmp_path):
    shards(14, 7)
    tars = sorted(tmp_path.glob("train-*.tar"))
    for tar in tars:
        tar.with_suffix(".idx").write_text(_dali_index(tar, "v1.2"))
    a, b = (t.with_suffix(".idx") for t in tars)
    # The indexes swapped: names differ (v1.2) where offsets and sizes may agree.
    with pytest.raises(prestage.ConfigError, match=rf"index '{b}' line 2 does not describe shard '{tars[0]}'"):
        prestage.Catalog.from_webdataset(tars[0], index=b)
    bad = tmp_path / "bad.idx"
    text = a.read_text().splitlines()
    ext, offset, size, name = text[1].split()[:4]
    for lie, what in ((text[1].replace(f" {offset} ", f" {int(offset) + 512} ", 1), "tar header"),
                      (text[1].replace(f" {size} ", f" {int(size) + 1} ", 1), "tar header"),
                      (text[1].replace(f" {offset} ", " 1000000000 ", 1), "within the shard")):
        bad.write_text("\n".join([text[0], lie] + text[2:]) + "\n")
        for on_error in ("raise", "skip"):
            with pytest.raises(prestage.ConfigError, match=f"shard '{tars[0]}'.*{what}"):
                prestage.Catalog.from_webdataset(tars[0], index=bad, on_error=on_error)
    bad.write_text("\n".join(text[:-1]) + "\n")  # a sample short of its count
    with pytest.raises(prestage.ConfigError, match="lists 6 samples, its count says 7"):
        prestage.Catalog.from_webdataset(tars[0], index=bad)
    bad.write_text("v2.0 7\n")
    with pytest.raises(prestage.ConfigError, match="not a DALI WebDataset index"):
        prestage.Catalog.from_webdataset(tars[0], index=bad)
    with pytest.raises(prestage.ConfigError, match="1 indexes for 2 shards"):
        prestage.Catalog.from_webdataset([str(t) for t in tars], index=a)
    with pytest.raises(prestage.IoError):
        prestage.Catalog.from_webdataset(tars[0], index=tmp_path / "missing.idx")
