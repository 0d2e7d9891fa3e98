"""Memory over a long run: one loader iterated epoch after epoch, its process's resident memory (VmRSS,
after a garbage collection) and open file descriptors read after every epoch, for every decode kind
and surface, each in a process of its own.

    python benchmarks/soak_bench.py --out soak/ --epochs 300            # every mode, plot and table
    python benchmarks/soak_bench.py --out soak/ --epochs 40 --modes jpeg-full,raw,jpeg-fixed-bounded

Writes ``soak.json`` (every mode's per-epoch figures), ``soak.png`` (RSS per epoch, one line a
mode) and prints a Markdown table: RSS at the start (before the loader), at epoch 2, at the last
epoch, the growth per epoch from epoch 2 and over the last three quarters of the run, and after
close. A mode needing what is not installed (PyTorch, TensorFlow, h5py) is skipped with the reason.

One mode alone, in this process (what the driver runs in each child; JSON on stdout):

    python benchmarks/soak_bench.py --run-one jpeg-full --data soak/data --epochs 40
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Tuple

import numpy as np

# mode: (what it needs, what it is)
MODES: Dict[str, Tuple[str, str]] = {
    "jpeg-fixed": ("", "prestage.Loader, image_size=(64, 64), no stage directory"),
    "jpeg-fixed-bounded": ("", "same, stage directory bounded at 30% of the set"),
    "jpeg-full": ("", "prestage.Loader, image_size=None (ragged full-size images)"),
    "jpeg-full-stage": ("", "same, unbounded stage directory"),
    "raw": ("", "prestage.Loader, decode='raw' over the JPEG files (ragged bytes)"),
    "raw-bounded": ("", "same, stage directory bounded at 30% of the set"),
    "npy": ("", "prestage.Loader over .npy files of mixed shapes (from_folder)"),
    "hdf5": ("h5py", "prestage.Loader over HDF5 rows (from_hdf5)"),
    "tfrecord": ("tensorflow", "prestage.Loader over TFRecord records of the JPEGs, image_size=None"),
    "torch-full": ("torch", "prestage.torch.Loader(image_size=None, layout='NHWC')"),
    "tf-fixed": ("tensorflow", "prestage.tf.dataset, image_size=(64, 64)"),
    "sampler-workers": ("torch", "prestage.torch.StagedSampler + DataLoader(num_workers=2), stage directory"),
}
BATCH = 32


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError("no VmRSS in /proc/self/status")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def make_data(root: Path, images: int, modes: List[str]) -> None:
    """What `modes` read: the JPEGs (prestage synth), .npy files of mixed shapes, one HDF5 file, one
    TFRecord file of the JPEGs."""
    import prestage.synth

    prestage.synth.make_synthetic_set(root / "jpeg", images, 4, seed=1, progress=False)
    rng = np.random.default_rng(0)
    npy = root / "npy" / "class_0"
    if "npy" in modes and not npy.exists():
        npy.mkdir(parents=True)
        for i in range(images):
            np.save(npy / f"a_{i:04d}.npy", rng.random((int(rng.integers(8, 64)), 64), dtype=np.float32))
    if "hdf5" in modes and importlib.util.find_spec("h5py") is not None:
        import h5py

        with h5py.File(root / "rows.h5", "w") as f:
            f["data"] = rng.random((images, 32, 32), dtype=np.float32)
            f["labels"] = np.arange(images) % 4
    if "tfrecord" in modes and importlib.util.find_spec("tensorflow") is not None:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        import tensorflow as tf

        files = sorted((root / "jpeg").rglob("*.jpg"))
        with tf.io.TFRecordWriter(str(root / "images.tfrecord")) as w:
            for k, p in enumerate(files):
                feature = {
                    "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[p.read_bytes()])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[k % 4])),
                }
                w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def _bounded(root: Path) -> int:
    return int(sum(p.stat().st_size for p in (root / "jpeg").rglob("*.jpg")) * 0.3)


def _iterate(mode: str, data: Path, stage: Path) -> Tuple[Callable[[], Iterable[Any]], Callable[[], None]]:
    """The mode's loader: a function that gives one epoch's batches, and its close."""
    import prestage

    jpegs = lambda: prestage.Catalog.from_folder(data / "jpeg")  # noqa: E731
    if mode.startswith("jpeg") or mode.startswith("raw"):
        options: Dict[str, Any] = {"batch_size": BATCH}
        if mode.startswith("jpeg-fixed"):
            options["image_size"] = (64, 64)
        if mode.startswith("raw"):
            options["decode"] = "raw"
        if mode.endswith("-bounded"):
            options.update(stage_dir=stage, cache_bytes=_bounded(data))
        if mode.endswith("-stage"):
            options["stage_dir"] = stage
        loader = prestage.Loader(jpegs(), **options)
        return (lambda: loader), loader.close
    if mode == "npy":
        loader = prestage.Loader(prestage.Catalog.from_folder(data / "npy", extensions=[".npy"]),
                                 batch_size=BATCH, decode="npy")
        return (lambda: loader), loader.close
    if mode == "hdf5":
        loader = prestage.Loader(prestage.Catalog.from_hdf5([str(data / "rows.h5")], "data", labels="labels"),
                                 batch_size=BATCH)
        return (lambda: loader), loader.close
    if mode == "tfrecord":
        catalog = prestage.Catalog.from_tfrecord([str(data / "images.tfrecord")],
                                                 features={"image": "image", "label": "label"})
        loader = prestage.Loader(catalog, batch_size=BATCH)
        return (lambda: loader), loader.close
    if mode == "torch-full":
        import prestage.torch

        tl = prestage.torch.Loader(jpegs(), batch_size=BATCH, image_size=None, layout="NHWC")
        return (lambda: tl), tl.close
    if mode == "tf-fixed":
        import prestage.tf

        ds = prestage.tf.dataset(jpegs(), batch_size=BATCH, image_size=(64, 64))
        return (lambda: ds), lambda: None
    if mode == "sampler-workers":
        import io

        from PIL import Image

        import prestage.torch

        def read(sample: Any, label: int) -> Any:
            with Image.open(io.BytesIO(sample.bytes())) as im:
                return np.asarray(im.convert("RGB").resize((32, 32))), label

        sampler = prestage.torch.StagedSampler(jpegs(), batch_size=BATCH, stage_dir=stage, num_workers=2)
        dl = sampler.data_loader(prestage.torch.StagedDataset(sampler, read=read), persistent_workers=True)
        epochs = iter(range(1 << 30))

        def one_epoch() -> Iterable[Any]:
            sampler.set_epoch(next(epochs))
            return dl

        return one_epoch, sampler.close
    raise SystemExit(f"unknown mode {mode!r}")


def run_one(mode: str, data: Path, epochs: int) -> Dict[str, Any]:
    """Runs one mode in this process; its per-epoch RSS (MB) and open descriptors."""
    stage = Path(tempfile.mkdtemp(prefix="soak-stage-"))
    needs = MODES[mode][0]
    if needs in ("torch", "tensorflow"):
        __import__(needs)  # the framework's own memory is not the loader's: counted in the start
    try:
        gc.collect()
        start, start_fds = rss_mb(), open_fds()
        epoch, close = _iterate(mode, data, stage)
        rss: List[float] = []
        fds: List[int] = []
        t0 = time.perf_counter()
        for _ in range(epochs):
            for batch in epoch():
                del batch
            gc.collect()
            rss.append(rss_mb())
            fds.append(open_fds())
        seconds = time.perf_counter() - t0
        close()
        del epoch, close
        gc.collect()
        return {"mode": mode, "start": start, "start_fds": start_fds, "rss": rss, "fds": fds,
                "closed": rss_mb(), "closed_fds": open_fds(), "seconds": seconds}
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def growth_per_epoch(rss: List[float], since: int) -> float:
    """MB per epoch from epoch `since` to the last."""
    last = len(rss) - 1
    return (rss[last] - rss[since]) / (last - since) if last > since else 0.0


def table(results: List[Dict[str, Any]]) -> str:
    rows = ["| mode | start | epoch 2 | last | growth/epoch from 2 | growth/epoch, last 3/4 | after close | fds start → last |",
            "|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "skipped" in r:
            rows.append(f"| {r['mode']} | skipped: {r['skipped']} |||||||")
            continue
        rss = r["rss"]
        quarter = len(rss) // 4
        rows.append(
            f"| {r['mode']} | {r['start']:.0f} MB | {rss[2]:.0f} MB | {rss[-1]:.0f} MB "
            f"| {growth_per_epoch(rss, 2) * 1024:.0f} KB | {growth_per_epoch(rss, quarter) * 1024:.0f} KB "
            f"| {r['closed']:.0f} MB | {r['start_fds']} → {r['fds'][-1]} |")
    return "\n".join(rows)


def plot(results: List[Dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    for r in results:
        if "rss" in r:
            ax.plot(range(len(r["rss"])), r["rss"], label=r["mode"])
    ax.set_xlabel("epoch")
    ax.set_ylabel("RSS after the epoch (MB)")
    ax.set_title("prestage: resident memory over a long run, one process per mode")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="where the data, soak.json and soak.png go")
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--images", type=int, default=256, help="samples per data set")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated, of: " + ", ".join(MODES))
    parser.add_argument("--run-one", metavar="MODE", help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.epochs < 4:
        parser.error("--epochs must be at least 4")
    if args.run_one:
        print(json.dumps(run_one(args.run_one, args.data, args.epochs)))
        return
    if args.out is None:
        parser.error("--out is required")
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            parser.error(f"unknown mode {m!r}; the modes are {', '.join(MODES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    data = args.out / "data"
    print(f"the data sets ({args.images} samples each) in {data}", file=sys.stderr)
    make_data(data, args.images, modes)
    results: List[Dict[str, Any]] = []
    for m in modes:
        needs = MODES[m][0]
        if needs and importlib.util.find_spec(needs) is None:
            results.append({"mode": m, "skipped": f"needs {needs}"})
            continue
        print(f"{m}: {args.epochs} epochs ...", file=sys.stderr, flush=True)
        out = subprocess.run([sys.executable, __file__, "--run-one", m, "--data", str(data),
                              "--epochs", str(args.epochs)], capture_output=True, text=True)
        if out.returncode != 0:
            results.append({"mode": m, "skipped": f"failed: {out.stderr.strip().splitlines()[-1:]}"})
            continue
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    (args.out / "soak.json").write_text(json.dumps(results, indent=1))
    plot(results, args.out / "soak.png")
    print(table(results))
    print(f"\n{args.out / 'soak.json'}, {args.out / 'soak.png'}")


if __name__ == "__main__":
    main()
