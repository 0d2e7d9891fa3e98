"""What a loader's start-up costs on a warm stage directory of many copies: this build against another
one (``--baseline``, a ``pip install --target`` of an earlier commit), each in its own interpreter with
its own stage directory over the same files, in alternating rounds.

Each build first stages every file (one epoch), then each round times one start-up: ``Loader(...)``
(the stage directory opened and checked, its index read, every copy found and checked against its
record) and ``close()``, nothing iterated. Figures: ms per start-up, the median of the rounds.

    python benchmarks/warm_start_bench.py --baseline /tmp/before --files 100000 --rounds 7
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WORKER = r"""
import json, sys, time
import prestage
root, stage = sys.argv[1], sys.argv[2]
cat = prestage.Catalog.from_folder(root, [".bin"])
with prestage.Loader(cat, batch_size=1000, decode="raw", stage_dir=stage, stage_patience=None,
                     shuffle=False) as loader:
    for _ in loader:  # stages every file
        pass
    staged = loader.stats()["staged_files"]
print(json.dumps({"module": prestage.__file__, "staged": staged}), flush=True)
for line in sys.stdin:
    t0 = time.perf_counter()
    loader = prestage.Loader(cat, batch_size=1000, decode="raw", stage_dir=stage, shuffle=False)
    loader.close()
    print(json.dumps({"ms": (time.perf_counter() - t0) * 1e3}), flush=True)
"""


def start(python_path: str, root: Path, stage: Path) -> subprocess.Popen:
    env = dict(os.environ)
    if python_path:
        env["PYTHONPATH"] = python_path
    proc = subprocess.Popen([sys.executable, "-c", WORKER, str(root), str(stage)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    info = json.loads(proc.stdout.readline())
    print(f"# {info['module']}: {info['staged']} copies staged", file=sys.stderr)
    return proc


def one(proc: subprocess.Popen) -> float:
    proc.stdin.write("go\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline())["ms"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="", help="a pip install --target of the build to compare")
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--dir", type=Path, default=None, help="where the files and stage dirs go")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="warm-start-", dir=args.dir))
    root = work / "set"
    for i in range(args.files):
        d = root / f"c{i % 100:02d}"
        if i < 100:
            d.mkdir(parents=True)
        (d / f"{i:06d}.bin").write_bytes(i.to_bytes(8, "little") * 8)  # 64 bytes
    builds = {"this": start("", root, work / "stage-this")}
    if args.baseline:
        builds["baseline"] = start(args.baseline, root, work / "stage-baseline")
    times = {name: [] for name in builds}
    for _ in range(args.rounds):
        for name, proc in builds.items():
            times[name].append(one(proc))
    for proc in builds.values():
        proc.stdin.close()
        proc.wait()
    result = {"files": args.files, "rounds": args.rounds, "host": platform.node(),
              "ms": {name: [round(t, 1) for t in ts] for name, ts in times.items()},
              "median_ms": {name: round(statistics.median(ts), 1) for name, ts in times.items()}}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
