"""The plan against an independent oracle: the same PRNG and shuffle written in plain Python."""

import collections

import numpy as np
import pytest

import prestage

MASK = (1 << 64) - 1


def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return state, z ^ (z >> 31)


class Xoshiro256:
    def __init__(self, seed, stream):
        _, mixed = splitmix64(stream)
        sm = seed ^ mixed
        self.s = []
        for _ in range(4):
            sm, word = splitmix64(sm)
            self.s.append(word)

    def next(self):
        s = self.s
        rotl = lambda x, k: ((x << k) | (x >> (64 - k))) & MASK  # noqa: E731
        result = (rotl((s[1] * 5) & MASK, 7) * 9) & MASK
        t = (s[1] << 17) & MASK
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
        return result

    def below(self, n):  # Lemire's unbiased bounded integer
        m = self.next() * n
        low = m & MASK
        if low < n:
            threshold = ((1 << 64) - n) % n
            while low < threshold:
                m = self.next() * n
                low = m & MASK
        return m >> 64


def oracle_order(n, seed, epoch):
    order = list(range(n))
    rng = Xoshiro256(seed, epoch)
    for i in range(n - 1, 0, -1):
        j = rng.below(i + 1)
        order[i], order[j] = order[j], order[i]
    return order


@pytest.mark.parametrize("n,seed,epoch", [(1, 0, 0), (2, 1, 0), (10, 0, 0), (257, 42, 3), (1000, 2**63, 7)])
def test_order_equals_the_python_oracle(n, seed, epoch):
    assert prestage.plan.epoch_order(n, seed, epoch).tolist() == oracle_order(n, seed, epoch)


def test_no_shuffle_is_catalog_order():
    assert prestage.plan.epoch_order(9, 5, 2, shuffle=False).tolist() == list(range(9))


def oracle_batches(n, bs, seed, epoch, rank, world, drop_last):
    """Rank slices of global batches, with DistributedSampler's padding, written independently."""
    order = oracle_order(n, seed, epoch)
    if drop_last:
        per_rank = n // (bs * world) * bs
    else:
        per_rank = -(-n // world)
        order = (order * (world + 1))[: per_rank * world]
    batches = []
    for b in range(-(-per_rank // bs)):
        size = min(bs, per_rank - b * bs)
        start = b * bs * world + rank * size
        batches.append(order[start:start + size])
    return batches


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_rank_batches_equal_the_oracle_and_cover_the_set(world, drop_last):
    n, bs = 23, 4
    seen = collections.Counter()
    counts = set()
    for rank in range(world):
        got = prestage.plan.epoch_batches(n, bs, seed=1, epoch=2, rank=rank, world_size=world,
                                          drop_last=drop_last)
        assert got == oracle_batches(n, bs, 1, 2, rank, world, drop_last)
        counts.add(len(got))
        for b in got:
            seen.update(b)
    assert len(counts) == 1  # every rank has the same number of batches
    if drop_last:
        assert all(c == 1 for c in seen.values())
        assert len(seen) == n // (bs * world) * bs * world
    else:
        assert set(seen) == set(range(n))
        assert sum(seen.values()) - n < world  # only the padding repeats


def test_orders_look_uniform():
    # Position of sample 0 over many epochs: roughly uniform over 8 places.
    positions = [int(np.argmax(prestage.plan.epoch_order(8, 3, e) == 0)) for e in range(4000)]
    hist = np.bincount(positions, minlength=8)
    assert hist.min() > 400 and hist.max() < 600
