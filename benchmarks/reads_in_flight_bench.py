"""Reads in flight: blocking threads against io_uring on the emulated parallel file system, the
measurement behind how stage 2 keeps many reads in flight (threads, started as the self-tuning asks).

Compiles ``reads_in_flight_bench.c`` (no liburing needed), writes ``--files`` files of ``--kb`` KB,
mounts them through ``prestage-pfs`` (``--latency-ms`` per operation, ``--bandwidth-mbs``,
``--max-ops`` at once; every open drops the file's cached pages, so each read meets the latency), and
reads them all with one open, one read of the known size and one close each, N files in flight, by N
blocking threads and by one thread driving an io_uring, alternating, ``--repeat`` times. Prints the
median files/s of each and their ratio as JSON.

    python benchmarks/reads_in_flight_bench.py --files 600 --latency-ms 2 --bandwidth-mbs 2000 --max-ops 64
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

from prestage.bench.emulator import PfsEmulator

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=600)
    parser.add_argument("--kb", type=int, default=100)
    parser.add_argument("--latency-ms", type=float, default=2.0)
    parser.add_argument("--bandwidth-mbs", type=float, default=2000.0)
    parser.add_argument("--max-ops", type=int, default=64)
    parser.add_argument("--in-flight", default="4,16,64")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="prestage-reads-bench-") as tmp:
        tmp_path = Path(tmp)
        binary = tmp_path / "reads_in_flight_bench"
        subprocess.run(["cc", "-O2", "-o", str(binary), str(HERE / "reads_in_flight_bench.c"),
                        "-lpthread"], check=True)
        src = tmp_path / "src"
        src.mkdir()
        payload = os.urandom(args.kb * 1000)
        for i in range(args.files):
            (src / f"{i:05d}.bin").write_bytes(payload)
        results = []
        with PfsEmulator(src, latency_ms=args.latency_ms, bandwidth_mbs=args.bandwidth_mbs,
                         max_ops=args.max_ops) as pfs:
            listing = "".join(f"{pfs.mountpoint}/{i:05d}.bin {len(payload)}\n"
                              for i in range(args.files))
            for n in (int(x) for x in args.in_flight.split(",")):
                rates = {"threads": [], "uring": []}
                for _ in range(args.repeat):
                    for mode in ("threads", "uring"):
                        out = subprocess.run([str(binary), mode, str(n)], input=listing, text=True,
                                             capture_output=True, check=True).stdout
                        rates[mode].append(json.loads(out)["files_per_s"])
                threads = statistics.median(rates["threads"])
                uring = statistics.median(rates["uring"])
                results.append({"in_flight": n, "threads_files_per_s": threads,
                                "uring_files_per_s": uring, "uring_over_threads": uring / threads,
                                "runs": rates})
                print(json.dumps(results[-1]), flush=True)
    print(json.dumps({"latency_ms": args.latency_ms, "bandwidth_mbs": args.bandwidth_mbs,
                      "max_ops": args.max_ops, "files": args.files, "kb": args.kb,
                      "results": results}, indent=1))


if __name__ == "__main__":
    main()
