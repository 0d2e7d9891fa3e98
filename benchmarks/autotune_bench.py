"""The loader as a user who sets nothing runs it, against the best hand-tuned point, per scenario.

For each scenario, in one run and alternating (round-robin over the configurations, ``--repeat``
rounds, so a drift of the shared machine touches every configuration alike), the pipelined mode of
``prestage bench`` (:func:`prestage.bench.grid.run_jobs`, a stage directory on local disk emptied
between runs) with:

- ``auto``: no thread option and no ``autotune``: sized to the machine, self-tuning on;
- ``grid``: every point of readers x prefetchers x lookahead with ``autotune=False``; its best
  (highest median images/s) is the hand-tuned reference;
- ``old``: the fixed defaults prestage had before (readers=2, prefetchers=4, lookahead=4), fixed;
- ``machine``: no thread option, ``autotune=False`` (the machine-sized values, kept fixed);
- ``auto-pN`` (``--auto-prefetchers N,...``): as ``auto`` but starting from N reads in flight, held
  there (the tuner still tunes readers and lookahead): a candidate sizing rule, A/B against ``auto``
  and the grid in the same run.

Scenarios: the page cache (the source read from local disk, warm), the emulated PFS (``prestage-pfs``)
at 2 ms per operation with 200 MB/s and with 2,000 MB/s, 64 operations at once (cold: the stage
directory is new and the source's pages dropped or fadvised before each run, as ``prestage bench``
does), loose JPEG files and the same files packed into shards by ``prestage.pack``, and a consumer
that computes 10 ms and 100 ms per batch (it sleeps, as an accelerator's step leaves the CPU free).

Per scenario: the median images/s of each configuration, the ratios auto/best and auto/old, the
tuner's settle time (``stats()["tuning"]["settled_s"]``, the median over the auto runs) and its final
values (and its log of one run). JSON to ``--out``, a PNG of the ratios next to it.

    python benchmarks/autotune_bench.py --out benchmarks/plots/autotune.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import prestage
from prestage.bench.emulator import EmulatorError, PfsEmulator
from prestage.bench.grid import Job, best, counts, pipelined_jobs, run_jobs
from prestage.bench.modes import Setup
from prestage.bench.session import machine, note

OLD = Job("pipelined", prefetchers=4, readers=2, lookahead=4, autotune=False)
AUTO = Job("pipelined", prefetchers=None, readers=None, lookahead=None)
MACHINE = Job("pipelined", prefetchers=None, readers=None, lookahead=None, autotune=False)

# name: (emulated PFS as (latency ms, MB/s, operations at once) or None for the page cache,
#        packed shards, consumer's compute ms per batch)
SCENARIOS: Dict[str, Any] = {
    "pagecache": (None, False, 0.0),
    "pfs200": ((2.0, 200.0, 64), False, 0.0),
    "pfs2000": ((2.0, 2000.0, 64), False, 0.0),
    "pfs2000-packed": ((2.0, 2000.0, 64), True, 0.0),
    "pfs2000-compute10": ((2.0, 2000.0, 64), False, 10.0),
    "pfs2000-compute100": ((2.0, 2000.0, 64), False, 100.0),
}


def _label(job: Job) -> str:
    if job.autotune and job.readers is None:
        return f"auto-p{job.prefetchers}"
    if job == AUTO:
        return "auto"
    if job == OLD:
        return "old"
    if job == MACHINE:
        return "machine"
    return f"r{job.readers}-p{job.prefetchers}-l{job.lookahead}"


def _scenario(name: str, data: Path, work: Path, args: argparse.Namespace) -> Dict[str, Any]:
    emulate, packed, compute_ms = SCENARIOS[name]
    emulator: Optional[PfsEmulator] = None
    root = data
    if emulate is not None:
        latency, mbs, ops = emulate
        emulator = PfsEmulator(data, latency_ms=latency, bandwidth_mbs=mbs, max_ops=ops)
        root = emulator.start()
    try:
        pfs_root = root / ("packed" if packed else "loose")
        catalog = prestage.Catalog.from_shards(pfs_root) if packed else prestage.Catalog.from_folder(pfs_root)
        paths = [catalog.path(i) for i in range(len(catalog))]
        labels = [catalog.label(i) for i in range(len(catalog))]
        loose = data / "loose"
        sizes = [p.stat().st_size for p in loose.rglob("*.jpg")]
        setup = Setup(source=data, pfs_root=pfs_root, work_dir=work, paths=paths, labels=labels,
                      classes=list(catalog.classes), mean_file_bytes=sum(sizes) / len(sizes),
                      batch_size=args.batch_size, compute_ms=compute_ms,
                      cold="none" if emulate is None else args.cold, emulator=emulator,
                      show_progress=False)
        setup.keep_catalog(pfs_root, catalog)
        candidates = [Job("pipelined", prefetchers=n, readers=None, lookahead=None, autotune=True)
                      for n in args.auto_prefetchers]
        jobs = ([AUTO] + candidates + pipelined_jobs(args.prefetchers, args.readers, args.lookahead)
                + [OLD, MACHINE])
        jobs = [Job(j.mode, j.prefetchers, j.readers, j.lookahead, autotune=False)
                if j.autotune is None and j != AUTO else j for j in jobs]
        batches = args.batches if compute_ms < 50 else args.batches_slow
        start = time.perf_counter()
        summaries = run_jobs(setup, jobs, batches, args.repeat, name, show_progress=False,
                             on_run=lambda job, r: note(f"  {name} {_label(job):>12}: "
                                                        f"{r['images_per_s']:7.0f} images/s"))
        elapsed = time.perf_counter() - start
    finally:
        if emulator is not None:
            emulator.stop()
    by_label = {_label(j): s for j, s in zip(jobs, summaries)}
    grid = [s for j, s in zip(jobs, summaries)
            if _label(j) not in ("old", "machine") and not _label(j).startswith("auto")]
    top = best(grid)
    auto = by_label["auto"]
    tunings = [r["tuning"] for r in auto["runs"]]
    settled = [t["settled_s"] for t in tunings if "settled_s" in t]
    return {
        "scenario": name,
        "emulated": None if emulate is None else {"latency_ms": emulate[0], "bandwidth_mbs": emulate[1],
                                                  "max_ops": emulate[2]},
        "packed": packed,
        "compute_ms": compute_ms,
        "images_in_set": len(paths),
        "batches_per_run": batches,
        "seconds": round(elapsed, 1),
        "images_per_s": {k: s["images_per_s"] for k, s in by_label.items()},
        "best": {"label": _label(Job("pipelined", top["prefetchers"], top["readers"], top["lookahead"])),
                 "images_per_s": top["images_per_s"]},
        "auto_over_best": auto["images_per_s"] / top["images_per_s"],
        "auto_over_old": auto["images_per_s"] / by_label["old"]["images_per_s"],
        "machine_over_best": by_label["machine"]["images_per_s"] / top["images_per_s"],
        "candidates_over_best": {_label(j): by_label[_label(j)]["images_per_s"] / top["images_per_s"]
                                 for j in candidates},
        "settled_s": statistics.median(settled) if settled else None,
        "auto_run_s": statistics.median(r["seconds"] for r in auto["runs"]),
        "auto_started": auto["runs"][0]["chosen"],
        "threads_why": auto["runs"][0]["threads_why"],
        "auto_final": [{k: t.get(k) for k in ("readers", "reads_in_flight", "lookahead", "steps_kept",
                                              "steps_undone", "settled_s")} for t in tunings],
        "auto_log": tunings[len(tunings) // 2].get("log", []),
        "other_cpu_s": {k: s["other_cpu_s"] for k, s in by_label.items()},
        "runs": {k: [{"images_per_s": r["images_per_s"], "seconds": r["seconds"], "pfs": r["pfs"]}
                     for r in s["runs"]] for k, s in by_label.items()},
    }


def _plot(results: List[Dict[str, Any]], out: Path) -> Optional[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        note("no matplotlib: no figure")
        return None
    names = [r["scenario"] for r in results]
    x = range(len(names))
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.27
    ax.bar([i - width for i in x], [r["auto_over_best"] for r in results], width, label="auto / best grid")
    ax.bar(list(x), [r["machine_over_best"] for r in results], width, label="machine-sized, fixed / best")
    ax.bar([i + width for i in x], [r["auto_over_best"] / r["auto_over_old"] for r in results], width,
           label="old defaults / best")
    ax.axhline(0.9, color="k", linestyle="--", linewidth=1, label="target 0.9")
    ax.set_xticks(list(x))
    ax.set_xticklabels(names, rotation=15)
    ax.set_ylabel("images/s relative to the best grid point")
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(f"prestage with no thread option ({os.cpu_count()} cores)")
    fig.tight_layout()
    path = out.with_suffix(".png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=1500, help="synthetic images in the set (default 1500)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--batches", type=int, default=40, help="batches per run (default 40)")
    p.add_argument("--batches-slow", type=int, default=40,
                   help="batches per run with a consumer of 50 ms or more per batch (default 40)")
    p.add_argument("--repeat", type=int, default=3, help="runs per configuration (default 3)")
    p.add_argument("--readers", type=counts, default=[1, 2])
    p.add_argument("--prefetchers", type=counts, default=[4, 16, 64])
    p.add_argument("--lookahead", type=counts, default=[2, 8])
    p.add_argument("--auto-prefetchers", type=counts, default=[],
                   help="also run auto starting from each of these reads in flight, held (auto-pN)")
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated, of: " + ", ".join(SCENARIOS))
    p.add_argument("--cold", default="fadvise", help="how emulated runs start cold (see prestage bench)")
    p.add_argument("--work-dir", type=Path, default=None, help="local disk for data and stage dirs")
    p.add_argument("--out", type=Path, default=Path("autotune.json"))
    args = p.parse_args(argv)
    names = [n for n in args.scenarios.split(",") if n]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        p.error(f"unknown scenarios {unknown}")

    from prestage.cli.demo import default_source

    import prestage.pack

    work = Path(tempfile.mkdtemp(prefix="prestage-autotune-", dir=args.work_dir))
    results: List[Dict[str, Any]] = []
    try:
        data = work / "pfs"
        shutil.copytree(default_source(args.images, 10, True), data / "loose")
        prestage.pack.pack(prestage.Catalog.from_folder(data / "loose"), data / "packed", shard_bytes=4 << 20)
        stage = work / "stage"
        stage.mkdir()
        for name in names:
            try:
                result = _scenario(name, data, stage, args)
            except EmulatorError as e:
                note(f"{name}: skipped, no emulator ({e})")
                continue
            results.append(result)
            note(f"{name}: auto {result['images_per_s']['auto']:.0f}, best {result['best']['label']} "
                 f"{result['best']['images_per_s']:.0f}, old {result['images_per_s']['old']:.0f} images/s: "
                 f"auto/best {result['auto_over_best']:.2f}, auto/old {result['auto_over_old']:.2f}, "
                 f"settled at {result['settled_s']} s of {result['auto_run_s']:.1f} s; "
                 f"final {result['auto_final']}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    doc = {"command": " ".join([os.path.basename(sys.argv[0])] + (argv if argv is not None else sys.argv[1:])),
           "machine": machine({"work": Path(tempfile.gettempdir())}),
           "grid": {"readers": args.readers, "prefetchers": args.prefetchers, "lookahead": args.lookahead},
           "repeat": args.repeat, "batch_size": args.batch_size, "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    figure = _plot(results, args.out)
    print(f"{'scenario':20} {'auto':>7} {'best':>7} {'(point)':>12} {'old':>7} {'machine':>7} "
          f"{'a/best':>6} {'a/old':>6} {'settled':>8}  final (readers, reads in flight, lookahead)")
    for r in results:
        ips = r["images_per_s"]
        finals = "; ".join(f"{f['readers']},{f['reads_in_flight']},{f['lookahead']}" for f in r["auto_final"])
        print(f"{r['scenario']:20} {ips['auto']:7.0f} {r['best']['images_per_s']:7.0f} {r['best']['label']:>12} "
              f"{ips['old']:7.0f} {ips['machine']:7.0f} {r['auto_over_best']:6.2f} {r['auto_over_old']:6.2f} "
              f"{r['settled_s'] if r['settled_s'] is not None else float('nan'):7.2f}s  {finals}")
    print(f"JSON: {args.out}" + (f", figure: {figure}" if figure else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
