"""The I/O trace: one record per read, whose samples, files, ranges and tiers agree with what the loader
read (checked against the catalog and the loader's own counters); `prestage trace` reads and draws it."""

import itertools
import os
import struct

import numpy as np
import pytest

import prestage
from prestage import pack as packing
from prestage import trace as traces
from prestage.cli import main as cli_main


def small_set(root, files=24, classes=3):
    rng = np.random.default_rng(0)
    for i in range(files):
        folder = root / f"c{i % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / f"a{i:03d}.npy", rng.integers(0, 255, (4, 5), dtype=np.uint8))
    return prestage.Catalog.from_folder(root, [".npy"])


def test_no_trace_unless_asked(tmp_path):
    catalog = small_set(tmp_path / "src")
    with prestage.Loader(catalog, batch_size=8, decode="npy") as loader:
        for _ in loader:
            pass
    assert not list(tmp_path.glob("*.trace"))


def test_direct_reads_are_one_record_each_naming_sample_file_and_range(tmp_path):
    catalog = small_set(tmp_path / "src")
    path = tmp_path / "run.trace"
    with prestage.Loader(catalog, batch_size=8, decode="raw", trace=path, seed=3) as loader:
        seen = [int(i) for batch in loader for i in batch.indices]
        stats = loader.stats(epochs="all")
    header, records = traces.read(path)
    assert header["files"] == len(catalog) and header["root"] == str(catalog.root)
    reads = records[records["kind"] == traces.KINDS.index("read")]
    # Every sample of the epoch was read from the source by stage 3 (and some again: the pipeline
    # decodes the next epoch's first batches ahead, across the boundary).
    assert sorted(set(reads["sample"].tolist())) == sorted(seen) == list(range(len(catalog)))
    assert set(reads["tier"].tolist()) == {traces.TIERS.index("source")}
    assert len(reads) >= stats["source_reads"] >= len(catalog)
    for r in reads:
        i = int(r["sample"])
        assert int(r["file"]) == i  # one file per sample here
        assert int(r["size"]) == os.path.getsize(catalog.source_path(i))
        assert int(r["offset"]) == 0
    assert (records["end_ns"] >= records["start_ns"]).all()
    assert np.all(np.diff(records["start_ns"]) >= 0)  # read() sorts by start


def test_staged_packed_set_records_shard_copies_and_stage_hits(tmp_path):
    small_set(tmp_path / "src")
    packing.pack(tmp_path / "src", tmp_path / "packed", shard_bytes=1500)
    catalog = prestage.Catalog.from_shards(tmp_path / "packed")
    path = tmp_path / "run.trace"
    with prestage.Loader(catalog, batch_size=8, decode="raw", stage_dir=tmp_path / "stage",
                         stage_patience=None, trace=path) as loader:
        for epoch in range(2):
            loader.set_epoch(epoch)
            for _ in loader:
                pass
        stats = loader.stats(epochs="all")
    _, records = traces.read(path)
    copies = records[records["kind"] == traces.KINDS.index("copy")]
    shards = sorted(p for p in os.listdir(tmp_path / "packed") if p.endswith(".bin"))
    # Each shard was copied whole once, from the source, and named as a file, not a sample.
    assert sorted(copies["file"].tolist()) == list(range(len(shards)))
    assert (copies["sample"] == traces.NO_SAMPLE).all()
    assert [int(c["size"]) for c in sorted(copies, key=lambda c: c["file"])] == \
        [os.path.getsize(tmp_path / "packed" / s) for s in shards]
    reads = records[records["kind"] == traces.KINDS.index("read")]
    assert len(reads) >= 2 * len(catalog)  # and batches decoded ahead, across epoch boundaries
    staged = reads[reads["tier"] == traces.TIERS.index("stage")]
    # The second epoch is served from the stage directory alone.
    assert len(staged) >= len(catalog)
    assert stats["hits"] > 0
    loc_lines = (tmp_path / "packed" / "index.tsv").read_text().splitlines()
    rows = [line.split("\t") for line in loc_lines if not line.startswith("#")]
    for r in reads:
        shard, offset, length = rows[int(r["sample"])][:3]
        assert shards.index(shard) == int(r["file"])
        assert (int(r["offset"]), int(r["size"])) == (int(offset), int(length))
    s = traces.summary(records)
    assert s["reads"] == len(records)
    assert s["by_kind"]["copy"]["reads"] == len(shards)


def test_cli_summarises_and_draws(tmp_path, capsys):
    catalog = small_set(tmp_path / "src")
    path = tmp_path / "run.trace"
    with prestage.Loader(catalog, batch_size=8, decode="raw", stage_dir=tmp_path / "stage",
                         trace=path) as loader:
        for _ in loader:
            pass
    assert cli_main(["trace", str(path), "--out", str(tmp_path / "figures")]) == 0
    out = capsys.readouterr().out
    assert "by tier:" in out and "by kind:" in out
    for name in ("spatial.png", "temporal.png", "timeline.png"):
        assert (tmp_path / "figures" / name).stat().st_size > 1000


def test_a_bad_trace_is_refused_and_a_torn_record_dropped(tmp_path, capsys):
    bad = tmp_path / "bad.trace"
    bad.write_bytes(b"not a trace at all")
    with pytest.raises(ValueError, match="not a prestage I/O trace"):
        traces.read(bad)
    assert cli_main(["trace", str(bad)]) == 1
    assert "not a prestage I/O trace" in capsys.readouterr().err
    header = b'{"format": 1, "root": "/x", "files": 1}'
    record = struct.pack("<QQQQqqIBBH", 0, 0, 0, 10, 5, 9, 0, 3, 0, 0)
    torn = tmp_path / "torn.trace"
    torn.write_bytes(b"PSTGTRC1" + struct.pack("<Q", len(header)) + header + record + record[:20])
    _, records = traces.read(torn)
    assert len(records) == 1 and int(records[0]["size"]) == 10
    with pytest.raises(prestage.IoError, match="cannot create the I/O trace"):
        prestage.Loader(small_set(tmp_path / "src"), batch_size=4, decode="raw",
                        trace=tmp_path / "missing" / "dir" / "run.trace")


@pytest.mark.parametrize("staged", [False, True])
def test_the_trace_has_one_record_per_read_the_counters_count(tmp_path, staged):
    # Raw samples are sized by a first look (a stat, or the stage directory's record), then read:
    # only the read is one.
    root = tmp_path / "src"
    root.mkdir()
    for i in range(10):
        (root / f"{i}.bin").write_bytes(bytes([i]) * 1000)
    catalog = prestage.Catalog.from_folder(root, [".bin"])
    path = tmp_path / "run.trace"
    stage = {"stage_dir": tmp_path / "stage", "stage_patience": None} if staged else {}
    loader = prestage.Loader(catalog, batch_size=5, decode="raw", trace=path, **stage)
    for epoch in range(2):
        loader.set_epoch(epoch)
        for _ in loader:
            pass
    loader.close()
    stats = loader.stats(epochs="all")
    _, records = traces.read(path)
    kinds = records["kind"].tolist()
    tiers = records["tier"].tolist()
    count = {(k, t): sum(1 for a, b in zip(kinds, tiers)
                         if a == traces.KINDS.index(k) and b == traces.TIERS.index(t))
             for k in traces.KINDS for t in traces.TIERS}
    assert sum(count.values()) == len(records)
    if staged:
        # Each file copied once from the source, then every read served by its copy.
        assert count[("copy", "source")] == stats["staged_files"] == stats["source_reads"] == 10
        assert count[("read", "stage")] == stats["bytes_from_stage"] // 1000 >= 20
        assert len(records) == count[("copy", "source")] + count[("read", "stage")]
    else:
        assert count[("read", "source")] == stats["source_reads"] >= 20
        assert len(records) == count[("read", "source")]


def epoch_batches(loader, epoch, steps=None):
    """The index lists of `epoch`'s batches, each batch let go before the next is asked for."""
    loader.set_epoch(epoch)
    batches = loader if steps is None else itertools.islice(loader, steps)
    return [batch.indices.tolist() for batch in batches]


@pytest.mark.parametrize("loop", ["set_epoch", "plain", "steps", "steps_set_epoch"])
def test_the_next_epoch_read_ahead_is_kept_across_each_boundary(tmp_path, loop):
    # Direct reads: each sample is read from the source once per epoch it is used in. The pipeline
    # reads the next epoch's first batches while the last ones of an epoch are used; if the next
    # iteration threw that away, those samples would be read twice in the next epoch.
    catalog = small_set(tmp_path / "src", files=60)
    path = tmp_path / "run.trace"
    epochs = 3
    options = dict(batch_size=4, decode="raw", seed=5, readers=2, lookahead=2, depth=3,
                   autotune=False)
    seen = []
    with prestage.Loader(catalog, trace=path, **options) as loader:
        for e in range(epochs):
            if loop in ("set_epoch", "steps_set_epoch"):
                loader.set_epoch(e)
            # "steps": a loop of len(loader) steps, which never asks for the StopIteration after them.
            batches = loader if loop in ("set_epoch", "plain") else itertools.islice(loader, len(loader))
            seen.append([batch.indices.tolist() for batch in batches])
            assert loader.epoch == e + 1
    stats = loader.stats(epochs="all")  # once closed: every read the trace holds is counted
    with prestage.Loader(catalog, **options) as fresh:
        assert seen == [epoch_batches(fresh, e) for e in range(epochs)]
    by_epoch = {e["epoch"]: e["source_reads"] for e in stats["epochs"]}
    assert [by_epoch[e] for e in range(epochs)] == [len(catalog)] * epochs
    assert by_epoch.get(epochs, 0) <= len(catalog)  # read ahead, never used
    _, records = traces.read(path)
    assert len(records) == stats["source_reads"] == sum(by_epoch.values())


def test_set_epoch_of_another_epoch_delivers_exactly_its_plan(tmp_path):
    catalog = small_set(tmp_path / "src", files=60)
    options = dict(batch_size=4, decode="raw", seed=5, readers=2, lookahead=2, depth=3)
    with prestage.Loader(catalog, **options) as fresh:
        expected = {e: epoch_batches(fresh, e) for e in (0, 1, 3, 4, 6)}
    with prestage.Loader(catalog, **options) as loader:
        assert epoch_batches(loader, 0, steps=5) == expected[0][:5]  # left mid-epoch
        assert epoch_batches(loader, 1, steps=len(loader) - 1) == expected[1][:-1]  # one short
        assert epoch_batches(loader, 3) == expected[3]  # not the next epoch (2): started anew
        assert epoch_batches(loader, 4) == expected[4]  # the next one
        assert epoch_batches(loader, 6) == expected[6]
        assert epoch_batches(loader, 0, steps=len(loader) - 2) == expected[0][:-2]
        assert epoch_batches(loader, 1) == expected[1]  # the next one, left 2 batches early
        assert epoch_batches(loader, 0) == expected[0]  # back: the same order
