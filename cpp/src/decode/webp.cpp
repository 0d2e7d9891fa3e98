#include "decode/webp.hpp"

#include <webp/decode.h>

#include <cstring>
#include <stdexcept>
#include <string>

#include "prestage/error.hpp"

namespace prestage::detail {
namespace {

std::string status_text(VP8StatusCode status) {
  switch (status) {
    case VP8_STATUS_OK:
      return "ok";
    case VP8_STATUS_OUT_OF_MEMORY:
      return "out of memory";
    case VP8_STATUS_INVALID_PARAM:
      return "invalid parameter";
    case VP8_STATUS_BITSTREAM_ERROR:
      return "corrupt bitstream";
    case VP8_STATUS_UNSUPPORTED_FEATURE:
      return "unsupported feature";
    case VP8_STATUS_SUSPENDED:
      return "suspended";
    case VP8_STATUS_USER_ABORT:
      return "aborted";
    case VP8_STATUS_NOT_ENOUGH_DATA:
      return "truncated file (not enough data)";
  }
  return "status " + std::to_string(static_cast<int>(status));
}

}  // namespace

bool is_webp(std::span<const std::byte> bytes) {
  return bytes.size() >= 12 && std::memcmp(bytes.data(), "RIFF", 4) == 0 &&
         std::memcmp(bytes.data() + 8, "WEBP", 4) == 0;
}

struct WebpDecoder::Impl {
  uint64_t max_pixels = 0;
  WebPDecoderConfig config{};

  ImageHeader read_header(std::span<const std::byte> bytes, const std::string& path) {
    if (bytes.empty()) throw DecodeError(path, "empty file");
    if (!is_webp(bytes)) throw DecodeError(path, "not a WebP file (no RIFF/WEBP header)");
    const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
    const VP8StatusCode status = WebPGetFeatures(data, bytes.size(), &config.input);
    if (status != VP8_STATUS_OK) {
      throw DecodeError(path, "cannot read WebP header: " + status_text(status));
    }
    if (config.input.has_animation != 0) {
      throw DecodeError(path, "an animated WebP file (only still images are decoded)");
    }
    const int width = config.input.width;
    const int height = config.input.height;
    const uint64_t pixels = uint64_t(width > 0 ? width : 0) * uint64_t(height > 0 ? height : 0);
    if (width <= 0 || height <= 0 || pixels > max_pixels) {
      throw DecodeError(path, std::to_string(width) + " x " + std::to_string(height) +
                                  " pixels exceeds max_pixels " + std::to_string(max_pixels));
    }
    return ImageHeader{width, height};
  }
};

WebpDecoder::WebpDecoder(uint64_t max_pixels) : impl_(std::make_unique<Impl>()) {
  impl_->max_pixels = max_pixels;
  if (WebPInitDecoderConfig(&impl_->config) == 0) {
    throw Error("cannot set up a WebP decoder: libwebp's version does not match its header");
  }
}

WebpDecoder::~WebpDecoder() = default;

ImageHeader WebpDecoder::header(std::span<const std::byte> webp, const std::string& path) {
  return impl_->read_header(webp, path);
}

void WebpDecoder::decode(std::span<const std::byte> webp, std::span<std::byte> out,
                         const std::string& path) {
  const ImageHeader header = impl_->read_header(webp, path);
  const size_t stride = size_t(header.width) * 3;
  if (out.size() != stride * size_t(header.height)) {
    throw std::logic_error("WebpDecoder::decode: output buffer has the wrong size");
  }
  WebPDecBuffer& output = impl_->config.output;
  output.colorspace = MODE_RGB;
  output.is_external_memory = 1;
  output.u.RGBA.rgba = reinterpret_cast<uint8_t*>(out.data());
  output.u.RGBA.stride = static_cast<int>(stride);
  output.u.RGBA.size = out.size();
  const VP8StatusCode status =
      WebPDecode(reinterpret_cast<const uint8_t*>(webp.data()), webp.size(), &impl_->config);
  WebPFreeDecBuffer(&output);  // external memory: frees nothing of ours, resets the buffer
  if (status != VP8_STATUS_OK) {
    throw DecodeError(path, "cannot decode WebP data: " + status_text(status));
  }
}

}  // namespace prestage::detail
