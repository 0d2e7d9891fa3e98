"""Every shard format of another library's (WebDataset tars, MosaicML MDS, Hugging Face Arrow and
Parquet) goes everywhere the older formats go: a catalog that saves and loads, the global shuffle and
the rank split (the same batches for any thread or worker count), ``prestage.torch``, ``prestage.tf``,
the staging sampler, ``prestage pack`` (into prestage shards, read back equal), ``prestage catalog``
and the I/O trace. One parametrised set per cell.

The sets are written by the formats' own writers (webdataset's ShardWriter, ``datasets``'
``save_to_disk`` and ``to_parquet``; MDS by conftest's ``write_mds``, which follows MDSWriter byte for
byte: MosaicML's package pulls in a CUDA build of torch) and the oracles are those libraries' own
readers (each sample's bytes and label, in order; for MDS what was written) and PIL for pixels."""

from __future__ import annotations

import gc
import io
import json
import os
import warnings
from pathlib import Path
from typing import Callable, List, Tuple

import numpy as np
import pytest
from PIL import Image

import prestage
from prestage import pack as packing
from prestage import trace as traces
from prestage.cli import main as cli_main
from prestage.plan import epoch_batches

N = 24
SIZE = (24, 32)  # one size: batches are plain arrays
FORMATS = ["webdataset", "mds", "hf-arrow", "hf-parquet"]
# What `prestage catalog SOURCE OUT` is told for each format.
CLI_FLAG = {"webdataset": "--webdataset", "mds": "--mds", "hf-arrow": "--hf", "hf-parquet": "--hf"}

Reference = List[Tuple[bytes, int]]


def _jpeg(i: int) -> bytes:
    rng = np.random.default_rng(i)
    small = rng.integers(0, 255, size=(3, 4, 3), dtype=np.uint8)
    out = io.BytesIO()
    # Lengths differ from sample to sample (the quality), so that a wrong range shows.
    Image.fromarray(small).resize((SIZE[1], SIZE[0]), Image.BICUBIC).save(out, format="JPEG",
                                                                         quality=60 + i)
    return out.getvalue()


def _write_webdataset(root: Path) -> Tuple[str, Reference]:
    wds = pytest.importorskip("webdataset")
    root.mkdir()
    with wds.ShardWriter(str(root / "train-%06d.tar"), maxcount=7, verbose=0) as sink:
        for i in range(N):
            sink.write({"__key__": f"s{i:05d}", "jpg": _jpeg(i), "cls": str(i).encode()})
    pattern = str(root / "train-{000000..000003}.tar")
    # webdataset's reader leaves each shard's file for the garbage collector to close.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        reference = [(s["jpg"], int(s["cls"]))
                     for s in wds.WebDataset(pattern, shardshuffle=False, empty_check=False)]
        gc.collect()
    return pattern, reference


def _write_mds(root: Path, write_mds: Callable[..., Path]) -> Tuple[str, Reference]:
    samples = [{"image": _jpeg(i), "label": i} for i in range(N)]
    write_mds(root, {"image": "jpeg", "label": "int"}, samples, per_shard=7)
    return str(root), [(s["image"], s["label"]) for s in samples]


def _hf_dataset(tmp_path: Path):
    datasets = pytest.importorskip("datasets")
    pytest.importorskip("pyarrow")
    os.environ["HF_DATASETS_CACHE"] = str(tmp_path / "hf-cache")
    datasets.disable_progress_bars()
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    return datasets, datasets.Dataset.from_dict(
        {"image": [{"bytes": _jpeg(i), "path": None} for i in range(N)], "label": list(range(N))},
        features=features)


def _hf_reference(datasets, ds) -> Reference:
    raw = ds.cast_column("image", datasets.Image(decode=False))
    return [(row["image"]["bytes"], row["label"]) for row in raw]


def _write_hf_arrow(root: Path, tmp_path: Path) -> Tuple[str, Reference]:
    datasets, ds = _hf_dataset(tmp_path)
    ds.save_to_disk(str(root), num_shards=3)
    return str(root), _hf_reference(datasets, datasets.load_from_disk(str(root)))


def _write_hf_parquet(root: Path, tmp_path: Path) -> Tuple[str, Reference]:
    datasets, ds = _hf_dataset(tmp_path)
    root.mkdir()
    files = []
    for k in range(2):  # two files of several row groups each
        files.append(str(root / f"train-{k}.parquet"))
        ds.shard(2, k, contiguous=True).to_parquet(files[-1], batch_size=5)
    return str(root), _hf_reference(datasets, datasets.Dataset.from_parquet(
        files, cache_dir=str(tmp_path / "parquet-cache")))


class ShardSet:
    """A set of N JPEGs (label i for sample i) in one format: `source` (what its catalog builder and
    `prestage catalog` take), `reference` (each sample's bytes and label, as its own reader gives
    them, in order)."""

    def __init__(self, kind: str, source: str, reference: Reference):
        self.kind, self.source, self.reference = kind, source, reference

    def catalog(self, **kwargs) -> prestage.Catalog:
        build = {"webdataset": prestage.Catalog.from_webdataset, "mds": prestage.Catalog.from_mds,
                 "hf-arrow": prestage.Catalog.from_hf, "hf-parquet": prestage.Catalog.from_hf}
        return build[self.kind](self.source, **kwargs)

    def pixels(self, i: int) -> np.ndarray:
        return np.asarray(Image.open(io.BytesIO(self.reference[i][0])).convert("RGB"))


@pytest.fixture(params=FORMATS)
def shard_set(request, tmp_path, mds_writer) -> ShardSet:
    kind = request.param
    root = tmp_path / kind
    if kind == "webdataset":
        source, reference = _write_webdataset(root)
    elif kind == "mds":
        source, reference = _write_mds(root, mds_writer)
    elif kind == "hf-arrow":
        source, reference = _write_hf_arrow(root, tmp_path)
    else:
        source, reference = _write_hf_parquet(root, tmp_path)
    assert [label for _, label in reference] == list(range(N))
    assert len({data for data, _ in reference}) == N
    return ShardSet(kind, source, reference)


def _range(cat: prestage.Catalog, i: int) -> bytes:
    _, offset, length = cat.locator(i)
    with open(cat.source_path(i), "rb") as f:
        f.seek(offset)
        return f.read(-1 if length is None else length)


def _assert_equal(cat: prestage.Catalog, reference: Reference) -> None:
    assert len(cat) == len(reference)
    for i, (data, label) in enumerate(reference):
        assert _range(cat, i) == data, i
        assert cat.label(i) == label, i


def _rows(cat: prestage.Catalog) -> list:
    return [(cat.path(i), cat.locator(i), cat.label(i)) for i in range(len(cat))]


def _check_batch(s: ShardSet, images, labels, indices=None) -> List[int]:
    """The batch's images are PIL's pixels of its samples (told by their labels, which are their
    indices); returns the labels."""
    labels = [int(x) for x in labels]
    if indices is not None:
        assert [int(x) for x in indices] == labels
    for k, label in enumerate(labels):
        np.testing.assert_array_equal(np.asarray(images[k]), s.pixels(label))
    return labels


# ------------------------------------------------------------------------------ catalog save and load

def test_catalog_reads_back_equal_saves_and_loads(shard_set, tmp_path):
    cat = shard_set.catalog()
    assert cat.kind == "files" and cat.damage == []
    _assert_equal(cat, shard_set.reference)
    cat.save(tmp_path / "set.catalog")
    loaded = prestage.Catalog.load(tmp_path / "set.catalog")
    assert _rows(loaded) == _rows(cat) and loaded.fingerprint == cat.fingerprint
    _assert_equal(loaded, shard_set.reference)


# ------------------------------------------------------------------------------ shuffle and rank split

@pytest.mark.parametrize("world_size", [1, 2])
def test_shuffle_and_rank_split_give_the_same_batches_for_any_thread_count(shard_set, world_size):
    # Each rank's batches are its slices of the global plan (prestage.plan), whatever readers and
    # prefetchers decode and stage them; over the ranks each sample comes once per epoch.
    cat = shard_set.catalog()
    for epoch in range(2):
        seen = []
        for rank in range(world_size):
            plan = [list(b) for b in epoch_batches(N, 5, seed=11, epoch=epoch, rank=rank,
                                                   world_size=world_size)]
            for threads in (1, 2, 4):
                got = []
                with prestage.Loader(cat, batch_size=5, seed=11, rank=rank, world_size=world_size,
                                     readers=threads, prefetchers=threads) as loader:
                    loader.set_epoch(epoch)
                    for batch in loader:
                        got.append(_check_batch(shard_set, batch.images, batch.labels, batch.indices))
                assert got == plan, (rank, threads)
            seen += [i for b in plan for i in b]
        assert sorted(seen) == list(range(N))


# ------------------------------------------------------------------------------ framework adaptors

@pytest.mark.torch
def test_torch_loader_gives_each_ranks_plan_with_pils_pixels(shard_set):
    pytest.importorskip("torch")
    import prestage.torch as pt

    cat = shard_set.catalog()
    seen = []
    for rank in range(2):
        plan = [list(b) for b in epoch_batches(N, 4, seed=3, epoch=0, rank=rank, world_size=2)]
        for readers in (1, 3):
            with pt.Loader(cat, batch_size=4, seed=3, rank=rank, world_size=2, readers=readers,
                           layout="NHWC") as loader:
                got = [_check_batch(shard_set, images.numpy(), labels) for images, labels in loader]
            assert got == plan, (rank, readers)
        seen += [i for b in plan for i in b]
    assert sorted(seen) == list(range(N))


@pytest.mark.tf
def test_tf_dataset_and_staged_paths_give_the_plan_pils_pixels_and_the_bytes(shard_set, tmp_path):
    pytest.importorskip("tensorflow")
    import prestage.tf

    shard_set.catalog().save(tmp_path / "set.catalog")
    plan = [list(b) for b in epoch_batches(N, 5, seed=2, epoch=0)]
    got = [_check_batch(shard_set, images.numpy(), labels.numpy())
           for images, labels in prestage.tf.dataset(tmp_path / "set.catalog", batch_size=5, seed=2)]
    assert got == plan
    ds = prestage.tf.staged_paths(tmp_path / "set.catalog", 5, stage_dir=str(tmp_path / "stage"), seed=2,
                                  read=True, epochs=1)
    order = []
    for data, label in ds:
        assert data.numpy() == shard_set.reference[int(label)][0]
        order.append(int(label))
    ds.sampler.close()
    assert order == [i for b in plan for i in b]


# ------------------------------------------------------------------------------ the staging sampler

@pytest.mark.torch
@pytest.mark.parametrize("workers", [0, 2])
def test_staged_sampler_hands_each_worker_the_samples_bytes(shard_set, tmp_path, workers):
    pytest.importorskip("torch")
    import prestage.torch as pt

    cat = shard_set.catalog()
    sampler = pt.StagedSampler(cat, batch_size=5, stage_dir=str(tmp_path / "stage"), seed=4,
                               num_workers=workers)
    dataset = pt.StagedDataset(sampler, read=lambda sample, label: (bytes(sample.bytes()), label))
    for epoch in range(2):
        sampler.set_epoch(epoch)
        got = []
        for batch in sampler.data_loader(dataset, collate_fn=list):
            for data, label in batch:
                assert data == shard_set.reference[label][0]
            got.append([label for _, label in batch])
        assert got == [list(b) for b in epoch_batches(N, 5, seed=4, epoch=epoch)]
    stats = sampler.stats()
    sampler.close()
    # The second epoch reads staged copies: whole shards, copied once each.
    assert stats["worker_staged"] > 0 and stats["source_reads"] <= cat.num_files


# ------------------------------------------------------------------------------ prestage pack

@pytest.mark.parametrize("zstd", [None, 3])
def test_pack_into_prestage_shards_reads_back_equal(shard_set, tmp_path, zstd):
    cat = shard_set.catalog()
    summary = packing.pack(cat, tmp_path / "packed", shard_bytes=4000, zstd_level=zstd, workers=3)
    assert summary["samples"] == N and summary["shards"] > 1
    packed = prestage.Catalog.from_shards(tmp_path / "packed")
    assert [packed.label(i) for i in range(N)] == list(range(N))
    if zstd is None:  # each sample's bytes as they are in the source shard
        _assert_equal(packed, shard_set.reference)
    index = (tmp_path / "packed" / packing.INDEX_NAME).read_text().splitlines()
    rows = [line.split("\t") for line in index if not line.startswith("#")]
    for i, row in enumerate(rows):  # the CRC is the sample's own bytes'
        assert int(row[4], 16) == prestage._core.crc32c(shard_set.reference[i][0])
        assert row[5] == f"{cat.path(i)}@{cat.locator(i)[1]}+{cat.locator(i)[2]}"
    with prestage.Loader(packed, batch_size=5, seed=6) as loader:
        for batch in loader:
            _check_batch(shard_set, batch.images, batch.labels, batch.indices)
    # `prestage pack` takes the format's saved catalog the same way.
    cat.save(tmp_path / "set.catalog")
    args = ["pack", str(tmp_path / "set.catalog"), str(tmp_path / "cli"), "--shard-size", "4000", "--quiet"]
    assert cli_main(args + ([] if zstd is None else ["--zstd", str(zstd)])) == 0
    assert (tmp_path / "cli" / packing.INDEX_NAME).read_text() == "\n".join(index) + "\n"


# ------------------------------------------------------------------------------ prestage catalog

def test_catalog_cli_scans_once_and_saves_the_catalog_the_api_builds(shard_set, tmp_path, capsys):
    out = tmp_path / "cli.catalog"
    assert cli_main(["catalog", shard_set.source, str(out), CLI_FLAG[shard_set.kind], "--json",
                     "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    cat = shard_set.catalog()
    assert report["samples"] == N and report["files"] == cat.num_files and report["damaged"] == 0
    assert report["bytes"] == int(cat.file_sizes().sum())
    assert _rows(prestage.Catalog.load(out)) == _rows(cat)
    # And a loader takes the saved file in place of a catalog.
    with prestage.Loader(str(out), batch_size=6, seed=1) as loader:
        assert sorted(i for b in loader for i in _check_batch(shard_set, b.images, b.labels)) == \
            list(range(N))


# ------------------------------------------------------------------------------ the I/O trace

def test_trace_records_whole_shard_copies_and_each_samples_range(shard_set, tmp_path):
    cat = shard_set.catalog()
    path = tmp_path / "run.trace"
    with prestage.Loader(cat, batch_size=5, seed=8, stage_dir=str(tmp_path / "stage"),
                         stage_patience=None, trace=path) as loader:
        for epoch in range(2):
            loader.set_epoch(epoch)
            for batch in loader:
                _check_batch(shard_set, batch.images, batch.labels, batch.indices)
    header, records = traces.read(path)
    assert header["files"] == cat.num_files
    copies = records[records["kind"] == traces.KINDS.index("copy")]
    # Stage 2 copied each shard whole, once, named as a file.
    assert sorted(copies["file"].tolist()) == list(range(cat.num_files))
    assert (copies["sample"] == traces.NO_SAMPLE).all()
    sizes = cat.file_sizes()
    assert all(int(c["size"]) == sizes[int(c["file"])] for c in copies)
    reads = records[records["kind"] == traces.KINDS.index("read")]
    assert set(reads["sample"].tolist()) == set(range(N))
    for r in reads:  # stage 3 read each sample's range, nothing more
        file, offset, length = cat.locator(int(r["sample"]))
        assert (int(r["file"]), int(r["offset"]), int(r["size"])) == (file, offset, length)
    assert (reads["tier"] == traces.TIERS.index("stage")).sum() >= N  # the second epoch
