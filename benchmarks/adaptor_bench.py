"""The arrays adaptors against their baseline: prestage.torch.Loader (decode="npy") against
``torch.from_numpy`` on the batches of prestage.Loader, on the same .npy files, in the same run.

Both read the same catalog with the same options (no stage directory: the files are in the page cache
after the warm-up, so what differs is the adaptor's own work per batch). Each round times one epoch of
each, the two in turn (which goes first alternates), so they share the machine's conditions; each figure
is the median of ``--runs`` rounds after one warm-up round.

    python benchmarks/adaptor_bench.py --files 4000 --shape 3,64,64 --batch-size 64 --runs 5
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

import numpy as np
import torch

import prestage
import prestage.torch


def write_set(root: Path, files: int, shape: List[int], ragged: bool) -> prestage.Catalog:
    rng = np.random.default_rng(0)
    (root / "c").mkdir(parents=True)
    for i in range(files):
        s = list(shape)
        if ragged:
            s[0] += i % 3  # three shapes: every batch is a list
        np.save(root / "c" / f"{i:06d}.npy", rng.random(s, dtype=np.float32))
    return prestage.Catalog.from_folder(root, extensions=[".npy"])


def epoch_from_numpy(catalog: prestage.Catalog, options: Dict[str, Any]) -> int:
    """The baseline: prestage.Loader's batches made tensors by the caller."""
    samples = 0
    with prestage.Loader(catalog, decode="npy", **options) as loader:
        for batch in loader:
            arrays = batch.arrays
            tensors = [torch.from_numpy(a) for a in arrays] if batch.ragged else torch.from_numpy(arrays)
            labels = torch.from_numpy(batch.labels)
            samples += len(labels)
            del tensors, labels, batch
    return samples


def epoch_adaptor(catalog: prestage.Catalog, options: Dict[str, Any]) -> int:
    samples = 0
    with prestage.torch.Loader(catalog, decode="npy", **options) as loader:
        for arrays, labels in loader:
            samples += len(labels)
            del arrays, labels
    return samples


def timed(run: Callable[[prestage.Catalog, Dict[str, Any]], int], catalog: prestage.Catalog,
          options: Dict[str, Any]) -> float:
    start = time.perf_counter()
    samples = run(catalog, options)
    return samples / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", type=int, default=4000)
    p.add_argument("--shape", default="3,64,64", help="each array's shape, comma-separated (float32)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--readers", type=int, default=2)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--ragged", action="store_true", help="three shapes: batches are lists of tensors")
    args = p.parse_args()
    shape = [int(v) for v in args.shape.split(",")]
    options = dict(batch_size=args.batch_size, readers=args.readers, seed=1)
    with tempfile.TemporaryDirectory(prefix="prestage-adaptor-bench-") as tmp:
        catalog = write_set(Path(tmp), args.files, shape, args.ragged)
        runs: Dict[str, List[float]] = {"from_numpy": [], "adaptor": []}
        for r in range(args.runs + 1):  # round 0 warms the page cache up
            # Which goes first alternates, so neither always runs after the other.
            if r % 2:
                adaptor = timed(epoch_adaptor, catalog, options)
                base = timed(epoch_from_numpy, catalog, options)
            else:
                base = timed(epoch_from_numpy, catalog, options)
                adaptor = timed(epoch_adaptor, catalog, options)
            if r > 0:
                runs["from_numpy"].append(base)
                runs["adaptor"].append(adaptor)
    median = {k: statistics.median(v) for k, v in runs.items()}
    print(json.dumps({
        "files": args.files, "shape": shape, "ragged": args.ragged, "batch_size": args.batch_size,
        "readers": args.readers, "runs": args.runs,
        "samples_per_s": {k: round(v) for k, v in median.items()},
        "adaptor_over_from_numpy": round(median["adaptor"] / median["from_numpy"], 3),
        "all_runs": {k: [round(x) for x in v] for k, v in runs.items()},
        "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version(),
                    "torch": torch.__version__},
    }, indent=1))


if __name__ == "__main__":
    main()
