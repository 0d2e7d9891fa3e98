"""Packing a set of small files into a few large shards, so that each epoch opens a few files on the
parallel file system instead of millions (``prestage pack SRC OUT``, ``prestage.Catalog.from_shards``).

A metadata operation (open, stat, lookup) costs the PFS's metadata servers far more than the bytes of a
small file, and a training job reading millions of files per epoch is what overloads them (NERSC's guidance
is to aggregate small files; etalumis packed 15 million files into 150). A packed set is::

    OUT/shard-00000.bin      the samples' bytes back to back (each one optionally a zstd frame)
    OUT/shard-00000.tsv      that shard's lines of the index (written once the shard is complete)
    ...
    OUT/index.tsv            every sample: shard, offset, length, label, CRC-32C, original path
    OUT/pack.json            the parameters, then the totals once the pack is complete

The samples keep the source catalog's order, labels and class names. A sample is a whole file, or a
byte range of one (a WebDataset member, an MDS field, an image of a Hugging Face Arrow or Parquet
file, a sample of an earlier pack), whose original path is then ``PATH@OFFSET+LENGTH``. Without
``zstd`` a sample's bytes are its original bytes exactly; with it, a zstd frame that decompresses to
them (every decode mode but ``"raw"`` decompresses frames; a sample that already is a zstd frame is
kept as it is, never compressed twice). Either way the CRC-32C in the index is the original bytes'.

Packing reads the files on ``workers`` threads, in order, and one writer appends them to the current
shard, starting a new one once ``shard_bytes`` is reached. A shard is written under a ``.part`` name and
renamed, then its index lines are written: an interrupted pack is resumed by running it again with the
same parameters, from the first shard that is not complete.
"""

from __future__ import annotations

import collections
import concurrent.futures
import errno
import json
import os
import time
from pathlib import Path
from typing import Any, Deque, Dict, List, Optional, Tuple, Union

from prestage import _core
from prestage._core import Catalog
from prestage._paths import check_folder
from prestage.errors import IoError

__all__ = ["pack", "INDEX_NAME", "SUMMARY_NAME"]

INDEX_NAME = "index.tsv"
SUMMARY_NAME = "pack.json"
_HEADER = "# prestage pack 1"
_FORMAT = 1


def _source_catalog(source: Union[Catalog, str, os.PathLike]) -> Catalog:
    if isinstance(source, Catalog):
        return source
    path = Path(source)
    if path.is_dir():
        return Catalog.from_folder(path, [])
    if path.is_file():
        return Catalog.load(path)
    raise FileNotFoundError(f"pack: source '{path}' is neither a folder nor a saved catalog")


def _shard_name(k: int) -> str:
    return f"shard-{k:05d}"


def _parameters(catalog: Catalog, shard_bytes: int, zstd_level: Optional[int]) -> Dict[str, Any]:
    return {
        "format": _FORMAT,
        "source": str(catalog.root),
        "source_fingerprint": catalog.fingerprint,
        "samples": len(catalog),
        "shard_bytes": shard_bytes,
        "zstd_level": zstd_level,
    }


def _write_json(path: Path, value: Dict[str, Any]) -> None:
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(value, indent=2) + "\n")
    os.replace(part, path)


def _resume_point(out: Path, params: Dict[str, Any], overwrite: bool) -> Tuple[int, int]:
    """Prepares OUT and returns (first shard to write, first sample to pack)."""
    summary = out / SUMMARY_NAME
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"pack: '{out}' exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    check_folder(out)  # another user's folder, or one open to all: they could plant links in it
    entries = list(out.iterdir())
    if summary.exists():
        old = json.loads(summary.read_text())
        if {k: old.get(k) for k in params} != params:
            if not overwrite:
                raise FileExistsError(
                    f"pack: '{out}' holds a pack made with other parameters or from another source; "
                    "pass overwrite=True (--overwrite) to replace it")
            _clear(out)
            entries = []
    elif entries:
        if not overwrite:
            raise FileExistsError(f"pack: '{out}' is not empty and holds no pack; pass overwrite=True "
                                  "(--overwrite) to use it anyway")
    _write_json(summary, params)
    # Complete shards are the ones whose index lines were written: 0..k-1 without a gap.
    shard, sample = 0, 0
    while (out / (_shard_name(shard) + ".tsv")).exists() and (out / (_shard_name(shard) + ".bin")).exists():
        with open(out / (_shard_name(shard) + ".tsv")) as lines:
            sample += sum(1 for _ in lines)
        shard += 1
    for entry in out.iterdir():
        name = entry.name
        number = name[6:11]
        if name.endswith(".part") or (name.startswith("shard-") and number.isdigit() and
                                      int(number) >= shard):
            entry.unlink()
    (out / INDEX_NAME).unlink(missing_ok=True)
    return shard, sample


def _clear(out: Path) -> None:
    for entry in out.iterdir():
        if entry.name.startswith("shard-") or entry.name in (INDEX_NAME, SUMMARY_NAME) or \
                entry.name.endswith(".part"):
            entry.unlink()


#: The first bytes of a zstd frame (RFC 8878, 3.1.1).
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def _read(catalog: Catalog, i: int, zstd_level: Optional[int]) -> Tuple[bytes, int]:
    _, offset, length = catalog.locator(i)
    path = catalog.source_path(i)
    with open(path, "rb") as f:
        if length is None:
            data = f.read()
        else:
            f.seek(offset)
            data = f.read(length)
            if len(data) != length:
                raise IoError(errno.EIO, f"pack: sample {i} is bytes {offset}+{length} of '{path}', "
                              f"which ends at byte {offset + len(data)}: the file changed since the "
                              "catalog was built", str(path))
    crc = _core.crc32c(data)
    if zstd_level is not None and not data.startswith(_ZSTD_MAGIC):
        data = _core.zstd_compress(data, zstd_level)
    return data, crc


def _original_path(catalog: Catalog, i: int) -> str:
    """The index's last field: the sample's path, and its byte range where it is one."""
    _, offset, length = catalog.locator(i)
    return catalog.path(i) if length is None else f"{catalog.path(i)}@{offset}+{length}"


class _ShardWriter:
    """Appends samples to shard files, cutting a new one at `shard_bytes`; each shard is renamed into
    place, then its index lines written (the mark that it is complete)."""

    def __init__(self, out: Path, first_shard: int, shard_bytes: int) -> None:
        self.out, self.shard, self.shard_bytes = out, first_shard, shard_bytes
        self.file: Optional[Any] = None
        self.lines: List[str] = []
        self.offset = 0
        self.bytes_written = 0

    def add(self, data: bytes, label: int, crc: int, path: str) -> None:
        if self.file is not None and self.offset > 0 and self.offset + len(data) > self.shard_bytes:
            self.finish()
        if self.file is None:
            self.file = open(self.out / (_shard_name(self.shard) + ".bin.part"), "wb")
            self.offset = 0
        self.file.write(data)
        self.lines.append(f"{_shard_name(self.shard)}.bin\t{self.offset}\t{len(data)}\t{label}\t"
                          f"{crc:08x}\t{path}\n")
        self.offset += len(data)
        self.bytes_written += len(data)

    def finish(self) -> None:
        if self.file is None:
            return
        name = _shard_name(self.shard)
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        self.file = None
        os.replace(self.out / (name + ".bin.part"), self.out / (name + ".bin"))
        part = self.out / (name + ".tsv.part")
        part.write_text("".join(self.lines))
        os.replace(part, self.out / (name + ".tsv"))
        self.lines = []
        self.shard += 1

    def abandon(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def pack(source: Union[Catalog, str, os.PathLike], out: Union[str, os.PathLike], *,
         shard_bytes: int = 256 << 20, zstd_level: Optional[int] = None, workers: int = 16,
         overwrite: bool = False, progress: bool = False) -> Dict[str, Any]:
    """Packs the samples of `source` (a catalog of whole files or of byte ranges of files: a
    class-folder tree, a saved catalog, WebDataset, MDS and Hugging Face catalogs) into shards of
    about `shard_bytes` in folder `out`, and returns the summary written to ``out/pack.json``.
    ``zstd_level`` compresses each sample as one zstd frame. Running it again with the same
    arguments resumes an interrupted pack (or does nothing once it is complete).

    >>> prestage.pack.pack("/pfs/imagenet/train", "/pfs/imagenet-packed", workers=32)
    >>> catalog = prestage.Catalog.from_shards("/pfs/imagenet-packed")
    """
    from prestage.cli.progress import progress as progress_bar

    if shard_bytes <= 0:
        raise ValueError(f"pack: shard_bytes must be positive, not {shard_bytes}")
    if workers < 1:
        raise ValueError(f"pack: workers must be at least 1, not {workers}")
    catalog = _source_catalog(source)
    if catalog.kind != "files":
        raise ValueError(f"pack: packs files and byte ranges of files; this catalog's samples are "
                         f"{catalog.kind} records")
    paths = [_original_path(catalog, i) for i in range(len(catalog))]
    if len(set(paths)) != len(paths):
        raise ValueError("pack: this catalog names a sample twice (a file, or one byte range of a file)")
    for p in paths:
        if "\t" in p or "\n" in p or "\r" in p:
            raise ValueError(f"pack: the path {p!r} holds a tab or a line break, which the index "
                             "cannot hold")
    out = Path(out)
    params = _parameters(catalog, shard_bytes, zstd_level)
    summary_path = out / SUMMARY_NAME
    if summary_path.exists() and (out / INDEX_NAME).exists():
        done = json.loads(summary_path.read_text())
        if done.get("complete") and {k: done.get(k) for k in params} == params:
            return done
    first_shard, first_sample = _resume_point(out, params, overwrite)
    started = time.perf_counter()
    writer = _ShardWriter(out, first_shard, shard_bytes)
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool, \
            progress_bar(len(catalog) - first_sample, desc="pack", unit="file", enabled=progress) as bar:
        pending: Deque[Tuple[int, "concurrent.futures.Future[Tuple[bytes, int]]"]] = collections.deque()
        upcoming = iter(range(first_sample, len(catalog)))
        try:
            for i in upcoming:
                pending.append((i, pool.submit(_read, catalog, i, zstd_level)))
                if len(pending) >= 4 * workers:
                    break
            while pending:
                i, future = pending.popleft()
                data, crc = future.result()
                for j in upcoming:  # keep the readers busy: one more in for each one out
                    pending.append((j, pool.submit(_read, catalog, j, zstd_level)))
                    break
                writer.add(data, catalog.label(i), crc, paths[i])
                bar.update(1)
            writer.finish()
        except BaseException:
            for _, future in pending:
                future.cancel()
            writer.abandon()
            raise
    shards = writer.shard
    index_part = out / (INDEX_NAME + ".part")
    with open(index_part, "w") as index:
        index.write(_HEADER + "\n")
        if catalog.classes:
            index.write("# classes\t" + "\t".join(catalog.classes) + "\n")
        index.write(f"# zstd\t{'none' if zstd_level is None else zstd_level}\n")
        for k in range(shards):
            with open(out / (_shard_name(k) + ".tsv")) as lines:
                index.write(lines.read())
    os.replace(index_part, out / INDEX_NAME)
    shard_total = sum((out / (_shard_name(k) + ".bin")).stat().st_size for k in range(shards))
    summary = dict(params, complete=True, shards=shards, bytes=shard_total,
                   seconds=round(time.perf_counter() - started, 3))
    _write_json(summary_path, summary)
    return summary
