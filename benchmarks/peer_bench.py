"""PFS bytes of a 4-rank job (2 nodes of 2 ranks, emulated on one host with PRESTAGE_NODE, one
stage directory per node), with and without the peer tier, for node caches that hold 25, 50 and 100%
of the set in aggregate (each node's cache_bytes is that share of the set over the 2 nodes).

    python benchmarks/peer_bench.py [--files 480] [--size 16384] [--epochs 4] [--runs 3] [--json out.json]
    python benchmarks/peer_bench.py --format jpeg --pfs-ms 0.2 --shares 50 --epochs 3 \\
        --pfs-reads fastest fewest --runs 5

Needs mpirun (OpenMPI) and libprestage_mpi.so beside the prestage extension. The source is a local
folder of equal-size raw files (--format raw), or of JPEG images (--format jpeg, 64x80, decoded to
32x32) or .npy arrays (--format npy, --size bytes of float32 each); with --pfs-ms it is served by the
PFS emulator (prestage-pfs) at that latency per operation, unlimited bandwidth, and the PFS bytes
are the emulator's own count (the loaders' count, stats()["epochs"] summed over the ranks, is shown
beside it); without, they are the loaders' count. Ranks meet at a barrier after every epoch, as a
training step's all-reduce makes them. The jobs with and without the tier alternate, so that a
change in the machine's load falls on both. Each figure is the median of --runs jobs (which ranks
make the few home copies a neighbour had not reached yet varies with timing), with the epochs' time
(rank 0's, from a barrier after the loaders' construction to the last epoch's barrier) and the job's wall time (mpirun
start to end). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORLD, NODES, BATCH, SEED = 4, 2, 8, 1


def rank_main(cfg: dict) -> None:
    """One rank of a job: `epochs` epochs; writes its per-epoch figures."""
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    node = rank * NODES // WORLD
    os.environ["PRESTAGE_NODE"] = str(node)
    import prestage

    def barrier(name: str) -> None:
        Path(cfg["barrier"], f"{name}-{rank}").touch()
        while not all(Path(cfg["barrier"], f"{name}-{r}").exists() for r in range(WORLD)):
            time.sleep(0.002)

    catalog = prestage.Catalog.load(cfg["catalog"])
    options = dict(decode="raw")
    if cfg["format"] == "jpeg":
        options = dict(decode="jpeg", image_size=(32, 32))
    elif cfg["format"] == "npy":
        options = dict(decode="npy")
    if cfg["peers"]:
        options["pfs_reads"] = cfg["pfs_reads"]
    loader = prestage.Loader(catalog, batch_size=BATCH, seed=SEED, rank=rank, world_size=WORLD,
                             stage_dir=os.path.join(cfg["stage"], f"node{node}"),
                             cache_bytes=cfg["cache_bytes"], peers=cfg["peers"], prefetchers=4,
                             lookahead=2, depth=2, **options)
    barrier("start")  # the tier's start (MPI's) is the job's, not its epochs'
    started = time.monotonic()
    for epoch in range(cfg["epochs"]):
        for _ in loader:
            pass
        barrier(f"e{epoch}")
    epochs_s = time.monotonic() - started
    barrier("done")  # every rank answers its peers until all are done
    loader.close()
    s = loader.stats(epochs="all")
    Path(cfg["out"], f"{rank}.json").write_text(json.dumps(
        {"epochs": s["epochs"], "peer_tier": s["peer_tier"], "why": s["peer_tier_why"],
         "epochs_s": epochs_s, "stats": {k: v for k, v in s.items() if k != "epochs"}}))
    barrier("closed")


def pfs_bytes(emulator) -> int:
    """The bytes the emulator has served so far, over every file."""
    return sum(p["bytes"] for p in emulator.stats()["paths"].values())


def run_job(catalog: Path, work: Path, cfg: dict, emulator=None) -> dict:
    """One mpirun job: per epoch (PFS bytes, peer bytes) summed over the ranks as the loaders count
    them, the emulator's PFS bytes (None without it), rank 0's epochs' seconds, the job's wall
    seconds (mpirun start to end)."""
    for d in ("stage", "barrier", "out"):
        shutil.rmtree(work / d, ignore_errors=True)
        (work / d).mkdir(parents=True)
    cfg = dict(cfg, catalog=str(catalog), stage=str(work / "stage"), barrier=str(work / "barrier"),
               out=str(work / "out"))
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none")
    before = pfs_bytes(emulator) if emulator is not None else 0
    started = time.monotonic()
    subprocess.run(["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", str(WORLD), sys.executable,
                    __file__, "--rank", json.dumps(cfg)], env=env, check=True, timeout=600)
    job_s = time.monotonic() - started
    ranks = [json.loads((work / "out" / f"{r}.json").read_text()) for r in range(WORLD)]
    if cfg["peers"] and not all(r["peer_tier"] for r in ranks):
        raise SystemExit(f"the peer tier is off: {ranks[0]['why']}")
    totals = []
    for epoch in range(cfg["epochs"]):
        rows = [e for r in ranks for e in r["epochs"] if e["epoch"] == epoch]
        totals.append((sum(e["bytes_from_source"] for e in rows), sum(e["bytes_from_peers"] for e in rows)))
    past_end = sum(e["bytes_from_source"] for r in ranks for e in r["epochs"] if e["epoch"] >= cfg["epochs"])
    return dict(epochs=totals, past_end=past_end, emulated=pfs_bytes(emulator) - before if emulator is not None else None,
                epochs_s=ranks[0]["epochs_s"], job_s=job_s, ranks=[r["stats"] for r in ranks])


def make_set(kind: str, root: Path, files: int, size: int):
    """`files` files of format `kind` under root/c; returns the catalog builder over a root."""
    import numpy as np
    import prestage

    source = root / "c"
    source.mkdir(parents=True)
    rng = np.random.default_rng(5)
    if kind == "jpeg":
        from PIL import Image
        for i in range(files):
            y, x = np.mgrid[0:64, 0:80]
            base = (np.stack([x * 3, y * 4, (x + y) * 2], -1) + rng.integers(0, 40, (64, 80, 3))) % 256
            Image.fromarray(base.astype(np.uint8)).save(source / f"{i:05d}.jpg", quality=90)
        return lambda top: prestage.Catalog.from_folder(top)
    if kind == "npy":
        for i in range(files):
            np.save(source / f"{i:05d}.npy", rng.standard_normal(size // 4).astype(np.float32))
        return lambda top: prestage.Catalog.from_folder(top, extensions=[".npy"])
    for i in range(files):
        (source / f"{i:05d}.bin").write_bytes(os.urandom(size))
    return lambda top: prestage.Catalog.from_folder(top, extensions=[".bin"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=480)
    p.add_argument("--size", type=int, default=16384, help="bytes per file (raw, npy)")
    p.add_argument("--format", choices=["raw", "jpeg", "npy"], default="raw")
    p.add_argument("--pfs-ms", type=float, default=None,
                   help="serve the set through the PFS emulator at this latency per operation")
    p.add_argument("--pfs-reads", nargs="+", choices=["fastest", "fewest"], default=["fastest"])
    p.add_argument("--shares", type=int, nargs="+", default=[25, 50, 100],
                   help="aggregate cache, percent of the set")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--rank", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank is not None:
        rank_main(json.loads(args.rank))
        return
    import prestage

    emulator = None
    with tempfile.TemporaryDirectory(prefix="prestage-peer-bench-") as tmp:
        work = Path(tmp)
        build = make_set(args.format, work / "source", args.files, args.size)
        set_bytes = sum(f.stat().st_size for f in (work / "source").rglob("*") if f.is_file())
        top = work / "source"
        if args.pfs_ms is not None:
            from prestage.bench.emulator import PfsEmulator
            emulator = PfsEmulator(top, latency_ms=args.pfs_ms, bandwidth_mbs=0, max_ops=0)
            top = emulator.start()
        try:
            catalog = work / "set.catalog"
            build(top).save(catalog)
            modes = [(False, "-")] + [(True, m) for m in args.pfs_reads]
            results = {}
            for share in args.shares:
                per_node = set_bytes * share // 100 // NODES
                jobs = {m: [] for m in modes}
                for _ in range(args.runs):  # alternating: a change of load falls on every mode
                    for peers, mode in modes:
                        cfg = dict(cache_bytes=per_node, peers=peers, pfs_reads=mode,
                                   epochs=args.epochs, format=args.format)
                        jobs[(peers, mode)].append(run_job(catalog, work, cfg, emulator))
                for m, runs in jobs.items():
                    results[(share, m)] = runs
        finally:
            if emulator is not None:
                emulator.stop()

    mb = 1e6
    print(f"{WORLD} ranks = {NODES} nodes x {WORLD // NODES}, {args.files} {args.format} files "
          f"({set_bytes / mb:.2f} MB), {args.epochs} epochs, "
          + (f"PFS emulator at {args.pfs_ms:g} ms per operation" if emulator else "a local folder")
          + f"; medians of {args.runs} jobs; PFS MB per epoch (peer MB in brackets)\n")
    print("| aggregate cache | peers | " + " | ".join(f"epoch {e}" for e in range(args.epochs)) +
          " | PFS total (range) | emulator's count | with / without | epochs s | with / without | job s |")
    print("|---|---|" + "---|" * args.epochs + "---|---|---|---|---|---|")
    out = {}
    for share in args.shares:
        def summary(runs):
            per_epoch = [tuple(statistics.median(run["epochs"][e][i] for run in runs) for i in (0, 1))
                         for e in range(args.epochs)]
            total = statistics.median(sum(b for b, _ in run["epochs"]) for run in runs)
            emulated = (statistics.median(run["emulated"] for run in runs)
                        if runs[0]["emulated"] is not None else None)
            return per_epoch, total, emulated, statistics.median(run["epochs_s"] for run in runs), \
                statistics.median(run["job_s"] for run in runs)
        base = summary(results[(share, (False, "-"))])
        for peers, mode in [(False, "-")] + [(True, m) for m in args.pfs_reads]:
            runs = results[(share, (peers, mode))]
            per_epoch, total, emulated, epochs_s, job_s = summary(runs)
            pfs = emulated if emulated is not None else total
            base_pfs = base[2] if base[2] is not None else base[1]
            cells = [f"{b / mb:.3f}" + (f" ({q / mb:.3f})" if peers else "") for b, q in per_epoch]
            totals = [sum(b for b, _ in run["epochs"]) / mb for run in runs]
            print(f"| {share}% | {mode if peers else 'no'} | " + " | ".join(cells) +
                  f" | {total / mb:.3f} ({min(totals):.3f}-{max(totals):.3f}) | " + (f"{emulated:,.0f} B" if emulated is not None else "-") +
                  f" | {pfs / base_pfs:.3f} | {epochs_s:.2f} | {epochs_s / base[3]:.3f} | {job_s:.1f} |")
            out[f"{share}-{mode if peers else 'no-peers'}"] = runs
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
