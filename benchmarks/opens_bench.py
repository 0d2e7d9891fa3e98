"""Metadata operations per array sample: the opens, reads and getattrs that one epoch of slices of array
files costs on the emulated parallel file system (``prestage-pfs``), with and without a stage directory.

The set: ``--files`` archives written with ``np.savez`` (``x`` of shape (8, 8, ``--per-file``), uint8,
the samples along the last axis as DLIO writes them, and ``y`` their labels) and as many ``.npy`` files
of ``--per-file`` samples along the first axis. The catalogs are built before counting; the counts are
the emulator's, for one epoch of ``prestage.Loader`` (batches of 8), including the batches of the next
epoch the loader may have started before it closed.

    python benchmarks/opens_bench.py --files 4 --per-file 16
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

import prestage
from prestage.bench.emulator import PfsEmulator


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", type=int, default=4)
    p.add_argument("--per-file", type=int, default=16)
    args = p.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="prestage-opens-bench-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for f in range(args.files):
            np.savez(src / f"{f}.npz", x=np.zeros((8, 8, args.per_file), np.uint8), y=np.arange(args.per_file))
            np.save(src / f"{f}.npy", np.zeros((args.per_file, 8, 8), np.uint8))
        emulator = PfsEmulator(src, latency_ms=0, bandwidth_mbs=0, max_ops=0)
        emulator.start()
        try:
            mount = Path(emulator.mountpoint)
            catalogs = {
                "npz_last_axis": prestage.Catalog.from_arrays(
                    [mount / f"{f}.npz" for f in range(args.files)], axis=-1, member="x", labels="y"),
                "npy_first_axis": prestage.Catalog.from_arrays([mount / f"{f}.npy" for f in range(args.files)]),
            }
            for name, catalog in catalogs.items():
                for staged in (False, True):
                    stage = str(Path(tmp) / f"stage-{name}") if staged else None
                    before = emulator.stats()["ops"]
                    with prestage.Loader(catalog, batch_size=8, stage_dir=stage) as loader:
                        samples = sum(len(b) for b in loader)
                    after = emulator.stats()["ops"]
                    ops = {k: after[k] - before.get(k, 0) for k in ("open", "read", "getattr")}
                    results[f"{name}{'_staged' if staged else ''}"] = {
                        "samples": samples, **ops, "opens_per_sample": round(ops["open"] / samples, 2)}
        finally:
            emulator.stop()
    print(json.dumps({"files": args.files, "per_file": args.per_file, "epoch": results}, indent=1))


if __name__ == "__main__":
    main()
