"""The tuning grid: prefetchers x readers x lookahead, each point repeated, summarised by medians.

``prestage tune`` searches it for the pipelined mode alone; ``prestage bench --grid`` also runs the other
modes along the axes of the paper's figures (prefetch threads, decode threads).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import statistics
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

from prestage.bench.modes import Setup, run_mode
from prestage.cli.progress import progress

__all__ = ["Job", "counts", "default_readers", "add_grid_options", "run_jobs", "summarize", "pipelined_jobs", "best"]

#: The figures a summary gives the median of (over a point's repeats).
MEDIAN_KEYS = ("seconds", "images_per_s", "mb_per_s", "stall_s", "epoch_s", "copy_s", "other_cpu_s",
               "window_s")


def counts(text: str) -> List[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]`` (an argparse type): positive integers, sorted, no repeats."""
    try:
        values = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def default_readers() -> List[int]:
    """Stage 3 thread counts a grid tries by default: 1, the powers of two below the core count,
    and the core count."""
    cores = os.cpu_count() or 1
    return sorted({1, cores} | {2 ** k for k in range(1, cores.bit_length()) if 2 ** k < cores})


def add_grid_options(g: "argparse._ArgumentGroup", prefix: str, lookahead: List[int]) -> None:
    """The grid's axes as options of ``g``: ``--{prefix}prefetchers``, ``--{prefix}readers`` and
    ``--{prefix}lookahead`` (``prestage bench --grid-...``, ``prestage tune --...``)."""
    readers = default_readers()
    g.add_argument(f"--{prefix}prefetchers", type=counts, default=[1, 2, 4, 8, 16, 32], metavar="LIST",
                   help="stage 2 (copy) threads to try, comma-separated (default 1,2,4,8,16,32)")
    g.add_argument(f"--{prefix}readers", type=counts, default=readers, metavar="LIST",
                   help="stage 3 (decode) threads to try (default: 1, powers of two and the number "
                        f"of cores: {','.join(map(str, readers))} here)")
    g.add_argument(f"--{prefix}lookahead", type=counts, default=lookahead, metavar="LIST",
                   help="batches stage 2 may work on ahead of stage 3, to try (default "
                        f"{','.join(map(str, lookahead))})")


@dataclasses.dataclass(frozen=True)
class Job:
    """One point of a grid: a mode and its thread counts (``workers``: the baselines'). A count of
    None, and ``autotune`` None, are left to the loader's defaults (see :func:`run_mode`)."""

    mode: str
    prefetchers: Optional[int] = 1
    readers: Optional[int] = 1
    lookahead: Optional[int] = 1
    workers: Optional[int] = None
    autotune: Optional[bool] = None

    def key(self) -> Dict[str, Any]:
        key = {"mode": self.mode, "prefetchers": self.prefetchers, "readers": self.readers,
               "lookahead": self.lookahead, "workers": self.workers}
        if self.autotune is not None:
            key["autotune"] = self.autotune
        return key


def pipelined_jobs(prefetchers: Iterable[int], readers: Iterable[int],
                   lookahead: Iterable[int]) -> List[Job]:
    return [Job("pipelined", p, r, la) for r, p, la in itertools.product(readers, prefetchers, lookahead)]


def summarize(job: Job, runs: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """A point's figures: the median over its runs of each of MEDIAN_KEYS, and the runs themselves."""
    summary: Dict[str, Any] = dict(job.key())
    for key in MEDIAN_KEYS:
        values = [r[key] for r in runs if r.get(key) is not None]
        summary[key] = statistics.median(values) if values else None
    summary["images"] = runs[0]["images"] if runs else 0
    summary["repeats"] = len(runs)
    summary["runs"] = list(runs)
    return summary


def run_jobs(setup: Setup, jobs: Sequence[Job], batches: Optional[int], repeat: int, desc: str,
             first_epoch: int = 1, on_run: Optional[Callable[[Job, Dict[str, Any]], None]] = None,
             show_progress: bool = True) -> List[Dict[str, Any]]:
    """Runs every job ``repeat`` times, round-robin (a slow drift of the machine touches every point
    alike); each run reads ``batches`` batches of an epoch of its own (``first_epoch`` onwards), so that
    no run finds the files of the previous one in a cache. Returns one summary per job, in order."""
    runs: Dict[Job, List[Dict[str, Any]]] = {job: [] for job in jobs}
    epoch = first_epoch
    total = len(jobs) * repeat
    shown = setup.show_progress
    setup.show_progress = False  # one bar for the grid, none per run
    try:
        with progress(total, desc=desc, unit="run", enabled=show_progress and shown) as bar:
            for _ in range(repeat):
                for job in jobs:
                    result = run_mode(setup, job.mode, job.prefetchers, job.readers, job.lookahead,
                                      epoch=epoch, batches=batches, workers=job.workers,
                                      autotune=job.autotune)
                    epoch += 1
                    runs[job].append(result)
                    if on_run is not None:
                        on_run(job, result)
                    bar.update(1)
    finally:
        setup.show_progress = shown
    return [summarize(job, runs[job]) for job in jobs]


def best(summaries: Sequence[Dict[str, Any]], mode: str = "pipelined") -> Optional[Dict[str, Any]]:
    """The point of ``mode`` with the highest median images/s."""
    points = [s for s in summaries if s["mode"] == mode and s["images_per_s"]]
    return max(points, key=lambda s: s["images_per_s"]) if points else None
