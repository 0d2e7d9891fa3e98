"""Ranks of one node sharing one stage directory, against one rank alone doing the same total work.

A set of small files (64 bytes each by default: the cost measured is per file, not per byte) is
read for `--epochs` epochs by R processes at once, ranks 0..R-1 of a world of R, all sharing one
stage directory; and by one process alone, world size 1, over the same set. Epoch 1 copies the set
into the stage directory (each rank its own slice); from epoch 2 on everything is staged, but each
rank meets files that its neighbours copied: it takes their copies over (adoption), which must cost
about what a hit costs. Ranks meet at the end of every epoch (a file barrier), as a training step's
all-reduce makes them. Reported per R, median of `--runs` rounds (each round runs every R in turn,
each run on a fresh stage directory): the time of each epoch (the slowest rank's), the ratio
shared / alone for it, and the CPU time of all the ranks together.

    python benchmarks/share_bench.py --files 60000 --ranks 1 2 4 8 --runs 3
    python benchmarks/share_bench.py --files 1000000 --ranks 1 2 4 8 --runs 1 --epochs 2

`--baseline DIR` runs every process with DIR first on sys.path (another build of prestage,
installed there with `pip install --target DIR .`), to measure before and after a change.
Reproducible from the repository alone: the files are written here.
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
from typing import Dict, List, Optional

WORKER = r"""
import json, sys, time
import prestage
catalog, stage, rank, world, batch, epochs, go, threads = sys.argv[1:9]
cat = prestage.Catalog.load(catalog)
options = json.loads(threads)  # prefetchers, readers: the defaults unless given
loader = prestage.Loader(cat, batch_size=int(batch), decode="raw", stage_dir=stage, rank=int(rank),
                         world_size=int(world), seed=0, stage_patience=None, **options)
while not __import__("os").path.exists(go):  # all ranks start together
    time.sleep(0.001)
times, cpu = [], []
for e in range(int(epochs)):
    start, start_cpu = time.perf_counter(), time.process_time()
    for b in loader:
        pass
    times.append(time.perf_counter() - start)
    cpu.append(time.process_time() - start_cpu)
    # Ranks meet at the end of every epoch, as a training step's all-reduce makes them.
    open(f"{go}.{e}.{rank}", "w").close()
    while sum(__import__("os").path.exists(f"{go}.{e}.{r}") for r in range(int(world))) < int(world):
        time.sleep(0.0005)
s = loader.stats(epochs="all")
loader.close()
print(json.dumps({"epoch_s": times, "epoch_cpu_s": cpu, "copies": s["staged_files"], "adopted": s["adopted_files"],
                  "source_reads": s["source_reads"],
                  "epochs": [{k: e[k] for k in ("source_reads", "copies_made", "copies_adopted")}
                             for e in s["epochs"][:int(epochs)]]}))
"""


def make_files(root: Path, count: int, size: int, classes: int = 100) -> None:
    """`count` files of `size` bytes in `classes` folders, each file's bytes its own."""
    for c in range(classes):
        (root / f"c{c:03d}").mkdir(parents=True, exist_ok=True)
    step = max(1, count // 100)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    for i in range(count):
        data = (i.to_bytes(8, "little") * (size // 8 + 1))[:size]
        fd = os.open(root / f"c{i % classes:03d}" / f"{i:07d}.bin", flags, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        if i % step == 0 or i + 1 == count:
            print(f"\r  writing files {i + 1:,}/{count:,}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)


def run_once(catalog: Path, stage: Path, ranks: int, batch: int, epochs: int,
             env: Dict[str, str], threads: Optional[Dict[str, int]] = None) -> dict:
    """R processes sharing `stage`, started together; per epoch the slowest rank's time."""
    if stage.exists():
        shutil.rmtree(stage)
    go = stage.parent / "go"
    for old in stage.parent.glob("go*"):
        old.unlink()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(catalog), str(stage), str(r),
                               str(ranks), str(batch), str(epochs), str(go),
                               json.dumps(threads or {})],
                              stdout=subprocess.PIPE, text=True, env=env) for r in range(ranks)]
    time.sleep(1.0 + 0.2 * ranks)  # every loader built (the catalog loaded) before the start
    go.touch()
    outs = []
    for p in procs:
        out, _ = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"a rank failed (exit {p.returncode})")
        outs.append(json.loads(out))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    per_epoch = [max(o["epoch_s"][e] for o in outs) for e in range(epochs)]
    return {"epoch_s": per_epoch,
            "epoch_cpu_s": [sum(o["epoch_cpu_s"][e] for o in outs) for e in range(epochs)],
            "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "source_reads": sum(o["source_reads"] for o in outs),
            "copies": sum(o["copies"] for o in outs),
            "adopted": sum(o["adopted"] for o in outs)}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=60000)
    ap.add_argument("--file-bytes", type=int, default=64)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--prefetchers", type=int, help="stage 2 threads of each rank (default: the loader's)")
    ap.add_argument("--readers", type=int, help="stage 3 threads of each rank (default: the loader's)")
    ap.add_argument("--baseline", type=Path, help="another build of prestage (a pip --target dir)")
    ap.add_argument("--workdir", type=Path, help="where the files go (default: a temporary dir)")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)

    env = dict(os.environ)
    if args.baseline:
        env["PYTHONPATH"] = str(args.baseline.resolve()) + os.pathsep + env.get("PYTHONPATH", "")
    work = Path(tempfile.mkdtemp(prefix="prestage-share-", dir=args.workdir))
    try:
        src = work / "src"
        make_files(src, args.files, args.file_bytes)
        catalog = work / "set.catalog"
        subprocess.run([sys.executable, "-c",
                        "import sys, prestage; prestage.Catalog.from_folder(sys.argv[1], "
                        "extensions=['.bin']).save(sys.argv[2])", str(src), str(catalog)],
                       check=True, env=env)
        # Rounds of every rank count in turn, so that a machine whose speed drifts slows them alike.
        configs = [1] + [r for r in args.ranks if r != 1]
        all_runs: Dict[int, List[dict]] = {ranks: [] for ranks in configs}
        for i in range(args.runs):
            for ranks in configs:
                threads = {k: v for k, v in (("prefetchers", args.prefetchers),
                                             ("readers", args.readers)) if v is not None}
                r = run_once(catalog, work / "stage", ranks, args.batch_size, args.epochs, env,
                             threads)
                all_runs[ranks].append(r)
                print(f"  round {i + 1}, {ranks} rank(s): epochs "
                      + " ".join(f"{t:.2f}s" for t in r["epoch_s"])
                      + f", CPU {r['cpu_s']:.1f}s, source reads {r['source_reads']:,}, "
                        f"copies {r['copies']:,}, taken over {r['adopted']:,}",
                      file=sys.stderr, flush=True)
        results = {}
        for ranks, runs in all_runs.items():
            results[ranks] = {
                "epoch_s": [statistics.median(r["epoch_s"][e] for r in runs)
                            for e in range(args.epochs)],
                "source_reads": [r["source_reads"] for r in runs],
                "cpu_s": statistics.median(r["cpu_s"] for r in runs),
                "epoch_cpu_s": [statistics.median(r["epoch_cpu_s"][e] for r in runs)
                                for e in range(args.epochs)],
                "runs": runs}
        alone = results[1]["epoch_s"]
        print(f"\n{args.files:,} files of {args.file_bytes} bytes, batch {args.batch_size}, "
              f"median of {args.runs} round(s); epoch time of the slowest rank, and shared / alone")
        print("ranks " + "".join(f"   epoch {e + 1:<2}  ratio" for e in range(args.epochs))
              + "   CPU (all ranks)   source reads (node)")
        for ranks, r in results.items():
            cells = "".join(f"  {t:8.2f}s {t / a:6.2f}" for t, a in zip(r["epoch_s"], alone))
            print(f"{ranks:>5} {cells}   {r['cpu_s']:14.1f}s   "
                  f"{statistics.median(r['source_reads']):,.0f}")
        # The work an epoch costs, whatever the machine's load: the CPU time of all ranks together.
        alone_cpu = results[1]["epoch_cpu_s"]
        print("\nCPU time of each epoch, all ranks together, and shared / alone")
        for ranks, r in results.items():
            print(f"{ranks:>5} " + "".join(f"  {t:8.2f}s {t / a:6.2f}"
                                          for t, a in zip(r["epoch_cpu_s"], alone_cpu)))
        if args.json:
            args.json.write_text(json.dumps({
                "files": args.files, "file_bytes": args.file_bytes, "batch_size": args.batch_size,
                "epochs": args.epochs, "runs": args.runs,
                "cpus": os.cpu_count(), "baseline": str(args.baseline) if args.baseline else None,
                "results": {str(k): v for k, v in results.items()}}, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
