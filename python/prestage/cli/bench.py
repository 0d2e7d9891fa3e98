"""prestage bench: how much faster, and with how many threads, on this machine's file systems.

It runs the modes of Serizawa & Tatebe (BDCAT'19) on the same data, from cold caches, each --repeat
times (medians are reported):

  direct      stage 3 decodes straight from SOURCE (the PFS); no staging
  stage-all   copy every file to the stage directory first (--prefetchers threads), then read the copy;
              the copy time and the read time are both reported
  pipelined   prestage: stage 2 copies the next --lookahead batches while stage 3 decodes
  ideal       the data already on local disk and in the page cache (no I/O: the decode-only limit)
  torch       PyTorch DataLoader + torchvision ImageFolder, same transform, num_workers = cores,
              pin_memory=True, reading SOURCE
  tf          tf.data: parallel map (AUTOTUNE) + prefetch(AUTOTUNE), reading SOURCE

With --grid it first runs the grid prefetchers x readers x lookahead (a bounded number of batches per
point) for the pipelined mode, and the other modes along the readers axis (and stage-all along the
prefetchers axis); the best pipelined point is then used for the full runs, and stage-all copies with
its own best number of threads.

With --cache-bytes, a stage directory smaller than the data set is read for --epochs epochs with each
--eviction policy (clairvoyant: Belady's rule over the known plan; lru), after the other runs and with
their thread counts: per epoch, hits, misses, evictions and bytes read from the source.

With --emulate, SOURCE is served through prestage-pfs, a FUSE file system that adds a latency per
operation, a bandwidth cap and a concurrency cap: the paper's experiment on one machine.

Output: a table (images/s, MB/s, times, consumer stall, per-stage busy/idle thread-seconds, PFS
operations), the paper's ratios against their targets, and with --out DIR: results.json and PNG figures
(elapsed time against prefetch threads and against decode threads).

Example (the experiment of benchmarks/RESULTS.md):

  prestage synth /data/synth-20k --images 20000 --classes 100
  prestage bench /data/synth-20k --stage-dir /local/ssd --emulate --latency-ms 2 --bandwidth-mbs 200 \\
      --grid --out results/
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from prestage.bench import report
from prestage.bench.cache_study import EVICTIONS, format_cache_study, parse_size, run_cache_study
from prestage.bench.grid import Job, add_grid_options, run_jobs, summarize
from prestage.bench.modes import MODES, run_mode
from prestage.bench.session import (add_data_options, add_emulator_options, machine, note, positive,
                                    session)
from prestage.cli import summary


def _modes(text: str) -> List[str]:
    names = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"modes are {', '.join(MODES)}; got {text!r}")
    return [m for m in MODES if m in names]  # the paper's order, whatever the order given


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bench",
        help=summary("bench"),
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_data_options(p, default_batches=None)
    g = p.add_argument_group("modes and threads")
    g.add_argument("--modes", type=_modes, default=list(MODES), metavar="LIST",
                   help=f"comma-separated modes to run, of {','.join(MODES)} (default: all; a baseline "
                        "whose framework is not installed is skipped with a note)")
    g.add_argument("--prefetchers", type=positive, default=None, metavar="N",
                   help="stage 2 threads of pipelined, copy threads of stage-all (default: the loader's "
                        "own, as a user who sets nothing gets: sized to the machine and self-tuned; "
                        "stage-all copies with 8; with --grid: the best grid point's of each)")
    g.add_argument("--readers", type=positive, default=None, metavar="N",
                   help="stage 3 (decode) threads of the prestage modes (default: the loader's own, "
                        "sized to the machine and self-tuned; with --grid: the best grid point's)")
    g.add_argument("--lookahead", type=positive, default=None, metavar="N",
                   help="batches stage 2 works on ahead of stage 3 (default: the loader's own, sized "
                        "to the machine and self-tuned; with --grid: the best grid point's)")
    g.add_argument("--workers", type=positive, default=None, metavar="N",
                   help="PyTorch DataLoader workers and tf.data map calls (default: the number of cores "
                        "for PyTorch, AUTOTUNE for tf.data)")
    g.add_argument("--repeat", type=positive, default=3, metavar="N",
                   help="runs of each mode; medians are reported (default 3)")
    g = p.add_argument_group("grid")
    g.add_argument("--grid", action="store_true",
                   help="run the grid first and take its best pipelined point for the full runs")
    add_grid_options(g, "grid-", lookahead=[2, 8])
    g.add_argument("--grid-batches", type=positive, default=30, metavar="N",
                   help="batches read at each grid point (default 30)")
    g.add_argument("--grid-repeat", type=positive, default=None, metavar="N",
                   help="runs of each grid point (default: --repeat)")
    g.add_argument("--grid-only", action="store_true", help="run the grid only, not the full runs")
    g = p.add_argument_group("a stage directory smaller than the data set")
    g.add_argument("--cache-bytes", type=_cache_size, default=None, metavar="SIZE",
                   help="bound the stage directory to SIZE: bytes with an optional K, M, G or T suffix "
                        "(powers of 1024), or a percentage of the data set such as 25%%; reads --epochs "
                        "epochs with each --eviction policy and reports hits, misses, evictions and bytes "
                        "read from the source per epoch")
    g.add_argument("--epochs", type=positive, default=4, metavar="N",
                   help="epochs read with the bounded stage directory, the first one cold (default 4)")
    g.add_argument("--eviction", type=_evictions, default=list(EVICTIONS), metavar="LIST",
                   help=f"eviction policies to compare, of {','.join(EVICTIONS)} (default: both)")
    g.add_argument("--cache-only", action="store_true",
                   help="with --cache-bytes: run the bounded stage directory only, not the modes")
    add_emulator_options(p)
    g = p.add_argument_group("output")
    g.add_argument("--out", type=Path, metavar="DIR",
                   help="write results.json and the PNG figures into DIR (created)")
    g.add_argument("--json", action="store_true", help="print the results as JSON instead of tables")
    return p


def _cache_size(text: str) -> str:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _evictions(text: str) -> List[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [n for n in names if n not in EVICTIONS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"unknown eviction policy {', '.join(unknown) or text!r}; "
                                         f"give some of {','.join(EVICTIONS)}")
    return list(dict.fromkeys(names))


def _check_modes(args: argparse.Namespace) -> List[str]:
    import prestage

    modes = list(args.modes)
    if args.transform != "center-crop" and "transform" not in inspect.signature(prestage.Loader).parameters:
        raise ValueError(f"--transform {args.transform}: this prestage has no such transform")
    needs = {"torch": ("torch", "torchvision"), "tf": ("tensorflow",)}
    for mode, modules in needs.items():
        if mode not in modes:
            continue
        missing = [m for m in modules if importlib.util.find_spec(m) is None]
        if missing:
            note(f"prestage bench: skipping the {mode} baseline: {', '.join(missing)} not installed "
                 f"(scripts/bench-setup.sh installs them)")
            modes.remove(mode)
        elif mode == "tf" and args.transform != "center-crop":
            note("prestage bench: skipping the tf baseline: it implements the center-crop transform only")
            modes.remove(mode)
    return modes


def _grid_jobs(args: argparse.Namespace, modes: List[str]) -> List[Job]:
    jobs: List[Job] = []
    top_r = max(args.grid_readers)
    for r in args.grid_readers:
        if "pipelined" in modes:
            jobs += [Job("pipelined", p, r, la) for p in args.grid_prefetchers for la in args.grid_lookahead]
        if "stage-all" in modes:
            jobs += [Job("stage-all", p, r, 1) for p in args.grid_prefetchers]
        for mode in ("direct", "ideal"):
            if mode in modes:
                jobs.append(Job(mode, 1, r, 1))
        for mode in ("torch", "tf"):
            if mode in modes:
                jobs.append(Job(mode, 1, top_r, 1, workers=r))
    return jobs


def _log_run(args: argparse.Namespace, total: int) -> Optional[Callable[[Job, Dict[str, Any]], None]]:
    """A line per grid run for logs (stderr not a terminal: no progress bar there)."""
    if args.quiet or sys.stderr.isatty():
        return None
    done = [0]

    def log(job: Job, r: Dict[str, Any]) -> None:
        done[0] += 1
        note(f"  grid {done[0]}/{total} {job.mode:<9} {report.format_options(r['options']):<18} "
             f"{r['seconds']:7.2f} s {r['images_per_s']:7.0f} images/s")

    return log


def _grid_ratios(grid: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """pipelined (best prefetchers and lookahead) over direct, at each number of decode threads."""
    out = []
    for r in sorted({s["readers"] for s in grid if s["mode"] == "direct"}):
        direct = [s for s in grid if s["mode"] == "direct" and s["readers"] == r]
        pipelined = [s for s in grid if s["mode"] == "pipelined" and s["readers"] == r]
        if direct and pipelined:
            best = max(pipelined, key=lambda s: s["images_per_s"])
            out.append({"readers": r, "prefetchers": best["prefetchers"], "lookahead": best["lookahead"],
                        "pipelined_images_per_s": best["images_per_s"],
                        "direct_images_per_s": direct[0]["images_per_s"],
                        "speedup": best["images_per_s"] / direct[0]["images_per_s"]})
    return out


def run(args: argparse.Namespace) -> int:
    import prestage

    if args.grid_repeat is None:
        args.grid_repeat = args.repeat
    try:
        if args.cache_only and args.cache_bytes is None:
            raise ValueError("--cache-only needs --cache-bytes")
        modes = _check_modes(args)
        with session(args, "bench") as (setup, info):
            result: Dict[str, Any] = {
                "argv": sys.argv[1:],
                "machine": machine({"source": setup.source, "stage": setup.work_dir}),
                "session": info,
                "settings": {"batch_size": args.batch_size, "image_size": args.image_size,
                             "transform": args.transform, "depth": args.depth, "compute_ms": args.compute_ms,
                             "seed": args.seed, "cold": args.cold, "repeat": args.repeat,
                             "batches": args.batches},
                "grid": [], "grid_ratios": [], "headline": [], "ratios": [], "runs": [],
            }
            note(f"cold caches: {info['cache_method']}; {info['images_in_set']} images, "
                 f"{info['mean_file_bytes'] / 1e3:.1f} KB on average")
            prefetchers, readers, lookahead = args.prefetchers, args.readers, args.lookahead
            copy_threads = prefetchers  # stage-all's (None: 8)
            if args.grid:
                jobs = _grid_jobs(args, modes)
                grid = run_jobs(setup, jobs, args.grid_batches, args.grid_repeat, "grid",
                                on_run=_log_run(args, len(jobs) * args.grid_repeat))
                result["grid"] = grid
                result["grid_ratios"] = _grid_ratios(grid)
                best = max((s for s in grid if s["mode"] == "pipelined"),
                           key=lambda s: s["images_per_s"], default=None)
                if best is not None:
                    prefetchers, readers, lookahead = best["prefetchers"], best["readers"], best["lookahead"]
                    note(f"best grid point: prefetchers={prefetchers} readers={readers} "
                         f"lookahead={lookahead} ({best['images_per_s']:.0f} images/s)")
                # stage-all gets its own best copy threads (at the same readers), not pipelined's.
                copies = [s for s in grid if s["mode"] == "stage-all" and s["readers"] == readers]
                copy_threads = max(copies, key=lambda s: s["images_per_s"])["prefetchers"] \
                    if copies else prefetchers
            result["chosen"] = {"prefetchers": prefetchers, "readers": readers, "lookahead": lookahead,
                                "stage_all_prefetchers": copy_threads}
            if not args.grid_only and not (args.cache_only and args.cache_bytes is not None):
                runs: Dict[str, List[Dict[str, Any]]] = {m: [] for m in modes}
                for repeat in range(args.repeat):
                    for mode in modes:
                        threads = copy_threads if mode == "stage-all" else prefetchers
                        r = run_mode(setup, mode, threads, readers, lookahead, epoch=repeat,
                                     batches=args.batches, workers=args.workers)
                        runs[mode].append(r)
                        result["runs"].append(r)
                        if not args.quiet:
                            note(f"  run {repeat + 1}/{args.repeat} {mode:<9} {r['seconds']:7.2f} s "
                                 f"{r['images_per_s']:7.0f} images/s  stall {r['stall_s']:.2f} s")
                headline = []
                for mode in modes:
                    threads = copy_threads if mode == "stage-all" else prefetchers
                    s = summarize(Job(mode, threads, readers, lookahead, args.workers), runs[mode])
                    first = runs[mode][0]
                    for key in ("options", "stages", "pfs", "cache", "hits", "misses", "pinned",
                                "pinned_why", "version", "index_s", "chosen", "threads_why"):
                        if key in first:
                            s[key] = first[key]
                    s["stages"] = _median_stages(runs[mode])
                    s["seconds_all"] = [r["seconds"] for r in runs[mode]]
                    if runs[mode][0].get("tuning"):
                        s["tuning"] = [r["tuning"] for r in runs[mode]]
                    s.pop("runs")
                    headline.append(s)
                result["headline"] = headline
                result["ratios"] = report.ratios({s["mode"]: s for s in headline})
            if args.cache_bytes is not None and not args.grid_only:
                result["cache_study"] = run_cache_study(setup, args.cache_bytes, args.eviction, args.epochs,
                                                        prefetchers, readers, lookahead)
            if args.out is not None:
                _write_outputs(args, result)
    except KeyboardInterrupt:
        note("prestage bench: interrupted; the emulated PFS is unmounted and temporary files removed")
        return 130
    except (prestage.Error, ValueError, OSError, RuntimeError) as e:
        note(f"prestage bench: {e}")
        return 2
    if args.json:
        print(json.dumps(result, indent=1, default=str))
    else:
        print(format_result(result))
    return 0


def _format_chosen(headline: List[Dict[str, Any]]) -> List[str]:
    """The values each prestage mode's loader started with, why, and where its self-tuning took
    them (one line per run)."""
    lines: List[str] = []
    for s in headline:
        chosen = s.get("chosen")
        if not chosen:
            continue
        why = s.get("threads_why") or "given"
        lines.append(f"{s['mode']}: readers={chosen['readers']} prefetchers={chosen['prefetchers']} "
                     f"lookahead={chosen['lookahead']} ({why})")
        for i, t in enumerate(s.get("tuning") or []):
            if not t.get("on"):
                lines.append(f"  run {i + 1}: self-tuning off")
                continue
            lines.append(f"  run {i + 1}: self-tuned to readers={t['readers']} "
                         f"reads_in_flight={t['reads_in_flight']} lookahead={t['lookahead']} "
                         f"({t['steps_kept']} steps kept, {t['steps_undone']} undone, "
                         f"settled at {t['settled_s']:.2f} s)")
    return ["", "loader values:"] + lines if lines else []


def _median_stages(runs: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    if not runs or not runs[0].get("stages"):
        return None
    return {name: {k: statistics.median(r["stages"][name][k] for r in runs) for k in ("busy_s", "idle_s")}
            for name in runs[0]["stages"]}


def _write_outputs(args: argparse.Namespace, result: Dict[str, Any]) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    chosen = result["chosen"]
    batches = "one epoch" if args.batches is None else f"{args.batches} batches"
    try:
        from prestage.bench.plots import plot_all

        written = plot_all(args.out, result["grid"], result["headline"], chosen["readers"],
                           chosen["prefetchers"], f"{args.grid_batches} batches of {args.batch_size}",
                           f"{batches}, batches of {args.batch_size}")
        result["plots"] = [str(p) for p in written]
    except ImportError:
        note("prestage bench: no figures (matplotlib is not installed)")
    if result.get("cache_study"):
        try:
            from prestage.bench.cache_study import plot_cache_study

            result.setdefault("plots", []).append(str(plot_cache_study(result["cache_study"], args.out)))
        except ImportError:
            pass  # said above
    (args.out / "results.json").write_text(json.dumps(result, indent=1, default=str) + "\n")


def format_result(result: Dict[str, Any]) -> str:
    info = result["session"]
    m = result["machine"]
    lines = [
        f"machine   {m.get('cpu', '?')}, {m['cores']} cores, {m.get('memory_gib', '?')} GiB, "
        f"Linux {m['kernel']}; source on {m.get('source_fs')}, stage directory on {m.get('stage_fs')}",
        f"data      {info['images_in_set']} images, {info['mean_file_bytes'] / 1e3:.1f} KB mean, "
        f"catalog walked through the PFS in {info['catalog_s']:.1f} s (once; a training job saves it)",
    ]
    if info["emulated"]:
        e = info["emulator"]
        lines.append(f"PFS       emulated: {e['latency_ms']:g} ms per operation, "
                     f"{e['bandwidth_mbs']:g} MB/s, {e['max_ops']} operations at once")
    else:
        lines.append(f"PFS       {info['source']} as it is"
                     + (f" (emulator unavailable: {info['emulator_error']})" if "emulator_error" in info
                        else ""))
    lines.append(f"caches    cold runs by {info['cache_method']}; ideal runs warm")
    if result["grid"]:
        lines += ["", "grid (median of each point's runs):", report.format_grid(result["grid"], limit=8)]
        for g in result["grid_ratios"]:
            lines.append(f"  readers={g['readers']}: pipelined (P={g['prefetchers']}, L={g['lookahead']}) "
                         f"{g['pipelined_images_per_s']:.0f} images/s / direct {g['direct_images_per_s']:.0f}"
                         f" = {g['speedup']:.2f}x")
    if result["headline"]:
        s = result["settings"]
        what = "whole epoch" if s["batches"] is None else f"{s['batches']} batches"
        lines += ["", f"full runs ({what}, median of {s['repeat']}):",
                  report.format_table(result["headline"])]
        lines += _format_chosen(result["headline"])
        if result["ratios"]:
            lines += ["", report.format_ratios(result["ratios"])]
    if result.get("cache_study"):
        lines += ["", format_cache_study(result["cache_study"])]
    if result.get("plots"):
        lines += ["", "figures: " + ", ".join(result["plots"])]
    return "\n".join(lines)
