"""Metadata operations per array sample: the opens, reads and getattrs that one epoch of slices of array
files costs on the emulated parallel file system (``prestage-pfs``), with and without a stage directory.

The set: ``--files`` archives written with ``np.savez`` (``x`` of shape (8, 8, ``--per-file``), uint8,
the samples along the last axis as DLIO writes them, and ``y`` their labels) and as many ``.npy`` files
of ``--per-file`` samples along the first axis. The catalogs are built before counting; the counts are
the emulator's, for one epoch of ``prestage.Loader`` (batches of 8), including the batches of the next
epoch the loader may have started before it closed.

    python benchmarks/opens_bench.py --files 4 --per-file 16

``--loose N`` measures instead N loose files per kind (JPEG images of 20 to 300 KB, and raw ``.bin``
files of the same sizes, one cold epoch each with ``decode="raw"``; the JPEGs also with
``decode="jpeg"``), read directly and copied to a stage directory, and the same files packed into
shards by ``prestage.pack`` (one cold epoch, staged): per file, the opens, reads and getattrs the
emulated PFS served. The loader reads every loose file once per epoch, so one open per file is the
floor; "getattr" counts the kernel's own lookups of each name too.

    python benchmarks/opens_bench.py --loose 200

``--epoch N`` measures one cold pipelined epoch as a user who sets no thread option runs it: the
synthetic ImageNet-like set of N images (``prestage synth``, about 100 KB on average, a few of 1-2.6
MB), batches of 64, 224x224, a new stage directory, over the emulated PFS at 2 ms per operation,
2,000 MB/s and 64 operations at once; per file: opens, reads and getattrs (all, and those of the
files themselves: the rest are the class folders' lookups, which the kernel makes again each time
their entries time out), and the files read beyond their size (read twice) or opened twice,
``--repeat`` times. With ``--epochs K``, each run is a job of K epochs (the first cold, the stage
directory kept), counted as a whole.

    python benchmarks/opens_bench.py --epoch 3000 --repeat 3 [--epochs 3]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

import prestage
from prestage.bench.emulator import PfsEmulator


def loose(n: int) -> dict:
    """Operations per loose file (and per shard, packed) for one cold epoch of each case."""
    import io

    from PIL import Image

    import prestage.pack

    rng = np.random.default_rng(0)
    results = {}
    with tempfile.TemporaryDirectory(prefix="prestage-opens-bench-") as tmp:
        src = Path(tmp) / "src"
        (src / "jpeg").mkdir(parents=True)
        (src / "raw").mkdir()
        for i in range(n):
            # Noise compresses little: the side sets the size, about 20 to 300 KB.
            side = int(rng.integers(80, 330))
            out = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(out, "JPEG", quality=90)
            (src / "jpeg" / f"{i:05d}.jpg").write_bytes(out.getvalue())
            (src / "raw" / f"{i:05d}.bin").write_bytes(out.getvalue())
        prestage.pack.pack(prestage.Catalog.from_folder(src / "jpeg"), Path(tmp) / "packed",
                           shard_bytes=4 << 20)
        shards = len(list((Path(tmp) / "packed").glob("shard-*.bin")))
        emulator = PfsEmulator(Path(tmp), latency_ms=0, bandwidth_mbs=0, max_ops=0)
        emulator.start()
        try:
            mount = Path(emulator.mountpoint)
            jpeg = prestage.Catalog.from_folder(mount / "src" / "jpeg")
            raw = prestage.Catalog.from_folder(mount / "src" / "raw", extensions=[".bin"])
            packed = prestage.Catalog.from_shards(mount / "packed")
            cases = [("jpeg_raw", jpeg, {"decode": "raw"}), ("jpeg", jpeg, {"image_size": (64, 64)}),
                     ("bin_raw", raw, {"decode": "raw"})]
            for name, catalog, options in cases + [("packed_jpeg", packed, {"decode": "raw"})]:
                for staged in (False, True) if name != "packed_jpeg" else (True,):
                    stage = str(Path(tmp) / f"stage-{name}") if staged else None
                    time.sleep(1.2)  # the kernel's cached names and attributes expire: a cold epoch
                    before = emulator.stats()["ops"]
                    with prestage.Loader(catalog, batch_size=8, stage_dir=stage, shuffle=False,
                                         **options) as loader:
                        samples = 0
                        for batch in loader:
                            samples += len(batch)
                            if samples >= len(catalog):
                                break  # no batch of the next epoch is asked for
                    after = emulator.stats()["ops"]
                    ops = {k: after[k] - before.get(k, 0) for k in ("open", "read", "getattr")}
                    files = shards if name == "packed_jpeg" else len(catalog)
                    results[f"{name}{'_staged' if staged else ''}"] = {
                        "samples": samples, "files": files, **ops,
                        **{f"{k}s_per_file": round(v / files, 3) for k, v in ops.items()}}
        finally:
            emulator.stop()
    return results


def epoch(n: int, repeat: int, epochs: int = 1) -> dict:
    """Operations per file of one cold pipelined epoch with no thread option (or of a job of
    ``epochs`` epochs, the first cold), ``repeat`` times."""
    import os
    import shutil

    from prestage.cli.demo import default_source

    src = default_source(n, 10, True)
    runs = []
    emulator = PfsEmulator(src, latency_ms=2, bandwidth_mbs=2000, max_ops=64)
    mount = emulator.start()
    try:
        catalog = prestage.Catalog.from_folder(mount)
        sizes = {catalog.path(i): os.path.getsize(src / catalog.path(i)) for i in range(len(catalog))}
        for r in range(repeat):
            stage = Path(tempfile.mkdtemp(prefix="prestage-opens-bench-"))
            time.sleep(1.2)  # the kernel's cached names and attributes expire: a cold epoch
            before = emulator.stats()
            start = time.perf_counter()
            with prestage.Loader(catalog, batch_size=64, image_size=(224, 224),
                                 stage_dir=str(stage)) as loader:
                images = 0
                for e in range(epochs):
                    loader.set_epoch(r * epochs + e + 1)
                    images += sum(len(b) for b in loader)
                stats = loader.stats()
            seconds = time.perf_counter() - start
            after = emulator.stats()
            shutil.rmtree(stage, ignore_errors=True)
            ops = {k: after["ops"][k] - before["ops"].get(k, 0) for k in ("open", "read", "getattr")}
            paths = {p: {k: c[k] - before["paths"].get(p, {}).get(k, 0) for k in ("opens", "bytes")}
                     for p, c in after["paths"].items()}
            # The getattrs of the files themselves; the rest are the folders' lookups, made again
            # each time their entries time out (the emulator's 1 s), whatever the loader does.
            file_getattrs = sum(n - before["file_getattrs"].get(p, 0)
                                for p, n in after["file_getattrs"].items() if p in sizes)
            runs.append({"images": images, "seconds": round(seconds, 2), **ops,
                         **{f"{k}s_per_file": round(v / len(sizes), 4) for k, v in ops.items()},
                         "file_getattrs_per_file": round(file_getattrs / len(sizes), 4),
                         "folder_getattrs": ops["getattr"] - file_getattrs,
                         "files_read_beyond_their_size": sum(paths.get(p, {}).get("bytes", 0) > s
                                                             for p, s in sizes.items()),
                         "files_opened_twice": sum(paths.get(p, {}).get("opens", 0) > 1 for p in sizes),
                         # Stage 3's own reads of files stage 2 had not started, and of those the
                         # ones it staged (absent from builds before that field).
                         "stage_expedited": stats["stage_expedited"],
                         "misses_staged": stats.get("misses_staged"),
                         "load_average": round(os.getloadavg()[0], 1)})
    finally:
        emulator.stop()
    window = 256 << 10  # the kernel's read-ahead window for a file advised sequential
    return {"files": len(sizes), "bytes": sum(sizes.values()),
            "files_over_256KiB": sum(s > window for s in sizes.values()),
            "reads_at_one_per_256KiB": sum(-(-s // window) for s in sizes.values()),
            "reads_at_one_per_MiB": sum(-(-s // (1 << 20)) for s in sizes.values()), "runs": runs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", type=int, default=4)
    p.add_argument("--per-file", type=int, default=16)
    p.add_argument("--loose", type=int, default=0, help="measure N loose files per kind instead")
    p.add_argument("--epoch", type=int, default=0, help="measure a cold epoch of N synthetic images instead")
    p.add_argument("--repeat", type=int, default=3, help="jobs measured with --epoch")
    p.add_argument("--epochs", type=int, default=1,
                   help="epochs per job with --epoch (the counts are the job's)")
    args = p.parse_args()
    if args.epoch:
        print(json.dumps({"epoch_of": args.epoch, "epochs": args.epochs,
                          **epoch(args.epoch, args.repeat, args.epochs)}, indent=1))
        return
    if args.loose:
        print(json.dumps({"loose": args.loose, "epoch": loose(args.loose)}, indent=1))
        return
    results = {}
    with tempfile.TemporaryDirectory(prefix="prestage-opens-bench-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for f in range(args.files):
            np.savez(src / f"{f}.npz", x=np.zeros((8, 8, args.per_file), np.uint8), y=np.arange(args.per_file))
            np.save(src / f"{f}.npy", np.zeros((args.per_file, 8, 8), np.uint8))
        emulator = PfsEmulator(src, latency_ms=0, bandwidth_mbs=0, max_ops=0)
        emulator.start()
        try:
            mount = Path(emulator.mountpoint)
            catalogs = {
                "npz_last_axis": prestage.Catalog.from_arrays(
                    [mount / f"{f}.npz" for f in range(args.files)], axis=-1, member="x", labels="y"),
                "npy_first_axis": prestage.Catalog.from_arrays([mount / f"{f}.npy" for f in range(args.files)]),
            }
            for name, catalog in catalogs.items():
                for staged in (False, True):
                    stage = str(Path(tmp) / f"stage-{name}") if staged else None
                    before = emulator.stats()["ops"]
                    with prestage.Loader(catalog, batch_size=8, stage_dir=stage) as loader:
                        samples = sum(len(b) for b in loader)
                    after = emulator.stats()["ops"]
                    ops = {k: after[k] - before.get(k, 0) for k in ("open", "read", "getattr")}
                    results[f"{name}{'_staged' if staged else ''}"] = {
                        "samples": samples, **ops, "opens_per_sample": round(ops["open"] / samples, 2)}
        finally:
            emulator.stop()
    print(json.dumps({"files": args.files, "per_file": args.per_file, "epoch": results}, indent=1))


if __name__ == "__main__":
    main()
