"""Warm restart: a job that comes back on a node whose stage directory an earlier run left adopts
its copies: it reads from the (emulated) PFS only what the directory lacks, keeps within a smaller
bound the copies its resumed plan uses first, and serves each kept copy without reading its source.

The oracle for what is read is the emulator's count of opens per file; for the plan order,
``prestage.plan.epoch_order``; for bytes, the source files."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Dict, List

import numpy as np

import prestage

N = 60


def make_set(root: Path) -> None:
    rng = np.random.default_rng(21)
    for i in range(N):
        folder = root / f"c{i % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{i:03d}.bin").write_bytes(rng.bytes(int(rng.integers(200, 3000))))


def opens(pfs, catalog: prestage.Catalog, mount: Path) -> Dict[int, int]:
    """PFS opens so far, per sample."""
    paths = pfs.stats()["paths"]
    return {i: paths.get(str(catalog.source_path(i).relative_to(mount)), {}).get("opens", 0)
            for i in range(len(catalog))}


def take(loader: prestage.Loader, backing: Path, mount: Path, batches=None) -> List[int]:
    """The samples of up to `batches` batches (all: None), each checked against its source file,
    read beside the emulator (which would count the check as the loader's read)."""
    cat = loader._catalog
    got: List[int] = []
    for n, b in enumerate(loader):
        for k, i in enumerate(b.indices):
            source = backing / cat.source_path(int(i)).relative_to(mount)
            assert b.data[b.offsets[k]:b.offsets[k + 1]].tobytes() == source.read_bytes()
            got.append(int(i))
        del b
        if batches is not None and n + 1 == batches:
            break
    return got


def staged_files(stage: Path) -> set:
    """The ids of the copies in the stage directory (named by their hex id; ".part" files aside)."""
    return {int(p.name, 16) for p in stage.glob("prestage-*/*/*") if p.is_file() and "." not in p.name}


def test_a_warm_restart_on_another_world_size_reads_from_the_pfs_only_what_the_directory_lacks(
        tmp_path, pfs):
    src = tmp_path / "src"
    make_set(src)
    emulator = pfs(src)
    mount = emulator.mountpoint
    catalog = prestage.Catalog.from_folder(mount, [".bin"])
    stage = tmp_path / "stage"
    options = dict(decode="raw", seed=4, stage_dir=stage, stage_patience=None, cache_bytes=0)
    # The first job, rank 0 of 2, is preempted 4 batches into epoch 0: it has copied those and the
    # batches its stage 2 had reached.
    with prestage.Loader(catalog, 5, world_size=2, rank=0, **options) as first:
        seen = take(first, src, mount, 4)
        state = first.state_dict()
    warm = staged_files(stage)
    assert set(seen) <= warm and len(warm) < N
    before = opens(emulator, catalog, mount)
    # It comes back on one rank with another batch size: the rest of the epoch (what rank 1 had
    # read too, as that rank's node is gone), then epoch 1.
    with prestage.Loader(catalog, 7, world_size=1, rank=0, **options) as again:
        again.load_state_dict(state)
        rest = take(again, src, mount)
        assert len(rest) == N - 4 * 5 * 2  # 4 batches of 5 on 2 ranks were consumed
        take(again, src, mount)  # epoch 1: every sample
        stats = again.stats(epochs="all")
    after = opens(emulator, catalog, mount)
    read = {i: after[i] - before[i] for i in range(N)}
    assert all(read[i] == 0 for i in warm)  # adopted, checked against its CRC, never read again
    assert all(read[i] == 1 for i in set(range(N)) - warm)  # copied once, then served from the copy
    assert stats["staged_files"] == N - len(warm)
    assert stats["stage_failures"] == 0 and stats["stage_corrupt"] == 0


def test_a_warm_restart_with_a_smaller_bound_keeps_the_copies_the_resumed_plan_uses_first(tmp_path, pfs):
    src = tmp_path / "src"
    make_set(src)
    emulator = pfs(src)
    mount = emulator.mountpoint
    catalog = prestage.Catalog.from_folder(mount, [".bin"])
    sizes = {i: (src / catalog.source_path(i).relative_to(mount)).stat().st_size for i in range(N)}
    stage = tmp_path / "stage"
    options = dict(decode="raw", seed=4, stage_dir=stage, stage_patience=None)
    # The first job had room for the whole set: after epoch 0 every file is staged.
    with prestage.Loader(catalog, 4, cache_bytes=0, **options) as first:
        take(first, src, mount)
        take(first, src, mount, 5)  # 20 samples into epoch 1
        state = first.state_dict()
    assert staged_files(stage) == set(range(N))
    # It comes back with a third of the room, with another batch size. Its plan from there: the
    # rest of epoch 1's order, then epoch 2's. Kept: the longest prefix of the copies in the order
    # of their next use that fits the bound; the rest are evicted.
    bound = sum(sizes.values()) // 3
    order = [int(i) for i in prestage.plan.epoch_order(N, 4, 1)][20:]
    kept, room = set(), bound
    for i in order:
        if sizes[i] > room:
            break
        kept.add(i)
        room -= sizes[i]
    before = opens(emulator, catalog, mount)
    with prestage.Loader(catalog, 6, cache_bytes=bound, **options) as again:
        again.load_state_dict(state)
        rest = take(again, src, mount)
        stats = again.stats(epochs="all")
    assert rest == order  # one rank: the rest of the epoch's order, in order
    read = {i: opens(emulator, catalog, mount)[i] - before[i] for i in range(N)}
    # Each kept copy is used before anything could displace it (its next use is in this epoch, that
    # of every file read meanwhile in the next): a hit, never read from the PFS. The others of the
    # epoch's rest are read from it (once in the epoch; stage 2 may have begun epoch 2 already).
    assert {i for i in order if read[i] == 0} == kept
    epoch1 = next(e for e in stats["epochs"] if e["epoch"] == 1)
    assert epoch1["hits"] == len(kept) and epoch1["source_reads"] == len(order) - len(kept)
    assert stats["stage_bytes_peak"] <= bound
