// The image codecs' harnesses (jpeg_fuzzer.cpp, png_fuzzer.cpp, webp_fuzzer.cpp): the codec's
// header (and, for a codec other than the routes' own, its whole-image decode), then the routes'
// decode_exact, decode_resized (Resize + CenterCrop), decode_crop and decode_random_crop on the
// same bytes: JpegDecoder's own for a JPEG (the training path: libjpeg's partial decode plus the
// resampler), ImageDecoder's for PNG and WebP (the loader's route for them with decode=image).
//
// Input: 4 parameter bytes, then the file. Parameters: output height and width (1..64 each), and
// two bytes that place the crop box and seed the random crop. The box always lies inside the image
// (the caller's contract), so a logic_error from decode_crop is a finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "decode/jpeg.hpp"
#include "decode/transform.hpp"
#include "fuzz_util.hpp"
#include "prestage/error.hpp"

namespace prestage::fuzz {

using prestage::detail::CropBox;
using prestage::detail::ImageHeader;

inline constexpr size_t kImageParams = 4;
// Small enough that a decode stays fast and its buffers small, large enough for real photographs'
// code paths (every DCT scale, several iMCU rows and columns).
inline constexpr uint64_t kImageMaxPixels = uint64_t{1} << 22;

// One input through `codec` (JpegDecoder, PngDecoder, WebpDecoder), then through `decoder`'s routes
// (`codec` itself for a JPEG, an ImageDecoder for the others). Both are the harness's, one per
// thread, reused: as the readers use them.
template <typename Codec, typename Routes>
int fuzz_image(const uint8_t* data, size_t size, Codec& codec, Routes& decoder,
               const std::string& path) {
  if (size < kImageParams) return 0;
  static std::vector<std::byte> out;
  const prestage::ImageSize size_out{1u + data[0] % 64u, 1u + data[1] % 64u};
  const uint8_t where = data[2];
  const uint8_t seed = data[3];
  const auto file = as_bytes(data + kImageParams, size - kImageParams);
  const size_t out_bytes = size_t{size_out.height} * size_out.width * 3;

  ImageHeader header{};
  bool have_header = false;
  try {
    header = codec.header(file, path);
    have_header = true;
    const uint64_t pixels = uint64_t(header.width) * uint64_t(header.height);
    harness_check(header.width > 0 && header.height > 0 && pixels <= kImageMaxPixels,
                  "header() returned a size outside (0, max_pixels]");
  } catch (const prestage::Error&) {
  }
  if (have_header) {
    if constexpr (!std::is_same_v<Codec, Routes>) {
      try {
        out.resize(size_t(header.width) * size_t(header.height) * 3);
        codec.decode(file, out, path);
      } catch (const prestage::Error&) {
      }
    }
    try {
      out.resize(size_t(header.width) * size_t(header.height) * 3);
      decoder.decode_exact(file, {uint32_t(header.height), uint32_t(header.width)}, out, path);
    } catch (const prestage::Error&) {
    }
    try {
      out.resize(out_bytes);
      decoder.decode_resized(file, size_out, out, path);
    } catch (const prestage::Error&) {
    }
    try {
      // A box anywhere inside the image, from 1 pixel up to all of it.
      CropBox box;
      box.width = 1 + int((uint64_t(where & 0x0f) * uint64_t(header.width - 1)) / 15);
      box.height = 1 + int((uint64_t(where >> 4) * uint64_t(header.height - 1)) / 15);
      box.left = int((uint64_t(seed) * uint64_t(header.width - box.width)) / 255);
      box.top = int((uint64_t(seed ^ 0x5a) * uint64_t(header.height - box.height)) / 255);
      box.flip = (seed & 1) != 0;
      out.resize(out_bytes);
      decoder.decode_crop(file, box, size_out, out, path);
    } catch (const prestage::Error&) {
    }
  }
  // Reads its own header, so it runs whatever header() said.
  try {
    out.resize(out_bytes);
    const CropBox box = decoder.decode_random_crop(file, size_out, seed, where, 7, out, path);
    harness_check(box.width > 0 && box.height > 0 && box.left >= 0 && box.top >= 0,
                  "decode_random_crop returned an empty or negative box");
  } catch (const prestage::Error&) {
  }
  return 0;
}

}  // namespace prestage::fuzz
