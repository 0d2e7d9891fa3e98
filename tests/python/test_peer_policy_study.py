"""The peer-layout design study (benchmarks/peer_policy_study.py): its *own first* policy keeps every
local hit of the tier off, reads no more from the PFS, and serves a miss only from a node holding the
sample at that moment (checked against a plain walk of the same stays)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from prestage.bench import simulate as sim
from prestage.plan import epoch_order

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "peer_policy_study.py"


@pytest.fixture(scope="module")
def study():
    spec = importlib.util.spec_from_file_location("peer_policy_study", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["peer_policy_study"] = module
    spec.loader.exec_module(module)
    return module


def streams(n: int, nodes: int, epochs: int, sigma: float):
    config = sim.Config(num_samples=n, ranks_per_node=2, batch_size=4, epochs=epochs, seed=3)
    sizes = sim.sample_sizes(n, 1000, sigma, 3)
    orders = [np.asarray(epoch_order(n, 3, e)) for e in range(epochs)]
    return config, sizes, orders, sim._Streams(orders, nodes, config)


@pytest.mark.parametrize("nodes, cache, sigma", [(2, 0.5, 0.0), (2, 1.0, 0.5), (4, 0.5, 0.5), (8, 0.25, 0.5),
                                                 (8, 1.0, 0.0)])
def test_own_first_keeps_the_tier_offs_hits_and_reads_no_more_from_the_pfs(study, nodes, cache, sigma):
    config, sizes, orders, st = streams(600, nodes, 3, sigma)
    budget = int(cache * sizes.sum() / nodes)
    times = study.global_batches(orders, nodes, config)
    own = study.own_first(st, times, sizes, budget, config, record=True)
    # Each peer read comes from another node that held the sample through that batch.
    for s, user, source, now in own["peer_reads"]:
        assert source != user
        assert any(node == source and a < now < e for node, a, e in own["stays"][s])
    off_hits = 0
    for node in range(nodes):
        lo, hi = st.bounds[node], st.bounds[node + 1]
        off_hits += sum(sim._belady_hits(st.samples[lo:hi].tolist(), (st.next_use[lo:hi] - lo).tolist(),
                                         sizes.tolist(), budget))
    assert own["local_hits"] == off_hits
    off = sim._without_peers(st, sizes, config, sim._walk(st, sizes, budget)[0])
    for e in range(config.epochs):
        assert own["pfs_bytes"][e] <= off["pfs_bytes"][e]
        # Every miss of the tier off is read once: from the PFS or from a peer.
        assert own["pfs_bytes"][e] + sum(own["peer_sent"][e]) == pytest.approx(off["pfs_bytes"][e])
        assert sum(own["peer_sent"][e]) == pytest.approx(sum(own["peer_received"][e]))
    if nodes > 1 and cache >= 0.5:
        assert sum(sum(row) for row in own["peer_sent"][1:]) > 0


def test_a_node_holds_a_sample_between_its_admission_and_its_eviction_within_the_bound(study):
    config, sizes, orders, st = streams(400, 4, 3, 0.5)
    budget = int(0.5 * sizes.sum() / 4)
    times = study.global_batches(orders, 4, config)
    owner_node = st.owner_rank // config.ranks_per_node
    lo, hi = st.bounds[1], st.bounds[2]
    samples = st.samples[lo:hi].tolist()
    hits, stays = study.own_first_residency(samples, (st.next_use[lo:hi] - lo).tolist(),
                                            times[lo:hi].tolist(), sizes.tolist(), budget, owner_node == 1)
    # The samples staying through a whole global batch fit the bound together; a hit is a sample
    # staying at its batch (admitted at or before it, evicted at or after it).
    for i, now in enumerate(times[lo:hi].tolist()):
        through = {s for s, a, e in stays if a < now < e}
        assert sum(int(sizes[s]) for s in through) <= budget
        if hits[i]:
            assert any(s == samples[i] and a <= now <= e for s, a, e in stays)
    # Home copies not used again by the node itself are kept where there is room.
    assert any(owner_node[s] == 1 and s not in samples[samples.index(s) + 1:] for s, _, _ in stays)


def test_the_cli_prints_a_table_and_writes_json_and_a_plot(study, tmp_path, capsys):
    out = tmp_path / "s.json"
    png = tmp_path / "s.png"
    assert study.main(["--samples", "400", "--nodes", "1,2,4", "--cache", "50,100", "--json", str(out),
                       "--plot", str(png)]) == 0
    table = capsys.readouterr().out
    assert table.count("\n") == 2 + 6
    import json

    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 6 and all(r["ratio_own_first"] is None or r["ratio_own_first"] <= 1.0 + 1e-9
                                  for r in rows)
    assert png.stat().st_size > 1000
    with pytest.raises(SystemExit):
        study.main(["--nodes", "0"])
