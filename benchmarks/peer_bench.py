"""PFS bytes per epoch of a 4-rank job (2 nodes of 2 ranks, emulated on one host with PRESTAGE_NODE, one
stage directory per node), with and without the peer tier, for node caches that hold 25, 50 and 100%
of the set in aggregate (each node's cache_bytes is that share of the set over the 2 nodes).

    python benchmarks/peer_bench.py [--files 480] [--size 16384] [--epochs 4] [--runs 3] [--json out.json]

Needs mpirun (OpenMPI) and libprestage_mpi.so beside the prestage extension. The source is a local
folder of equal-size raw files; the bytes are counted by the loaders (stats()["epochs"], summed over
the ranks), which test_peers.py checks against the PFS emulator's own counts. Ranks meet at a barrier
after every epoch, as a training step's all-reduce makes them. Each figure is the median of --runs
jobs (which ranks make the few home copies a neighbour had not reached yet varies with timing), with
the job's wall time (mpirun start to end: start-up, epochs and the ranks' closing). Prints a Markdown
table.
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
    """One rank of a job: `epochs` epochs of raw samples; writes its per-epoch figures."""
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    node = rank * NODES // WORLD
    os.environ["PRESTAGE_NODE"] = str(node)
    import prestage

    catalog = prestage.Catalog.load(cfg["catalog"])
    loader = prestage.Loader(catalog, batch_size=BATCH, decode="raw", seed=SEED, rank=rank,
                             world_size=WORLD, stage_dir=os.path.join(cfg["stage"], f"node{node}"),
                             cache_bytes=cfg["cache_bytes"], peers=cfg["peers"], prefetchers=4,
                             lookahead=2, depth=2)

    def barrier(name: str) -> None:
        Path(cfg["barrier"], f"{name}-{rank}").touch()
        while not all(Path(cfg["barrier"], f"{name}-{r}").exists() for r in range(WORLD)):
            time.sleep(0.002)

    for epoch in range(cfg["epochs"]):
        for _ in loader:
            pass
        barrier(f"e{epoch}")
    barrier("done")  # every rank answers its peers until all are done
    loader.close()
    s = loader.stats(epochs="all")
    Path(cfg["out"], f"{rank}.json").write_text(json.dumps(
        {"epochs": s["epochs"], "peer_tier": s["peer_tier"], "why": s["peer_tier_why"]}))
    barrier("closed")


def run_job(catalog: Path, work: Path, cache_bytes: int, peers: bool, epochs: int) -> tuple:
    """(per epoch: (PFS bytes, peer bytes) summed over the ranks; the job's wall seconds, mpirun
    start to end)."""
    for d in ("stage", "barrier", "out"):
        shutil.rmtree(work / d, ignore_errors=True)
        (work / d).mkdir(parents=True)
    cfg = dict(catalog=str(catalog), stage=str(work / "stage"), barrier=str(work / "barrier"),
               out=str(work / "out"), cache_bytes=cache_bytes, peers=peers, epochs=epochs)
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none")
    started = time.monotonic()
    subprocess.run(["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", str(WORLD), sys.executable,
                    __file__, "--rank", json.dumps(cfg)], env=env, check=True, timeout=600)
    ranks = [json.loads((work / "out" / f"{r}.json").read_text()) for r in range(WORLD)]
    if peers and not all(r["peer_tier"] for r in ranks):
        raise SystemExit(f"the peer tier is off: {ranks[0]['why']}")
    totals = []
    for epoch in range(epochs):
        rows = [e for r in ranks for e in r["epochs"] if e["epoch"] == epoch]
        totals.append((sum(e["bytes_from_source"] for e in rows), sum(e["bytes_from_peers"] for e in rows)))
    return totals, time.monotonic() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=480)
    p.add_argument("--size", type=int, default=16384, help="bytes per file")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--rank", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank is not None:
        rank_main(json.loads(args.rank))
        return
    import prestage

    with tempfile.TemporaryDirectory(prefix="prestage-peer-bench-") as tmp:
        work = Path(tmp)
        source = work / "source" / "c"
        source.mkdir(parents=True)
        for i in range(args.files):
            (source / f"{i:05d}.bin").write_bytes(os.urandom(args.size))
        catalog = work / "set.catalog"
        prestage.Catalog.from_folder(source.parent, extensions=[".bin"]).save(catalog)
        set_bytes = args.files * args.size
        results, job_s = {}, {}
        for share in (25, 50, 100):
            per_node = set_bytes * share // 100 // NODES
            for peers in (False, True):
                jobs = [run_job(catalog, work, per_node, peers, args.epochs) for _ in range(args.runs)]
                runs = [totals for totals, _ in jobs]
                job_s[(share, peers)] = statistics.median(s for _, s in jobs)
                results[(share, peers)] = [
                    tuple(statistics.median(run[e][i] for run in runs) for i in (0, 1))
                    for e in range(args.epochs)]

    mb = 1e6
    print(f"{WORLD} ranks = {NODES} nodes x {WORLD // NODES}, {args.files} files of {args.size} bytes "
          f"({set_bytes / mb:.1f} MB), {args.epochs} epochs; PFS MB per epoch (peer MB in brackets)\n")
    print("| aggregate cache | peers | " + " | ".join(f"epoch {e}" for e in range(args.epochs)) +
          " | PFS total | with / without | job s |")
    print("|---|---|" + "---|" * args.epochs + "---|---|---|")
    for share in (25, 50, 100):
        base = sum(b for b, _ in results[(share, False)])
        for peers in (False, True):
            row = results[(share, peers)]
            total = sum(b for b, _ in row)
            cells = [f"{b / mb:.2f}" + (f" ({q / mb:.2f})" if peers else "") for b, q in row]
            ratio = f"{total / base:.2f}" if peers else "1"
            print(f"| {share}% | {'yes' if peers else 'no'} | " + " | ".join(cells) +
                  f" | {total / mb:.2f} | {ratio} | {job_s[(share, peers)]:.1f} |")
    if args.json:
        args.json.write_text(json.dumps({f"{s}-{'peers' if p else 'no-peers'}": v
                                         for (s, p), v in results.items()}, indent=1))


if __name__ == "__main__":
    main()
