// Stage 3's codec registry: the codec is chosen once per loader from decode= and the catalog's kind
// (whole files or byte ranges, TFRecord records, HDF5 rows), and each reader thread holds one
// SampleDecoder with every codec context it may need, created once.
//
// Arrays (npy, npz, HDF5, raw TFRecord features) are decoded in two phases, so that a batch's
// buffer is sized once and each array is written straight into its place: probe() reads only
// headers (a .npy header, a zip directory, a zstd frame's first bytes, HDF5 metadata) and fill()
// decodes the data into the batch buffer.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "decode/array.hpp"
#include "decode/jpeg.hpp"
#include "decode/npz.hpp"
#include "decode/zstd.hpp"
#include "prestage/catalog.hpp"
#include "prestage/options.hpp"

namespace prestage::detail {

struct Codec {
  DecodeMode mode = DecodeMode::kJpeg;
  Catalog::Kind kind = Catalog::Kind::kFiles;
  std::string field;       // kTfrecord: the data feature; kHdf5: the dataset
  std::string array_name;  // kNpz
  uint64_t max_bytes = 0;
  uint64_t max_pixels = 0;

  // Checks that `options.decode` fits the catalog (ConfigError otherwise).
  static Codec choose(const Catalog& catalog, const LoaderOptions& options);
  bool arrays() const {
    return mode != DecodeMode::kJpeg && mode != DecodeMode::kLocate &&
           !(mode == DecodeMode::kRaw && kind == Catalog::Kind::kFiles);
  }
};

// Where one sample is read from: the copy to read (staged or source) and the name errors give.
struct SampleLocation {
  FileRef file;
  const std::string& path;
  Catalog::Locator locator;
};

// What probe() found, kept until fill().
struct ArrayProbe {
  enum class Kind : uint8_t { kNpy, kZstdNpy, kNpz, kZstdNpz, kHdf5, kBytes };
  ArrayInfo info;
  Kind kind = Kind::kNpy;
  uint64_t data_offset =
      0;             // kNpy, kZstdNpy: the array data's offset in the (decompressed) payload
  NpzMember member;  // kNpz, kZstdNpz
};

class SampleDecoder {
 public:
  explicit SampleDecoder(const Codec& codec);

  // The bytes a JPEG is decoded from, given the sample's bytes as read: the TFRecord feature taken
  // out of its record, a zstd frame decompressed. May point into `sample` or into this decoder.
  std::span<const std::byte> image_payload(std::span<const std::byte> sample,
                                           const std::string& path);
  // As above, a zstd frame decompressed into `unpacked` (grown, never shrunk), so that the JPEG
  // outlives this decoder's next call.
  std::span<const std::byte> image_payload(std::span<const std::byte> sample,
                                           const std::string& path,
                                           std::vector<std::byte>& unpacked);

  void probe(const SampleLocation& where, ArrayProbe& probe);
  void fill(const SampleLocation& where, const ArrayProbe& probe, std::span<std::byte> out);

  JpegDecoder jpeg;

 private:
  // The sample's payload as a byte source: the file range, or the TFRecord feature in memory.
  const ByteSource& payload(const SampleLocation& where);

  const Codec& codec_;
  ZstdDecoder zstd_;
  NpzDecoder npz_;
  std::vector<std::byte> record_;    // a TFRecord record
  std::vector<std::byte> packed_;    // compressed bytes
  std::vector<std::byte> unpacked_;  // decompressed bytes
  std::vector<std::byte> scratch_;
  std::optional<FileSource> file_source_;
  std::optional<MemorySource> memory_source_;
};

}  // namespace prestage::detail
