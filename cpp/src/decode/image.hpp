// Stage 3, images of any supported format: each image's codec (JPEG, PNG or WebP) chosen by the
// signature of its bytes, never by a file name, and the same outputs for all three (the JPEG
// codec's: a decode at the image's own size, Resize + CenterCrop, a crop box, the random crop).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "decode/jpeg.hpp"
#include "decode/transform.hpp"
#include "prestage/options.hpp"

namespace prestage::detail {

enum class ImageFormat : uint8_t { kUnknown, kJpeg, kPng, kWebp };

// The format whose signature `bytes` begins with: JPEG FF D8 FF, PNG 89 50 4E 47 0D 0A 1A 0A,
// WebP "RIFF" <4 bytes> "WEBP".
ImageFormat sniff_image(std::span<const std::byte> bytes);

// One per reader thread, created once (the JPEG codec's contexts; the PNG and WebP ones at their
// first image). Not thread-safe. Every error is a DecodeError naming `path`.
//
// `any_format` (decode=image): JPEG, PNG and WebP, by signature; anything else is refused. Without
// it (decode=jpeg) every image goes to the JPEG codec, which refuses what is not a JPEG; a PNG or a
// WebP file is refused with a message that names its format and decode=image.
//
// PNG and WebP images are decoded whole to RGB (PngDecoder, WebpDecoder say how grey, palettes,
// 16 bits and alpha become RGB), then resized and cropped by the same resampler, on the same boxes,
// as the JPEG codec's full-scale path: an image gives the same pixels in every format that stores
// them losslessly. The JPEG codec's DCT scaling (decoding at 1/2, 1/4, 1/8) has no counterpart.
class ImageDecoder {
 public:
  ImageDecoder(uint64_t max_pixels, bool any_format);
  ~ImageDecoder();
  ImageDecoder(const ImageDecoder&) = delete;
  ImageDecoder& operator=(const ImageDecoder&) = delete;

  // As JpegDecoder's functions of the same names, for any format this decoder takes.
  ImageHeader header(std::span<const std::byte> image, const std::string& path);
  void decode_exact(std::span<const std::byte> image, ImageSize size, std::span<std::byte> out,
                    const std::string& path);
  void decode_resized(std::span<const std::byte> image, ImageSize size, std::span<std::byte> out,
                      const std::string& path);
  void decode_crop(std::span<const std::byte> image, const CropBox& box, ImageSize size,
                   std::span<std::byte> out, const std::string& path);
  CropBox decode_random_crop(std::span<const std::byte> image, ImageSize size, uint64_t seed,
                             uint64_t epoch, uint64_t index, std::span<std::byte> out,
                             const std::string& path);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace prestage::detail
