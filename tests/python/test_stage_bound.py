"""The stage directory's bound holds at every moment, not only between copies: its copies, partial
ones included, sampled while a staging sampler runs with workers, never take more than cache_bytes."""

import os
import subprocess
import threading
import time

import numpy as np
import pytest

import prestage
from prestage.staging import StagedDataset, StagedSampler


def used_bytes(mount):
    st = os.statvfs(mount)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def length(sample, label):
    return len(bytes(sample.bytes()))


def keep(items):
    return items


def test_copies_on_disk_never_pass_the_bound_at_any_sampled_moment(tmp_path, tmpfs):
    # Files of whole pages: the blocks the tmpfs counts are the bytes the bound counts. (Measured
    # through the file system, which counts all files at once: a walk of the directory may count a
    # copy evicted behind it and one written ahead of it.)
    source = tmp_path / "set"
    rng = np.random.default_rng(3)
    for i in range(160):
        (source / f"c{i % 4}").mkdir(parents=True, exist_ok=True)
        (source / f"c{i % 4}" / f"{i:03d}.bin").write_bytes(rng.bytes(4096 * int(rng.integers(1, 4))))
    total = sum(p.stat().st_size for p in source.rglob("*.bin"))
    bound = 4096 * (total // 4 // 4096)
    catalog = prestage.Catalog.from_folder(source, extensions=[".bin"])
    mount = tmpfs(8 * 1024)
    stage = mount / "stage"
    with StagedSampler(catalog, batch_size=8, stage_dir=stage, num_workers=2, cache_bytes=bound,
                       prefetchers=4, seed=1) as sampler:
        area = next(stage.glob("prestage-*"))
        index = area / "index.log"

        def blocks(path):
            try:
                return path.stat().st_blocks * 512
            except FileNotFoundError:
                return 0

        def evicted_in_reads():
            # Copies evicted while a worker reads them (opened or mapped before the eviction, the
            # read then ends with the right bytes): out of the directory, their blocks used until the
            # read ends. Reads in flight, not copies: outside what is measured here.
            held = {}
            for pid in worker_pids():
                for link in (f"/proc/{pid}/fd", f"/proc/{pid}/map_files"):
                    try:
                        names = os.listdir(link)
                    except OSError:
                        continue
                    for name in names:
                        try:
                            if not os.readlink(f"{link}/{name}").endswith(" (deleted)"):
                                continue
                            st = os.stat(f"{link}/{name}")
                        except OSError:
                            continue
                        if st.st_dev == area_dev:
                            held[st.st_ino] = st.st_blocks * 512
            return sum(held.values())

        def worker_pids():
            me = str(os.getpid())
            for pid in os.listdir("/proc"):
                if pid.isdigit():
                    try:
                        with open(f"/proc/{pid}/stat") as f:
                            if f.read().rsplit(")", 1)[1].split()[1] == me:
                                yield pid
                    except OSError:
                        continue

        area_dev = area.stat().st_dev
        baseline = used_bytes(mount) - blocks(index)
        peak = [0]
        done = threading.Event()

        def watch():
            while not done.is_set():
                # The index grows by a record per copy: bookkeeping, outside what is measured here.
                # Read after the disk, so that its growth is never counted as a copy's; the reads of
                # evicted copies before and after it, the larger kept, for the same reason.
                before = evicted_in_reads()
                used = used_bytes(mount)
                reading = max(before, evicted_in_reads())
                peak[0] = max(peak[0], used - baseline - blocks(index) - reading)
                time.sleep(0.001)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            loader = sampler.data_loader(StagedDataset(sampler, read=length), collate_fn=keep)
            for epoch in range(3):
                sampler.set_epoch(epoch)
                for items in loader:
                    pass
        finally:
            done.set()
            watcher.join()
        stats = sampler.stats(epochs="all")
    assert sum(e["evictions"] for e in stats["epochs"]) > 0 and stats["worker_staged"] > 0
    assert 0 < peak[0] <= bound


def test_the_default_bound_never_fills_a_disk_of_small_files(tmp_path, tmpfs):
    # 200 files of 2.1-4.2 KB on a 184 KB disk: each copy takes whole blocks, the index and the
    # node's table take their own, copies being written take room too.
    source = tmp_path / "set"
    rng = np.random.default_rng(10)
    for i in range(200):
        (source / f"c{i % 4}").mkdir(parents=True, exist_ok=True)
        (source / f"c{i % 4}" / f"{i:03d}.bin").write_bytes(rng.bytes(int(rng.integers(2100, 4200))))
    catalog = prestage.Catalog.from_folder(source, extensions=[".bin"])
    mount = tmpfs(184)
    fs = os.statvfs(mount)
    total, block = fs.f_blocks * fs.f_frsize, fs.f_frsize
    baseline = used_bytes(mount)
    peak = [0]
    done = threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], used_bytes(mount))
            time.sleep(0.001)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with prestage.Loader(catalog, batch_size=8, decode="raw", stage_dir=mount / "stage",
                             stage_patience=None, seed=2) as loader:
            for epoch in range(3):
                loader.set_epoch(epoch)
                for batch in loader:
                    for k, i in enumerate(batch.indices):
                        got = batch.data[batch.offsets[k]:batch.offsets[k + 1]].tobytes()
                        assert got == catalog.source_path(int(i)).read_bytes()
            stats = loader.stats(epochs="all")
    finally:
        done.set()
        watcher.join()
    assert not stats["stage_dir_disabled"], stats["stage_dir_error"]
    # The set does not fit: the bound is 90% of the room the disk had, and what the directory takes
    # on disk (copies, copies being written, its index and table) stays within it, but for the
    # index's last block (counted once a record has been appended to it).
    room = total - baseline
    assert 0 < stats["cache_bytes"] <= room * 9 // 10
    assert stats["staged_files"] > 0 and stats["stage_bytes_peak"] <= stats["cache_bytes"]
    assert peak[0] - baseline <= stats["cache_bytes"] + block


def test_a_read_only_stage_directory_serves_the_copies_in_it_and_copies_nothing(tmp_path, tmpfs):
    source = tmp_path / "set"
    rng = np.random.default_rng(4)
    for i in range(24):
        (source / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        (source / f"c{i % 2}" / f"{i:03d}.bin").write_bytes(rng.bytes(int(rng.integers(100, 3000))))
    catalog = prestage.Catalog.from_folder(source, extensions=[".bin"])
    mount = tmpfs(1024)
    stage = mount / "stage"
    set_bytes = sum(catalog.source_path(i).stat().st_size for i in range(len(catalog)))
    # A first job stages about half the set (a bound given in bytes), then the disk turns read-only
    # (root ignores permissions: a read-only mount is what refuses root's writes).
    with prestage.Loader(catalog, batch_size=4, decode="raw", stage_dir=stage, stage_patience=None,
                         cache_bytes=set_bytes // 2) as loader:
        for _ in loader:
            pass
        staged = loader.stats(epochs="all")["staged_files"]
    assert 0 < staged < len(catalog)
    r = subprocess.run(["mount", "-o", "remount,ro", str(mount)], capture_output=True)
    if r.returncode != 0:
        pytest.skip("cannot remount the tmpfs read-only: " + r.stderr.decode().strip())
    on_disk = used_bytes(mount)
    with prestage.Loader(catalog, batch_size=4, decode="raw", stage_dir=stage,
                         stage_patience=None) as loader:
        for batch in loader:
            for k, i in enumerate(batch.indices):
                got = batch.data[batch.offsets[k]:batch.offsets[k + 1]].tobytes()
                assert got == catalog.source_path(int(i)).read_bytes()
        stats = loader.stats(epochs="all")
    assert not stats["stage_dir_disabled"], stats["stage_dir_error"]
    assert stats["staged_files"] == 0 and stats["stage_failures"] == 0  # nothing copied, nothing tried
    kept = [p for p in stage.glob("prestage-*/*/*") if p.is_file() and "." not in p.name]
    assert stats["epochs"][0]["hits"] == len(kept) > 0  # every copy there was served
    kept_bytes = sum(p.stat().st_size for p in kept)
    assert stats["epochs"][0]["bytes_from_source"] == set_bytes - kept_bytes
    assert used_bytes(mount) == on_disk


def test_the_batches_a_dataloader_may_still_read_keep_their_copies(tmp_path):
    # A DataLoader asks its batch sampler for num_workers * prefetch_factor batches ahead of the
    # loop, and its workers read them later: their copies must stay while the loader runs ahead
    # and evicts for the batches after them. (They were evicted two batches after their hand-out;
    # a worker then found a copy gone, or held a removed copy's pages past the bound.)
    source = tmp_path / "set"
    source.mkdir()
    for i in range(160):
        (source / f"{i:03d}.bin").write_bytes(bytes([i % 256]) * 4096)
    catalog = prestage.Catalog.from_folder(source, extensions=[".bin"])
    with StagedSampler(catalog, batch_size=4, stage_dir=tmp_path / "stage", num_workers=2,
                       prefetch_factor=2, cache_bytes=4096 * 80, prefetchers=2, seed=0,
                       autotune=False) as sampler:
        dataset = StagedDataset(sampler, read=lambda sample, label: sample.tier)
        ahead = sampler.num_workers * sampler.prefetch_factor

        def settle():  # lets the loader run ahead as far as it may: it plans, copies and evicts
            deadline = time.monotonic() + 0.3
            while time.monotonic() < deadline:
                time.sleep(0.02)

        batches = iter(sampler)
        handed = []
        staged = []  # per batch handed out, its samples found staged once the loader settled
        checked = 0
        for step in range(20):
            # The DataLoader asks for one more batch each time the loop takes one.
            handed.append(next(batches))
            settle()
            staged.append({i for i in handed[-1] if dataset[i] == "stage"})
            for batch, was in zip(handed[-ahead:], staged[-ahead:]):
                assert {i for i in was if dataset[i] != "stage"} == set(), step
                checked += len(was)
        assert sampler.stats(epochs="all")["epochs"][0]["evictions"] > 0 and checked > 150
