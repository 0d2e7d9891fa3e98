// PngDecoder and ImageDecoder on one input: see image_fuzz.hpp.
#include <cstddef>
#include <cstdint>

#include "decode/png.hpp"
#include "image_fuzz.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "fuzz.png";
  return prestage::fuzz::fuzz_image<prestage::detail::PngDecoder>(data, size, path);
}
