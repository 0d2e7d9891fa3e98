"""prestage.torch: the loader as PyTorch tensors, for single-process and DistributedDataParallel training.

>>> import prestage, prestage.torch
>>> catalog = prestage.Catalog.from_folder("/pfs/imagenet/train")
>>> loader = prestage.torch.Loader(catalog, batch_size=256, image_size=(224, 224),
...                                stage_dir="/local/ssd/stage")          # rank from torch.distributed
>>> for epoch in range(start_epoch, 90):
...     loader.set_epoch(epoch)
...     for images, labels in loader:                   # uint8 (N, 3, 224, 224), int64 (N,): no copy
...         images = images.to("cuda", non_blocking=True).float().div_(255)
...         labels = labels.to("cuda", non_blocking=True)
...         ...
...         checkpoint = {"model": model.state_dict(), "loader": loader.state_dict()}

Copies: none. The core decodes straight into the layout and dtype asked for (uint8 or normalised float32,
NCHW or NHWC) in a page-locked batch buffer of its ring, and the tensors are ``torch.from_numpy`` views of
it. The buffer goes back to the ring when both tensors (and every view of them) have been collected, so hold
them only for the step that uses them; ``.clone()`` what must outlive it.

Host-to-device copies. Where a CUDA device is present, the ring's buffers are registered with the CUDA
driver (``stats()["pinned"] == "cuda"``: ``images.is_pinned()`` is true), so ``images.to("cuda",
non_blocking=True)`` is an asynchronous DMA that may still be reading the batch buffer when it returns. When
CUDA is in use, the loader keeps each batch lent until the copies enqueued on the current CUDA stream before
the next batch was asked for have finished (a CUDA event), so a buffer is never refilled under a copy in
flight. Copies enqueued on another stream must be waited for by the caller.

Device batches. ``Loader(..., device="cuda")`` does the copies itself and yields device tensors: each batch
is copied on a side CUDA stream while the caller's step on the previous batch runs, the caller's current
stream waits for that copy (an event) before it uses the tensors, and a host buffer goes back to the ring
only once the copy from it has completed. ``normalize_on_device=True`` (with ``dtype=torch.float32``) sends
uint8 over the bus, a quarter of the bytes, and applies ``mean``/``std`` on the GPU.

``import prestage`` does not import torch; ``import prestage.torch`` does.
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
from typing import TYPE_CHECKING, Any, Deque, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

import torch
import torch.utils.data

from prestage import _core
from prestage.errors import ConfigError, DecodeError, IoError
from prestage.loader import Loader as _NumpyLoader, as_catalog
from prestage.options import ARRAY_MODES, CommonOptions, take_decode_options

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["Loader", "as_tensors", "distributed_rank", "gather_state"]

#: DataLoader keywords that have no meaning here, and what to use instead.
_DATALOADER_ONLY = {
    "num_workers": "prestage decodes on threads, not in worker processes: use readers= (decode threads) "
                   "and prefetchers= (staging threads)",
    "prefetch_factor": "use depth= (batch buffers decoded ahead) and lookahead= (batches staged ahead)",
    "persistent_workers": "prestage's threads persist across epochs already",
    "worker_init_fn": "there are no worker processes",
    "multiprocessing_context": "there are no worker processes",
    "sampler": "the order is prestage's seeded global shuffle: use shuffle=, seed=, set_epoch(), rank=, "
               "world_size=",
    "batch_sampler": "the batches are prestage's plan: use batch_size=, shuffle=, seed=, drop_last=",
    "generator": "use seed=",
    "collate_fn": "batches come out collated as (images, labels); transform the yielded tensors instead",
}

_DType = Union[torch.dtype, str]

#: A batch's samples: one tensor ``(N, ...)`` when their shapes agree, else a list of N tensors (ragged
#: arrays, raw bytes of different lengths, JPEG images of mixed sizes without ``image_size``).
Samples = Union[torch.Tensor, List[torch.Tensor]]
_Pair = Tuple[Samples, torch.Tensor]


def distributed_rank(rank: Optional[int] = None, world_size: Optional[int] = None) -> Tuple[int, int]:
    """This process's ``(rank, world_size)``: the arguments where given, else ``torch.distributed``'s when
    it is initialised, else the ``RANK`` and ``WORLD_SIZE`` environment variables (as ``torchrun`` sets
    them), else ``(0, 1)``.

    >>> prestage.torch.distributed_rank()          # in a process of `torchrun --nproc-per-node 4`
    (2, 4)
    """
    if rank is not None and world_size is not None:
        return rank, world_size
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        found = (dist.get_rank(), dist.get_world_size())
    elif "RANK" in os.environ or "WORLD_SIZE" in os.environ:
        found = (_env_int("RANK"), _env_int("WORLD_SIZE"))
    else:
        found = (0, 1)
    return (found[0] if rank is None else rank, found[1] if world_size is None else world_size)


def gather_state(loader: Any, group: Any = None) -> Dict[str, Any]:
    """The job's global position: every rank's ``loader.state_dict()`` gathered over
    ``torch.distributed`` (``group``: None, the default group; gloo or NCCL) and merged
    (:func:`prestage.state.merge_states`), the same dict on every rank. Collective: every rank calls
    it. ``loader``: a :class:`Loader`, :class:`prestage.Loader` or ``StagedSampler``.

    A rank's own ``state_dict()`` is the global position when every rank delivered the same number of
    batches (DDP steps in lockstep); gather when they may differ, e.g. a checkpoint taken by a
    signal handler.

    >>> state = prestage.torch.gather_state(loader)
    >>> if torch.distributed.get_rank() == 0: torch.save({"loader": state, ...}, path)
    """
    import torch.distributed as dist

    from prestage.state import merge_states

    mine = loader.state_dict()
    states: List[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(states, mine, group=group)
    return merge_states(states)


def _env_int(name: str) -> int:
    text = os.environ.get(name)
    if text is None:
        raise ConfigError("RANK and WORLD_SIZE must be set together (or pass rank= and world_size=); "
                          f"{name} is not set")
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"environment variable {name}={text!r} is not an integer") from None


def _dtype_name(dtype: _DType) -> str:
    names = {"uint8": "uint8", "float32": "float32", torch.uint8: "uint8", torch.float32: "float32"}
    if not isinstance(dtype, (str, torch.dtype)) or dtype not in names:
        raise ConfigError(f"dtype must be torch.uint8 or torch.float32, got {dtype!r}")
    return names[dtype]


def _channels(value: Any) -> Any:
    """One number for every channel, or the value as given (the core checks it)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (value,) * 3
    return value


def as_tensors(batch: _core.Batch) -> Tuple[Samples, torch.Tensor]:
    """``(samples, labels)`` tensors viewing a :class:`prestage.Batch` of :class:`prestage.Loader`, of any
    decode mode: no copy; the batch's buffer stays lent while they live.

    ``samples`` is ``batch.images`` (``decode="jpeg"``: layout and dtype are the loader's) or
    ``batch.arrays`` (``"npy"``, ``"npz"``, ``"hdf5"``, ``"raw"``, TFRecord features) as tensors: one
    ``(N, *shape)`` tensor when the samples' shapes agree, else a list of N tensors (``batch.ragged``).
    Arrays stored big-endian are byte-swapped in place in the batch buffer (torch has no big-endian
    dtypes), so they too are views, not copies.

    >>> for batch in numpy_loader:
    ...     images, labels = prestage.torch.as_tensors(batch)
    """
    try:
        return _tensors(batch, jpeg=True)
    except ConfigError:  # not decode="jpeg": the batch's arrays
        return _tensors(batch, jpeg=False)


def _tensors(batch: _core.Batch, jpeg: bool) -> _Pair:
    """:func:`as_tensors` for a loader whose decode mode is known."""
    arrays = batch.images if jpeg else batch.arrays
    samples: Samples = [_view(a) for a in arrays] if isinstance(arrays, list) else _view(arrays)
    return samples, torch.from_numpy(batch.labels)


def _view(array: np.ndarray) -> torch.Tensor:
    """``torch.from_numpy(array)``; a non-native byte order is swapped in place first (the batch buffer is
    lent to this batch alone), since torch refuses it."""
    if not array.dtype.isnative:
        array.byteswap(inplace=True)
        array = array.view(array.dtype.newbyteorder("="))
    return torch.from_numpy(array)


def _each(samples: Samples) -> List[torch.Tensor]:
    return samples if isinstance(samples, list) else [samples]


def _cuda_in_use() -> bool:
    return torch.cuda.is_available()


def _record_stream_event() -> Optional[Any]:
    """An event on the current CUDA stream (after the copies the caller has enqueued), or None without
    CUDA. Something with ``query()`` and ``synchronize()``."""
    if not torch.cuda.is_initialized():
        return None
    event = torch.cuda.Event()
    event.record()
    return event


def _resolve_device(device: Union[str, int, "torch.device", None]) -> Optional[torch.device]:
    """The CUDA device asked for (with its index), or None for host tensors (``None`` or ``"cpu"``)."""
    if device is None:
        return None
    try:
        found = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ConfigError(f"device={device!r} is not a device: {e}") from None
    if found.type == "cpu":
        return None
    if found.type != "cuda":
        raise ConfigError(f"device={device!r}: prestage.torch.Loader copies to CUDA devices only (or "
                          "device=None for host tensors)")
    if not torch.cuda.is_available():
        raise ConfigError(f"device={device!r} asks for CUDA, but torch.cuda.is_available() is False (no "
                          "GPU, no driver, or a CPU-only build of torch): leave device= out for host "
                          "tensors")
    index = torch.cuda.current_device() if found.index is None else found.index
    if not 0 <= index < torch.cuda.device_count():
        raise ConfigError(f"device={device!r}: there are {torch.cuda.device_count()} CUDA devices")
    return torch.device("cuda", index)


def _mean_std(mean: Any, std: Any) -> Tuple[Tuple[float, ...], Tuple[float, ...]]:
    """normalize_on_device's mean and std, per channel (defaults 0 and 1), checked as the core checks
    them."""
    try:
        m = tuple(float(v) for v in _channels(0.0 if mean is None else mean))
        s = tuple(float(v) for v in _channels(1.0 if std is None else std))
    except (TypeError, ValueError):
        m = s = ()
    if len(m) != 3 or len(s) != 3 or not all(v > 0 for v in s):
        raise ConfigError(f"mean and std must be one number or three (std > 0), got mean={mean!r}, "
                          f"std={std!r}")
    return m, s


def _affine(normalize: Tuple[Sequence[float], Sequence[float]],
            layout: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(scale, shift)`` with ``(x / 255 - mean) / std == x * scale + shift``, shaped to broadcast over a
    batch of ``layout``: one pass over the batch instead of three."""
    mean = torch.tensor(normalize[0], dtype=torch.float64)
    std = torch.tensor(normalize[1], dtype=torch.float64)
    shape = (1, 3, 1, 1) if layout == "NCHW" else (1, 1, 1, 3)
    scale, shift = (1 / (255 * std)).reshape(shape), (-mean / std).reshape(shape)
    return scale.float(), shift.float()


def _normalized(images: List[torch.Tensor], affine: Tuple[torch.Tensor, torch.Tensor],
                ragged: bool) -> List[torch.Tensor]:
    """``x * scale + shift`` (:func:`_affine`) in float32 on one batch tensor, or on each image of a ragged
    batch (images without the batch dimension)."""
    scale, shift = affine
    if ragged:
        scale, shift = scale[0], shift[0]
    return [t.float().mul_(scale).add_(shift) for t in images]


class _HostHold:
    """Host batches kept lent until the device copies from them are done: ``(event, tensors)`` pairs, in
    the order the copies were enqueued; an event is anything with ``query()`` and ``synchronize()``.
    Thread-safe (close() may drain from another thread)."""

    def __init__(self) -> None:
        self._held: Deque[Tuple[Any, _Pair]] = collections.deque()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    def add(self, event: Any, tensors: _Pair) -> None:
        with self._lock:
            self._held.append((event, tensors))

    def release(self, keep_at_most: int) -> None:
        """Lets go of the batches whose copies are done (in order), then waits for the oldest until at most
        ``keep_at_most`` are kept."""
        with self._lock:
            while self._held and self._held[0][0].query():
                self._held.popleft()
            while len(self._held) > max(0, keep_at_most):
                self._held.popleft()[0].synchronize()

    def drain(self) -> None:
        self.release(0)


class _CudaCopier:
    """Copies host batches to ``device`` on a side stream of its own (optionally normalising there) and hands
    the results over to the caller's current stream."""

    def __init__(self, device: torch.device, normalize: Optional[Tuple[Sequence[float], Sequence[float]]],
                 layout: str) -> None:
        self.device = device
        self._stream = torch.cuda.Stream(device=device)
        self._affine: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
        if normalize is not None:
            scale, shift = _affine(normalize, layout)
            self._affine = (scale.to(device), shift.to(device))

    def copy(self, host: _Pair) -> Tuple[_Pair, Any]:
        """Enqueues the copy of ``host`` (and the normalisation) on the side stream; returns the device
        tensors and an event recorded after them."""
        with torch.cuda.stream(self._stream):
            moved = [t.to(self.device, non_blocking=True) for t in _each(host[0])]
            labels = host[1].to(self.device, non_blocking=True)
            if self._affine is not None:  # JPEG images
                moved = _normalized(moved, self._affine, ragged=isinstance(host[0], list))
            images: Samples = moved if isinstance(host[0], list) else moved[0]
            event = torch.cuda.Event()
            event.record(self._stream)
        return (images, labels), event

    def hand_over(self, tensors: _Pair, event: Any) -> None:
        """Makes the caller's current stream wait for the copy, and tells the caching allocator that the
        tensors (allocated on the side stream) are used there."""
        stream = torch.cuda.current_stream(self.device)
        stream.wait_event(event)
        for t in (*_each(tensors[0]), tensors[1]):
            t.record_stream(stream)


def _make_copier(device: torch.device, normalize: Optional[Tuple[Sequence[float], Sequence[float]]],
                 layout: str) -> Any:
    return _CudaCopier(device, normalize, layout)


class _LentUntilCopied:
    """Keeps zero-copy batches lent until the device copies made from them are done.

    After a batch is yielded, the caller may enqueue ``tensor.to("cuda", non_blocking=True)``, which reads
    the page-locked buffer asynchronously. When the next batch is asked for, an event is recorded on the
    current stream and the previous batch's tensors are kept until it completes. At most ``limit`` batches
    are kept, so that the ring always has a buffer for the pipeline: beyond that, the oldest is waited for.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._cuda = _cuda_in_use()
        self._last: Optional[_Pair] = None
        self._held = _HostHold()
        self._lock = threading.Lock()  # close() may drain from another thread

    def yielded(self, tensors: _Pair) -> None:
        with self._lock:
            self._last = tensors if self._cuda else None

    def next_requested(self) -> None:
        with self._lock:
            self._release_copied()

    def _release_copied(self) -> None:
        last, self._last = self._last, None
        if last is not None:
            event = _record_stream_event()
            if event is not None:
                self._held.add(event, last)
        self._held.release(self._limit)

    def drain(self) -> None:
        with self._lock:
            self._release_copied()
            self._held.drain()


class Loader(torch.utils.data.IterableDataset):
    """:class:`prestage.Loader` yielding ``(images, labels)`` torch tensors, ready for DDP; or, with
    ``decode=``, ``(arrays, labels)`` of any other format.

    Iterating gives one epoch: ``images`` ``(N, 3, H, W)`` (``layout="NCHW"``, the default) or
    ``(N, H, W, 3)`` (``"NHWC"``), uint8 or normalised float32 (``dtype``); ``labels`` int64 ``(N,)``. Both
    are views of the loader's page-locked batch buffer (no copy: see the module docstring). ``len(loader)``
    is the number of batches per epoch. Each completed epoch advances the epoch (and so the shuffle);
    ``set_epoch(e)`` picks one, as with ``DistributedSampler``.

    Distributed training: ``rank`` and ``world_size`` default to ``torch.distributed``'s when it is
    initialised, else to ``RANK`` / ``WORLD_SIZE`` (:func:`distributed_rank`). All ranks must use the same
    catalog, ``seed`` and ``batch_size``: each rank then takes its own slice of every global batch, the
    ranks' samples are disjoint, and every rank gets ``len(loader)`` batches, so DDP never waits on a short
    rank. With ``drop_last=False`` the epoch is padded by repeating its first few samples so that the ranks
    are even (as ``DistributedSampler``); with ``drop_last=True`` the last incomplete global batch is
    dropped.

    Thread safety: as :class:`prestage.Loader`: ``stats()``, ``state_dict()`` and ``close()`` may be called
    from any thread, also while another waits for a batch, which then raises :class:`prestage.ConfigError`.

    Resume: ``state_dict()`` says how many batches of which epoch were delivered and the global position
    (samples of the epoch's global order consumed); ``load_state_dict()`` on a new loader makes its next
    iteration yield exactly the remaining samples, whatever ``readers``, ``prefetchers``, ``lookahead`` and
    ``depth`` are now, on any ``world_size`` and ``batch_size`` (see :meth:`prestage.Loader.load_state_dict`
    and :func:`gather_state`); ``set_epoch()`` with the state's epoch keeps that position.

    It is also a ``torch.utils.data.IterableDataset``: ``DataLoader(loader, batch_size=None)`` (with
    ``num_workers=0``, the default) yields the same batches, without a copy. (``pin_memory=True`` there would
    copy every batch into another page-locked buffer: leave it out.)

    Device batches: with ``device="cuda"`` (or ``"cuda:1"``, a ``torch.device``) the tensors yielded are on
    that device, copied on a side stream one batch ahead (see the module docstring); the caller's current
    stream is made to wait for each copy, so they can be used at once. ``len()``, resume and the order are
    as on the host.

    Decoding on the device: with a CUDA ``device`` and ``decode_device="cuda"``, the JPEGs are decoded by
    nvJPEG on that device (its hardware engines where it has them) and cropped, resized and flipped there
    (see :class:`prestage.Loader`'s ``decode_device``; the CPU decoders take a share of each batch, sized
    at run time so that both finish together, or the fixed ``gpu_cpu_share`` given). The images yielded
    view the batch's device buffer, no copy: ``"NCHW"`` is a view of the NHWC buffer in
    ``torch.channels_last`` memory format (what channels_last training wants; ``.contiguous()`` makes a
    copy if one is needed), ``dtype=torch.float32`` one new normalised tensor. The caller's current stream waits for the decoding first; a batch goes back to the ring only
    once the work enqueued on the current stream before the next batch was asked for is done. Work
    enqueued on another stream must be waited for by the caller.

    Formats other than JPEG: ``decode="npy"``, ``"npz"`` (with ``array_name``), ``"hdf5"`` (inferred for a
    :meth:`prestage.Catalog.from_hdf5` catalog) or ``"raw"`` (TFRecord features and any file's bytes) yield
    ``(arrays, labels)``: ``arrays`` is one ``(N, *shape)`` tensor of the stored dtype when the batch's
    samples have one shape, else a list of N tensors; either views the batch buffer, as
    :func:`as_tensors` says (no copy). ``layout``, ``dtype``, ``mean``, ``std`` and
    ``normalize_on_device`` are for JPEG only. With ``device=``, each tensor of the list is copied.

    Args:
        catalog: the samples (:class:`prestage.Catalog`), or the path of a saved catalog
            (``prestage catalog``, :meth:`prestage.Catalog.save`).
        batch_size: samples per batch on this rank.
        image_size: ``(height, width)`` of the output; ``None``: each image keeps its own size (a batch
            of images of mixed sizes is a list of N tensors, ``(3, H_i, W_i)`` or ``(H_i, W_i, 3)``).
        decode, array_name, max_sample_bytes, raw_dtype, raw_shape: as for :class:`prestage.Loader`
            (``decode=None``: ``"hdf5"`` for an HDF5 catalog, ``"npy"`` for
            :meth:`Catalog.from_arrays`, else ``"jpeg"``).
        shuffle, seed, drop_last: as for ``DataLoader`` / ``DistributedSampler``; the same ``seed`` gives
            the same batches on any machine.
        transform: ``"center-crop"`` (torchvision ``Resize`` + ``CenterCrop``: evaluation) or
            ``"random-resized-crop"`` (``RandomResizedCrop`` + ``RandomHorizontalFlip``: training; drawn
            from seed, epoch and sample, so a resumed run gets the same pixels).
        layout: ``"NCHW"`` (PyTorch's convention) or ``"NHWC"``; either is contiguous.
        dtype: ``torch.uint8``, or ``torch.float32``: ``(x / 255 - mean) / std``.
        mean, std: per channel (R, G, B) or one number, on the 0-1 scale as torchvision's ``Normalize``
            (e.g. ``mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)``); float32 only.
        rank, world_size: this process's place among the data-parallel ranks (see above).
        device: ``None`` (or ``"cpu"``): host tensors viewing the batch buffers; a CUDA device: device
            tensors (a copy, asynchronous, from the registered buffers).
        normalize_on_device: with a CUDA ``device`` and ``dtype=torch.float32``: decode to uint8, copy
            that, and apply ``(x / 255 - mean) / std`` on the device.
        decode_device: ``"cpu"`` (the default) or ``"cuda"``: decode on ``device`` (see above).
        gpu_cpu_share: with ``decode_device="cuda"``: the fraction of each batch, in [0, 1),
            decoded by the CPU decoders; ``None`` (the default): sized at run time (see
            :class:`prestage.Loader`).
        gpu_crop: with ``decode_device="cuda"``: ``"auto"`` (the default), ``"resize"`` or ``"roi"``, where
            the hardware engine's crop boxes are applied (see :class:`prestage.Loader`).
        pin_memory: accepted for ``DataLoader`` compatibility when the batch buffers are registered with
            CUDA already (``stats()["pinned"] == "cuda"``), so no copy is made; refused otherwise, since
            prestage never copies a batch into another host buffer.
        options: the other options, by keyword, as for :class:`prestage.Loader`
            (:class:`prestage.options.CommonOptions`: ``stage_dir``, ``cache_bytes``, ``eviction``,
            ``prefetchers``, ``readers``, ``lookahead``, ``depth``, ``max_pixels``, ``io_timeout``,
            ``stage_patience``, ``on_error``, ``tuned``, ...). ``on_error="skip"`` replaces a sample
            that cannot be read or decoded by the next good sample of the epoch, so batches keep their
            shape; ``tuned=``'s values apply only to options not passed here.

    Raises:
        prestage.ConfigError: an invalid option; a ``DataLoader`` keyword with no meaning here (the message
            says what to use instead); a CUDA ``device`` where CUDA is not available;
            ``normalize_on_device`` without a CUDA device or float32; ``pin_memory=True`` where the
            buffers are not CUDA-registered.

    >>> loader = prestage.torch.Loader(catalog, batch_size=128, image_size=(224, 224),
    ...                                transform="random-resized-crop", dtype=torch.float32,
    ...                                mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    >>> images, labels = next(iter(loader))
    >>> images.shape, images.dtype
    (torch.Size([128, 3, 224, 224]), torch.float32)
    """

    def __init__(
        self,
        catalog: Union[_core.Catalog, str, "os.PathLike[str]"],
        batch_size: int,
        image_size: Optional[Tuple[int, int]] = None,
        *,
        layout: str = "NCHW",
        dtype: _DType = torch.uint8,
        mean: Union[float, Sequence[float], None] = None,
        std: Union[float, Sequence[float], None] = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        device: Union[str, int, torch.device, None] = None,
        normalize_on_device: bool = False,
        pin_memory: bool = False,
        decode_device: str = "cpu",
        gpu_cpu_share: Optional[float] = None,
        gpu_crop: str = "auto",
        **options: Unpack[CommonOptions],
    ) -> None:
        super().__init__()
        for name in options:
            if name in _DATALOADER_ONLY:
                raise ConfigError(f"{name}= is a DataLoader option with no meaning for "
                                  f"prestage.torch.Loader: {_DATALOADER_ONLY[name]}")
            if name not in CommonOptions.__optional_keys__:
                raise TypeError(f"Loader() got an unexpected keyword argument {name!r}")
        for name, flag in (("normalize_on_device", normalize_on_device), ("pin_memory", pin_memory)):
            if not isinstance(flag, bool):
                raise ConfigError(f"{name} must be True or False, got {flag!r}")
        self._device = _resolve_device(device)
        catalog = as_catalog(catalog)
        decode = options.get("decode")
        mode, codec = take_decode_options(catalog, options)
        # What PyTorch spells differently is converted here; every rule is the core's.
        image_options: Dict[str, Any] = {"layout": layout, "dtype": _dtype_name(dtype)}
        if mean is not None:
            image_options["mean"] = _channels(mean)
        if std is not None:
            image_options["std"] = _channels(std)
        jpeg = mode not in ARRAY_MODES
        if not jpeg:
            # Arrays and bytes come out as stored: PyTorch's own image defaults do not apply to them.
            if image_options != {"layout": "NCHW", "dtype": "uint8"} or normalize_on_device:
                raise ConfigError(f"layout, dtype, mean, std and normalize_on_device apply to decode='jpeg' "
                                  f"only; decode={decode!r} gives the samples as stored")
            image_options = {}
        normalize = None
        if normalize_on_device:
            if self._device is None:
                raise ConfigError("normalize_on_device=True needs a CUDA device= (on the host, dtype="
                                  "torch.float32 normalises while decoding)")
            if image_options["dtype"] != "float32":
                raise ConfigError("normalize_on_device=True gives float32 tensors: pass dtype=torch.float32")
            if layout not in ("NCHW", "NHWC"):
                raise ConfigError(f"layout must be 'NCHW' or 'NHWC', got {layout!r}")
            normalize = _mean_std(mean, std)
            image_options = {"layout": layout, "dtype": "uint8"}  # what crosses the bus
        gpu_decode: Dict[str, Any] = {}
        if decode_device != "cpu" or gpu_cpu_share is not None or gpu_crop != "auto":
            gpu_decode = {"decode_device": decode_device, "gpu_crop": gpu_crop}
            if gpu_cpu_share is not None:
                gpu_decode["gpu_cpu_share"] = gpu_cpu_share
        self._on_device_decode = decode_device == "cuda"
        if self._on_device_decode:
            if self._device is None:
                raise ConfigError("decode_device='cuda' needs a CUDA device= (the batches are born on "
                                  "it)")
            if not jpeg:
                raise ConfigError("decode_device='cuda' decodes JPEG images only (decode='jpeg')")
            if layout not in ("NCHW", "NHWC"):
                raise ConfigError(f"layout must be 'NCHW' or 'NHWC', got {layout!r}")
            # The device batch is NHWC uint8; NCHW is a view of it, float32 is made on the device.
            if normalize is None and image_options["dtype"] == "float32":
                normalize = _mean_std(mean, std)
            elif normalize is None and (mean is not None or std is not None):
                raise ConfigError("mean and std apply to dtype=torch.float32 only")
            image_options = {"layout": "NHWC", "dtype": "uint8"}
        self._rank, self._world_size = distributed_rank(rank, world_size)
        with contextlib.ExitStack() as on_device:
            if self._on_device_decode:
                # The core decodes on the CUDA device current while it is made.
                on_device.enter_context(torch.cuda.device(self._device))
            self._loader = _NumpyLoader(catalog, batch_size, image_size, rank=self._rank,
                                        world_size=self._world_size, **codec,
                                        **image_options, **gpu_decode, **options)
        if pin_memory:
            stats = self._loader.stats()
            if stats["pinned"] != "cuda":
                self._loader.close()
                raise ConfigError("pin_memory=True: the batch buffers are not registered with CUDA "
                                  f"(stats()['pinned'] is {stats['pinned']!r}: {stats['pinned_why']}); "
                                  "leave pin_memory out (prestage never copies a batch on the host)")
        self._decode = self._loader.options.decode.name
        self._jpeg = jpeg
        self._layout = layout if jpeg else None
        self._dtype = "float32" if normalize is not None else image_options.get("dtype")
        depth = self._loader.options.depth  # after `tuned`
        self._lent = _LentUntilCopied(limit=max(0, depth - 1))
        self._copier = None
        self._gpu_affine: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
        if self._on_device_decode:
            assert self._device is not None
            if normalize is not None:
                scale, shift = _affine(normalize, layout)
                self._gpu_affine = (scale.to(self._device), shift.to(self._device))
        elif self._device is not None:
            self._copier = _make_copier(self._device, normalize, layout)
        self._in_flight = _HostHold()  # device=: host batches under a copy

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def epoch(self) -> int:
        """The epoch the next iteration runs."""
        return self._loader.epoch

    def __len__(self) -> int:
        """Batches per epoch: the same on every rank."""
        return len(self._loader)

    def set_epoch(self, epoch: int) -> None:
        """Chooses the epoch (and so the shuffle) of the next iteration, as
        ``DistributedSampler.set_epoch``."""
        self._loader.set_epoch(epoch)

    def __iter__(self) -> Iterator[_Pair]:
        if torch.utils.data.get_worker_info() is not None:
            raise ConfigError("prestage.torch.Loader must be iterated in the process that made it: use "
                              "DataLoader(loader, batch_size=None) with num_workers=0 (its threads do "
                              "the work)")
        if self._on_device_decode:
            assert self._device is not None and self._layout is not None
            return _DecodedOnDeviceEpoch(self._lent, iter(self._loader), self._device, self._layout,
                                         self._gpu_affine)
        if self._copier is not None:
            # One host batch is being copied ahead; at most depth - 1 are held, one is left to the ring.
            return _DeviceEpoch(self._copier, self._in_flight, iter(self._loader), self._jpeg,
                                keep_at_most=max(0, self._loader.options.depth - 2))
        return _Epoch(self._lent, iter(self._loader), self._jpeg)

    def state_dict(self) -> Dict[str, Any]:
        """Where the loader is (epoch, batches delivered, and the plan's parameters): a dict of plain
        values for a checkpoint. See :meth:`prestage.Loader.state_dict`."""
        return self._loader.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Makes the next iteration yield the rest of the epoch where ``state`` was taken. Thread counts,
        depths, world size, batch size and drop_last may differ; the seed, shuffle and catalog size must
        not (``prestage.ConfigError``). See :meth:`prestage.Loader.load_state_dict`."""
        self._loader.load_state_dict(state)

    def stats(self, epochs: Any = None) -> dict:
        """Per-stage counters; ``consumer_stall_s`` is the time the training loop waited for batches;
        ``epochs`` as :meth:`prestage.Loader.stats` takes it (default: the epoch being delivered)."""
        return self._loader.stats(epochs)

    @property
    def device(self) -> Optional[torch.device]:
        """The CUDA device the batches are copied to, or None (host tensors)."""
        return self._device

    def close(self) -> None:
        """Waits for device copies from lent batches, then stops the loader's threads; any thread (a thread
        waiting for a batch raises :class:`prestage.ConfigError`). Idempotent."""
        self._lent.drain()
        self._in_flight.drain()
        self._loader.close()

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getstate__(self) -> None:
        raise ConfigError("a prestage.torch.Loader cannot be sent to another process (its threads and "
                          "buffers live in this one): iterate it here, with DataLoader num_workers=0")

    def __repr__(self) -> str:
        return (f"prestage.torch.Loader(batch_size={self._loader.options.batch_size}, rank={self._rank}, "
                f"world_size={self._world_size}, batches={len(self)}, decode={self._decode!r}, "
                f"layout={self._layout!r}, "
                f"dtype={self._dtype!r}, device={self._device})")


class _Epoch:
    """One epoch of ``(images, labels)``. An error of one batch is raised at that batch; iteration can go
    on."""

    def __init__(self, lent: _LentUntilCopied, batches: Iterator[_core.Batch], jpeg: bool) -> None:
        self._lent = lent
        self._batches = batches
        self._jpeg = jpeg

    def __iter__(self) -> "_Epoch":
        return self

    def __next__(self) -> _Pair:
        self._lent.next_requested()
        tensors = _tensors(next(self._batches), self._jpeg)
        self._lent.yielded(tensors)
        return tensors


class _DecodedOnDeviceEpoch:
    """One epoch of device ``(images, labels)`` decoded on the device (``decode_device="cuda"``).

    ``images`` views the batch's device buffer through ``__cuda_array_interface__`` (no copy; NCHW is a
    permuted view, a ``channels_last`` tensor): the caller's current stream waits for the stream that
    decoded it. ``dtype=torch.float32`` makes one new tensor on the device, ``(x / 255 - mean) / std``.
    The labels (int64, on the host) are copied to the device. The batch stays lent until the work the
    caller enqueued on its current stream before asking for the next batch is done (an event), as for
    host batches, so no kernel still reads a device buffer when the decoder writes its next batch there.
    An error of one batch is raised at that batch."""

    def __init__(self, lent: _LentUntilCopied, batches: Iterator[_core.Batch], device: torch.device,
                 layout: str, affine: Optional[Tuple[torch.Tensor, torch.Tensor]]) -> None:
        self._lent = lent
        self._batches = batches
        self._device = device
        self._layout = layout
        self._affine = affine

    def __iter__(self) -> "_DecodedOnDeviceEpoch":
        return self

    def __next__(self) -> _Pair:
        self._lent.next_requested()
        batch = next(self._batches)
        stream = torch.cuda.current_stream(self._device)
        stream.wait_stream(torch.cuda.ExternalStream(batch.device_stream, device=self._device))
        # Holds the batch (and so its buffer) while it lives.
        nhwc = torch.as_tensor(batch, device=self._device)
        host_labels = torch.from_numpy(batch.labels)
        self._lent.yielded((nhwc, host_labels))
        images = nhwc.permute(0, 3, 1, 2) if self._layout == "NCHW" else nhwc
        if self._affine is not None:
            images = images.float().mul_(self._affine[0]).add_(self._affine[1])
        return images, host_labels.to(self._device, non_blocking=True)


class _DeviceEpoch:
    """One epoch of device ``(images, labels)``: batch b + 1 is fetched and its copy enqueued before batch b
    is returned, so the copy overlaps the caller's step on b. A host batch stays held until its copy's
    event completes; at most ``keep_at_most`` + 1 are held. An error of one batch is raised at that batch,
    after the batches before it."""

    def __init__(self, copier: Any, hold: _HostHold, batches: Iterator[_core.Batch], jpeg: bool,
                 keep_at_most: int) -> None:
        self._copier = copier
        self._hold = hold
        self._batches = batches
        self._jpeg = jpeg
        self._keep_at_most = keep_at_most
        self._ahead: Optional[Tuple[_Pair, Any]] = None
        self._error: Optional[BaseException] = None
        self._ended = False

    def __iter__(self) -> "_DeviceEpoch":
        return self

    def __next__(self) -> _Pair:
        if self._ahead is None and self._error is None:
            self._fetch()
        if self._ahead is None:
            error, self._error = self._error, None
            if error is not None:
                raise error
            raise StopIteration
        current, self._ahead = self._ahead, None
        self._fetch()
        self._copier.hand_over(*current)
        return current[0]

    def _fetch(self) -> None:
        if self._ended:
            return
        self._hold.release(self._keep_at_most)
        try:
            host = _tensors(next(self._batches), self._jpeg)
        except StopIteration:
            self._ended = True
            return
        except (IoError, DecodeError) as e:  # this batch's sample: raised in its turn
            self._error = e
            return
        tensors, event = self._copier.copy(host)
        self._hold.add(event, host)
        self._ahead = (tensors, event)


# Staging for a dataset of your own (prestage.staging): the sampler, the dataset wrapper, the catalog of a
# torchvision-style dataset.
from prestage.staging import StagedDataset, StagedSample, StagedSampler, catalog_of  # noqa: E402

__all__ += ["StagedDataset", "StagedSample", "StagedSampler", "catalog_of"]
