"""Bytes read from the source per epoch with a stage directory smaller than the data set.

For each cache size (a fraction of the set) and each policy (clairvoyant, LRU, no cache), runs
`epochs` epochs through a bounded stage directory, with the source behind the PFS emulator when it
can be mounted, and reports the bytes read from the source in epochs 2..E as a fraction of the set
per epoch: the loader's own per-epoch count (sizes of the files it missed) and the bytes the emulator
served (measured below the loader). Beside them, simulations over the same plan of Belady's rule
(the optimum without look-ahead protection) and of LRU.

    python benchmarks/cache_bench.py --images 5000 --epochs 5 --json out.json

Reproducible from the repository alone: the set is `prestage synth`'s (seed 0).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import prestage
from prestage.bench import emulator
from prestage.cli import synth


def simulate(plan_epochs, sizes, capacity, policy):
    """Bytes missed per epoch by a cache of `capacity` bytes, Belady (with bypass) or LRU, on the plan."""
    first_use = {}
    stream = []
    for e, order in enumerate(plan_epochs):
        for pos, f in enumerate(order):
            first_use.setdefault((e, f), pos)
            stream.append((e, pos, f))
    n_epochs = len(plan_epochs)
    per_epoch = len(plan_epochs[0])

    def next_use(f, e, pos):
        for later in range(e, n_epochs):
            p = first_use.get((later, f))
            if p is not None and (later > e or p > pos):
                return later * per_epoch + p
        return float("inf")

    cache, used = {}, 0
    missed = [0] * n_epochs
    for e, pos, f in stream:
        key = next_use(f, e, pos) if policy == "belady" else e * per_epoch + pos
        if f in cache:
            cache[f] = key
            continue
        missed[e] += sizes[f]
        if sizes[f] > capacity:
            continue
        while used + sizes[f] > capacity:
            victim = max(cache, key=cache.get) if policy == "belady" else min(cache, key=cache.get)
            if policy == "belady" and cache[victim] <= key:
                break
            used -= sizes[victim]
            del cache[victim]
        if used + sizes[f] <= capacity:
            cache[f] = key
            used += sizes[f]
    return missed


def run(source, catalog, stage_root, cache_bytes, policy, epochs, pfs):
    stage = Path(tempfile.mkdtemp(dir=stage_root))
    kwargs = dict(batch_size=64, decode="raw", seed=0, prefetchers=16, readers=2, lookahead=4,
                  depth=4)
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
        stats = loader.stats()
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
    p.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "prestage-cache-bench",
                   help="where the synthetic set and the stage directories go")
    p.add_argument("--latency-ms", type=float, default=2.0, help="emulated PFS latency per operation, ms")
    p.add_argument("--bandwidth-mbs", type=float, default=200.0, help="emulated PFS bandwidth, MB/s")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args()

    source = args.data / f"synth-{args.images}"
    synth.make_synthetic_set(source, images=args.images, classes=100, seed=0, progress=True)
    stage_root = args.data / "stage"
    stage_root.mkdir(parents=True, exist_ok=True)

    pfs = None
    binary = emulator.find_emulator()
    reason = emulator.unavailable_reason(binary)
    if reason is None:
        pfs = emulator.PfsEmulator(source, latency_ms=args.latency_ms, bandwidth_mbs=args.bandwidth_mbs)
        root = pfs.start()
    else:
        print(f"no PFS emulator ({reason}): reading {source} directly")
        root = source
    try:
        catalog = prestage.Catalog.from_folder(root)
        sizes = [catalog.source_path(i).stat().st_size for i in range(len(catalog))]
        total = sum(sizes)
        plan = [prestage.plan.epoch_order(len(catalog), 0, e).tolist() for e in range(args.epochs)]
        rows = []
        for fraction in (0.25, 0.5, 0.75):
            capacity = int(fraction * total)
            sims = {pol: simulate(plan, sizes, capacity, pol) for pol in ("belady", "lru")}
            for policy in ("clairvoyant", "lru", "none"):
                r = run(root, catalog, stage_root, capacity, policy, args.epochs, pfs)
                later = r["per_epoch_bytes"][1:]
                r.update(fraction=fraction,
                         loader_per_epoch=statistics.mean(later) / total,
                         served_per_epoch=(r["served_bytes"] / (args.epochs - 1) / total)
                         if r["served_bytes"] is not None else None,
                         sim_belady=statistics.mean(sims["belady"][1:]) / total,
                         sim_lru=statistics.mean(sims["lru"][1:]) / total)
                rows.append(r)
                served = r["served_per_epoch"]
                print(f"cache {fraction:.0%} {policy:>11}: {r['loader_per_epoch']:.3f} of the set per "
                      f"epoch (epochs 2-{args.epochs})"
                      + (f", emulator served {served:.3f}" if served is not None else "")
                      + f"; simulated Belady {r['sim_belady']:.3f}, LRU {r['sim_lru']:.3f};"
                      f" {r['seconds']:.1f} s", flush=True)
    finally:
        if pfs:
            pfs.stop()
    result = {"images": len(catalog), "set_bytes": total, "epochs": args.epochs,
              "emulator": None if pfs is None else pfs.config, "machine": platform.platform(),
              "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
