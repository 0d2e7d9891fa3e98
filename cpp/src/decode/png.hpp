// Stage 3, PNG codec (libpng 1.6). The only file that includes png.h is png.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "decode/jpeg.hpp"

namespace prestage::detail {

// Whether `bytes` begins with the PNG signature (89 50 4E 47 0D 0A 1A 0A).
bool is_png(std::span<const std::byte> bytes);

// One per reader thread, reused for every image (libpng's read structures are made per image:
// libpng cannot reuse them). Not thread-safe. Every error is a DecodeError naming `path`.
//
// Output is 8-bit RGB whatever the file holds: grey is replicated to the three channels, palettes
// are looked up, 1, 2 and 4-bit samples widened, 16-bit samples keep their high byte (Pillow's
// RGB, RGBA and LA modes do the same), and alpha (an alpha channel, or a tRNS chunk) is dropped, as
// Pillow's convert("RGB") drops it. Gamma, colour profiles and sBIT are not applied (Pillow does
// not apply them either). Interlaced files are read as any other.
class PngDecoder {
 public:
  explicit PngDecoder(uint64_t max_pixels);
  ~PngDecoder();
  PngDecoder(const PngDecoder&) = delete;
  PngDecoder& operator=(const PngDecoder&) = delete;

  // Reads the header (IHDR) only. Refuses data that is not a PNG and images over max_pixels.
  ImageHeader header(std::span<const std::byte> png, const std::string& path);

  // Decodes the whole image to RGB into `out`, which holds exactly height x width x 3 bytes (the
  // header's size; another size is a logic_error). The file must be whole: every chunk up to IEND
  // read, every critical chunk's CRC and the image data's zlib checksum checked (a bad CRC in an
  // ancillary chunk only drops that chunk, as libpng does).
  void decode(std::span<const std::byte> png, std::span<std::byte> out, const std::string& path);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace prestage::detail
