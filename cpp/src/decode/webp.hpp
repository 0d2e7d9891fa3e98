// Stage 3, WebP codec (libwebp). The only file that includes webp/decode.h is webp.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "decode/jpeg.hpp"

namespace prestage::detail {

// Whether `bytes` begins as a WebP file does: "RIFF", 4 size bytes, "WEBP".
bool is_webp(std::span<const std::byte> bytes);

// One per reader thread, created once and reused for every image (libwebp's decoder settings).
// Not thread-safe. Every error is a DecodeError naming `path`.
//
// Lossy and lossless images alike decode to 8-bit RGB with libwebp's default (fancy) upsampling,
// as Pillow's do; alpha is dropped (as Pillow's convert("RGB") drops it). Animated WebP files are
// refused.
class WebpDecoder {
 public:
  explicit WebpDecoder(uint64_t max_pixels);
  ~WebpDecoder();
  WebpDecoder(const WebpDecoder&) = delete;
  WebpDecoder& operator=(const WebpDecoder&) = delete;

  // Reads the header only. Refuses data that is not a WebP file, animations and images over
  // max_pixels.
  ImageHeader header(std::span<const std::byte> webp, const std::string& path);

  // Decodes the whole image to RGB into `out`, which holds exactly height x width x 3 bytes (the
  // header's size; another size is a logic_error). A truncated or corrupt bitstream is an error.
  void decode(std::span<const std::byte> webp, std::span<std::byte> out, const std::string& path);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace prestage::detail
