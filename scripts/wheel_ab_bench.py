"""A/B: the portable wheel's decode speed against the development build's, in one run.

    python scripts/wheel_ab_bench.py --dev PYTHON_A --wheel PYTHON_B [--images 2000] [--rounds 9]

PYTHON_A: an interpreter with the development build (.venv/bin/python after scripts/dev.sh setup:
GCC 12, the system's libjpeg-turbo). PYTHON_B: one with the portable wheel installed (scripts/wheel.sh:
Zig's clang, libjpeg-turbo built in). Both must be the same CPython version. The JPEGs (a synthetic
set, `prestage synth`, about 100 KB each) are read once before timing, so every epoch reads from the
page cache.

Each round times one epoch in each build, alternating which goes first, every epoch in a fresh
process: `Loader(catalog, batch_size=64, image_size=(224, 224), transform="random-resized-crop",
readers=2)`, uint8, the time from the first batch asked for to the last one. Also, in each round, the
wheel with `JSIMD_FORCENONE=1` (libjpeg-turbo's switch that turns its SIMD code off at run time): if
the wheel's libjpeg-turbo had no SIMD code, the two would run at the same speed. Prints each round's
figures, then the medians and the ratios wheel / development build (per round too), both of images per
second of wall time and of images per CPU-second of the epoch's process (all its threads): on a machine
shared with other jobs the second is what each would do on dedicated cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

EPOCH = r"""
import json, resource, sys, time
import prestage
catalog = prestage.Catalog.from_folder(sys.argv[1])
with prestage.Loader(catalog, batch_size=64, image_size=(224, 224), transform="random-resized-crop",
                     readers=2, seed=int(sys.argv[2])) as loader:
    t, u = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    n = sum(len(b.labels) for b in loader)
    s, v = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF)
cpu = v.ru_utime + v.ru_stime - u.ru_utime - u.ru_stime
print(json.dumps({"images": n, "seconds": s, "cpu": cpu, "file": prestage.__file__}))
"""


def epoch(python: str, images: Path, seed: int, env: dict) -> tuple:
    """(images per second of wall time, images per CPU-second of the process, all its threads)."""
    r = subprocess.run([python, "-c", EPOCH, str(images), str(seed)], capture_output=True, text=True,
                       env=env, check=True)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return out["images"] / out["seconds"], out["images"] / out["cpu"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dev", required=True, help="interpreter with the development build")
    ap.add_argument("--wheel", required=True, help="interpreter with the portable wheel")
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--data", help="where to write the JPEGs (default: a temporary folder)")
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_LIBRARY_PATH")}
    with tempfile.TemporaryDirectory() as tmp:
        images = Path(args.data or tmp) / "images"
        if not images.exists():
            prestage_cli = str(Path(args.dev).parent / "prestage")
            subprocess.run([prestage_cli, "synth", str(images), "--images", str(args.images), "--classes", "10",
                            "--quiet"], check=True)
        for f in images.rglob("*.jpg"):  # into the page cache
            f.read_bytes()
        for python in (args.dev, args.wheel):  # warm-up: imports, the interpreters' own files
            epoch(python, images, 0, env)
        rows = []
        for r in range(args.rounds):
            seed = r + 1
            first, second = (args.dev, args.wheel) if r % 2 == 0 else (args.wheel, args.dev)
            rates = {first: epoch(first, images, seed, env), second: epoch(second, images, seed, env)}
            nosimd = epoch(args.wheel, images, seed, dict(env, JSIMD_FORCENONE="1"))
            row = rates[args.dev] + rates[args.wheel] + nosimd
            rows.append(row)
            print(f"round {r + 1}: images/s development {row[0]:6.1f}  wheel {row[2]:6.1f}  wheel without "
                  f"SIMD {row[4]:6.1f} (wheel / development {row[2] / row[0]:.3f}); per CPU-second "
                  f"{row[1]:6.1f} {row[3]:6.1f} {row[5]:6.1f} ({row[3] / row[1]:.3f})", flush=True)
        med = [statistics.median(c) for c in zip(*rows)]
        for name, k in (("images/s (wall)", 0), ("images per CPU-second", 1)):
            ratios = sorted(row[2 + k] / row[k] for row in rows)
            print(f"{name}, medians of {args.rounds}: development {med[k]:.1f}, wheel {med[2 + k]:.1f}, "
                  f"wheel without SIMD {med[4 + k]:.1f}")
            print(f"  wheel / development: {med[2 + k] / med[k]:.3f} (per round {ratios[0]:.3f}-{ratios[-1]:.3f}, "
                  f"median {statistics.median(ratios):.3f}); wheel without SIMD / wheel: "
                  f"{med[4 + k] / med[2 + k]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
