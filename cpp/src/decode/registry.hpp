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
#include <string_view>
#include <vector>

#include "decode/image.hpp"
#include "decode/zstd.hpp"
#include "formats/array.hpp"
#include "formats/npz.hpp"
#include "prestage/catalog.hpp"
#include "prestage/options.hpp"

namespace prestage::detail {

struct Codec {
  // decode=image is kJpeg here with any_image set: the two differ only in the formats the image
  // codec takes (ImageDecoder).
  DecodeMode mode = DecodeMode::kJpeg;
  bool any_image = false;
  Catalog::Kind kind = Catalog::Kind::kFiles;
  std::string field;       // kTfrecord: the data feature; kHdf5: the dataset; kArrays: the member
  int64_t axis = 0;        // kHdf5, kArrays: the axis samples are sliced along
  std::string array_name;  // kNpz
  uint64_t max_bytes = 0;
  uint64_t max_pixels = 0;
  std::string raw_dtype;                          // kRaw: LoaderOptions::raw_dtype
  std::optional<std::vector<int64_t>> raw_shape;  // kRaw: LoaderOptions::raw_shape

  // Checks that `options.decode` fits the catalog (ConfigError otherwise).
  static Codec choose(const Catalog& catalog, const LoaderDecodeOptions& options);
  // kRaw: `info` for a sample of `bytes` bytes whose items are `stored` ("|u1": bytes, which
  // raw_dtype may retype; "<f4" or "<i8": a TFRecord float_list or int64_list, which raw_dtype must
  // name if given), shaped by raw_shape. Throws DecodeError naming `path` if they do not fit.
  void raw_array(uint64_t bytes, std::string_view stored, ArrayInfo& info,
                 const std::string& path) const;
  bool arrays() const {
    return mode != DecodeMode::kJpeg && mode != DecodeMode::kLocate &&
           !(mode == DecodeMode::kRaw && kind == Catalog::Kind::kFiles);
  }
};

// What probe() found, kept until fill().
struct ArrayProbe {
  enum class Kind : uint8_t {
    kNpy,
    kZstdNpy,
    kNpz,
    kZstdNpz,
    kHdf5,
    kBytes,
    kSlice,          // a slice of an array stored as it is (a .npy file, a stored .npz member)
    kDeflatedSlice,  // a slice of a deflated .npz member
  };
  ArrayInfo info;
  Kind kind = Kind::kNpy;
  // kNpy, kZstdNpy: the array data's offset in the (decompressed) payload; kSlice: in the file.
  uint64_t data_offset = 0;
  NpzMember member;  // kNpz, kZstdNpz, kDeflatedSlice
  ArrayInfo whole;   // kSlice, kDeflatedSlice: the array the sample is a slice of
  uint32_t axis = 0;
  uint64_t index = 0;
};

class SampleDecoder {
 public:
  explicit SampleDecoder(const Codec& codec);

  // The bytes an image is decoded from, given the sample's bytes as read: the TFRecord feature
  // taken out of its record, a zstd frame decompressed. May point into `sample` or into this
  // decoder.
  std::span<const std::byte> image_payload(std::span<const std::byte> sample,
                                           const std::string& path);
  // As above, a zstd frame decompressed into `unpacked` (grown, never shrunk), so that the image
  // outlives this decoder's next call.
  std::span<const std::byte> image_payload(std::span<const std::byte> sample,
                                           const std::string& path,
                                           std::vector<std::byte>& unpacked);

  // `sample`: the sample's bytes as the tiers serve them (its byte range, or its whole file for a
  // sample of the whole file or a slice of it); `loc`: where the catalog puts it (a slice's index).
  void probe(const ByteSource& sample, const Catalog::Locator& loc, ArrayProbe& probe);
  void fill(const ByteSource& sample, const Catalog::Locator& loc, const ArrayProbe& probe,
            std::span<std::byte> out);

  ImageDecoder image;

 private:
  // The sample's payload as a byte source: `sample` itself, or the TFRecord feature in memory
  // (kRaw: a float_list's or int64_list's values too, their type left in payload_dtype_).
  const ByteSource& payload(const ByteSource& sample, const Catalog::Locator& loc);
  void probe_slice(const ByteSource& sample, const Catalog::Locator& loc, ArrayProbe& probe);

  const Codec& codec_;
  ZstdDecoder zstd_;
  NpzDecoder npz_;
  std::vector<std::byte> record_;    // a TFRecord record
  std::vector<std::byte> packed_;    // compressed bytes
  std::vector<std::byte> unpacked_;  // decompressed bytes
  std::vector<std::byte> scratch_;
  std::vector<std::byte> values_;  // a TFRecord feature's float or int64 values
  std::string_view payload_dtype_ = "|u1";
  std::optional<MemorySource> memory_source_;
};

}  // namespace prestage::detail
