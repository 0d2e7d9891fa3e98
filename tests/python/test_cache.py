"""The bounded stage directory against independent simulations of Belady's rule and of LRU."""

import numpy as np
import pytest

import prestage

FILE_BYTES = 1000
N_FILES = 60
BATCH = 4
LOOKAHEAD, DEPTH = 2, 2
# Files of the current batch and of the lookahead + depth + 1 batches before it may still be in flight
# (planned, not yet decoded): the loader never evicts them, and neither do the simulations.
PROTECTED_BATCHES = LOOKAHEAD + DEPTH + 2


@pytest.fixture
def equal_files(tmp_path):
    root = tmp_path / "data"
    rng = np.random.default_rng(0)
    for c in range(3):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(N_FILES // 3):
            (root / f"c{c}" / f"{i:03d}.bin").write_bytes(rng.bytes(FILE_BYTES))
    return root


def plan_stream(n, epochs, seed, rank=0, world_size=1):
    """[(epoch, position, sample)] of one rank in plan order, from prestage.plan (checked against its
    own oracle)."""
    stream = []
    for e in range(epochs):
        for b, batch in enumerate(prestage.plan.epoch_batches(n, BATCH, seed=seed, epoch=e, rank=rank,
                                                              world_size=world_size)):
            for k, s in enumerate(batch):
                stream.append((e, b, b * BATCH + k, s))
    return stream


def simulate(n, capacity, epochs, seed, policy, declined=None, rank=0, world_size=1):
    """Misses per epoch of a cache of `capacity` equal files. Belady: on a miss with a full cache, give
    up the unprotected file used farthest in the future, unless the incoming one is used even later
    (then read it without caching). LRU: give up the least recently used unprotected file.
    `declined`, a list: gets the (epoch, batch) of each miss that is not cached.

    Belady's next uses are those the loader sees: in epoch e, exact in epochs e to e + 2; in the
    min(64, 8 * world_size) epochs after those, only the epoch (a use at its end, the larger file id
    first among equal ones); later, after every use."""
    far = min(64, 8 * world_size)
    horizon = epochs + 3 + far
    first_use = {}
    for e, b, pos, s in plan_stream(n, horizon, seed, rank, world_size):
        first_use.setdefault((e, s), pos)
    per_epoch = len(prestage.plan.epoch_batches(n, BATCH, seed=seed, epoch=0, rank=rank,
                                                world_size=world_size)) * BATCH

    def next_use_from(s, e, pos):  # (epoch, position in it), or None
        if first_use.get((e, s), -1) >= pos:
            return e, first_use[(e, s)]
        for later in range(e + 1, horizon):
            if (later, s) in first_use:
                return later, first_use[(later, s)]
        return None

    def seen_in(e, use):
        if use is None or use[0] > e + 2 + far:
            return float("inf")
        return use[0] * (per_epoch + 1) + (use[1] if use[0] <= e + 2 else per_epoch)

    cache = {}  # file -> Belady: its next use; LRU: its last use
    last_batch = {}
    misses = [0] * epochs
    seq = 0
    stream = plan_stream(n, epochs, seed, rank, world_size)
    for i, (e, b, pos, s) in enumerate(stream):
        if pos % BATCH == 0:
            seq += 1
        use = next_use_from(s, e, pos + 1) if policy == "belady" else e * per_epoch + pos
        key = seen_in(e, use) if policy == "belady" else use
        last_batch[s] = seq
        if s in cache:
            cache[s] = use
            continue
        misses[e] += 1
        if len(cache) >= capacity:
            keys = {f: seen_in(e, u) if policy == "belady" else u for f, u in cache.items()}
            order = sorted(((k, f) for f, k in keys.items()), reverse=(policy == "belady"))
            victim = None
            for k, f in order:
                if last_batch.get(f, 0) + PROTECTED_BATCHES > seq:
                    continue
                if policy == "belady" and k <= key:
                    break
                victim = f
                break
            if victim is None:
                if declined is not None:
                    declined.append((e, b))
                continue  # not cached: read from the source
            del cache[victim]
        cache[s] = use
    return misses


def run_loader(root, stage, cache_bytes, eviction, epochs, seed, rank=0, world_size=1):
    cat = prestage.Catalog.from_folder(root, extensions=[".bin"])
    contents = {i: cat.source_path(i).read_bytes() for i in range(len(cat))}
    # stage_patience=None: stage 3 always waits for stage 2, so what is staged follows the plan exactly.
    with prestage.Loader(cat, batch_size=BATCH, decode="raw", stage_dir=stage, seed=seed,
                         stage_patience=None, cache_bytes=cache_bytes, eviction=eviction, lookahead=LOOKAHEAD,
                         depth=DEPTH, prefetchers=3, readers=2, rank=rank,
                         world_size=world_size) as loader:
        for _ in range(epochs):
            for batch in loader:
                data, off = batch.data, batch.offsets
                for k, i in enumerate(batch.indices):  # never wrong bytes, whatever was evicted
                    assert data[off[k]:off[k + 1]].tobytes() == contents[int(i)]
        stats = loader.stats(epochs="all")
    # The copies; index.log and node.table are bookkeeping outside the bound.
    on_disk = sum(p.stat().st_size for p in stage.rglob("*") if p.is_file() and p.name not in ("index.log", "node.table"))
    return stats, on_disk


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("eviction", ["clairvoyant", "lru"])
def test_misses_per_epoch_equal_the_simulation(equal_files, tmp_path, fraction, eviction):
    capacity = int(fraction * N_FILES)
    cache_bytes = capacity * FILE_BYTES
    stats, on_disk = run_loader(equal_files, tmp_path / "stage", cache_bytes, eviction, 3, seed=7)
    got = [e["misses"] for e in stats["epochs"][:3]]
    declined = []
    policy = "belady" if eviction == "clairvoyant" else "lru"
    expected = simulate(N_FILES, capacity, 3, 7, policy)
    assert got == expected
    # The files not cached were read into memory by stage 2, those of the three epochs and at most
    # those of the batches planned ahead into the fourth (the first LOOKAHEAD + DEPTH + 1).
    simulate(N_FILES, capacity, 4, 7, policy, declined)
    consumed = sum(1 for e, _ in declined if e < 3)
    ahead = sum(1 for e, b in declined if e == 3 and b < LOOKAHEAD + DEPTH + 1)
    assert consumed <= stats["read_ahead"] <= consumed + ahead
    assert stats["read_ahead_bytes"] == stats["read_ahead"] * FILE_BYTES
    # Stage 3 read the source only for those (decoded batches, counted when decoded): never for a
    # staged file, so none was evicted while it was read (its copy gone, stage 3 would read the source).
    assert consumed <= stats["misses"] <= stats["read_ahead"]
    assert stats["misses_read_ahead"] == stats["misses"]
    if eviction == "clairvoyant" and fraction < 0.9:  # LRU declines only when all are protected
        assert consumed > 0
    assert stats["stage_bytes_peak"] <= cache_bytes
    assert on_disk <= cache_bytes
    assert [e["epoch"] for e in stats["epochs"][:3]] == [0, 1, 2]
    assert stats["epochs"][0]["misses"] == N_FILES  # a cold start misses everything once


@pytest.mark.parametrize("eviction", ["clairvoyant", "lru"])
def test_a_rank_of_three_misses_as_the_simulation_of_its_own_stream(equal_files, tmp_path, eviction):
    # Each rank bounds its own stage directory over its slice of every global batch (20 of the 60 files
    # per epoch here): room for 5 of them.
    stats, on_disk = run_loader(equal_files, tmp_path / "stage", 5 * FILE_BYTES, eviction, 3, seed=2,
                                rank=1, world_size=3)
    policy = "belady" if eviction == "clairvoyant" else "lru"
    assert [e["misses"] for e in stats["epochs"][:3]] == simulate(N_FILES, 5, 3, 2, policy, rank=1,
                                                                   world_size=3)
    assert stats["epochs"][0]["misses"] == N_FILES // 3
    assert stats["stage_bytes_peak"] <= 5 * FILE_BYTES and on_disk <= 5 * FILE_BYTES


def test_clairvoyant_beats_lru_and_approaches_the_optimum(equal_files, tmp_path):
    capacity = N_FILES // 2
    misses = {}
    for eviction in ("clairvoyant", "lru"):
        stats, _ = run_loader(equal_files, tmp_path / eviction, capacity * FILE_BYTES, eviction, 4,
                              seed=3)
        misses[eviction] = sum(e["misses"] for e in stats["epochs"][1:4])
    # Optimum without the protected window: (1 - 0.5) of the set per epoch after the first.
    assert misses["clairvoyant"] < misses["lru"]
    assert misses["clairvoyant"] <= 1.15 * 0.5 * N_FILES * 3


def test_a_warm_restart_reuses_the_directory_and_stays_within_the_bound(equal_files, tmp_path):
    stage = tmp_path / "stage"
    bound = 30 * FILE_BYTES
    run_loader(equal_files, stage, bound, "clairvoyant", 1, seed=5)
    # Same seed, half the bound: the restart evicts down to it, then serves hits from what is left.
    stats, on_disk = run_loader(equal_files, stage, bound // 2, "clairvoyant", 1, seed=5)
    assert stats["epochs"][0]["hits"] > 0
    assert stats["stage_bytes_peak"] <= bound // 2
    assert on_disk <= bound // 2


def test_unbounded_stage_directory_counts_hits_and_misses(equal_files, tmp_path):
    stats, _ = run_loader(equal_files, tmp_path / "stage", 0, "clairvoyant", 2, seed=1)
    assert stats["epochs"][0]["misses"] == N_FILES
    assert stats["epochs"][1]["misses"] == 0 and stats["epochs"][1]["hits"] == N_FILES
    assert all(e["evictions"] == 0 for e in stats["epochs"])


def test_declined_jpegs_read_ahead_decode_as_direct_reads(make_folder, tmp_path):
    root = make_folder(4, 10, size=None)  # 40 JPEGs of mixed sizes
    cat = prestage.Catalog.from_folder(root)
    cache_bytes = sum(cat.source_path(i).stat().st_size for i in range(len(cat))) // 4
    common = dict(batch_size=6, image_size=(24, 24), seed=2, readers=2)
    with prestage.Loader(cat, **common) as direct:
        expected = [[(b.images.copy(), b.indices.copy()) for b in direct] for _ in range(3)]
    with prestage.Loader(cat, stage_dir=tmp_path / "stage", cache_bytes=cache_bytes, prefetchers=3,
                         stage_patience=None, **common) as loader:
        for epoch in expected:
            got = [(b.images.copy(), b.indices.copy()) for b in loader]
            assert len(got) == len(epoch)
            for (images, indices), (want_images, want_indices) in zip(got, epoch):
                np.testing.assert_array_equal(indices, want_indices)
                np.testing.assert_array_equal(images, want_images)
        s = loader.stats(epochs="all")
    assert s["read_ahead"] > 0 and s["stage_bytes_peak"] <= cache_bytes
    assert s["misses"] <= s["read_ahead"]
    assert s["misses_read_ahead"] == s["misses"]  # every source read of stage 3 was read ahead


def test_a_declined_file_that_cannot_be_read_fails_at_its_batch(equal_files, tmp_path):
    cat = prestage.Catalog.from_folder(equal_files, extensions=[".bin"])
    # A 10% cache declines files in every batch of epoch 1 (the simulation says which batches). Take
    # one past the batches planned ahead across the boundary, and remove its files after epoch 0:
    # whether stage 2 reads them ahead or copies them, the failure reaches that batch, naming a file.
    declined = []
    simulate(N_FILES, N_FILES // 10, 2, 4, "belady", declined)
    b = next(b for e, b in declined if e == 1 and b > LOOKAHEAD + DEPTH + 2)
    victims = [cat.source_path(s) for e, bb, _, s in plan_stream(N_FILES, 2, 4) if (e, bb) == (1, b)]
    with prestage.Loader(cat, batch_size=BATCH, decode="raw", stage_dir=tmp_path / "stage", seed=4,
                         stage_patience=None, cache_bytes=N_FILES // 10 * FILE_BYTES,
                         lookahead=LOOKAHEAD, depth=DEPTH, prefetchers=2, readers=2) as loader:
        assert sum(1 for _ in loader) == len(loader)
        for p in victims:
            p.unlink()
        served = 0
        with pytest.raises(prestage.IoError) as raised:
            for _ in loader:
                served += 1
    assert served == b
    assert any(str(p) in str(raised.value) for p in victims)
