"""prestage.tf: the loader as a ``tf.data.Dataset``, for Keras ``model.fit`` and custom TensorFlow loops.

>>> import prestage, prestage.tf
>>> catalog = prestage.Catalog.from_folder("/pfs/imagenet/train")
>>> train = prestage.tf.dataset(catalog, batch_size=256, image_size=(224, 224),
...                             stage_dir="/local/ssd/stage")
>>> model.fit(train, epochs=90, shuffle=False)   # each pass is the loader's next epoch (a new shuffle)

``import prestage`` does not import TensorFlow; ``import prestage.tf`` does.
"""

from __future__ import annotations

import errno
import math
import os
from typing import (TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Literal, Mapping, Optional,
                    Tuple, Union)

import numpy as np
import tensorflow as tf

from prestage import _core
from prestage.errors import ConfigError, IoError
from prestage.loader import Loader, as_catalog
from prestage.options import ARRAY_MODES, ImageOptions, take_decode_options

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["dataset", "staged_paths"]

# TensorFlow wraps a NumPy array without copying when its data are aligned to this (Eigen's largest
# alignment); an unaligned array is copied again.
_TF_ALIGNMENT = 64


def dataset(
    catalog: Union[_core.Catalog, str, "os.PathLike[str]"],
    batch_size: int,
    image_size: Optional[Tuple[int, int]] = None,
    *,
    decode_device: Literal["cpu", "cuda"] = "cpu",
    ragged: bool = False,
    resume: Optional[Dict[str, Any]] = None,
    **options: Unpack[ImageOptions],
) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` of ``(images, labels)`` batches: the batches of :class:`prestage.Loader`;
    with ``decode=`` another format, ``(arrays, labels)``.

    Elements are ``images`` ``(N, H, W, 3)`` (``layout="NHWC"``, Keras's ``channels_last``; or ``"NCHW"``),
    uint8 or normalised float32 (``dtype``), and ``labels`` int64 ``(N,)``: the batches the NumPy loader
    gives with the same arguments, in the same order. The ``output_signature`` is complete:
    ``H`` and ``W`` are ``image_size``, or when it is ``None`` the catalog's first image's (read once,
    through its codec: TFRecord records and zstd frames too, when the dataset is made), and a batch
    holding an image of another size raises :class:`prestage.ConfigError` unless ``ragged=True``,
    which makes every batch a ``tf.RaggedTensor`` of images of their own sizes (``(N, None, None,
    3)``, ``ragged_rank`` 2; NCHW ``(N, 3, None, None)``, ``ragged_rank`` 3); the batch dimension
    is ``batch_size`` when every batch is full (``drop_last=True``, or the rank's share of the set
    is a multiple of ``batch_size``), else ``None``. The cardinality is the number of batches
    per epoch, so Keras knows the steps per epoch. Each complete pass over the dataset is the loader's next
    epoch (a new shuffle); a pass stopped early starts its epoch again.

    Resume: ``ds.loader`` is the :class:`prestage.Loader`; its ``state_dict()`` counts the batches the
    dataset has produced (those a ``prefetch`` holds included: checkpoint after the pass, or
    without a prefetch). ``resume=state`` (a ``state_dict()`` of any adaptor, any world size and
    batch size) makes the first pass the rest of that state's epoch, of unknown cardinality.

    Copies: one per batch, from the loader's page-locked buffer into memory that TensorFlow then owns
    (aligned so that TensorFlow takes it without a second copy); the buffer goes back to the loader's
    ring at once, so ``.prefetch()`` and Keras may hold as many elements as they like.

    Keras's own ``shuffle`` does not apply (the order is prestage's global shuffle): pass ``shuffle=False``
    to ``model.fit`` to silence its warning.

    Other formats: ``decode="npy"``, ``"npz"`` (``array_name``), ``"hdf5"`` (inferred for an HDF5
    catalog; ``"npy"`` is inferred for slices of array files, :meth:`Catalog.from_arrays`) give
    ``arrays`` of the data set's dtype (in native byte order; a sample of another dtype raises at its
    batch, or is skipped) and ``(N, *shape)``, ``shape`` the catalog's first sample of that dtype's
    (read once, through the same codec, when the dataset is made);
    a batch whose samples have another shape, or several, raises :class:`prestage.ConfigError` unless
    ``ragged=True``, which makes every batch a ``tf.RaggedTensor`` (``ragged_rank`` = the samples'
    rank). ``decode="raw"`` gives each sample's bytes as a ``tf.string`` ``(N,)``, for
    ``tf.io.decode_raw``, ``tf.io.parse_example`` or the user's own parser; with ``raw_dtype``
    (and ``raw_shape``) it gives arrays as the other formats do, ``(N, *shape)`` of that dtype:
    what ``tf.io.decode_raw`` and ``tf.reshape`` would make of each sample (a TFRecord feature's
    raw pixels, a ``float_list``), without the strings.

    Args: ``catalog`` (or the path of a saved catalog), ``batch_size``, ``image_size`` and the
    options, by keyword, as for :class:`prestage.Loader` (:class:`prestage.options.ImageOptions`;
    ``dtype`` and ``layout`` as strings; ``decode``, ``array_name``, ``max_sample_bytes``,
    ``raw_dtype``, ``raw_shape``);
    ``decode_device`` is ``"cpu"`` (the default) only: ``"cuda"`` raises
    :class:`prestage.ConfigError`, because the dataset hands TensorFlow host memory (the copy above,
    from the batch's host buffer), and a batch decoded on the GPU holds its images in device memory
    only (:class:`prestage.Loader` and :class:`prestage.torch.Loader` take those);
    ``rank``/``world_size`` give this worker its slice of every global batch (all workers get the
    same number of batches). ``on_error="skip"`` replaces a sample that cannot be read or
    decoded by the next good one, so batches keep their shape (``on_error="raise"``, the default,
    raises at its batch).

    Raises:
        prestage.ConfigError: an invalid option; ``decode_device="cuda"``.

    >>> ds = prestage.tf.dataset(catalog, batch_size=64, image_size=(96, 96), seed=1)
    >>> ds.element_spec
    (TensorSpec(shape=(None, 96, 96, 3), dtype=tf.uint8, name='images'),
     TensorSpec(shape=(None,), dtype=tf.int64, name='labels'))
    """
    for name in options:
        if name not in ImageOptions.__optional_keys__:
            raise TypeError(f"dataset() got an unexpected keyword argument {name!r}")
    if not isinstance(ragged, bool):
        raise ConfigError(f"ragged must be True or False, got {ragged!r}")
    if decode_device == "cuda":
        raise ConfigError("prestage.tf.dataset cannot take decode_device='cuda': it hands TensorFlow each "
                          "batch as host memory, copied from the batch's host buffer, and a batch decoded "
                          "on the GPU has its images in device memory only. Decode on the CPU (the "
                          "default), or use prestage.Loader or prestage.torch.Loader for batches "
                          "decoded on the device")
    catalog = as_catalog(catalog)
    mode, codec = take_decode_options(catalog, options)
    loader = Loader(catalog, batch_size, image_size, **codec, decode_device=decode_device, **options)
    if resume is not None:
        loader.load_state_dict(resume)
    o = loader.options
    per_rank = math.ceil(len(catalog) / o.world_size)
    full = o.drop_last or per_rank % batch_size == 0
    n = batch_size if full else None
    spec: Any
    if mode in ARRAY_MODES:
        spec, samples = _array_spec(catalog, mode, codec, n, ragged)
    else:
        spec, samples = _image_spec(catalog, loader, options, n, ragged)

    signature = (spec, tf.TensorSpec((n,), tf.int64, name="labels"))

    def batches() -> Iterator[Tuple[Any, np.ndarray]]:
        for batch in loader:
            data, labels = samples(batch), batch.labels.copy()
            del batch  # the buffer goes back to the ring
            yield data, labels

    data = tf.data.Dataset.from_generator(batches, output_signature=signature)
    if loader._first_batch == 0 and loader.batches_in_epoch(loader.epoch) == len(loader):
        data = data.apply(tf.data.experimental.assert_cardinality(len(loader)))
    data.loader = loader  # type: ignore[attr-defined]  # state_dict(), stats(), close()
    return data


def _array_spec(catalog: _core.Catalog, mode: str, codec: Dict[str, Any], n: Optional[int],
                ragged: bool) -> Tuple[Any, Callable[[_core.Batch], Any]]:
    """The element spec of a batch of arrays or raw bytes, and the function that copies a batch into it."""
    if mode == "raw" and codec.get("raw_dtype") is None:
        def strings(batch: _core.Batch) -> np.ndarray:
            return np.array([a.tobytes() for a in _each(batch.arrays)], dtype=object)
        return tf.TensorSpec((n,), tf.string, name="data"), strings
    if len(catalog) == 0:
        raise ConfigError("the catalog is empty: there is no sample to take the arrays' dtype and shape from")
    dtype, shape = _first_sample(catalog, **codec)
    tf_dtype = tf.as_dtype(dtype)
    if ragged:
        if not shape:
            raise ConfigError("ragged=True: the samples are scalars (rank 0), which cannot be ragged")

        def stacked(batch: _core.Batch) -> Any:
            # The spec's row splits are int64, but tf.ragged.stack makes int32 ones for 1-D items.
            rows = tf.ragged.stack([tf.constant(a.astype(dtype)) for a in _each(batch.arrays)])
            return rows.with_row_splits_dtype(tf.int64)
        spec = tf.RaggedTensorSpec((n, *[None] * len(shape)), tf_dtype, ragged_rank=len(shape))
        return spec, stacked

    def dense(batch: _core.Batch) -> np.ndarray:
        if batch.ragged or tuple(batch.shapes[0]) != tuple(shape):
            raise ConfigError(f"batch {batch.index} of epoch {batch.epoch} holds samples of shapes "
                              f"{sorted(set(batch.shapes))}, not the first sample's {tuple(shape)}: pass "
                              "ragged=True for batches of mixed shapes")
        arrays = batch.arrays
        assert not isinstance(arrays, list)  # not ragged: checked above
        return _aligned_copy(arrays, dtype)
    return tf.TensorSpec((n, *shape), tf_dtype, name="arrays"), dense


def _first_sample(catalog: _core.Catalog, **options: Any) -> Tuple[np.dtype, Tuple[int, ...]]:
    """The dtype (native byte order) and shape of the catalog's first sample of the data set's dtype (the
    first one that reads and has it: a loader's batches take the data set's dtype, see the README),
    decoded as a loader with ``options`` decodes it: they give the dtype and shape of the signature."""
    options = {**options, "on_error": "skip"}  # an odd or unreadable first sample is passed over
    with Loader(catalog, 1, shuffle=False, readers=1, prefetchers=1, **options) as first:
        probe = next(iter(first))
        dtype, shape = probe.dtype.newbyteorder("="), tuple(probe.shapes[0])
        del probe
    return dtype, shape


# What decides the first image's size besides the catalog: the pixel limit, and which image stands in
# for a first one that fails.
_FIRST_IMAGE_OPTIONS = ("max_pixels", "on_error", "io_timeout")


def _image_spec(catalog: _core.Catalog, loader: Loader, options: Mapping[str, object], n: Optional[int],
                ragged: bool) -> Tuple[Any, Callable[[_core.Batch], Any]]:
    """The element spec of a batch of images, and the function that copies a batch into it."""
    o = loader.options
    nchw = o.layout == _core.Layout.NCHW
    tf_dtype = tf.as_dtype(o.dtype.name)
    if ragged:
        # Each image's height and width ragged, its channels not (NHWC): tf.ragged.stack needs the
        # images' own ragged dimensions made explicit.
        inner = 2 if nchw else 1

        def stacked(batch: _core.Batch) -> Any:
            return tf.ragged.stack([tf.RaggedTensor.from_tensor(image, ragged_rank=inner)
                                    for image in _each(batch.images)])
        shape = (n, 3, None, None) if nchw else (n, None, None, 3)
        return tf.RaggedTensorSpec(shape, tf_dtype, ragged_rank=inner + 1), stacked
    if loader.image_size is not None:
        height, width = loader.image_size
    else:
        # Not resized: the first image's size, as the loader reads it (TFRecord, zstd frames too).
        first = {k: v for k, v in options.items() if k in _FIRST_IMAGE_OPTIONS}
        decode = o.decode.name  # "jpeg" or "image"
        _, (height, width, _) = _first_sample(catalog, decode=decode, layout="NHWC", **first)
        _check_sizes(catalog, (height, width), {**first, "decode": decode})
    image = (3, height, width) if nchw else (height, width, 3)

    def dense(batch: _core.Batch) -> np.ndarray:
        images = batch.images
        if isinstance(images, list) or images.shape[1:] != image:
            raise ConfigError(f"batch {batch.index} of epoch {batch.epoch} holds images of shapes "
                              f"{sorted(set(batch.shapes))}, not the first image's {image}: pass "
                              "ragged=True for batches of images of mixed sizes")
        return _aligned_copy(images)
    return tf.TensorSpec((n, *image), tf_dtype, name="images"), dense


#: Images _check_sizes decodes: a set of mixed sizes (ImageNet's) shows it in any few of them.
_SIZE_PROBES = 5


def _check_sizes(catalog: _core.Catalog, size: Tuple[int, int], options: Mapping[str, Any]) -> None:
    """Raises ConfigError, here rather than in TensorFlow, when any of ``_SIZE_PROBES`` images drawn
    from the catalog (a fixed draw) has another size than ``size``, the first image's. TensorFlow wraps
    an error raised inside the generator in its own ``InvalidArgumentError``, which ``except
    prestage.ConfigError`` does not catch: a set of mixed sizes is told apart before it gets there. An
    odd image the probes miss still raises there, at its batch."""
    count = min(_SIZE_PROBES, len(catalog))
    probe_options: Dict[str, Any] = {"decode": "jpeg", **options, "on_error": "skip"}
    with Loader(catalog, count, shuffle=True, seed=0, readers=1, prefetchers=1, layout="NHWC",
                **probe_options) as probe:
        batch = next(iter(probe))
        shapes = sorted({tuple(s[:2]) for s in batch.shapes})
    if shapes != [tuple(size)]:
        raise ConfigError(f"the images have several sizes (the first {tuple(size)}; of {count} drawn from "
                          f"the catalog: {shapes}) and image_size is None: pass image_size=(H, W) to "
                          "resize them, or ragged=True for batches of images of mixed sizes")


def _each(arrays: Union[np.ndarray, List[np.ndarray]]) -> List[np.ndarray]:
    return arrays if isinstance(arrays, list) else list(arrays)


def _aligned_copy(array: np.ndarray, dtype: Optional[np.dtype] = None) -> np.ndarray:
    """A copy of ``array`` (as ``dtype``: a byte order TensorFlow reads) whose data start on a
    ``_TF_ALIGNMENT`` boundary."""
    dtype = array.dtype if dtype is None else dtype
    raw = np.empty(array.nbytes + _TF_ALIGNMENT, dtype=np.uint8)
    start = -raw.ctypes.data % _TF_ALIGNMENT
    out = raw[start:start + array.nbytes].view(dtype).reshape(array.shape)
    np.copyto(out, array)
    return out


def staged_paths(catalog: Union[_core.Catalog, str, "os.PathLike[str]"], batch_size: int, *, stage_dir: str,
                 epochs: Optional[int] = None, read: bool = False, **options: Any) -> tf.data.Dataset:
    """Staging for your own parsing: a ``tf.data.Dataset`` of this rank's samples in plan order, each
    ``(path, offset, length, label)`` where ``path`` is the staged copy on the local SSD, or the source
    when it was not staged in time (``length`` -1: the whole file), or ``(bytes, label)`` with
    ``read=True``. Stages 1 and 2 run on prestage's threads (:class:`prestage.staging.StagedSampler`,
    whose options it takes) while your ``map`` parses, with ``num_parallel_calls=tf.data.AUTOTUNE`` and
    the order kept:

    >>> ds = prestage.tf.staged_paths(catalog, 256, stage_dir="/local/ssd")
    >>> ds = ds.map(lambda path, offset, length, label: (parse(tf.io.read_file(path)), label),
    ...             num_parallel_calls=tf.data.AUTOTUNE).batch(256)

    Each pass is the next epoch (a new order), ``epochs`` passes in all (``None``: without end);
    ``resume=state`` (a ``state_dict()`` of any adaptor, any world size) makes the first pass the
    rest of that state's epoch (``ds.sampler.state_dict()`` is where the passes are). A copy
    stays staged for ``in_flight`` batches (default 16) after its batch was handed out; one evicted
    sooner is simply gone, and ``tf.io.read_file`` fails: keep ``in_flight`` above what your pipeline
    buffers (``prefetch``, ``AUTOTUNE``'s parallelism), or use ``read=True``, which reads each sample
    here (the source if the copy went)."""
    from prestage.staging import StagedSampler

    catalog = as_catalog(catalog)  # a saved catalog's path, as dataset() takes it
    in_flight = int(options.pop("in_flight", 16))
    resume = options.pop("resume", None)
    sampler = StagedSampler(catalog, batch_size, stage_dir=stage_dir, num_workers=in_flight,
                            prefetch_factor=1, **options)
    if resume is not None:
        sampler.load_state_dict(resume)
    where = sampler._where
    next_epoch = [sampler._loader._epoch]

    def samples() -> Iterator[tuple]:
        sampler.set_epoch(next_epoch[0])
        next_epoch[0] += 1
        for batch in sampler:
            for index in batch:
                sample = where.find(index)
                label = catalog.label(index)
                if not read:
                    if sample.data is not None:
                        raise IoError(errno.ENOENT, f"sample {index}'s shard {sample.path!r} is compressed "
                                      f"({catalog.file_codec(catalog.locator(index)[0])}) and its "
                                      "decompressed copy is not staged (no room for it within cache_bytes): "
                                      "no path holds its bytes; use staged_paths(..., read=True), or give the "
                                      "stage directory room for it", sample.path)
                    yield sample.path, sample.offset, -1 if sample.length is None else sample.length, label
                    continue
                try:
                    data = bytes(sample.bytes())
                except FileNotFoundError:
                    if sample.tier != "stage":
                        raise
                    data = bytes(where.gone(sample).bytes())
                yield data, label

    signature: tuple
    if read:
        signature = (tf.TensorSpec((), tf.string), tf.TensorSpec((), tf.int64))
    else:
        signature = (tf.TensorSpec((), tf.string), tf.TensorSpec((), tf.int64), tf.TensorSpec((), tf.int64),
                     tf.TensorSpec((), tf.int64))
    ds = tf.data.Dataset.from_generator(samples, output_signature=signature)
    ds = ds.repeat(epochs) if epochs != 1 else ds
    ds.sampler = sampler  # type: ignore[attr-defined]  # stats(), close()
    return ds
