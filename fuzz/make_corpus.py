#!/usr/bin/env python3
"""Writes the seed corpus of every harness into fuzz/corpus/<harness>/.

Each seed is a small valid input (or a near miss) that reaches one code path; libFuzzer mutates from
there. Needs NumPy, Pillow, zstandard and h5py (pip install numpy pillow zstandard h5py); TFRecord files,
tf.train.Example messages, catalog files and stage indexes are written by hand here, as their
formats are documented in the headers and sources that read them. The output is deterministic, so
running it again rewrites the same files.

    python3 fuzz/make_corpus.py             every harness's seeds
    python3 fuzz/make_corpus.py png webp    these harnesses' seeds only
"""

import io
import shutil
import struct
import sys
import tarfile
import zipfile
from pathlib import Path

import h5py
import numpy as np
import zstandard
from PIL import Image

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"


# --- helpers ---------------------------------------------------------------------------------------

def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc = (crc >> 8) ^ _CRC32C[(crc ^ b) & 0xFF]
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(data: bytes) -> bytes:
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc(length)) + data + struct.pack("<I", masked_crc(data))


def varint(v: int) -> bytes:
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(number: int, wire: int, payload) -> bytes:
    key = varint(number << 3 | wire)
    if wire == 2:
        return key + varint(len(payload)) + payload
    return key + payload


def feature_bytes(*values: bytes) -> bytes:
    return field(1, 2, b"".join(field(1, 2, v) for v in values))  # Feature.bytes_list


def feature_int64(*values: int, packed=False) -> bytes:
    if packed:
        inner = field(1, 2, b"".join(varint(v) for v in values))
    else:
        inner = b"".join(field(1, 0, varint(v)) for v in values)
    return field(3, 2, inner)  # Feature.int64_list


def feature_float(*values: float) -> bytes:
    return field(2, 2, field(1, 2, b"".join(struct.pack("<f", v) for v in values)))


def example(features: dict) -> bytes:
    entries = b"".join(field(1, 2, field(1, 2, k.encode()) + field(2, 2, v)) for k, v in features.items())
    return field(1, 2, entries)  # Example.features (map entries)


def npy(array, version=None) -> bytes:
    buf = io.BytesIO()
    if version is None:
        np.save(buf, array)
    else:
        np.lib.format.write_array(buf, np.asanyarray(array), version=version)
    return buf.getvalue()


def npz(arrays: dict, compressed=False) -> bytes:
    buf = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buf, **arrays)
    return fixed_zip_times(buf.getvalue())


def fixed_zip_times(archive: bytes) -> bytes:
    """The archive with every member dated 1980-01-01 00:00, so that seeds do not change with the
    clock (zip records a modification time in each local header and central directory entry)."""
    out = bytearray(archive)
    eocd = archive.rindex(struct.pack("<I", 0x06054B50))
    entries, _, dir_offset = struct.unpack_from("<HII", archive, eocd + 10)
    pos = dir_offset
    for _ in range(entries):
        struct.pack_into("<HH", out, pos + 12, 0, 0x21)
        local = struct.unpack_from("<I", archive, pos + 42)[0]
        struct.pack_into("<HH", out, local + 10, 0, 0x21)
        name_len, extra_len, comment_len = struct.unpack_from("<HHH", archive, pos + 28)
        pos += 46 + name_len + extra_len + comment_len
    return bytes(out)


def zip64_npz(name: str, payload: bytes) -> bytes:
    """A stored one-member archive in zip64 form: 0xFFFFFFFF sizes and offset in the central
    directory with a zip64 extra field, and a zip64 end record found through its locator."""
    fname = name.encode()
    crc = zipfile.crc32(payload) & 0xFFFFFFFF
    local = struct.pack("<IHHHHHIIIHH", 0x04034B50, 45, 0, 0, 0, 0, crc, len(payload), len(payload),
                        len(fname), 0) + fname
    extra = struct.pack("<HHQQQ", 0x0001, 24, len(payload), len(payload), 0)
    central = struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45, 45, 0, 0, 0, 0, crc, 0xFFFFFFFF,
                          0xFFFFFFFF, len(fname), len(extra), 0, 0, 0, 0, 0xFFFFFFFF) + fname + extra
    dir_offset = len(local) + len(payload)
    end64_offset = dir_offset + len(central)
    end64 = struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, 1, 1, len(central), dir_offset)
    locator = struct.pack("<IIQI", 0x07064B50, 0, end64_offset, 1)
    eocd = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return local + payload + central + end64 + locator + eocd


def hdf5(datasets: dict, **options) -> bytes:
    """An HDF5 file in the oldest format (libver="earliest"), which HDF5 1.10 reads."""
    buf = io.BytesIO()
    with h5py.File(buf, "w", libver="earliest") as f:
        for name, (array, dataset_options) in datasets.items():
            f.create_dataset(name, data=array, track_times=False, **dataset_options, **options)
    return buf.getvalue()


def image(width, height, mode="RGB", seed=0):
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([(x * 255 // max(1, width - 1) + seed * 37) % 256,
                    (y * 255 // max(1, height - 1) + seed * 11) % 256,
                    ((x + y) * 4 + seed * 53) % 256], axis=-1).astype(np.uint8)
    return Image.fromarray(rgb, "RGB").convert(mode)


def jpeg(width, height, mode="RGB", seed=0, **options) -> bytes:
    buf = io.BytesIO()
    image(width, height, mode, seed).save(buf, "JPEG", quality=options.pop("quality", 85), **options)
    return buf.getvalue()


def encoded(picture, fmt, **options) -> bytes:
    buf = io.BytesIO()
    picture.save(buf, fmt, **options)
    return buf.getvalue()


def zstd(data: bytes, **options) -> bytes:
    return zstandard.ZstdCompressor(**options).compress(data)


def zstd_streamed(data: bytes) -> bytes:
    """A frame whose header does not state its content size."""
    out = io.BytesIO()
    with zstandard.ZstdCompressor().stream_writer(out, closefd=False) as writer:
        writer.write(data)
    return out.getvalue()


# The catalog file (cpp/src/catalog/catalog.cpp, format version 4; 3 still loads), little-endian.
def fnv1a(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def catalog_file(root, paths, labels, classes=(), locators=(), sizes=(), mtimes=(), kind=0, field_name="",
                 version=4, symlinks=0, damage=()):
    """damage: (file, offset, rest_of_file, reason) tuples; version 3 has no symlinks or damage."""
    def text(s):
        b = s.encode()
        return struct.pack("<Q", len(b)) + b

    def array(fmt, values):
        return struct.pack("<Q", len(values)) + b"".join(struct.pack(fmt, *(v if isinstance(v, tuple) else (v,)))
                                                           for v in values)
    offsets = [0]
    for p in paths:
        offsets.append(offsets[-1] + len(p.encode()))
    out = b"PSTGCAT\0" + struct.pack("<I", version) + text(root)
    out += struct.pack("<Q", len(classes)) + b"".join(text(c) for c in classes)
    out += text("".join(paths)) + array("<Q", offsets) + array("<QQQ", list(locators))
    out += array("<q", labels) + array("<Q", list(sizes)) + array("<q", list(mtimes))
    out += struct.pack("<B", kind) + text(field_name)
    if version >= 4:
        out += struct.pack("<BQ", symlinks, len(damage))
        out += b"".join(struct.pack("<QQB", f, o, r) + text(why) for f, o, r, why in damage)
    return out + struct.pack("<Q", fnv1a(out))


# The stage index (cpp/src/staging/stage_directory.cpp): 40-byte records. The harness's catalog
# file `id` holds 1 + 5 * id bytes, byte k being (id * 31 + k * 7) & 0xff.
def staged_bytes(file_id):
    return bytes((file_id * 31 + k * 7) & 0xFF for k in range(1 + 5 * file_id))


def index_record(file_id, size=None, mtime=0, crc=None, magic=0x58444950, version=1, own=True):
    size = len(staged_bytes(file_id)) if size is None and file_id < 8 else (size or 0)
    crc = crc32c(staged_bytes(file_id)) if crc is None and file_id < 8 else (crc or 0)
    body = struct.pack("<IIQQqI", magic, version, file_id, size, mtime, crc)
    return body + struct.pack("<I", crc32c(body) if own else 0)


# --- the seeds -------------------------------------------------------------------------------------

def seeds():
    s = {}
    jpegs = {
        "rgb420": jpeg(32, 24),
        "rgb444-odd": jpeg(17, 13, subsampling=0, seed=1),
        "rgb422": jpeg(40, 18, subsampling=1, seed=2),
        "gray": jpeg(16, 16, "L", seed=3),
        "progressive": jpeg(48, 36, progressive=True, seed=4),
        "cmyk": jpeg(24, 16, "CMYK", seed=5),
        "restart": jpeg(64, 32, seed=6, restart_marker_blocks=2),
        "optimized-exif": jpeg(20, 30, seed=7, optimize=True, exif=b"Exif\0\0MM\0*\0\0\0\x08\0\0",
                               icc_profile=b"\0" * 40, comment=b"seed"),
        "one-pixel": jpeg(1, 1, seed=8),
        "wide": jpeg(300, 4, seed=9, quality=40),
    }
    jpegs["truncated"] = jpegs["rgb420"][: len(jpegs["rgb420"]) * 2 // 3]
    params = [bytes([24, 32, 0x37, 1]), bytes([7, 5, 0xF0, 2]), bytes([63, 63, 0xFF, 255]),
              bytes([0, 0, 0x00, 0]), bytes([10, 40, 0x88, 77])]
    s["jpeg"] = {name: params[i % len(params)] + data for i, (name, data) in enumerate(jpegs.items())}

    pngs = {
        "rgb": encoded(image(32, 24), "PNG"),
        "grey": encoded(image(17, 13, "L", seed=1), "PNG"),
        "palette": encoded(image(20, 10, "P", seed=2), "PNG"),
        "palette-trns": encoded(image(12, 12, "P", seed=3), "PNG", transparency=2),
        "rgba": encoded(image(16, 9, "RGBA", seed=4), "PNG"),
        "grey-alpha": encoded(image(9, 16, "LA", seed=5), "PNG"),
        "grey-16": encoded(image(8, 8, "L", seed=6).convert("I;16"), "PNG"),
        "one-bit": encoded(image(33, 5, "1", seed=7), "PNG"),
        "optimized": encoded(image(40, 30, seed=8), "PNG", optimize=True),
        "one-pixel": encoded(image(1, 1, seed=9), "PNG"),
    }
    pngs["truncated"] = pngs["rgb"][: len(pngs["rgb"]) * 2 // 3]
    s["png"] = {name: params[i % len(params)] + data for i, (name, data) in enumerate(pngs.items())}
    webps = {
        "lossy": encoded(image(32, 24), "WEBP", quality=80),
        "lossless": encoded(image(17, 13, seed=1), "WEBP", lossless=True),
        "lossy-alpha": encoded(image(16, 9, "RGBA", seed=2), "WEBP", quality=60),
        "lossless-alpha": encoded(image(9, 16, "RGBA", seed=3), "WEBP", lossless=True),
        "animated": encoded(image(8, 8, seed=4), "WEBP", save_all=True,
                            append_images=[image(8, 8, seed=5)], duration=10),
        "one-pixel": encoded(image(1, 1, seed=6), "WEBP"),
    }
    webps["truncated"] = webps["lossy"][: len(webps["lossy"]) * 2 // 3]
    s["webp"] = {name: params[i % len(params)] + data for i, (name, data) in enumerate(webps.items())}

    arrays = {
        "f4-2d": np.arange(12, dtype="<f4").reshape(3, 4),
        "i8-be-fortran": np.asfortranarray(np.arange(12, dtype=">i8").reshape(2, 3, 2)),
        "u1-empty": np.zeros((0,), dtype="|u1"),
        "scalar": np.array(3.5, dtype="<f8"),
        "bool": np.array([True, False, True]),
        "c16": np.array([1 + 2j, 3 - 4j], dtype="<c16"),
        "u2-fortran-4d": np.asfortranarray(np.arange(24, dtype="<u2").reshape(2, 3, 2, 2)),
        "datetime": np.array(["2020-01-01"], dtype="datetime64[D]"),
    }
    s["npy"] = {name: npy(a) for name, a in arrays.items()}
    s["npy"]["v2"] = npy(np.arange(6, dtype="<i4").reshape(2, 3), version=(2, 0))
    s["npy"]["v3"] = npy(np.arange(6, dtype="<i2"), version=(3, 0))
    header = b"{\"descr\": '<u1', \"shape\": (2, 2) ,'fortran_order':True}"
    header += b" " * (-(10 + len(header) + 1) % 64) + b"\n"
    s["npy"]["hand-written"] = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + bytes(4)

    s["npz"] = {
        "stored-one": npz({"arr_0": arrays["f4-2d"]}),
        "stored-two": npz({"x": arrays["f4-2d"], "y": arrays["bool"]}),
        "deflated-one": npz({"x": np.arange(100, dtype="<i4")}, compressed=True),
        "deflated-fortran": npz({"x": arrays["i8-be-fortran"], "z": arrays["c16"]}, compressed=True),
        "stored-fortran": npz({"x": arrays["u2-fortran-4d"]}),
        "zip64": zip64_npz("x.npy", npy(np.arange(5, dtype="<u4"))),
    }

    text = b"prestage seed " * 20
    s["zstd"] = {
        "sized": zstd(text),
        "checksum": zstd(text, write_checksum=True),
        "streamed": zstd_streamed(text),
        "two-frames": zstd(b"first") + zstd_streamed(b"second"),
        "skippable": struct.pack("<II", 0x184D2A50, 4) + b"skip" + zstd(b"after"),
        "empty": zstd(b""),
        "npy": zstd(s["npy"]["f4-2d"], level=3),
        "long": zstd(bytes(range(256)) * 256, level=19),
    }

    image_bytes = jpegs["rgb420"]
    records = [example({"image": feature_bytes(image_bytes[:50]), "label": feature_int64(3)}),
               example({"label": feature_int64(-1, packed=True), "image": feature_bytes(b"abc")}),
               example({"image": feature_bytes(b"xyz", b"second"), "label": feature_int64(7, 8)})]
    s["tfrecord"] = {
        "one-raw": b"\x00" + tfrecord(records[0]),
        "three-raw": b"\x00" + b"".join(tfrecord(r) for r in records),
        "three-fixed": b"\x01" + b"".join(tfrecord(r) for r in records),
        "truncated-fixed": b"\x01" + tfrecord(records[1])[:-3],
        "no-label-fixed": b"\x01" + tfrecord(example({"image": feature_bytes(b"a")})),
        "empty": b"\x00",
        "dali-index": b"\x02" + dali_index(tar_shard(two)) + b"\x00" + tar_shard(two),
    }

    unknown_fields = (field(2, 0, varint(150)) + field(3, 1, bytes(8)) + field(4, 5, bytes(4)) +
                      field(5, 2, b"junk"))
    s["example"] = {
        "image-label": records[0],
        "packed-label": records[1],
        "lists": records[2],
        "floats": example({"image": feature_float(1.0, 2.5), "label": feature_float(0.5), "x": feature_bytes()}),
        "unknown-fields": unknown_fields + example({"x": feature_bytes(b"v"), "label": feature_int64(1)}),
        "duplicate-keys": example({"x": feature_bytes(b"first")}) + example({"x": feature_bytes(b"last")}),
        "empty-feature": field(1, 2, field(1, 2, field(1, 2, b"image"))),
        "empty": b"",
        "mixed-lists": example({"x": field(2, 2, field(1, 2, struct.pack("<2f", 1.0, 2.0)) +
                                             field(1, 5, struct.pack("<f", 3.0))),
                                "image": feature_int64(-5, 6, packed=True)}),
    }

    # The index of a packed set (prestage pack): the harness puts a 64-byte shard-00000.bin beside it.
    head = b"# prestage pack 1\n# classes\tcat\tdog\n# zstd\tnone\n"
    s["shard_index"] = {
        "two-samples": head + b"shard-00000.bin\t0\t10\t0\t0a0b0c0d\tcat/a.jpg\n"
                              b"shard-00000.bin\t10\t54\t1\t01020304\tdog/b.jpg\n",
        "past-the-end": head + b"shard-00000.bin\t60\t10\t0\t0\tcat/a.jpg\n",
        "two-shards": head + b"shard-00000.bin\t0\t1\t-1\t0\ta\nshard-00001.bin\t0\t1\t3\t0\tb\n",
    }
    s["catalog"] = {
        "folder": catalog_file("/data/imagenet", ["cat/1.jpg", "cat/2.jpg", "dog/a.jpg"], [0, 0, 1],
                               classes=["cat", "dog"], sizes=[100, 200, 300],
                               mtimes=[1_700_000_000_000_000_000] * 3),
        "list-unknown-sizes": catalog_file("rel/root", ["a.npy", "b/c.npy"], [-1, 5]),
        "tfrecord": catalog_file("/shards", ["train-0.tfrecord", "train-1.tfrecord"], [1, 2, 3],
                                 locators=[(0, 0, 120), (0, 120, 90), (1, 0, 64)], sizes=[210, 64],
                                 kind=1, field_name="image"),
        "hdf5": catalog_file("/h5", ["x.h5"], [-1, -1], locators=[(0, 0, 2**64 - 1), (0, 1, 2**64 - 1)],
                             kind=2, field_name="images"),
        "empty": catalog_file("", [], []),
        "version-3": catalog_file("/data", ["a.jpg"], [0], version=3),
        "symlinks-inside": catalog_file("/shared/set", ["c/a.jpg", "c/b.jpg"], [0, 0], symlinks=1),
        "tfrecord-damaged": catalog_file("/shards", ["train-0.tfrecord", "train-1.tfrecord"], [1, 3],
                                         locators=[(0, 0, 120), (1, 0, 64)], sizes=[2**64 - 1, 64],
                                         kind=1, field_name="image",
                                         damage=[(0, 120, 0, "bad CRC of the record data"),
                                                 (0, 210, 1, "bad CRC of the record length")]),
    }

    full = b"".join(index_record(i) for i in range(8))
    s["stage_index"] = {
        "all-valid": b"\x00" + full,
        "all-valid-staging": b"\x20" + full,
        "fixed-known-sizes": bytes([0x1F]) + full,
        "fixed-known-sizes-staging": bytes([0x3F]) + full,
        "torn-last": b"\x00" + full[:-17],
        "wrong-sizes": b"\x00" + b"".join(index_record(i, size=999) for i in range(0, 8, 2)),
        "bad-crc-of-copy": b"\x00" + b"".join(index_record(i, crc=1) for i in range(8)),
        "ids-out-of-range": b"\x00" + index_record(8, size=1) + index_record(2**64 - 1, size=2) + index_record(3),
        "bad-record-midway": b"\x00" + index_record(1) + index_record(2, own=False) + index_record(3),
        "later-wins": b"\x00" + index_record(4, size=7) + index_record(4),
        "empty": b"\x00",
        "dali-index": b"\x02" + dali_index(tar_shard(two)) + b"\x00" + tar_shard(two),
    }

    labels = (np.array([3, 1, 2], dtype="<i8"), {})
    s["hdf5"] = {
        "f4-rows": hdf5({"x": (np.arange(12, dtype="<f4").reshape(3, 4), {}), "y": labels}),
        "u1-images": hdf5({"x": (np.zeros((2, 4, 4, 3), dtype="|u1"), {}), "y": (np.array([0, 1], dtype="<u2"), {})}),
        "be-i2-chunked": hdf5({"x": (np.arange(30, dtype=">i2").reshape(5, 6), {"chunks": (2, 3)}), "y": labels}),
        "deflated": hdf5({"x": (np.arange(64, dtype="<f8").reshape(8, 8), {"chunks": (4, 8), "compression": "gzip"})}),
        "strings": hdf5({"x": (np.array([b"ab", b"cd"]), {}), "y": (np.array([1.5]), {})}),
    }

    npz_x = s["npz"]["stored-two"]
    s["sample"] = {
        "npy": b"\x00" + s["npy"]["f4-2d"],
        "npy-fortran": b"\x00" + s["npy"]["u2-fortran-4d"],
        "zstd-npy": b"\x00" + zstd(s["npy"]["i8-be-fortran"]),
        "zstd-npy-streamed": b"\x00" + zstd_streamed(s["npy"]["f4-2d"]),
        "npz": b"\x01" + s["npz"]["deflated-one"],
        "zstd-npz": b"\x01" + zstd(s["npz"]["stored-one"]),
        "tfrecord-npy": b"\x02" + example({"x": feature_bytes(s["npy"]["c16"])}),
        "tfrecord-zstd-npy": b"\x02" + example({"x": feature_bytes(zstd(s["npy"]["bool"]))}),
        "tfrecord-npz": b"\x03" + example({"x": feature_bytes(s["npz"]["deflated-fortran"])}),
        "tfrecord-raw": b"\x04" + example({"x": feature_bytes(b"raw bytes")}),
        "tfrecord-raw-floats": b"\x04" + example({"x": feature_float(1.0, -2.0, 3.5)}),
        "tfrecord-raw-int64": b"\x04" + example({"x": feature_int64(1, -1, 1 << 40)}),
        "tfrecord-raw-framed": b"\x0c" + tfrecord(example({"x": feature_bytes(b"framed")})),
        "jpeg": b"\x05" + jpegs["rgb422"],
        "zstd-jpeg": b"\x05" + zstd(jpegs["cmyk"]),
        "tfrecord-jpeg": b"\x06" + example({"x": feature_bytes(jpegs["gray"])}),
        "npz-member-x": b"\x07" + npz_x,
    }
    s["tar"] = tar_seeds()
    s["mds"] = mds_seeds()
    return s


def tar_shard(members, fmt=tarfile.PAX_FORMAT, mtime=1.5) -> bytes:
    """A tar of (name, data) members as Python's tarfile writes it: a float mtime gives a pax header
    before each member (as webdataset's TarWriter), GNU_FORMAT long-name (`L`) headers."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), mtime
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def dali_index(shard: bytes) -> bytes:
    """The v1.2 index DALI's wds2idx writes for `shard`: per sample (a run of one key), each regular
    member's extension, data offset, size and name."""
    samples, last = [], None
    with tarfile.open(fileobj=io.BytesIO(shard)) as tar:
        for m in tar:
            if not m.isreg():
                continue
            dot = m.name.find(".", m.name.rfind("/") + 1)
            part = f"{m.name[dot + 1:]} {m.offset_data} {m.size} {m.name}"
            if m.name[:dot] != last:
                samples.append([part])
                last = m.name[:dot]
            else:
                samples[-1].append(part)
    return (f"v1.2 {len(samples)}\n" + "".join(" ".join(s) + "\n" for s in samples)).encode()


def tar_seeds() -> dict:
    two = [("a.jpg", b"\xff\xd8jpeg"), ("a.cls", b"3"), ("a.json", b'{"label": 4}'),
           ("b.bin", b"\x00\x01"), ("b.cls", b" 7\n"), ("b.json", b'{"label": -1, "x": [1, {"y": 2}]}')]
    long_name = "d" * 120 + "/sample.jpg"
    return {
        "pax": b"\x00" + tar_shard(two),
        "pax-fixed": b"\x01" + tar_shard(two),
        "gnu-long-names": b"\x00" + tar_shard([(long_name, b"jpeg"), (long_name[:-3] + "cls", b"1")],
                                              tarfile.GNU_FORMAT, 0),
        "ustar-prefix": b"\x00" + tar_shard([("p" * 90 + "/" + "q" * 60 + ".jpg", b"x")],
                                            tarfile.USTAR_FORMAT, 0),
        "interleaved": b"\x01" + tar_shard([("a.jpg", b"1"), ("b.jpg", b"2"), ("a.cls", b"0")], mtime=0),
        "meta-and-dirs": b"\x01" + tar_shard([("__index__", b"{}"), ("c.jpg", b"3"), ("c.cls", b"2")]),
        "empty": b"\x00",
        "dali-index": b"\x02" + dali_index(tar_shard(two)) + b"\x00" + tar_shard(two),
    }


def mds_seeds() -> dict:
    """MDS (as MDSWriter writes it): a shard of columns arr (ndarray, dtype and shape in the sample),
    image (jpeg), label (int), pix (pil), tid (str_int); and an index.json naming them."""
    arr = bytes([34, 1 << 2 | 0, 2]) + bytes(8)
    image = b"\xff\xd8jpeg"
    pix = struct.pack("<III", 1, 1, 1) + b"L" + b"\x05"
    tid = b"-3"
    sample = struct.pack("<IIII", len(arr), len(image), len(pix), len(tid))
    sample += arr + image + struct.pack("<q", 7) + pix + tid
    samples = [sample, sample]
    table = 4 + 4 * (len(samples) + 1)
    offsets = [table]
    for one in samples:
        offsets.append(offsets[-1] + len(one))
    shard = struct.pack(f"<{len(offsets) + 1}I", len(samples), *offsets) + b"".join(samples)
    index = ('{"shards": [{"column_encodings": ["ndarray", "jpeg", "int", "pil", "str_int"], '
             '"column_names": ["arr", "image", "label", "pix", "tid"], '
             '"column_sizes": [null, null, 8, null, null], "compression": null, "format": "mds", '
             '"hashes": [], "raw_data": {"basename": "shard.00000.mds", "bytes": 0, "hashes": {}}, '
             '"samples": 1, "size_limit": 67108864, "version": 2, "zip_data": null}], "version": 2}')
    return {"shard": b"\x00" + shard, "index": b"\x01" + index.encode(), "empty": b"\x00"}


def main(only=()):
    total = 0
    for harness, files in seeds().items():
        if only and harness not in only:
            continue
        folder = CORPUS / harness
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        for name, data in files.items():
            (folder / name).write_bytes(data)
            total += len(data)
        print(f"{harness}: {len(files)} seeds")
    print(f"{total} bytes in all")


if __name__ == "__main__":
    main(sys.argv[1:])
