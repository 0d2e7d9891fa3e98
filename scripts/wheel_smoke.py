"""Smoke test of an installed prestage wheel, run by scripts/wheel-check.sh in a fresh virtual environment.

    python wheel_smoke.py [--torch | --h5py] [--reference EPOCH.npz] DATA FORBIDDEN_DIR...
    python wheel_smoke.py --write-reference EPOCH.npz DATA

DATA holds what a full development environment made beforehand (this environment has only the
wheel's required dependencies): images/ (a synthetic JPEG set, one folder per class), fields.h5
(gzip-compressed rows, written by h5py) and fields.npy (the same rows, the oracle); others/ (PNG and
WebP files, written by Pillow) and others.npy (Pillow's pixels of them, in file name order). FORBIDDEN_DIR:
directories no library of this process may come from (the repository, the wheel's build cache).

--reference EPOCH.npz: also one epoch of the JPEG set with ``transform="random-resized-crop"``, equal
pixel for pixel to the same epoch written by ``--write-reference`` with another build of prestage (the
development build): the decoder, the crop's draws and the resize agree across builds and machines.
--torch: only the PyTorch adaptor (PyTorch installed after the first run). --h5py: only the HDF5 rows
read by prestage and by h5py in the same process, each with its own HDF5 library (h5py installed
after the first run). PRESTAGE_CHECK_T0 (a Unix
time): when the wheel's installation began, to print the time from it to the first batch.
Prints one line per check; exits non-zero on the first failure.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

# Libraries the wheel bundles: a copy of any of them from outside this environment means the wheel
# is not self-contained (or found the build machine's copy).
BUNDLED = re.compile(r"lib(tbb|turbojpeg|jpeg|zstd|hdf5|curl|sz|aec|png|webp)[^/]*\.so")


PASSED = 0


def check(ok: bool, what: str) -> None:
    global PASSED
    if not ok:
        print(f"FAIL {what}", flush=True)
        print(f"wheel smoke: {PASSED} passed, 1 failed", flush=True)
        sys.exit(1)
    PASSED += 1
    print(f"ok   {what}", flush=True)


def mapped_libraries() -> list[str]:
    paths = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and ".so" in parts[5]:
                paths.add(os.path.realpath(parts[5].strip()))
    return sorted(paths)


# The epoch compared across builds: random-resized-crop, seeded; the images in sample order.
RRC = dict(batch_size=32, image_size=(48, 56), transform="random-resized-crop", seed=11)


def rrc_epoch(data: Path, epoch: int = 1):  # type: ignore[no-untyped-def]
    import numpy as np

    import prestage

    catalog = prestage.Catalog.from_folder(data / "images")
    images, indices = [], []
    with prestage.Loader(catalog, stage_dir=str(data / "stage-rrc"), **RRC) as loader:  # type: ignore[arg-type]
        loader.set_epoch(epoch)
        for batch in loader:
            images.append(np.array(batch.images))
            indices.append(np.array(batch.indices))
    order = np.argsort(np.concatenate(indices), kind="stable")
    return np.concatenate(images)[order], np.concatenate(indices)[order]


def main() -> int:
    args = sys.argv[1:]
    mode = args.pop(0) if args[:1] in (["--torch"], ["--h5py"]) else ""
    reference = None
    if args[:1] == ["--write-reference"]:
        import numpy as np
        images, indices = rrc_epoch(Path(args[2]))
        np.savez(args[1], images=images, indices=indices)
        print(f"reference epoch: {images.shape} into {args[1]}")
        sys.exit(0)
    if args[:1] == ["--reference"]:
        reference = Path(args[1])
        args = args[2:]
    data = Path(args[0])
    forbidden = [os.path.realpath(d) for d in args[1:]]
    if mode == "--torch":
        return adaptor(data)
    if mode == "--h5py":
        return with_h5py(data)
    start = time.perf_counter()
    import numpy as np

    import prestage

    check(Path(prestage.__file__).resolve().is_relative_to(Path(sys.prefix).resolve()),
          f"import prestage from this environment ({prestage.__file__})")

    # The loader on the JPEG set: the first batch.
    catalog = prestage.Catalog.from_folder(data / "images")
    with prestage.Loader(catalog, batch_size=32, image_size=(64, 64), stage_dir=str(data / "stage")) as loader:
        it = iter(loader)
        first = next(it)
        since_install = (f", {time.time() - float(os.environ['PRESTAGE_CHECK_T0']):.1f} s after pip install began"
                         if os.environ.get("PRESTAGE_CHECK_T0") else "")
        print(f"     first batch {time.perf_counter() - start:.2f} s into this script, imports included{since_install}", flush=True)
        check(first.images.shape == (32, 64, 64, 3), f"first batch {first.images.shape}")
        rest = sum(len(b.labels) for b in it)
        check(32 + rest == len(catalog), f"one epoch: {32 + rest} of {len(catalog)} images")
        pinned_why = loader.stats()["pinned_why"]
    print(f"     batch buffers: {pinned_why}", flush=True)

    # HDF5, statically linked, with its deflate filter: rows equal to h5py's.
    expected = np.load(data / "fields.npy")
    h5 = prestage.Catalog.from_hdf5([data / "fields.h5"], "x")
    with prestage.Loader(h5, batch_size=len(expected), shuffle=False, decode="hdf5") as loader:
        batch = next(iter(loader))
        check(np.array_equal(batch.arrays, expected),
              f"HDF5 gzip rows equal h5py's ({expected.shape})")

    # PNG and WebP (libpng and libwebp, statically linked): Pillow's pixels.
    if (data / "others").is_dir():
        expected = np.load(data / "others.npy")
        others = prestage.Catalog.from_folder(data / "others", extensions=[".png", ".webp"])
        with prestage.Loader(others, batch_size=len(expected), shuffle=False, decode="image") as loader:
            batch = next(iter(loader))
            check(np.array_equal(batch.images, expected),
                  f"PNG and WebP images equal Pillow's ({expected.shape})")

    if reference is not None:
        ref = np.load(reference)
        images, indices = rrc_epoch(data)
        check(np.array_equal(indices, ref["indices"]) and images.shape == ref["images"].shape,
              f"random-resized-crop epoch: {images.shape[0]} samples, as the reference's")
        differ = int(np.count_nonzero(images != ref["images"]))
        check(differ == 0, f"random-resized-crop epoch equal to the reference pixel for pixel "
                           f"({differ} of {images.size} values differ)")

    # No library from the build machine: nothing bundled comes from outside this environment.
    here = os.path.realpath(sys.prefix)
    libs = mapped_libraries()
    outside = [p for p in libs if BUNDLED.search(os.path.basename(p)) and not p.startswith(here + os.sep)]
    check(not outside, f"bundled libraries loaded from the wheel only (outside: {outside})")
    leaked = [p for p in libs for d in forbidden if p.startswith(d + os.sep)]
    check(not leaked, f"no library from the build tree or cache (found: {leaked})")

    # The command line: every sub-command's --help with only the required dependencies.
    from prestage.cli import COMMANDS

    exe = Path(sys.executable).parent / "prestage"
    for name in COMMANDS:
        r = subprocess.run([str(exe), name, "--help"], capture_output=True, text=True)
        check(r.returncode == 0 and "usage:" in r.stdout,
              f"prestage {name} --help" + ("" if r.returncode == 0 else f": {r.stderr.strip()[-300:]}"))

    # prestage demo on the JPEG set.
    r = subprocess.run([str(exe), "demo", str(data / "images"), "--quiet", "--json", "--batch-size", "32"],
                       capture_output=True, text=True)
    check(r.returncode == 0, "prestage demo" + ("" if r.returncode == 0 else f": {r.stderr.strip()[-500:]}"))
    figures = json.loads(r.stdout)
    check(figures.get("images") == len(catalog), f"prestage demo: {figures.get('images')} images")

    return 0


def with_h5py(data: Path) -> int:
    """HDF5 rows by prestage (its HDF5 linked in, hidden) and by h5py (its own) in one process."""
    import h5py
    import numpy as np

    import prestage

    path = data / "fields.h5"
    with h5py.File(path, "r") as f:
        theirs = f["x"][...]
        catalog = prestage.Catalog.from_hdf5([path], "x")  # while h5py holds the file open
        with prestage.Loader(catalog, batch_size=len(theirs), shuffle=False, decode="hdf5") as loader:
            ours = next(iter(loader)).arrays
    check(np.array_equal(ours, theirs), f"HDF5 rows equal h5py's in the same process ({theirs.shape}, "
                                        f"h5py {h5py.__version__}, its HDF5 {h5py.version.hdf5_version})")
    hdf5 = [p for p in mapped_libraries() if "hdf5" in os.path.basename(p)]
    check(all("h5py" in p for p in hdf5), f"the only HDF5 library mapped is h5py's ({hdf5})")
    return 0


def adaptor(data: Path) -> int:
    """The PyTorch adaptor on 3 batches: tensors viewing the batch buffers, channels first by default."""
    import torch

    import prestage
    import prestage.torch as pt

    catalog = prestage.Catalog.from_folder(data / "images")
    with pt.Loader(catalog, batch_size=16, image_size=(32, 32), stage_dir=str(data / "stage")) as loader:
        n = 0
        for images, labels in loader:
            check(isinstance(images, torch.Tensor) and tuple(images.shape) == (16, 3, 32, 32)
                  and images.dtype == torch.uint8 and labels.dtype == torch.int64,
                  f"PyTorch batch {n}: {tuple(images.shape)} {images.dtype}, labels {labels.dtype}")
            check(set(labels.tolist()) <= set(range(4)), f"PyTorch batch {n}: labels of the 4 classes")
            n += 1
            if n == 3:
                break
    return 0


if __name__ == "__main__":
    code = main()
    print(f"wheel smoke: {PASSED} passed, 0 failed", flush=True)
    sys.exit(code)
