"""A stage directory smaller than the data set, over several epochs: ``prestage bench --cache-bytes``.

For each eviction policy, one loader reads ``epochs`` consecutive epochs from the PFS through a stage
directory bounded to ``cache_bytes`` (each epoch from cold page caches). Per epoch it reports the
loader's own counts (hits, misses, evictions, bytes read from the source: ``stats()["epochs"]``), what
the emulated PFS served (measured below the loader), images/s and the consumer's stall. From the
second epoch on, the optimum is to read ``1 - cache_bytes / set`` of the set per epoch; LRU reads more,
because each epoch visits the files in a new order.
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Any, Dict, List, Literal, Optional, Sequence, Tuple

from prestage.bench.modes import Setup, _consume, _loader_kwargs

__all__ = ["EVICTIONS", "parse_size", "resolve_size", "run_cache_study", "format_cache_study"]

EVICTIONS: Tuple[Literal["clairvoyant", "lru"], ...] = ("clairvoyant", "lru")

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def _match(text: str) -> "re.Match[str]":
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(%|[kmgt]?)", t)
    if m is None or float(m.group(1)) <= 0 or (m.group(2) == "%" and float(m.group(1)) > 100):
        raise ValueError(f"{text!r} is not a size: give bytes (with an optional K, M, G or T suffix) "
                         "or a percentage of the data set between 0 and 100, e.g. 25%")
    return m


def parse_size(text: str) -> str:
    """Checks a --cache-bytes value: bytes with an optional K, M, G or T suffix (powers of 1024), or a
    percentage of the data set ("25%"). Returned as given; resolve_size() turns it into bytes."""
    _match(text)
    return text


def resolve_size(text: str, set_bytes: int) -> int:
    m = _match(text)
    value = float(m.group(1))
    return int(value / 100 * set_bytes) if m.group(2) == "%" else int(value * _UNITS[m.group(2)])


def set_bytes_of(setup: Setup) -> int:
    """The data set's size, from the full-speed source (not through the emulated PFS)."""
    return sum(os.stat(setup.source / p).st_size for p in setup.paths)


def run_cache_study(setup: Setup, cache_size: str, evictions: Sequence[Literal["clairvoyant", "lru"]],
                    epochs: int, prefetchers: int, readers: int, lookahead: int) -> Dict[str, Any]:
    import prestage

    total = set_bytes_of(setup)
    cache_bytes = resolve_size(cache_size, total)
    policies: List[Dict[str, Any]] = []
    for eviction in evictions:
        stage_dir = setup.fresh_dir(f"cache-{eviction}")
        rows: List[Dict[str, Any]] = []
        try:
            with prestage.Loader(setup.catalog(setup.pfs_root), stage_dir=stage_dir, cache_bytes=cache_bytes,
                                 eviction=eviction, prefetchers=prefetchers, readers=readers,
                                 lookahead=lookahead, **_loader_kwargs(setup)) as loader:
                for epoch in range(epochs):
                    cache_state = setup.make_cold()
                    before = setup.pfs_counters()
                    batches = iter(loader)
                    images, seconds, stall = _consume(batches, len(loader), setup.compute_ms / 1e3,
                                                      len, f"{eviction} epoch {epoch + 1}/{epochs}",
                                                      setup.show_progress)
                    for _ in batches:  # ends the epoch: the next iter() starts the next one
                        pass
                    after = setup.pfs_counters()
                    rows.append({"epoch": epoch, "images": images, "seconds": seconds, "stall_s": stall,
                                 "images_per_s": images / seconds if seconds > 0 else 0.0,
                                 "cache": cache_state,
                                 "pfs_bytes": None if before is None or after is None
                                 else after["bytes_read"] - before["bytes_read"]})
                stats = loader.stats(epochs="all")
        finally:
            shutil.rmtree(stage_dir, ignore_errors=True)
        for row, counts in zip(rows, stats["epochs"]):
            row.update({k: counts[k] for k in ("hits", "misses", "evictions", "bytes_from_source")})
            row["source_fraction"] = counts["bytes_from_source"] / total if total else None
        later = [r["bytes_from_source"] for r in rows[1:]]
        policies.append({
            "eviction": eviction,
            "epochs": rows,
            "peak_stage_bytes": stats["stage_bytes_peak"],
            "read_ahead": stats["read_ahead"],
            # Epochs 2 on, as a fraction of the set: what the bound is meant to cut.
            "later_source_fraction": sum(later) / len(later) / total if later and total else None,
        })
    return {"cache_bytes": cache_bytes, "set_bytes": total, "fraction": cache_bytes / total if total else None,
            "optimum": max(0.0, 1 - cache_bytes / total) if total else None,
            "options": {"prefetchers": prefetchers, "readers": readers, "lookahead": lookahead},
            "policies": policies}


def format_cache_study(study: Dict[str, Any]) -> str:
    fraction = study["fraction"]
    lines = [f"bounded stage directory: {study['cache_bytes'] / 1e6:.1f} MB"
             + (f" ({fraction:.0%} of the set's {study['set_bytes'] / 1e6:.1f} MB)" if fraction else ""),
             f"{'eviction':<12}{'epoch':>6}{'images/s':>10}{'stall s':>9}{'hits':>8}{'misses':>8}"
             f"{'evicted':>9}{'from source MB':>16}{'of the set':>12}{'PFS served MB':>15}"]
    for p in study["policies"]:
        for r in p["epochs"]:
            pfs = "" if r["pfs_bytes"] is None else f"{r['pfs_bytes'] / 1e6:.1f}"
            share = "" if r["source_fraction"] is None else f"{r['source_fraction']:.3f}"
            lines.append(f"{p['eviction']:<12}{r['epoch'] + 1:>6}{r['images_per_s']:>10.0f}"
                         f"{r['stall_s']:>9.2f}{r['hits']:>8}{r['misses']:>8}{r['evictions']:>9}"
                         f"{r['bytes_from_source'] / 1e6:>16.1f}{share:>12}{pfs:>15}")
    if study["optimum"] is not None:
        for p in study["policies"]:
            if p["later_source_fraction"] is not None:
                lines.append(f"  {p['eviction']}: epochs 2 on read {p['later_source_fraction']:.3f} of the set "
                             f"per epoch (optimum {study['optimum']:.3f}); stage directory peak "
                             f"{p['peak_stage_bytes'] / 1e6:.1f} MB")
    return "\n".join(lines)


def plot_cache_study(study: Dict[str, Any], out: Any) -> Optional[Any]:
    """Bytes read from the source per epoch, one line per policy, with the optimum: a PNG in ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=100)
    for p in study["policies"]:
        xs = [r["epoch"] + 1 for r in p["epochs"]]
        ys = [r["source_fraction"] for r in p["epochs"]]
        ax.plot(xs, ys, marker="o", label=p["eviction"])
    if study["optimum"] is not None:
        ax.axhline(study["optimum"], color="grey", linestyle="--", linewidth=1,
                   label=f"optimum from epoch 2 (1 - {study['fraction']:.2f})")
    ax.set_xticks(sorted({r["epoch"] + 1 for p in study["policies"] for r in p["epochs"]}))
    ax.set_xlabel("epoch")
    ax.set_ylabel("read from the source (fraction of the set)")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"stage directory bounded to {study['fraction']:.0%} of the set" if study["fraction"]
                 else "bounded stage directory")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "cache_bytes_per_epoch.png"
    fig.savefig(path)
    plt.close(fig)
    return path
