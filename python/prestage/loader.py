"""prestage.Loader: the three-stage pipeline as a Python iterable of batches."""

from __future__ import annotations

import atexit
import json
import os
import weakref
from typing import Any, Dict, Iterator, Optional, Tuple, Union

from prestage import _core
from prestage.errors import ConfigError

_live_loaders: "weakref.WeakSet[Loader]" = weakref.WeakSet()


@atexit.register
def _close_live_loaders() -> None:
    # Threads must be joined before the interpreter tears down the modules they may call back into.
    for loader in list(_live_loaders):
        loader.close()


_DECODE_MODES = ("jpeg", "raw", "npy", "npz", "hdf5")


def _count(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value}")
    return value


class Loader:
    """Batches of a catalog, in a seeded global order, through the three stages.

    Stage 2 copies the files of the next ``lookahead`` batches to ``stage_dir`` with ``prefetchers``
    threads; stage 3 decodes each batch with ``readers`` threads into one of ``depth`` page-locked
    buffers. Iterating gives one epoch of :class:`prestage.Batch` objects whose ``images``, ``labels``
    and ``indices`` are zero-copy NumPy views; a buffer is reused once the batch and its views are
    collected. Each completed epoch advances the epoch (and so the shuffle); ``set_epoch`` picks one.

    Args:
        catalog: the samples (:class:`prestage.Catalog`).
        batch_size: samples per batch on this rank.
        image_size: ``(height, width)``: resize the shorter side to cover it, then centre-crop
            (torchvision ``Resize`` + ``CenterCrop``). ``None``: no resize; every image must have the
            size of the catalog's first image.
        shuffle: a new global permutation each epoch (else catalog order).
        seed: the shuffle's seed; the same seed gives the same batches on any machine and for any
            thread counts.
        stage_dir: node-local directory for stage 2's copies; ``None`` reads the source directly.
        cache_bytes: the most bytes the stage directory's copies may take (files being written
            included; its index adds 40 bytes per copy made); 0: no bound; ``None`` (the default):
            no bound if the data set fits in 90% of the stage directory's room at start (its file
            system's free space plus the copies already there), else that 90%, so that a node's
            disk is never filled up (``stats()["cache_bytes"]`` gives the bound chosen). When the
            bound is reached, a file is staged only by evicting one used later; a file not staged (it would displace files
            needed sooner) is read from the source into memory by stage 2 instead
            (``stats()["read_ahead"]``; JPEG and raw files, up to 64 MiB per batch), so stage 3 does
            not wait on the source for it.
        eviction: ``"clairvoyant"`` (evict the file whose next use in the plan is farthest away:
            Belady's rule, optimal since the plan is known) or ``"lru"``.
        prefetchers: stage 2 threads (I/O bound: more than cores is normal).
        readers: stage 3 threads (CPU bound).
        lookahead: batches stage 2 may work on ahead of stage 3.
        depth: batch buffers: batches decoded ahead plus those the caller still holds.
        rank, world_size: this process's share of every global batch (distributed training).
        drop_last: drop the last, incomplete global batch (else ranks are padded to equal counts).
        decode: how a sample's bytes become its part of the batch (``batch.images`` for JPEG,
            ``batch.arrays`` otherwise): ``"jpeg"`` (RGB images), ``"raw"`` (the bytes as they are:
            ``batch.data`` and ``batch.offsets``), ``"npy"`` (a ``.npy`` array: any dtype and
            shape, C or Fortran order), ``"npz"`` (one array of a ``.npz``, stored or deflated: see
            ``array_name``), ``"hdf5"`` (rows of a :meth:`Catalog.from_hdf5` catalog). ``None``:
            ``"hdf5"`` for an HDF5 catalog, else ``"jpeg"``. A sample that is a zstd frame
            (``.zst``) is decompressed first (all but ``"raw"``). Arrays of one shape make one
            ``(N, *shape)`` array; arrays of different shapes make a list (``batch.ragged``).
        max_pixels: images with more pixels are refused before decoding (decompression bombs).
        io_timeout: seconds a read may take before it fails (``IoError``, ``errno.ETIMEDOUT``, at its
            sample's batch) instead of hanging on a stalled file system; ``None``: no limit.
            Each loader has its own limit.
        stage_patience: seconds the next batch may wait for stage 2 to finish its copies; then stage 3
            takes it and reads the files no copy has started from the source itself (misses, counted
            in ``stats()["stage_expedited"]``), so a slow stage 2 never stalls training for more than
            the copies under way. ``None``: always wait for stage 2 (what is staged then follows the
            plan exactly, whatever the timing).
        on_error: what a sample that cannot be read or decoded (``IoError``, ``DecodeError``, a
            timed-out read) does. ``"raise"``: its error, naming its path, is raised at its batch.
            ``"skip"``: it is replaced in its batch by the next good sample of this rank's epoch
            (the samples that follow it in the order this rank's batches run through the epoch,
            wrapping around), so batches keep their size and shape; ``batch.indices`` and
            ``batch.labels`` are the replacement's. The choice depends on the plan and the data
            alone, not on thread counts. At most 32 samples are tried; if none is good, the error
            is raised after all. ``stats()["skipped"]`` counts the replaced samples and
            ``stats()["skipped_samples"]`` lists the first 1000 (path, error, sample,
            replacement, epoch, batch). With ``decode="raw"`` or arrays, a sample that fails only
            once its batch is laid out (its size or header read, its data not) is replaced by one
            of the same size, or dtype and shape.
        transform: with ``image_size``: ``"center-crop"`` (torchvision ``Resize`` +
            ``CenterCrop``: the eval path) or ``"random-resized-crop"`` (torchvision
            ``RandomResizedCrop`` with scale (0.08, 1), ratio (3/4, 4/3), then a horizontal flip
            with p = 0.5; drawn from (seed, epoch, sample index): a rerun gives the same pixels.
            See :func:`prestage.transforms.random_resized_crop_params`).
        layout: ``"NHWC"`` or ``"NCHW"`` (images).
        dtype: ``"uint8"``, or ``"float32"``: ``(pixel / 255 - mean[c]) / std[c]`` (images).
        mean, std: per-channel (R, G, B) normalisation for ``dtype="float32"``, on the 0..1 scale
            as torchvision's ``Normalize`` after ``ToTensor``.
        array_name: ``decode="npz"``: the member to take from each archive (without ``.npy``);
            ``None``: the archive's only array.
        max_sample_bytes: an array (or raw sample) larger than this is refused before any
            allocation (lying headers, decompression bombs).
        tuned: a JSON file written by ``prestage tune``; its ``prefetchers``, ``readers``,
            ``lookahead`` and ``depth`` replace those not given here explicitly.

    >>> with prestage.Loader(catalog, batch_size=64, image_size=(224, 224)) as loader:
    ...     for batch in loader:
    ...         train_step(batch.images, batch.labels)
    """

    def __init__(
        self,
        catalog: _core.Catalog,
        batch_size: int,
        image_size: Optional[Tuple[int, int]] = None,
        shuffle: bool = True,
        seed: int = 0,
        stage_dir: Union[str, os.PathLike, None] = None,
        cache_bytes: Optional[int] = None,
        eviction: str = "clairvoyant",
        prefetchers: int = 4,
        readers: int = 2,
        lookahead: int = 4,
        depth: int = 4,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
        decode: Optional[str] = None,
        max_pixels: int = 89_478_485,
        transform: str = "center-crop",
        layout: str = "NHWC",
        dtype: str = "uint8",
        mean: Tuple[float, float, float] = (0.0, 0.0, 0.0),
        std: Tuple[float, float, float] = (1.0, 1.0, 1.0),
        array_name: Optional[str] = None,
        max_sample_bytes: int = 4 << 30,
        io_timeout: Optional[float] = None,
        stage_patience: Optional[float] = 0.05,
        on_error: str = "raise",
        tuned: Union[str, os.PathLike, None] = None,
    ) -> None:
        if tuned is not None:
            threads = {"prefetchers": prefetchers, "readers": readers, "lookahead": lookahead,
                       "depth": depth}
            defaults = {"prefetchers": 4, "readers": 2, "lookahead": 4, "depth": 4}
            for name, value in load_tuned(tuned).items():
                if threads[name] == defaults[name]:
                    threads[name] = value
            prefetchers, readers = threads["prefetchers"], threads["readers"]
            lookahead, depth = threads["lookahead"], threads["depth"]
        if not isinstance(catalog, _core.Catalog):
            raise ConfigError(f"catalog must be a prestage.Catalog, got {type(catalog).__name__}")
        options = _core.LoaderOptions()
        options.batch_size = _count("batch_size", batch_size, 1)
        if image_size is not None:
            if len(image_size) != 2:
                raise ConfigError(f"image_size must be (height, width) or None, got {image_size!r}")
            options.image_size = (_count("image_size[0]", image_size[0], 1),
                                  _count("image_size[1]", image_size[1], 1))
        options.shuffle = bool(shuffle)
        options.seed = _count("seed", seed, 0)
        options.stage_dir = "" if stage_dir is None else os.fspath(stage_dir)
        # None: LoaderOptions::kFitFreeSpace.
        options.cache_bytes = 2**64 - 1 if cache_bytes is None else _count("cache_bytes", cache_bytes, 0)
        if eviction not in ("clairvoyant", "lru"):
            raise ConfigError(f"eviction must be 'clairvoyant' or 'lru', got {eviction!r}")
        options.eviction = getattr(_core.Eviction, eviction)
        options.prefetchers = _count("prefetchers", prefetchers, 1)
        options.readers = _count("readers", readers, 1)
        options.lookahead = _count("lookahead", lookahead, 1)
        options.depth = _count("depth", depth, 1)
        options.rank = _count("rank", rank, 0)
        options.world_size = _count("world_size", world_size, 1)
        options.drop_last = bool(drop_last)
        if decode is None:
            decode = "hdf5" if catalog.kind == "hdf5" else "jpeg"
        if decode not in _DECODE_MODES:
            raise ConfigError(f"decode must be one of {', '.join(map(repr, _DECODE_MODES))}, got {decode!r}")
        options.decode = getattr(_core.DecodeMode, decode)
        options.max_pixels = _count("max_pixels", max_pixels, 1)
        if io_timeout is not None:
            if isinstance(io_timeout, bool) or not isinstance(io_timeout, (int, float)) or io_timeout <= 0:
                raise ConfigError(f"io_timeout must be a positive number of seconds, got {io_timeout!r}")
            options.io_timeout_ms = max(1, round(io_timeout * 1000))
        if stage_patience is None:
            options.stage_patience_ms = 2**64 - 1  # LoaderOptions::kWaitForStaging
        elif isinstance(stage_patience, bool) or not isinstance(stage_patience, (int, float)) \
                or stage_patience < 0:
            raise ConfigError(f"stage_patience must be a number of seconds >= 0 or None, "
                              f"got {stage_patience!r}")
        else:
            options.stage_patience_ms = min(round(stage_patience * 1000), 2**64 - 2)
        if on_error not in ("raise", "skip"):
            raise ConfigError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        options.on_error = getattr(_core.OnError, on_error)
        transforms = {"center-crop": "center_crop", "random-resized-crop": "random_resized_crop"}
        if transform not in transforms:
            raise ConfigError(f"transform must be 'center-crop' or 'random-resized-crop', got {transform!r}")
        options.transform = getattr(_core.Transform, transforms[transform])
        if layout not in ("NHWC", "NCHW"):
            raise ConfigError(f"layout must be 'NHWC' or 'NCHW', got {layout!r}")
        options.layout = getattr(_core.Layout, layout)
        if dtype not in ("uint8", "float32"):
            raise ConfigError(f"dtype must be 'uint8' or 'float32', got {dtype!r}")
        options.dtype = getattr(_core.OutputType, dtype)
        try:
            options.mean = [float(v) for v in mean]
            options.std = [float(v) for v in std]
        except (TypeError, ValueError) as e:
            raise ConfigError(f"mean and std must be three numbers each: {e}") from e
        options.array_name = "" if array_name is None else str(array_name)
        options.max_sample_bytes = _count("max_sample_bytes", max_sample_bytes, 1)
        self._loader: Optional[_core.Loader] = _core.Loader(catalog, options)
        self._options = options
        self._num_samples = len(catalog)
        self._epoch = 0
        self._first_batch = 0  # where the next iteration starts (load_state_dict)
        self._position: Tuple[int, int] = (0, 0)  # (epoch, batches delivered) of the live iteration
        _live_loaders.add(self)

    def __len__(self) -> int:
        """Batches per epoch (the same on every rank)."""
        return self._core.batches_per_epoch

    @property
    def epoch(self) -> int:
        """The epoch the next iteration runs."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Chooses the epoch (and so the order) of the next iteration."""
        self._epoch = _count("epoch", epoch, 0)
        self._first_batch = 0

    def __iter__(self) -> Iterator[_core.Batch]:
        first, self._first_batch = self._first_batch, 0
        return _EpochIterator(self, self._epoch, first)

    def state_dict(self) -> Dict[str, Any]:
        """Where the loader is: enough to resume exactly, mid-epoch, with any thread counts.

        ``batch`` counts the batches of ``epoch`` already delivered to the caller.
        """
        epoch, batch = self._position
        if batch >= len(self):
            epoch, batch = epoch + 1, 0
        o = self._options
        return {
            "epoch": epoch,
            "batch": batch,
            "seed": o.seed,
            "shuffle": o.shuffle,
            "batch_size": o.batch_size,
            "world_size": o.world_size,
            "drop_last": o.drop_last,
            "num_samples": self._num_samples,
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Makes the next iteration resume where ``state`` (from ``state_dict()``) was taken.

        The plan must be the same: seed, shuffle, batch size, world size, drop_last and catalog size
        are checked (ConfigError otherwise); thread counts and depths may differ.
        """
        o = self._options
        mine = {"seed": o.seed, "shuffle": o.shuffle, "batch_size": o.batch_size,
                "world_size": o.world_size, "drop_last": o.drop_last,
                "num_samples": self._num_samples}
        for key, value in mine.items():
            if state.get(key) != value:
                raise ConfigError(f"state_dict was taken with {key}={state.get(key)!r}, "
                                  f"this loader has {key}={value!r}")
        epoch = _count("state_dict['epoch']", state.get("epoch"), 0)
        batch = _count("state_dict['batch']", state.get("batch"), 0)
        if batch > len(self):
            raise ConfigError(f"state_dict['batch']={batch} is past an epoch of {len(self)} batches")
        self._epoch, self._first_batch = epoch, batch
        self._position = (epoch, batch)

    def stats(self) -> dict:
        """Per-stage counters and the consumer's stall time (seconds the caller waited); with
        ``on_error="skip"``, ``skipped`` and ``skipped_samples``."""
        return self._core.stats()

    def close(self) -> None:
        """Stops the pipeline and joins its threads. Idempotent; batches already lent stay valid."""
        if self._loader is not None:
            self._loader.close()
            self._loader = None

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def _core(self) -> _core.Loader:
        if self._loader is None:
            raise ConfigError("the loader is closed")
        return self._loader


def load_tuned(path: Union[str, os.PathLike]) -> Dict[str, int]:
    """The thread counts and depths in a file written by ``prestage tune``."""
    keys = ("prefetchers", "readers", "lookahead", "depth")
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read tuned options from {os.fspath(path)!r}: {e}") from e
    options = data.get("options", data) if isinstance(data, dict) else None
    if not isinstance(options, dict):
        raise ConfigError(f"{os.fspath(path)!r} holds no options object")
    return {k: _count(f"{k} in {os.fspath(path)!r}", options[k], 1) for k in keys if k in options}


class _EpochIterator:
    """One epoch's batches. An error of one batch is raised at that batch; iteration can go on."""

    def __init__(self, loader: Loader, epoch: int, first_batch: int = 0) -> None:
        self._loader = loader
        self._epoch = epoch
        self._delivered = first_batch
        self._done = False
        loader._core.start_epoch(epoch, first_batch)
        loader._position = (epoch, first_batch)

    def __iter__(self) -> "_EpochIterator":
        return self

    def __next__(self) -> _core.Batch:
        if self._done:
            raise StopIteration
        try:
            batch = self._loader._core.next()
        except Exception:
            self._advance()  # the failed batch counts as delivered: resume goes past it
            raise
        if batch is None:
            self._done = True
            self._loader._epoch = self._epoch + 1
            raise StopIteration
        self._advance()
        return batch

    def _advance(self) -> None:
        self._delivered += 1
        self._loader._position = (self._epoch, self._delivered)
