"""Figures like the paper's: elapsed time against prefetch threads and against decode threads.

Each figure has two panels. Left: the median elapsed time of the grid's runs, one line per mode and
baseline (modes that do not use the axis's threads are drawn flat, dashed). Right: where the time of the
two staging modes goes, stacked: stage-all's copy, then its read; pipelined's stage 3 (decode) busy
time per thread, then the time it waited (on stage 2, or on the consumer). matplotlib is imported here
only, with the Agg backend (no display needed).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

__all__ = ["plot_all"]

_COLORS = {"pipelined": "#1f77b4", "stage-all": "#ff7f0e", "direct": "#d62728", "ideal": "#2ca02c",
           "torch": "#9467bd", "tf": "#8c564b"}
_LABELS = {"pipelined": "pipelined (prestage)", "stage-all": "stage-all (copy + read)",
           "direct": "direct from PFS", "ideal": "ideal (local, warm)",
           "torch": "PyTorch DataLoader", "tf": "tf.data"}


def _pick(summaries: Sequence[Dict[str, Any]], mode: str, **fixed: Any) -> List[Dict[str, Any]]:
    return [s for s in summaries if s["mode"] == mode and s["seconds"]
            and all(s.get(k) == v for k, v in fixed.items())]


def _fastest(points: Sequence[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    return min(points, key=lambda s: s["seconds"]) if points else None


def _series(summaries: Sequence[Dict[str, Any]], axis: str, values: Sequence[int], readers: int,
            prefetchers: int) -> Dict[str, List[Optional[Dict[str, Any]]]]:
    """For each mode, the point drawn at each value of the axis (``None`` where there is none)."""
    out: Dict[str, List[Optional[Dict[str, Any]]]] = {}
    for mode in ("pipelined", "stage-all", "direct", "ideal", "torch", "tf"):
        row: List[Optional[Dict[str, Any]]] = []
        for v in values:
            if axis == "prefetchers":
                if mode in ("pipelined", "stage-all"):
                    row.append(_fastest(_pick(summaries, mode, prefetchers=v, readers=readers)))
                elif mode in ("torch", "tf"):
                    row.append(_fastest(_pick(summaries, mode, workers=readers)))
                else:
                    row.append(_fastest(_pick(summaries, mode, readers=readers)))
            else:
                if mode in ("torch", "tf"):
                    row.append(_fastest(_pick(summaries, mode, workers=v)))
                else:
                    row.append(_fastest(_pick(summaries, mode, readers=v)))
        if any(p is not None for p in row):
            out[mode] = row
    return out


def _decode_busy_per_thread(point: Dict[str, Any]) -> float:
    """Median over a point's runs of stage 3's busy time per reader thread, in seconds."""
    values = [r["stages"]["decode"]["busy_s"] / max(1, r["options"].get("readers", 1))
              for r in point.get("runs", []) if r.get("stages")]
    return statistics.median(values) if values else 0.0


def _seconds_axis(axis: Any) -> None:
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if str(f"{v:g}")[0] in "25" else ""))


def _figure(summaries: Sequence[Dict[str, Any]], axis: str, values: Sequence[int], readers: int,
            prefetchers: int, title: str, out: Path, batches_note: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = _series(summaries, axis, values, readers, prefetchers)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=90)
    flat = {"prefetchers": ("direct", "ideal", "torch", "tf"), "readers": ()}[axis]
    for mode, row in series.items():
        xs = [v for v, p in zip(values, row) if p is not None]
        ys = [p["seconds"] for p in row if p is not None]
        left.plot(xs, ys, marker="o", color=_COLORS[mode], label=_LABELS[mode],
                  linestyle="--" if mode in flat else "-")
    left.set_xscale("log", base=2)
    left.set_xticks(list(values))
    left.set_xticklabels([str(v) for v in values])
    left.set_yscale("log")
    _seconds_axis(left.yaxis)
    left.set_xlabel({"prefetchers": "prefetch (stage 2) threads",
                     "readers": "decode threads (stage 3 readers; baselines: workers)"}[axis])
    left.set_ylabel(f"elapsed time, s ({batches_note})")
    left.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=8)
    left.set_title(title, fontsize=10)

    width = 0.38
    positions = range(len(values))
    for offset, mode in ((-width / 2, "stage-all"), (width / 2, "pipelined")):
        bars = series.get(mode)
        if bars is None:
            continue
        if mode == "stage-all":
            bottom = [(p["copy_s"] or 0) if p else 0 for p in bars]
            top = [(p["seconds"] - (p["copy_s"] or 0)) if p else 0 for p in bars]
            labels = ("stage-all: copy", "stage-all: read")
        else:
            bottom = [min(_decode_busy_per_thread(p), p["seconds"]) if p else 0 for p in bars]
            top = [(p["seconds"] - b) if p else 0 for p, b in zip(bars, bottom)]
            labels = ("pipelined: stage 3 busy", "pipelined: stage 3 waiting")
        bar_xs = [i + offset for i in positions]
        right.bar(bar_xs, bottom, width, color=_COLORS[mode], alpha=0.9, label=labels[0])
        right.bar(bar_xs, top, width, bottom=bottom, color=_COLORS[mode], alpha=0.4, hatch="//",
                  label=labels[1])
    right.set_xticks(list(positions))
    right.set_xticklabels([str(v) for v in values])
    right.set_xlabel(left.get_xlabel())
    right.set_ylabel("elapsed time, s")
    right.set_title("where the time goes", fontsize=10)
    right.legend(fontsize=8)
    right.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def _modes_figure(headline: Sequence[Dict[str, Any]], out: Path, note: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [s for s in headline if s.get("seconds")]
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(rows) + 1.4), dpi=90)
    for i, s in enumerate(rows):
        mode = s["mode"]
        copy = s.get("copy_s") or 0
        ax.barh(i, copy, color=_COLORS.get(mode, "grey"), alpha=0.9)
        ax.barh(i, s["seconds"] - copy, left=copy, color=_COLORS.get(mode, "grey"),
                alpha=0.5 if copy else 0.9)
        ax.text(s["seconds"], i, f" {s['seconds']:.1f} s, {s['images_per_s']:.0f} img/s", va="center",
                fontsize=8)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([_LABELS.get(s["mode"], s["mode"]) for s in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"elapsed time, s ({note}; stage-all: copy, then read)")
    ax.set_xlim(0, max(s["seconds"] for s in rows) * 1.35)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def plot_all(out_dir: Path, grid: Sequence[Dict[str, Any]], headline: Sequence[Dict[str, Any]],
             readers: int, prefetchers: int, grid_note: str, headline_note: str,
             prefix: str = "") -> List[Path]:
    """Writes the figures that the results allow; returns their paths."""
    written: List[Path] = []
    if grid:
        ps = sorted({s["prefetchers"] for s in grid if s["mode"] in ("pipelined", "stage-all")})
        rs = sorted({s["readers"] for s in grid if s["mode"] not in ("torch", "tf")})
        if len(ps) > 1:
            written.append(_figure(grid, "prefetchers", ps, readers, prefetchers,
                                   f"elapsed time vs prefetch threads (decode threads = {readers})",
                                   out_dir / f"{prefix}elapsed_vs_prefetchers.png", grid_note))
        if len(rs) > 1:
            written.append(_figure(grid, "readers", rs, readers, prefetchers,
                                   "elapsed time vs decode threads (best prefetchers and lookahead)",
                                   out_dir / f"{prefix}elapsed_vs_decode_threads.png", grid_note))
    if headline:
        written.append(_modes_figure(headline, out_dir / f"{prefix}modes.png", headline_note))
    return written
