// Stage 3, JPEG codec (libjpeg-turbo). The only file that includes turbojpeg.h and jpeglib.h is
// jpeg.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "decode/transform.hpp"
#include "prestage/options.hpp"

namespace prestage::detail {

struct ImageHeader {
  int width = 0;
  int height = 0;
};

// One per reader thread, created once and reused for every image (a TurboJPEG handle plus scratch
// buffers). Not thread-safe. Every error is a DecodeError naming `path`.
class JpegDecoder {
 public:
  explicit JpegDecoder(uint64_t max_pixels);
  ~JpegDecoder();
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;

  // Reads the header only. Refuses data that is not a JPEG and images over max_pixels.
  ImageHeader header(std::span<const std::byte> jpeg, const std::string& path);

  // Decodes to RGB (height x width x 3, rows contiguous) into `out`, which holds exactly that many
  // bytes. The image must be exactly `size`; any other size is a DecodeError.
  void decode_exact(std::span<const std::byte> jpeg, ImageSize size, std::span<std::byte> out,
                    const std::string& path);

  // Resizes the shorter side to cover `size`, then crops the centre (torchvision Resize +
  // CenterCrop), writing size.height x size.width x 3 bytes into `out`. Uses libjpeg-turbo's DCT
  // scaling (decode at 1/2, 1/4 or 1/8) when the image is at least twice as large as needed.
  void decode_resized(std::span<const std::byte> jpeg, ImageSize size, std::span<std::byte> out,
                      const std::string& path);

  // Decodes `box` of the image, resizes it to `size` with the same antialiased bilinear filter (as
  // torchvision's resized_crop on a PIL image: crop, then resize; pixels outside the box are not
  // used), flips it if box.flip, and writes size.height x size.width x 3 bytes into `out`. Only the
  // box's rows and iMCU columns are decoded (libjpeg's jpeg_skip_scanlines and
  // jpeg_crop_scanline), at 1/2, 1/4 or 1/8 scale when the box is at least that many times the
  // output. The file must end with its end-of-image marker (truncation is refused even when the
  // box lies before the missing part); corrupt data outside the decoded rows goes unnoticed.
  void decode_crop(std::span<const std::byte> jpeg, const CropBox& box, ImageSize size,
                   std::span<std::byte> out, const std::string& path);

  // The training path: the box is drawn by random_resized_crop(seed, epoch, index, image height,
  // image width), then decoded as decode_crop does. Returns the box.
  CropBox decode_random_crop(std::span<const std::byte> jpeg, ImageSize size, uint64_t seed,
                             uint64_t epoch, uint64_t index, std::span<std::byte> out,
                             const std::string& path);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace prestage::detail
