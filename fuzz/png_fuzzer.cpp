// PngDecoder, then ImageDecoder's routes, on one input: see image_fuzz.hpp.
#include <cstddef>
#include <cstdint>
#include <string>

#include "decode/image.hpp"
#include "decode/png.hpp"
#include "image_fuzz.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using prestage::fuzz::kImageMaxPixels;
  static prestage::detail::PngDecoder codec(kImageMaxPixels);
  static prestage::detail::ImageDecoder decoder(kImageMaxPixels, true);
  static const std::string path = "fuzz.png";
  return prestage::fuzz::fuzz_image(data, size, codec, decoder, path);
}
