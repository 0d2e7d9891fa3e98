"""prestage simulate against a plain per-sample walk of the same rules over prestage.plan.epoch_batches."""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Tuple

import numpy as np
import pytest

from prestage.bench import simulate as sim
from prestage.cli import main
from prestage.plan import epoch_batches, epoch_order


def walk(n: int, batch: int, seed: int, epoch: int, nodes: int, per_node: int) -> List[Tuple[int, int, int]]:
    """(batch, rank, sample) for every use of an epoch in plan order: batch, then rank, then position."""
    world = nodes * per_node
    plans = [epoch_batches(n, batch, seed=seed, epoch=epoch, rank=r, world_size=world) for r in range(world)]
    return [(b, r, s) for b in range(len(plans[0])) for r in range(world) for s in plans[r][b]]


def belady(stream: List[Tuple[int, int, int]], sizes: List[int], capacity: int, epochs: int,
           tier: Callable[[int], int] = lambda s: 0):
    """Belady's rule with bypass over (epoch, global batch, sample) uses, by scanning ahead, samples ranked
    by (tier, next use): an incoming sample evicts only samples ranked after it, the last first; a
    sample not used again ranks last in its tier (ties: the lowest sample id first). Returns the bytes
    missed per epoch, per use whether it missed, and per sample the global batches between which the
    directory held it: [(admitted, evicted or inf)]."""
    def rank(i: int, s: int) -> Tuple[int, float]:
        return tier(s), next((j for j in range(i + 1, len(stream)) if stream[j][2] == s), float("inf"))

    kept: Dict[int, Tuple[int, float]] = {}
    since: Dict[int, int] = {}
    held: Dict[int, List[Tuple[float, float]]] = {}
    missed = [0] * epochs
    miss = []
    for i, (e, t, s) in enumerate(stream):
        here = rank(i, s)
        miss.append(s not in kept)
        if s in kept:
            kept[s] = here
            continue
        missed[e] += sizes[s]
        if sizes[s] > capacity:
            continue
        victims: List[int] = []
        for v in sorted(kept, key=lambda v: (-kept[v][0], -kept[v][1], v)):
            if sum(sizes[k] for k in kept if k not in victims) + sizes[s] <= capacity or kept[v] <= here:
                break
            victims.append(v)
        if sum(sizes[k] for k in kept if k not in victims) + sizes[s] <= capacity:
            for v in victims:
                del kept[v]
                held.setdefault(v, []).append((since.pop(v), t))
            kept[s] = here
            since[s] = t
    for s, t in since.items():
        held.setdefault(s, []).append((t, float("inf")))
    return missed, miss, held


def oracle(n: int, sizes: List[int], nodes: int, per_node: int, cache: float, epochs: int, batch: int,
           seed: int, pfs_gbs: float = 100.0, link_gbs: float = 12.5) -> Dict[str, object]:
    uses = [walk(n, batch, seed, e, nodes, per_node) for e in range(epochs)]
    per_epoch = len({b for b, _, _ in uses[0]})
    owner: Dict[int, int] = {}
    owned: Dict[int, List[int]] = {k: [] for k in range(nodes)}
    for _, r, s in uses[0]:
        if s not in owner:
            owner[s] = r // per_node
            owned[r // per_node].append(s)
    budget = int(cache * sum(sizes) / nodes)
    home = set()
    for node, samples in owned.items():
        used = 0
        for s in samples:
            if used + sizes[s] > budget:
                break
            used += sizes[s]
            home.add(s)
    # With the tier off, each node's directory is Belady's rule over its own uses. With the tier on, the
    # same while a node's link is not faster than its share of the PFS (own first), else its home copies
    # rank ahead of every other sample (home first). A miss is served by the owner node when the
    # sample is within its home budget and the owner held it from an earlier global batch until after
    # this one, else by the PFS.
    home_first = link_gbs > pfs_gbs / nodes
    streams: Dict[int, List[Tuple[int, int, int]]] = {k: [] for k in range(nodes)}
    for e in range(epochs):
        for b, r, s in uses[e]:
            streams[r // per_node].append((e, e * per_epoch + b, s))
    base = [0] * epochs
    walked = {}
    for node in range(nodes):
        off = belady(streams[node], sizes, budget, epochs)
        for e, b in enumerate(off[0]):
            base[e] += b
        walked[node] = off
        if home_first:
            walked[node] = belady(streams[node], sizes, budget, epochs,
                                  lambda s, node=node: 0 if s in home and owner[s] == node else 1)
    pfs = [0] * epochs
    sent = [[0] * nodes for _ in range(epochs)]
    received = [[0] * nodes for _ in range(epochs)]
    for node in range(nodes):
        for (e, t, s), missed in zip(streams[node], walked[node][1]):
            if not missed:
                continue
            o = owner[s]
            if s in home and o != node and any(a < t < v for a, v in walked[o][2].get(s, [])):
                sent[e][o] += sizes[s]
                received[e][node] += sizes[s]
            else:
                pfs[e] += sizes[s]
    return {"pfs": pfs, "sent": sent, "received": received, "base": base,
            "layout": "home first" if home_first else "own first", "held": {k: v[2] for k, v in walked.items()},
            "home": home, "owner": owner}


def run_sim(n: int, sizes: np.ndarray, nodes: int, per_node: int, caches: List[float], epochs: int,
            batch: int, seed: int, link_gbs: float = 12.5) -> List[Dict[str, object]]:
    config = sim.Config(num_samples=n, ranks_per_node=per_node, batch_size=batch, epochs=epochs, seed=seed,
                        link_gbs=link_gbs)
    return sim.simulate(config, [nodes], caches, sizes)["rows"]


# PFS 100 GB/s: a 12.5 GB/s link is slower than a node's share of it up to 8 nodes (own first), a
# 200 GB/s link faster from 1 node (home first).
@pytest.mark.parametrize("link_gbs", [12.5, 200.0])
@pytest.mark.parametrize("n,nodes,per_node,batch,sigma", [(53, 2, 2, 3, 0.6), (61, 3, 2, 4, 0.0),
                                                           (47, 4, 1, 2, 0.8), (29, 1, 3, 5, 0.5)])
def test_simulation_matches_a_per_sample_walk(n, nodes, per_node, batch, sigma, link_gbs):
    sizes = sim.sample_sizes(n, 1000, sigma, seed=n)
    caches = [0.25, 0.5, 1.0]
    rows = run_sim(n, sizes, nodes, per_node, caches, 3, batch, seed=7, link_gbs=link_gbs)
    for cache, row in zip(caches, rows):
        want = oracle(n, sizes.tolist(), nodes, per_node, cache, 3, batch, seed=7, link_gbs=link_gbs)
        assert row["layout"] == want["layout"]
        assert row["with_peers"]["pfs_bytes"] == want["pfs"]
        assert row["with_peers"]["peer_sent"] == want["sent"]
        assert row["with_peers"]["peer_received"] == want["received"]
        assert row["without_peers"]["pfs_bytes"] == want["base"]


def test_layout_is_the_plans():
    n, world, batch = 83, 6, 4
    samples, ranks = sim.epoch_layout(np.asarray(epoch_order(n, 3, 1)), world, batch)
    for r in range(world):
        want = [s for b in epoch_batches(n, batch, seed=3, epoch=1, rank=r, world_size=world) for s in b]
        assert samples[ranks == r].tolist() == want


def test_full_cache_keeps_the_tier_offs_hits_and_reads_each_miss_once_from_a_peer_or_the_pfs():
    n, nodes, per_node = 256, 8, 2  # no padding, equal sizes: every node's share fits its budget
    sizes = sim.sample_sizes(n, 500, 0.0, seed=0)
    row = run_sim(n, sizes, nodes, per_node, [1.0], 4, 4, seed=1)[0]
    assert row["with_peers"]["beyond_budget_samples"] == 0
    off, on = row["without_peers"]["pfs_bytes"], row["with_peers"]["pfs_bytes"]
    assert sum(off[1:]) > 0  # without peers, the shuffle costs reads
    assert on[0] == off[0] == int(sizes.sum())  # epoch 0: every sample read once, by its owner
    sent, received = np.asarray(row["with_peers"]["peer_sent"]), np.asarray(row["with_peers"]["peer_received"])
    assert sent.sum() > 0 and sent.sum() == received.sum()
    assert np.allclose(sent.sum(axis=1), received.sum(axis=1))
    # The nodes' own hits are the tier off's: every miss of the tier off is read once, from a peer
    # (most of them) or from the PFS.
    assert np.allclose(np.asarray(on) + sent.sum(axis=1), off)
    assert all(a <= b for a, b in zip(on, off)) and sum(on[1:]) < sent[1:].sum()


def test_sent_equals_received_with_padding_and_uneven_sizes():
    sizes = sim.sample_sizes(301, 2000, 0.7, seed=5)
    for row in run_sim(301, sizes, 8, 3, [0.25, 1.0], 3, 5, seed=2):
        assert np.isclose(np.sum(row["with_peers"]["peer_sent"]), np.sum(row["with_peers"]["peer_received"]))


def test_one_node_has_no_peer_bytes_and_at_full_cache_matches_the_baseline():
    sizes = sim.sample_sizes(97, 800, 0.0, seed=0)
    rows = run_sim(97, sizes, 1, 4, [0.25, 0.5, 1.0], 3, 8, seed=4)
    for row in rows:
        assert np.sum(row["with_peers"]["peer_sent"]) == 0 and np.sum(row["with_peers"]["peer_received"]) == 0
        # One node: the tier changes nothing (its directory is run as without the tier).
        assert row["without_peers"]["pfs_bytes"] == row["with_peers"]["pfs_bytes"]
    assert rows[-1]["with_peers"]["pfs_bytes"] == rows[-1]["without_peers"]["pfs_bytes"] == [sizes.sum(), 0, 0]


def test_node_specs():
    assert sim.parse_nodes("1-1024") == [1 << k for k in range(11)]
    assert sim.parse_nodes("4-16") == [4, 8, 16]
    assert sim.parse_nodes("8,1,3") == [1, 3, 8]
    assert sim.parse_caches("25,100%,50") == [0.25, 0.5, 1.0]
    for bad in ("0", "1-1000", "3-8", "16-4", "a,b", ""):
        with pytest.raises(ValueError):
            sim.parse_nodes(bad)
    for bad in ("0", "-5,25", "x", ""):
        with pytest.raises(ValueError):
            sim.parse_caches(bad)


@pytest.mark.parametrize("argv,words", [
    (["--nodes", "0"], "at least 1"),
    (["--nodes", "1-1000"], "powers of two"),
    (["--cache", "0"], "above 0"),
    (["--epochs", "1"], "at least 2"),
    (["--samples", "100", "--nodes", "64"], "at least 256 samples"),
    (["--link-gbs", "0"], "bandwidths"),
    (["--size-sigma", "-1"], "sigma"),
])
def test_bad_arguments_say_what_is_wrong(argv, words, capsys):
    assert main(["simulate", "--samples", "1000", "--nodes", "1,2", "--quiet", *argv]) == 2
    assert words in capsys.readouterr().err


def test_cli_writes_table_json_and_plot(tmp_path, capsys):
    assert main(["simulate", "--nodes", "1-4", "--samples", "400", "--cache", "50,100", "--epochs", "2",
                 "--out", str(tmp_path), "--quiet"]) == 0
    table = capsys.readouterr().out
    assert table.count("\n| ") == 6  # two cache sizes x three node counts, after the header
    assert (tmp_path / "simulate.png").stat().st_size > 0
    assert (tmp_path / "simulate.md").read_text().strip() == table.strip()
    import json
    study = json.loads((tmp_path / "simulate.json").read_text())
    assert [(r["cache"], r["nodes"]) for r in study["rows"]] == [(c, k) for k in (1, 2, 4) for c in (0.5, 1.0)]


def greedy_seconds(pfs_bytes: float, per_node: List[float], read: float, pfs_bps: float, link_bps: float) -> float:
    """The per-read rule walked read by read: node n's peer bytes in reads of `read` bytes, taken in turn
    over the nodes, each to its node's link or to the PFS, whichever would finish it first with the
    bytes queued there (the PFS starts with its own reads queued); the epoch ends when both are done."""
    links = [0.0] * len(per_node)
    left = list(per_node)
    pfs = pfs_bytes
    while any(b > 0 for b in left):
        for n, b in enumerate(left):
            if b <= 0:
                continue
            size = min(read, b)
            left[n] -= size
            if (links[n] + size) / link_bps <= (pfs + size) / pfs_bps:
                links[n] += size
            else:
                pfs += size
    return max(max(links) / link_bps, pfs / pfs_bps)


@pytest.mark.parametrize("pfs_bytes,per_node,pfs_bps,link_bps", [
    (0.0, [8e6, 8e6], 100e6, 12.5e6),       # link slow: most reads move to the PFS
    (1e6, [6e6, 6e6, 6e6], 30e6, 10e6),     # even links, some moved
    (5e6, [1e6, 9e6, 3e6], 50e6, 20e6),     # one busy link
    (2e6, [4e6, 4e6, 4e6, 4e6], 10e6, 1e9),  # link fast: nothing moves
    (50e6, [1e6, 2e6], 10e6, 5e6),          # the PFS already the bottleneck
])
def test_chosen_seconds_is_the_per_read_rule_over_many_reads(pfs_bytes, per_node, pfs_bps, link_bps):
    a = np.asarray(per_node)
    fluid, moved = sim.chosen_seconds(pfs_bytes, a, a, pfs_bps, link_bps)
    read = 1e3
    greedy = greedy_seconds(pfs_bytes, per_node, read, pfs_bps, link_bps)
    slack = 2 * read / min(pfs_bps, link_bps)
    if len(set(per_node)) == 1:  # even links: the rule's reads level the queues exactly
        assert fluid == pytest.approx(greedy, abs=slack)
    else:  # all queued at once, a link that is not the busiest moves reads early: a little later
        assert fluid - slack <= greedy <= fluid * 1.05 + slack
    # Never slower than every read on its link, or every read on the PFS.
    assert fluid <= max(a.max() / link_bps, pfs_bytes / pfs_bps) * (1 + 1e-9)
    assert fluid <= (pfs_bytes + a.sum()) / pfs_bps * (1 + 1e-9)
    assert 0 <= moved <= a.sum()


def test_the_tier_on_is_never_slower_than_its_two_extremes():
    sizes = sim.sample_sizes(512, 1000, 0.5, seed=3)
    config = sim.Config(num_samples=512, ranks_per_node=2, batch_size=4, epochs=3, seed=1, pfs_gbs=1.0,
                        link_gbs=0.05)
    for row in sim.simulate(config, [1, 2, 4, 8], [0.25, 1.0], sizes)["rows"]:
        later = row["later"]
        assert later["seconds_chosen"] <= max(later["seconds_pfs"], later["seconds_link"]) * (1 + 1e-9)
        peer_pfs = later["pfs_fraction_with"] * row["set_bytes"]
        all_to_pfs = (peer_pfs + later["peer_bytes_per_node"] * row["nodes"]) / (config.pfs_gbs * 1e9)
        assert later["seconds_chosen"] <= all_to_pfs * (1 + 1e-9)


@pytest.mark.parametrize("link_gbs", [0.05, 12.5])  # a link far slower than the PFS, and faster
def test_own_first_is_never_slower_than_the_tier_off(link_gbs):
    # Own first, each node's directory is run as without the tier, and each peer read goes where it is
    # expected to finish first: the time per epoch with the tier on is at most the tier off's, at every
    # node count and cache size, and below it where peers hold what the shuffle sends a node.
    sizes = sim.sample_sizes(512, 1000, 0.5, seed=3)
    config = sim.Config(num_samples=512, ranks_per_node=2, batch_size=4, epochs=3, seed=1, pfs_gbs=1.0,
                        link_gbs=link_gbs, layout="own first")
    rows = sim.simulate(config, [1, 2, 4, 8, 16], [0.25, 0.5, 1.0], sizes)["rows"]
    for row in rows:
        assert row["layout"] == "own first"
        ratio = row["later"]["ratio_chosen"]
        assert ratio is not None and ratio <= 1 + 1e-9, (row["nodes"], row["cache"], ratio)
    if link_gbs > config.pfs_gbs:
        assert min(r["later"]["ratio_chosen"] for r in rows if r["nodes"] >= 8) < 0.8


def test_the_layout_follows_the_bandwidth_rule():
    config = sim.Config(num_samples=400, ranks_per_node=2, batch_size=4, epochs=3, seed=2)  # 100 and 12.5 GB/s
    assert [sim.layout_for(n, config) for n in (1, 2, 4, 8, 16, 1024)] == ["own first"] * 4 + ["home first"] * 2
    faster = dataclasses.replace(config, link_gbs=25.0)  # 4 nodes: a tie, own first
    assert [sim.layout_for(n, faster) for n in (2, 4, 8)] == ["own first", "own first", "home first"]
    assert sim.layout_for(1024, dataclasses.replace(config, layout="own first")) == "own first"
    assert sim.layout_for(1, dataclasses.replace(config, layout="home first")) == "home first"
    # Each row is run in its layout: the same as that layout forced, and the two layouts differ there.
    sizes = sim.sample_sizes(400, 1000, 0.5, seed=2)
    rows = sim.simulate(faster, [4, 8], [0.5], sizes)["rows"]
    assert [r["layout"] for r in rows] == ["own first", "home first"]
    for row in rows:
        forced = {layout: sim.simulate(dataclasses.replace(faster, layout=layout), [row["nodes"]], [0.5],
                                       sizes)["rows"][0]["with_peers"] for layout in sim.LAYOUTS}
        assert row["with_peers"] == forced[row["layout"]]
        assert forced["own first"] != forced["home first"]
    with pytest.raises(ValueError):
        sim.simulate(dataclasses.replace(config, layout="owner first"), [2], [0.5], sizes)


@pytest.mark.parametrize("nodes,cache,sigma", [(4, 0.5, 0.5), (5, 0.25, 0.0), (3, 1.0, 0.7), (6, 0.5, 0.0)])
def test_home_first_keeps_every_home_copy(nodes, cache, sigma):
    n, per_node = 600, 2
    config = sim.Config(num_samples=n, ranks_per_node=per_node, batch_size=4, epochs=3, seed=3)
    sizes = sim.sample_sizes(n, 1000, sigma, seed=3)
    orders = [np.asarray(epoch_order(n, 3, e)) for e in range(3)]
    st = sim._Streams(orders, nodes, config)
    budget = int(cache * sizes.sum() / nodes)
    owner = st.owner_rank // per_node
    home = sim._home(st, sizes, budget, config)
    assert 0 < home.sum() < n or cache == 1.0

    def lost(home_node):
        """The home copies that leave their owner node's directory, or that it never holds."""
        _, holders = sim._walk(st, sizes, budget, home_node=home_node)
        return [s for s in np.flatnonzero(home).tolist()
                if [e for k, _, e in holders.get(s, []) if k == owner[s]] != [sim._NEVER]]

    assert lost(None)  # own first (the tier off's layout) gives home copies up
    assert lost(np.where(home, owner, -1)) == []
    # Seen from outside: n divides among the ranks (no padding), so each sample is used once an epoch;
    # from the second epoch on, every use of a home copy is a hit or its owner's, and the PFS reads at
    # most the samples beyond the budgets, where own first reads more.
    home_first = dataclasses.replace(config, layout="home first")
    row = sim.simulate(home_first, [nodes], [cache], sizes)["rows"][0]
    own = sim.simulate(dataclasses.replace(config, layout="own first"), [nodes], [cache], sizes)["rows"][0]
    beyond = row["with_peers"]["beyond_budget_bytes"]
    assert beyond == int(sizes[~home].sum())
    assert all(b <= beyond for b in row["with_peers"]["pfs_bytes"][1:])
    assert any(b > beyond for b in own["with_peers"]["pfs_bytes"][1:])


def test_home_first_at_full_cache_reads_only_the_first_epoch_from_the_pfs_and_beats_own_first():
    # Equal sizes, no padding, the whole set in the nodes' budgets: home first holds every sample on its
    # owner node from its first use, so epochs 2 on read nothing from the PFS and the time per epoch is
    # the busiest link's, negligible at this link; own first's is at least its PFS reads'.
    n, nodes, per_node = 256, 8, 2
    sizes = sim.sample_sizes(n, 500, 0.0, seed=0)
    config = sim.Config(num_samples=n, ranks_per_node=per_node, batch_size=4, epochs=4, seed=1, pfs_gbs=1.0,
                        link_gbs=1e6)
    hybrid = sim.simulate(config, [nodes], [1.0], sizes)["rows"][0]
    own = sim.simulate(dataclasses.replace(config, layout="own first"), [nodes], [1.0], sizes)["rows"][0]
    assert hybrid["layout"] == "home first" and hybrid["with_peers"]["beyond_budget_samples"] == 0
    assert hybrid["with_peers"]["pfs_bytes"] == [int(sizes.sum()), 0, 0, 0]
    assert sum(own["with_peers"]["pfs_bytes"][1:]) > 0
    assert hybrid["later"]["ratio_chosen"] < own["later"]["ratio_chosen"] <= 1


def test_a_long_walk_reports_progress_within_it_and_the_cli_says_how_long_first(capsys):
    """One node's stream of 40,000 uses (2 epochs of 20,000): its progress comes in steps of at most _REPORT_EVERY uses, not
    one step at its end, and adds up to total_uses; the CLI prints the uses and an estimate first."""
    config = sim.Config(num_samples=20_000, ranks_per_node=4, batch_size=32, epochs=2, seed=0,
                        pfs_gbs=100.0, link_gbs=12.5)
    steps: List[int] = []
    sim.simulate(config, [1], [0.5], sim.sample_sizes(20_000, 110e3, 0.5, 0), on_uses=steps.append)
    assert sum(steps) == sim.total_uses(config, [1], [0.5])
    assert len(steps) >= 2 and max(steps) <= sim._REPORT_EVERY
    assert main(["simulate", "--nodes", "1,2", "--samples", "400", "--cache", "50", "--epochs", "2"]) == 0
    err = capsys.readouterr().err
    assert "sample uses to walk" in err and "about 1 s at" in err and "--samples 20000" in err
