"""The I/O trace's figures for the set of `pack_bench.py`: one epoch of the loose and of the packed set
through a stage directory, behind the emulated PFS (2 ms per operation), each with `trace=`, then
`prestage trace` draws them into benchmarks/plots/trace-<layout>-*.png.

    python benchmarks/pack_bench.py --files 20000 --runs 1 --work /tmp/pack-bench
    python benchmarks/trace_figures.py /tmp/pack-bench/pfs
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import prestage
from prestage import trace as traces
from prestage.bench.emulator import PfsEmulator


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    plots = Path(__file__).resolve().parent / "plots"
    work = Path(tempfile.mkdtemp(prefix="trace-figures-"))
    with PfsEmulator(sys.argv[1], latency_ms=2, bandwidth_mbs=0, max_ops=0) as pfs:
        assert pfs.mountpoint is not None
        for layout in ("loose", "packed"):
            catalog = (prestage.Catalog.from_folder(pfs.mountpoint / "loose", [".npy"]) if layout == "loose"
                       else prestage.Catalog.from_shards(pfs.mountpoint / "packed"))
            trace = work / f"{layout}.trace"
            with prestage.Loader(catalog, batch_size=256, decode="npy", stage_dir=work / f"stage-{layout}",
                                 prefetchers=16, readers=8, trace=trace) as loader:
                for _ in loader:
                    pass
            _, records = traces.read(trace)
            print(layout, traces.summary(records))
            for figure in traces.plot(records, work / layout, title=f"I/O trace: {layout} set, one epoch"):
                figure.replace(plots / f"trace-{layout}-{figure.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
