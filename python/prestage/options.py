"""The keyword options of :class:`prestage.Loader`, :class:`prestage.torch.Loader` and
:func:`prestage.tf.dataset`: one definition for all three.

Each takes ``catalog, batch_size, image_size=None`` and then options by keyword, typed here (IDEs and
type checkers read them from ``**options: Unpack[...]``; :class:`prestage.Loader` documents what each
one means):

- :class:`CommonOptions`: every surface, :class:`DecodeOptions` (how samples other than JPEG images
  are decoded) included (``prestage.torch.Loader`` adds ``rank``, ``world_size``, ``layout``,
  ``dtype``, ``mean`` and ``std`` of its own, in PyTorch's terms);
- :class:`ImageOptions`: ``CommonOptions`` plus the plain-value image and rank options
  (``prestage.tf.dataset``);
- :class:`Options`: ``ImageOptions`` plus the GPU decoding options (``prestage.Loader``).

An option not given keeps its default, which is the C++ one (``prestage._core.LoaderOptions()``), or
takes its value from a ``tuned=`` file. Precedence, highest first: an option given in the call (even
one equal to its default), the ``tuned=`` file (``prefetchers``, ``readers``, ``lookahead``,
``depth``), the default.

Which values are valid is decided in one place, ``LoaderOptions::validate()`` in C++, whose
``ConfigError`` reaches Python as :class:`prestage.ConfigError`. This module only converts Python
values to the C++ fields (names to enums, seconds to milliseconds, ``None`` to the C++ sentinels,
paths to strings) and refuses what cannot be converted, with the same ``ConfigError``.
"""

from __future__ import annotations

import json
import numbers
import operator
import os
from typing import Any, Callable, Dict, Literal, Mapping, Optional, Sequence, Tuple, TypedDict, Union

import numpy as np

from prestage import _core
from prestage.errors import ConfigError

__all__ = ["CommonOptions", "DecodeOptions", "ImageOptions", "Options", "keywords", "load_tuned"]


class DecodeOptions(TypedDict, total=False):
    """How samples other than JPEG images are decoded; every surface takes them."""

    decode: Optional[Literal["jpeg", "image", "raw", "npy", "npz", "hdf5", "locate"]]
    array_name: Optional[str]
    max_sample_bytes: int
    raw_dtype: Any
    raw_shape: Union[int, Sequence[int], None]


class CommonOptions(DecodeOptions, total=False):
    """The options every surface takes; see :class:`prestage.Loader` for their meaning."""

    shuffle: bool
    seed: int
    drop_last: bool
    transform: Literal["center-crop", "random-resized-crop"]
    stage_dir: Union[str, os.PathLike[str], None]
    stage_group: Optional[str]
    cache_bytes: Optional[int]
    eviction: Literal["clairvoyant", "lru"]
    prefetchers: Optional[int]
    readers: Optional[int]
    lookahead: Optional[int]
    autotune: bool
    memory_budget: Optional[int]
    depth: int
    max_pixels: int
    io_timeout: Optional[float]
    stage_patience: Optional[float]
    on_error: Literal["raise", "skip"]
    tuned: Union[str, os.PathLike[str], None]
    trace: Union[str, os.PathLike[str], None]
    peers: bool
    peer_timeout: float
    pfs_reads: Literal["fastest", "fewest"]
    comm: Any


class ImageOptions(CommonOptions, total=False):
    """:class:`CommonOptions` plus the rank and the output format of images, as plain values."""

    rank: int
    world_size: int
    layout: Literal["NHWC", "NCHW"]
    dtype: Literal["uint8", "float32"]
    mean: Sequence[float]
    std: Sequence[float]


class Options(ImageOptions, total=False):
    """:class:`ImageOptions` plus where JPEG images are decoded (the CPU or a GPU)."""

    decode_device: Literal["cpu", "cuda"]
    gpu_cpu_share: Optional[float]
    gpu_crop: Literal["auto", "resize", "roi"]


_TUNED = ("prefetchers", "readers", "lookahead", "depth")


def load_tuned(path: Union[str, os.PathLike[str]]) -> Dict[str, int]:
    """The thread counts and depths in a file written by ``prestage tune`` (those it holds)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read tuned options from {os.fspath(path)!r}: {e}") from e
    options = data.get("options", data) if isinstance(data, dict) else None
    if not isinstance(options, dict):
        raise ConfigError(f"{os.fspath(path)!r} holds no options object")
    out = {}
    for key in _TUNED:
        if key in options:
            value = options[key]
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{key} in {os.fspath(path)!r} must be an integer, got {value!r}")
            out[key] = value
    return out


# ------------------------------------------------------------------- Python values -> C++ fields

def _set(options: _core.LoaderOptions, field: str, name: str, value: Any) -> None:
    try:
        setattr(options, field, value)
    except TypeError:  # pybind11: a negative or too large integer, a sequence of the wrong length
        raise ConfigError(f"{name}={value!r} cannot be converted to the loader's option") from None


def _integer(options: _core.LoaderOptions, name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    _set(options, name, name, operator.index(value))


def _threads(options: _core.LoaderOptions, name: str, value: Any) -> None:
    """prefetchers, readers, lookahead: a count of at least 1, or None: sized to the machine."""
    if value is None:
        return  # the C++ default: LoaderOptions::kAuto
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ConfigError(f"{name} must be an integer of at least 1, or None to size it to the "
                          f"machine, got {value!r}")
    _set(options, name, name, operator.index(value))


def _memory_budget(options: _core.LoaderOptions, name: str, value: Any) -> None:
    """memory_budget: bytes (at least 1), or None: a quarter of the memory this process may use."""
    if value is None:
        return  # the C++ default: 0
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ConfigError(f"memory_budget must be a number of bytes of at least 1, or None, "
                          f"got {value!r}")
    _set(options, name, name, operator.index(value))


def _flag(options: _core.LoaderOptions, name: str, value: Any) -> None:
    _set(options, name, name, bool(value))


def _enum(enum: Any, names: Optional[Mapping[str, str]] = None) -> Callable[..., None]:
    """A converter from a name (``names`` maps Python's spelling to the C++ enum's) to ``enum``."""
    spelling = names or {name: name for name in enum.__members__}

    def convert(options: _core.LoaderOptions, name: str, value: Any) -> None:
        if not isinstance(value, str) or value not in spelling:
            raise ConfigError(f"{name} must be one of {', '.join(map(repr, spelling))}, got {value!r}")
        _set(options, name, name, enum.__members__[spelling[value]])

    return convert


def _seconds(field: str, none: int, zero_means_none: bool) -> Callable[..., None]:
    """Seconds (or None: the C++ sentinel ``none``) to the millisecond field ``field``."""

    def convert(options: _core.LoaderOptions, name: str, value: Any) -> None:
        if value is None:
            _set(options, field, name, none)
            return
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or value != value:
            raise ConfigError(f"{name} must be a number of seconds or None, got {value!r}")
        # Milliseconds are unsigned; where 0 means "no limit" to C++, only None may say so.
        if value < 0 or (zero_means_none and value == 0):
            raise ConfigError(f"{name} must be {'positive' if zero_means_none else 'at least 0'} "
                              f"seconds or None, got {value!r}")
        ms = round(float(value) * 1000)
        if zero_means_none:
            ms = max(1, ms)
        _set(options, field, name, min(ms, (none or 2**64) - 1))  # the sentinel is no time

    return convert


def _cache_bytes(options: _core.LoaderOptions, name: str, value: Any) -> None:
    if value is None:
        options.cache_bytes = _core.LoaderOptions.FIT_FREE_SPACE
    else:
        _integer(options, name, value)


def _text(field: str) -> Callable[..., None]:
    """A path or a name (None: the empty string, which C++ reads as "none")."""

    def convert(options: _core.LoaderOptions, name: str, value: Any) -> None:
        text = "" if value is None else os.fspath(value) if isinstance(value, os.PathLike) else value
        if not isinstance(text, str):
            raise ConfigError(f"{name} must be a string, a path or None, got {value!r}")
        _set(options, field, name, text)

    return convert


def _channels(options: _core.LoaderOptions, name: str, value: Any) -> None:
    try:
        channels = [float(v) for v in value]
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be 3 numbers (R, G, B), got {value!r}") from None
    if len(channels) != 3:
        raise ConfigError(f"{name} must be 3 numbers (R, G, B), got {value!r}")
    _set(options, name, name, channels)


def _peer_timeout(options: _core.LoaderOptions, name: str, value: Any) -> None:
    seconds = float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else None
    if seconds is None or not 0 < seconds < float("inf"):
        raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")
    _set(options, "peer_timeout_ms", name, max(1, round(seconds * 1000)))


def _comm(options: _core.LoaderOptions, name: str, value: Any) -> None:
    """An mpi4py intra-communicator, passed by its Fortran handle, so prestage needs no mpi4py headers.

    Any other mpi4py handle has a Fortran handle too (a datatype's, a group's, ``REQUEST_NULL``'s 0,
    which is ``MPI_COMM_WORLD``'s), so the handle alone cannot tell: the object must say it is an
    intra-communicator (``Is_intra()``), and ``COMM_NULL`` and inter-communicators are refused."""
    if value is None:
        options.peer_comm_fortran = -1
        return
    py2f, is_intra = getattr(value, "py2f", None), getattr(value, "Is_intra", None)
    if not callable(py2f) or not callable(is_intra):
        raise ConfigError(f"{name} must be an mpi4py intra-communicator (MPI.COMM_WORLD or one made "
                          f"from it) or None, got {type(value).__name__}")
    try:
        intra = bool(is_intra())
    except Exception as e:  # COMM_NULL: MPI_ERR_COMM
        raise ConfigError(f"{name} must be an mpi4py intra-communicator, got one that is not valid "
                          f"({e})") from e
    if not intra:
        raise ConfigError(f"{name} must be an mpi4py intra-communicator, got an inter-communicator")
    _set(options, "peer_comm_fortran", name, int(py2f()))


def _raw_dtype(options: _core.LoaderOptions, name: str, value: Any) -> None:
    """Anything ``np.dtype()`` takes, as its type string ("<f4"): the C++ core checks which it reads."""
    if value is None:
        _set(options, name, name, "")
        return
    try:
        text = np.dtype(value).str
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{name}={value!r} is not a NumPy dtype: {e}") from None
    _set(options, name, name, text)


def _raw_shape(options: _core.LoaderOptions, name: str, value: Any) -> None:
    """A shape as NumPy's reshape takes it: an integer or a sequence of them (None: none)."""
    if value is None:
        _set(options, name, name, None)
        return
    dims = (value,) if isinstance(value, numbers.Integral) else value
    try:
        if isinstance(dims, (str, bytes)) or any(isinstance(d, bool) for d in dims):
            raise TypeError
        shape = [operator.index(d) for d in dims]
    except TypeError:
        raise ConfigError(f"{name} must be a shape (integers, one of which may be -1) or None, "
                          f"got {value!r}") from None
    _set(options, name, name, shape)


def _share(options: _core.LoaderOptions, name: str, value: Any) -> None:
    """A fraction (the C++ core checks its range), or None: sized at run time."""
    if value is None:
        _set(options, name, name, _core.LoaderOptions.AUTO_SHARE)
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{name} must be a number in [0, 1) or None, got {value!r}")
    _set(options, name, name, float(value))


_decode_mode = _enum(_core.DecodeMode)


def _decode(options: _core.LoaderOptions, name: str, value: Any) -> None:
    if value is not None:  # None: the catalog's own (set before the options are converted)
        _decode_mode(options, name, value)


_CONVERT: Dict[str, Callable[[_core.LoaderOptions, str, Any], None]] = {
    "shuffle": _flag,
    "seed": _integer,
    "drop_last": _flag,
    "transform": _enum(_core.Transform, {"center-crop": "center_crop",
                                         "random-resized-crop": "random_resized_crop"}),
    "stage_dir": _text("stage_dir"),
    "stage_group": _text("stage_group"),
    "cache_bytes": _cache_bytes,
    "eviction": _enum(_core.Eviction),
    "prefetchers": _threads,
    "readers": _threads,
    "lookahead": _threads,
    "autotune": _flag,
    "memory_budget": _memory_budget,
    "depth": _integer,
    "max_pixels": _integer,
    "io_timeout": _seconds("io_timeout_ms", none=0, zero_means_none=True),
    "stage_patience": _seconds("stage_patience_ms", none=_core.LoaderOptions.WAIT_FOR_STAGING,
                               zero_means_none=False),
    "on_error": _enum(_core.OnError),
    "rank": _integer,
    "world_size": _integer,
    "layout": _enum(_core.Layout),
    "dtype": _enum(_core.OutputType),
    "mean": _channels,
    "std": _channels,
    "decode": _decode,
    "array_name": _text("array_name"),
    "max_sample_bytes": _integer,
    "raw_dtype": _raw_dtype,
    "raw_shape": _raw_shape,
    "decode_device": _enum(_core.DecodeDevice),
    "gpu_cpu_share": _share,
    "gpu_crop": _enum(_core.GpuCrop),
    "trace": _text("trace"),
    "peers": _flag,
    "peer_timeout": _peer_timeout,
    "pfs_reads": _enum(_core.PfsReads),
    "comm": _comm,
}


#: The decode modes whose samples come out as stored (arrays, bytes), not as images.
ARRAY_MODES = ("raw", "npy", "npz", "hdf5")


def take_decode_options(catalog: Any, options: DecodeOptions) -> Tuple[str, Dict[str, Any]]:
    """Takes an adaptor's :class:`DecodeOptions` out of its ``options``: the decode mode they come
    to (``decode``, else the catalog's, :func:`default_decode`) and what the adaptor passes on to
    :class:`prestage.Loader` (the mode, and those of the others given; ``None``: the Loader's
    default)."""
    decode = options.pop("decode", None)
    mode = decode if decode is not None else default_decode(catalog)
    out: Dict[str, Any] = {"decode": mode}
    array_name = options.pop("array_name", None)
    if array_name is not None:
        out["array_name"] = array_name
    max_sample_bytes = options.pop("max_sample_bytes", None)
    if max_sample_bytes is not None:
        out["max_sample_bytes"] = max_sample_bytes
    raw_dtype, raw_shape = options.pop("raw_dtype", None), options.pop("raw_shape", None)
    if raw_dtype is not None or raw_shape is not None:
        out.update(raw_dtype=raw_dtype, raw_shape=raw_shape)
    return mode, out


def default_decode(catalog: Any) -> str:
    """The decode mode a catalog's samples take when none is given: ``"hdf5"`` for
    :meth:`Catalog.from_hdf5`, ``"npy"`` for :meth:`Catalog.from_arrays`, else ``"jpeg"``."""
    return {"hdf5": "hdf5", "arrays": "npy"}.get(catalog.kind, "jpeg")


def to_core(catalog: _core.Catalog, batch_size: int, image_size: Optional[Tuple[int, int]],
            given: Mapping[str, Any], surface: str = "Loader") -> _core.LoaderOptions:
    """The C++ options for the arguments of a call of ``surface``: those in ``given`` converted, the
    ``tuned=`` file's for the tuned ones not in ``given``, the C++ defaults for the rest. Not
    validated here: the C++ Loader's constructor does that.

    Raises:
        TypeError: an option that ``surface`` does not take (as Python does for a keyword argument).
        prestage.ConfigError: a value that cannot be converted; the tuned file cannot be read.
    """
    for name in given:
        if name != "tuned" and name not in _CONVERT:
            raise TypeError(f"{surface}() got an unexpected keyword argument {name!r}")
    if not isinstance(catalog, _core.Catalog):
        raise ConfigError(f"catalog must be a prestage.Catalog, got {type(catalog).__name__}")
    values = {k: v for k, v in given.items() if k != "tuned"}
    tuned = given.get("tuned")
    if tuned is not None:
        for name, value in load_tuned(tuned).items():
            values.setdefault(name, value)
    options = _core.LoaderOptions()
    _integer(options, "batch_size", batch_size)
    if image_size is not None:
        # C++ reads (0, 0) as "no image_size": only None may say that.
        if isinstance(image_size, (str, bytes)) or len(image_size) != 2 \
                or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v > 0
                           for v in image_size):
            raise ConfigError(f"image_size must be (height, width) of positive integers or None, "
                              f"got {image_size!r}")
        _set(options, "image_size", "image_size", (operator.index(image_size[0]),
                                                   operator.index(image_size[1])))
    options.decode = getattr(_core.DecodeMode, default_decode(catalog))
    for name, value in values.items():
        _CONVERT[name](options, name, value)
    return options


# ------------------------------------------------------------------- C++ fields -> Python values

def _name(value: Any) -> str:
    return str(value.name)


def _ms_to_seconds(ms: int, none: int) -> Optional[float]:
    return None if ms == none else ms / 1000


def _or_none(value: Any, none: Any) -> Any:
    return None if value == none else value


def keywords(options: _core.LoaderOptions) -> Dict[str, Any]:
    """``options`` as the keywords of :class:`prestage.Loader` (``stage_patience`` in seconds, not
    ``stage_patience_ms``; enums by their names; the C++ sentinels as ``None``): ``batch_size``,
    ``image_size``, then every option :data:`_CONVERT` takes except ``comm`` (``peer_comm`` says
    whether one was given). ``prestage.Loader(catalog, **keywords(o))`` makes the same options."""
    o = options
    out: Dict[str, Any] = {"batch_size": o.batch_size, "image_size": o.image_size}
    out.update(
        shuffle=o.shuffle, seed=o.seed, drop_last=o.drop_last,
        transform=_name(o.transform).replace("_", "-"),
        stage_dir=o.stage_dir or None, stage_group=o.stage_group or None,
        cache_bytes=_or_none(o.cache_bytes, _core.LoaderOptions.FIT_FREE_SPACE),
        eviction=_name(o.eviction),
        prefetchers=_or_none(o.prefetchers, 0), readers=_or_none(o.readers, 0),
        lookahead=_or_none(o.lookahead, 0), autotune=o.autotune,
        memory_budget=_or_none(o.memory_budget, 0), depth=o.depth, max_pixels=o.max_pixels,
        io_timeout=_ms_to_seconds(o.io_timeout_ms, 0),
        stage_patience=_ms_to_seconds(o.stage_patience_ms, _core.LoaderOptions.WAIT_FOR_STAGING),
        on_error=_name(o.on_error), rank=o.rank, world_size=o.world_size,
        layout=_name(o.layout), dtype=_name(o.dtype),
        mean=[float(v) for v in o.mean], std=[float(v) for v in o.std],
        decode=_name(o.decode), array_name=o.array_name or None,
        max_sample_bytes=o.max_sample_bytes, raw_dtype=o.raw_dtype or None,
        raw_shape=None if o.raw_shape is None else tuple(o.raw_shape),
        decode_device=_name(o.decode_device),
        gpu_cpu_share=_or_none(o.gpu_cpu_share, _core.LoaderOptions.AUTO_SHARE),
        gpu_crop=_name(o.gpu_crop), trace=o.trace or None, peers=o.peers,
        peer_timeout=o.peer_timeout_ms / 1000, pfs_reads=_name(o.pfs_reads),
        peer_comm=o.peer_comm_fortran != -1,
    )
    return out


def format_options(options: _core.LoaderOptions) -> str:
    """``LoaderOptions(batch_size=64, image_size=(224, 224), ...)``: :func:`keywords`, as a repr."""
    return "LoaderOptions(" + ", ".join(f"{k}={v!r}" for k, v in keywords(options).items()) + ")"
