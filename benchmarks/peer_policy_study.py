"""A design study for the peer tier's layout: the node's own clairvoyant cache first, home copies in
the room it leaves, each miss served by any node that holds the sample then.

The tier as first built (``home_copies`` here): each node kept the samples it owns (first used by its
ranks in the start epoch) as home copies, never evicted, and admitted nothing else. At
2 nodes that layout reads more from the PFS than no tier at all (1.20x the time at 50% cache, 1.07x at
100%), because a node's bound is spent on copies for its peers instead of on its own next uses. This
study walks the same streams (the real plan's layout, ``prestage.bench.simulate``) through a third
policy, *own first* (which the library now follows while a node's link is slower than the PFS, but for
asking the owner only; ``prestage simulate`` models that, and home first where the link is faster):

- Each node's stage directory is managed exactly as without the tier: Belady's rule with bypass over
  the node's own uses. So a node's local hits are those of the tier off, at every node count.
- A sample the node owns (as above) that the node itself does not use again is still admitted, into
  room that is free: keyed past every own use, so it is the first to go when an own use needs room.
- A miss is served by another node that holds the sample at that moment (admitted in an earlier global
  batch, not evicted before this one), the owner first; else by the PFS. It is then kept or not by the
  user's own rule (fetched samples stay when Belady would keep them: issue item 3).
- Each peer read goes to its link or to the PFS, whichever is expected to finish it first
  (``chosen_seconds``, as for the tier as built).

Since the local hits equal the tier off's and a peer read is only taken where it finishes first, the
tier on can never be slower in this model. What the study measures is how much of the tier's gain at
scale that keeps. A node's holdings are a function of the plans, which every rank knows, so a rank can
predict which node holds a sample; in the real system a prediction can miss (a copy late or evicted
early), which costs an answer "absent" and a PFS read.

    python benchmarks/peer_policy_study.py --samples 200000 --nodes 1-1024 --epochs 3 --json study.json \\
        --plot study.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from prestage.bench import simulate as sim
from prestage.plan import epoch_order

_NEVER = 1 << 62  # the batch at which a sample still staying at the end is evicted


def own_first_residency(samples: List[int], next_use: List[int], times: List[int], sizes: List[int],
                        capacity: int, home: np.ndarray) -> Tuple[bytearray, List[Tuple[int, int, int]]]:
    """One node's stream under *own first*. ``next_use[i]``: index of the sample's next use in this
    stream, or ``len(samples)``; ``times[i]``: the use's global batch (across epochs); ``home[s]``:
    this node owns s. Returns, per use, 1 for a hit, and every stay of a sample in the directory as
    (sample, global batch admitted, global batch evicted or ``_NEVER``).

    Belady's rule over the node's own uses (``simulate._belady_hits``): a home copy the node does not
    use again is kept in free room only, first to go; any other sample not used again is bypassed."""
    end = len(samples)
    # Not used again (any next use at or past `end`): a home copy's key is `end` (free room only),
    # another sample's is past it (first to go, if a hit finds it kept) and it is not admitted.
    keys = [n if n < end else end if home[s] else end + 1 for s, n in zip(samples, next_use)]
    stays: List[Tuple[int, int, int]] = []
    hits = sim._belady_hits(samples, keys, sizes, capacity, stays, admit=[k <= end for k in keys])
    return hits, [(s, times[a], times[e] if e < end else _NEVER) for s, a, e in stays]


def home_copies(st: Any, sizes: np.ndarray, budget: int, config: sim.Config) -> Dict[str, Any]:
    """The tier's first layout (the library before stage 2's copies went through the peer tier): each
    node keeps the home copies of the samples it owns within its budget, never evicted, and admits
    nothing else; every other use is served by the owner node's home copy, else the PFS."""
    epochs, n = config.epochs, st.nodes
    owner = (st.owner_rank // config.ranks_per_node)[st.samples]
    home = sim._home(st, sizes, budget, config)[st.samples]
    s, user, ep = st.samples, st.node, st.epoch
    size = sizes[s]
    pfs = st.first | ~home
    peer = ~pfs & (owner != user)
    sent = np.zeros((epochs, n))
    received = np.zeros((epochs, n))
    np.add.at(sent, (ep[peer], owner[peer]), size[peer])
    np.add.at(received, (ep[peer], user[peer]), size[peer])
    return {"pfs_bytes": np.bincount(ep[pfs], size[pfs], epochs).tolist(),
            "peer_sent": sent.tolist(), "peer_received": received.tolist(),
            "beyond_budget_samples": 0, "beyond_budget_bytes": 0}


def global_batches(orders: Sequence[np.ndarray], nodes: int, config: sim.Config) -> np.ndarray:
    """Per use, in the node order of ``sim._Streams``: its global batch counted across epochs."""
    world = nodes * config.ranks_per_node
    layout = [sim.epoch_layout(o, world, config.batch_size) for o in orders]
    per_epoch = layout[0][0].size
    position = np.tile(np.arange(per_epoch), len(orders))
    epoch = np.repeat(np.arange(len(orders)), per_epoch)
    batch = position // (config.batch_size * world)
    batches_per_epoch = int(batch.max()) + 1
    node = np.concatenate([r for _, r in layout]) // config.ranks_per_node
    return (epoch * batches_per_epoch + batch)[np.argsort(node, kind="stable")]


def own_first(st: Any, times: np.ndarray, sizes: np.ndarray, budget: int, config: sim.Config,
              record: bool = False) -> Dict[str, Any]:
    """Bytes per epoch from the PFS, and sent and received per node over links, under *own first*;
    with ``record``, also every node's stays and every peer read as (sample, user, source, batch)."""
    epochs, nodes = config.epochs, st.nodes
    owner_node = st.owner_rank // config.ranks_per_node
    size_list = sizes.tolist()
    hits = np.empty(st.samples.size, dtype=bool)
    holders: Dict[int, List[Tuple[int, int, int]]] = {}
    peer_reads: List[Tuple[int, int, int, int]] = []
    for node in range(nodes):
        lo, hi = st.bounds[node], st.bounds[node + 1]
        h, stays = own_first_residency(st.samples[lo:hi].tolist(), (st.next_use[lo:hi] - lo).tolist(),
                                       times[lo:hi].tolist(), size_list, budget, owner_node == node)
        hits[lo:hi] = np.frombuffer(h, dtype=np.uint8).astype(bool)
        for s, admitted, evicted in stays:
            holders.setdefault(s, []).append((node, admitted, evicted))
    pfs = np.zeros(epochs)
    sent = np.zeros((epochs, nodes))
    received = np.zeros((epochs, nodes))
    for m in np.flatnonzero(~hits):
        s, now, user, e = int(st.samples[m]), int(times[m]), int(st.node[m]), int(st.epoch[m])
        source = -1
        for node, admitted, evicted in holders.get(s, ()):
            if node != user and admitted < now < evicted:
                source = node
                if node == owner_node[s]:
                    break
        if source < 0:
            pfs[e] += sizes[s]
        else:
            sent[e, source] += sizes[s]
            received[e, user] += sizes[s]
            if record:
                peer_reads.append((s, user, source, now))
    out = {"pfs_bytes": pfs.tolist(), "peer_sent": sent.tolist(), "peer_received": received.tolist(),
           "local_hits": int(hits.sum())}
    if record:
        out |= {"stays": holders, "peer_reads": peer_reads}
    return out


def study(config: sim.Config, nodes: Sequence[int], caches: Sequence[float], sizes: np.ndarray,
          progress: bool = True) -> List[Dict[str, Any]]:
    config.check(nodes, caches, sizes)
    orders = [np.asarray(epoch_order(config.num_samples, config.seed, e)) for e in range(config.epochs)]
    set_bytes = int(sizes.sum())
    pfs_bps, link_bps = config.pfs_gbs * 1e9, config.link_gbs * 1e9
    later = slice(1, config.epochs)
    rows = []
    for n in nodes:
        st = sim._Streams(orders, n, config)
        times = global_batches(orders, n, config)
        for cache in caches:
            budget = int(cache * set_bytes / n)
            off = sim._without_peers(st, sizes, config, sim._walk(st, sizes, budget)[0])
            built = sim._summary(n, cache, budget, set_bytes, home_copies(st, sizes, budget, config), off,
                                 config)["later"]
            own = own_first(st, times, sizes, budget, config)
            t_off = float(np.mean(off["pfs_bytes"][later])) / pfs_bps
            chosen = [sim.chosen_seconds(own["pfs_bytes"][e], np.asarray(own["peer_sent"][e]),
                                         np.asarray(own["peer_received"][e]), pfs_bps, link_bps)
                      for e in range(1, config.epochs)]
            t_own = float(np.mean([c[0] for c in chosen]))
            rows.append({
                "nodes": n, "cache": cache,
                "pfs_fraction_off": built["pfs_fraction_without"],
                "pfs_fraction_built": built["pfs_fraction_with"],
                "ratio_built": built["ratio_chosen"],
                "pfs_fraction_own_first": float(np.mean(own["pfs_bytes"][later])) / set_bytes,
                "peer_fraction_own_first": float(np.mean(np.sum(own["peer_sent"][later], axis=1))) / set_bytes,
                "ratio_own_first": t_own / t_off if t_off > 0 else (1.0 if t_own == 0 else None),
            })
            if progress:
                print(format_row(rows[-1]), file=sys.stderr, flush=True)
    return rows


def _ratio(v: Any) -> str:
    return "-" if v is None else f"{v:.2f}x"


def format_row(r: Dict[str, Any]) -> str:
    return (f"| {r['cache']:.0%} | {r['nodes']} | {r['pfs_fraction_off']:.3f} | {r['pfs_fraction_built']:.3f} "
            f"| {_ratio(r['ratio_built'])} | {r['pfs_fraction_own_first']:.3f} | {r['peer_fraction_own_first']:.3f} "
            f"| {_ratio(r['ratio_own_first'])} |")


def format_table(rows: List[Dict[str, Any]]) -> str:
    head = ("| cache | nodes | PFS per epoch, tier off | PFS, tier as built | time, as built / off "
            "| PFS, own first | peer bytes, own first | time, own first / off |\n"
            "|---:|---:|---:|---:|---:|---:|---:|---:|")
    return "\n".join([head] + [format_row(r) for r in sorted(rows, key=lambda r: (r["cache"], r["nodes"]))])


def plot(rows: List[Dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    caches = sorted({r["cache"] for r in rows})
    fig, axes = plt.subplots(1, len(caches), figsize=(4.2 * len(caches), 3.6), dpi=90, squeeze=False,
                             sharey=True)
    for ax, cache in zip(axes[0], caches):
        mine = sorted((r for r in rows if r["cache"] == cache), key=lambda r: r["nodes"])
        xs = [r["nodes"] for r in mine]
        for key, style, label in (("ratio_built", "s-", "home copies (as built)"),
                                  ("ratio_own_first", "D-", "own first")):
            ax.plot(xs, [r[key] if r[key] is not None else float("nan") for r in mine], style, label=label)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(xs)
        ax.set_xticklabels([str(x) for x in xs], fontsize=7)
        ax.set_xlabel("nodes")
        ax.set_title(f"aggregate cache {cache:.0%}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("I/O time per epoch, tier on / off")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=200_000)
    p.add_argument("--nodes", default="1-1024", help="as prestage simulate's --nodes")
    p.add_argument("--cache", default="25,50,100", help="percent of the set, as prestage simulate's")
    p.add_argument("--ranks-per-node", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--sample-bytes", type=float, default=110e3)
    p.add_argument("--size-sigma", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pfs-gbs", type=float, default=100.0)
    p.add_argument("--link-gbs", type=float, default=12.5)
    p.add_argument("--json", type=Path)
    p.add_argument("--plot", type=Path)
    args = p.parse_args(argv)
    try:
        nodes, caches = sim.parse_nodes(args.nodes), sim.parse_caches(args.cache)
        config = sim.Config(num_samples=args.samples, ranks_per_node=args.ranks_per_node,
                            batch_size=args.batch_size, epochs=args.epochs, seed=args.seed,
                            pfs_gbs=args.pfs_gbs, link_gbs=args.link_gbs)
        sizes = sim.sample_sizes(args.samples, args.sample_bytes, args.size_sigma, args.seed)
        rows = study(config, nodes, caches, sizes)
    except ValueError as e:
        p.error(str(e))
    print(format_table(rows))
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json), "plot": str(args.plot)},
                                         "rows": rows}, indent=1))
    if args.plot:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
