// JpegDecoder's header and routes on one input: see image_fuzz.hpp.
#include <cstddef>
#include <cstdint>
#include <string>

#include "decode/jpeg.hpp"
#include "image_fuzz.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static prestage::detail::JpegDecoder decoder(prestage::fuzz::kImageMaxPixels);
  static const std::string path = "fuzz.jpg";
  return prestage::fuzz::fuzz_image(data, size, decoder, decoder, path);
}
