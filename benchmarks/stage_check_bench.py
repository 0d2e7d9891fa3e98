"""What checking every read from the stage directory costs: epochs served from a warm stage directory
(JPEG random-resized-crop to 224, and raw files), this build against another one (``--baseline``, a
``pip install --target`` of an earlier commit), in alternating rounds of the same process pair.

Each build runs in its own interpreter with its own stage directory over the same files, stages them
in a warm-up epoch, then times one epoch per round (every sample a hit: read from the SSD copy and,
in this build, checked against its CRC-32C). Figures: samples/s per round, and the median of each
round's ratio (this build over the baseline, run back to back).

    python benchmarks/stage_check_bench.py --baseline /tmp/before --images 2000 --rounds 7
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

from decode_bench import Contender  # a build in its own interpreter, one epoch per request

WORKER = r"""
import json, sys, time
import prestage
root, stage, mode, readers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
cat = prestage.Catalog.from_folder(root, [".jpg"] if mode == "jpeg" else [".bin"])
opts = ({"image_size": (224, 224), "transform": "random-resized-crop"} if mode == "jpeg"
        else {"decode": "raw"})
loader = prestage.Loader(cat, batch_size=64, readers=readers, stage_dir=stage, stage_patience=None,
                         seed=0, **opts)
for _ in loader:  # epoch 0 stages every file
    pass
print(json.dumps({"module": prestage.__file__}), flush=True)
epoch = 0
for line in sys.stdin:
    epoch += 1
    loader.set_epoch(epoch)
    start, n = time.perf_counter(), 0
    for b in loader:
        n += len(b.indices)
    s = loader.stats()
    print(json.dumps({"rate": n / (time.perf_counter() - start), "hits": s["hits"],
                      "stage_corrupt": s.get("stage_corrupt", 0)}), flush=True)
loader.close()
"""


def make_raw(root: Path, n: int, size: int) -> None:
    rng = __import__("numpy").random.default_rng(0)
    (root / "c0").mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (root / "c0" / f"{i:05d}.bin").write_bytes(rng.bytes(size))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--raw-bytes", type=int, default=110_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--data", default=None)
    args = parser.parse_args()
    work = Path(args.data or tempfile.mkdtemp(prefix="stage-check-"))
    jpegs = work / "jpeg"
    if not jpegs.exists():
        subprocess.run([sys.executable, "-m", "prestage", "synth", str(jpegs), "--images",
                        str(args.images), "--quiet"], check=True)
    raw = work / "raw"
    if not raw.exists():
        make_raw(raw, args.images, args.raw_bytes)
    results: dict = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                     "images": args.images, "rounds": args.rounds, "readers": args.readers}
    for mode, root in (("jpeg", jpegs), ("raw", raw)):
        this = Contender(sys.executable, WORKER,
                         [str(root), str(work / f"stage-{mode}-this"), mode, str(args.readers)],
                         dict(os.environ))
        base = Contender(sys.executable, WORKER,
                         [str(root), str(work / f"stage-{mode}-base"), mode, str(args.readers)],
                         {**os.environ, "PYTHONPATH": str(Path(args.baseline).resolve())})
        rates = {"this": [], "baseline": []}
        ratios = []
        for k in range(args.rounds):
            order = [("this", this), ("baseline", base)][:: 1 if k % 2 else -1]
            got = {name: w.epoch()["rate"] for name, w in order}
            for name in got:
                rates[name].append(got[name])
            ratios.append(got["this"] / got["baseline"])
        this.close()
        base.close()
        results[mode] = {"samples_per_s": {k: statistics.median(v) for k, v in rates.items()},
                         "runs": rates, "ratio_median": statistics.median(ratios), "ratios": ratios}
        print(f"{mode}: this {statistics.median(rates['this']):,.0f}/s, baseline "
              f"{statistics.median(rates['baseline']):,.0f}/s, this/baseline median "
              f"{statistics.median(ratios):.3f} (rounds {min(ratios):.3f}-{max(ratios):.3f})",
              file=sys.stderr)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
