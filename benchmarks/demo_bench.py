"""`prestage demo` figures next to a plain single-threaded Pillow read-and-decode loop, same files,
same run.

Each repetition evicts the set from the page cache first (posix_fadvise DONTNEED), then runs
  - pil:      for each file in catalog order: open, read, decode with Pillow, resize the shorter side
              to 224 and centre-crop 224 (the same output as the demo), one thread;
  - prestage: `prestage demo`'s epoch: 2 readers, 8 prefetchers, through a fresh stage directory.
Medians of --runs repetitions, after one warm-up of each.

    python benchmarks/demo_bench.py --images 5000 --runs 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from PIL import Image

import prestage
from prestage import synth
from prestage.cli import demo


def pil_loop(paths, size=224):
    start = time.perf_counter()
    for p in paths:
        with open(p, "rb") as f:
            im = Image.open(f)
            im = im.convert("RGB")
        w, h = im.size
        scale = size / min(w, h)
        rw, rh = max(size, int(w * scale)), max(size, int(h * scale))
        im = im.resize((rw, rh), Image.BILINEAR)
        left, top = (rw - size) // 2, (rh - size) // 2
        im.crop((left, top, left + size, top + size)).tobytes()
    return len(paths) / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=5000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "prestage-demo-bench")
    p.add_argument("--json", type=Path)
    args = p.parse_args()

    source = args.data / f"synth-{args.images}"
    synth.make_synthetic_set(source, images=args.images, classes=100, seed=0, progress=False)
    cat = prestage.Catalog.from_folder(source)
    paths = [cat.source_path(i) for i in range(len(cat))]

    def prestage_run():
        stage = Path(tempfile.mkdtemp(dir=args.data))
        try:
            # The figures in notes/decoding.md, "The spine", were taken with these (the demo now sizes
            # them itself).
            return demo.run_demo(source, stage, readers=2, prefetchers=8, lookahead=4,
                                 show_progress=False)
        finally:
            shutil.rmtree(stage, ignore_errors=True)

    results = {"pil": [], "prestage": [], "stall_s": [], "stage_busy_s": [], "decode_busy_s": []}
    pil_loop(paths[:200])  # warm-up
    prestage_run()
    for _ in range(args.runs):
        demo.evict_from_page_cache(source)
        results["pil"].append(pil_loop(paths))
        r = prestage_run()  # evicts the source itself
        results["prestage"].append(r["images_per_s"])
        results["stall_s"].append(r["consumer_stall_s"])
        results["stage_busy_s"].append(r["stats"]["stage"]["busy_s"])
        results["decode_busy_s"].append(r["stats"]["decode"]["busy_s"])
        print(f"pil {results['pil'][-1]:.0f} images/s, prestage {results['prestage'][-1]:.0f} images/s",
              flush=True)
    summary = {k: statistics.median(v) for k, v in results.items()}
    summary["ratio"] = summary["prestage"] / summary["pil"]
    summary.update(images=len(cat), runs=args.runs, machine=platform.platform(),
                   mean_file_kb=sum(q.stat().st_size for q in paths) / len(paths) / 1e3)
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "runs": results}, indent=2))


if __name__ == "__main__":
    main()
