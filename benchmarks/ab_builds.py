"""Two installed builds of prestage, A/B, in one run: is a change as fast as the main it starts
from?

Each build is a Python interpreter with its own prestage installed (a virtual environment each).
Each round runs, for both builds in alternating order (A then B, then B then A):

- ``prestage bench`` in the paper's setting over the emulated PFS: one cold pipelined epoch, 2 ms
  per operation, 200 MB/s, 16 operations at once, 2 readers, 16 reads in flight, a look-ahead of
  2 batches, a new stage directory each time;
- one page-cache epoch of random-resized crops to 224x224 (batches of 64, 2 readers).

The set is ``prestage synth``'s (``--images``, made in ``--data`` if absent). Put it on a tmpfs
(``/dev/shm``): the bench drops the source's pages before its epoch, and on a disk the disk's own
speed, which varies run to run, then decides the epoch.

    python benchmarks/ab_builds.py --a BASE/bin/python --b NEW/bin/python --rounds 20 \\
        --data /dev/shm/ab-data --out ab.json

It prints, per round, both builds' images/s, and at the end B's median over A's, the median of the
rounds' own B/A ratios, a 95% bootstrap interval of the first, and the samples stage 3 read from the
PFS itself for want of a copy (``misses``): a run whose first batches miss is about 10% slower, so
the ratios are worth as much as the misses are alike.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

EPOCH = r"""
import json, sys, time, prestage
cat = prestage.Catalog.from_folder(sys.argv[1])
with prestage.Loader(cat, batch_size=64, image_size=(224, 224), transform="random-resized-crop",
                     readers=2, seed=int(sys.argv[2])) as loader:
    start = time.perf_counter()
    n = sum(len(b.labels) for b in loader)
    print(json.dumps({"images_per_s": n / (time.perf_counter() - start)}))
"""


def run(argv: list[str], timeout: float) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv[:4])} ... failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return done.stdout


def bench(python: str, data: Path, work: Path) -> dict:
    stage = work / "stage"
    shutil.rmtree(stage, ignore_errors=True)
    out = run([python, "-m", "prestage", "bench", str(data), "--stage-dir", str(stage), "--emulate",
               "--latency-ms", "2", "--bandwidth-mbs", "200", "--max-ops", "16",
               "--modes", "pipelined", "--readers", "2", "--prefetchers", "16", "--lookahead", "2",
               "--repeat", "1", "--json", "--quiet"], timeout=900)
    report = json.loads(out)
    shutil.rmtree(stage, ignore_errors=True)
    return {"images_per_s": report["headline"][0]["images_per_s"],
            "misses": report["runs"][0]["misses"]}


def epoch(python: str, data: Path, seed: int) -> float:
    return json.loads(run([python, "-c", EPOCH, str(data), str(seed)], timeout=600))["images_per_s"]


def bootstrap(a: list[float], b: list[float], draws: int = 4000) -> tuple[float, float]:
    rng = random.Random(0)
    ratios = sorted(statistics.median(rng.choices(b, k=len(b))) /
                    statistics.median(rng.choices(a, k=len(a))) for _ in range(draws))
    return ratios[int(0.025 * draws)], ratios[int(0.975 * draws)]


def summary(name: str, a: list[float], b: list[float]) -> dict:
    low, high = bootstrap(a, b)
    result = {"a_median": statistics.median(a), "b_median": statistics.median(b),
              "b_over_a": statistics.median(b) / statistics.median(a),
              "paired_b_over_a": statistics.median(y / x for x, y in zip(a, b)),
              "interval_95": [low, high]}
    print(f"{name}: A {result['a_median']:.0f}, B {result['b_median']:.0f} images/s; "
          f"B/A {result['b_over_a']:.3f} (95% {low:.3f}-{high:.3f}), "
          f"per round {result['paired_b_over_a']:.3f}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", required=True, help="the base build's Python")
    parser.add_argument("--b", required=True, help="the new build's Python")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--data", type=Path, default=Path("/dev/shm/prestage-ab-data"))
    parser.add_argument("--out", type=Path, help="every run's figures, as JSON")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if not args.data.exists():
        run([args.b, "-m", "prestage", "synth", str(args.data), "--images", str(args.images),
             "--classes", "30", "--quiet"], timeout=1800)
    builds = {"A": args.a, "B": args.b}
    runs: dict = {"bench": {"A": [], "B": []}, "epoch": {"A": [], "B": []}}
    with tempfile.TemporaryDirectory(prefix="prestage-ab-") as work:
        for r in range(args.rounds):
            order = ["A", "B"] if r % 2 == 0 else ["B", "A"]
            for tag in order:
                runs["bench"][tag].append(bench(builds[tag], args.data, Path(work)))
            for tag in order:
                runs["epoch"][tag].append(epoch(builds[tag], args.data, r))
            bench_a, bench_b = (runs["bench"][t][-1]["images_per_s"] for t in "AB")
            epoch_a, epoch_b = (runs["epoch"][t][-1] for t in "AB")
            print(f"round {r + 1}/{args.rounds}: bench A {bench_a:.0f} B {bench_b:.0f}, "
                  f"epoch A {epoch_a:.0f} B {epoch_b:.0f} images/s", flush=True)
    result = {
        "bench": summary("prestage bench (emulated PFS)",
                         [x["images_per_s"] for x in runs["bench"]["A"]],
                         [x["images_per_s"] for x in runs["bench"]["B"]]),
        "epoch": summary("page-cache epoch", runs["epoch"]["A"], runs["epoch"]["B"]),
    }
    for tag in "AB":
        misses = [x["misses"] for x in runs["bench"][tag]]
        result["bench"][f"{tag.lower()}_misses_median"] = statistics.median(misses)
        print(f"misses {tag}: median {statistics.median(misses)}, runs under 30: "
              f"{sum(m < 30 for m in misses)} of {len(misses)}")
    if args.out:
        report = {"builds": builds, "summary": result, "runs": runs}
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
