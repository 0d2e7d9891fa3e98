"""MosaicML Streaming MDS sets (Catalog.from_mds). MosaicML's own package pulls in a CUDA build of torch,
transformers and several cloud SDKs, so the sets here are written by conftest's `write_mds`, which follows
MDSWriter byte for byte (streaming/base/format/mds/writer.py: columns sorted by name, a u32 size per
variable-size column, then the columns; a shard is u32 n, u32 offsets[n+1] from the file's start, the
JSON config, the samples; encodings.py for each column's bytes). Where `streaming` imports, the last test
reads a set its MDSWriter wrote. The oracle is what was written (bytes, NumPy) and PIL for pixels."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import prestage

def _jpeg(i: int) -> bytes:
    rng = np.random.default_rng(i)
    small = rng.integers(0, 255, size=(3, 4, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(small).resize((32, 24), Image.BICUBIC).save(out, format="JPEG", quality=90)
    return out.getvalue()


COLUMNS = {"image": "jpeg", "label": "int", "caption": "str", "small": "uint8", "text_id": "str_int",
           "arr": "ndarray:float32:2,3", "pix": "pil"}


def _samples(n: int = 10) -> list:
    return [{"image": _jpeg(i), "label": 100 + i, "caption": f"picture {i}" * (i + 1), "small": i,
             "text_id": -i, "arr": np.arange(6, dtype=np.float32).reshape(2, 3) * i,
             "pix": Image.fromarray(np.full((2, 3, 3), i, np.uint8))}
            for i in range(n)]


def _range(cat, i):
    _, offset, length = cat.locator(i)
    with open(cat.source_path(i), "rb") as f:
        f.seek(offset)
        return f.read(length)


def test_columns_are_byte_ranges_of_the_shards(tmp_path, mds_writer):
    samples = _samples()
    root = mds_writer(tmp_path / "set", COLUMNS, samples)
    cat = prestage.Catalog.from_mds(root)
    assert len(cat) == 10 and cat.num_files == 3 and cat.damage == []
    for i, sample in enumerate(samples):
        assert _range(cat, i) == sample["image"] and cat.label(i) == sample["label"]
    by = {
        ("caption", "small"): lambda s: (s["caption"].encode(), s["small"]),
        ("arr", "text_id"): lambda s: (s["arr"].tobytes(), s["text_id"]),
        ("pix", None): lambda s: (s["pix"].tobytes(), -1),
    }
    for (data, label), expect in by.items():
        other = prestage.Catalog.from_mds(root, fields={"data": data, "label": label})
        for i, sample in enumerate(samples):
            assert (_range(other, i), other.label(i)) == expect(sample)


def test_loader_decodes_jpeg_and_raw_columns(tmp_path, mds_writer):
    samples = _samples()
    root = mds_writer(tmp_path / "set", COLUMNS, samples)
    cat = prestage.Catalog.from_mds(root)
    cat.save(tmp_path / "mds.catalog")
    labels = []
    with prestage.Loader(prestage.Catalog.load(tmp_path / "mds.catalog"), batch_size=3, seed=4,
                         stage_dir=str(tmp_path / "stage")) as loader:
        for batch in loader:
            for k, label in enumerate(batch.labels):
                pil = np.asarray(Image.open(io.BytesIO(samples[label - 100]["image"])).convert("RGB"))
                np.testing.assert_array_equal(batch.images[k], pil)
                labels.append(int(label))
    assert sorted(labels) == [100 + i for i in range(10)]
    arrays = prestage.Catalog.from_mds(root, fields={"data": "arr", "label": "small"})
    with prestage.Loader(arrays, batch_size=4, decode="raw", raw_dtype="float32", raw_shape=(2, 3),
                         shuffle=False) as loader:
        for batch in loader:
            for k, label in enumerate(batch.labels):
                np.testing.assert_array_equal(batch.arrays[k], samples[label]["arr"])


def test_bad_fields_and_compressed_shards_are_config_errors(tmp_path, mds_writer):
    root = mds_writer(tmp_path / "set", COLUMNS, _samples(4))
    with pytest.raises(prestage.ConfigError, match=r"no column 'jpg' \(it has: arr \(ndarray:float32:2,3\)"):
        prestage.Catalog.from_mds(root, fields={"image": "jpg", "label": "label"})
    with pytest.raises(prestage.ConfigError, match="label column 'caption' has encoding 'str'"):
        prestage.Catalog.from_mds(root, fields={"image": "image", "label": "caption"})
    with pytest.raises(prestage.ConfigError, match="from_mds: fields takes the keys"):
        prestage.Catalog.from_mds(root, fields={"image": "image", "caption": "caption"})
    with pytest.raises(prestage.ConfigError, match="from_mds: fields needs one 'image' or 'data'"):
        prestage.Catalog.from_mds(root, fields={"image": None})
    index = json.loads((root / "index.json").read_text())
    index["shards"][0].update(compression="zstd", zip_data={"basename": "shard.00000.mds.zstd"})
    (root / "index.json").write_text(json.dumps(index))
    assert len(prestage.Catalog.from_mds(root)) == 4  # its decompressed copy is there
    (root / "shard.00000.mds").unlink()
    with pytest.raises(prestage.IoError, match=r"shard.00000.mds.zstd"):  # nor its zip_data
        prestage.Catalog.from_mds(root)
    index["shards"][0].update(compression="bz2", zip_data={"basename": "shard.00000.mds.bz2"})
    (root / "index.json").write_text(json.dumps(index))
    with pytest.raises(prestage.ConfigError, match=r"shard.00000.mds.bz2' .* is compressed \(bz2\)"):
        prestage.Catalog.from_mds(root)
    (root / "index.json").write_text(json.dumps({"shards": [], "version": 1}))
    with pytest.raises(prestage.ConfigError, match="expected 2"):
        prestage.Catalog.from_mds(root)


def _offset_at(shard: Path, i: int) -> int:
    return int(np.frombuffer(shard.read_bytes()[4 + 4 * i:8 + 4 * i], np.uint32)[0])


def _set_offset(shard: Path, i: int, value: int) -> None:
    data = bytearray(shard.read_bytes())
    data[4 + 4 * i:8 + 4 * i] = np.uint32(value).tobytes()
    shard.write_bytes(bytes(data))


def _out_of_order(shard: Path) -> set:
    _set_offset(shard, 2, _offset_at(shard, 3) + 1)  # sample 1 ends after sample 2 ends: 1 and 2 bad
    return {1, 2}


def _past_the_end(shard: Path) -> set:
    _set_offset(shard, 4, shard.stat().st_size + 100)  # the last sample ends past the file's end
    return {3}


def _sizes_lie(shard: Path) -> set:
    data = bytearray(shard.read_bytes())
    begin = _offset_at(shard, 0)
    data[begin:begin + 4] = np.uint32(7).tobytes()  # sample 0's first variable column size
    shard.write_bytes(bytes(data))
    return {0}


@pytest.mark.parametrize("damage", [_out_of_order, _past_the_end, _sizes_lie])
def test_hostile_offset_tables_raise_naming_the_shard_or_keep_every_good_sample(tmp_path, mds_writer, damage):
    samples = _samples(8)
    root = mds_writer(tmp_path / "set", COLUMNS, samples)
    bad = damage(root / "shard.00001.mds")  # samples 4..7
    with pytest.raises(prestage.DecodeError, match=r"shard.00001.mds.*sample \d"):
        prestage.Catalog.from_mds(root)
    with pytest.warns(RuntimeWarning, match="from_mds"):
        cat = prestage.Catalog.from_mds(root, on_error="skip")
    good = {100 + i for i in range(8)} - {104 + b for b in bad}
    assert {cat.label(i) for i in range(len(cat))} == good and len(cat) == len(good)
    for i in range(len(cat)):
        assert _range(cat, i) == samples[cat.label(i) - 100]["image"]
    assert all("shard.00001.mds" in d["reason"] for d in cat.damage)


def test_a_set_written_by_mosaicml_streaming(tmp_path):
    try:
        from streaming import MDSWriter, StreamingDataset
    except Exception as e:  # not installed, or its heavy dependencies are not
        pytest.skip(f"mosaicml-streaming does not import: {e}")
    samples = _samples(9)
    columns = {"image": "jpeg", "label": "int", "arr": "ndarray:float32:2,3"}
    with MDSWriter(out=str(tmp_path / "set"), columns=columns, size_limit=1 << 12) as out:
        for s in samples:
            out.write({"image": Image.open(io.BytesIO(s["image"])), "label": s["label"], "arr": s["arr"]})
    cat = prestage.Catalog.from_mds(tmp_path / "set")
    reference = StreamingDataset(local=str(tmp_path / "set"), shuffle=False, batch_size=1)
    assert len(cat) == len(reference) == 9
    for i in range(len(cat)):
        assert cat.label(i) == reference[i]["label"]
