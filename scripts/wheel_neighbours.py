"""The portable wheel side by side with PyTorch and TensorFlow in one process (scripts/bullseye-check.sh).

    python wheel_neighbours.py DATA

The wheel's extension carries its own C++ runtime (LLVM's libc++, linked in, every symbol hidden);
PyTorch and TensorFlow load GCC's libstdc++ and their own copies of oneTBB-like and protobuf-like
libraries. In a fresh process per import order (PyTorch and TensorFlow first, then prestage; prestage
first, then them), each check here must pass:

- both runtimes are mapped (libstdc++ from the system, prestage's extension) and prestage's
  ``_core`` exports ``PyInit__core`` alone;
- the PyTorch adaptor's epoch of DATA/images (every sample once, uint8 tensors, labels of the classes);
- the TensorFlow adaptor's epoch (``prestage.tf.dataset``), the same samples;
- an exception thrown in C++ (a corrupt JPEG under ``on_error="raise"``; a file that is not HDF5)
  arrives in Python as prestage's error, naming the file, while PyTorch is loaded, and the loader works
  after it;
- PyTorch and TensorFlow still raise and catch their own C++ errors (a shape mismatch each).

Prints one line per check; exits non-zero on the first failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

PASSED = 0


def check(ok: bool, what: str) -> None:
    global PASSED
    if not ok:
        print(f"FAIL {what}", flush=True)
        print(f"wheel neighbours: {PASSED} passed, 1 failed", flush=True)
        sys.exit(1)
    PASSED += 1
    print(f"ok   {what}", flush=True)


def mapped(pattern: str) -> list[str]:
    found = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and pattern in os.path.basename(parts[5].strip()):
                found.add(parts[5].strip())
    return sorted(found)


def run(data: Path, order: str) -> None:
    if order == "frameworks-first":
        import tensorflow as tf
        import torch

        import prestage
    else:
        import prestage
        import tensorflow as tf
        import torch
    import numpy as np

    import prestage.tf as ptf
    import prestage.torch as pt

    check(bool(mapped("libstdc++")) and bool(mapped("_core")),
          f"{order}: torch {torch.__version__}, tensorflow {tf.__version__}, prestage loaded; "
          f"GCC's runtime mapped ({mapped('libstdc++')[:1]})")

    catalog = prestage.Catalog.from_folder(data / "images")
    n = len(catalog)
    seen: list[int] = []
    with pt.Loader(catalog, batch_size=16, image_size=(32, 32), stage_dir=str(data / "stage")) as loader:
        for images, labels in loader:
            assert images.dtype == torch.uint8 and tuple(images.shape[1:]) == (3, 32, 32)
            seen.extend(labels.tolist())
    check(len(seen) == n // 16 * 16 or len(seen) == n,
          f"{order}: PyTorch adaptor epoch, {len(seen)} samples of {n}")

    ds = ptf.dataset(catalog, batch_size=16, image_size=(32, 32), stage_dir=str(data / "stage"))
    count = 0
    for images, labels in ds:
        assert images.dtype == tf.uint8 and tuple(images.shape[1:]) == (32, 32, 3)
        count += int(labels.shape[0])
    check(count == len(seen), f"{order}: TensorFlow adaptor epoch, {count} samples")

    # C++ exceptions crossing into Python while PyTorch (and its libstdc++) is loaded.
    bad = data / f"bad-{order}"
    shutil.rmtree(bad, ignore_errors=True)
    (bad / "a").mkdir(parents=True)
    (bad / "a" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a JPEG at all" * 8)
    try:
        with prestage.Loader(prestage.Catalog.from_folder(bad), batch_size=1, image_size=(8, 8),
                             stage_dir=str(data / "stage"), on_error="raise") as loader:
            next(iter(loader))
        check(False, f"{order}: a corrupt JPEG raised nothing")
    except prestage.DecodeError as e:
        check("broken.jpg" in str(e), f"{order}: C++ decode error caught in Python: {str(e)[:90]}")
    try:
        prestage.Catalog.from_hdf5([data / "fields.npy"], "x")
        check(False, f"{order}: a file that is not HDF5 raised nothing")
    except prestage.Error as e:
        check("fields.npy" in str(e), f"{order}: C++ HDF5 error caught in Python: {str(e)[:90]}")
    shutil.rmtree(bad, ignore_errors=True)
    with prestage.Loader(catalog, batch_size=16, image_size=(32, 32), stage_dir=str(data / "stage")) as loader:
        check(next(iter(loader)).images.shape == (16, 32, 32, 3), f"{order}: the loader works after them")

    try:
        torch.ones(2, 3) @ torch.ones(2, 3)
        check(False, f"{order}: torch's shape error raised nothing")
    except RuntimeError as e:
        check("shape" in str(e) or "size" in str(e), f"{order}: PyTorch's own C++ error: {str(e)[:60]}")
    try:
        tf.matmul(tf.ones((2, 3)), tf.ones((2, 3)))
        check(False, f"{order}: TensorFlow's shape error raised nothing")
    except (tf.errors.InvalidArgumentError, ValueError) as e:
        check(True, f"{order}: TensorFlow's own error: {type(e).__name__}")
    check(np.array_equal(np.asarray(torch.arange(3)), np.arange(3)), f"{order}: torch works after all")


def main() -> int:
    args = sys.argv[1:]
    if args[:1] == ["--order"]:
        run(Path(args[2]), args[1])
        print(f"wheel neighbours: {PASSED} passed, 0 failed", flush=True)
        return 0
    data = Path(args[0])
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    for order in ("frameworks-first", "prestage-first"):
        r = subprocess.run([sys.executable, __file__, "--order", order, str(data)], env=env)
        if r.returncode != 0:
            return r.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
