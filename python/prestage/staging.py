"""Staging for your own decoding: prestage stages, your code reads.

Stages 1 and 2 run in the trainer's process on prestage's threads, as for ``prestage.Loader`` (the plan,
the look-ahead, the bounded stage directory with clairvoyant eviction, sharing between the ranks of a
node); stage 3 is yours. A :class:`StagedSampler` yields each batch of this rank's plan as a list of
catalog indices once stage 2 has dealt with it; a :class:`StagedDataset` hands your reading code, in
``DataLoader`` workers or anywhere, where each sample's bytes are now: the staged copy on the local SSD,
or the source when it was not staged in time (a miss, never a wait past ``stage_patience``).

>>> sampler = prestage.torch.StagedSampler(catalog, batch_size=64, stage_dir="/local/ssd",
...                                        num_workers=4)
>>> dataset = prestage.torch.StagedDataset(sampler, read=lambda sample, label: (decode(sample.bytes()), label))
>>> loader = sampler.data_loader(dataset)     # torch DataLoader(dataset, batch_sampler=sampler, ...)
>>> for epoch in range(90):
...     sampler.set_epoch(epoch)
...     for batch in loader: ...

Workers hold no prestage thread and take no lock: a worker gets an index (nothing else crosses the
process boundary), opens the staged copy if it is there, else the source (a copy evicted after the
batch was handed out is found missing and the source read: never a wrong byte). So ``fork``, ``spawn``
and ``forkserver`` all work. Each worker counts what it read where in a slot of its own of a small shared
file, and :meth:`StagedSampler.stats` adds those counts to the loader's.

Resuming mid-epoch: ``DataLoader`` asks the sampler for ``prefetch_factor * num_workers`` batches ahead of
what the training loop has taken, so the sampler must know those two numbers (give them to it, and build
the ``DataLoader`` with :meth:`StagedSampler.data_loader`, which passes them on): then
:meth:`StagedSampler.state_dict` counts the batches the loop has taken, and a resume yields exactly the
rest, whatever ``num_workers`` the resumed job uses.
"""

from __future__ import annotations

import collections
import errno
import hashlib
import io
import mmap
import os
import stat
import threading
from pathlib import Path
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from prestage import _core
from prestage.errors import ConfigError, IoError
from prestage.loader import Loader, as_catalog

__all__ = ["StagedDataset", "StagedSample", "StagedSampler", "TIER_SOURCE", "TIER_STAGE", "catalog_of"]

TIER_STAGE = _core.TIERS.index("stage")    # the stage directory (local SSD), as traces number it
TIER_SOURCE = _core.TIERS.index("source")  # the source (the PFS)

_COUNTER_SLOTS = 256   # worker slots of the counter file: slot 0 is the main process
_COUNTERS = ("staged", "source", "gone", "bytes")


def _area(stage_dir: Union[str, os.PathLike], catalog: _core.Catalog) -> Path:
    return Path(_core.stage_area(stage_dir, catalog))  # the stage directory's own naming (C++)


_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def _open_area(area: str) -> int:
    """A descriptor of the stage area, never through a link, checked once: this user's (or of the
    group the loader was given), and writable by no one else; the sampler's files are opened
    relative to it."""
    fd = os.open(area, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW)
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() and st.st_mode & 0o070 == 0 or st.st_mode & 0o002:
        os.close(fd)
        raise IoError(errno.EPERM, f"refusing the stage area {area!r} (owned by uid {st.st_uid}, mode "
                      f"{stat.S_IMODE(st.st_mode):04o}): give another stage_dir, or remove it", area)
    return fd


def _file_in(area_fd: int, name: str, shown: str, flags: int, mode: int = 0o600) -> int:
    """File `name` of the area opened with `flags`, never through a link: one found there is an
    IoError (ELOOP) naming it."""
    try:
        fd = os.open(name, flags | _NOFOLLOW, mode, dir_fd=area_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise IoError(errno.ELOOP, f"{shown!r} is a symbolic link in the stage area, never followed: "
                          "remove it", shown) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise IoError(errno.EPERM, f"{shown!r} in the stage area is not a regular file", shown)
    return fd


def _read_all(fd: int) -> bytes:
    chunks: List[bytes] = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


class StagedSample:
    """Where one sample's bytes are: ``path`` (the staged copy, or the source file), and its byte range
    in it (``offset``, ``length``; ``length`` None: the whole file). For slices of array files and HDF5
    datasets (``catalog.kind`` ``"arrays"``, ``"hdf5"``) the range is the whole file, and
    ``catalog.locator(sample.index)[1]`` is the slice's index along ``catalog.axis``. ``tier`` is
    ``"stage"`` or ``"source"``, or ``"memory"`` for a sample of a shard compressed whole
    (``catalog.file_codec``) whose decompressed copy is not staged (no room for it within the stage
    directory's bound, or evicted since): its bytes were decompressed from the source into ``data``,
    ``path`` names the shard, and ``offset``, ``length`` are those of ``data`` (0, its length); read it
    with :meth:`open` or :meth:`bytes`, never from ``path``. :meth:`bytes` maps the range read-only: a
    zero-copy view, valid while it is held."""

    __slots__ = ("path", "offset", "length", "tier", "index", "data")

    def __init__(self, path: str, offset: int, length: Optional[int], tier: str, index: int,
                 data: Optional[bytes] = None) -> None:
        self.path, self.offset, self.length, self.tier, self.index = path, offset, length, tier, index
        self.data = data

    def open(self) -> Any:
        """The file, opened for reading, positioned at the sample's first byte (for a ``"memory"``
        sample, a file object over ``data``)."""
        if self.data is not None:
            return io.BytesIO(self.data)
        f = open(self.path, "rb")
        f.seek(self.offset)
        return f

    def bytes(self) -> memoryview:
        """The sample's bytes as a read-only view of the file mapped into memory (no copy)."""
        if self.data is not None:
            return memoryview(self.data)
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            length = size - self.offset if self.length is None else self.length
            if length == 0:
                return memoryview(b"")
            if self.offset + length > size:
                raise OSError(f"{self.path}: bytes {self.offset}+{length} lie past its end ({size})")
            start = self.offset - self.offset % mmap.ALLOCATIONGRANULARITY
            mapped = mmap.mmap(f.fileno(), self.offset + length - start, access=mmap.ACCESS_READ,
                               offset=start)
        return memoryview(mapped)[self.offset - start:self.offset - start + length]

    def __repr__(self) -> str:
        return f"StagedSample({self.index}, {self.tier}: {self.path!r} [{self.offset}:+{self.length}])"


class _Where:
    """What a worker needs to find a sample: the saved catalog and its content hash, the stage area,
    the counter file. Small when pickled (three paths and a hash); the catalog is loaded once per
    process, on first use, and only if its bytes are those the sampler saved (a catalog found in
    the area under that name but with other content is an IoError, never used)."""

    def __init__(self, catalog_file: str, area: str, counters: str, catalog_hash: str) -> None:
        self.catalog_file, self.area, self.counters = catalog_file, area, counters
        self.catalog_hash = catalog_hash
        self._catalog: Optional[_core.Catalog] = None
        self._slots: Optional[np.ndarray] = None
        self._pid = -1
        self._final: Optional[Dict[str, int]] = None  # the counts once the counter file is gone

    def remove(self) -> None:
        """Keeps the final counts and removes the counter file (the sampler's close())."""
        if self._final is None and os.path.lexists(self.counters):
            self._final = self.counts()
            os.unlink(self.counters)

    def __getstate__(self) -> Dict[str, Any]:
        return {"catalog_file": self.catalog_file, "area": self.area, "counters": self.counters,
                "catalog_hash": self.catalog_hash}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__init__(state["catalog_file"], state["area"], state["counters"],  # type: ignore[misc]
                      state["catalog_hash"])

    def _open(self, path: str, flags: int) -> int:
        area_fd = _open_area(self.area)
        try:
            return _file_in(area_fd, os.path.basename(path), path, flags)
        finally:
            os.close(area_fd)

    def catalog(self) -> _core.Catalog:
        if self._catalog is None:
            fd = self._open(self.catalog_file, os.O_RDONLY)
            try:
                if hashlib.sha256(_read_all(fd)).hexdigest() != self.catalog_hash:
                    raise IoError(errno.EPERM, f"{self.catalog_file!r} is not the catalog the sampler "
                                  "saved (its content differs): never used", self.catalog_file)
                # The very file whose bytes were checked (the descriptor's), where /proc has it.
                by_fd = f"/proc/self/fd/{fd}"
                self._catalog = _core.Catalog.load(by_fd if os.path.exists(by_fd) else self.catalog_file)
            finally:
                os.close(fd)
        return self._catalog

    def _slot(self) -> np.ndarray:
        if self._slots is None or self._pid != os.getpid():  # a forked worker maps it again
            fd = self._open(self.counters, os.O_RDWR)
            try:
                mapped = mmap.mmap(fd, _COUNTER_SLOTS * len(_COUNTERS) * 8)
            finally:
                os.close(fd)
            self._slots = np.frombuffer(mapped, dtype=np.uint64).reshape(_COUNTER_SLOTS, len(_COUNTERS))
            self._pid = os.getpid()
        worker = _worker_id()
        return self._slots[(worker + 1) % _COUNTER_SLOTS]

    def find(self, index: int) -> StagedSample:
        catalog = self.catalog()
        if not 0 <= index < len(catalog):
            raise IndexError(f"sample {index} of a catalog of {len(catalog)}")
        file, offset, length = catalog.locator(index)
        if catalog.kind in ("arrays", "hdf5"):
            offset = 0  # the locator's offset is the slice's index, not a byte
        staged = _core.staged_copy_path(self.area, file)
        slot = self._slot()
        # A copy under its final name is whole (published by a rename); one evicted since the batch
        # was handed out is simply not there any more: the source has the same bytes.
        if os.path.exists(staged):
            slot[0] += 1
            return StagedSample(staged, offset, length, "stage", index)
        slot[1] += 1
        return self.at_source(index, offset, length)

    def at_source(self, index: int, offset: int, length: Optional[int]) -> StagedSample:
        catalog = self.catalog()
        file = catalog.locator(index)[0]
        if catalog.compressed and catalog.file_codec(file) != "none":
            # Its offsets are those of the decompressed bytes: the source gives none by range. The
            # whole shard is decompressed (and checked) for this sample, as the loader does.
            data = _core.decompressed_sample(catalog, index)
            return StagedSample(os.fspath(catalog.source_path(index)), 0, len(data), "memory", index,
                                data)
        return StagedSample(os.fspath(self.catalog().source_path(index)), offset, length, "source", index)

    def gone(self, sample: StagedSample) -> StagedSample:
        """Counts a staged copy that vanished between the look and the read (evicted since); returns
        where the same bytes are: the source."""
        self._slot()[2] += 1
        return self.at_source(sample.index, sample.offset, sample.length)

    def counts(self) -> Dict[str, int]:
        if self._final is not None:
            return dict(self._final)
        fd = self._open(self.counters, os.O_RDONLY)
        try:
            data = _read_all(fd)
        finally:
            os.close(fd)
        slots = np.frombuffer(data, dtype=np.uint64).reshape(_COUNTER_SLOTS, len(_COUNTERS))
        total = slots.sum(axis=0)
        return {f"worker_{name}": int(v) for name, v in zip(_COUNTERS, total) if name != "bytes"}


def _worker_id() -> int:
    try:
        import torch.utils.data

        info = torch.utils.data.get_worker_info()
    except ImportError:
        info = None
    return -1 if info is None else int(info.id)


class StagedSampler:
    """This rank's batches of the plan, as lists of catalog indices, each yielded once stage 2 has
    dealt with it. A ``batch_sampler`` for ``torch.utils.data.DataLoader`` (or any loop).

    Args:
        catalog: the samples (``prestage.Catalog``, or the path of a saved one, as
            :class:`prestage.Loader` takes it); its indices are what the batches hold.
        batch_size: samples per batch on this rank.
        stage_dir: the node-local stage directory (required: staging is the point).
        num_workers, prefetch_factor: those of the ``DataLoader`` that will use this sampler (see
            :meth:`data_loader`): how many batches it takes ahead of the training loop, for
            ``state_dict`` and for how long staged copies are kept after being handed out.
        rank, world_size: this process's place (default: ``prestage.torch.distributed_rank()``'s
            sources: ``torch.distributed``, then ``RANK``/``WORLD_SIZE``, else 0 of 1).
        options: the others, as ``prestage.Loader``'s: ``seed``, ``shuffle``, ``drop_last``,
            ``cache_bytes``, ``eviction``, ``prefetchers``, ``lookahead``, ``stage_patience``,
            ``io_timeout``, ``trace``, ``tuned``.
    """

    def __init__(self, catalog: Union[_core.Catalog, str, "os.PathLike[str]"], batch_size: int, *,
                 stage_dir: Union[str, os.PathLike], num_workers: int = 0,
                 prefetch_factor: Optional[int] = None, rank: Optional[int] = None,
                 world_size: Optional[int] = None, **options: Any) -> None:
        catalog = as_catalog(catalog)
        if not stage_dir:
            raise ConfigError("StagedSampler needs a stage_dir: staging is what it is for")
        for name in ("decode", "image_size", "readers", "depth", "on_error"):
            if name in options:
                raise TypeError(f"StagedSampler() takes no {name}=: it stages, your code decodes")
        if num_workers < 0:
            raise ConfigError(f"num_workers must be >= 0, got {num_workers}")
        if prefetch_factor is None:
            prefetch_factor = 2 if num_workers > 0 else 0
        if num_workers > 0 and prefetch_factor < 1:
            raise ConfigError(f"prefetch_factor must be >= 1 with workers, got {prefetch_factor}")
        if num_workers == 0 and prefetch_factor:
            raise ConfigError("prefetch_factor needs num_workers > 0 (as torch's DataLoader says)")
        if num_workers + 1 >= _COUNTER_SLOTS:
            raise ConfigError(f"at most {_COUNTER_SLOTS - 2} workers")
        if rank is None or world_size is None:
            rank, world_size = _rank_and_world(rank, world_size)
        self.num_workers, self.prefetch_factor = num_workers, prefetch_factor
        self._ahead = num_workers * prefetch_factor
        self.catalog = catalog
        # The workers' files are written before the loader looks at the disk's free space (its
        # default bound), so that they are not taken out of the room it counts on.
        # The area is made and checked as the loader does (another user's is refused), and the
        # sampler's files are made in it relative to a descriptor of it, never through a link.
        area = Path(_core.make_stage_area(stage_dir, catalog, options.get("stage_group") or ""))
        area_fd = _open_area(os.fspath(area))
        try:
            catalog_file, catalog_hash = self._save_catalog(catalog, area, area_fd,
                                                            options.get("stage_group"))
            counters = area / f"workers-{os.getpid()}-{id(self):x}.counts"
            fd = _file_in(area_fd, counters.name, os.fspath(counters),
                          os.O_RDWR | os.O_CREAT | os.O_EXCL)
            try:
                if options.get("stage_group"):
                    import grp

                    os.fchown(fd, -1, grp.getgrnam(options["stage_group"]).gr_gid)
                os.fchmod(fd, 0o660 if options.get("stage_group") else 0o600)
                # Written, not a hole: its blocks are taken now, before the loader counts the disk.
                os.write(fd, bytes(_COUNTER_SLOTS * len(_COUNTERS) * 8))
            finally:
                os.close(fd)
        finally:
            os.close(area_fd)
        # Batches handed out may still be read by workers: the loader keeps their copies that long.
        try:
            self._loader = Loader(catalog, batch_size=batch_size, decode="locate", stage_dir=stage_dir,
                                  rank=rank, world_size=world_size, depth=max(4, self._ahead + 2),
                                  readers=1, **options)
        except BaseException:
            counters.unlink()
            raise
        self._where = _Where(os.fspath(catalog_file), os.fspath(area), os.fspath(counters), catalog_hash)
        self._iteration: Optional[_Batches] = None

    @staticmethod
    def _save_catalog(catalog: _core.Catalog, area: Path, area_fd: int,
                      group: Optional[str]) -> Tuple[Path, str]:
        """Saves the catalog the sampler was given under a name of its content's hash (ranks with the
        same catalog share one file); returns its path and hash. A file found under that name is
        used only if its bytes hash to it; else it is replaced."""
        tmp = area / f"catalog-{os.getpid()}-{threading.get_ident():x}.tmp"
        catalog.save(tmp)  # written in the area that only this user can write
        try:
            fd = _file_in(area_fd, tmp.name, os.fspath(tmp), os.O_RDONLY)
            try:
                if group:  # the loader's modes, whatever the umask
                    import grp

                    os.fchown(fd, -1, grp.getgrnam(group).gr_gid)
                os.fchmod(fd, 0o660 if group else 0o600)
                digest = hashlib.sha256(_read_all(fd)).hexdigest()
            finally:
                os.close(fd)
            name = f"catalog-{digest[:32]}.prestage"
            os.rename(tmp.name, name, src_dir_fd=area_fd, dst_dir_fd=area_fd)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return area / name, digest

    # ------------------------------------------------------------------ the sampler protocol

    def __len__(self) -> int:
        return len(self._loader)

    def __iter__(self) -> Iterator[List[int]]:
        # Where the loader's next iteration starts: set_epoch() or load_state_dict() said so.
        epoch, first = self._loader._epoch, self._loader._first_batch
        if self._iteration is not None:
            self._iteration.release()  # the workers are done with the last iteration's batches
        self._iteration = _Batches(self._loader, epoch, first, self._ahead)
        return self._iteration

    def set_epoch(self, epoch: int) -> None:
        """Chooses the epoch (and so the order) of the next iteration; the epoch of a state just
        loaded keeps its position (:meth:`prestage.Loader.set_epoch`)."""
        self._loader.set_epoch(epoch)

    def state_dict(self) -> Dict[str, Any]:
        """Where the training loop is: the batches it has taken from the ``DataLoader`` (those the
        sampler yielded, less the ``prefetch_factor * num_workers`` the ``DataLoader`` asks for ahead
        of the loop). Resume with :meth:`load_state_dict`, with any ``num_workers``."""
        run = self._iteration
        if run is None:
            return self._loader.state_dict()
        taken = run.first + max(0, run.calls - self._ahead)
        return self._loader._state_at(run.epoch, min(taken, self._loader.batches_in_epoch(run.epoch)))

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Makes the next iteration resume where ``state`` (from :meth:`state_dict`, or
        :func:`prestage.state.merge_states`) was taken, on any ``world_size`` and ``batch_size``: see
        :meth:`prestage.Loader.load_state_dict`. ``set_epoch()`` with the state's epoch keeps it."""
        self._loader.load_state_dict(state)
        if self._iteration is not None:
            self._iteration.release()
        self._iteration = None

    # ------------------------------------------------------------------ for the workers

    def dataset(self, read: Optional[Callable[[StagedSample, int], Any]] = None,
                dataset: Any = None) -> "StagedDataset":
        """A :class:`StagedDataset` of this sampler's catalog (see there)."""
        return StagedDataset(self, read=read, dataset=dataset)

    def data_loader(self, dataset: Any, **kwargs: Any) -> Any:
        """``torch.utils.data.DataLoader(dataset, batch_sampler=self, num_workers=...,
        prefetch_factor=...)`` with this sampler's ``num_workers`` and ``prefetch_factor``, and
        ``kwargs`` (``collate_fn``, ``multiprocessing_context``, ``pin_memory``, ...)."""
        import torch.utils.data

        for name in ("batch_sampler", "num_workers", "prefetch_factor", "batch_size", "shuffle", "sampler"):
            if name in kwargs:
                raise TypeError(f"data_loader() takes no {name}=: the sampler decides it")
        extra: Dict[str, Any] = {"prefetch_factor": self.prefetch_factor} if self.num_workers > 0 else {}
        return torch.utils.data.DataLoader(dataset, batch_sampler=self, num_workers=self.num_workers,
                                           **extra, **kwargs)

    def stats(self, epochs: Any = None) -> Dict[str, Any]:
        """The loader's figures (``hits``, ``misses``, ``evictions``, per epoch...: where stage 3
        would have found each sample when its batch was handed out) and the workers' own:
        ``worker_staged`` and ``worker_source`` (reads of staged copies and of the source),
        ``worker_gone`` (copies that vanished between the look and the read). ``epochs``: as
        :meth:`prestage.Loader.stats` takes it."""
        stats = self._loader.stats(epochs)
        stats.update(self._where.counts())
        return stats

    def close(self) -> None:
        """Stops staging (joins prestage's threads) and removes the workers' counter file (their
        counts stay in stats()); the stage directory keeps its copies. Call it once the workers are
        done (the DataLoader's iteration is over)."""
        if self._iteration is not None:
            self._iteration.release()
        self._loader.close()
        self._where.remove()

    def __enter__(self) -> "StagedSampler":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Batches:
    """One iteration of a StagedSampler. Counts every ``next()``, also those after the last batch: a
    ``DataLoader`` asks for one batch more each time the training loop takes one, so the count tells
    how many the loop has taken, even once every batch has been handed out."""

    def __init__(self, loader: Loader, epoch: int, first: int, ahead: int) -> None:
        self.epoch, self.first = epoch, first
        self.calls = 0
        self._loader = loader
        # Started at the first next(): DataLoader calls iter() on its sampler twice and uses the second.
        self._batches: Optional[Iterator[Any]] = None
        self._lock = threading.Lock()
        # The last batches handed out, held: the DataLoader's workers may read their samples until
        # it has asked for `ahead` more, and a batch's copies stay in the loader's window (never
        # evicted) until its buffer goes back to the ring. The loader's depth leaves 2 buffers free.
        self._held: Deque[Any] = collections.deque(maxlen=max(1, ahead))

    def __iter__(self) -> "_Batches":
        return self

    def __next__(self) -> List[int]:
        with self._lock:
            self.calls += 1
            if self._batches is None:
                self._batches = iter(self._loader)
        batch = next(self._batches)
        indices: List[int] = batch.indices.tolist()
        with self._lock:
            self._held.append(batch)  # and the oldest held goes back to the ring
        return indices

    def release(self) -> None:
        """Gives the held batches back to the loader's ring (the iteration is over or abandoned)."""
        with self._lock:
            self._held.clear()


def _rank_and_world(rank: Optional[int], world_size: Optional[int]) -> Tuple[int, int]:
    try:
        from prestage.torch import distributed_rank
    except ImportError:
        env_rank, env_world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        return (env_rank if rank is None else rank), (env_world if world_size is None else world_size)
    return distributed_rank(rank, world_size)


class StagedDataset:
    """A map-style dataset over a :class:`StagedSampler`'s catalog whose items your code makes from
    each sample's staged location. Give it one of:

    - ``read(sample, label)``: called with a :class:`StagedSample` (``sample.path``, ``.offset``,
      ``.length``, ``.open()``, ``.bytes()``: a read-only zero-copy view) and the catalog's label;
      returns the item;
    - ``dataset``: an unmodified dataset that loads files with a ``loader(path)`` attribute and lists
      them in ``samples`` (torchvision's ``ImageFolder`` and ``DatasetFolder``), whose catalog is the
      sampler's (:func:`catalog_of`): its ``loader`` is given the staged copy's path instead of the
      source's, and everything else (transforms, targets) is its own.

    Pickles small (the dataset, if any, and three paths); holds no thread and no lock.
    """

    def __init__(self, sampler: StagedSampler, *, read: Optional[Callable[[StagedSample, int], Any]] = None,
                 dataset: Any = None) -> None:
        if (read is None) == (dataset is None):
            raise ConfigError("StagedDataset needs read= or dataset= (one of them)")
        if dataset is not None:
            for attribute in ("loader", "samples"):
                if not hasattr(dataset, attribute):
                    raise ConfigError(f"dataset= needs a dataset with a {attribute!r} attribute (as "
                                      f"torchvision's ImageFolder); {type(dataset).__name__} has none: "
                                      "use read= instead")
            if len(dataset.samples) != len(sampler.catalog):
                raise ConfigError(f"the dataset has {len(dataset.samples)} samples and the sampler's catalog "
                                  f"{len(sampler.catalog)}: build the catalog with catalog_of(dataset)")
        self._where = sampler._where
        self._read = read
        self.dataset = dataset
        self._length = len(sampler.catalog)

    def __len__(self) -> int:
        return self._length

    def locate(self, index: int) -> StagedSample:
        """Where sample ``index``'s bytes are now (and counted as a read from there)."""
        return self._where.find(int(index))

    def __getitem__(self, index: int) -> Any:
        sample = self._where.find(int(index))
        try:
            return self._use(sample)
        except FileNotFoundError:
            if sample.tier != "stage":
                raise
        # The copy was evicted between the look and the read: the source has the same bytes.
        return self._use(self._where.gone(sample))

    def _use(self, sample: StagedSample) -> Any:
        if self._read is not None:
            return self._read(sample, self._where.catalog().label(sample.index))
        return self._through_dataset(sample)

    def _through_dataset(self, sample: StagedSample) -> Any:
        dataset = self.dataset
        expected = os.fspath(dataset.samples[sample.index][0])
        original = dataset.loader

        def loader(path: Any) -> Any:
            return original(sample.path if os.fspath(path) == expected else path)

        dataset.loader = loader
        try:
            return dataset[sample.index]
        finally:
            dataset.loader = original


def catalog_of(dataset: Any, root: Union[str, os.PathLike, None] = None) -> _core.Catalog:
    """A catalog of a dataset that lists its files in ``samples`` as ``(path, target)`` (torchvision's
    ``ImageFolder``, ``DatasetFolder``), in its order, so that index ``i`` is the same sample in both:
    paths relative to ``root`` (default: ``dataset.root``), labels its targets, classes its ``classes``."""
    root = os.fspath(root if root is not None else dataset.root)
    paths: List[str] = []
    for path, _ in dataset.samples:
        rel = os.path.relpath(os.fspath(path), root)
        if rel.startswith(".."):
            raise ConfigError(f"{path} is not under the root {root}")
        paths.append(rel)
    labels = [int(t) for _, t in dataset.samples]
    classes: Sequence[str] = list(getattr(dataset, "classes", []) or [])
    return _core.Catalog.from_paths(root, paths, labels, classes)
