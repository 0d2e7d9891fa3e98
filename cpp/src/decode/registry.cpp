#include "decode/registry.hpp"

#include <algorithm>

#include "decode/hdf5.hpp"
#include "decode/npy.hpp"
#include "decode/tfrecord.hpp"
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
  }
  return "?";
}

}  // namespace

Codec Codec::choose(const Catalog& catalog, const LoaderOptions& options) {
  Codec c;
  c.mode = options.decode;
  c.kind = catalog.kind();
  c.field = catalog.field();
  c.array_name = options.array_name;
  c.max_bytes = options.max_sample_bytes;
  c.max_pixels = options.max_pixels;
  const bool hdf5_catalog = c.kind == Catalog::Kind::kHdf5;
  if (c.mode != DecodeMode::kLocate && hdf5_catalog != (c.mode == DecodeMode::kHdf5)) {
    throw ConfigError(hdf5_catalog ? std::string("a catalog of HDF5 rows needs decode=hdf5, not ") +
                                         mode_name(c.mode)
                                   : "decode=hdf5 needs a catalog from Catalog::from_hdf5");
  }
  return c;
}

SampleDecoder::SampleDecoder(const Codec& codec) : jpeg(codec.max_pixels), codec_(codec) {}

const ByteSource& SampleDecoder::payload(const SampleLocation& where) {
  const Catalog::Locator& loc = where.locator;
  const uint64_t length = loc.length == Catalog::kWholeFile ? file_size(where.file) : loc.length;
  if (codec_.kind != Catalog::Kind::kTfrecord) {
    file_source_.emplace(where.file, loc.length == Catalog::kWholeFile ? 0 : loc.offset, length,
                         where.path);
    return *file_source_;
  }
  if (length > codec_.max_bytes + kFramingBytes) {
    throw DecodeError(where.path, "TFRecord record of " + std::to_string(length) +
                                      " bytes exceeds max_sample_bytes");
  }
  if (record_.size() < length) record_.resize(length);
  std::span<std::byte> framed(record_.data(), length);
  read_range(where.file, loc.offset, framed);
  const auto data = unframe_record(framed, where.path);
  std::span<const std::byte> value;
  if (!example_bytes(data, codec_.field, value, where.path)) {
    throw DecodeError(where.path, "TFRecord record at byte " + std::to_string(loc.offset) +
                                      " has no feature '" + codec_.field + "'");
  }
  memory_source_.emplace(value, where.path);
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

void SampleDecoder::probe(const SampleLocation& where, ArrayProbe& probe) {
  if (codec_.kind == Catalog::Kind::kHdf5) {
    const Hdf5Dataset d = hdf5::describe(where.file, codec_.field, codec_.max_bytes, where.path);
    if (where.locator.offset >= d.rows) {
      throw DecodeError(where.path, "row " + std::to_string(where.locator.offset) +
                                        " is past the " + std::to_string(d.rows) + " rows of '" +
                                        codec_.field + "'");
    }
    probe.info = d.row;
    probe.kind = ArrayProbe::Kind::kHdf5;
    return;
  }
  const ByteSource& source = payload(where);
  if (codec_.mode == DecodeMode::kRaw) {
    if (source.size() > codec_.max_bytes)
      throw DecodeError(where.path, "sample exceeds max_sample_bytes");
    probe.info = ArrayInfo{};
    probe.info.dtype = "|u1";
    probe.info.item_size = 1;
    probe.info.ndim = 1;
    probe.info.shape[0] = source.size();
    probe.info.bytes = source.size();
    probe.kind = ArrayProbe::Kind::kBytes;
    return;
  }
  const bool npz = codec_.mode == DecodeMode::kNpz;
  std::byte magic[8] = {};
  const size_t magic_len = static_cast<size_t>(std::min<uint64_t>(sizeof(magic), source.size()));
  source.read(0, std::span(magic, magic_len));
  const std::span<const std::byte> head(magic, magic_len);
  if (is_zstd_frame(head)) {
    const auto packed = read_span(source, 0, source.size(), packed_);
    if (npz) {
      // A zip archive needs random access: decompress all of it (again in fill()).
      const auto archive = zstd_.decompress(packed, unpacked_, codec_.max_bytes, where.path);
      const MemorySource inner(archive, where.path);
      probe.member = npz_.probe(inner, codec_.array_name, probe.info, codec_.max_bytes);
      probe.kind = ArrayProbe::Kind::kZstdNpz;
      return;
    }
    // Decompress only as much as the .npy header needs.
    size_t want = kHeaderPrefix;
    while (true) {
      if (scratch_.size() < want) scratch_.resize(want);
      const size_t got =
          zstd_.decompress_prefix(packed, std::span(scratch_.data(), want), where.path);
      uint64_t needed = 0;
      const uint64_t offset = parse_npy_header(std::span(scratch_.data(), got), probe.info,
                                               codec_.max_bytes, where.path, &needed);
      if (offset != 0) {
        probe.data_offset = offset;
        probe.kind = ArrayProbe::Kind::kZstdNpy;
        return;
      }
      if (got < want) throw DecodeError(where.path, "truncated .npy header in zstd frame");
      want = static_cast<size_t>(needed);
    }
  }
  if (npz) {
    if (!is_zip(head)) throw DecodeError(where.path, "not a .npz file (no zip header)");
    probe.member = npz_.probe(source, codec_.array_name, probe.info, codec_.max_bytes);
    probe.kind = ArrayProbe::Kind::kNpz;
    return;
  }
  if (!is_npy(head)) {
    throw DecodeError(where.path, is_zip(head)
                                      ? "a .npz archive, not a .npy file (use decode='npz')"
                                      : "not a .npy file (bad magic)");
  }
  probe.data_offset = probe_npy(source, probe.info, codec_.max_bytes, scratch_);
  probe.kind = ArrayProbe::Kind::kNpy;
}

void SampleDecoder::fill(const SampleLocation& where, const ArrayProbe& probe,
                         std::span<std::byte> out) {
  if (probe.kind == ArrayProbe::Kind::kHdf5) {
    hdf5::read_row(where.file, codec_.field, where.locator.offset, probe.info, out, where.path);
    return;
  }
  const ByteSource& source = payload(where);
  switch (probe.kind) {
    case ArrayProbe::Kind::kBytes:
      if (source.size() != out.size()) throw DecodeError(where.path, "the sample changed size");
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
        zstd_.decompress_into(packed, probe.data_offset, out, where.path);
        return;
      }
      if (unpacked_.size() < probe.info.bytes) unpacked_.resize(probe.info.bytes);
      zstd_.decompress_into(packed, probe.data_offset,
                            std::span(unpacked_.data(), probe.info.bytes), where.path);
      fortran_to_c(unpacked_.data(), out.data(), probe.info);
      return;
    }
    case ArrayProbe::Kind::kZstdNpz: {
      const auto packed = read_span(source, 0, source.size(), packed_);
      const auto archive = zstd_.decompress(packed, unpacked_, codec_.max_bytes, where.path);
      const MemorySource inner(archive, where.path);
      npz_.decode(inner, probe.member, probe.info, out);
      return;
    }
    case ArrayProbe::Kind::kHdf5:
      break;
  }
}

}  // namespace prestage::detail
