"""The I/O trace a loader writes with ``trace=PATH``: one record per read, read back as a NumPy array,
summarised, and drawn as the access-pattern figures Darshan draws for HPC jobs (``prestage trace FILE``).

>>> with prestage.Loader(catalog, batch_size=256, stage_dir="/local/ssd", trace="run.trace") as loader:
...     for batch in loader: ...
>>> header, records = prestage.trace.read("run.trace")
>>> prestage.trace.summary(records)["by_tier"]["source"]["reads"]

Each record: ``sample`` (-1 as uint64 for a whole-file copy), ``file`` (the catalog's file index),
``offset`` and ``size`` (the bytes read), ``start_ns`` and ``end_ns`` (since the loader opened the trace),
``thread`` (a small number per thread), ``tier`` (``TIERS``), ``kind`` (``KINDS``). The self-tuning's
changes (``autotune``) are records of their own in the file; :func:`read` returns them apart, in the
header's ``"tuning"`` list (``t_ns``, ``knob``, ``from``, ``to``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from prestage import _core

__all__ = ["KINDS", "KNOBS", "NO_SAMPLE", "RECORD", "TIERS", "TUNE_KIND", "plot", "read", "summary"]

MAGIC = b"PSTGTRC1"
# The numbers a record holds, named as the C++ core names them.
#: The tiers, in the order the loader tries them: ``memory``, ``stage``, ``peer``, ``source``.
TIERS: Tuple[str, ...] = tuple(_core.TIERS)
#: What a read was for: stage 3's ``read`` of a sample, stage 2's ``copy`` of a file, stage 2's
#: ``read-ahead``.
KINDS: Tuple[str, ...] = tuple(_core.TRACE_KINDS)
NO_SAMPLE = np.iinfo(np.uint64).max
#: The kind of a self-tuning record (no read): sample is the knob, offset the old value, size the new.
TUNE_KIND: int = _core.TRACE_TUNE_KIND
#: The self-tuning's knobs, by number: ``readers``, ``reads_in_flight``, ``lookahead``.
KNOBS: Tuple[str, ...] = tuple(_core.KNOBS)
#: One record as the C++ core writes it (cpp/src/util/io_trace.hpp), little-endian, 56 bytes.
RECORD = np.dtype([("sample", "<u8"), ("file", "<u8"), ("offset", "<u8"), ("size", "<u8"),
                   ("start_ns", "<i8"), ("end_ns", "<i8"), ("thread", "<u4"), ("tier", "u1"),
                   ("kind", "u1"), ("reserved", "<u2")])


def read(path: Union[str, "os.PathLike[str]"]) -> Tuple[Dict[str, Any], np.ndarray]:
    """The trace's header (a dict: format, root, files, and ``tuning``: the self-tuning's changes in
    time order) and its read records sorted by start time. A trace whose writer stopped mid-record (a
    full disk) loses that record only. ValueError if the file is not a trace."""
    data = Path(path).read_bytes()
    if len(data) < 16 or data[:8] != MAGIC:
        raise ValueError(f"{os.fspath(path)!r} is not a prestage I/O trace (no {MAGIC.decode()} magic)")
    header_bytes = int.from_bytes(data[8:16], "little")
    if 16 + header_bytes > len(data):
        raise ValueError(f"{os.fspath(path)!r}: the header runs past the end of the file")
    try:
        header = json.loads(data[16:16 + header_bytes].decode("utf-8", errors="replace"))
    except ValueError as error:
        raise ValueError(f"{os.fspath(path)!r}: the header is not JSON ({error})") from None
    body = data[16 + header_bytes:]
    records = np.sort(np.frombuffer(body[:len(body) - len(body) % RECORD.itemsize], dtype=RECORD),
                      order="start_ns")
    tune = records["kind"] == TUNE_KIND
    header["tuning"] = [{"t_ns": int(r["start_ns"]),
                         "knob": KNOBS[int(r["sample"])] if int(r["sample"]) < len(KNOBS) else "?",
                         "from": int(r["offset"]), "to": int(r["size"])} for r in records[tune]]
    return header, records[~tune]


def summary(records: np.ndarray) -> Dict[str, Any]:
    """Reads, bytes and mean time per read, by tier and by kind; the span; reads per second."""
    span_s = float(records["end_ns"].max() - records["start_ns"].min()) / 1e9 if len(records) else 0.0

    def group(mask: np.ndarray) -> Dict[str, Any]:
        chosen = records[mask]
        seconds = (chosen["end_ns"] - chosen["start_ns"]) / 1e9
        return {"reads": int(len(chosen)), "bytes": int(chosen["size"].sum()),
                "mean_ms": float(seconds.mean() * 1e3) if len(chosen) else 0.0}

    return {
        "reads": int(len(records)),
        "bytes": int(records["size"].sum()),
        "span_s": span_s,
        "reads_per_s": len(records) / span_s if span_s > 0 else 0.0,
        "threads": int(len(np.unique(records["thread"]))),
        "files": int(len(np.unique(records["file"]))),
        "by_tier": {name: group(records["tier"] == t) for t, name in enumerate(TIERS)
                    if (records["tier"] == t).any()},
        "by_kind": {name: group(records["kind"] == k) for k, name in enumerate(KINDS)
                    if (records["kind"] == k).any()},
    }


_TIER_COLORS = {"memory": "#2ca02c", "stage": "#1f77b4", "peer": "#9467bd", "source": "#d62728"}
_KIND_COLORS = {"read": "#1f77b4", "copy": "#ff7f0e", "read-ahead": "#d62728"}


def plot(records: np.ndarray, out: Union[str, "os.PathLike[str]"], title: str = "",
         tuning: Optional[List[Dict[str, Any]]] = None) -> List[Path]:
    """Draws the trace into folder ``out`` (created) and returns the PNGs written (``tuning``: the
    header's list, drawn as marked vertical lines on the temporal figure):

    - ``spatial.png``: the file read against time (one point per read, by tier), and the offset read
      against time in the file read most often (a packed shard's access pattern);
    - ``temporal.png``: reads per second against time, by tier, and bytes per second;
    - ``timeline.png``: one row per thread, a bar per read from its start to its end, by kind (stage 2's
      copies and read-ahead, stage 3's reads): where each stage spends its time.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if len(records) == 0:
        raise ValueError("the trace holds no records: nothing to draw")
    t0 = records["start_ns"].min()
    start = (records["start_ns"] - t0) / 1e9
    end = (records["end_ns"] - t0) / 1e9
    written = []

    fig, (files_ax, offset_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    for t, name in enumerate(TIERS):
        mask = records["tier"] == t
        if mask.any():
            files_ax.scatter(start[mask], records["file"][mask], s=2, color=_TIER_COLORS[name],
                             label=f"{name} ({mask.sum():,})")
    files_ax.set(xlabel="time (s)", ylabel="file (catalog index)", title="files read over time")
    files_ax.legend(markerscale=5, fontsize=8)
    files, counts = np.unique(records["file"], return_counts=True)
    busiest = files[counts.argmax()]
    mask = records["file"] == busiest
    for t, name in enumerate(TIERS):
        m = mask & (records["tier"] == t)
        if m.any():
            offset_ax.scatter(start[m], records["offset"][m] / 2**20, s=3, color=_TIER_COLORS[name],
                              label=name)
    offset_ax.set(xlabel="time (s)", ylabel="offset (MiB)",
                  title=f"offsets read in file {busiest} ({counts.max():,} reads)")
    offset_ax.legend(markerscale=4, fontsize=8)
    fig.suptitle(title or "prestage I/O trace: spatial pattern")
    fig.tight_layout()
    written.append(out / "spatial.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    fig, (rate_ax, bytes_ax) = plt.subplots(1, 2, figsize=(12, 4))
    span = max(float(end.max()), 1e-3)
    bins = np.linspace(0, span, min(200, max(10, int(span * 10))) + 1)
    width = bins[1] - bins[0]
    for t, name in enumerate(TIERS):
        m = records["tier"] == t
        if m.any():
            hist, _ = np.histogram(start[m], bins=bins)
            rate_ax.plot(bins[:-1], hist / width, color=_TIER_COLORS[name], label=name)
            hist, _ = np.histogram(start[m], bins=bins, weights=records["size"][m])
            bytes_ax.plot(bins[:-1], hist / width / 1e6, color=_TIER_COLORS[name], label=name)
    for change in tuning or []:
        at = (change["t_ns"] - t0) / 1e9
        for ax in (rate_ax, bytes_ax):
            ax.axvline(at, color="#7f7f7f", linestyle=":", linewidth=1)
        rate_ax.annotate(f"{change['knob']} {change['from']}\u2192{change['to']}", (at, 1),
                         xycoords=("data", "axes fraction"), rotation=90, fontsize=6,
                         va="top", ha="right", color="#7f7f7f")
    rate_ax.set(xlabel="time (s)", ylabel="reads per second", title="reads per second, by tier")
    bytes_ax.set(xlabel="time (s)", ylabel="MB/s", title="bytes per second, by tier")
    rate_ax.legend(fontsize=8)
    bytes_ax.legend(fontsize=8)
    fig.suptitle(title or "prestage I/O trace: temporal pattern")
    fig.tight_layout()
    written.append(out / "temporal.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    from matplotlib.patches import Patch

    threads = np.unique(records["thread"])
    row = {int(t): i for i, t in enumerate(threads)}
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.35 * len(threads)))
    handles = []
    for k, name in enumerate(KINDS):
        m = records["kind"] == k
        if not m.any():
            continue
        for thread in threads:
            mt = m & (records["thread"] == thread)
            if mt.any():
                ax.broken_barh(list(zip(start[mt], np.maximum(end[mt] - start[mt], span * 1e-4))),
                               (row[int(thread)] - 0.4, 0.8), color=_KIND_COLORS[name])
        handles.append(Patch(color=_KIND_COLORS[name], label=f"{name} ({m.sum():,})"))
    ax.set(xlabel="time (s)", ylabel="thread", yticks=range(len(threads)),
           yticklabels=[str(int(t)) for t in threads], title=title or "reads per thread, by kind")
    ax.legend(handles=handles, fontsize=8, loc="upper right")
    fig.tight_layout()
    written.append(out / "timeline.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written
