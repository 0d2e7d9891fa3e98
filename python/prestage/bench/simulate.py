"""The peer tier at scale, simulated: ``prestage simulate``.

For W = nodes x ranks-per-node ranks, it lays out each epoch exactly as the plan does (the real
``prestage.plan.epoch_order``, padded and sliced into global batches as ``EpochPlan`` does; a test checks
the layout against ``prestage.plan.epoch_batches``) and follows every use of every sample through two
policies, each node holding B = cache fraction x set bytes / nodes:

without peers (prestage without the tier)
    Each node's stage directory is bounded to B and managed by Belady's rule with bypass over the node's
    own stream (as the clairvoyant eviction does, seeing every simulated epoch): on a miss that does not
    fit, the samples used farthest in the future are evicted if they are used later than the incoming
    one, else the incoming one is read without being kept; a sample the node does not use again is kept
    only in room that is free, the first to go. Every miss is a read of the PFS.
with peers (the library's rule: tiers/peers.hpp, staging/stage_cache.hpp)
    The owner of a sample is the rank that first uses it in the start epoch e0 (lowest batch, then
    lowest rank, then position in the batch: padding duplicates keep the first); its node is the owner
    node, and the sample is within its home budget while the node's owned samples, in order of first
    use, fit B (the first that does not and every later one are "beyond budget"); the samples within
    a node's budget are its home copies. Each node's stage directory is run in one of two layouts
    (``layout_for``, the ``layout`` of each row):

    own first, while the node's link is the slower source (``link_gbs <= pfs_gbs / nodes``)
        Exactly as without peers, so its hits are the same.
    home first, while the link is the faster source (``link_gbs > pfs_gbs / nodes``)
        Belady's rule with bypass over the node's own stream in two tiers: its home copies (tier 0)
        rank ahead of every other sample (tier 1); within a tier, samples are keyed by their next use
        by this node (none: last in the tier). An incoming sample evicts only samples of a higher tier
        or of its own tier used later than it (farthest first, the higher tier first), and is
        bypassed otherwise. Home copies fit B, so none is ever evicted: a sample that is not a home
        copy enters only free room or the room of such samples used later.

    No latencies are simulated: the link is the faster source when a node's link bandwidth exceeds
    its share of the PFS's aggregate bandwidth (a tie is own first). The library decides the same at
    run time from its measured estimates, for the mean sample (``SourceModel::links_against_pfs``),
    so a job can change layout as it learns; the simulation holds one layout per row.

    A miss of a sample within budget is served by the owner node over the interconnect (peer bytes:
    sent by the owner node, received by the user's) if the owner node's directory held it from an
    earlier global batch until after this one (its copy, not yet evicted), else by the PFS; the copy
    fetched stays on the user's node as its own layout says.

A node's stream is its ranks' uses in plan order: global batch, then rank, then position in the batch
(ranks run concurrently, so within a global batch the real order is interleaved; the simulation
serialises it). Bytes only: no time is simulated, but from a PFS aggregate bandwidth and a per-node link
bandwidth it gives the time an epoch's I/O needs at least, bound by each, and which one binds.

with peers, each read to the faster source (the tier's rule, tiers/source_model.hpp)
    A use served by another node's home copy goes there or to the PFS, whichever is expected to
    finish it first, the reads queued at each counted: over an epoch that levels the busiest link's
    time and the PFS's (``chosen_seconds``). The time per epoch with the tier on is that level. Own
    first, it is never more than the tier off's, whose PFS reads are those of the tier on plus its
    peer reads. Home first, a node keeps fewer of its own next uses than the tier off in exchange for
    home copies the other nodes read, so the ratio is what the row measures, not bound by 1.
"""

from __future__ import annotations

import dataclasses
import heapq
import re
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

__all__ = ["Config", "LAYOUTS", "layout_for", "parse_nodes", "parse_caches", "sample_sizes", "epoch_layout",
           "simulate_one", "simulate", "format_table", "plot_study"]


LAYOUTS = ("own first", "home first")


@dataclasses.dataclass(frozen=True)
class Config:
    """What the study is about (every field is checked by ``check()``)."""

    num_samples: int
    ranks_per_node: int = 4
    batch_size: int = 32  # per rank
    epochs: int = 3
    seed: int = 0
    pfs_gbs: float = 100.0  # PFS aggregate bandwidth, GB/s
    link_gbs: float = 12.5  # per-node interconnect link, GB/s (each direction)
    layout: Optional[str] = None  # with the tier on: one of LAYOUTS for every row; None: layout_for's rule

    def check(self, nodes: Sequence[int], caches: Sequence[float], sizes: np.ndarray) -> None:
        for name in ("num_samples", "ranks_per_node", "batch_size", "epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.epochs < 2:
            raise ValueError(f"epochs must be at least 2 (the peer tier serves the epochs after the first), "
                             f"got {self.epochs}")
        if not (self.pfs_gbs > 0 and self.link_gbs > 0):
            raise ValueError(f"bandwidths must be > 0 GB/s, got PFS {self.pfs_gbs} and link {self.link_gbs}")
        if self.layout is not None and self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)} or None, got {self.layout!r}")
        if not nodes or min(nodes) < 1:
            raise ValueError(f"node counts must be at least 1, got {list(nodes)}")
        if max(nodes) * self.ranks_per_node > self.num_samples:
            raise ValueError(f"{max(nodes)} nodes x {self.ranks_per_node} ranks need at least one sample each: "
                             f"give at least {max(nodes) * self.ranks_per_node} samples, not {self.num_samples}")
        if not caches or not all(c > 0 for c in caches):
            raise ValueError(f"cache fractions must be > 0, got {list(caches)}")
        if sizes.shape != (self.num_samples,) or (sizes.size and sizes.min() < 1):
            raise ValueError(f"sizes must be {self.num_samples} positive byte counts")


def layout_for(nodes: int, config: Config) -> str:
    """How each node's stage directory is run with the tier on, at ``nodes`` nodes: "home first" where a
    node's link is faster than its share of the PFS (``link_gbs > pfs_gbs / nodes``; no latencies are
    simulated), else "own first" (ties too); ``config.layout`` overrides it. The library decides the
    same at run time from its measured estimates, for the mean sample
    (``SourceModel::links_against_pfs``)."""
    if config.layout is not None:
        return config.layout
    return "home first" if config.link_gbs > config.pfs_gbs / nodes else "own first"


def parse_nodes(text: str) -> List[int]:
    """``"1-1024"`` (the powers of two from 1 to 1024) or ``"1,3,8"``: node counts, sorted, no repeats."""
    t = text.strip()
    m = re.fullmatch(r"(\d+)\s*-\s*(\d+)", t)
    if m:
        lo, hi = int(m.group(1)), int(m.group(2))
        if lo < 1 or hi < lo or lo & (lo - 1) or hi & (hi - 1):
            raise ValueError(f"a node range is two powers of two, low to high, e.g. 1-1024; got {text!r}")
        return [1 << k for k in range(lo.bit_length() - 1, hi.bit_length())]
    try:
        values = sorted({int(p) for p in t.split(",") if p.strip()})
    except ValueError:
        raise ValueError(f"node counts are a range like 1-1024 or integers like 1,2,8; got {text!r}") from None
    if not values or values[0] < 1:
        raise ValueError(f"node counts must be at least 1; got {text!r}")
    return values


def parse_caches(text: str) -> List[float]:
    """``"25,50,100"``: aggregate cache sizes in percent of the set, as fractions."""
    try:
        values = sorted({float(p.strip().removesuffix("%")) for p in text.split(",") if p.strip()})
    except ValueError:
        raise ValueError(f"cache sizes are percentages of the set like 25,50,100; got {text!r}") from None
    if not values or values[0] <= 0:
        raise ValueError(f"cache sizes must be percentages above 0; got {text!r}")
    return [v / 100 for v in values]


def sample_sizes(num_samples: int, mean_bytes: float, sigma: float, seed: int) -> np.ndarray:
    """Per sample, its bytes: lognormal with the given mean and shape ``sigma`` (seeded), or all
    ``mean_bytes`` when ``sigma`` is 0."""
    if num_samples < 1 or not mean_bytes >= 1 or not sigma >= 0:
        raise ValueError(f"sizes need samples >= 1, a mean >= 1 byte and sigma >= 0; got {num_samples}, "
                         f"{mean_bytes}, {sigma}")
    if sigma == 0:
        return np.full(num_samples, int(mean_bytes), dtype=np.int64)
    rng = np.random.default_rng(seed)
    # The lognormal's mean is exp(mu + sigma^2 / 2).
    drawn = rng.lognormal(np.log(mean_bytes) - sigma * sigma / 2, sigma, num_samples)
    return np.maximum(1, np.rint(drawn)).astype(np.int64)


def epoch_layout(order: np.ndarray, world_size: int, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """One epoch as the plan lays it out (drop_last=False): the padded order (its first samples repeated
    up to a multiple of ``world_size``) and, per position, the rank that uses it. Global batch g holds
    positions [g * B * W, ...); rank r takes the r-th contiguous slice, of the batch's size per rank."""
    n = order.size
    per_rank = -(-n // world_size)
    positions = np.arange(per_rank * world_size, dtype=np.int64)
    samples = order[positions % n].astype(np.int64)
    g = positions // (batch_size * world_size)
    within = positions - g * batch_size * world_size
    size_of_batch = np.minimum(batch_size, per_rank - g * batch_size)
    return samples, within // size_of_batch


#: Uses a walk takes between two calls of its ``on_uses``: a node's stream can be millions of uses
#: long (ImageNet on one node: 3.8 million over 3 epochs), and a progress bar must move within it.
_REPORT_EVERY = 1 << 15


def _belady_hits(samples: List[int], next_use: List[int], sizes: List[int], capacity: int,
                 stays: Optional[List[tuple[int, int, int]]] = None,
                 admit: Optional[List[bool]] = None, tier: Optional[List[int]] = None,
                 on_uses: Optional[Callable[[int], None]] = None) -> bytearray:
    """Per use, 1 if Belady's rule with bypass (byte capacity) finds the sample kept. ``next_use[i]``: the
    index of the sample's next use, or ``len(samples)`` (or more) if none (kept only in room that is
    free: the first to go). ``admit[i]`` False: a miss at use i is not admitted (bypassed). With
    ``stays``, every stay of a sample in the directory is appended to it as (sample, index of the use
    that admitted it, index of the use that evicted it or ``len(samples)``).

    ``tier[i]`` (0 or more; none: all 0) ranks samples ahead of next uses: a sample is keyed by (its
    tier, its next use), an incoming sample evicts only samples keyed after it (farthest first, the
    higher tier first) and is bypassed otherwise. So a sample is never evicted for one of a higher tier,
    and one not used again is the first to go within its tier. Home first (``_walk``) is tier 0 for the
    node's home copies, 1 for the rest. ``on_uses(k)``: called as the walk takes k more uses."""
    hits = bytearray(len(samples))
    admitted: Dict[int, int] = {}
    kept: Dict[int, int] = {}  # sample -> its key: tier * (len(samples) + 1) + next use
    heap: List[tuple[int, int]] = []  # (-key, sample); stale entries are skipped when met
    used = 0
    end = len(samples)
    for i, s in enumerate(samples):
        if on_uses is not None and i % _REPORT_EVERY == 0 and i:
            on_uses(_REPORT_EVERY)
        nxt = next_use[i] if tier is None else tier[i] * (end + 1) + min(next_use[i], end)
        if s in kept:
            hits[i] = 1
            kept[s] = nxt
            heapq.heappush(heap, (-nxt, s))
            continue
        if admit is not None and not admit[i]:
            continue
        size = sizes[s]
        if used + size > capacity:
            if size > capacity:
                continue
            victims = []
            freed = 0
            while heap and used - freed + size > capacity:
                key, v = heap[0]
                if kept.get(v) != -key:
                    heapq.heappop(heap)
                    continue
                if -key <= nxt:  # only a sample needed later than this one is worth giving up
                    break
                victims.append(heapq.heappop(heap))
                freed += sizes[v]
            if used - freed + size > capacity:
                for entry in victims:
                    heapq.heappush(heap, entry)
                continue
            for _, v in victims:
                del kept[v]
                if stays is not None:
                    stays.append((v, admitted.pop(v), i))
            used -= freed
        kept[s] = nxt
        used += size
        heapq.heappush(heap, (-nxt, s))
        if stays is not None:
            admitted[s] = i
    if stays is not None:
        stays.extend((s, at, end) for s, at in admitted.items())
    if on_uses is not None and end:
        on_uses(end - (end - 1) // _REPORT_EVERY * _REPORT_EVERY)  # the uses since the last call
    return hits


class _Streams:
    """The uses of every epoch for one node count, in node order then plan order: what both policies walk."""

    def __init__(self, orders: Sequence[np.ndarray], nodes: int, config: Config):
        world = nodes * config.ranks_per_node
        per_epoch = [epoch_layout(o, world, config.batch_size) for o in orders]
        self.nodes = nodes
        self.uses_per_epoch = per_epoch[0][0].size
        samples = np.concatenate([s for s, _ in per_epoch])
        ranks = np.concatenate([r for _, r in per_epoch])
        epoch = np.repeat(np.arange(len(orders)), self.uses_per_epoch)
        self.first_in_e0 = np.zeros(samples.size, dtype=bool)
        self.first_in_e0[:config.num_samples] = True  # e0's padded order starts with the permutation
        node = ranks // config.ranks_per_node
        # Owner: the rank of the sample's position in e0's permutation (its first use in plan order).
        self.owner_rank = np.empty(config.num_samples, dtype=np.int64)
        self.owner_rank[samples[:config.num_samples]] = ranks[:config.num_samples]
        by_node = np.argsort(node, kind="stable")  # plan order kept within each node
        self.samples, self.node, self.epoch = samples[by_node], node[by_node], epoch[by_node]
        # Per use, its global batch counted across epochs: when a node's copy is there for another.
        positions = np.tile(np.arange(self.uses_per_epoch), len(orders))
        batch = positions // (config.batch_size * world)
        self.time = (epoch * (int(batch.max()) + 1) + batch)[by_node]
        self.first = self.first_in_e0[by_node]
        self.bounds = np.searchsorted(self.node, np.arange(nodes + 1))
        key = self.node * config.num_samples + self.samples
        same = np.argsort(key, kind="stable")
        repeat = key[same[1:]] == key[same[:-1]]
        self.next_use = np.full(samples.size, samples.size, dtype=np.int64)
        self.next_use[same[:-1][repeat]] = same[1:][repeat]


def _home(st: _Streams, sizes: np.ndarray, budget: int, config: Config) -> np.ndarray:
    """Per sample: within its owner node's home budget (the node's owned samples in order of first use
    in e0, while they fit)."""
    n = st.nodes
    owner_node = st.owner_rank // config.ranks_per_node
    first_pos = np.empty(config.num_samples, dtype=np.int64)
    first_pos[st.samples[st.first]] = np.flatnonzero(st.first)  # node-sorted index keeps plan order
    by_owner = np.lexsort((first_pos, owner_node))
    cum = np.cumsum(sizes[by_owner])
    start = np.searchsorted(owner_node[by_owner], np.arange(n))
    before = np.concatenate(([0], cum))[start]
    home = np.empty(config.num_samples, dtype=bool)
    home[by_owner] = cum - np.repeat(before, np.diff(np.append(start, by_owner.size))) <= budget
    return home


def _walk(st: _Streams, sizes: np.ndarray, budget: int, on_uses: Optional[Callable[[int], None]] = None,
          home_node: Optional[np.ndarray] = None) -> tuple[np.ndarray, Dict[int, List[tuple[int, int, int]]]]:
    """Every node's stage directory under Belady's rule with bypass over its own stream: own first (the
    tier off, and the tier on while its link is the slower source) or, with ``home_node`` (per sample,
    the node that holds its home copy, -1 beyond every budget), home first: the node's home copies in
    tier 0, every other sample in tier 1 (``_belady_hits``). Per use, whether it is a hit; per sample,
    its stays on each node as (node, global batch admitted, global batch evicted or ``_NEVER``)."""
    size_list = sizes.tolist()
    hits = np.empty(st.samples.size, dtype=bool)
    holders: Dict[int, List[tuple[int, int, int]]] = {}
    for node in range(st.nodes):
        lo, hi = st.bounds[node], st.bounds[node + 1]
        samples = st.samples[lo:hi]
        tier = None if home_node is None else (home_node[samples] != node).astype(np.int64).tolist()
        stays: List[tuple[int, int, int]] = []
        hits[lo:hi] = np.frombuffer(_belady_hits(samples.tolist(), (st.next_use[lo:hi] - lo).tolist(),
                                                 size_list, budget, stays, tier=tier, on_uses=on_uses),
                                    dtype=np.uint8)
        times = st.time[lo:hi].tolist()
        end = hi - lo
        for s, admitted, evicted in stays:
            holders.setdefault(s, []).append((node, times[admitted], times[evicted] if evicted < end else _NEVER))
    return hits, holders


_NEVER = 1 << 62  # a stay that lasts past the last use


def _with_peers(st: _Streams, sizes: np.ndarray, budget: int, config: Config,
                walk: tuple[np.ndarray, Dict[int, List[tuple[int, int, int]]]]) -> Dict[str, Any]:
    epochs, n = config.epochs, st.nodes
    owner_node = st.owner_rank // config.ranks_per_node
    home = _home(st, sizes, budget, config)
    hits, holders = walk
    pfs = np.zeros(epochs)
    local = np.zeros(epochs)
    sent = np.zeros((epochs, n))
    received = np.zeros((epochs, n))
    np.add.at(local, st.epoch[hits], sizes[st.samples[hits]])
    for m in np.flatnonzero(~hits).tolist():
        s, user, e, now = int(st.samples[m]), int(st.node[m]), int(st.epoch[m]), int(st.time[m])
        owner = int(owner_node[s])
        served = home[s] and owner != user and any(
            node == owner and admitted < now < evicted for node, admitted, evicted in holders.get(s, ()))
        if served:
            sent[e, owner] += sizes[s]
            received[e, user] += sizes[s]
        else:
            pfs[e] += sizes[s]
    return {"pfs_bytes": pfs.tolist(), "local_bytes": local.tolist(),
            "peer_sent": sent.tolist(), "peer_received": received.tolist(),
            "beyond_budget_samples": int((~home).sum()),
            "beyond_budget_bytes": int(sizes[~home].sum())}


def _without_peers(st: _Streams, sizes: np.ndarray, config: Config, hits: np.ndarray) -> Dict[str, Any]:
    miss = ~hits
    return {"pfs_bytes": np.bincount(st.epoch[miss], sizes[st.samples[miss]], config.epochs).tolist()}


def chosen_seconds(pfs_bytes: float, sent: np.ndarray, received: np.ndarray, pfs_bps: float,
                   link_bps: float) -> tuple[float, float]:
    """An epoch's I/O time when each peer read goes where it is expected to finish first (the tier's
    per-read rule, tiers/source_model.hpp), and the bytes it moves from peer links to the PFS.

    The rule sends a read to the PFS once the queue on its peer link would finish later than the PFS's;
    over an epoch's many reads that levels the finish times (its fluid limit; with every read queued
    at once, the rule moves some reads off links that are not the busiest early, and ends a few
    percent later where the links are uneven): the least T such that
    the reads left on each link fit it in T (``sent[n]``, ``received[n]``: node n's bytes each way) and
    the PFS's own reads (``pfs_bytes``) plus the moved ones fit the PFS in T. A read moved off a link
    relieves its sender and its receiver, so the bytes moved are the larger of the two sides' excesses.
    Never more than the time with every peer read on its link (moved 0) or on the PFS (all moved)."""
    def moved(t: float) -> float:
        cap = link_bps * t
        return float(max(np.maximum(sent - cap, 0).sum(), np.maximum(received - cap, 0).sum()))

    lo, hi = 0.0, max(float(max(sent.max(initial=0), received.max(initial=0))) / link_bps,
                      (pfs_bytes + float(received.sum())) / pfs_bps)
    if hi == 0:
        return 0.0, 0.0
    for _ in range(100):  # bisection: moved(t) falls and the PFS's capacity rises with t
        mid = (lo + hi) / 2
        if pfs_bytes + moved(mid) <= pfs_bps * mid:
            hi = mid
        else:
            lo = mid
    return hi, moved(hi)


def _summary(nodes: int, cache: float, budget: int, set_bytes: int, peers: Dict[str, Any],
             baseline: Dict[str, Any], config: Config, layout: Optional[str] = None) -> Dict[str, Any]:
    later = slice(1, config.epochs)
    sent = np.asarray(peers["peer_sent"])[later]
    received = np.asarray(peers["peer_received"])[later]
    link = np.maximum(sent, received)  # each direction of a link carries its own bytes
    mean_link = float(np.mean(link.max(axis=1)))
    base_pfs = float(np.mean(baseline["pfs_bytes"][later]))
    peer_pfs = float(np.mean(peers["pfs_bytes"][later]))
    t_base = base_pfs / (config.pfs_gbs * 1e9)
    t_pfs = peer_pfs / (config.pfs_gbs * 1e9)
    t_link = mean_link / (config.link_gbs * 1e9)
    per_node = sent.sum(axis=1) / nodes  # mean over nodes, per epoch
    pfs_later = np.asarray(peers["pfs_bytes"][later], dtype=float)
    chosen = [chosen_seconds(pfs_later[e], sent[e], received[e], config.pfs_gbs * 1e9, config.link_gbs * 1e9)
              for e in range(sent.shape[0])]
    t_chosen = float(np.mean([c[0] for c in chosen]))
    moved = float(np.mean([c[1] for c in chosen]))

    def imbalance(a: np.ndarray) -> Optional[float]:
        means = a.mean(axis=1)
        return float(np.max(a.max(axis=1) / means)) if np.all(means > 0) else None

    return {
        "nodes": nodes, "ranks": nodes * config.ranks_per_node, "cache": cache, "node_budget_bytes": budget,
        "set_bytes": set_bytes, "layout": layout,
        "with_peers": peers, "without_peers": baseline,
        # Epochs 2 on (means over them): what the tier is for.
        "later": {
            "pfs_fraction_without": base_pfs / set_bytes, "pfs_fraction_with": peer_pfs / set_bytes,
            "peer_bytes_per_node": float(per_node.mean()),
            "peer_bytes_max_node": mean_link,
            "imbalance_sent": imbalance(sent), "imbalance_received": imbalance(received),
            "seconds_without": t_base, "seconds_pfs": t_pfs, "seconds_link": t_link,
            "binds": "link" if t_link > t_pfs else "PFS",
            "speedup": t_base / max(t_pfs, t_link) if max(t_pfs, t_link) > 0 else None,
            # Each read to the source expected to finish first (chosen_seconds).
            "seconds_chosen": t_chosen, "moved_to_pfs_fraction": moved / set_bytes,
            "ratio_chosen": t_chosen / t_base if t_base > 0 else (1.0 if t_chosen == 0 else None),
        },
    }


def simulate_one(orders: Sequence[np.ndarray], sizes: np.ndarray, nodes: int, caches: Sequence[float],
                 config: Config, on_uses: Optional[Callable[[int], None]] = None,
                 streams: Optional[_Streams] = None) -> List[Dict[str, Any]]:
    """Both policies for one node count and each aggregate cache fraction; ``orders[e]`` is
    ``epoch_order(num_samples, seed, e)``. ``on_uses(k)`` is called as a walk takes k more uses."""
    st = streams if streams is not None else _Streams(orders, nodes, config)
    set_bytes = int(sizes.sum())
    layout = layout_for(nodes, config)
    out = []
    for cache in caches:
        budget = int(cache * set_bytes / nodes)
        own = _walk(st, sizes, budget, on_uses)
        walk = own
        if layout == "home first":
            home_node = np.where(_home(st, sizes, budget, config), st.owner_rank // config.ranks_per_node, -1)
            walk = _walk(st, sizes, budget, on_uses, home_node)
        out.append(_summary(nodes, cache, budget, set_bytes, _with_peers(st, sizes, budget, config, walk),
                            _without_peers(st, sizes, config, own[0]), config, layout))
    return out


def simulate(config: Config, nodes: Sequence[int], caches: Sequence[float], sizes: np.ndarray,
             on_uses: Optional[Callable[[int], None]] = None) -> Dict[str, Any]:
    """The study: every node count x cache fraction. Raises ValueError for arguments out of range."""
    from prestage.plan import epoch_order

    config.check(nodes, caches, sizes)
    orders = [np.asarray(epoch_order(config.num_samples, config.seed, e)) for e in range(config.epochs)]
    rows: List[Dict[str, Any]] = []
    for n in nodes:
        rows.extend(simulate_one(orders, sizes, n, caches, config, on_uses))
    return {"config": dataclasses.asdict(config) | {"nodes": list(nodes), "caches": list(caches)},
            "set_bytes": int(sizes.sum()), "rows": rows}


def total_uses(config: Config, nodes: Sequence[int], caches: Sequence[float]) -> int:
    """Uses the walks take in the whole study (a progress bar's total): the tier off's, and home first's
    in its rows."""
    return sum(-(-config.num_samples // (n * config.ranks_per_node)) * n * config.ranks_per_node
               * (2 if layout_for(n, config) == "home first" else 1) for n in nodes) * config.epochs * len(caches)


def _bytes(v: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if v >= scale:
            return f"{v / scale:.1f} {unit}"
    return f"{v:.0f} B"


def format_table(study: Dict[str, Any]) -> str:
    """A markdown table: one row per cache fraction and node count, with the layout of the tier on."""
    set_bytes = study["set_bytes"]
    lines = ["| cache | nodes | layout, tier on | PFS per epoch, no peers (of the set) | PFS per epoch, peers "
             "| beyond budget | peer bytes per node per epoch (mean; max node) | imbalance sent / received (max/mean) "
             "| I/O s per epoch: no peers; peers PFS; peers link | binds | speedup, every read to its home copy "
             "| I/O s per epoch, each read to the faster source (moved to the PFS, of the set) "
             "| time per epoch, tier on / off |",
             "|---:|---:|---|---|---|---:|---|---|---|---|---:|---|---:|"]
    for r in sorted(study["rows"], key=lambda r: (r["cache"], r["nodes"])):
        later = r["later"]
        base = " / ".join(f"{b / set_bytes:.3f}" for b in r["without_peers"]["pfs_bytes"])
        peer = " / ".join(f"{b / set_bytes:.3f}" for b in r["with_peers"]["pfs_bytes"])
        imb = " / ".join("-" if v is None else f"{v:.2f}"
                         for v in (later["imbalance_sent"], later["imbalance_received"]))
        speed = "-" if later["speedup"] is None else f"{later['speedup']:.1f}x"
        ratio = "-" if later["ratio_chosen"] is None else f"{later['ratio_chosen']:.2f}x"
        lines.append(
            f"| {r['cache']:.0%} | {r['nodes']} | {r['layout']} | {base} | {peer} "
            f"| {r['with_peers']['beyond_budget_bytes'] / set_bytes:.1%} "
            f"| {_bytes(later['peer_bytes_per_node'])}; {_bytes(later['peer_bytes_max_node'])} | {imb} "
            f"| {later['seconds_without']:.3f}; {later['seconds_pfs']:.3f}; {later['seconds_link']:.3f} "
            f"| {later['binds']} | {speed} | {later['seconds_chosen']:.3f} ({later['moved_to_pfs_fraction']:.3f}) "
            f"| {ratio} |")
    return "\n".join(lines)


def plot_study(study: Dict[str, Any], path: Any) -> Any:
    """Per cache fraction, against nodes: PFS and peer bytes per epoch (top) and the I/O time each
    resource needs per epoch (bottom), epochs 2 on; the node counts run home first shaded. A PNG at
    ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    caches = study["config"]["caches"]
    fig, axes = plt.subplots(2, len(caches), figsize=(4.2 * len(caches), 7), dpi=90, squeeze=False,
                             sharex=True)
    for col, cache in enumerate(caches):
        rows = [r for r in study["rows"] if r["cache"] == cache]
        xs = [r["nodes"] for r in rows]
        top, bottom = axes[0][col], axes[1][col]
        top.plot(xs, [r["later"]["pfs_fraction_without"] for r in rows], "o-", color="#d62728",
                 label="PFS, no peers")
        top.plot(xs, [r["later"]["pfs_fraction_with"] for r in rows], "s-", color="#1f77b4",
                 label="PFS, peers")
        top.plot(xs, [r["later"]["peer_bytes_per_node"] * r["nodes"] / r["set_bytes"] for r in rows], "^--",
                 color="#2ca02c", label="peer bytes, all nodes")
        top.set_ylim(0, 1.05)
        top.set_title(f"aggregate cache {cache:.0%} of the set", fontsize=10)
        def seconds(key: str) -> List[float]:  # none (0 s) is left out of the log scale
            return [r["later"][key] or float("nan") for r in rows]

        bottom.plot(xs, seconds("seconds_without"), "o-", color="#d62728", label="no peers: PFS")
        bottom.plot(xs, seconds("seconds_pfs"), "s-", color="#1f77b4", label="peers: PFS")
        bottom.plot(xs, seconds("seconds_link"), "^--", color="#2ca02c", label="peers: busiest node's link")
        bottom.plot(xs, seconds("seconds_chosen"), "D-", color="#9467bd",
                    label="peers, each read to the faster source")
        home_first = [x for x, r in zip(xs, rows) if r.get("layout") == "home first"]
        if home_first:
            for ax in (top, bottom):
                ax.axvspan(min(home_first), max(home_first), color="#9467bd", alpha=0.08, lw=0,
                           label="home first (link faster than a node's PFS share)")
        bottom.set_yscale("log")
        bottom.set_xscale("log", base=2)
        bottom.set_xticks(xs)
        bottom.set_xticklabels([str(x) for x in xs], fontsize=7)
        bottom.set_xlabel("nodes")
        for ax in (top, bottom):
            ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("bytes per epoch from epoch 2 (of the set)")
    cfg = study["config"]
    axes[1][0].set_ylabel(f"I/O s per epoch (PFS {cfg['pfs_gbs']:g}, link {cfg['link_gbs']:g} GB/s)")
    axes[0][0].legend(fontsize=8)
    axes[1][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
