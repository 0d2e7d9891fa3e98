#include "decode/image.hpp"

#include <algorithm>
#include <climits>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "decode/png.hpp"
#include "decode/resize.hpp"
#include "decode/webp.hpp"
#include "prestage/error.hpp"

namespace prestage::detail {
namespace {

constexpr size_t kRgbBytes = 3;

const char* format_name(ImageFormat format) {
  switch (format) {
    case ImageFormat::kJpeg:
      return "JPEG";
    case ImageFormat::kPng:
      return "PNG";
    case ImageFormat::kWebp:
      return "WebP";
    case ImageFormat::kUnknown:
      break;
  }
  return "unknown";
}

// Python's round() of excess / 2 (half to even): torchvision's CenterCrop computes its offsets so
// (as the JPEG codec does).
int64_t centre_offset(int64_t excess) {
  const int64_t half = excess / 2;
  return (excess % 2 == 1 && half % 2 == 1) ? half + 1 : half;
}

void check_output(ImageSize size, std::span<std::byte> out, const char* what) {
  if (size.height == 0 || size.width == 0 || size.height > INT_MAX || size.width > INT_MAX ||
      out.size() != uint64_t{size.height} * uint64_t{size.width} * kRgbBytes) {
    throw std::logic_error(std::string("ImageDecoder::") + what + ": output size out of range");
  }
}

}  // namespace

ImageFormat sniff_image(std::span<const std::byte> bytes) {
  if (bytes.size() >= 3 && bytes[0] == std::byte{0xFF} && bytes[1] == std::byte{0xD8} &&
      bytes[2] == std::byte{0xFF}) {
    return ImageFormat::kJpeg;
  }
  if (is_png(bytes)) return ImageFormat::kPng;
  if (is_webp(bytes)) return ImageFormat::kWebp;
  return ImageFormat::kUnknown;
}

struct ImageDecoder::Impl {
  Impl(uint64_t max_pixels, bool any_format)
      : max_pixels(max_pixels), any_format(any_format), jpeg(max_pixels) {}

  uint64_t max_pixels;
  bool any_format;
  JpegDecoder jpeg;
  std::optional<PngDecoder> png;
  std::optional<WebpDecoder> webp;
  std::vector<std::byte> decoded;  // a PNG or WebP image at its own size
  ResizeScratch resize;

  // The format `image` is decoded as: kJpeg for every image without any_format (the JPEG codec
  // refuses what is not one), but for PNG and WebP, named in the error.
  ImageFormat route(std::span<const std::byte> image, const std::string& path) {
    const ImageFormat format = sniff_image(image);
    if (!any_format) {
      if (format == ImageFormat::kPng || format == ImageFormat::kWebp) {
        throw DecodeError(path, std::string("a ") + format_name(format) +
                                    " image: decode=jpeg reads JPEG only (decode=image reads "
                                    "JPEG, PNG and WebP)");
      }
      return ImageFormat::kJpeg;
    }
    if (format == ImageFormat::kUnknown) {
      if (image.empty()) throw DecodeError(path, "empty file");
      throw DecodeError(path, "not a JPEG, PNG or WebP image (no known signature)");
    }
    return format;
  }

  ImageHeader other_header(ImageFormat format, std::span<const std::byte> image,
                           const std::string& path) {
    if (format == ImageFormat::kPng) {
      if (!png) png.emplace(max_pixels);
      return png->header(image, path);
    }
    if (!webp) webp.emplace(max_pixels);
    return webp->header(image, path);
  }

  // A PNG or WebP image decoded whole into `decoded`; returns its size.
  ImageHeader decode_whole(ImageFormat format, std::span<const std::byte> image,
                           const std::string& path) {
    const ImageHeader header = other_header(format, image, path);
    const size_t bytes = size_t(header.width) * size_t(header.height) * kRgbBytes;
    if (decoded.size() < bytes) decoded.resize(bytes);
    const std::span<std::byte> out(decoded.data(), bytes);
    if (format == ImageFormat::kPng) {
      png->decode(image, out, path);
    } else {
      webp->decode(image, out, path);
    }
    return header;
  }

  // `box` of the image in `decoded` resized to `size`, as the JPEG codec's full-scale crop.
  void crop_resize(const ImageHeader& header, const CropBox& box, ImageSize size,
                   std::span<std::byte> out) {
    if (box.width <= 0 || box.height <= 0 || box.left < 0 || box.top < 0 ||
        box.left + box.width > header.width || box.top + box.height > header.height) {
      throw std::logic_error("ImageDecoder::decode_crop: box outside the image");
    }
    const size_t stride = size_t(header.width) * kRgbBytes;
    const auto* src = reinterpret_cast<const uint8_t*>(decoded.data()) + size_t(box.top) * stride +
                      size_t(box.left) * kRgbBytes;
    resize_rgb(src, box.width, box.height, stride, 0.0, 0.0, box.width, box.height,
               reinterpret_cast<uint8_t*>(out.data()), static_cast<int>(size.width),
               static_cast<int>(size.height), size_t{size.width} * kRgbBytes, resize, box.flip);
  }
};

ImageDecoder::ImageDecoder(uint64_t max_pixels, bool any_format)
    : impl_(std::make_unique<Impl>(max_pixels, any_format)) {}

ImageDecoder::~ImageDecoder() = default;

ImageHeader ImageDecoder::header(std::span<const std::byte> image, const std::string& path) {
  const ImageFormat format = impl_->route(image, path);
  if (format == ImageFormat::kJpeg) return impl_->jpeg.header(image, path);
  return impl_->other_header(format, image, path);
}

void ImageDecoder::decode_exact(std::span<const std::byte> image, ImageSize size,
                                std::span<std::byte> out, const std::string& path) {
  const ImageFormat format = impl_->route(image, path);
  if (format == ImageFormat::kJpeg) {
    impl_->jpeg.decode_exact(image, size, out, path);
    return;
  }
  const ImageHeader header = impl_->other_header(format, image, path);
  if (uint64_t(header.width) != size.width || uint64_t(header.height) != size.height) {
    throw DecodeError(path, "image is " + std::to_string(header.width) + "x" +
                                std::to_string(header.height) + ", expected " +
                                std::to_string(size.width) + "x" + std::to_string(size.height));
  }
  if (out.size() != size_t(header.width) * size_t(header.height) * kRgbBytes) {
    throw std::logic_error("ImageDecoder::decode_exact: output buffer has the wrong size");
  }
  if (format == ImageFormat::kPng) {
    impl_->png->decode(image, out, path);
  } else {
    impl_->webp->decode(image, out, path);
  }
}

void ImageDecoder::decode_resized(std::span<const std::byte> image, ImageSize size,
                                  std::span<std::byte> out, const std::string& path) {
  const ImageFormat format = impl_->route(image, path);
  if (format == ImageFormat::kJpeg) {
    impl_->jpeg.decode_resized(image, size, out, path);
    return;
  }
  check_output(size, out, "decode_resized");
  const ImageHeader header = impl_->decode_whole(format, image, path);
  const int64_t h = header.height;
  const int64_t w = header.width;
  const int64_t out_h = size.height;
  const int64_t out_w = size.width;
  if (w == out_w && h == out_h) {
    std::memcpy(out.data(), impl_->decoded.data(), out.size());
    return;
  }
  // The JPEG codec's arithmetic at full scale: torchvision's Resize(int) size, the centre crop's
  // offsets, and that box mapped back to the image, resampled in one pass.
  int64_t resized_h = out_h;
  int64_t resized_w = out_w;
  if (out_h * w >= out_w * h) {
    resized_w = std::max<int64_t>(out_w, out_h * w / h);
  } else {
    resized_h = std::max<int64_t>(out_h, out_w * h / w);
  }
  const int64_t top = centre_offset(resized_h - out_h);
  const int64_t left = centre_offset(resized_w - out_w);
  const double to_x = static_cast<double>(w) / static_cast<double>(resized_w);
  const double to_y = static_cast<double>(h) / static_cast<double>(resized_h);
  const double x0 = static_cast<double>(left) * to_x;
  const double y0 = static_cast<double>(top) * to_y;
  const double x1 = std::min(static_cast<double>(left + out_w) * to_x, static_cast<double>(w));
  const double y1 = std::min(static_cast<double>(top + out_h) * to_y, static_cast<double>(h));
  resize_rgb(reinterpret_cast<const uint8_t*>(impl_->decoded.data()), header.width, header.height,
             size_t(header.width) * kRgbBytes, x0, y0, x1, y1,
             reinterpret_cast<uint8_t*>(out.data()), static_cast<int>(out_w),
             static_cast<int>(out_h), size_t(out_w) * kRgbBytes, impl_->resize);
}

void ImageDecoder::decode_crop(std::span<const std::byte> image, const CropBox& box, ImageSize size,
                               std::span<std::byte> out, const std::string& path) {
  const ImageFormat format = impl_->route(image, path);
  if (format == ImageFormat::kJpeg) {
    impl_->jpeg.decode_crop(image, box, size, out, path);
    return;
  }
  check_output(size, out, "decode_crop");
  const ImageHeader header = impl_->decode_whole(format, image, path);
  impl_->crop_resize(header, box, size, out);
}

CropBox ImageDecoder::decode_random_crop(std::span<const std::byte> image, ImageSize size,
                                         uint64_t seed, uint64_t epoch, uint64_t index,
                                         std::span<std::byte> out, const std::string& path) {
  const ImageFormat format = impl_->route(image, path);
  if (format == ImageFormat::kJpeg) {
    return impl_->jpeg.decode_random_crop(image, size, seed, epoch, index, out, path);
  }
  check_output(size, out, "decode_random_crop");
  const ImageHeader header = impl_->decode_whole(format, image, path);
  const CropBox box = random_resized_crop(seed, epoch, index, header.height, header.width);
  impl_->crop_resize(header, box, size, out);
  return box;
}

}  // namespace prestage::detail
