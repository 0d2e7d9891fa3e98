"""Hugging Face datasets sets (Catalog.from_hf): Arrow files written by ``save_to_disk`` and a Dataset's
cache, Parquet written by ``to_parquet`` and by pyarrow. The oracles are ``datasets``' own reader (the
bytes and labels of every row), PIL (the pixels) and pyarrow (which rows of a damaged file it reads)."""

from __future__ import annotations

import io
import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import prestage

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

N = 23
CLASSES = ["cat", "dog", "fish"]


@pytest.fixture(autouse=True)
def _quiet_datasets(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    datasets.disable_progress_bars()


def _jpeg(i: int) -> bytes:
    rng = np.random.default_rng(i)
    small = rng.integers(0, 255, size=(3, 4, 3), dtype=np.uint8)
    out = io.BytesIO()
    # Byte lengths differ from row to row (the quality), so that a wrong offset shows.
    Image.fromarray(small).resize((32, 24), Image.BICUBIC).save(out, format="JPEG", quality=60 + i)
    return out.getvalue()


def _dataset(n: int = N):
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=CLASSES),
                                  "caption": datasets.Value("string")})
    return datasets.Dataset.from_dict(
        {"image": [{"bytes": _jpeg(i), "path": None} for i in range(n)], "label": [i % 3 for i in range(n)],
         "caption": [f"picture {i}" for i in range(n)]}, features=features)


def _reference(ds) -> list:
    """(bytes, label) of every row, as datasets reads them."""
    raw = ds.cast_column("image", datasets.Image(decode=False))
    return [(row["image"]["bytes"], row["label"]) for row in raw]


def _range(cat, i: int) -> bytes:
    _, offset, length = cat.locator(i)
    with open(cat.source_path(i), "rb") as f:
        f.seek(offset)
        return f.read(length)


def _assert_equal(cat, reference) -> None:
    assert len(cat) == len(reference)
    for i, (data, label) in enumerate(reference):
        assert _range(cat, i) == data and cat.label(i) == label


@pytest.fixture
def saved(tmp_path):
    """A save_to_disk folder of three Arrow files, and datasets' own reading of it."""
    _dataset().save_to_disk(str(tmp_path / "saved"), num_shards=3)
    return tmp_path / "saved", _reference(datasets.load_from_disk(str(tmp_path / "saved")))


def test_save_to_disk_reads_back_equal_to_datasets(saved):
    folder, reference = saved
    cat = prestage.Catalog.from_hf(folder)
    assert cat.num_files == 3 and cat.damage == [] and list(cat.classes) == CLASSES
    _assert_equal(cat, reference)
    assert sorted({cat.path(i) for i in range(len(cat))}) == [
        d["filename"] for d in json.loads((folder / "state.json").read_text())["_data_files"]]
    assert (cat.file_sizes() > 0).all()


def test_a_dataset_objects_cache_files_and_a_list_of_files(saved):
    folder, reference = saved
    ds = datasets.load_from_disk(str(folder))
    _assert_equal(prestage.Catalog.from_hf(ds), reference)
    files = sorted(str(p) for p in folder.glob("data-*.arrow"))
    _assert_equal(prestage.Catalog.from_hf(files), reference)
    _assert_equal(prestage.Catalog.from_hf(str(folder / "data-*.arrow")), reference)
    with pytest.raises(prestage.ConfigError, match="flatten_indices"):
        prestage.Catalog.from_hf(ds.shuffle(seed=1))
    with pytest.raises(prestage.ConfigError, match="in memory"):
        prestage.Catalog.from_hf(_dataset(3))
    flat = ds.shuffle(seed=1).flatten_indices()
    _assert_equal(prestage.Catalog.from_hf(flat), _reference(flat))


def test_to_parquet_reads_back_equal_to_datasets(tmp_path):
    ds = _dataset()
    for k in range(2):  # two files of several row groups
        ds.shard(2, k, contiguous=True).to_parquet(str(tmp_path / f"train-{k}.parquet"), batch_size=4)
    assert pq.ParquetFile(tmp_path / "train-0.parquet").metadata.num_row_groups > 1
    files = sorted(str(p) for p in tmp_path.glob("train-*.parquet"))
    reference = _reference(datasets.Dataset.from_parquet(files, cache_dir=str(tmp_path / "c")))
    cat = prestage.Catalog.from_hf(files)
    assert list(cat.classes) == CLASSES and cat.damage == []
    _assert_equal(cat, reference)
    _assert_equal(prestage.Catalog.from_hf(tmp_path), reference)  # a folder of Parquet files


@pytest.mark.parametrize("page_version", ["1.0", "2.0"])
def test_parquet_pages_of_both_versions_many_per_row_group_and_nulls(tmp_path, page_version):
    table = _dataset().data.table
    path = tmp_path / "pages.parquet"
    pq.write_table(table, path, compression="none", use_dictionary=False, data_page_size=300,
                   data_page_version=page_version, row_group_size=10, write_page_checksum=True)
    chunk = pq.ParquetFile(path).metadata.row_group(0).column(0)
    assert chunk.total_compressed_size > 2 * 300  # several pages in a chunk
    cat = prestage.Catalog.from_hf(path)
    _assert_equal(cat, [(_jpeg(i), i % 3) for i in range(N)])
    # A plain binary column, and no labels.
    plain = pa.table({"png": [_jpeg(i) for i in range(5)], "n": pa.array(range(5), pa.int8())})
    pq.write_table(plain, tmp_path / "plain.parquet", compression="none", use_dictionary=False,
                   data_page_version=page_version)
    cat = prestage.Catalog.from_hf(tmp_path / "plain.parquet", fields={"image": "png", "label": None})
    _assert_equal(cat, [(_jpeg(i), -1) for i in range(5)])
    cat = prestage.Catalog.from_hf(tmp_path / "plain.parquet", fields={"data": "png", "label": "n"})
    _assert_equal(cat, [(_jpeg(i), i) for i in range(5)])


def test_loader_decodes_the_jpegs_as_pil_does_and_the_catalog_saves(saved, tmp_path):
    folder, reference = saved
    cat = prestage.Catalog.from_hf(folder)
    cat.save(tmp_path / "hf.catalog")
    loaded = prestage.Catalog.load(tmp_path / "hf.catalog")
    _assert_equal(loaded, reference)
    assert list(loaded.classes) == CLASSES
    seen = []
    with prestage.Loader(loaded, batch_size=4, seed=3, stage_dir=str(tmp_path / "stage")) as loader:
        for batch in loader:
            for k in range(len(batch.labels)):
                seen.append(int(batch.labels[k]))
    assert sorted(seen) == sorted(label for _, label in reference)
    with prestage.Loader(loaded, batch_size=5, shuffle=False) as loader:
        row = 0
        for batch in loader:
            for k in range(len(batch.labels)):
                pil = np.asarray(Image.open(io.BytesIO(reference[row][0])).convert("RGB"))
                np.testing.assert_array_equal(batch.images[k], pil)
                row += 1
    assert row == N


@pytest.mark.torch
def test_torch_loader_gives_the_pixels_pil_gives(tmp_path):
    pytest.importorskip("torch")
    import prestage.torch as pt

    ds = _dataset(12)
    ds.to_parquet(str(tmp_path / "t.parquet"))
    reference = _reference(datasets.Dataset.from_parquet(str(tmp_path / "t.parquet"),
                                                         cache_dir=str(tmp_path / "c")))
    cat = prestage.Catalog.from_hf(tmp_path / "t.parquet")
    rows = 0
    with pt.Loader(cat, batch_size=4, shuffle=False, layout="NHWC") as loader:
        for images, labels in loader:
            for k in range(len(labels)):
                pil = np.asarray(Image.open(io.BytesIO(reference[rows][0])).convert("RGB"))
                np.testing.assert_array_equal(images[k].numpy(), pil)
                assert int(labels[k]) == reference[rows][1]
                rows += 1
    assert rows == 12


# ------------------------------------------------------------------------------------ hostile files

def _page_sizes_at(raw: bytes, at: int) -> tuple:
    """Positions of the uncompressed and stored size varints of the page header at `at` (Thrift
    compact: field 1 type, field 2 uncompressed_page_size, field 3 compressed_page_size, each an i32
    field header 0x15 and a zigzag varint)."""
    def varint_end(p: int) -> int:
        while raw[p] & 0x80:
            p += 1
        return p + 1

    assert raw[at] == 0x15
    p2 = varint_end(at + 1)
    assert raw[p2] == 0x15
    p3 = varint_end(p2 + 1)
    assert raw[p3] == 0x15
    return p2 + 1, p3 + 1


def _zigzag(raw: bytearray, at: int, delta: int) -> None:
    """Adds `delta` to the zigzag varint at `at`, keeping its length."""
    end = at
    while raw[end] & 0x80:
        end += 1
    value = 0
    for k, b in enumerate(raw[at:end + 1]):
        value |= (b & 0x7F) << (7 * k)
    value = ((value >> 1) ^ -(value & 1)) + delta
    z = (value << 1) ^ (value >> 63)
    out = []
    for _ in range(end + 1 - at):
        out.append(z & 0x7F | 0x80)
        z >>= 7
    out[-1] &= 0x7F
    assert z == 0
    raw[at:end + 1] = bytes(out)


def _page_length_lies(tmp_path: Path, delta: int):
    ds = _dataset()
    path = tmp_path / "lies.parquet"
    ds.to_parquet(str(path), batch_size=8)  # row groups of rows 0..7, 8..15, 16..22
    md = pq.ParquetFile(path).metadata
    assert md.num_row_groups == 3
    at = md.row_group(1).column(0).data_page_offset
    raw = bytearray(path.read_bytes())
    p2, p3 = _page_sizes_at(bytes(raw), at)
    _zigzag(raw, p3, delta)  # both sizes lie alike (an uncompressed page has them equal)
    _zigzag(raw, p2, delta)
    path.write_bytes(bytes(raw))
    return path, set(range(8)) | set(range(16, N)), "rows 8..15"


@pytest.mark.parametrize("delta", [-9, 7])
def test_a_parquet_page_whose_length_lies(tmp_path, delta):
    path, good, rows = _page_length_lies(tmp_path, delta)
    with pytest.raises(prestage.DecodeError) as raised:
        prestage.Catalog.from_hf(path)
    message = str(raised.value)
    assert str(path) in message and "image.bytes" in message and rows in message
    assert "length lies" in message or "past" in message
    with pytest.warns(RuntimeWarning, match="from_hf"):
        cat = prestage.Catalog.from_hf(path, on_error="skip")
    assert len(cat.damage) == 1 and rows in cat.damage[0]["reason"]
    _assert_every_good_row(cat, good)


def _assert_every_good_row(cat, good: set) -> None:
    """Every kept sample is the JPEG of its row (found by its bytes), and each good row is there once."""
    by_bytes = {_jpeg(i): i for i in range(N)}
    rows = [by_bytes[_range(cat, i)] for i in range(len(cat))]
    assert sorted(rows) == sorted(good)
    assert all(cat.label(i) == rows[i] % 3 for i in range(len(cat)))
    with prestage.Loader(cat, batch_size=4, shuffle=False) as loader:
        assert sum(len(b.labels) for b in loader) == len(good)


def test_a_truncated_arrow_file(tmp_path):
    ds = _dataset()
    folder = tmp_path / "saved"
    ds.save_to_disk(str(folder), num_shards=2, )
    files = sorted(folder.glob("data-*.arrow"))
    # Several record batches in the second file, cut in its last.
    table = pa.ipc.open_stream(files[1].read_bytes()).read_all()  # not mapped: rewritten below
    with pa.OSFile(str(files[1]), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=4):
            writer.write_batch(batch)
    raw = files[1].read_bytes()
    files[1].write_bytes(raw[: len(raw) - 700])
    # pyarrow, the oracle: the rows it reads before the damage.
    readable = 0
    reader = pa.ipc.open_stream(files[1].read_bytes())
    while True:
        try:
            readable += reader.read_next_batch().num_rows
        except (StopIteration, pa.ArrowInvalid, OSError):
            break
    first = len(pa.ipc.open_stream(files[0].read_bytes()).read_all())
    assert 0 < readable < N - first
    with pytest.raises(prestage.DecodeError) as raised:
        prestage.Catalog.from_hf(folder)
    assert str(files[1]) in str(raised.value) and f"row {first + readable}" in str(raised.value)
    with pytest.warns(RuntimeWarning, match="from_hf"):
        cat = prestage.Catalog.from_hf(folder, on_error="skip")
    assert cat.damage[0]["rest_of_file"] and cat.damage[0]["path"] == str(files[1])
    _assert_every_good_row(cat, set(range(first + readable)))


def test_a_compressed_or_dictionary_encoded_parquet_column(tmp_path):
    table = _dataset().data.table
    good = tmp_path / "a.parquet"
    pq.write_table(table.slice(0, 10), good, compression="none", use_dictionary=False)
    for name, args in (("snappy", {"compression": "snappy"}),
                       ("dictionary", {"compression": "none", "use_dictionary": True})):
        bad = tmp_path / f"b-{name}.parquet"
        pq.write_table(table.slice(10), bad, **args)
        what = "is compressed (SNAPPY)" if name == "snappy" else "dictionary-encoded"
        with pytest.raises(prestage.ConfigError) as raised:
            prestage.Catalog.from_hf([good, bad])
        message = str(raised.value)
        assert str(bad) in message and "image.bytes" in message and what in message
        assert "compression='none', use_dictionary=False" in message
        with pytest.warns(RuntimeWarning, match="from_hf"):
            cat = prestage.Catalog.from_hf([good, bad], on_error="skip")
        _assert_every_good_row(cat, set(range(10)))
        # The command the message gives rewrites the file so that it is read.
        fixed = tmp_path / f"fixed-{name}.parquet"
        pq.write_table(pq.read_table(bad), fixed, compression="none", use_dictionary=False)
        _assert_equal(prestage.Catalog.from_hf(fixed), [(_jpeg(i), i % 3) for i in range(10, N)])
        bad.unlink()


def test_a_compressed_arrow_stream_and_rows_without_bytes(tmp_path):
    table = _dataset(5).data.table
    path = tmp_path / "z.arrow"
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema, options=options) as w:
        w.write_table(table)
    for on_error in ("raise", "skip"):
        with pytest.raises(prestage.ConfigError, match="z.arrow.*column 'image'.*compressed"):
            prestage.Catalog.from_hf(path, on_error=on_error)
    # An image stored by path only (datasets keeps the path of a file it was given).
    (tmp_path / "pic.jpg").write_bytes(_jpeg(0))
    ds = datasets.Dataset.from_dict({"image": [{"bytes": _jpeg(1), "path": None},
                                               {"bytes": None, "path": str(tmp_path / "pic.jpg")},
                                               {"bytes": _jpeg(2), "path": None}],
                                     "label": [1, 0, 2]},
                                    features=datasets.Features({"image": datasets.Image(),
                                                                "label": datasets.Value("int64")}))
    # save_to_disk embeds the file's bytes: the table datasets holds, written as its cache file is.
    assert ds.data.table.column("image").combine_chunks().field("bytes").null_count == 1
    (tmp_path / "paths").mkdir()
    with pa.OSFile(str(tmp_path / "paths" / "cache.arrow"), "wb") as sink, \
            pa.ipc.new_stream(sink, ds.data.table.schema) as w:
        w.write_table(ds.data.table)
    with pytest.raises(prestage.DecodeError, match="column 'image', row 1: no image bytes"):
        prestage.Catalog.from_hf(tmp_path / "paths")
    with pytest.warns(RuntimeWarning, match="from_hf"):
        cat = prestage.Catalog.from_hf(tmp_path / "paths", on_error="skip")
    assert [(_range(cat, i), cat.label(i)) for i in range(len(cat))] == [(_jpeg(1), 1), (_jpeg(2), 2)]


def test_errors_name_what_is_wrong(saved, tmp_path):
    folder, _ = saved
    with pytest.raises(prestage.ConfigError, match="no image column 'photo'; its columns: image, label"):
        prestage.Catalog.from_hf(folder, fields={"image": "photo"})
    with pytest.raises(prestage.ConfigError, match="label column 'caption' is of type string"):
        prestage.Catalog.from_hf(folder, fields={"image": "image", "label": "caption"})
    with pytest.raises(prestage.ConfigError, match="fields takes the keys"):
        prestage.Catalog.from_hf(folder, fields={"picture": "image"})
    with pytest.raises(prestage.ConfigError, match="on_error"):
        prestage.Catalog.from_hf(folder, on_error="ignore")
    with pytest.raises(prestage.IoError):
        prestage.Catalog.from_hf(tmp_path / "nowhere")
    datasets.DatasetDict({"train": _dataset(2)}).save_to_disk(str(tmp_path / "dict"))
    with pytest.raises(prestage.ConfigError, match=r"DatasetDict of splits \['train'\]"):
        prestage.Catalog.from_hf(tmp_path / "dict")
    cat = prestage.Catalog.from_hf(tmp_path / "dict" / "train")
    assert len(cat) == 2


def test_cli_scans_a_set_once_and_saves_it(saved, tmp_path, capsys):
    from prestage.cli import main

    folder, reference = saved
    rc = main(["catalog", str(folder), str(tmp_path / "hf.catalog"), "--hf", "--quiet", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    report = json.loads(out)
    assert report["samples"] == N and report["damaged"] == 0 and report["classes"] == 3
    _assert_equal(prestage.Catalog.load(tmp_path / "hf.catalog"), reference)
    rc = main(["catalog", str(folder), str(tmp_path / "x.catalog"), "--hf", "--quiet",
               "--labels", "caption"])
    out, err = capsys.readouterr()
    assert rc == 2 and "label column 'caption' is of type string" in err


@pytest.mark.parametrize("fmt", ["parquet-v1", "parquet-v2", "arrow"])
def test_random_damage_is_an_error_never_a_crash(tmp_path, fmt):
    """Random bytes changed in the image column's pages (Parquet) or anywhere past the schema (Arrow):
    from_hf gives a catalog or a prestage error, with either policy, and every sample it keeps is one
    of the images written."""
    table = _dataset(12).data.table
    path = tmp_path / ("set.arrow" if fmt == "arrow" else "set.parquet")
    if fmt == "arrow":
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=4):
                writer.write_batch(batch)
        first = len(path.read_bytes()) // 4
        span = (first, len(path.read_bytes()))
    else:
        pq.write_table(table, path, compression="none", use_dictionary=False, data_page_size=400,
                       row_group_size=5, data_page_version=fmt[-2:].replace("v", "") + ".0")
        md = pq.ParquetFile(path).metadata
        start = md.row_group(0).column(0).data_page_offset
        last = md.row_group(md.num_row_groups - 1).column(0)
        span = (start, last.data_page_offset + last.total_compressed_size)
    clean = path.read_bytes()
    images = {_jpeg(i) for i in range(12)}
    rng = np.random.default_rng(5)
    outcomes = set()
    for _ in range(int(os.environ.get("HF_TRIALS", "150"))):
        raw = bytearray(clean)
        for at in rng.integers(span[0], span[1], size=int(rng.integers(1, 4))):
            raw[at] = int(rng.integers(0, 256))
        path.write_bytes(bytes(raw))
        for on_error in ("raise", "skip"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                try:
                    cat = prestage.Catalog.from_hf(path, on_error=on_error)
                except prestage.Error as e:
                    assert str(path) in str(e)
                    outcomes.add("error")
                    continue
            outcomes.add("catalog")
            for i in range(len(cat)):  # a range of the file, and one of the images where intact
                _, offset, length = cat.locator(i)
                assert offset + length <= len(raw)
                if raw[offset:offset + length] == clean[offset:offset + length]:
                    assert clean[offset:offset + length] in images
    assert outcomes == {"error", "catalog"}
