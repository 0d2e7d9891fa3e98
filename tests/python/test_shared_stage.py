"""Ranks of one node sharing one stage directory, as separate processes (torchrun's or srun's ranks):
each file is read from the source once per node, each process's figures add up to what the source
(the emulated parallel file system) served, and a rank killed mid-copy costs the others nothing but
the copies it had in hand."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import prestage

# One rank of `world`: 3 epochs of raw bytes, each checked against the backing files (read beside
# the emulator, so that the check is not counted as a read of the source), with a barrier at the end
# of every epoch as a training step's all-reduce makes; prints the per-epoch figures. Its batches in
# flight (lookahead 1, depth 2) are fewer than an epoch's, so it plans epoch 2 only once every rank
# has passed the barrier of epoch 0.
RANK = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    import prestage
    catalog, backing, stage, barrier, rank, world = sys.argv[1:7]
    rank, world = int(rank), int(world)
    cat = prestage.Catalog.load(catalog)
    with prestage.Loader(cat, batch_size=5, decode="raw", stage_dir=stage, rank=rank,
                         world_size=world, seed=7, stage_patience=None, prefetchers=3,
                         lookahead=1, depth=2) as loader:
        for epoch in range(3):
            for b in loader:
                for k, i in enumerate(b.indices):
                    got = b.data[b.offsets[k]:b.offsets[k + 1]].tobytes()
                    assert got == (Path(backing) / cat.path(int(i))).read_bytes(), cat.path(int(i))
            Path(barrier, f"{epoch}-{rank}").touch()
            while len([p for p in os.listdir(barrier) if p.startswith(f"{epoch}-")]) < world:
                time.sleep(0.005)
        s = loader.stats(epochs="all")
    print(json.dumps({"epochs": s["epochs"], "source_reads": s["source_reads"],
                      "source_bytes": s["source_bytes"], "staged_files": s["staged_files"],
                      "adopted_files": s["adopted_files"]}))
""")


def run_ranks(world, catalog, backing, stage, barrier, timeout=180):
    barrier.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(catalog), str(backing), str(stage),
                               str(barrier), str(r), str(world)], stdout=subprocess.PIPE, text=True)
             for r in range(world)]
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:  # none outlives the test, whatever happened
            p.kill()
            p.wait()
    assert [p.returncode for p in procs] == [0] * world
    return [json.loads(out) for out in outputs]


def test_four_ranks_read_each_file_from_the_source_once_and_their_figures_say_so(
        make_folder, pfs, tmp_path):
    backing = make_folder(4, 30, size=(48, 64))  # 120 files
    emulator = pfs(backing)
    cat = prestage.Catalog.from_folder(emulator.mountpoint)
    catalog = tmp_path / "set.catalog"
    cat.save(catalog)
    set_bytes = sum((backing / cat.path(i)).stat().st_size for i in range(len(cat)))
    before = emulator.stats()

    ranks = run_ranks(4, catalog, backing, tmp_path / "stage", tmp_path / "barrier")

    after = emulator.stats()
    opens = after["ops"]["open"] - before["ops"]["open"]
    served = after["bytes_read"] - before["bytes_read"]
    # The node read every file once: what the emulator counted, and what the ranks say they read.
    assert opens == len(cat)
    assert served == set_bytes
    assert sum(r["source_reads"] for r in ranks) == opens
    assert sum(r["source_bytes"] for r in ranks) == served
    for r in ranks:  # the totals are the sums of the epochs'
        assert r["source_reads"] == sum(e["source_reads"] for e in r["epochs"])
        assert r["source_bytes"] == sum(e["bytes_from_source"] for e in r["epochs"])
    per_epoch = {}
    for r in ranks:
        for e in r["epochs"]:
            per_epoch.setdefault(e["epoch"], []).append(e)
    # By the barrier of epoch 0 the node had every file (each is in some rank's slice of it), and no
    # rank plans epoch 2 before that: in epoch 2 nothing is read from the source, and every sample
    # is a hit. (With more batches in flight than an epoch holds, a rank would plan epoch 2 early
    # and copy there what a neighbour had not reached yet: a CI check saw 4 such reads. The epochs
    # planned ahead and never consumed show what stage 1 had decided when the loader closed.)
    counts = per_epoch[2]
    assert sum(c["source_reads"] for c in counts) == 0
    assert sum(c["misses"] for c in counts) == 0
    assert sum(c["hits"] for c in counts) == len(cat)
    assert sum(c["copies_made"] for c in counts) == 0
    # Copies: one per file for the node, made by one rank each; the others took them over.
    assert sum(r["staged_files"] for r in ranks) == len(cat)
    assert sum(c["copies_made"] for counts in per_epoch.values() for c in counts) == len(cat)
    assert sum(r["adopted_files"] for r in ranks) > 0
    # Misses are the samples a rank read from the source: here, its copies.
    assert sum(c["misses"] for epoch in (0, 1, 2) for c in per_epoch[epoch]) == len(cat)


KILLED_RANK = textwrap.dedent("""
    import sys, prestage
    cat = prestage.Catalog.load(sys.argv[1])
    loader = prestage.Loader(cat, batch_size=2, decode="raw", stage_dir=sys.argv[2], rank=2,
                             world_size=3, prefetchers=8, lookahead=32, depth=2)
    for b in loader:
        print("batch", flush=True)
        loader.stats(epochs="all")
        import time; time.sleep(0.05)  # stage 2 runs far ahead of a slow consumer, copying
""")


def test_a_rank_killed_mid_copy_costs_the_others_no_wrong_byte_and_no_hang(make_folder, pfs, tmp_path):
    backing = make_folder(3, 40, size=(96, 96))
    emulator = pfs(backing, latency_ms=3)  # copies take a while: the kill lands in some
    cat = prestage.Catalog.from_folder(emulator.mountpoint)
    catalog = tmp_path / "set.catalog"
    cat.save(catalog)
    stage = tmp_path / "stage"
    victim = subprocess.Popen([sys.executable, "-c", KILLED_RANK, str(catalog), str(stage)],
                              stdout=subprocess.PIPE, text=True)
    others = []
    try:
        assert victim.stdout.readline().strip() == "batch"
        # The others start while it copies; it dies holding the locks of copies in progress.
        barrier = tmp_path / "barrier"
        barrier.mkdir()
        others += [subprocess.Popen([sys.executable, "-c", RANK, str(catalog), str(backing),
                                     str(stage), str(barrier), str(r), "2"], stdout=subprocess.PIPE,
                                    text=True) for r in range(2)]
        time.sleep(0.2)
        victim.send_signal(signal.SIGKILL)
        outputs = [p.communicate(timeout=180)[0] for p in others]
    finally:
        victim.kill()
        victim.wait()
        victim.stdout.close()
        for p in others:
            p.kill()
            p.wait()
    assert [p.returncode for p in others] == [0, 0]  # every byte checked against the source
    ranks = [json.loads(out) for out in outputs]
    # The files are all staged now; a new job finds them and reads nothing from the source.
    with prestage.Loader(cat, batch_size=8, decode="raw", stage_dir=stage, stage_patience=None) as loader:
        for b in loader:
            for k, i in enumerate(b.indices):
                got = b.data[b.offsets[k]:b.offsets[k + 1]].tobytes()
                assert got == (backing / cat.path(int(i))).read_bytes()
        s = loader.stats(epochs="all")
    assert s["source_reads"] == 0 and s["epochs"][0]["hits"] == len(cat)
    assert not list(stage.rglob("*.part"))
    assert sum(r["source_reads"] for r in ranks) >= 1


BOUNDED_RANK = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import prestage
    catalog, backing, stage, rank, world, bound = sys.argv[1:7]
    cat = prestage.Catalog.load(catalog)
    with prestage.Loader(cat, batch_size=4, decode="raw", stage_dir=stage, rank=int(rank),
                         world_size=int(world), seed=3, cache_bytes=int(bound), prefetchers=4,
                         lookahead=2, depth=2) as loader:
        for epoch in range(3):
            for b in loader:
                for k, i in enumerate(b.indices):
                    got = b.data[b.offsets[k]:b.offsets[k + 1]].tobytes()
                    assert got == (Path(backing) / cat.path(int(i))).read_bytes(), cat.path(int(i))
        s = loader.stats(epochs="all")
    print(json.dumps({k: s[k] for k in ("cache_bytes", "stage_bytes_peak", "source_bytes")}))
""")


def used_bytes(mount):
    """Bytes in use on a file system, as one reading (a walk of the directory would add up files
    that were never there at once while copies come and go)."""
    st = os.statvfs(mount)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def test_ranks_sharing_a_bounded_directory_keep_the_nodes_bound_on_disk_throughout(tmp_path, tmpfs):
    import threading

    # Files of whole pages, so that the bytes the bound counts are the blocks the disk counts.
    backing = tmp_path / "set"
    rng = np.random.default_rng(5)
    for i in range(120):
        (backing / f"c{i % 4}").mkdir(parents=True, exist_ok=True)
        (backing / f"c{i % 4}" / f"{i:03d}.bin").write_bytes(rng.bytes(4096 * (1 + i % 3)))
    cat = prestage.Catalog.from_folder(backing, extensions=[".bin"])
    catalog = tmp_path / "set.catalog"
    cat.save(catalog)
    set_bytes = sum(cat.source_path(i).stat().st_size for i in range(len(cat)))
    bound = 4096 * int(0.4 * set_bytes / 4096)
    mount = tmpfs(4 * set_bytes // 1024)
    stage = mount / "stage"
    prestage.Loader(cat, batch_size=4, decode="raw", stage_dir=stage).close()  # its bookkeeping files
    baseline = used_bytes(mount)
    peak = [0]
    done = threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], used_bytes(mount) - baseline)
            time.sleep(0.001)

    watcher = threading.Thread(target=watch)
    watcher.start()
    procs = [subprocess.Popen([sys.executable, "-c", BOUNDED_RANK, str(catalog), str(backing), str(stage),
                               str(r), "3", str(bound)], stdout=subprocess.PIPE, text=True)
             for r in range(3)]
    try:
        outputs = [p.communicate(timeout=180)[0] for p in procs]
    finally:
        done.set()
        watcher.join()
        for p in procs:
            p.kill()
            p.wait()
    assert [p.returncode for p in procs] == [0, 0, 0]  # every byte checked against the source
    ranks = [json.loads(out) for out in outputs]
    assert all(r["cache_bytes"] == bound for r in ranks)
    # The index grows by a record per copy made: bookkeeping, outside the bound.
    index_pages = 4096 * -(-next(stage.glob("*/index.log")).stat().st_size // 4096)
    assert 0 < peak[0] <= bound + index_pages
    assert all(r["stage_bytes_peak"] <= bound for r in ranks)
    # The node's copies were reused: together the ranks read less than three times the set.
    assert sum(r["source_bytes"] for r in ranks) < 3 * set_bytes
