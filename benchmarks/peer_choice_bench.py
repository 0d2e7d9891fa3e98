"""Time per epoch of a 4-rank job (2 nodes of 2 ranks, emulated on one host with PRESTAGE_NODE, one stage
directory per node) with the peer tier on and off, behind the PFS emulator, with the peer link emulated
(PRESTAGE_PEER_LINK) faster than the PFS in one scenario and slower in the other.

    python benchmarks/peer_choice_bench.py [--files 240] [--size 65536] [--epochs 4] [--runs 3]
                                           [--only faster|slower]

Needs mpirun (OpenMPI), libprestage_mpi.so beside the prestage extension, and prestage-pfs (FUSE). The
source is a folder of equal-size raw files served by the emulator; each node's cache_bytes is half the
set (the two nodes hold the set together). Ranks meet at a barrier after every epoch (as a training
step's all-reduce makes them); an epoch's time is rank 0's time from one barrier to the next. Epoch 0
stages from the PFS in both modes; the figure is epochs 1 on (mean per job), median of --runs jobs,
and each pair's ratio (the jobs without and with peers alternate). Prints it as a Markdown table,
then one of the jobs' CPU seconds and voluntary context switches, and of the wake-ups per second of
the peer transports' progress threads (named prestage-mpi) in epochs 1 on: their idle polling; then
each rank's own time in its loops (without the barrier's waits: a rank waits there for the slowest,
which on a shared host is often a matter of the scheduler) and the CPU seconds per thread.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORLD, NODES, BATCH, SEED = 4, 2, 8, 1

# (name, PFS latency ms, PFS MB/s (aggregate), peer link "LATENCY_MS,MBS" per rank)
SCENARIOS = [
    ("PFS slower than the link", 10.0, 50.0, "1,200"),
    ("PFS faster than the link", 1.0, 400.0, "30,4"),
]


def transport_switches() -> int:
    """Voluntary context switches of this process's peer transport thread ("prestage-mpi"): its
    sleeps, each ended by a wake-up (0 with the tier off)."""
    total = 0
    for task in Path("/proc/self/task").iterdir():
        try:
            if (task / "comm").read_text().strip() != "prestage-mpi":
                continue
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    total += int(line.split()[1])
        except OSError:  # a thread that ended meanwhile
            pass
    return total


def thread_ticks() -> dict[str, tuple[str, int]]:
    """This process's threads: id -> (name, CPU clock ticks so far). prestage names its own
    (prestage-stage, -io, -probe, -mpi); the rest (the main thread, TBB's workers) run stages 1 and 3."""
    out = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            kind = name if name.startswith("prestage-") else "other"
            out[task.name] = (kind, int(fields[11]) + int(fields[12]))  # utime + stime
        except OSError:  # a thread that ended meanwhile
            pass
    return out


def rank_main(cfg: dict) -> None:
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
            time.sleep(0.001)

    barrier("start")
    marks = [time.monotonic()]
    before = resource.getrusage(resource.RUSAGE_SELF)
    transport = [transport_switches()]
    loops = []  # this rank's own time in each epoch's loop, without its wait at the barrier
    for epoch in range(cfg["epochs"]):
        start = time.monotonic()
        for _ in loader:
            pass
        loops.append(time.monotonic() - start)
        barrier(f"e{epoch}")
        marks.append(time.monotonic())
        transport.append(transport_switches())
        if epoch == 0:
            ticks = thread_ticks()
    after = resource.getrusage(resource.RUSAGE_SELF)
    by_thread: dict[str, float] = {}  # CPU seconds per thread name, epochs 1 on
    tick = os.sysconf("SC_CLK_TCK")
    for tid, (name, t) in thread_ticks().items():
        by_thread[name] = by_thread.get(name, 0.0) + (t - ticks.get(tid, (name, 0))[1]) / tick
    barrier("done")  # every rank answers its peers until all are done
    loader.close()
    s = loader.stats(epochs="all")
    Path(cfg["out"], f"{rank}.json").write_text(json.dumps(
        {"epoch_s": [b - a for a, b in zip(marks, marks[1:])], "loop_s": loops, "by_thread": by_thread,
         "peer_tier": s["peer_tier"],
         "why": s["peer_tier_why"], "peer_reads": s["peer_reads"], "to_pfs": s["peer_reads_to_pfs"],
         "sources": s["sources"], "home_first": s["peer_home_first"], "fallbacks": s["peer_fallbacks"],
         "pfs_per_epoch": [e["source_reads"] for e in sorted(s["epochs"], key=lambda e: e["epoch"])],
         # The process's, over the epochs: CPU seconds, and voluntary context switches (each thread's
         # sleeps and waits: the peer transport's idle wake-ups among them).
         "cpu_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
         "switches": after.ru_nvcsw - before.ru_nvcsw,
         # Epochs 1 on, as the times.
         "transport_per_s": (transport[-1] - transport[1]) / (marks[-1] - marks[1])}))
    barrier("closed")


def run_job(catalog: Path, work: Path, cache_bytes: int, peers: bool, epochs: int, link: str) -> dict:
    for d in ("stage", "barrier", "out"):
        shutil.rmtree(work / d, ignore_errors=True)
        (work / d).mkdir(parents=True)
    cfg = dict(catalog=str(catalog), stage=str(work / "stage"), barrier=str(work / "barrier"),
               out=str(work / "out"), cache_bytes=cache_bytes, peers=peers, epochs=epochs)
    # One BLAS thread per rank: NumPy's (imported by prestage) would otherwise spin in each of them.
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none", PRESTAGE_PEER_LINK=link,
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    subprocess.run(["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", str(WORLD), sys.executable,
                    __file__, "--rank", json.dumps(cfg)], env=env, check=True, timeout=600)
    ranks = [json.loads((work / "out" / f"{r}.json").read_text()) for r in range(WORLD)]
    if peers and not all(r["peer_tier"] for r in ranks):
        raise SystemExit(f"the peer tier is off: {ranks[0]['why']}")
    by_thread: dict[str, float] = {}
    for r in ranks:
        for name, cpu in r["by_thread"].items():
            by_thread[name] = by_thread.get(name, 0.0) + cpu
    return {"later_s": statistics.mean(ranks[0]["epoch_s"][1:]), "epoch0_s": ranks[0]["epoch_s"][0],
            # Each rank's own loop, epochs 1 on, averaged over the ranks: the job's time without the
            # barrier's waits (a rank waits there for the slowest, whose delay is often the host's).
            "loop_s": statistics.mean(statistics.mean(r["loop_s"][1:]) for r in ranks),
            "by_thread": by_thread,
            "epoch_s": ranks[0]["epoch_s"],
            "peer_reads": sum(r["peer_reads"] for r in ranks), "to_pfs": sum(r["to_pfs"] for r in ranks),
            "sources": ranks[0]["sources"], "home_first": [r["home_first"] for r in ranks],
            "fallbacks": sum(r["fallbacks"] for r in ranks),
            # PFS reads per epoch, all ranks (the last: reads ahead into the epoch no one consumes).
            "pfs_per_epoch": [sum(r["pfs_per_epoch"][e] for r in ranks if e < len(r["pfs_per_epoch"]))
                              for e in range(max(len(r["pfs_per_epoch"]) for r in ranks))],
            "cpu_s": sum(r["cpu_s"] for r in ranks), "switches": sum(r["switches"] for r in ranks),
            "transport_wakeups_per_s": sum(r["transport_per_s"] for r in ranks)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=240)
    p.add_argument("--size", type=int, default=65536, help="bytes per file")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--only", choices=("faster", "slower"), default=None,
                   help="run one scenario: the PFS faster, or slower, than the link")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--rank", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank is not None:
        rank_main(json.loads(args.rank))
        return
    import prestage
    from prestage.bench.emulator import PfsEmulator

    rows, raw, cost, wakeups = [], {}, {}, {}
    with tempfile.TemporaryDirectory(prefix="prestage-peer-choice-") as tmp:
        work = Path(tmp)
        backing = work / "backing"
        (backing / "c").mkdir(parents=True)
        for i in range(args.files):
            (backing / "c" / f"{i:05d}.bin").write_bytes(os.urandom(args.size))
        per_node = args.files * args.size // NODES
        for name, latency_ms, mbs, link in SCENARIOS:
            if args.only is not None and f"PFS {args.only} than" not in name:
                continue
            with PfsEmulator(backing, latency_ms=latency_ms, bandwidth_mbs=mbs, max_ops=16) as pfs:
                catalog = work / "set.catalog"
                assert pfs.mountpoint is not None
                prestage.Catalog.from_folder(pfs.mountpoint, extensions=[".bin"]).save(catalog)
                # Off and on alternate, so that a change in the machine's load falls on both.
                jobs: dict[bool, list[dict]] = {False: [], True: []}
                for _ in range(args.runs):
                    for peers in (False, True):
                        jobs[peers].append(run_job(catalog, work, per_node, peers, args.epochs, link))
            off = statistics.median(j["later_s"] for j in jobs[False])
            on = statistics.median(j["later_s"] for j in jobs[True])
            reads = statistics.median(j["peer_reads"] for j in jobs[True])
            moved = statistics.median(j["to_pfs"] for j in jobs[True])
            # The jobs of a pair ran back to back: their ratio is the least disturbed by load.
            pairs = sorted(b["later_s"] / a["later_s"] for a, b in zip(jobs[False], jobs[True]))
            rows.append((name, latency_ms, mbs, link, off, on, reads, moved, pairs))
            loops = sorted(b["loop_s"] / a["loop_s"] for a, b in zip(jobs[False], jobs[True]))
            threads = sorted({t for j in jobs[False] + jobs[True] for t in j["by_thread"]})
            cost[name] = {peers: (statistics.median(j["cpu_s"] for j in jobs[peers]),
                                  statistics.median(j["switches"] for j in jobs[peers]),
                                  {t: statistics.median(j["by_thread"].get(t, 0.0) for j in jobs[peers])
                                   for t in threads})
                          for peers in (False, True)}
            cost[name]["loops"] = loops
            wakeups[name] = statistics.median(j["transport_wakeups_per_s"] for j in jobs[True])
            raw[name] = jobs
    print(f"{WORLD} ranks = {NODES} nodes x {WORLD // NODES}, {args.files} files of {args.size} bytes, "
          f"cache_bytes half the set per node, {args.epochs} epochs; seconds per epoch, epochs 1 on, "
          f"median of {args.runs} jobs; on / off per pair of jobs run back to back, sorted\n")
    print("| scenario | PFS emulated | peer link emulated | peers off | peers on | on / off "
          "| peer reads (job) | reads sent to the PFS instead (job) | on / off per pair |")
    print("|---|---|---|---:|---:|---:|---:|---:|---|")
    for name, latency_ms, mbs, link, off, on, reads, moved, pairs in rows:
        lat, link_mbs = link.split(",")
        print(f"| {name} | {latency_ms:g} ms, {mbs:g} MB/s | {lat} ms, {link_mbs} MB/s per rank "
              f"| {off:.3f} | {on:.3f} | {on / off:.2f} | {reads:.0f} | {moved:.0f} "
              f"| {' '.join(f'{r:.2f}' for r in pairs)} |")
    print("\nCPU seconds and voluntary context switches of the job's 4 processes over its epochs, and "
          "the peer transport threads' wake-ups per second in epochs 1 on (summed over the ranks; "
          "medians):\n")
    print("| scenario | CPU s, peers off | CPU s, peers on | switches, peers off | switches, peers on "
          "| transport wake-ups / s |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, c in cost.items():
        print(f"| {name} | {c[False][0]:.2f} | {c[True][0]:.2f} | {c[False][1]:.0f} | {c[True][1]:.0f} "
              f"| {wakeups[name]:.0f} |")
    print("\nEach rank's own time in its epochs' loops (epochs 1 on, without its waits at the barrier; "
          "mean over the ranks), on / off per pair, sorted; and the CPU seconds of epochs 1 on per thread "
          "(summed over the ranks; medians; other: the main thread and TBB's workers, stages 1 and 3):\n")
    for name, c in cost.items():
        loops = c["loops"]
        print(f"- {name}: loops on / off {statistics.median(loops):.2f} "
              f"({' '.join(f'{r:.2f}' for r in loops)}); CPU s off / on: "
              + ", ".join(f"{t} {c[False][2].get(t, 0):.2f} / {c[True][2].get(t, 0):.2f}"
                          for t in sorted(set(c[False][2]) | set(c[True][2]))))
    if args.json:
        args.json.write_text(json.dumps(raw, indent=1))


if __name__ == "__main__":
    main()
