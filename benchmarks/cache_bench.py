"""Bytes read from the source per epoch with a stage directory smaller than the data set.

For each world size, each cache size (a fraction of the bytes one rank reads per epoch: the set
divided by the world size) and each policy (clairvoyant, LRU, no cache), one rank (rank 1 of several,
rank 0 alone) runs `epochs` epochs through a bounded stage directory, with the source behind the PFS
emulator when it can be mounted, and reports the bytes read from the source in epochs 2..E as a
fraction of the bytes the rank reads in them (the sizes of its samples): the loader's own per-epoch
count (sizes of the files it missed) and the bytes the emulator served (measured below the loader).
Beside them, simulations over the same rank's plan, seeing 100 epochs past the last one read:
Belady's rule (the offline optimum), Belady's rule never giving up a file of the batches in flight
(what the loader may do), and LRU.

    python benchmarks/cache_bench.py --images 5000 --epochs 5 --json out.json
    python benchmarks/cache_bench.py --world-size 1 3 8 --batch-size 4 --lookahead 2 --depth 2

Reproducible from the repository alone: the set is `prestage synth`'s (seed 0).
"""

from __future__ import annotations

import argparse
import heapq
import json
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import prestage
from prestage.bench import emulator
from prestage import synth


def simulate(plan_epochs, sizes, capacity, policy, epochs, window=0):
    """Bytes missed in each of the first `epochs` epochs by a cache of `capacity` bytes, Belady (with
    bypass: a file used later than every candidate victim is read and not kept) or LRU. `plan_epochs`:
    one rank's batches per epoch, past `epochs` too (Belady's look-ahead). `window` > 0: files of the
    current batch and the `window - 1` before it are never given up, as in the loader."""
    stream = []  # (epoch, batch number, file), in plan order
    seq = 0
    for e, batches in enumerate(plan_epochs):
        for batch in batches:
            seq += 1
            stream.extend((e, seq, f) for f in batch)
    never = len(stream)
    next_use = [never] * len(stream)
    later = {}
    for i in range(len(stream) - 1, -1, -1):
        f = stream[i][2]
        next_use[i] = later.get(f, never)
        later[f] = i

    # A heap of (priority, stamp, file): the largest key first for Belady (the larger file id among
    # equal keys, as the loader), the smallest for LRU. An entry whose stamp is not its file's latest
    # is stale (re-keyed or given up since) and skipped.
    belady = policy == "belady"
    cache, used, heap, last_seq, stamp = {}, 0, [], {}, 0

    def push(f, key):
        nonlocal stamp
        stamp += 1
        cache[f] = (key, stamp)
        heapq.heappush(heap, ((-key, -f) if belady else (key, f), stamp, f))

    missed = [0] * epochs
    for i, (e, seq, f) in enumerate(stream):
        if e >= epochs:
            break
        key = next_use[i] if belady else i
        last_seq[f] = seq
        if f in cache:
            push(f, key)
            continue
        missed[e] += sizes[f]
        if sizes[f] > capacity:
            continue
        victims, held, freed = [], [], 0
        while used - freed + sizes[f] > capacity and heap:
            entry = heapq.heappop(heap)
            _, entry_stamp, g = entry
            if cache.get(g, (None, None))[1] != entry_stamp:
                continue
            held.append(entry)
            if window and last_seq[g] + window > seq:
                continue  # in flight
            if belady and cache[g][0] <= key:
                break
            victims.append(g)
            freed += sizes[g]
        if used - freed + sizes[f] > capacity:
            victims = []  # not enough room: nothing is given up, the file is read and not kept
        for g in victims:
            used -= sizes[g]
            del cache[g]
        for entry in held:
            if entry[2] in cache:
                heapq.heappush(heap, entry)
        if used + sizes[f] <= capacity:
            push(f, key)
            used += sizes[f]
    return missed


def run(catalog, stage_root, cache_bytes, policy, epochs, pfs, rank, world_size, batch_size,
        lookahead, depth):
    stage = Path(tempfile.mkdtemp(dir=stage_root))
    kwargs = dict(batch_size=batch_size, decode="raw", seed=0, prefetchers=16, readers=2,
                  lookahead=lookahead, depth=depth, rank=rank, world_size=world_size)
    if policy != "none":
        # Stage 3 waits for stage 2 (stage_patience=None): the bytes read then measure the eviction
        # policy alone, not how far the copies lag behind the consumer.
        kwargs.update(stage_dir=stage, cache_bytes=cache_bytes, eviction=policy, stage_patience=None)
    served_after_first = None
    start = time.perf_counter()
    with prestage.Loader(catalog, **kwargs) as loader:
        for e in range(epochs):
            for _ in loader:
                pass
            if e == 0 and pfs:
                served_after_first = pfs.stats()["bytes_read"]
        stats = loader.stats(epochs="all")
    elapsed = time.perf_counter() - start
    # Epochs 2..E as the emulator saw them (the loader runs a little ahead across each boundary).
    served = pfs.stats()["bytes_read"] - served_after_first if pfs else None
    shutil.rmtree(stage, ignore_errors=True)
    per_epoch = [e["bytes_from_source"] for e in stats["epochs"][:epochs]]
    return {"policy": policy, "per_epoch_bytes": per_epoch, "served_bytes": served,
            "seconds": elapsed, "peak_stage_bytes": stats["stage_bytes_peak"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=5000, help="images in the synthetic set")
    p.add_argument("--epochs", type=int, default=5, help="epochs per run (epoch 1 is cold)")
    p.add_argument("--world-size", type=int, nargs="+", default=[1],
                   help="world sizes to study, each on one rank (rank 1, or 0 alone); the cache is a "
                   "fraction of the set / world size")
    p.add_argument("--fractions", type=float, nargs="+", default=[0.25, 0.5, 0.75],
                   help="cache sizes, as fractions of the bytes one rank reads per epoch")
    p.add_argument("--policies", nargs="+", default=["clairvoyant", "lru", "none"],
                   choices=["clairvoyant", "lru", "none"], help="loader runs ('none': no stage directory)")
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--lookahead", type=int, default=4, help="batches staged ahead")
    p.add_argument("--depth", type=int, default=4, help="batch buffers")
    p.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "prestage-cache-bench",
                   help="where the synthetic set and the stage directories go")
    p.add_argument("--latency-ms", type=float, default=2.0, help="emulated PFS latency per operation, ms")
    p.add_argument("--bandwidth-mbs", type=float, default=200.0, help="emulated PFS bandwidth, MB/s")
    p.add_argument("--no-emulator", action="store_true", help="read the set directly")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args()

    source = args.data / f"synth-{args.images}"
    synth.make_synthetic_set(source, images=args.images, classes=100, seed=0, progress=True)
    stage_root = args.data / "stage"
    stage_root.mkdir(parents=True, exist_ok=True)

    pfs = None
    binary = emulator.find_emulator()
    reason = "--no-emulator" if args.no_emulator else emulator.unavailable_reason(binary)
    if reason is None:
        pfs = emulator.PfsEmulator(source, latency_ms=args.latency_ms, bandwidth_mbs=args.bandwidth_mbs)
        root = pfs.start()
    else:
        print(f"no PFS emulator ({reason}): reading {source} directly")
        root = source
    # Files in flight (planned, not yet decoded) are never evicted: the loader's window, in batches.
    window = args.lookahead + args.depth + 2
    rows = []
    try:
        catalog = prestage.Catalog.from_folder(root)
        sizes = [catalog.source_path(i).stat().st_size for i in range(len(catalog))]
        total = sum(sizes)
        for world_size in args.world_size:
            rank = min(1, world_size - 1)
            # Belady sees 100 epochs past the last one read.
            plan = [prestage.plan.epoch_batches(len(catalog), args.batch_size, seed=0, epoch=e, rank=rank,
                                                world_size=world_size)
                    for e in range(args.epochs + 100)]
            # What the rank reads per epoch in epochs 2..E (its share of the set varies with the sizes).
            share = sum(sizes[f] for batches in plan[1:args.epochs] for batch in batches
                        for f in batch) / (args.epochs - 1)
            for fraction in args.fractions:
                capacity = int(fraction * total / world_size)
                sims = {name: simulate(plan, sizes, capacity, pol, args.epochs, w)
                        for name, pol, w in (("belady", "belady", 0), ("belady_window", "belady", window),
                                             ("lru", "lru", window))}
                for policy in args.policies:
                    r = run(catalog, stage_root, capacity, policy, args.epochs, pfs, rank, world_size,
                            args.batch_size, args.lookahead, args.depth)
                    later = r["per_epoch_bytes"][1:]
                    r.update(world_size=world_size, rank=rank, fraction=fraction, capacity=capacity,
                             rank_bytes_per_epoch=share,
                             loader_per_epoch=statistics.mean(later) / share,
                             served_per_epoch=(r["served_bytes"] / (args.epochs - 1) / share)
                             if r["served_bytes"] is not None else None,
                             sim_belady=statistics.mean(sims["belady"][1:]) / share,
                             sim_belady_window=statistics.mean(sims["belady_window"][1:]) / share,
                             sim_lru=statistics.mean(sims["lru"][1:]) / share)
                    rows.append(r)
                    served = r["served_per_epoch"]
                    print(f"rank {rank} of {world_size}, cache {fraction:.0%} {policy:>11}: "
                          f"{r['loader_per_epoch']:.3f} of what the rank reads (epochs 2-{args.epochs})"
                          + (f", emulator served {served:.3f}" if served is not None else "")
                          + f"; simulated Belady {r['sim_belady']:.3f} (with the window "
                          f"{r['sim_belady_window']:.3f}), LRU {r['sim_lru']:.3f}; {r['seconds']:.1f} s",
                          flush=True)
    finally:
        if pfs:
            pfs.stop()
    result = {"images": len(catalog), "set_bytes": total, "epochs": args.epochs,
              "batch_size": args.batch_size, "lookahead": args.lookahead, "depth": args.depth,
              "emulator": None if pfs is None else pfs.config, "machine": platform.platform(),
              "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
