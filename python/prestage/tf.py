"""prestage.tf: the loader as a ``tf.data.Dataset``, for Keras ``model.fit`` and custom TensorFlow loops.

>>> import prestage, prestage.tf
>>> catalog = prestage.Catalog.from_folder("/pfs/imagenet/train")
>>> train = prestage.tf.dataset(catalog, batch_size=256, image_size=(224, 224),
...                             stage_dir="/local/ssd/stage")
>>> model.fit(train, epochs=90, shuffle=False)   # each pass is the loader's next epoch (a new shuffle)

``import prestage`` does not import TensorFlow; ``import prestage.tf`` does.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Iterator, Optional, Tuple

import numpy as np
import tensorflow as tf

from prestage import _core
from prestage.loader import Loader
from prestage.options import ImageOptions

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["dataset", "staged_paths"]

# TensorFlow wraps a NumPy array without copying when its data are aligned to this (Eigen's largest
# alignment); an unaligned array is copied again.
_TF_ALIGNMENT = 64


def dataset(
    catalog: _core.Catalog,
    batch_size: int,
    image_size: Optional[Tuple[int, int]] = None,
    **options: Unpack[ImageOptions],
) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` of ``(images, labels)`` batches: the batches of :class:`prestage.Loader`.

    Elements are ``images`` ``(N, H, W, 3)`` (``layout="NHWC"``, Keras's ``channels_last``; or ``"NCHW"``),
    uint8 or normalised float32 (``dtype``), and ``labels`` int64 ``(N,)``: the batches the NumPy loader
    gives with the same arguments, in the same order. The ``output_signature`` is complete:
    ``H`` and ``W`` are the loader's :attr:`prestage.Loader.image_size` (``image_size``, or when it is
``None`` the catalog's first image's, read through its codec: TFRecord records and zstd frames too);
    the batch dimension is ``batch_size`` when every batch is full (``drop_last=True``, or the rank's share
    of the set is a multiple of ``batch_size``), else ``None``. The cardinality is the number of batches
    per epoch, so Keras knows the steps per epoch. Each complete pass over the dataset is the loader's next
    epoch (a new shuffle); a pass stopped early starts its epoch again.

    Copies: one per batch, from the loader's page-locked buffer into memory that TensorFlow then owns
    (aligned so that TensorFlow takes it without a second copy); the buffer goes back to the loader's
    ring at once, so ``.prefetch()`` and Keras may hold as many elements as they like.

    Keras's own ``shuffle`` does not apply (the order is prestage's global shuffle): pass ``shuffle=False``
    to ``model.fit`` to silence its warning.

    Args: ``catalog``, ``batch_size``, ``image_size`` and the options, by keyword, as for
    :class:`prestage.Loader` (:class:`prestage.options.ImageOptions`; ``dtype`` and ``layout`` as
    strings); ``rank``/``world_size`` give this worker its slice of every global batch (all workers
    get the same number of batches). ``on_error="skip"`` replaces a sample that cannot be read or
    decoded by the next good one, so batches keep their shape (``on_error="raise"``, the default,
    raises at its batch).

    Raises:
        prestage.ConfigError: an invalid option.

    >>> ds = prestage.tf.dataset(catalog, batch_size=64, image_size=(96, 96), seed=1)
    >>> ds.element_spec
    (TensorSpec(shape=(None, 96, 96, 3), dtype=tf.uint8, name='images'),
     TensorSpec(shape=(None,), dtype=tf.int64, name='labels'))
    """
    for name in options:
        if name not in ImageOptions.__optional_keys__:
            raise TypeError(f"dataset() got an unexpected keyword argument {name!r}")
    loader = Loader(catalog, batch_size, image_size, decode="jpeg", **options)
    o = loader.options
    height, width = loader.image_size or (None, None)
    per_rank = math.ceil(len(catalog) / o.world_size)
    full = o.drop_last or per_rank % batch_size == 0
    n = batch_size if full else None
    shape = (n, 3, height, width) if o.layout == _core.Layout.NCHW else (n, height, width, 3)
    dtype = tf.as_dtype(o.dtype.name)
    signature = (tf.TensorSpec(shape, dtype, name="images"),
                 tf.TensorSpec((n,), tf.int64, name="labels"))

    def batches() -> Iterator[Tuple[np.ndarray, np.ndarray]]:
        for batch in loader:
            images, labels = _aligned_copy(batch.images), batch.labels.copy()
            del batch  # the buffer goes back to the ring
            yield images, labels

    data = tf.data.Dataset.from_generator(batches, output_signature=signature)
    return data.apply(tf.data.experimental.assert_cardinality(len(loader)))


def _aligned_copy(array: np.ndarray) -> np.ndarray:
    """A copy of ``array`` whose data start on a ``_TF_ALIGNMENT`` boundary."""
    raw = np.empty(array.nbytes + _TF_ALIGNMENT, dtype=np.uint8)
    start = -raw.ctypes.data % _TF_ALIGNMENT
    out = raw[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
    np.copyto(out, array)
    return out


def staged_paths(catalog: _core.Catalog, batch_size: int, *, stage_dir: str, epochs: Optional[int] = None,
                 read: bool = False, **options: object) -> tf.data.Dataset:
    """Staging for your own parsing: a ``tf.data.Dataset`` of this rank's samples in plan order, each
    ``(path, offset, length, label)`` where ``path`` is the staged copy on the local SSD, or the source
    when it was not staged in time (``length`` -1: the whole file), or ``(bytes, label)`` with
    ``read=True``. Stages 1 and 2 run on prestage's threads (:class:`prestage.staging.StagedSampler`,
    whose options it takes) while your ``map`` parses, with ``num_parallel_calls=tf.data.AUTOTUNE`` and
    the order kept:

    >>> ds = prestage.tf.staged_paths(catalog, 256, stage_dir="/local/ssd")
    >>> ds = ds.map(lambda path, offset, length, label: (parse(tf.io.read_file(path)), label),
    ...             num_parallel_calls=tf.data.AUTOTUNE).batch(256)

    Each pass is the next epoch (a new order), ``epochs`` passes in all (``None``: without end). A copy
    stays staged for ``in_flight`` batches (default 16) after its batch was handed out; one evicted
    sooner is simply gone, and ``tf.io.read_file`` fails: keep ``in_flight`` above what your pipeline
    buffers (``prefetch``, ``AUTOTUNE``'s parallelism), or use ``read=True``, which reads each sample
    here (the source if the copy went)."""
    from prestage.staging import StagedSampler, StagedSample

    in_flight = int(options.pop("in_flight", 16))  # type: ignore[call-overload]
    sampler = StagedSampler(catalog, batch_size, stage_dir=stage_dir, num_workers=in_flight,
                            prefetch_factor=1, **options)
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
                    yield sample.path, sample.offset, -1 if sample.length is None else sample.length, label
                    continue
                try:
                    data = bytes(sample.bytes())
                except FileNotFoundError:
                    if sample.tier != "stage":
                        raise
                    where.gone()
                    data = bytes(StagedSample(str(catalog.source_path(index)), sample.offset, sample.length,
                                              "source", index).bytes())
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
