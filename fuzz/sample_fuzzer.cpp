// The codec registry: SampleDecoder as a reader thread uses it, on a sample read from a file.
// This is where the codecs compose: a zstd frame holding a .npy (its header decompressed by
// prefix, then decompress_into) or a .npz (decompressed whole), a TFRecord record whose feature is
// the array or the image, and probe() followed by fill() into a buffer of the probed size.
//
// Input: one selector byte, then the sample. Selector bits 0-2 pick the codec and catalog kind:
//   0 npy, files        1 npz, files        2 npy, TFRecord     3 npz, TFRecord
//   4 raw, TFRecord     5 jpeg, files       6 jpeg, TFRecord    7 npz member "x", files
// For a TFRecord kind the sample is the record's tf.train.Example (feature "x"), framed with
// correct CRCs by the harness unless selector bit 3 is set (then it is the framed record itself).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "decode/registry.hpp"
#include "fuzz_util.hpp"
#include "prestage/error.hpp"
#include "util/byte_source.hpp"

namespace {

using prestage::Catalog;
using prestage::DecodeMode;
using prestage::detail::ArrayProbe;
using prestage::detail::Codec;
using prestage::detail::FileSource;
using prestage::detail::SampleDecoder;
using prestage::fuzz::harness_check;

constexpr uint64_t kMaxBytes = uint64_t{1} << 22;   // max_sample_bytes
constexpr uint64_t kMaxPixels = uint64_t{1} << 20;  // max_pixels

struct Choice {
  DecodeMode mode;
  Catalog::Kind kind;
  const char* array_name;
};

constexpr Choice kChoices[8] = {
    {DecodeMode::kNpy, Catalog::Kind::kFiles, ""},
    {DecodeMode::kNpz, Catalog::Kind::kFiles, ""},
    {DecodeMode::kNpy, Catalog::Kind::kTfrecord, ""},
    {DecodeMode::kNpz, Catalog::Kind::kTfrecord, ""},
    {DecodeMode::kRaw, Catalog::Kind::kTfrecord, ""},
    {DecodeMode::kJpeg, Catalog::Kind::kFiles, ""},
    {DecodeMode::kJpeg, Catalog::Kind::kTfrecord, ""},
    {DecodeMode::kNpz, Catalog::Kind::kFiles, "x"},
};

// One SampleDecoder per choice, created once (a reader thread holds one per loader).
struct Decoders {
  Codec codecs[8];
  std::vector<std::unique_ptr<SampleDecoder>> decoders;
  Decoders() {
    for (int i = 0; i < 8; ++i) {
      codecs[i].mode = kChoices[i].mode;
      codecs[i].kind = kChoices[i].kind;
      codecs[i].field = "x";
      codecs[i].array_name = kChoices[i].array_name;
      codecs[i].max_bytes = kMaxBytes;
      codecs[i].max_pixels = kMaxPixels;
      decoders.push_back(std::make_unique<SampleDecoder>(codecs[i]));
    }
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static Decoders all;
  static const std::string file = (prestage::fuzz::scratch_dir() / "sample").string();
  static const std::string path = "fuzz-sample";
  static std::vector<std::byte> out;
  const int which = data[0] & 7;
  const Codec& codec = all.codecs[which];
  SampleDecoder& decoder = *all.decoders[which];
  const auto body = prestage::fuzz::as_bytes(data + 1, size - 1);

  std::vector<std::byte> sample;
  if (codec.kind == Catalog::Kind::kTfrecord && (data[0] & 8) == 0) {
    sample = prestage::fuzz::frame_record(body);
  } else {
    sample.assign(body.begin(), body.end());
  }
  prestage::fuzz::write_file(file, sample);
  const Catalog::Locator locator{
      0, 0, codec.kind == Catalog::Kind::kTfrecord ? sample.size() : Catalog::kWholeFile};
  const FileSource where = FileSource::sample(file, locator, Catalog::kUnknownSize, path);

  if (codec.mode == DecodeMode::kJpeg) {
    try {
      const auto jpeg = decoder.image_payload(sample, path);
      const prestage::ImageSize size_out{24, 32};
      out.resize(size_t{24} * 32 * 3);
      decoder.image.decode_resized(jpeg, size_out, out, path);
    } catch (const prestage::Error&) {
    }
    return 0;
  }
  try {
    ArrayProbe probe;
    decoder.probe(where, locator, probe);
    harness_check(probe.info.bytes <= kMaxBytes, "probe: sample over max_sample_bytes");
    out.resize(static_cast<size_t>(probe.info.bytes));
    decoder.fill(where, locator, probe, out);
  } catch (const prestage::Error&) {
  }
  return 0;
}
