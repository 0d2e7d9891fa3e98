"""Shared fixtures: small JPEG data sets written with Pillow (the oracle decodes them too)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Callable, Dict, List

import numpy as np
import pytest
from PIL import Image


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    # torch, tf and gpu tests run where their framework (or device) is there, and are skipped elsewhere.
    have = {
        "torch": importlib.util.find_spec("torch") is not None,
        "tf": importlib.util.find_spec("tensorflow") is not None,
        "gpu": os.path.exists("/dev/nvidia0"),
    }
    for item in items:
        for marker, present in have.items():
            if marker in item.keywords and not present:
                item.add_marker(pytest.mark.skip(reason=f"needs {marker}"))


def photo_like(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A smooth random image (blurred noise plus gradients): compresses like a photo, not like noise."""
    small = rng.random((max(2, height // 8), max(2, width // 8), 3))
    img = np.asarray(
        Image.fromarray((small * 255).astype(np.uint8)).resize((width, height), Image.BICUBIC),
        dtype=np.float64,
    )
    yy, xx = np.mgrid[0:height, 0:width]
    img[..., 0] += 40 * np.sin(xx / 7.0)
    img[..., 1] += 40 * np.cos(yy / 5.0)
    return np.clip(img, 0, 255).astype(np.uint8)


MakeFolder = Callable[..., Path]


@pytest.fixture
def make_folder(tmp_path: Path) -> MakeFolder:
    """make_folder(classes, per_class, size=(h, w) or None for mixed sizes) -> root of an ImageFolder."""
    counter = [0]

    def make(classes: int = 3, per_class: int = 5, size=(32, 48), name: str = "data") -> Path:
        root = tmp_path / f"{name}{counter[0]}"
        counter[0] += 1
        rng = np.random.default_rng(counter[0])
        for c in range(classes):
            (root / f"class_{c}").mkdir(parents=True)
            for i in range(per_class):
                h, w = size if size else (int(rng.integers(40, 120)), int(rng.integers(40, 120)))
                Image.fromarray(photo_like(rng, h, w)).save(root / f"class_{c}" / f"img_{i:03d}.jpg",
                                                            quality=90)
        return root

    return make


@pytest.fixture
def sigint_raises():
    """Ctrl+C raises KeyboardInterrupt in this process, as in a terminal, even where the tests run with
    SIGINT ignored (a shell starts background jobs so, and children inherit it)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture
def folder(make_folder: MakeFolder) -> Path:
    """3 classes x 7 images of 32x48: 21 images, not a multiple of common batch sizes."""
    return make_folder(3, 7)


@pytest.fixture
def stalled_catalog(tmp_path: Path):
    """A catalog of one file whose reads never return: a FIFO no one writes, as a hung file server.
    The abandoned reads are released at the end."""
    import prestage

    fifo = tmp_path / "stalled" / "stalled.jpg"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    yield prestage.Catalog.from_paths(fifo.parent, ["stalled.jpg"])
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:  # no reader left waiting
        pass


@pytest.fixture
def native_threads() -> Callable[[], int]:
    """Counts the process's threads, native ones included (threading.active_count() sees only Python's)."""
    return lambda: len(os.listdir("/proc/self/task"))


@pytest.fixture(scope="session")
def fake_cudart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A test double of the CUDA runtime library (tests/cpp/fake_cudart.c, compiled here with the system C
    compiler): load it with PRESTAGE_CUDART=<path>; FAKE_CUDART_LOG, FAKE_CUDART_DEVICES and
    FAKE_CUDART_REGISTER_ERROR control it (see the source)."""
    import shutil
    import subprocess

    source = Path(__file__).resolve().parents[1] / "cpp" / "fake_cudart.c"
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.fail("no C compiler (cc) to build the CUDA runtime double")
    out = tmp_path_factory.mktemp("fake_cudart") / "libfake_cudart.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-pthread", "-o", str(out), str(source)],
                   check=True)
    return out


@pytest.fixture(scope="session")
def fake_gpu_libs(tmp_path_factory: pytest.TempPathFactory, fake_cudart: Path) -> Dict[str, Path]:
    """Test doubles of the CUDA runtime, nvJPEG (decoding with libjpeg-turbo) and NPP
    (tests/cpp/fake_*.c, compiled here): load them with PRESTAGE_CUDART, PRESTAGE_NVJPEG and
    PRESTAGE_NPP; their "device" memory is host memory. {"cudart", "nvjpeg", "npp"} -> path."""
    import shutil
    import subprocess

    sources = Path(__file__).resolve().parents[1] / "cpp"
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.fail("no C compiler (cc) to build the nvJPEG and NPP doubles")
    out_dir = tmp_path_factory.mktemp("fake_gpu")
    libs = {"cudart": fake_cudart}
    # The nvJPEG double's per-image time moves the runtime double's stream clock (that copy).
    nvjpeg_extra = ["-lturbojpeg", "-ldl", f'-DFAKE_CUDART_PATH="{fake_cudart}"']
    for name, extra in (("nvjpeg", nvjpeg_extra), ("npp", [])):
        out = out_dir / f"libfake_{name}.so"
        subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-pthread", "-o", str(out),
                        str(sources / f"fake_{name}.c"), *extra], check=True)
        libs[name] = out
    return libs


# TFRecord files written without TensorFlow: the framing and tf.train.Example's wire format, from their
# specifications (the tf-marked tests check these bytes against TensorFlow's own writer).

def _crc32c_table() -> List[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C = _crc32c_table()


def masked_crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc = (crc >> 8) ^ _CRC32C[(crc ^ b) & 0xFF]
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def serialize_example(features: dict) -> bytes:
    """tf.train.Example bytes: values are bytes (bytes_list), int or list of ints (int64_list, packed)."""
    entries = b""
    for key, value in features.items():
        if isinstance(value, bytes):
            feature = _field(1, _field(1, value))
        else:
            ints = value if isinstance(value, list) else [value]
            feature = _field(3, _field(1, b"".join(_varint(v) for v in ints)))
        entries += _field(1, _field(1, key.encode()) + _field(2, feature))
    return _field(1, entries)


def frame_record(data: bytes) -> bytes:
    length = len(data).to_bytes(8, "little")
    return (length + masked_crc32c(length).to_bytes(4, "little") + data
            + masked_crc32c(data).to_bytes(4, "little"))


@pytest.fixture
def write_tfrecord() -> Callable[..., Path]:
    """write_tfrecord(path, [features dict, ...]) -> path, with our own framing and Example encoder."""

    def write(path: Path, examples: list) -> Path:
        with open(path, "wb") as f:
            for features in examples:
                f.write(frame_record(serialize_example(features)))
        return path

    return write


@pytest.fixture
def write_tf_examples() -> Callable[..., str]:
    """write_tf_examples(path, [features dict, ...]) -> path, written by TensorFlow's own
    tf.io.TFRecordWriter and tf.train.Example (tf-marked tests only). A value that is bytes is a
    bytes_list, a float array or list of floats a float_list, an int or integer array an int64_list."""
    import tensorflow as tf

    def feature(value):
        if isinstance(value, bytes):
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
        values = np.atleast_1d(np.asarray(value))
        if values.dtype.kind == "f":
            return tf.train.Feature(float_list=tf.train.FloatList(value=values.tolist()))
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values.tolist()))

    def write(path, examples: list) -> str:
        with tf.io.TFRecordWriter(str(path)) as writer:
            for features in examples:
                example = tf.train.Example(features=tf.train.Features(
                    feature={name: feature(value) for name, value in features.items()}))
                writer.write(example.SerializeToString())
        return str(path)

    return write


def jpeg_bytes(array: np.ndarray, **save_args) -> bytes:
    """A JPEG of `array` encoded by Pillow."""
    import io

    out = io.BytesIO()
    Image.fromarray(array).save(out, format="JPEG", **save_args)
    return out.getvalue()


@pytest.fixture
def encode_jpeg() -> Callable[..., bytes]:
    return jpeg_bytes


@pytest.fixture
def tfrecord_format():
    """(serialize_example, frame_record): the encoders behind write_tfrecord."""
    return serialize_example, frame_record


@pytest.fixture
def pfs():
    """pfs(source, **PfsEmulator options) -> a mounted PfsEmulator serving `source` (skipped where FUSE
    cannot be mounted); unmounted at the end of the test."""
    from prestage.bench.emulator import PfsEmulator, find_emulator, unavailable_reason

    reason = unavailable_reason(find_emulator())
    if reason is not None:
        pytest.skip(f"cannot mount FUSE here: {reason}")
    started = []

    def start(source, **options):
        settings = dict(latency_ms=0, bandwidth_mbs=0, max_ops=0)
        settings.update(options)
        emulator = PfsEmulator(source, **settings)
        emulator.start()
        started.append(emulator)
        return emulator

    yield start
    for emulator in started:
        emulator.stop()


@pytest.fixture
def tmpfs(tmp_path):
    """A small tmpfs of our own (needs mount permission; skipped elsewhere)."""
    mounts = []

    def mount(size_kb):
        point = tmp_path / f"tmpfs{len(mounts)}"
        point.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(point)],
                           capture_output=True)
        if r.returncode != 0:
            pytest.skip("cannot mount a tmpfs here: " + r.stderr.decode().strip())
        mounts.append(point)
        return point

    yield mount
    for point in mounts:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


# ------------------------------------------------------------------------------ MosaicML MDS sets

SIZES = {"int": 8, "int8": 1, "int16": 2, "int32": 4, "int64": 8, "uint8": 1, "uint16": 2, "uint32": 4,
         "uint64": 8}


def _encode(encoding: str, value) -> bytes:
    base = encoding.split(":")[0]
    if base in ("jpeg", "png", "bytes"):
        return value
    if base in ("str", "str_int"):
        return str(value).encode()
    if base == "int":
        return np.int64(value).tobytes()
    if base in SIZES:
        return np.dtype(base).type(value).tobytes()
    if base == "ndarray":  # "ndarray:dtype:shape": the values alone
        return np.ascontiguousarray(value).tobytes()
    if base == "pil":
        mode = value.mode.encode()
        return np.array([value.size[0], value.size[1], len(mode)], np.uint32).tobytes() + mode + value.tobytes()
    raise ValueError(encoding)


def _size(encoding: str):
    base, *args = encoding.split(":")
    if base in SIZES:
        return SIZES[base]
    if base == "ndarray" and len(args) == 2:
        return int(np.prod([int(x) for x in args[1].split(",")])) * np.dtype(args[0]).itemsize
    return None


def write_mds(out: Path, columns: dict, samples: list, per_shard: int = 4) -> Path:
    """An MDS set as MDSWriter(columns=columns, out=out, compression=None) writes it."""
    out.mkdir(parents=True, exist_ok=True)
    names = sorted(columns)
    encodings = [columns[n] for n in names]
    sizes = [_size(e) for e in encodings]
    shards = []
    for s, start in enumerate(range(0, len(samples), per_shard)):
        config = {"column_encodings": encodings, "column_names": names, "column_sizes": sizes,
                  "compression": None, "format": "mds", "hashes": [], "size_limit": 1 << 26, "version": 2}
        config_data = json.dumps(config, sort_keys=True).encode()
        encoded = []
        for sample in samples[start:start + per_shard]:
            head, body = [], []
            for name, encoding, size in zip(names, encodings, sizes):
                datum = _encode(encoding, sample[name])
                if size is None:
                    head.append(len(datum))
                else:
                    assert len(datum) == size
                body.append(datum)
            encoded.append(np.array(head, np.uint32).tobytes() + b"".join(body))
        n = np.uint32(len(encoded))
        offsets = np.array([0] + [len(e) for e in encoded]).cumsum().astype(np.uint32)
        offsets += len(n.tobytes()) + len(offsets.tobytes()) + len(config_data)
        data = n.tobytes() + offsets.tobytes() + config_data + b"".join(encoded)
        basename = f"shard.{s:05d}.mds"
        (out / basename).write_bytes(data)
        shards.append(dict(config, raw_data={"basename": basename, "bytes": len(data), "hashes": {}},
                           samples=len(encoded), zip_data=None))
    (out / "index.json").write_text(json.dumps({"shards": shards, "version": 2}, sort_keys=True))
    return out


@pytest.fixture
def mds_writer() -> Callable[..., Path]:
    """write_mds(out, columns, samples, per_shard=4) -> out: an MDS set as MDSWriter writes it."""
    return write_mds


def sampler_reads(catalog, stage_dir, epochs: int = 2, **options) -> list:
    """(bytes, label) of every sample a torch DataLoader over prestage.torch.StagedSampler hands out in
    `epochs` epochs (batches of 4, seed 3, unless `options` say otherwise), read with sample.bytes()."""
    import prestage.torch as pt

    options = {"batch_size": 4, "seed": 3, **options}
    sampler = pt.StagedSampler(catalog, stage_dir=str(stage_dir), **options)
    dataset = pt.StagedDataset(sampler, read=lambda sample, label: (bytes(sample.bytes()), label))
    out = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in sampler.data_loader(dataset, collate_fn=list):
            out.extend(batch)
    return out
