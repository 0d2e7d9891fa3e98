"""Stage 3 decode benchmark: the JPEG training path (random-resized-crop + flip) against the decode-only
limit (tjbench on the same images) and a PyTorch DataLoader, plus what HDF5's serialisation costs.

Reproducible from the repository alone: the images come from ``prestage synth``. Each figure is the
median of ``--runs`` timed runs after one warm-up run; the JSON goes to ``--json`` (default stdout).

    python benchmarks/decode_bench.py --images 2000 --runs 3 --torch-python /path/to/venv/bin/python

``--baseline DIR`` times another build of prestage (installed with ``pip install --target DIR``, e.g.
an earlier commit) on the training path in the same rounds: before and after a change, in one run.
``--unresized`` times the path without ``image_size`` instead (full decode, no resize), on the set's
images all brought to 500x375 first (one size: one array per batch), here and in the baseline.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import prestage

# The PyTorch baseline runs in its own interpreter (torch may live in another environment) and times
# one epoch each time it reads a line, so that its runs interleave with prestage's and share the
# machine's conditions.
TORCH_SCRIPT = r"""
import json, os, sys, time
import torch
from torchvision import datasets, transforms
root, workers, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tf = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                         transforms.PILToTensor()])
loader = torch.utils.data.DataLoader(datasets.ImageFolder(root, transform=tf), batch_size=batch,
                                     shuffle=True, num_workers=workers, persistent_workers=True)
def cpu_seconds():
    # This process and its worker processes (utime + stime from /proc).
    pids = [os.getpid()]
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as f:
            pids += [int(p) for p in f.read().split()]
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return total / os.sysconf("SC_CLK_TCK")
print(json.dumps({"torch": torch.__version__}), flush=True)
for line in sys.stdin:
    start, cpu, n = time.perf_counter(), cpu_seconds(), 0
    for images, labels in loader:
        n += images.shape[0]
    print(json.dumps({"rate": n / (time.perf_counter() - start), "cpu_rate": n / (cpu_seconds() - cpu)}),
          flush=True)
"""


# Another build of prestage, in its own interpreter, timed on the training path as the main process
# times this one (a new loader per epoch, timed from its first batch request).
BASELINE_SCRIPT = r"""
import json, sys, time
import prestage
root, readers, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
path = {"transform": "random-resized-crop", "image_size": (224, 224)} if sys.argv[4] == "rrc" else {}
cat = prestage.Catalog.from_folder(root)
print(json.dumps({"prestage": prestage.__version__, "module": prestage.__file__}), flush=True)
for line in sys.stdin:
    with prestage.Loader(cat, batch_size=batch, readers=readers, seed=0, **path) as loader:
        start, cpu, n, warm = time.perf_counter(), time.process_time(), 0, None
        for k, b in enumerate(loader):
            n += len(b)
            if k + 1 == loader.options.depth:
                warm = (time.perf_counter(), time.process_time(), n)
        end, cpu_end = time.perf_counter(), time.process_time()
        print(json.dumps({"rate": n / (end - start), "cpu_rate": n / (cpu_end - cpu),
                          "warm_rate": (n - warm[2]) / (end - warm[0]),
                          "warm_cpu_rate": (n - warm[2]) / (cpu_end - warm[1])}), flush=True)
"""


class Contender:
    """A loader in another interpreter that times one epoch each time it is asked (TORCH_SCRIPT,
    BASELINE_SCRIPT): its runs interleave with this process's, under the same conditions."""

    def __init__(self, python: str, script: str, args: list[str], env: dict | None = None):
        self.proc = subprocess.Popen([python, "-c", script, *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        self.hello = json.loads(self.proc.stdout.readline())

    def epoch(self) -> dict:
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def epoch_rate(loader, cpu: list | None = None, warm: list | None = None) -> float:
    """Images/s of one epoch; appends images per CPU-second of this process (all its threads) to
    `cpu` if given, and to `warm` (images/s, images per CPU-second) after the first `depth` batches:
    once every batch buffer has been used (without image_size the first batches allocate them)."""
    start, cpu_start, n, warm_at = time.perf_counter(), time.process_time(), 0, None
    for k, batch in enumerate(loader):
        n += len(batch)
        if k + 1 == loader.options.depth:
            warm_at = (time.perf_counter(), time.process_time(), n)
    end, cpu_end = time.perf_counter(), time.process_time()
    if cpu is not None:
        cpu.append(n / (cpu_end - cpu_start))
    if warm is not None:
        warm.append(((n - warm_at[2]) / (end - warm_at[0]), (n - warm_at[2]) / (cpu_end - warm_at[1])))
    return n / (end - start)


def median_rate(make_loader, runs: int) -> dict:
    """One epoch per new loader (a loader kept alive would decode the next epoch's first batches
    between runs), after one warm-up epoch (page cache)."""

    def once() -> float:
        with make_loader() as loader:
            return epoch_rate(loader)

    once()
    rates = [once() for _ in range(runs)]
    return {"median": statistics.median(rates), "runs": rates}


def tjbench_limit(paths: list[Path], benchtime: float) -> tuple[float, float]:
    """Decode-only images/s on one core: each image's frame rate from tjbench (full decode to RGB),
    combined as the rate of decoding the whole sample once (n / sum of per-image times). Also the
    same per CPU-second: each frame rate scaled by tjbench's wall time over its CPU time (the share
    of a core it got on a shared machine)."""
    seconds = cpu_seconds = 0.0
    for p in paths:
        before, wall = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        out = subprocess.run(["tjbench", str(p), "-rgb", "-benchtime", str(benchtime),
                              "-warmup", str(benchtime / 4)],
                             capture_output=True, text=True, check=True).stdout
        wall = time.perf_counter() - wall
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        fps = float(re.search(r"Decompress\s+--> Frame rate:\s+([\d.]+) fps", out).group(1))
        seconds += 1.0 / fps
        cpu_seconds += 1.0 / (fps * wall / cpu)
    return len(paths) / seconds, len(paths) / cpu_seconds


def tjbench_concurrent(paths: list[Path], benchtime: float, processes: int) -> float:
    """Decode-only images/s of `processes` tjbench processes running at once, each on every
    `processes`-th image of the sample: what the machine gives that many decoding threads now.
    On an idle machine it is `processes` times the one-core figure; on a shared one it can be
    less, because other jobs hold some of the cores."""

    def rate(part: list[Path]) -> float:
        seconds = 0.0
        for p in part:
            out = subprocess.run(["tjbench", str(p), "-rgb", "-benchtime", str(benchtime),
                                  "-warmup", str(benchtime / 4)],
                                 capture_output=True, text=True, check=True).stdout
            seconds += 1.0 / float(re.search(r"Decompress\s+--> Frame rate:\s+([\d.]+) fps", out).group(1))
        return len(part) / seconds

    with concurrent.futures.ThreadPoolExecutor(processes) as pool:
        return sum(pool.map(rate, [paths[k::processes] for k in range(processes)]))


def hdf5_cost(work: Path, runs: int) -> dict:
    """Rows/s reading the same arrays from HDF5 (calls serialised by one lock) and from .npy files
    (lock-free), with 1 and 2 readers."""
    import h5py

    rows, shape = 512, (4, 128, 128)
    rng = np.random.default_rng(0)
    data = rng.normal(size=(rows, *shape)).astype(np.float32)
    h5_dir, npy_dir = work / "h5", work / "npy" / "c"
    h5_dir.mkdir(parents=True, exist_ok=True)
    npy_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for f in range(4):
        path = h5_dir / f"part_{f}.h5"
        with h5py.File(path, "w") as h5:
            h5["x"] = data[f * rows // 4:(f + 1) * rows // 4]
        paths.append(path)
    for i in range(rows):
        np.save(npy_dir / f"{i:04d}.npy", data[i])
    result = {"rows": rows, "row_bytes": int(data[0].nbytes)}
    h5_cat = prestage.Catalog.from_hdf5(paths, "x")
    npy_cat = prestage.Catalog.from_folder(work / "npy", extensions=[".npy"])
    for name, cat, decode in (("hdf5", h5_cat, "hdf5"), ("npy", npy_cat, "npy")):
        for readers in (1, 2):
            r = median_rate(lambda: prestage.Loader(cat, batch_size=32, decode=decode, readers=readers), runs)
            result[f"{name}_readers{readers}"] = r
    return result


def one_size(src: Path, out: Path, size: tuple[int, int] = (500, 375)) -> Path:
    """The images of `src` resized to `size` (width, height) and saved again (quality 90) under `out`,
    in the same class folders; made once."""
    from PIL import Image

    if (out / ".done").exists():
        return out
    for path in sorted(src.rglob("*.jpg")):
        target = out / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        with Image.open(path) as im:
            im.convert("RGB").resize(size).save(target, quality=90)
    (out / ".done").touch()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--tjbench-images", type=int, default=400,
                        help="images timed with tjbench, evenly spaced in order of file size (0: every image)")
    parser.add_argument("--tjbench-time", type=float, default=0.1, help="tjbench's -benchtime per image, seconds")
    parser.add_argument("--data", default=None, help="where the synthetic set is made (default: a temp dir)")
    parser.add_argument("--torch-python", default=None,
                        help="a Python with torch and torchvision for the DataLoader baseline (default: none)")
    parser.add_argument("--skip-hdf5", action="store_true")
    parser.add_argument("--baseline", default=None,
                        help="a folder holding another build of prestage (pip install --target): timed "
                             "on the training path in the same rounds")
    parser.add_argument("--unresized", action="store_true",
                        help="time the path without image_size (full decode) on the images brought to "
                             "one size, instead of the random-resized-crop training path")
    parser.add_argument("--json", default=None, help="write the results here (default: stdout)")
    args = parser.parse_args()
    if args.unresized and args.torch_python:
        parser.error("--torch-python times the random-resized-crop path: not with --unresized")

    work = Path(args.data or tempfile.mkdtemp(prefix="prestage-decode-bench-"))
    images = work / "imagenet-like"
    subprocess.run([sys.executable, "-m", "prestage", "synth", str(images), "--images", str(args.images),
                    "--classes", "10", "--seed", "0", "--quiet"], check=True)
    if args.unresized:
        images = one_size(images, work / "one-size")
    cat = prestage.Catalog.from_folder(images)
    results = {
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                    "python": platform.python_version(), "prestage": prestage.__version__},
        "set": {"images": len(cat), "bytes": sum(cat.source_path(i).stat().st_size for i in range(len(cat)))},
        "readers": args.readers, "batch_size": args.batch_size, "runs": args.runs,
        "timed_path": "unresized" if args.unresized else "random-resized-crop",
    }
    common = dict(batch_size=args.batch_size, image_size=(224, 224), readers=args.readers, seed=0)
    results["center_crop"] = median_rate(lambda: prestage.Loader(cat, **common), args.runs)

    # The training path, tjbench and PyTorch in rounds: one run of each per round.
    # A sample with the set's distribution of file sizes (decode time follows the bytes): the
    # set's sizes follow the image index with short periods, so every k-th image in index order
    # can be far from the set's mean (every 20th: 75 KB and 150 kpx on average, against 100 KB and
    # 207 kpx for the set).
    by_size = sorted(range(len(cat)), key=lambda i: (cat.source_path(i).stat().st_size, i))
    n = args.tjbench_images if 0 < args.tjbench_images < len(cat) else len(cat)
    sample = [cat.source_path(by_size[(2 * k + 1) * len(cat) // (2 * n)]) for k in range(n)]
    contender_args = [str(images), str(args.readers), str(args.batch_size),
                      "unresized" if args.unresized else "rrc"]
    # The path timed against the contenders (results under "random_resized_crop", whichever it is).
    timed = ({**common, "image_size": None} if args.unresized
             else {**common, "transform": "random-resized-crop"})
    torch = baseline = None
    if args.torch_python:
        torch = Contender(args.torch_python, TORCH_SCRIPT, contender_args)
        results["pytorch_dataloader"] = {"torch": torch.hello["torch"], "num_workers": args.readers,
                                         "runs": []}
    if args.baseline:
        env = {**os.environ, "PYTHONPATH": str(Path(args.baseline).resolve())}
        baseline = Contender(sys.executable, BASELINE_SCRIPT, contender_args, env)
        results["baseline"] = {**baseline.hello, "runs": [], "per_cpu_second_runs": [], "warm_runs": []}
    rrc, rrc_cpu, limit, limit_cpu, limit_together, torch_cpu, load = [], [], [], [], [], [], [os.getloadavg()[0]]
    rrc_warm: list = []
    # A new loader per run (see median_rate), so that no run starts with batches decoded while the
    # other contender ran.
    def rrc_epoch(cpu: list | None = None, warm: list | None = None) -> float:
        with prestage.Loader(cat, **timed) as loader:
            return epoch_rate(loader, cpu, warm)

    rrc_epoch()  # warm-up: page cache
    for contender in (torch, baseline):
        if contender:
            contender.epoch()  # warm-up
    def baseline_epoch() -> None:
        run = baseline.epoch()
        results["baseline"]["runs"].append(run["rate"])
        results["baseline"]["per_cpu_second_runs"].append(run["cpu_rate"])
        results["baseline"]["warm_runs"].append((run["warm_rate"], run["warm_cpu_rate"]))

    for k in range(args.runs):
        # The baseline goes first in every other round: neither build always runs after the other.
        if baseline and k % 2:
            baseline_epoch()
        rrc.append(rrc_epoch(rrc_cpu, rrc_warm))
        if torch:
            run = torch.epoch()
            results["pytorch_dataloader"]["runs"].append(run["rate"])
            torch_cpu.append(run["cpu_rate"])
        if baseline and not k % 2:
            baseline_epoch()
        if shutil.which("tjbench"):
            wall, cpu = tjbench_limit(sample, args.tjbench_time)
            limit.append(wall)
            limit_cpu.append(cpu)
            limit_together.append(tjbench_concurrent(sample, args.tjbench_time, args.readers))
        load.append(os.getloadavg()[0])
    if baseline:
        baseline.close()
        b = results["baseline"]
        b["median"] = statistics.median(b["runs"])
        b["per_cpu_second"] = statistics.median(b["per_cpu_second_runs"])
        # Each round's own ratio (this build over the baseline), run back to back.
        b["ratio_rounds"] = [a / r for a, r in zip(rrc, b["runs"])]
        b["ratio"] = statistics.median(b["ratio_rounds"])
        b["ratio_per_cpu_second"] = statistics.median(
            [a / r for a, r in zip(rrc_cpu, b["per_cpu_second_runs"])])
        # After the first `depth` batches of each epoch: every batch buffer allocated.
        b["warm_median"] = statistics.median(r for r, _ in b["warm_runs"])
        b["ratio_warm_rounds"] = [a[0] / r[0] for a, r in zip(rrc_warm, b["warm_runs"])]
        b["ratio_warm"] = statistics.median(b["ratio_warm_rounds"])
        b["ratio_warm_per_cpu_second"] = statistics.median(
            [a[1] / r[1] for a, r in zip(rrc_warm, b["warm_runs"])])
    if torch:
        torch.close()
        results["pytorch_dataloader"]["median"] = statistics.median(results["pytorch_dataloader"]["runs"])
        results["pytorch_dataloader"]["per_cpu_second"] = statistics.median(torch_cpu)
        results["pytorch_dataloader"]["per_cpu_second_runs"] = torch_cpu
    results["random_resized_crop"] = {"median": statistics.median(rrc), "runs": rrc,
                                      "per_cpu_second": statistics.median(rrc_cpu), "per_cpu_second_runs": rrc_cpu,
                                      "warm": statistics.median(r for r, _ in rrc_warm), "warm_runs": rrc_warm}
    if limit:
        per_core = statistics.median(limit)
        results["tjbench_decode_only"] = {"images": len(sample), "benchtime": args.tjbench_time,
                                          "set_mean_bytes": results["set"]["bytes"] / len(cat),
                                          "mean_bytes": statistics.mean(p.stat().st_size for p in sample),
                                          "per_core_runs": limit, "per_cpu_second_runs": limit_cpu,
                                          "per_core": per_core, "readers": per_core * args.readers,
                                          "concurrent_runs": limit_together,
                                          "concurrent": statistics.median(limit_together),
                                          "per_cpu_second": statistics.median(limit_cpu)}
    results["load_average_1min"] = load
    results["random_resized_crop_1_reader"] = median_rate(
        lambda: prestage.Loader(cat, transform="random-resized-crop", **{**common, "readers": 1}), args.runs)

    rate = results["random_resized_crop"]["median"]
    if "pytorch_dataloader" in results:
        results["ratio_vs_pytorch"] = rate / results["pytorch_dataloader"]["median"]
    if "tjbench_decode_only" in results:
        results["ratio_vs_decode_only"] = rate / results["tjbench_decode_only"]["readers"]
        results["ratio_vs_concurrent_decode_only"] = rate / results["tjbench_decode_only"]["concurrent"]
    # Each round's own ratio, its contenders having run back to back: steadier than a ratio of
    # medians when the machine's load drifts between rounds.
    if "pytorch_dataloader" in results:
        results["ratio_vs_pytorch_rounds"] = [a / b for a, b in zip(rrc, results["pytorch_dataloader"]["runs"])]
    if limit:
        results["ratio_vs_decode_only_rounds"] = [a / (b * args.readers) for a, b in zip(rrc, limit)]
        results["ratio_vs_concurrent_decode_only_rounds"] = [a / b for a, b in zip(rrc, limit_together)]
    # The same ratios per CPU-second: what each would do on dedicated cores, on a shared machine.
    per_cpu = results["random_resized_crop"]["per_cpu_second"]
    if "pytorch_dataloader" in results:
        results["ratio_vs_pytorch_per_cpu_second"] = per_cpu / results["pytorch_dataloader"]["per_cpu_second"]
    if "tjbench_decode_only" in results:
        results["ratio_vs_decode_only_per_cpu_second"] = per_cpu / results["tjbench_decode_only"]["per_cpu_second"]
    if not args.skip_hdf5:
        results["hdf5_serialisation"] = hdf5_cost(work / "arrays", args.runs)

    text = json.dumps(results, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
