"""The PFS operations a loader costs per loose file and cold epoch, counted by the emulated parallel file
system (prestage-pfs): one open and one read of the size the catalog recorded, no stat, whether the file
is read directly or copied to a stage directory."""

import time
from pathlib import Path

import numpy as np
import pytest

import prestage
import prestage.trace

FILES = 48
BATCH = 8


@pytest.mark.parametrize("decode", ["raw", "jpeg"])
@pytest.mark.parametrize("staged", [False, True], ids=["direct", "staged"])
def test_a_loose_file_costs_one_open_and_one_read_per_cold_epoch(tmp_path, pfs, encode_jpeg, decode,
                                                                   staged):
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(0)
    for i in range(FILES):
        # Up to ~110 KB: below the 128 KiB a FUSE read request carries, so one read() is one request.
        side = int(rng.integers(24, 160))
        (src / f"{i:03d}.jpg").write_bytes(encode_jpeg(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)))
    emulator = pfs(src)
    cat = prestage.Catalog.from_folder(emulator.mountpoint)
    assert len(cat) == FILES
    time.sleep(1.2)  # the catalog's lookups expire from the kernel's cache (--attr-timeout 1): cold
    options = {"decode": "raw"} if decode == "raw" else {"image_size": (16, 16)}
    stage = str(tmp_path / "stage") if staged else None
    before = emulator.stats()
    # depth 2: at most one batch of the next epoch is decoded before close (read from the PFS when
    # direct, from the stage directory when staged).
    with prestage.Loader(cat, batch_size=BATCH, shuffle=False, depth=2, lookahead=2, stage_dir=stage,
                         **options) as loader:
        samples = 0
        for batch in loader:
            samples += len(batch)
            if samples == FILES:
                break
    after = emulator.stats()
    ops = {k: after["ops"][k] - before["ops"].get(k, 0) for k in ("open", "read", "getattr")}
    opens = {p: c["opens"] - before["paths"].get(p, {}).get("opens", 0) for p, c in after["paths"].items()}
    ahead = 0 if staged else 2 * BATCH  # the next epoch's first batches, decoded ahead
    # Every file opened once in the epoch; the next epoch's first files at most once more.
    assert all(opens[cat.path(i)] == 1 for i in range(ahead, FILES)), opens
    assert all(1 <= opens[cat.path(i)] <= 2 for i in range(ahead)), opens
    assert FILES <= ops["open"] <= FILES + ahead
    # One read per open (a file of a known size: no second read to find its end) ...
    assert ops["read"] == ops["open"], ops
    # ... and no stat: the getattrs are the kernel's lookups of the names (one per file; the root's).
    assert ops["getattr"] <= FILES + 2, ops


def test_a_packed_set_costs_one_open_per_shard_when_staged(tmp_path, pfs, encode_jpeg):
    import prestage.pack

    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(1)
    for i in range(FILES):
        (src / f"{i:03d}.jpg").write_bytes(encode_jpeg(rng.integers(0, 256, (48, 48, 3), dtype=np.uint8)))
    packed = tmp_path / "packed"
    prestage.pack.pack(prestage.Catalog.from_folder(src), packed, shard_bytes=64 << 10)
    shards = sorted(p.name for p in packed.glob("shard-*.bin"))
    assert len(shards) > 1
    emulator = pfs(packed)
    cat = prestage.Catalog.from_shards(emulator.mountpoint)
    time.sleep(1.2)
    before = emulator.stats()
    with prestage.Loader(cat, batch_size=BATCH, shuffle=False, decode="raw",
                         stage_dir=str(tmp_path / "stage")) as loader:
        assert sum(len(b) for b in loader) == FILES
    after = emulator.stats()
    opens = {p: c["opens"] - before["paths"].get(p, {}).get("opens", 0) for p, c in after["paths"].items()}
    assert {p: n for p, n in opens.items() if n} == {name: 1 for name in shards}
    assert after["ops"]["getattr"] - before["ops"]["getattr"] <= len(shards) + 2


def test_a_shard_is_opened_once_per_job_when_stage_2_lags(tmp_path, pfs, encode_jpeg):
    # Every open on the PFS takes 80 ms, one at a time: stage 2 takes longer than the default
    # stage_patience (50 ms) over each batch's shards. A sample read from the source then would open
    # its shard a second time, while the shard's copy is made anyway for the others: a catalog whose
    # files hold several samples waits for its copies, whatever stage_patience says.
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(3)
    for i in range(FILES):
        (src / f"{i:03d}.jpg").write_bytes(encode_jpeg(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)))
    packed = tmp_path / "packed"
    prestage.pack.pack(prestage.Catalog.from_folder(src), packed, shard_bytes=16 << 10)
    shards = sorted(p.name for p in packed.glob("shard-*.bin"))
    assert len(shards) >= 4
    emulator = pfs(packed, open_ms=80, read_ms=0, getattr_ms=0, max_ops=1)
    cat = prestage.Catalog.from_shards(emulator.mountpoint)
    before = emulator.stats()
    with prestage.Loader(cat, batch_size=BATCH, decode="raw", prefetchers=2,
                         stage_dir=str(tmp_path / "stage")) as loader:
        for epoch in range(2):
            loader.set_epoch(epoch)
            assert sum(len(b) for b in loader) == FILES
        stats = loader.stats()
    after = emulator.stats()
    opens = {p: c["opens"] - before["paths"].get(p, {}).get("opens", 0) for p, c in after["paths"].items()}
    assert {p: n for p, n in opens.items() if n} == {name: 1 for name in shards}
    assert stats["stage_patience"] is None and stats["stage_expedited"] == 0
    # A catalog of one sample per file keeps the option.
    with prestage.Loader(prestage.Catalog.from_folder(src), batch_size=BATCH, decode="raw",
                         stage_dir=str(tmp_path / "stage-files")) as loader:
        assert loader.stats()["stage_patience"] == 0.05


def write_large_files(tmp_path, seed):
    """16 files of 300 KB to 1 MB of random bytes in tmp_path/src; returns the folder and the sizes."""
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(seed)
    sizes = [int(s) for s in rng.integers(300_000, 1_000_000, 16)]
    for i, size in enumerate(sizes):
        (src / f"{i:03d}.bin").write_bytes(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    return src, sizes


@pytest.mark.parametrize("io_timeout", [None, 30.0], ids=["no-limit", "io-timeout"])
def test_a_large_file_is_copied_in_the_fewest_requests(tmp_path, pfs, io_timeout):
    # Files of 300 KB to 1 MB: through the page cache, FUSE gets one request per read-ahead window
    # (256 KiB at most), so each would cost 2 to 4 reads; stage 2 reads them with O_DIRECT, in
    # requests of up to 1 MiB: one each.
    src, sizes = write_large_files(tmp_path, seed=2)
    emulator = pfs(src)
    cat = prestage.Catalog.from_folder(emulator.mountpoint, extensions=[".bin"])
    time.sleep(1.2)
    before = emulator.stats()
    # With an io_timeout, stage 2's reads run on helper threads: read as directly there.
    with prestage.Loader(cat, batch_size=4, shuffle=False, decode="raw", depth=2, lookahead=2,
                         io_timeout=io_timeout, stage_dir=str(tmp_path / "stage")) as loader:
        seen = {}
        for batch in loader:
            for j, i in enumerate(batch.indices):
                seen[int(i)] = batch.arrays[j].tobytes()  # checked against the files below
            if len(seen) == len(cat):
                break
    after = emulator.stats()
    ops = {k: after["ops"][k] - before["ops"].get(k, 0) for k in ("open", "read")}
    assert ops["open"] == len(cat), ops
    assert ops["read"] == len(cat), ops  # main: 2 to 4 per file
    assert after["bytes_read"] - before["bytes_read"] == sum(sizes)
    for i, data in seen.items():
        assert data == (src / cat.path(i)).read_bytes()


def test_a_large_file_stage_3_reads_from_the_pfs_is_read_in_the_fewest_requests(tmp_path, pfs):
    # Every open on the PFS takes 80 ms, one at a time: stage 2 lags, and stage 3 reads the files no
    # copy has started from the PFS itself (stage_expedited), whole. Files of 300 KB to 1 MB: through
    # the page cache FUSE would get 2 to 4 requests for each (one per read-ahead window); stage 3
    # reads them with O_DIRECT where stage 2 does, in one request of up to 1 MiB each.
    src, sizes = write_large_files(tmp_path, seed=5)
    emulator = pfs(src, open_ms=80, read_ms=0, getattr_ms=0, max_ops=1)
    cat = prestage.Catalog.from_folder(emulator.mountpoint, extensions=[".bin"])
    time.sleep(1.2)
    before = emulator.stats()
    with prestage.Loader(cat, batch_size=4, shuffle=False, decode="raw", prefetchers=2,
                         stage_dir=str(tmp_path / "stage")) as loader:
        seen = {}
        for batch in loader:
            for j, i in enumerate(batch.indices):
                seen[int(i)] = batch.arrays[j].tobytes()
            if len(seen) == len(cat):
                break
        stats = loader.stats()
    after = emulator.stats()
    assert stats["stage_expedited"] > 0, stats  # stage 3 read some of them from the PFS
    ops = {k: after["ops"][k] - before["ops"].get(k, 0) for k in ("open", "read")}
    assert ops["open"] == len(cat), ops
    assert ops["read"] == len(cat), ops  # main: 2 to 4 for each file stage 3 read
    assert after["bytes_read"] - before["bytes_read"] == sum(sizes)
    assert seen == {i: (src / cat.path(i)).read_bytes() for i in range(len(cat))}


def _copies(stage):
    """The bytes of every copy in a stage directory (not its own files), sorted."""
    own = {"index.log", "node.table", "start.lock"}
    return sorted(p.read_bytes() for p in Path(stage).rglob("*")
                  if p.is_file() and p.name not in own and not p.name.endswith(".part"))


@pytest.mark.parametrize("bound", [0, FILES * 2000], ids=["no-bound", "bound-of-the-set"])
def test_a_file_stage_3_reads_from_the_pfs_is_staged_and_read_once_a_job(tmp_path, pfs, bound):
    # Every open on the PFS takes 80 ms, one at a time: stage 2 takes longer than the default
    # stage_patience (50 ms) over each batch, and stage 3 reads the files no copy has started from
    # the PFS itself (stage_expedited). It stages them as it reads them: the next epoch finds them
    # on the SSD, where stage 2 used to copy them then, a second read of each from the PFS.
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(4)
    for i in range(FILES):
        (src / f"{i:03d}.bin").write_bytes(rng.integers(0, 256, 2000, dtype=np.uint8).tobytes())
    emulator = pfs(src, open_ms=80, read_ms=0, getattr_ms=0, max_ops=1)
    cat = prestage.Catalog.from_folder(emulator.mountpoint, extensions=[".bin"])
    stage = tmp_path / "stage"
    trace = tmp_path / "job.trace"
    before = emulator.stats()
    with prestage.Loader(cat, batch_size=BATCH, shuffle=False, decode="raw", prefetchers=2,
                         stage_dir=str(stage), cache_bytes=bound, trace=str(trace)) as loader:
        for epoch in range(2):
            loader.set_epoch(epoch)
            for batch in loader:
                for j, i in enumerate(batch.indices):
                    assert batch.arrays[j].tobytes() == (src / cat.path(int(i))).read_bytes()
                if bound:
                    assert sum(len(c) for c in _copies(stage)) <= bound
        stats = loader.stats()
    after = emulator.stats()
    assert stats["stage_expedited"] > 0 and stats["misses_staged"] > 0, stats
    assert stats["staged_files"] == FILES, stats  # stage 3's copies among them
    # Each file read from the PFS once in the job, by stage 3 or by stage 2's copy: the trace's
    # reads from the source, and the emulator's opens.
    _, records = prestage.trace.read(trace)
    source = records[records["tier"] == prestage.trace.TIERS.index("source")]
    assert sorted(int(f) for f in source["file"]) == list(range(FILES))
    opens = {p: c["opens"] - before["paths"].get(p, {}).get("opens", 0) for p, c in after["paths"].items()}
    assert {p: n for p, n in opens.items() if n} == {cat.path(i): 1 for i in range(FILES)}
    # The copies are the files' bytes, and a new job takes them all (their records vouched for at its
    # start, their CRCs checked before their first use): nothing read from the PFS.
    assert _copies(stage) == sorted((src / cat.path(i)).read_bytes() for i in range(FILES))
    with prestage.Loader(cat, batch_size=BATCH, shuffle=False, decode="raw", stage_dir=str(stage),
                         cache_bytes=bound) as loader:
        assert sum(len(b) for b in loader) == FILES
        again = loader.stats()
    # (hits: the next epoch's first batches too, decoded before the loader closed)
    assert again["hits"] >= FILES and again["misses"] == 0 and again["source_reads"] == 0, again
    assert again["stage_corrupt"] == 0 and again["stage_failures"] == 0, again
