"""Shards compressed whole: WebDataset `.tar.gz` / `.tar.zst` and MDS shards written with compression.
They cannot be read by byte range, so the catalog locates samples in their decompressed bytes (one
streaming pass of decompression) and stage 2 writes them decompressed to the stage directory, whence
every sample is read. The oracles: the same samples written uncompressed (prestage's catalog of them
and its batches), webdataset's own reader (which reads `.tar.gz` transparently), PIL for pixels, and
the bytes an MDS set was written with."""

from __future__ import annotations

import gc
import gzip
import io
import json
import shutil
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import prestage

wds = pytest.importorskip("webdataset")
zstandard = pytest.importorskip("zstandard")

SIZE = (24, 40)


def _jpeg(i: int) -> bytes:
    rng = np.random.default_rng(i)
    small = rng.integers(0, 255, size=(4, 5, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(small).resize((SIZE[1], SIZE[0]), Image.BICUBIC).save(out, format="JPEG", quality=90)
    return out.getvalue()


def _sample(i: int) -> dict:
    return {"__key__": f"s{i:05d}", "jpg": _jpeg(i), "cls": str(i).encode()}


def _write(pattern: str, n: int, per_shard: int) -> None:
    with wds.ShardWriter(pattern, maxcount=per_shard, verbose=0) as sink:
        for i in range(n):
            sink.write(_sample(i))


@pytest.fixture
def sets(tmp_path: Path):
    """The same 20 samples in 4 shards: plain (`plain/`), and gzip as webdataset's ShardWriter writes
    a `.tar.gz` name (`gz/`); returns (plain pattern, gz pattern)."""
    (tmp_path / "plain").mkdir()
    (tmp_path / "gz").mkdir()
    _write(str(tmp_path / "plain" / "train-%06d.tar"), 20, 5)
    _write(str(tmp_path / "gz" / "train-%06d.tar.gz"), 20, 5)
    return (str(tmp_path / "plain" / "train-{000000..000003}.tar"),
            str(tmp_path / "gz" / "train-{000000..000003}.tar.gz"))


def _reference(pattern: str) -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        samples = list(wds.WebDataset(pattern, shardshuffle=False, empty_check=False))
        gc.collect()
    return samples


def _epoch(cat: prestage.Catalog, stage: Path, **options) -> dict:
    """index -> (image, label) for one shuffled epoch."""
    out = {}
    with prestage.Loader(cat, batch_size=4, seed=7, stage_dir=str(stage), **options) as loader:
        for batch in loader:
            for k, index in enumerate(batch.indices):
                out[int(index)] = (np.array(batch.images[k]), int(batch.labels[k]))
    return out


def test_gzip_shards_written_by_webdataset_read_back_equal_to_the_plain_set(sets, tmp_path):
    plain_pattern, gz_pattern = sets
    assert Path(gz_pattern.replace("{000000..000003}", "000000")).read_bytes()[:2] == b"\x1f\x8b"
    plain = prestage.Catalog.from_webdataset(plain_pattern)
    gz = prestage.Catalog.from_webdataset(gz_pattern)
    assert len(gz) == len(plain) == 20 and gz.damage == []
    assert gz.compressed and not plain.compressed
    assert [gz.file_codec(f) for f in range(gz.num_files)] == ["gzip"] * 4
    # Offsets of the decompressed bytes: those of the same tar written plain, and its sizes.
    assert [gz.locator(i) for i in range(20)] == [plain.locator(i) for i in range(20)]
    assert list(gz.file_sizes()) == list(plain.file_sizes())
    reference = _reference(gz_pattern)
    got = _epoch(gz, tmp_path / "stage-gz")
    expect = _epoch(plain, tmp_path / "stage-plain")
    assert sorted(got) == list(range(20))
    for index, (image, label) in got.items():
        pil = np.asarray(Image.open(io.BytesIO(reference[index]["jpg"])).convert("RGB"))
        np.testing.assert_array_equal(image, pil)
        np.testing.assert_array_equal(image, expect[index][0])
        assert label == int(reference[index]["cls"]) == expect[index][1]


def test_copies_are_the_decompressed_shards_read_once_each(sets, tmp_path):
    _, gz_pattern = sets
    cat = prestage.Catalog.from_webdataset(gz_pattern)
    stage = tmp_path / "stage"
    with prestage.Loader(cat, batch_size=4, seed=1, stage_dir=str(stage), decode="raw") as loader:
        for _ in range(2):
            for _batch in loader:
                pass
        stats = loader.stats()
    assert stats["source_reads"] == cat.num_files  # each shard read once, whole: never by range
    decompressed = sorted(gzip.decompress(p.read_bytes()) for p in sorted(Path(gz_pattern).parent.glob("*.gz")))
    copies = sorted(p.read_bytes() for p in stage.rglob("*") if p.is_file() and p.parent.name != p.parent.parent.name
                    and p.name.isalnum() and len(p.name) <= 2 and p.stat().st_size in set(cat.file_sizes()))
    assert copies == decompressed


def _gnu_tar(tmp_path: Path, flag: str, suffix: str, n: int = 6) -> tuple:
    members = tmp_path / "members"
    members.mkdir()
    for i in range(n):
        (members / f"s{i:05d}.jpg").write_bytes(_jpeg(i))
        (members / f"s{i:05d}.cls").write_text(str(i))
    names = sorted(p.name for p in members.iterdir())
    subprocess.run(["tar", "--format=gnu", "-cf", str(tmp_path / "plain.tar"), *names], cwd=members, check=True)
    subprocess.run(["tar", "--format=gnu", flag, "-cf", str(tmp_path / f"c{suffix}"), *names], cwd=members,
                   check=True)
    return tmp_path / "plain.tar", tmp_path / f"c{suffix}"


@pytest.mark.parametrize("flag,suffix,codec", [("-z", ".tar.gz", "gzip"), ("--zstd", ".tar.zst", "zstd"),
                                               ("-z", ".shard", "gzip")])
def test_gnu_tar_gzip_and_zstd_shards_told_by_their_bytes(tmp_path, flag, suffix, codec):
    if flag == "--zstd" and shutil.which("zstd") is None:
        pytest.skip("GNU tar's --zstd needs the zstd program")
    plain_tar, compressed = _gnu_tar(tmp_path, flag, suffix)
    plain = prestage.Catalog.from_webdataset(str(plain_tar))
    cat = prestage.Catalog.from_webdataset(str(compressed))
    assert cat.file_codec(0) == codec
    assert [cat.locator(i) for i in range(len(cat))] == [plain.locator(i) for i in range(len(plain))]
    got = _epoch(cat, tmp_path / "stage")
    for index, (image, label) in got.items():
        pil = np.asarray(Image.open(io.BytesIO(_jpeg(label))).convert("RGB"))
        np.testing.assert_array_equal(image, pil)
    assert sorted(label for _, label in got.values()) == list(range(6))


def test_the_catalog_saves_and_loads_its_codecs(sets, tmp_path):
    _, gz_pattern = sets
    cat = prestage.Catalog.from_webdataset(gz_pattern)
    cat.save(tmp_path / "gz.catalog")
    loaded = prestage.Catalog.load(tmp_path / "gz.catalog")
    assert loaded.compressed and loaded.fingerprint == cat.fingerprint
    assert [loaded.file_codec(f) for f in range(4)] == ["gzip"] * 4
    assert list(loaded.file_sizes()) == list(cat.file_sizes())
    assert sorted(_epoch(loaded, tmp_path / "stage")) == list(range(20))


def test_without_a_stage_directory_a_clear_error(sets):
    _, gz_pattern = sets
    cat = prestage.Catalog.from_webdataset(gz_pattern)
    with pytest.raises(prestage.ConfigError, match=r"a stage directory is needed .* cannot be read by byte range"):
        prestage.Loader(cat, batch_size=4)


def test_a_bound_smaller_than_a_decompressed_shard_is_refused(sets, tmp_path):
    _, gz_pattern = sets
    cat = prestage.Catalog.from_webdataset(gz_pattern)
    largest = int(max(cat.file_sizes()))
    with pytest.raises(prestage.ConfigError, match=rf"smaller than the largest decompressed shard \({largest} bytes\)"):
        prestage.Loader(cat, batch_size=4, stage_dir=str(tmp_path / "stage"), cache_bytes=largest - 1)


def test_the_bound_counts_decompressed_bytes(tmp_path):
    (tmp_path / "gz").mkdir()
    _write(str(tmp_path / "gz" / "train-%06d.tar.gz"), 40, 5)  # 8 shards
    cat = prestage.Catalog.from_webdataset(str(tmp_path / "gz" / "train-{000000..000007}.tar.gz"))
    sizes = [int(s) for s in cat.file_sizes()]
    stored = sum(p.stat().st_size for p in (tmp_path / "gz").iterdir())
    bound = 3 * max(sizes)  # room for 3 of the 8 decompressed shards
    assert stored < bound < sum(sizes)  # the compressed set would fit: the bound is on the copies
    stage = tmp_path / "stage"
    seen = []
    # A shard a batch, LRU: copies are evicted as the epoch goes (clairvoyant eviction declines
    # files read once before their copies would be evicted: those samples are decompressed from
    # the source instead, and the batches in flight keep theirs).
    with prestage.Loader(cat, batch_size=5, shuffle=False, stage_dir=str(stage), cache_bytes=bound,
                         lookahead=1, decode="raw", eviction="lru") as loader:
        for _ in range(2):
            for batch in loader:
                for k, label in enumerate(batch.labels):
                    assert bytes(batch.arrays[k]) == _jpeg(int(label))
                    seen.append(int(label))
                on_disk = sum(p.stat().st_size for p in stage.rglob("*")
                              if p.is_file() and p.stat().st_size in set(sizes))
                assert on_disk <= bound
        stats = loader.stats()
    assert sorted(seen) == sorted(list(range(40)) * 2)
    assert stats["cache_bytes"] == bound and stats["stage_bytes_peak"] <= bound
    assert stats["staged_files"] > 3  # more copies made than fit at once: evicted as it went


# ------------------------------------------------------------------------------ MDS


def _compress_mds(root: Path, codec: str) -> None:
    """Rewrites an MDS set as MDSWriter(compression=codec) leaves it: each shard's zip_data, no raw_data."""
    index = json.loads((root / "index.json").read_text())
    for shard in index["shards"]:
        raw = root / shard["raw_data"]["basename"]
        data = raw.read_bytes()
        packed = zstandard.ZstdCompressor(level=3).compress(data) if codec == "zstd" else gzip.compress(data)
        name = raw.name + "." + codec
        (root / name).write_bytes(packed)
        raw.unlink()
        shard.update(compression=codec, zip_data={"basename": name, "bytes": len(packed), "hashes": {}})
    (root / "index.json").write_text(json.dumps(index, sort_keys=True))


MDS_COLUMNS = {"image": "jpeg", "label": "int", "caption": "str"}


@pytest.mark.parametrize("codec", ["zstd", "gz"])
def test_mds_shards_written_with_compression_read_back_equal(tmp_path, mds_writer, codec):
    samples = [{"image": _jpeg(i), "label": 100 + i, "caption": f"picture {i}" * (i + 1)} for i in range(10)]
    plain = prestage.Catalog.from_mds(mds_writer(tmp_path / "plain", MDS_COLUMNS, samples))
    root = mds_writer(tmp_path / "set", MDS_COLUMNS, samples)
    _compress_mds(root, codec)
    cat = prestage.Catalog.from_mds(root)
    assert len(cat) == 10 and cat.damage == [] and cat.compressed
    assert Path(cat.source_path(0)).name == f"shard.00000.mds.{codec}"
    assert [cat.locator(i) for i in range(10)] == [plain.locator(i) for i in range(10)]
    got = _epoch(cat, tmp_path / "stage")
    for index, (image, label) in got.items():
        pil = np.asarray(Image.open(io.BytesIO(samples[index]["image"])).convert("RGB"))
        np.testing.assert_array_equal(image, pil)
        assert label == samples[index]["label"]
    captions = prestage.Catalog.from_mds(root, fields={"data": "caption", "label": "label"})
    with prestage.Loader(captions, batch_size=3, decode="raw", stage_dir=str(tmp_path / "stage2")) as loader:
        for batch in loader:
            for k, label in enumerate(batch.labels):
                assert bytes(batch.arrays[k]) == samples[label - 100]["caption"].encode()


def test_mds_with_another_compression_is_refused_naming_it(tmp_path, mds_writer):
    root = mds_writer(tmp_path / "set", MDS_COLUMNS, [{"image": _jpeg(0), "label": 1, "caption": "a"}])
    _compress_mds(root, "zstd")
    index = json.loads((root / "index.json").read_text())
    index["shards"][0]["compression"] = "br"
    (root / "index.json").write_text(json.dumps(index))
    with pytest.raises(prestage.ConfigError, match=r"is compressed \(br\): prestage decompresses zstd and gz"):
        prestage.Catalog.from_mds(root)


# ------------------------------------------------------------------------------ hostile streams


def _corrupt(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    for at in range(len(raw) // 3, len(raw) // 3 + 64):
        raw[at] ^= 0x5A
    path.write_bytes(bytes(raw))


def _truncate(path: Path) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) * 2 // 3])


@pytest.mark.parametrize("damage", [_corrupt, _truncate])
def test_a_damaged_gzip_stream_at_catalog_time_raises_or_is_skipped_naming_the_shard(sets, damage):
    _, gz_pattern = sets
    bad = Path(gz_pattern.replace("{000000..000003}", "000002"))
    damage(bad)
    with pytest.raises(prestage.DecodeError, match=r"train-000002\.tar\.gz.*gzip stream"):
        prestage.Catalog.from_webdataset(gz_pattern)
    with pytest.warns(RuntimeWarning):
        cat = prestage.Catalog.from_webdataset(gz_pattern, on_error="skip")
    assert sorted(cat.label(i) for i in range(len(cat))) == [i for i in range(20) if not 10 <= i < 15]
    [entry] = cat.damage
    assert Path(entry["path"]).name == "train-000002.tar.gz" and entry["offset"] == 0
    assert entry["rest_of_file"] and "gzip stream" in entry["reason"]


@pytest.mark.parametrize("damage", [_corrupt, _truncate])
def test_a_shard_damaged_after_the_catalog_is_an_error_naming_it_at_its_batch(sets, tmp_path, damage):
    _, gz_pattern = sets
    cat = prestage.Catalog.from_webdataset(gz_pattern)
    bad = Path(gz_pattern.replace("{000000..000003}", "000001"))
    damage(bad)
    with pytest.raises((prestage.DecodeError, prestage.IoError), match=r"train-000001\.tar\.gz"):
        _epoch(cat, tmp_path / "stage-raise")
    got = _epoch(cat, tmp_path / "stage-skip", on_error="skip")
    # The bad shard's samples replaced by good ones: every good sample delivered, none of its.
    assert sorted(got) == [i for i in range(20) if not 5 <= i < 10]
    for index, (image, label) in got.items():
        assert label == index
        np.testing.assert_array_equal(image, np.asarray(Image.open(io.BytesIO(_jpeg(index))).convert("RGB")))


@pytest.mark.torch
def test_the_staged_sampler_hands_out_ranges_of_the_decompressed_copies(sets, tmp_path):
    pytest.importorskip("torch")
    from conftest import sampler_reads

    _, gz_pattern = sets
    reference = _reference(gz_pattern)
    got = sampler_reads(prestage.Catalog.from_webdataset(gz_pattern), tmp_path / "stage")
    assert all(data == reference[label]["jpg"] for data, label in got)
    assert sorted(label for _, label in got) == sorted(list(range(20)) * 2)


@pytest.mark.torch
def test_the_staged_sampler_keeps_the_bound_and_decompresses_what_it_has_no_room_for(tmp_path):
    """decode="locate" on shards compressed whole with a bound of about two decompressed shards: a
    shard's copy is made only on a reservation within the bound (checked on disk after every batch);
    a sample with no room for its shard's copy is handed out as its bytes decompressed from the
    source ("memory"), never an error."""
    pytest.importorskip("torch")
    import prestage.torch as pt

    (tmp_path / "gz").mkdir()
    _write(str(tmp_path / "gz" / "train-%06d.tar.gz"), 40, 5)  # 8 shards
    cat = prestage.Catalog.from_webdataset(str(tmp_path / "gz" / "train-{000000..000007}.tar.gz"))
    sizes = {int(s) for s in cat.file_sizes()}
    bound = 2 * max(sizes) + max(sizes) // 2
    stage = tmp_path / "stage"
    sampler = pt.StagedSampler(cat, batch_size=8, stage_dir=str(stage), cache_bytes=bound, seed=3,
                               lookahead=2)
    dataset = pt.StagedDataset(sampler, read=lambda sample, label: (sample.tier, bytes(sample.bytes()), label))
    seen, tiers = [], set()
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for batch in sampler:
            on_disk = sum(p.stat().st_size for p in stage.rglob("*")
                          if p.is_file() and p.stat().st_size in sizes)
            assert on_disk <= bound
            for index in batch:
                tier, data, label = dataset[index]
                assert data == _jpeg(label)
                tiers.add(tier)
                seen.append(label)
    sampler.close()
    assert sorted(seen) == sorted(list(range(40)) * 2)
    assert "memory" in tiers  # some shards had no room: their samples were decompressed from the source


@pytest.mark.parametrize("damage", [_corrupt, _truncate])
def test_a_sample_decompressed_from_the_source_is_checked_whole(sets, damage):
    """What the staged sampler hands out where no copy is staged: the sample's bytes from the whole
    stream, checked against the catalog's size and CRC (a shard damaged since: an error naming it)."""
    plain_pattern, gz_pattern = sets
    cat = prestage.Catalog.from_webdataset(gz_pattern)
    for index in range(len(cat)):
        assert prestage._core.decompressed_sample(cat, index) == _jpeg(cat.label(index))
    with pytest.raises(prestage.ConfigError, match="sample 20 of a catalog of 20"):
        prestage._core.decompressed_sample(cat, 20)
    with pytest.raises(prestage.ConfigError, match="not compressed"):
        prestage._core.decompressed_sample(prestage.Catalog.from_webdataset(plain_pattern), 0)
    bad = Path(gz_pattern.replace("{000000..000003}", "000001"))
    damage(bad)
    index = next(i for i in range(len(cat)) if cat.label(i) == 7)
    with pytest.raises((prestage.DecodeError, prestage.IoError), match=r"train-000001\.tar\.gz"):
        prestage._core.decompressed_sample(cat, index)


def test_tf_staged_paths_reads_what_has_no_room_and_says_no_path_holds_it(tmp_path):
    """staged_paths(read=True) hands out the bytes of samples whose shard has no room in the bound;
    read=False, which hands out paths, says that no path holds them (never the compressed shard's)."""
    pytest.importorskip("tensorflow")
    import prestage.tf

    (tmp_path / "gz").mkdir()
    _write(str(tmp_path / "gz" / "train-%06d.tar.gz"), 40, 5)  # 8 shards
    cat = prestage.Catalog.from_webdataset(str(tmp_path / "gz" / "train-{000000..000007}.tar.gz"))
    bound = 2 * max(int(s) for s in cat.file_sizes())
    options = dict(cache_bytes=bound, seed=3, lookahead=2, epochs=1)
    ds = prestage.tf.staged_paths(cat, 8, stage_dir=str(tmp_path / "a"), read=True, **options)
    got = [(bytes(data.numpy()), int(label)) for data, label in ds]
    ds.sampler.close()
    assert sorted(label for _, label in got) == list(range(40))
    assert all(data == _jpeg(label) for data, label in got)
    ds = prestage.tf.staged_paths(cat, 8, stage_dir=str(tmp_path / "b"), **options)
    with pytest.raises(Exception, match=r"is compressed \(gzip\) and its decompressed copy is not staged"):
        for _ in ds:
            pass
    ds.sampler.close()
