# Stubs of prestage's C++ extension module (python/src/*.cpp): what type checkers and IDEs read.
# tests/python/test_stubs.py checks that they name every public name of the module and its classes.
from os import PathLike
from types import ModuleType
from typing import Any, ClassVar, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

__version__: str
TIERS: Tuple[str, ...]
TRACE_KINDS: Tuple[str, ...]
TRACE_TUNE_KIND: int
KNOBS: Tuple[str, ...]

_Path = Union[str, PathLike[str]]

# ------------------------------------------------------------------------------------------ catalog

class Catalog:
    """The immutable, indexed list of samples 0..N-1 of a data set."""

    @staticmethod
    def from_folder(root: _Path, extensions: Sequence[str] = ..., *,
                    symlinks: str = "follow") -> Catalog: ...
    @staticmethod
    def from_list(path: _Path, root: _Path, *, symlinks: str = "follow") -> Catalog: ...
    @staticmethod
    def from_paths(root: _Path, paths: Sequence[str], labels: Sequence[int] = ...,
                   classes: Sequence[str] = ..., *, symlinks: str = "follow") -> Catalog: ...
    @staticmethod
    def from_shards(dir: _Path) -> Catalog: ...
    @staticmethod
    def from_hdf5(paths: Union[_Path, Sequence[_Path]], dataset: str,
                  labels: Optional[str] = None, *, axis: int = 0) -> Catalog: ...
    @staticmethod
    def from_arrays(paths: Union[_Path, Sequence[_Path]], *, axis: int = 0,
                    member: Optional[str] = None, labels: Optional[str] = None) -> Catalog: ...
    @staticmethod
    def from_tfrecord(paths: Union[_Path, Sequence[_Path]], features: Dict[str, str], *,
                      on_error: str = "raise") -> Catalog: ...
    @staticmethod
    def from_webdataset(shards: Union[_Path, Sequence[_Path]],
                        fields: Dict[str, Optional[str]] = ..., *, missing: str = "error",
                        on_error: str = "raise",
                        index: Union[_Path, Sequence[_Path], None] = None) -> Catalog: ...
    @staticmethod
    def from_mds(dir: _Path, fields: Dict[str, Optional[str]] = ..., *,
                 on_error: str = "raise") -> Catalog: ...
    @staticmethod
    def from_hf(source: Any, fields: Optional[Dict[str, Optional[str]]] = None, *,
                on_error: str = "raise") -> Catalog: ...
    @staticmethod
    def load(path: _Path) -> Catalog: ...
    def save(self, path: _Path) -> None: ...
    def __len__(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def field(self) -> str: ...
    @property
    def axis(self) -> int: ...
    @property
    def dtype(self) -> Optional[str]: ...
    @property
    def root(self) -> Any: ...  # pathlib.Path
    @property
    def symlinks(self) -> str: ...
    @property
    def damage(self) -> List[Dict[str, Any]]: ...
    @property
    def classes(self) -> List[str]: ...
    @property
    def fingerprint(self) -> int: ...
    def path(self, i: int) -> str: ...
    def source_path(self, i: int) -> Any: ...  # pathlib.Path
    def label(self, i: int) -> int: ...
    def locator(self, i: int) -> Tuple[int, int, Optional[int]]: ...
    @property
    def num_files(self) -> int: ...
    def file_sizes(self) -> npt.NDArray[np.int64]: ...
    def file_codec(self, f: int) -> str: ...
    @property
    def compressed(self) -> bool: ...

# ------------------------------------------------------------------------------------------ staging

def _catalog_from_located(root: _Path, files: Sequence[str], file_index: npt.ArrayLike,
                          offsets: npt.ArrayLike, lengths: npt.ArrayLike, labels: npt.ArrayLike,
                          classes: Sequence[str],
                          damage: Sequence[Tuple[int, int, bool, str]]) -> Catalog: ...
def stage_area(stage_dir: _Path, catalog: Catalog) -> str: ...
def make_stage_area(stage_dir: _Path, catalog: Catalog, group: str = ...) -> str: ...
def staged_copy_path(area: _Path, file: int) -> str: ...
def decompressed_sample(catalog: Catalog, index: int) -> bytes: ...

# --------------------------------------------------------------------------------------------- plan

def crc32c(data: bytes) -> int: ...
def zstd_compress(data: bytes, level: int = 3) -> bytes: ...
def epoch_order(num_samples: int, seed: int, epoch: int, shuffle: bool = True) -> npt.NDArray[np.uint64]: ...
def epoch_batches(num_samples: int, batch_size: int, seed: int, epoch: int, shuffle: bool = True,
                  drop_last: bool = False, rank: int = 0, world_size: int = 1,
                  consumed: Sequence[Tuple[int, int]] = ...) -> List[List[int]]: ...
def consumed_positions(num_samples: int, batch_size: int, world_size: int, drop_last: bool,
                       delivered: Sequence[int],
                       consumed: Sequence[Tuple[int, int]] = ...) -> List[Tuple[int, int]]: ...
def batches_in_epoch(num_samples: int, batch_size: int, world_size: int, drop_last: bool,
                     consumed: Sequence[Tuple[int, int]] = ...) -> int: ...

# ------------------------------------------------------------------------------------------ options

class _Enum:
    """A pybind11 enum: members are class attributes; ``__members__`` maps names to them."""

    __members__: ClassVar[Dict[str, Any]]
    def __init__(self, value: int) -> None: ...
    def __eq__(self, other: object) -> bool: ...
    def __ne__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...
    def __index__(self) -> int: ...
    def __int__(self) -> int: ...
    def __getstate__(self) -> int: ...
    def __setstate__(self, state: int) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

class DecodeMode(_Enum):
    jpeg: ClassVar[DecodeMode]
    image: ClassVar[DecodeMode]
    raw: ClassVar[DecodeMode]
    npy: ClassVar[DecodeMode]
    npz: ClassVar[DecodeMode]
    hdf5: ClassVar[DecodeMode]
    locate: ClassVar[DecodeMode]

class Transform(_Enum):
    center_crop: ClassVar[Transform]
    random_resized_crop: ClassVar[Transform]

class Layout(_Enum):
    NHWC: ClassVar[Layout]
    NCHW: ClassVar[Layout]

class OutputType(_Enum):
    uint8: ClassVar[OutputType]
    float32: ClassVar[OutputType]

class Eviction(_Enum):
    clairvoyant: ClassVar[Eviction]
    lru: ClassVar[Eviction]

class DecodeDevice(_Enum):
    cpu: ClassVar[DecodeDevice]
    cuda: ClassVar[DecodeDevice]

class PfsReads(_Enum):
    fastest: ClassVar[PfsReads]
    fewest: ClassVar[PfsReads]

class GpuCrop(_Enum):
    auto: ClassVar[GpuCrop]
    resize: ClassVar[GpuCrop]
    roi: ClassVar[GpuCrop]

class OnError(_Enum):
    # `raise` is a keyword: the member is reached as OnError.__members__["raise"].
    skip: ClassVar[OnError]

class LoaderOptions:
    """Every option of a Loader, as C++ holds it; validate() is the one check."""

    FIT_FREE_SPACE: ClassVar[int]
    WAIT_FOR_STAGING: ClassVar[int]
    AUTO_SHARE: ClassVar[float]
    batch_size: int
    image_size: Optional[Tuple[int, int]]
    decode: DecodeMode
    shuffle: bool
    seed: int
    drop_last: bool
    rank: int
    world_size: int
    resume: Optional[Tuple[int, List[Tuple[int, int]]]]
    stage_dir: str
    stage_group: str
    cache_bytes: int
    eviction: Eviction
    prefetchers: int
    readers: int
    lookahead: int
    autotune: bool
    memory_budget: int
    depth: int
    max_pixels: int
    io_timeout_ms: int
    stage_patience_ms: int
    peers: bool
    peer_timeout_ms: int
    pfs_reads: PfsReads
    peer_comm_fortran: int
    on_error: OnError
    transform: Transform
    layout: Layout
    dtype: OutputType
    mean: List[float]
    std: List[float]
    array_name: str
    max_sample_bytes: int
    raw_dtype: str
    raw_shape: Optional[List[int]]
    trace: str
    decode_device: DecodeDevice
    gpu_cpu_share: float
    gpu_crop: GpuCrop
    def __init__(self, other: LoaderOptions = ...) -> None: ...
    def to_dict(self) -> Dict[str, Any]: ...
    def validate(self) -> None: ...

# ------------------------------------------------------------------------------------ batch, loader

class Batch:
    """A decoded batch, lent by the loader; its arrays are zero-copy views of a ring buffer."""

    def __len__(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def index(self) -> int: ...
    @property
    def pinned(self) -> bool: ...
    @property
    def pinning(self) -> str: ...
    @property
    def images(self) -> Union[npt.NDArray[Any], List[npt.NDArray[Any]]]: ...
    @property
    def arrays(self) -> Union[npt.NDArray[Any], List[npt.NDArray[Any]]]: ...
    @property
    def on_device(self) -> bool: ...
    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]: ...
    @property
    def device_ready(self) -> Optional[int]: ...
    @property
    def device_stream(self) -> Optional[int]: ...
    @property
    def ragged(self) -> bool: ...
    @property
    def dtype(self) -> np.dtype[Any]: ...
    @property
    def shapes(self) -> List[Tuple[int, ...]]: ...
    @property
    def data(self) -> npt.NDArray[np.uint8]: ...
    @property
    def offsets(self) -> npt.NDArray[np.uint64]: ...
    @property
    def labels(self) -> npt.NDArray[np.int64]: ...
    @property
    def indices(self) -> npt.NDArray[np.int64]: ...

class Loader:
    """The C++ loader; use prestage.Loader. stats(), position and close() may be called from any
    thread, also while another waits in next(), which close() makes raise prestage.ConfigError."""

    def __init__(self, catalog: Catalog, options: LoaderOptions) -> None: ...
    @property
    def batches_per_epoch(self) -> int: ...
    def batches_in_epoch(self, epoch: int) -> int: ...
    @property
    def options(self) -> LoaderOptions: ...
    @property
    def image_size(self) -> Optional[Tuple[int, int]]: ...
    @property
    def position(self) -> Tuple[int, int]: ...
    def start_epoch(self, epoch: int, first_batch: int = 0) -> None: ...
    def next(self) -> Optional[Batch]: ...
    def stats(self) -> Dict[str, Any]: ...
    def take_tuning_log(self) -> List[str]: ...
    def staged_path(self, sample: int) -> str: ...
    def close(self) -> None: ...

# ------------------------------------------------------------------------------------ transforms

class _Transforms(ModuleType):
    """The submodule ``prestage._core.transforms``: stage 3's random transforms."""

    @staticmethod
    def random_resized_crop_params(seed: int, epoch: int, index: int, height: int,
                                   width: int) -> Tuple[int, int, int, int, bool]: ...
    @staticmethod
    def crop_draws(seed: int, epoch: int, index: int, count: int) -> List[float]: ...

transforms: _Transforms
