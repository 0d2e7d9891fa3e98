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
import os
from typing import Iterator, Optional, Tuple, Union

import numpy as np
import tensorflow as tf

from prestage import _core
from prestage.errors import ConfigError
from prestage.loader import Loader

__all__ = ["dataset"]

# TensorFlow wraps a NumPy array without copying when its data are aligned to this (Eigen's largest
# alignment); an unaligned array is copied again.
_TF_ALIGNMENT = 64


def dataset(
    catalog: _core.Catalog,
    batch_size: int,
    image_size: Optional[Tuple[int, int]] = None,
    *,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = False,
    transform: str = "center-crop",
    layout: str = "NHWC",
    dtype: str = "uint8",
    mean: Tuple[float, float, float] = (0.0, 0.0, 0.0),
    std: Tuple[float, float, float] = (1.0, 1.0, 1.0),
    rank: int = 0,
    world_size: int = 1,
    stage_dir: Union[str, os.PathLike, None] = None,
    cache_bytes: Optional[int] = None,
    eviction: str = "clairvoyant",
    prefetchers: int = 4,
    readers: int = 2,
    lookahead: int = 4,
    depth: int = 4,
    max_pixels: int = 89_478_485,
    on_error: str = "raise",
    io_timeout: Optional[float] = None,
    tuned: Union[str, os.PathLike, None] = None,
) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` of ``(images, labels)`` batches: the batches of :class:`prestage.Loader`.

    Elements are ``images`` ``(N, H, W, 3)`` (``layout="NHWC"``, Keras's ``channels_last``; or ``"NCHW"``),
    uint8 or normalised float32 (``dtype``), and ``labels`` int64 ``(N,)``: the batches the NumPy loader
    gives with the same arguments, in the same order. The ``output_signature`` is complete:
    ``H`` and ``W`` come from ``image_size`` (or, when it is ``None``, from the first image's JPEG header);
    the batch dimension is ``batch_size`` when every batch is full (``drop_last=True``, or the rank's share
    of the set is a multiple of ``batch_size``), else ``None``. The cardinality is the number of batches
    per epoch, so Keras knows the steps per epoch. Each complete pass over the dataset is the loader's next
    epoch (a new shuffle); a pass stopped early starts its epoch again.

    Copies: one per batch, from the loader's page-locked buffer into memory that TensorFlow then owns
    (aligned so that TensorFlow takes it without a second copy); the buffer goes back to the loader's
    ring at once, so ``.prefetch()`` and Keras may hold as many elements as they like.

    Keras's own ``shuffle`` does not apply (the order is prestage's global shuffle): pass ``shuffle=False``
    to ``model.fit`` to silence its warning.

    Args: as :class:`prestage.Loader` (``dtype`` and ``layout`` as strings); ``rank``/``world_size`` give
    this worker its slice of every global batch (all workers get the same number of batches).
    ``on_error="skip"`` replaces a sample that cannot be read or decoded by the next good one, so
    batches keep their shape (``on_error="raise"``, the default, raises at its batch).

    Raises:
        prestage.ConfigError: an invalid option.

    >>> ds = prestage.tf.dataset(catalog, batch_size=64, image_size=(96, 96), seed=1)
    >>> ds.element_spec
    (TensorSpec(shape=(None, 96, 96, 3), dtype=tf.uint8, name='images'),
     TensorSpec(shape=(None,), dtype=tf.int64, name='labels'))
    """
    loader = Loader(catalog, batch_size, image_size=image_size, shuffle=shuffle, seed=seed,
                    stage_dir=stage_dir, cache_bytes=cache_bytes, eviction=eviction,
                    prefetchers=prefetchers, readers=readers, lookahead=lookahead, depth=depth, rank=rank,
                    world_size=world_size, drop_last=drop_last, decode="jpeg", max_pixels=max_pixels,
                    transform=transform, layout=layout, dtype=dtype, mean=mean, std=std,
                    on_error=on_error, io_timeout=io_timeout, tuned=tuned)
    if image_size is not None:
        height, width = image_size
    else:
        height, width = _jpeg_size(os.fspath(catalog.source_path(0))) if len(catalog) else (None, None)
    per_rank = math.ceil(len(catalog) / world_size)
    full = drop_last or per_rank % batch_size == 0
    n = batch_size if full else None
    shape = (n, 3, height, width) if layout == "NCHW" else (n, height, width, 3)
    signature = (tf.TensorSpec(shape, tf.as_dtype(dtype), name="images"),
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


def _jpeg_size(path: str) -> Tuple[Optional[int], Optional[int]]:
    """(height, width) from a JPEG's frame header, or (None, None) if the file is not a readable JPEG
    (the loader then reports the real error at that sample's batch)."""
    try:
        with open(path, "rb") as f:
            if f.read(2) != b"\xff\xd8":
                return None, None
            while True:
                marker = f.read(2)
                if len(marker) != 2 or marker[0] != 0xFF:
                    return None, None
                while marker[1] == 0xFF:  # fill bytes
                    marker = marker[1:] + f.read(1)
                kind = marker[1]
                if kind in (0x01,) or 0xD0 <= kind <= 0xD7:
                    continue  # markers without a length
                length = int.from_bytes(f.read(2), "big")
                # SOF0..SOF15 carry the frame size; C4 (DHT), C8 (JPG) and CC (DAC) do not.
                if 0xC0 <= kind <= 0xCF and kind not in (0xC4, 0xC8, 0xCC):
                    header = f.read(5)
                    if len(header) != 5:
                        return None, None
                    return int.from_bytes(header[1:3], "big"), int.from_bytes(header[3:5], "big")
                if kind == 0xDA or length < 2:
                    return None, None  # image data before any frame header
                f.seek(length - 2, os.SEEK_CUR)
    except OSError:
        return None, None
