"""prestage catalog: walk a data set once, save its catalog, and say what is in it.

A catalog built by walking the parallel file system costs one directory read per folder and one stat per
file; every job (and every rank of it) that calls ``Catalog.from_folder`` pays that again. This walks
SOURCE once, saves the catalog to OUT, and prints the files, classes, bytes and a histogram of file
sizes. The loaders take OUT in place of a catalog, and ``prestage demo`` takes it in place of SOURCE:

  prestage catalog /pfs/imagenet/train train.catalog
  loader = prestage.Loader("train.catalog", batch_size=256, stage_dir="/local/ssd/stage")

Sizes and the report are read from the catalog itself (recorded during the walk): no second pass over
the file system. A folder of files with no sub-folders is a catalog without classes (label -1, as
``Catalog.from_folder`` reads it).

Files that hold many samples: with ``--axis`` (and ``--member``, ``--labels``) each sample is a slice
of the array in each ``.npy`` or ``.npz`` file under SOURCE (``Catalog.from_arrays``); with
``--dataset`` a slice of that dataset in each ``.h5``/``.hdf5`` file (``Catalog.from_hdf5``). The files
are taken in the walk's order, and their headers (and labels) are read once, here:

  prestage catalog /pfs/dlio/train train.catalog --axis -1 --member x --labels y

Shards: with ``--webdataset`` SOURCE is a WebDataset shard pattern (a path, a glob or a brace range,
``Catalog.from_webdataset``; ``--image`` the extensions to take, default ``jpg;jpeg``, ``--labels``
the label's extension or ``json:KEY``, default ``cls``); with ``--mds`` SOURCE is a MosaicML MDS
folder (``Catalog.from_mds``; ``--image`` and ``--labels`` name columns, default ``image`` and
``label``); with ``--hf`` SOURCE is a Hugging Face ``datasets`` set: a ``save_to_disk`` folder, a
folder of ``.arrow`` or ``.parquet`` files, a file or a glob (``Catalog.from_hf``, which needs
pyarrow; ``--image`` and ``--labels`` name columns, default ``image`` and ``label`` where the set has
one). Their headers are scanned once, here; ``--on-error skip`` keeps every good sample of a
damaged shard and reports what it left out:

  prestage catalog "/pfs/laion/train-{000000..000123}.tar" laion.catalog --webdataset
  prestage catalog /pfs/flowers flowers.catalog --hf
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Dict, List

from prestage.cli import summary
from prestage.cli.progress import progress


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "catalog",
        help=summary("catalog"),
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("source", type=Path, metavar="SOURCE", help="data set root (one folder per class)")
    p.add_argument("out", type=Path, metavar="OUT", help="file to save the catalog to")
    p.add_argument("--extensions", default=None, metavar="LIST",
                   help="file name endings to take, comma-separated (default: from_folder's, JPEG)")
    p.add_argument("--symlinks", choices=("follow", "inside"), default="follow",
                   help="how symbolic links under SOURCE are treated (see Catalog.from_folder)")
    p.add_argument("--axis", type=int, default=None, metavar="N",
                   help="samples are slices along axis N (negative: from the last) of the array in each "
                        "file, not whole files (default 0 with --member, --dataset or --labels)")
    p.add_argument("--member", default=None, metavar="NAME",
                   help=".npz files: the member to slice (default: the archive's only one)")
    p.add_argument("--dataset", default=None, metavar="NAME",
                   help="HDF5 files (.h5, .hdf5): the dataset to slice")
    p.add_argument("--labels", default=None, metavar="NAME",
                   help="the .npz member or HDF5 dataset beside the data with one integer label per sample")
    p.add_argument("--webdataset", action="store_true",
                   help="SOURCE is a WebDataset shard pattern (path, glob, brace range)")
    p.add_argument("--mds", action="store_true", help="SOURCE is a MosaicML MDS folder (index.json)")
    p.add_argument("--hf", action="store_true",
                   help="SOURCE is a Hugging Face datasets set (save_to_disk folder, .arrow or .parquet "
                        "files; needs pyarrow)")
    p.add_argument("--image", default=None, metavar="NAME",
                   help="--webdataset: the extensions to take ('jpg;jpeg'); --mds, --hf: the column "
                        "('image')")
    p.add_argument("--on-error", choices=("raise", "skip"), default="raise",
                   help="--webdataset, --mds, --hf: what a damaged shard does (see "
                        "Catalog.from_webdataset)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def walk(source: Path, extensions: List[str] | None, symlinks: str, show_progress: bool) -> Any:
    """``Catalog.from_folder`` with a bar that shows the walk is alive (its elapsed time) while it runs."""
    import prestage

    args = {} if extensions is None else {"extensions": extensions}
    return _with_bar(f"walking {source}", show_progress,
                     lambda: prestage.Catalog.from_folder(source, symlinks=symlinks, **args))


def slices(walked: Any, args: argparse.Namespace) -> Any:
    """The catalog of the slices of the arrays in the files ``walked`` found (see the module's doc)."""
    import prestage

    files = [walked.source_path(i) for i in range(len(walked))]  # a walk: one file per sample
    axis = 0 if args.axis is None else args.axis
    if args.dataset is not None:
        if args.member is not None:
            raise ValueError("--member names an .npz member; HDF5 files take --dataset")
        build = lambda: prestage.Catalog.from_hdf5(files, args.dataset, labels=args.labels, axis=axis)  # noqa: E731
    else:
        build = lambda: prestage.Catalog.from_arrays(files, axis=axis, member=args.member,  # noqa: E731
                                                     labels=args.labels)
    return _with_bar(f"reading the headers of {len(files)} files", not args.quiet, build)


def shards(args: argparse.Namespace) -> Any:
    """The catalog of WebDataset shards, an MDS set or a Hugging Face set (see the module's doc)."""
    import prestage

    if args.webdataset + args.mds + args.hf > 1:
        raise ValueError("--webdataset, --mds and --hf name different formats: give one")
    if any(v is not None for v in (args.axis, args.member, args.dataset)):
        raise ValueError("--axis, --member and --dataset slice arrays; shards take --image and --labels")
    source = str(args.source)
    if args.webdataset:
        fields = {"image": args.image or "jpg;jpeg", "label": args.labels or "cls"}
        build = lambda: prestage.Catalog.from_webdataset(source, fields, on_error=args.on_error)  # noqa: E731
    elif args.hf:
        hf_fields = {"image": args.image or "image"}
        if args.labels is not None:  # else the set's "label" column, where it has one
            hf_fields["label"] = args.labels
        build = lambda: prestage.Catalog.from_hf(source, hf_fields, on_error=args.on_error)  # noqa: E731
    else:
        fields = {"image": args.image or "image", "label": args.labels or "label"}
        build = lambda: prestage.Catalog.from_mds(source, fields, on_error=args.on_error)  # noqa: E731
    return _with_bar(f"scanning {source}", not args.quiet, build)


def _with_bar(desc: str, show_progress: bool, build: Callable[[], Any]) -> Any:
    """``build()``'s result, with a bar that shows it is alive (its elapsed time) while it runs.

    A catalog is built by one call into the core, which reports no progress of its own: it runs on a
    thread, and this one redraws the bar until it is done."""
    result: Dict[str, Any] = {}

    def run() -> None:
        try:
            result["catalog"] = build()
        except BaseException as e:  # raised again in the caller's thread
            result["error"] = e

    thread = threading.Thread(target=run, name="prestage-catalog-build", daemon=True)
    thread.start()
    with progress(0, desc=desc, unit="s", enabled=show_progress) as bar:
        while thread.is_alive():
            thread.join(0.1)
            bar.update(0)  # redraws the elapsed time
    if "error" in result:
        raise result["error"]
    return result["catalog"]


def report(catalog: Any) -> Dict[str, Any]:
    """Files, samples, classes (with their sample counts), bytes, a power-of-two histogram of file sizes
    and the samples' dtype (None where the catalog does not record it), from what the catalog recorded."""
    import numpy as np

    sizes = catalog.file_sizes()
    known = sizes[sizes >= 0]
    labels = np.fromiter((catalog.label(i) for i in range(len(catalog))), dtype=np.int64,
                         count=len(catalog))
    names = list(catalog.classes)
    counts = np.bincount(labels[labels >= 0], minlength=len(names))  # -1: no class (a flat folder)
    histogram = []
    if len(known):
        # Bins [2^k, 2^(k+1)) bytes; an empty file counts in the first bin.
        exponents = np.floor(np.log2(np.maximum(known, 1))).astype(int)
        for k in range(int(exponents.min()), int(exponents.max()) + 1):
            histogram.append({"from_bytes": 0 if k == 0 else 2 ** k, "to_bytes": 2 ** (k + 1),
                              "files": int((exponents == k).sum())})
    return {
        "root": str(catalog.root),
        "samples": len(catalog),
        "files": catalog.num_files,
        "classes": len(names),
        "unlabelled": int((labels < 0).sum()),
        "per_class": {name: int(n) for name, n in zip(names, counts)},
        "bytes": int(known.sum()),
        "sizes_unknown": int((sizes < 0).sum()),
        "size_histogram": histogram,
        "dtype": catalog.dtype,
    }


#: Classes the text report lists by name with their counts.
CLASSES_LISTED = 20


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def format_report(r: Dict[str, Any], out: Path) -> str:
    lines = [f"catalog of {r['root']} saved to {out}",
             f"  {r['files']} files, {r['samples']} samples, {r['classes']} classes, "
             f"{_human(r['bytes'])} ({r['bytes']} bytes)"]
    per_class = r["per_class"]
    if per_class:
        # Every class up to CLASSES_LISTED (ImageNet's 1,000 would flood the screen): --json has all.
        shown = list(per_class.items())[:CLASSES_LISTED]
        counts = list(per_class.values())
        lines.append(f"  samples per class: {min(counts)} to {max(counts)}"
                     + ("" if len(shown) == len(per_class) else
                        f" (the first {len(shown)} of {len(per_class)} below; --json lists them all)"))
        lines.append("    " + ", ".join(f"{name} {n}" for name, n in shown))
    if r["unlabelled"]:
        lines.append(f"  {r['unlabelled']} samples without a class (label -1)")
    if r.get("damaged"):
        lines.append(f"  {r['damaged']} damaged samples left out (Catalog.damage lists them)")
    if r["sizes_unknown"]:
        lines.append(f"  {r['sizes_unknown']} files of unknown size")
    if r.get("dtype"):
        lines.append(f"  samples of dtype {r['dtype']} (most of them; the loader holds every one to it)")
    if r["size_histogram"]:
        lines.append("  file sizes:")
        widest = max(b["files"] for b in r["size_histogram"])
        for b in r["size_histogram"]:
            bar = "#" * max(1 if b["files"] else 0, math.ceil(40 * b["files"] / widest))
            lines.append(f"    {_human(b['from_bytes']):>10} .. {_human(b['to_bytes']):>10}  "
                         f"{b['files']:>9}  {bar}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    import prestage

    try:
        if args.webdataset or args.mds or args.hf:
            catalog = shards(args)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            catalog.save(args.out)
            result = report(catalog)
            result["damaged"] = len(catalog.damage)
            print(json.dumps(result, indent=1) if args.json else format_report(result, args.out))
            return 0
        if not args.source.is_dir():
            raise ValueError(f"{args.source} is not a directory")
        extensions = None if args.extensions is None else [e for e in args.extensions.split(",") if e]
        sliced = any(v is not None for v in (args.axis, args.member, args.dataset, args.labels))
        if sliced and extensions is None:
            extensions = [".h5", ".hdf5"] if args.dataset is not None else [".npy", ".npz"]
        catalog = walk(args.source, extensions, args.symlinks, show_progress=not args.quiet)
        if len(catalog) == 0:
            raise ValueError(f"{args.source} holds no files with the extensions asked for")
        if sliced:
            catalog = slices(catalog, args)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        catalog.save(args.out)
        result = report(catalog)
    except KeyboardInterrupt:
        print("prestage catalog: interrupted; nothing saved", file=sys.stderr)
        return 130
    except (prestage.Error, ValueError, OSError, ImportError) as e:
        print(f"prestage catalog: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=1) if args.json else format_report(result, args.out))
    return 0
