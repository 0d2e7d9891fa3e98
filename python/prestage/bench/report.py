"""The benchmark's report: the table of modes, the ratios of the paper, the grid, as text and JSON.

A run or summary is a dict with ``mode``, ``options``, ``images``, ``seconds`` (for stage-all: copy +
read), ``copy_s``, ``epoch_s``, ``images_per_s``, ``mb_per_s`` (JPEG bytes delivered per second),
``stall_s`` (time the consumer waited for batches), ``stages`` (prestage's per-stage busy/idle
thread-seconds), ``pfs`` (the emulator's operation counts during the run), ``cache`` (how the run
started: ``drop_caches``, ``fadvise``, ``none`` or ``warm``) and ``other_cpu_s`` (CPU-seconds other
processes of the machine used meanwhile; the table's "others" column gives it in cores).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

__all__ = ["TARGETS", "ratios", "format_table", "format_ratios", "format_grid", "format_options"]

#: (name, numerator, denominator, target, "min" or "max"): what the issue's experiment must show.
TARGETS = (
    ("pipelined / direct (speed-up)", "pipelined", "direct", 6.0, "min"),
    ("pipelined / ideal (speed)", "pipelined", "ideal", 0.9, "min"),
    ("pipelined / (stage-all copy + epoch) (time)", "pipelined", "stage-all", 0.6, "max"),
    ("pipelined / PyTorch DataLoader (speed-up)", "pipelined", "torch", 3.0, "min"),
    ("pipelined / tf.data (speed-up)", "pipelined", "tf", 3.0, "min"),
)


def format_options(options: Dict[str, Any]) -> str:
    short = {"prefetchers": "P", "readers": "R", "lookahead": "L", "depth": "D", "workers": "W"}
    return " ".join(f"{short.get(k, k)}={v}" for k, v in options.items() if v is not None)


def _f(value: Optional[float], fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def format_table(rows: Sequence[Dict[str, Any]]) -> str:
    """One line per mode: throughput, times, stall, per-stage busy/idle, PFS operations."""
    header = (f"{'mode':<10} {'options':<18} {'images':>7} {'images/s':>9} {'MB/s':>7} {'total s':>8} "
              f"{'copy s':>7} {'read s':>7} {'stall s':>8} {'stage2 busy/idle s':>19} "
              f"{'stage3 busy/idle s':>19} {'PFS open/read/getattr':>22} {'others':>6}  cache")
    lines = [header, "-" * len(header)]
    for r in rows:
        stages = r.get("stages") or {}
        s2 = stages.get("stage")
        s3 = stages.get("decode")
        busy2 = f"{s2['busy_s']:.1f}/{s2['idle_s']:.1f}" if s2 and r["mode"] == "pipelined" else "-"
        busy3 = f"{s3['busy_s']:.1f}/{s3['idle_s']:.1f}" if s3 else "-"
        pfs = r.get("pfs")
        ops = (f"{pfs['ops'].get('open', 0)}/{pfs['ops'].get('read', 0)}/{pfs['ops'].get('getattr', 0)}"
               if pfs else "-")
        lines.append(
            f"{r['mode']:<10} {format_options(r.get('options', {})):<18} {r['images']:>7} "
            f"{r['images_per_s']:>9.0f} {r['mb_per_s']:>7.1f} {r['seconds']:>8.2f} "
            f"{_f(r.get('copy_s'), '.2f'):>7} {_f(r.get('epoch_s'), '.2f'):>7} "
            f"{_f(r.get('stall_s'), '.2f'):>8} "
            f"{busy2:>19} {busy3:>19} {ops:>22} {_others(r):>6}  {r.get('cache', '-')}")
    return "\n".join(lines)


def _others(r: Dict[str, Any]) -> str:
    """Cores that other processes kept busy during the run, on average (a shared machine's noise)."""
    other, window = r.get("other_cpu_s"), r.get("window_s")
    return "-" if other is None or not window else f"{other / window:.2f}"


def ratios(by_mode: Dict[str, Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The paper's comparisons from one summary per mode (medians measured in the same run)."""
    out = []
    pipelined = by_mode.get("pipelined")
    for name, num, den, target, kind in TARGETS:
        other = by_mode.get(den)
        if pipelined is None or other is None or not other.get("seconds") or not pipelined.get("seconds"):
            continue
        if kind == "max":  # a ratio of times: lower is better
            value = pipelined["seconds"] / other["seconds"]
            met = value <= target
        else:  # a ratio of speeds
            value = pipelined["images_per_s"] / other["images_per_s"]
            met = value >= target
        out.append({"name": name, "value": value, "target": target, "kind": kind, "met": met,
                    "numerator": num, "denominator": den})
    return out


def format_ratios(items: Sequence[Dict[str, Any]]) -> str:
    lines = [f"{'comparison':<46} {'value':>7}  {'target':>8}  met"]
    for item in items:
        sign = ">=" if item["kind"] == "min" else "<="
        lines.append(f"{item['name']:<46} {item['value']:>7.2f}  {sign} {item['target']:<5g}  "
                     f"{'yes' if item['met'] else 'NO'}")
    return "\n".join(lines)


def format_grid(summaries: Sequence[Dict[str, Any]], limit: Optional[int] = None) -> str:
    """The grid's points, fastest first within each mode."""
    lines = [f"{'mode':<10} {'P':>3} {'R':>3} {'L':>3} {'W':>8} {'images/s':>9} {'median s':>9} "
             f"{'copy s':>7} {'stall s':>8} {'runs':>5}"]
    modes: List[str] = []
    for s in summaries:
        if s["mode"] not in modes:
            modes.append(s["mode"])
    for mode in modes:
        points = sorted((s for s in summaries if s["mode"] == mode),
                        key=lambda s: -(s["images_per_s"] or 0))
        for s in points[:limit]:
            staged = mode in ("pipelined", "stage-all")
            lines.append(
                f"{mode:<10} {s['prefetchers'] if staged else '-':>3} "
                f"{s['readers'] if mode not in ('torch', 'tf') else '-':>3} "
                f"{s['lookahead'] if mode == 'pipelined' else '-':>3} "
                f"{_workers(s):>8} {s['images_per_s'] or 0:>9.0f} {s['seconds'] or 0:>9.2f} "
                f"{_f(s.get('copy_s'), '.2f'):>7} {_f(s.get('stall_s'), '.2f'):>8} {s['repeats']:>5}")
    return "\n".join(lines)


def _workers(summary: Dict[str, Any]) -> str:
    if summary["mode"] not in ("torch", "tf"):
        return "-"
    return "auto" if summary.get("workers") is None else str(summary["workers"])
