#include "decode/registry.hpp"

#include <algorithm>

#include "formats/hdf5.hpp"
#include "formats/npy.hpp"
#include "formats/tfrecord.hpp"
#include "prestage/error.hpp"
#include "util/file_io.hpp"

namespace prestage::detail {
namespace {

constexpr size_t kHeaderPrefix = 1 << 16;

const char* mode_name(DecodeMode mode) {
  switch (mode) {
    case DecodeMode::kJpeg:
      return "jpeg";
    case DecodeMode::kRaw:
      return "raw";
    case DecodeMode::kNpy:
      return "npy";
    case DecodeMode::kNpz:
      return "npz";
    case DecodeMode::kHdf5:
      return "hdf5";
    case DecodeMode::kLocate:
      return "locate";
    case DecodeMode::kImage:
      return "image";
  }
  return "?";
}

}  // namespace

Codec Codec::choose(const Catalog& catalog, const LoaderDecodeOptions& options) {
  Codec c;
  c.mode = options.decode;
  c.kind = catalog.kind();
  c.field = catalog.field();
  c.axis = catalog.axis();
  c.array_name = options.array_name;
  c.max_bytes = options.max_sample_bytes;
  c.max_pixels = options.max_pixels;
  c.raw_dtype = options.raw_dtype;
  c.raw_shape = options.raw_shape;
  const bool hdf5_catalog = c.kind == Catalog::Kind::kHdf5;
  if (c.mode != DecodeMode::kLocate && hdf5_catalog != (c.mode == DecodeMode::kHdf5)) {
    throw ConfigError(hdf5_catalog ? std::string("a catalog of HDF5 rows needs decode=hdf5, not ") +
                                         mode_name(c.mode)
                                   : "decode=hdf5 needs a catalog from Catalog::from_hdf5");
  }
  if (c.kind == Catalog::Kind::kArrays) {
    // Each file's kind (.npy or .npz) is read from its first bytes: either mode reads both.
    if (c.mode != DecodeMode::kNpy && c.mode != DecodeMode::kNpz && c.mode != DecodeMode::kLocate) {
      throw ConfigError(std::string("a catalog of array slices needs decode=npy, not ") +
                        mode_name(c.mode));
    }
    if (!c.array_name.empty()) {
      throw ConfigError(
          "array_name does not apply to a catalog of array slices: its member is "
          "named when it is built (Catalog::from_arrays)");
    }
  }
  if (c.mode == DecodeMode::kImage) {
    c.mode = DecodeMode::kJpeg;
    c.any_image = true;
  }
  return c;
}

void Codec::raw_array(uint64_t bytes, std::string_view stored, ArrayInfo& info,
                      const std::string& path) const {
  const bool retyped = !raw_dtype.empty() && stored == "|u1";
  if (!raw_dtype.empty() && !retyped && raw_dtype != stored) {
    throw DecodeError(path, "its values are of type '" + std::string(stored) +
                                "', not raw_dtype '" + raw_dtype + "'");
  }
  const std::string_view dtype = retyped ? std::string_view(raw_dtype) : stored;
  std::string why;
  const uint64_t item = dtype_item_size(dtype, why);  // validate() checked raw_dtype
  if (bytes % item != 0) {
    throw DecodeError(path, "its " + std::to_string(bytes) + " bytes are not a whole number of '" +
                                std::string(dtype) + "' items of " + std::to_string(item) +
                                " bytes");
  }
  info = ArrayInfo{};
  info.dtype = dtype;
  info.item_size = static_cast<size_t>(item);
  info.bytes = bytes;
  const uint64_t items = bytes / item;
  if (!raw_shape) {
    info.ndim = 1;
    info.shape[0] = items;
    return;
  }
  // validate() allows at most one -1, no other negative and a product within max_sample_bytes.
  info.ndim = static_cast<uint32_t>(raw_shape->size());
  uint64_t known = 1;
  int inferred = -1;
  for (uint32_t d = 0; d < info.ndim; ++d) {
    const int64_t n = (*raw_shape)[d];
    if (n < 0) {
      inferred = static_cast<int>(d);
    } else {
      info.shape[d] = static_cast<uint64_t>(n);
      known *= info.shape[d];
    }
  }
  if (inferred >= 0 && known != 0 && items % known == 0) {
    info.shape[inferred] = items / known;
  } else if (inferred >= 0 || known != items) {
    std::string shape;
    for (const int64_t n : *raw_shape) shape += (shape.empty() ? "" : ", ") + std::to_string(n);
    throw DecodeError(path, "its " + std::to_string(items) + " items of '" + info.dtype + "' (" +
                                std::to_string(bytes) + " bytes) do not fit raw_shape (" + shape +
                                (raw_shape->size() == 1 ? ",)" : ")"));
  }
}

SampleDecoder::SampleDecoder(const Codec& codec)
    : image(codec.max_pixels, codec.any_image), codec_(codec) {}

const ByteSource& SampleDecoder::payload(const ByteSource& sample, const Catalog::Locator& loc) {
  payload_dtype_ = "|u1";
  if (codec_.kind != Catalog::Kind::kTfrecord) return sample;
  const std::string& path = sample.path();
  if (sample.size() > codec_.max_bytes + kFramingBytes) {
    throw DecodeError(path, "TFRecord record of " + std::to_string(sample.size()) +
                                " bytes exceeds max_sample_bytes");
  }
  const auto data = unframe_record(sample.all(record_), path);
  std::span<const std::byte> value;
  if (codec_.mode == DecodeMode::kRaw ? !example_values(data, codec_.field, codec_.max_bytes,
                                                        values_, value, payload_dtype_, path)
                                      : !example_bytes(data, codec_.field, value, path)) {
    throw DecodeError(path, "TFRecord record at byte " + std::to_string(loc.offset) +
                                " has no feature '" + codec_.field + "'");
  }
  memory_source_.emplace(value, path);
  return *memory_source_;
}

std::span<const std::byte> SampleDecoder::image_payload(std::span<const std::byte> sample,
                                                        const std::string& path) {
  return image_payload(sample, path, unpacked_);
}

std::span<const std::byte> SampleDecoder::image_payload(std::span<const std::byte> sample,
                                                        const std::string& path,
                                                        std::vector<std::byte>& unpacked) {
  std::span<const std::byte> bytes = sample;
  if (codec_.kind == Catalog::Kind::kTfrecord) {
    const auto data = unframe_record(sample, path);
    if (!example_bytes(data, codec_.field, bytes, path)) {
      throw DecodeError(path, "TFRecord record has no feature '" + codec_.field + "'");
    }
  }
  if (is_zstd_frame(bytes)) {
    // A JPEG is never larger than its pixels (plus headers): bound the output by max_pixels.
    bytes = zstd_.decompress(bytes, unpacked, codec_.max_pixels * 4 + (1 << 20), path);
  }
  return bytes;
}

void SampleDecoder::probe(const ByteSource& sample, const Catalog::Locator& loc,
                          ArrayProbe& probe) {
  const std::string& path = sample.path();
  if (codec_.kind == Catalog::Kind::kHdf5) {
    const Hdf5Dataset d =
        sample.file() == nullptr
            ? hdf5::describe(sample.memory(), codec_.field, codec_.axis, codec_.max_bytes, path)
            : hdf5::describe(*sample.file(), codec_.field, codec_.axis, codec_.max_bytes, path);
    if (loc.offset >= d.rows) {
      throw DecodeError(path, "slice " + std::to_string(loc.offset) + " is past the " +
                                  std::to_string(d.rows) + " along axis " + std::to_string(d.axis) +
                                  " of '" + codec_.field + "'");
    }
    probe.info = d.row;
    probe.kind = ArrayProbe::Kind::kHdf5;
    return;
  }
  if (codec_.kind == Catalog::Kind::kArrays) {
    probe_slice(sample, loc, probe);
    return;
  }
  const ByteSource& source = payload(sample, loc);
  if (codec_.mode == DecodeMode::kRaw) {
    if (source.size() > codec_.max_bytes)
      throw DecodeError(path, "sample exceeds max_sample_bytes");
    codec_.raw_array(source.size(), payload_dtype_, probe.info, path);
    probe.kind = ArrayProbe::Kind::kBytes;
    return;
  }
  const bool npz = codec_.mode == DecodeMode::kNpz;
  std::array<std::byte, 8> magic;
  const std::span<const std::byte> head = read_magic(source, magic);
  if (is_zstd_frame(head)) {
    const auto packed = read_span(source, 0, source.size(), packed_);
    if (npz) {
      // A zip archive needs random access: decompress all of it (again in fill()).
      const auto archive = zstd_.decompress(packed, unpacked_, codec_.max_bytes, path);
      const MemorySource inner(archive, path);
      probe.member = npz_.probe(inner, codec_.array_name, probe.info, codec_.max_bytes);
      probe.kind = ArrayProbe::Kind::kZstdNpz;
      return;
    }
    // Decompress only as much as the .npy header needs.
    size_t want = kHeaderPrefix;
    while (true) {
      if (scratch_.size() < want) scratch_.resize(want);
      const size_t got = zstd_.decompress_prefix(packed, std::span(scratch_.data(), want), path);
      uint64_t needed = 0;
      const uint64_t offset = parse_npy_header(std::span(scratch_.data(), got), probe.info,
                                               codec_.max_bytes, path, &needed);
      if (offset != 0) {
        probe.data_offset = offset;
        probe.kind = ArrayProbe::Kind::kZstdNpy;
        return;
      }
      if (got < want) throw DecodeError(path, "truncated .npy header in zstd frame");
      want = static_cast<size_t>(needed);
    }
  }
  if (npz) {
    if (!is_zip(head)) throw DecodeError(path, "not a .npz file (no zip header)");
    probe.member = npz_.probe(source, codec_.array_name, probe.info, codec_.max_bytes);
    probe.kind = ArrayProbe::Kind::kNpz;
    return;
  }
  if (!is_npy(head)) {
    throw DecodeError(path, is_zip(head) ? "a .npz archive, not a .npy file (use decode='npz')"
                                         : "not a .npy file (bad magic)");
  }
  probe.data_offset = probe_npy(source, probe.info, codec_.max_bytes, scratch_);
  probe.kind = ArrayProbe::Kind::kNpy;
}

void SampleDecoder::probe_slice(const ByteSource& sample, const Catalog::Locator& loc,
                                ArrayProbe& probe) {
  const std::string& path = sample.path();
  const ByteSource& source = payload(sample, loc);
  ArrayInfo& whole = probe.whole;
  // The whole array is bounded by the file that holds it, not by max_sample_bytes: only the slice
  // is decoded (but a deflated member is inflated whole).
  const ArrayFile file =
      probe_array_file(source, codec_.field, whole, ~uint64_t{0}, npz_, scratch_);
  probe.data_offset = file.data_offset;
  probe.kind = ArrayProbe::Kind::kSlice;
  if (file.member) {
    probe.member = *file.member;
    if (probe.member.deflated) {
      probe.kind = ArrayProbe::Kind::kDeflatedSlice;
      if (whole.bytes > codec_.max_bytes) {
        throw DecodeError(path, "a deflated member is inflated whole to take a slice, and its " +
                                    std::to_string(whole.bytes) +
                                    " bytes exceed max_sample_bytes (" +
                                    std::to_string(codec_.max_bytes) + ")");
      }
    }
  }
  const auto axis = resolve_axis(codec_.axis, whole.ndim);
  if (!axis) {
    throw DecodeError(path, "its array has " + std::to_string(whole.ndim) +
                                " dimensions: no axis " + std::to_string(codec_.axis));
  }
  if (loc.offset >= whole.shape[*axis]) {
    throw DecodeError(path, "slice " + std::to_string(loc.offset) + " is past the " +
                                std::to_string(whole.shape[*axis]) + " along axis " +
                                std::to_string(*axis));
  }
  probe.axis = *axis;
  probe.index = loc.offset;
  probe.info = slice_info(whole, *axis, codec_.max_bytes, path);
}

void SampleDecoder::fill(const ByteSource& sample, const Catalog::Locator& loc,
                         const ArrayProbe& probe, std::span<std::byte> out) {
  const std::string& path = sample.path();
  if (probe.kind == ArrayProbe::Kind::kHdf5) {
    if (sample.file() == nullptr) {
      hdf5::read_row(sample.memory(), codec_.field, codec_.axis, loc.offset, probe.info, out, path);
    } else {
      hdf5::read_row(*sample.file(), codec_.field, codec_.axis, loc.offset, probe.info, out, path);
    }
    return;
  }
  const ByteSource& source = payload(sample, loc);
  switch (probe.kind) {
    case ArrayProbe::Kind::kBytes:
      if (source.size() != out.size()) throw DecodeError(path, "the sample changed size");
      source.read(0, out);
      return;
    case ArrayProbe::Kind::kNpy:
      decode_npy(source, probe.info, probe.data_offset, out, scratch_);
      return;
    case ArrayProbe::Kind::kNpz:
      npz_.decode(source, probe.member, probe.info, out);
      return;
    case ArrayProbe::Kind::kZstdNpy: {
      const auto packed = read_span(source, 0, source.size(), packed_);
      if (!probe.info.fortran || probe.info.ndim <= 1) {
        zstd_.decompress_into(packed, probe.data_offset, out, path);
        return;
      }
      if (unpacked_.size() < probe.info.bytes) unpacked_.resize(probe.info.bytes);
      zstd_.decompress_into(packed, probe.data_offset,
                            std::span(unpacked_.data(), probe.info.bytes), path);
      fortran_to_c(unpacked_.data(), out.data(), probe.info);
      return;
    }
    case ArrayProbe::Kind::kZstdNpz: {
      const auto packed = read_span(source, 0, source.size(), packed_);
      const auto archive = zstd_.decompress(packed, unpacked_, codec_.max_bytes, path);
      const MemorySource inner(archive, path);
      npz_.decode(inner, probe.member, probe.info, out);
      return;
    }
    case ArrayProbe::Kind::kSlice:
      read_slice(source, probe.data_offset, probe.whole, probe.axis, probe.index, out, scratch_);
      return;
    case ArrayProbe::Kind::kDeflatedSlice: {
      if (unpacked_.size() < probe.whole.bytes) unpacked_.resize(probe.whole.bytes);
      const std::span<std::byte> all(unpacked_.data(), probe.whole.bytes);
      npz_.decode(source, probe.member, probe.whole, all);  // in C order, CRC checked
      ArrayInfo c_order = probe.whole;
      c_order.fortran = false;
      read_slice(MemorySource(all, path), 0, c_order, probe.axis, probe.index, out, scratch_);
      return;
    }
    case ArrayProbe::Kind::kHdf5:
      break;
  }
}

}  // namespace prestage::detail
