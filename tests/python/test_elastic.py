"""Elastic restarts: the global position in a state dict, merging ranks' states, resuming on another
number of ranks and batch size, and set_epoch() after a resume, for every adaptor.

The oracle for orders is ``prestage.plan.epoch_order`` (the epoch's global permutation, tested on its
own) sliced by hand as the design says (global batch g = positions [g*B*W, (g+1)*B*W), rank r its r-th
slice); the oracle for bytes is the source file."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import pytest

import prestage
from prestage.state import merge_states

N = 60


def make_raw(root: Path, n: int = N) -> prestage.Catalog:
    rng = np.random.default_rng(7)
    for i in range(n):
        folder = root / f"c{i % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{i:04d}.bin").write_bytes(rng.bytes(int(rng.integers(20, 200))))
    return prestage.Catalog.from_folder(root, [])


@pytest.fixture
def raw(tmp_path: Path) -> prestage.Catalog:
    return make_raw(tmp_path / "raw")


def take(loader: prestage.Loader, batches: Optional[int] = None) -> List[List[int]]:
    """Up to `batches` batches of the loader's next iteration (all: None), each sample's bytes
    checked against its source file."""
    cat = loader._catalog
    out = []
    if batches == 0:
        return out
    for b in loader:
        data, off = b.data, b.offsets
        for k, i in enumerate(b.indices):
            assert data[off[k]:off[k + 1]].tobytes() == cat.source_path(int(i)).read_bytes()
        out.append([int(i) for i in b.indices])
        del b
        if batches is not None and len(out) == batches:
            break
    return out


def rank_slices(order: List[int], batch_size: int, world_size: int, rank: int) -> List[List[int]]:
    """Rank `rank`'s batches of `order` (no padding needed: len(order) is a multiple of world_size)."""
    assert len(order) % world_size == 0
    per_rank = len(order) // world_size
    batches = []
    for g in range(-(-per_rank // batch_size)):
        size = min(batch_size, per_rank - g * batch_size)
        start = g * batch_size * world_size + rank * size
        batches.append(order[start:start + size])
    return batches


def loaders(cat, world_size: int, batch_size: int, **options) -> List[prestage.Loader]:
    return [prestage.Loader(cat, batch_size, decode="raw", seed=5, rank=r, world_size=world_size, **options)
            for r in range(world_size)]


def test_state_dict_holds_the_global_position(raw):
    ranks = loaders(raw, 4, 3)
    for loader in ranks:
        loader.set_epoch(2)
        take(loader, 2)
    states = [loader.state_dict() for loader in ranks]
    for r, state in enumerate(states):
        assert state["epoch"] == 2 and state["batch"] == 2 and state["rank"] == r
        assert state["position"] == 2 * 3 * 4 and state["consumed_beyond"] == []
        assert state["resumed_from"] == []
    assert merge_states(states)["position"] == 24
    for loader in ranks:
        loader.close()


@pytest.mark.parametrize("stage", [False, True])
def test_resume_on_another_world_size_and_batch_size_gives_each_remaining_sample_once(raw, tmp_path, stage):
    options = {"stage_dir": str(tmp_path / "stage")} if stage else {}
    order = [int(i) for i in prestage.plan.epoch_order(N, 5, 1)]
    first = loaders(raw, 4, 3, **options)
    seen = []
    for loader in first:
        loader.set_epoch(1)
        for batch in take(loader, 2):  # 24 of 60
            seen += batch
        state = loader.state_dict()
        loader.close()
    assert sorted(seen) == sorted(order[:24])
    # 36 remain: 3 ranks of 4 take 3 batches each, the last global batch 12 as well.
    second = loaders(raw, 3, 4, **options)
    for r, loader in enumerate(second):
        loader.load_state_dict(state)
        rest = take(loader)
        assert len(rest) == 3 and len(loader) == 5
        assert rest == rank_slices(order[24:], 4, 3, r)  # the rest of the permutation, in order
        seen += [i for b in rest for i in b]
        # The next epoch is what a fresh run on 3 ranks gives.
        nxt = [int(i) for i in prestage.plan.epoch_order(N, 5, 2)]
        assert take(loader) == rank_slices(nxt, 4, 3, r)
        loader.close()
    assert collections.Counter(seen) == collections.Counter(range(N))


def test_merged_states_of_ranks_stopped_apart_resume_without_loss_or_repeat(raw):
    ranks = loaders(raw, 4, 2)
    seen = []
    for loader, batches in zip(ranks, [3, 1, 2, 0]):  # a kill caught them at different batches
        for b in take(loader, batches):
            seen += b
    merged = merge_states([loader.state_dict() for loader in reversed(ranks)])
    assert merged["position"] == 6  # the first global batch but rank 3's slice of it
    assert merged["consumed_beyond"] == [[8, 10], [12, 14], [16, 18]]  # what the ranks ahead took
    for loader in ranks:
        loader.close()
    for loader in loaders(raw, 2, 5):
        loader.load_state_dict(merged)
        seen += [i for b in take(loader) for i in b]
        loader.close()
    # 60 - 12 = 48 remain over 2 ranks: no padding, so exactly the epoch.
    assert collections.Counter(seen) == collections.Counter(range(N))


def test_a_resume_on_the_same_layout_gives_the_very_batches_of_the_uninterrupted_run(raw):
    with prestage.Loader(raw, 4, decode="raw", seed=5, rank=1, world_size=3) as whole:
        expected = take(whole)
    with prestage.Loader(raw, 4, decode="raw", seed=5, rank=1, world_size=3) as first:
        assert take(first, 2) == expected[:2]
        state = first.state_dict()
    with prestage.Loader(raw, 4, decode="raw", seed=5, rank=1, world_size=3, readers=1) as again:
        again.load_state_dict(state)
        assert again._resume is None  # no new plan was needed
        assert take(again) == expected[2:]


def test_a_state_from_a_resumed_loader_resumes_again_on_a_third_layout(raw):
    order = [int(i) for i in prestage.plan.epoch_order(N, 5, 0)]
    seen = []
    for loader in loaders(raw, 4, 2):  # 4 -> 2 -> 3 ranks, mid-epoch each time
        seen += [i for b in take(loader, 2) for i in b]  # 16
        state = loader.state_dict()
        loader.close()
    for loader in loaders(raw, 2, 5):
        loader.load_state_dict(state)
        seen += [i for b in take(loader, 2) for i in b]  # 20 more; 24 left: 8 per rank of 3
        state2 = loader.state_dict()
        loader.close()
    assert state2["position"] == 36 and state2["resumed_from"] == [[0, 16]]
    for r, loader in enumerate(loaders(raw, 3, 2)):
        loader.load_state_dict(state2)
        rest = take(loader)
        assert rest == rank_slices(order[36:], 2, 3, r)
        seen += [i for b in rest for i in b]
        loader.close()
    assert collections.Counter(seen) == collections.Counter(range(N))


def test_remainders_pad_without_drop_last_and_are_left_out_with_it(raw):
    order = [int(i) for i in prestage.plan.epoch_order(N, 5, 0)]
    with prestage.Loader(raw, 10, decode="raw", seed=5) as first:
        take(first, 4)
        state = first.state_dict()  # 40 consumed, 20 remain
    assert state["position"] == 40
    # Without drop_last: 20 over 3 ranks is 7 each, the 21st the epoch order's first sample again.
    got = []
    for loader in loaders(raw, 3, 3):
        loader.load_state_dict(state)
        got += [i for b in take(loader) for i in b]
        loader.close()
    assert collections.Counter(got) == collections.Counter(order[40:] + order[:1])
    # With drop_last: whole global batches of 3 x 3 only: 18 of the 20, the last 2 left out.
    got = []
    for loader in loaders(raw, 3, 3, drop_last=True):
        loader.load_state_dict(state)
        assert loader.batches_in_epoch(0) == 2
        got += [i for b in take(loader) for i in b]
        assert loader.state_dict()["epoch"] == 1
        loader.close()
    assert sorted(got) == sorted(order[40:58])


def test_a_state_without_a_global_position_still_resumes(raw):
    with prestage.Loader(raw, 4, decode="raw", seed=5, world_size=2) as whole:
        expected = take(whole)
    old = {"epoch": 0, "batch": 3, "seed": 5, "shuffle": True, "batch_size": 4, "world_size": 2,
           "drop_last": False, "num_samples": N}  # as state_dict() wrote it before
    with prestage.Loader(raw, 4, decode="raw", seed=5, world_size=2) as loader:
        loader.load_state_dict(old)
        assert take(loader) == expected[3:]


def test_a_state_of_another_data_set_or_seed_is_refused(raw, tmp_path):
    with prestage.Loader(raw, 4, decode="raw", seed=5) as loader:
        state = loader.state_dict()
    with prestage.Loader(raw, 4, decode="raw", seed=6) as other, pytest.raises(prestage.ConfigError, match="seed"):
        other.load_state_dict(state)
    small = make_raw(tmp_path / "small", 30)
    with prestage.Loader(small, 4, decode="raw", seed=5) as other, \
            pytest.raises(prestage.ConfigError, match="num_samples"):
        other.load_state_dict(state)
    bad = dict(state, position=10, consumed_beyond=[[5, 12]])  # overlaps the prefix
    with prestage.Loader(raw, 4, decode="raw", seed=5) as other:
        with pytest.raises(prestage.ConfigError):
            other.load_state_dict(bad)
        take(other, 1)  # still usable


def test_merge_states_refuses_missing_ranks_and_mixed_plans(raw):
    ranks = loaders(raw, 3, 2)
    states = [loader.state_dict() for loader in ranks]
    for loader in ranks:
        loader.close()
    with pytest.raises(prestage.ConfigError, match="missing"):
        merge_states(states[:2])
    with pytest.raises(prestage.ConfigError, match="rank 1"):
        merge_states([states[0], states[1], states[1]])
    with pytest.raises(prestage.ConfigError, match="batch_size"):
        merge_states([states[0], states[1], dict(states[2], batch_size=4)])
    with pytest.raises(prestage.ConfigError):
        merge_states([])


def readme_loop(start: int, epochs: int, set_epoch, iterate) -> Dict[int, List[List[int]]]:
    """The README's loop: for epoch in range(start, E): set_epoch(epoch); for batch in loader: ..."""
    got = {}
    for epoch in range(start, epochs):
        set_epoch(epoch)
        got[epoch] = list(iterate())
    return got


def test_set_epoch_with_the_epoch_of_a_loaded_state_keeps_its_position(raw):
    with prestage.Loader(raw, 6, decode="raw", seed=5) as whole:  # 10 batches per epoch
        whole.set_epoch(3)
        full3 = take(whole)
        full4 = take(whole)
    with prestage.Loader(raw, 6, decode="raw", seed=5) as first:
        first.set_epoch(3)
        take(first, 3)
        state = first.state_dict()
    with prestage.Loader(raw, 6, decode="raw", seed=5) as loader:
        loader.load_state_dict(state)
        got = readme_loop(state["epoch"], 5, loader.set_epoch, lambda: take(loader))
        assert got[3] == full3[3:]  # 7 batches left, not 10
        assert got[4] == full4
        loader.set_epoch(3)  # the epoch asked for again, once resumed: all of it
        assert take(loader) == full3


def test_set_epoch_after_a_resume_on_another_layout_keeps_its_position_then_gives_whole_epochs(raw):
    order = [int(i) for i in prestage.plan.epoch_order(N, 5, 3)]
    ranks = loaders(raw, 2, 3)
    for loader in ranks:
        loader.set_epoch(3)
        take(loader, 2)  # 12
    state = ranks[0].state_dict()
    for loader in ranks:
        loader.close()
    with prestage.Loader(raw, 4, decode="raw", seed=5) as loader:
        loader.load_state_dict(state)
        got = readme_loop(3, 4, loader.set_epoch, lambda: take(loader))
        assert [i for b in got[3] for i in b] == order[12:]
        loader.set_epoch(3)  # again: the whole epoch, from a plan without the resume
        assert [i for b in take(loader) for i in b] == order


@pytest.mark.torch
def test_torch_loader_and_staged_sampler_keep_the_position_in_the_readme_loop(raw, tmp_path):
    import prestage.torch as pt

    order = [int(i) for i in prestage.plan.epoch_order(N, 5, 1)]
    with pt.Loader(raw, batch_size=6, decode="raw", seed=5, world_size=2, rank=0) as first:
        first.set_epoch(1)
        for k, _ in enumerate(first):
            if k == 1:
                break
        state = first.state_dict()  # 2 batches x 6 x 2 ranks = 24 consumed
    assert state["position"] == 24
    with pt.Loader(raw, batch_size=4, decode="raw", seed=5, world_size=3, rank=2) as loader:
        loader.load_state_dict(state)
        got = readme_loop(1, 2, loader.set_epoch, lambda: [len(labels) for _, labels in loader])
        assert got[1] == [4, 4, 4]  # 36 left over 3 ranks of 4, not a whole epoch's 5 batches
    with pt.StagedSampler(raw, batch_size=4, stage_dir=tmp_path / "stage", seed=5, world_size=3,
                          rank=2) as sampler:
        sampler.load_state_dict(state)
        got = readme_loop(1, 3, sampler.set_epoch, lambda: iter(sampler))
        assert got[1] == rank_slices(order[24:], 4, 3, 2)
        nxt = [int(i) for i in prestage.plan.epoch_order(N, 5, 2)]
        assert got[2] == rank_slices(nxt, 4, 3, 2)


@pytest.mark.torch
def test_staged_sampler_state_after_a_resume_counts_the_taken_batches_globally(raw, tmp_path):
    import prestage.torch as pt

    with pt.StagedSampler(raw, batch_size=5, stage_dir=tmp_path / "stage", seed=5, world_size=1,
                          rank=0) as sampler:
        it = iter(sampler)
        for _ in range(3):
            next(it)
        state = sampler.state_dict()  # 3 batches of 5
    assert state["position"] == 15
    with pt.StagedSampler(raw, batch_size=3, stage_dir=tmp_path / "stage", seed=5, world_size=3,
                          rank=0) as sampler:
        sampler.load_state_dict(state)
        it = iter(sampler)
        next(it)
        assert sampler.state_dict()["position"] == 15 + 9
        assert sampler.state_dict()["resumed_from"] == [[0, 15]]


@pytest.mark.tf
def test_tf_staged_paths_resume_keeps_the_position(raw, tmp_path):
    import prestage.tf as ptf

    order = [int(i) for i in prestage.plan.epoch_order(N, 5, 0)]
    state = {"epoch": 0, "batch": 0, "position": 20, "consumed_beyond": [], "rank": 0, "resumed_from": [],
             "seed": 5, "shuffle": True, "batch_size": 5, "world_size": 2, "drop_last": False,
             "num_samples": N}
    index_of = {raw.source_path(i).read_bytes(): i for i in range(N)}
    ds = ptf.staged_paths(raw, 4, stage_dir=str(tmp_path / "stage"), seed=5, world_size=2, rank=1,
                          resume=state, epochs=1, read=True)
    try:
        got = [index_of[data.numpy()] for data, _ in ds]
    finally:
        ds.sampler.close()
    assert got == [i for b in rank_slices(order[20:], 4, 2, 1) for i in b]


@pytest.mark.tf
def test_tf_dataset_resumes_a_state_of_another_world_size(raw):
    import prestage.tf as ptf

    order = [int(i) for i in prestage.plan.epoch_order(N, 5, 0)]
    index_of = {raw.source_path(i).read_bytes(): i for i in range(N)}
    state = {"epoch": 0, "batch": 0, "position": 20, "consumed_beyond": [], "rank": 0, "resumed_from": [],
             "seed": 5, "shuffle": True, "batch_size": 5, "world_size": 2, "drop_last": False,
             "num_samples": N}
    ds = ptf.dataset(raw, 4, decode="raw", seed=5, world_size=2, rank=1, resume=state)
    try:
        got = [[index_of[s] for s in data.numpy()] for data, _ in ds]
        assert got == rank_slices(order[20:], 4, 2, 1)
        assert ds.loader.state_dict()["epoch"] == 1
    finally:
        ds.loader.close()
