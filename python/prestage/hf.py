"""Hugging Face ``datasets`` sets as byte ranges: ``Catalog.from_hf``.

``datasets`` keeps a set in Arrow IPC stream files (its cache, and ``save_to_disk``'s
``data-*.arrow``) and publishes it as Parquet. An ``Image`` feature is a struct of ``bytes`` and
``path``; its ``bytes`` child is a binary column whose values lie, uncompressed, at byte ranges of
those files: in an Arrow file at the record batch's data buffer plus the value's offset, in a
Parquet file of uncompressed PLAIN pages (what ``datasets`` writes for images from 4.6 on) after each
value's 4-byte length. This module finds those ranges once, with pyarrow (imported here only, and
needed only to build the catalog): for Arrow the buffers of a memory-mapped stream, whose addresses
less the map's are file offsets; for Parquet the column chunks of the footer, then its own walk of
each chunk's page headers (Thrift compact), definition levels and values. The loader then reads the
ranges as it reads any catalog's, through every tier and adaptor.
"""

from __future__ import annotations

import glob
import json
import mmap
import os
import struct
import warnings
import zlib
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from prestage import _core
from prestage.errors import ConfigError, DecodeError

_Source = Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]], Any]

#: The command that rewrites a Parquet file so that its images can be read by byte range.
REWRITE = ('python -c "import pyarrow.parquet as pq; pq.write_table(pq.read_table(\'{src}\'), '
           '\'OUT.parquet\', compression=\'none\', use_dictionary=False)"')


class _Damage(Exception):
    """Damage found in a file: where it starts, why, and whether the rest of the file is lost."""

    def __init__(self, offset: int, reason: str, rest_of_file: bool = False):
        super().__init__(reason)
        self.offset = offset
        self.reason = reason
        self.rest_of_file = rest_of_file


class _Located:
    """The samples found so far (arrays grow by file) and the damage left out."""

    def __init__(self) -> None:
        self.files: List[str] = []
        self.index: List[np.ndarray] = []
        self.offsets: List[np.ndarray] = []
        self.lengths: List[np.ndarray] = []
        self.labels: List[np.ndarray] = []
        self.damage: List[Tuple[int, int, bool, str]] = []
        self.classes: Optional[List[str]] = None

    def add(self, file: int, offsets: np.ndarray, lengths: np.ndarray, labels: np.ndarray) -> None:
        self.index.append(np.full(len(offsets), file, np.uint64))
        self.offsets.append(offsets.astype(np.uint64))
        self.lengths.append(lengths.astype(np.uint64))
        self.labels.append(labels.astype(np.int64))


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.ipc  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError as e:
        raise ImportError("Catalog.from_hf needs pyarrow to find the buffers of Arrow and Parquet "
                          "files (only to build the catalog): pip install pyarrow") from e
    return pyarrow


def _files(source: _Source) -> List[str]:
    """The Arrow or Parquet files of `source`, in the set's order."""
    if hasattr(source, "cache_files") and hasattr(source, "features"):  # a datasets.Dataset
        if getattr(source, "_indices", None) is not None:
            raise ConfigError("from_hf: this Dataset reorders or selects its rows through an indices "
                              "mapping (select, shuffle, filter, train_test_split): call "
                              "ds.flatten_indices() first, which writes the rows in their order")
        files = [f["filename"] for f in source.cache_files]
        if not files:
            raise ConfigError("from_hf: this Dataset is held in memory, not in Arrow files: "
                              "ds.save_to_disk(DIR) and pass DIR")
        return files
    if hasattr(source, "keys") and hasattr(source, "values"):  # a DatasetDict
        raise ConfigError("from_hf: a DatasetDict holds several splits (" +
                          ", ".join(map(str, source.keys())) + "): pass one, e.g. ds['train']")
    sources = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    out: List[str] = []
    for s in sources:
        path = os.fspath(s)
        if os.path.isdir(path):
            out += _folder(path)
        elif any(c in path for c in "*?["):
            found = sorted(glob.glob(path))
            if not found:
                raise ConfigError(f"from_hf: no file matches '{path}'")
            out += found
        elif os.path.exists(path):
            out.append(path)
        else:
            raise _core_io_error(path)
    if not out:
        raise ConfigError("from_hf: no file given")
    return out


def _core_io_error(path: str) -> OSError:
    from prestage.errors import IoError

    return IoError(2, f"from_hf: no such file or folder '{path}'", path)


def _folder(path: str) -> List[str]:
    """A save_to_disk folder's data files (state.json's order), else its .arrow or .parquet files."""
    if os.path.exists(os.path.join(path, "dataset_dict.json")):
        with open(os.path.join(path, "dataset_dict.json")) as f:
            splits = json.load(f).get("splits", [])
        raise ConfigError(f"from_hf: '{path}' holds a DatasetDict of splits {splits}: pass the "
                          f"folder of one, e.g. '{os.path.join(path, str(splits[0]) if splits else 'train')}'")
    state = os.path.join(path, "state.json")
    if os.path.exists(state):
        with open(state) as f:
            files = [d["filename"] for d in json.load(f).get("_data_files", [])]
        if files:
            return [os.path.join(path, name) for name in files]
    for pattern in ("*.arrow", "*.parquet", "**/*.arrow", "**/*.parquet"):
        found = sorted(glob.glob(os.path.join(path, pattern), recursive=True))
        if found:
            return found
    raise ConfigError(f"from_hf: '{path}' holds no .arrow or .parquet file")


def _hf_features(metadata: Optional[Dict[bytes, bytes]]) -> Dict[str, Any]:
    """The features `datasets` records in a schema's metadata (empty where it did not)."""
    if not metadata or b"huggingface" not in metadata:
        return {}
    try:
        info = json.loads(metadata[b"huggingface"])
        features = info.get("info", {}).get("features", {})
        return features if isinstance(features, dict) else {}
    except (ValueError, AttributeError):
        return {}


def _class_names(features: Dict[str, Any], label: Optional[str]) -> Optional[List[str]]:
    feature = features.get(label) if label else None
    if isinstance(feature, dict) and feature.get("_type") == "ClassLabel":
        return [str(n) for n in feature.get("names", [])]
    return None


def _column_index(schema: Any, name: str, path: str, what: str) -> int:
    index = schema.get_field_index(name)
    if index < 0:
        raise ConfigError(f"from_hf: '{path}' has no {what} column '{name}'; its columns: "
                          + ", ".join(schema.names))
    return int(index)


def _labels(column: Any, path: str, name: str) -> np.ndarray:
    """A label column as int64, null as -1 (a ClassLabel's "no label")."""
    import pyarrow as pa

    if not (pa.types.is_integer(column.type) or pa.types.is_boolean(column.type)):
        raise ConfigError(f"from_hf: '{path}': label column '{name}' is of type {column.type}, "
                          "not an integer (int or ClassLabel)")
    return np.asarray(column.fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)


# --------------------------------------------------------------------------------------- Arrow

def _binary_child(column: Any, path: str, name: str) -> Tuple[Any, Optional[np.ndarray]]:
    """The binary array holding the images, and the rows whose struct is null (None: none are)."""
    import pyarrow as pa

    t = column.type
    if pa.types.is_struct(t):
        if t.get_field_index("bytes") < 0:
            raise ConfigError(f"from_hf: '{path}': column '{name}' is a struct without a 'bytes' "
                              f"field ({t}), not an Image feature")
        child = column.field("bytes")
        null = None if column.null_count == 0 else np.asarray(column.is_null())
        return child, null
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return column, None
    raise ConfigError(f"from_hf: '{path}': column '{name}' is of type {t}, not an Image feature "
                      "(struct of bytes and path) or binary")


def _locate_arrow(path: str, image: str, label: Optional[str], first_row: int,
                  out: _Located, file: int, skip: bool) -> int:
    """Adds the samples of an Arrow IPC stream file to `out`; returns its rows."""
    pa = _pyarrow()
    size = os.path.getsize(path)
    try:
        mm = pa.memory_map(path, "r")
    except OSError as e:
        raise _core_io_error(path) from e
    with mm:
        base = mm.read_buffer(size)  # the whole map, zero copy: its address is the file's start
        mm.seek(0)
        start = base.address
        try:
            reader = pa.ipc.open_stream(mm)
        except (pa.ArrowException, OSError) as e:
            raise _Damage(0, f"not an Arrow IPC stream ({e})", True) from None
        features = _hf_features(reader.schema.metadata)
        classes = _class_names(features, label)
        if out.classes is None:
            out.classes = classes
        image_index = _column_index(reader.schema, image, path, "image")
        label_index = None if label is None else _column_index(reader.schema, label, path, "label")
        row = first_row
        while True:
            at = mm.tell()
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                break
            except (pa.ArrowException, OSError) as e:
                damage = _Damage(at, f"the record batch at row {row} cannot be read ({e}): the file "
                                 "is truncated or damaged", True)
                if not skip:
                    raise damage from None
                out.damage.append((file, at, True, damage.reason))
                break
            try:
                batch.validate(full=True)
                column = batch.column(image_index)
                child, struct_null = _binary_child(column, path, image)
                buffers = child.buffers()
                width = 8 if pa.types.is_large_binary(child.type) else 4
                n = len(child)
                offsets = np.frombuffer(buffers[1], dtype=np.int32 if width == 4 else np.int64,
                                        count=child.offset + n + 1)[child.offset:].astype(np.int64)
                data = buffers[2]
                if data is None or len(data) == 0:
                    where = -1
                else:
                    where = data.address - start
                    if where < 0 or where + len(data) > size:
                        raise ConfigError(
                            f"from_hf: '{path}': the values of column '{image}' are not stored as "
                            "they are in the file (a compressed Arrow stream?): prestage reads them "
                            "by byte range. Write the set again without compression "
                            "(ds.save_to_disk, or pyarrow's default IpcWriteOptions)")
                missing = np.asarray(child.is_null()) if child.null_count else np.zeros(n, bool)
                if struct_null is not None:
                    missing |= struct_null
                labels = (np.full(n, -1, np.int64) if label_index is None else
                          _labels(batch.column(label_index), path, label or ""))
            except (pa.ArrowException, ValueError) as e:
                if isinstance(e, ConfigError):
                    raise
                damage = _Damage(at, f"the record batch of rows {row}..{row + batch.num_rows - 1} "
                                 f"is damaged ({e})")
                if not skip:
                    raise damage from None
                out.damage.append((file, at, False, damage.reason))
                row += batch.num_rows
                continue
            lengths = offsets[1:] - offsets[:-1]
            good = ~missing
            if missing.any():
                first = int(np.flatnonzero(missing)[0])
                reason = (f"column '{image}', row {row + first}: no image bytes (a null image, or "
                          "one stored by path only: prestage reads the bytes held in the file)")
                if not skip:
                    raise _Damage(at, reason)
                for k in np.flatnonzero(missing):
                    out.damage.append((file, at, False, f"column '{image}', row {row + int(k)}: "
                                       "no image bytes (a null image, or one stored by path only)"))
            out.add(file, (where + offsets[:-1])[good], lengths[good], labels[good])
            row += n
    return row - first_row


# ------------------------------------------------------------------------------------- Parquet

# Thrift compact protocol types (parquet.thrift's structs are read with it).
_T_TRUE, _T_FALSE, _T_BYTE, _T_I16, _T_I32, _T_I64, _T_DOUBLE = 1, 2, 3, 4, 5, 6, 7
_T_BINARY, _T_LIST, _T_SET, _T_MAP, _T_STRUCT = 8, 9, 10, 11, 12


class _Thrift:
    """A Thrift compact reader over buf[pos:end]; a read past `end` is damage."""

    def __init__(self, buf: Any, pos: int, end: int):
        self.buf, self.pos, self.end = buf, pos, end

    def byte(self) -> int:
        if self.pos >= self.end:
            raise _Damage(self.pos, "a page header runs past the end of its column chunk")
        b = self.buf[self.pos]
        self.pos += 1
        return int(b)

    def varint(self) -> int:
        value, shift = 0, 0
        while True:
            b = self.byte()
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 63:
                raise _Damage(self.pos, "a page header holds a malformed integer")

    def zigzag(self) -> int:
        v = self.varint()
        return (v >> 1) ^ -(v & 1)

    def value(self, kind: int, depth: int) -> Any:
        if depth > 16:
            raise _Damage(self.pos, "a page header nests too deep")
        if kind in (_T_TRUE, _T_FALSE):
            return kind == _T_TRUE
        if kind == _T_BYTE:
            return self.byte()
        if kind in (_T_I16, _T_I32, _T_I64):
            return self.zigzag()
        if kind == _T_DOUBLE:
            self.skip(8)
            return None
        if kind == _T_BINARY:
            self.skip(self.varint())
            return None
        if kind in (_T_LIST, _T_SET):
            head = self.byte()
            count = head >> 4
            if count == 15:
                count = self.varint()
            elem = head & 0x0F
            for _ in range(count):
                if elem in (_T_TRUE, _T_FALSE):
                    self.byte()
                else:
                    self.value(elem, depth + 1)
            return None
        if kind == _T_MAP:
            count = self.varint()
            if count:
                types = self.byte()
                for _ in range(count):
                    self.value(types >> 4, depth + 1)
                    self.value(types & 0x0F, depth + 1)
            return None
        if kind == _T_STRUCT:
            return self.struct(depth + 1)
        raise _Damage(self.pos, f"a page header holds an unknown Thrift type {kind}")

    def skip(self, n: int) -> None:
        if n < 0 or self.pos + n > self.end:
            raise _Damage(self.pos, "a page header runs past the end of its column chunk")
        self.pos += n

    def struct(self, depth: int = 0) -> Dict[int, Any]:
        fields: Dict[int, Any] = {}
        last = 0
        while True:
            head = self.byte()
            if head == 0:
                return fields
            delta, kind = head >> 4, head & 0x0F
            last = last + delta if delta else self.zigzag()
            fields[last] = self.value(kind, depth)


def _levels(buf: Any, pos: int, end: int, count: int, bit_width: int) -> np.ndarray:
    """`count` levels of the RLE / bit-packed hybrid encoding in buf[pos:end]."""
    out = np.empty(count, np.int32)
    filled = 0
    reader = _Thrift(buf, pos, end)
    byte_width = (bit_width + 7) // 8
    while filled < count:
        if reader.pos >= end:
            raise _Damage(pos, f"its definition levels end after {filled} of {count} values")
        header = reader.varint()
        if header & 1:  # bit-packed: groups of 8 values
            groups = header >> 1
            nbytes = groups * bit_width
            reader.skip(nbytes)
            raw = np.frombuffer(bytes(buf[reader.pos - nbytes:reader.pos]), np.uint8)
            bits = np.unpackbits(raw, bitorder="little").reshape(-1, bit_width)
            values = (bits.astype(np.int32) << np.arange(bit_width, dtype=np.int32)).sum(axis=1)
            take = min(len(values), count - filled)
            out[filled:filled + take] = values[:take]
            filled += take
        else:  # a run of one value
            run = header >> 1
            reader.skip(byte_width)
            value = int.from_bytes(bytes(buf[reader.pos - byte_width:reader.pos]), "little")
            take = min(run, count - filled)
            out[filled:filled + take] = value
            filled += take
    return out


def _walk_chunk(buf: Any, start: int, end: int, num_values: int, max_def: int,
                column: str) -> Tuple[np.ndarray, np.ndarray, int]:
    """Each value's (offset, length) in one column chunk of uncompressed PLAIN BYTE_ARRAY pages
    (offset -1 for a null); _Damage at the first page that does not add up, _Unsupported at a page
    that is not PLAIN."""
    offsets = np.full(num_values, -1, np.int64)
    lengths = np.zeros(num_values, np.int64)
    seen = 0
    pos = start
    bit_width = max_def.bit_length()
    u32 = struct.Struct("<I")
    while seen < num_values:
        if pos >= end:
            raise _Damage(pos, f"the column chunk ends after {seen} of its {num_values} values")
        page = pos
        reader = _Thrift(buf, pos, end)
        header = reader.struct()

        def field(fields: Any, key: int, default: Optional[int] = None) -> int:
            value = fields.get(key, default) if isinstance(fields, dict) else None
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise _Damage(page, f"the page at byte {page} has a malformed header")
            return value

        kind, raw_size, size = field(header, 1), field(header, 2), field(header, 3)
        body, body_end = reader.pos, reader.pos + size
        if body_end > end:
            raise _Damage(page, f"the page at byte {page} claims {size} bytes, past the end of "
                          f"its column chunk at byte {end}")
        if kind == 2:
            raise _Unsupported(f"column '{column}' is dictionary-encoded")
        if kind not in (0, 3):
            pos = body_end  # an index page
            continue
        if raw_size != size:
            raise _Damage(page, f"the page at byte {page} claims {raw_size} bytes "
                          f"uncompressed and {size} stored, in an uncompressed column")
        crc = header.get(4)
        if isinstance(crc, int) and zlib.crc32(buf[body:body_end]) != crc & 0xFFFFFFFF:
            raise _Damage(page, f"the page at byte {page} fails its CRC")
        levels_at = values = body
        if kind == 0:
            data_header = header.get(5)
            count, encoding = field(data_header, 1), field(data_header, 2)
            if max_def:
                if body + 4 > body_end:
                    raise _Damage(page, f"the page at byte {page} ends in its levels")
                levels_size = u32.unpack_from(buf, body)[0]
                levels_at, values = body + 4, body + 4 + levels_size
        else:
            data_header = header.get(8)
            count, encoding = field(data_header, 1), field(data_header, 4)
            levels_at = body + field(data_header, 6, 0)
            values = levels_at + field(data_header, 5, 0)
        if count > num_values - seen:
            raise _Damage(page, f"the page at byte {page} claims {count} values, more than "
                          f"its column chunk has left ({num_values - seen})")
        if encoding != 0:
            raise _Unsupported(f"column '{column}' is not PLAIN-encoded (encoding {encoding})")
        if values > body_end:
            raise _Damage(page, f"the page at byte {page} has levels past its end")
        present = (np.ones(count, bool) if not max_def else
                   _levels(buf, levels_at, values, count, bit_width) == max_def)
        at = values
        for k in range(count):
            if not present[k]:
                continue
            if at + 4 > body_end:
                raise _Damage(page, f"the page at byte {page} ends before value {seen + k} "
                              "(its length lies)")
            n = u32.unpack_from(buf, at)[0]
            if at + 4 + n > body_end:
                raise _Damage(page, f"value {seen + k} of the page at byte {page} claims {n} "
                              f"bytes, past the page's end at byte {body_end} (its length lies)")
            offsets[seen + k] = at + 4
            lengths[seen + k] = n
            at += 4 + n
        if at != body_end:
            raise _Damage(page, f"the page at byte {page} claims {size} bytes but its values "
                          f"end {body_end - at} bytes before (its length lies)")
        seen += count
        pos = body_end
    return offsets, lengths, seen


class _Unsupported(Exception):
    """A column prestage cannot read by byte range (compressed, dictionary-encoded)."""


def _locate_parquet(path: str, image: str, label: Optional[str], first_row: int,
                    out: _Located, file: int, skip: bool) -> int:
    """Adds the samples of a Parquet file to `out`; returns its rows."""
    _pyarrow()
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise _Damage(0, f"not a readable Parquet file ({e})", True) from None
    schema = pf.schema_arrow
    if out.classes is None:
        out.classes = _class_names(_hf_features(schema.metadata), label)
    _column_index(schema, image, path, "image")
    leaf = None
    for j in range(pf.metadata.num_columns):
        if pf.schema.column(j).path in (f"{image}.bytes", image):
            leaf = j
            break
    if leaf is None or pf.schema.column(j).physical_type != "BYTE_ARRAY":
        raise ConfigError(f"from_hf: '{path}': column '{image}' is not an Image feature (struct of "
                          "bytes and path) or binary")
    described = pf.schema.column(leaf)
    if described.max_repetition_level:
        raise ConfigError(f"from_hf: '{path}': column '{described.path}' is repeated")
    if label is not None:
        _column_index(schema, label, path, "label")
        _labels(pa.array([], schema.field(label).type), path, label)  # its type, before any row
    size = os.path.getsize(path)
    row = first_row
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        try:
            groups = pf.metadata.num_row_groups
            for g in range(groups):
                chunk = pf.metadata.row_group(g).column(leaf)
                rows = pf.metadata.row_group(g).num_rows
                start = chunk.data_page_offset
                if chunk.has_dictionary_page and chunk.dictionary_page_offset is not None:
                    start = min(start, chunk.dictionary_page_offset)
                end = start + chunk.total_compressed_size
                where = f"column '{described.path}', rows {row}..{row + rows - 1}"
                try:
                    if chunk.compression != "UNCOMPRESSED":
                        raise _Unsupported(f"column '{described.path}' is compressed "
                                           f"({chunk.compression})")
                    if start < 0 or end > size:
                        raise _Damage(max(start, 0), f"its column chunk at bytes {start}..{end} "
                                      f"lies past the file's end ({size} bytes)")
                    offsets, lengths, _ = _walk_chunk(buf, start, end, chunk.num_values,
                                                      described.max_definition_level,
                                                      described.path)
                    if chunk.num_values != rows:
                        raise _Damage(start, f"its column chunk holds {chunk.num_values} values "
                                      f"for {rows} rows")
                    labels = np.full(rows, -1, np.int64)
                    if label is not None:
                        try:
                            column = pf.read_row_group(g, columns=[label]).column(0)
                        except (pa.ArrowException, OSError) as e:
                            raise _Damage(start, f"its label column '{label}' cannot be read "
                                          f"({e})") from None
                        labels = _labels(column.combine_chunks(), path, label)
                        if len(labels) != rows:
                            raise _Damage(start, f"its label column '{label}' holds "
                                          f"{len(labels)} values for {rows} rows")
                except _Unsupported as e:
                    message = (f"{e}, rows {row}..{row + rows - 1}: prestage reads images by "
                               "byte range from uncompressed PLAIN pages (what datasets writes "
                               "for images from 4.6 on). Rewrite the file so: "
                               + REWRITE.format(src=path))
                    if not skip:
                        raise ConfigError(f"from_hf: '{path}': {message}") from None
                    out.damage.append((file, start, False, message))
                    row += rows
                    continue
                except _Damage as d:
                    reason = f"{where}: {d.reason}"
                    if not skip:
                        raise _decode_error(path, reason) from None
                    out.damage.append((file, d.offset, g == groups - 1, reason))
                    row += rows
                    continue
                missing = offsets < 0
                if missing.any():
                    reason = (f"column '{described.path}', row "
                              f"{row + int(np.flatnonzero(missing)[0])}: no image bytes (a null "
                              "image, or one stored by path only)")
                    if not skip:
                        raise _decode_error(path, reason)
                    for k in np.flatnonzero(missing):
                        out.damage.append((file, start, False,
                                           f"column '{described.path}', row {row + int(k)}: no "
                                           "image bytes"))
                good = ~missing
                out.add(file, offsets[good], lengths[good], labels[good])
                row += rows
        finally:
            if isinstance(buf, mmap.mmap):
                buf.close()
    return row - first_row


def _decode_error(path: str, reason: str) -> DecodeError:  # noqa: N802
    """prestage.DecodeError as the core raises it: `path` and `reason` set."""
    e = DecodeError(f"{path}: {reason}")
    e.path, e.reason = path, reason
    return e


def _rows(path: str, parquet: bool) -> int:
    """The rows of a file, to number the rows of the next (0 where it cannot be read)."""
    pa = _pyarrow()
    try:
        if parquet:
            return int(pa.parquet.ParquetFile(path).metadata.num_rows)
        with pa.memory_map(path, "r") as mm:
            return sum(b.num_rows for b in pa.ipc.open_stream(mm))
    except (pa.ArrowException, OSError):
        return 0


def from_hf(source: _Source, fields: Optional[Dict[str, Optional[str]]] = None, *,
            on_error: str = "raise") -> "_core.Catalog":
    """Samples are the rows of a Hugging Face ``datasets`` set: an image column's bytes at their byte
    ranges of its Arrow or Parquet files, and the label column beside it.

    `source`: a ``datasets.Dataset`` (its Arrow cache files; one without an indices mapping: call
    ``flatten_indices()`` after ``select``/``shuffle``), a ``save_to_disk`` folder (its
    ``data-*.arrow`` files, in state.json's order), a folder of ``.arrow`` or ``.parquet`` files, a
    file, a glob, or a list of them. Arrow files are ``datasets``' IPC streams, read uncompressed;
    Parquet files need the image column stored uncompressed with PLAIN encoding, which ``datasets``
    writes from 4.6 on (``to_parquet``, ``push_to_hub``); another file is refused with the command
    that rewrites it so. pyarrow finds the buffers (it is needed to build the catalog only; the
    loader reads byte ranges).

    `fields`: {"image": the column (an ``Image`` feature, whose ``bytes`` are read, or a binary
    column; "data" may stand for it), "label": an integer or ``ClassLabel`` column, or None (labels
    -1)}; default {"image": "image", "label": "label"}. A ClassLabel's names become the catalog's
    classes.

    Damage (an Arrow file that is truncated or whose batch does not validate, a Parquet page whose
    length or header lies, a row without image bytes): on_error="raise" (the default) raises
    prestage.DecodeError naming the file, the column and the row; on_error="skip" keeps every good
    sample, warns once (RuntimeWarning) and lists the rest in `damage`. A compressed or
    dictionary-encoded Parquet column is a prestage.ConfigError (with "skip", damage: the rest of
    the set is kept).

    >>> ds.save_to_disk("/pfs/sets/flowers")
    >>> cat = prestage.Catalog.from_hf("/pfs/sets/flowers", fields={"image": "image", "label": "label"})
    >>> cat = prestage.Catalog.from_hf(sorted(glob.glob("data/train-*.parquet")), on_error="skip")
    """
    if on_error not in ("raise", "skip"):
        raise ConfigError(f"on_error must be 'raise' or 'skip', got '{on_error}'")
    image: str = "image"
    label: Optional[str] = "label"
    for key, value in (fields or {}).items():
        if key in ("image", "data"):
            if not value:
                raise ConfigError("from_hf: fields needs one 'image' or 'data' entry")
            image = value
        elif key == "label":
            label = value
        else:
            raise ConfigError(f"from_hf: fields takes the keys 'image' or 'data', and 'label', got "
                              f"'{key}'")
    _pyarrow()
    files = [os.path.abspath(p) for p in _files(source)]
    if len(set(files)) != len(files):
        raise ConfigError("from_hf: a file is named twice")
    root = os.path.commonpath([os.path.dirname(p) for p in files])
    located = _Located()
    located.files = [os.path.relpath(p, root) for p in files]
    skip = on_error == "skip"
    row = 0
    label_given = fields is not None and "label" in fields
    for f, path in enumerate(files):
        parquet = path.endswith(".parquet") or _is_parquet(path)
        want_label = label
        if label is not None and not label_given and not _has_column(path, parquet, label):
            want_label = None  # the default label column, where the set has one
        try:
            locate = _locate_parquet if parquet else _locate_arrow
            row += locate(path, image, want_label, row, located, f, skip)
        except _Damage as d:
            if not skip:
                raise _decode_error(path, d.reason) from None
            located.damage.append((f, d.offset, d.rest_of_file, d.reason))
            row += _rows(path, parquet)
    if not located.offsets or sum(len(o) for o in located.offsets) == 0:
        first = f" (first damage: {located.damage[0][3]})" if located.damage else ""
        raise ConfigError(f"from_hf: the files hold no sample with an image in column '{image}'"
                          + first)
    catalog = _core._catalog_from_located(
        root, located.files, np.concatenate(located.index), np.concatenate(located.offsets),
        np.concatenate(located.lengths), np.concatenate(located.labels), located.classes or [],
        located.damage)
    if located.damage:
        file, offset, _, reason = located.damage[0]
        warnings.warn(f"from_hf: {len(located.damage)} damaged samples or pages left out of the "
                      f"catalog (on_error='skip'); the first: '{files[file]}' at byte {offset}: "
                      f"{reason}. Catalog.damage lists them all.", RuntimeWarning, stacklevel=2)
    return catalog


def _is_parquet(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"PAR1"


def _has_column(path: str, parquet: bool, name: str) -> bool:
    pa = _pyarrow()
    try:
        if parquet:
            return name in pa.parquet.ParquetFile(path).schema_arrow.names
        with pa.memory_map(path, "r") as mm:
            return name in pa.ipc.open_stream(mm).schema.names
    except (pa.ArrowException, OSError):
        return True  # the file's own reading says what is wrong with it


__all__ = ["from_hf"]
