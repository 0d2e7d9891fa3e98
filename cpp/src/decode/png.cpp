#include "decode/png.hpp"

#include <png.h>

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "prestage/error.hpp"

namespace prestage::detail {
namespace {

constexpr size_t kSignatureBytes = 8;
constexpr unsigned char kSignature[kSignatureBytes] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};

// libpng reads through this: the file's bytes in memory, and the message of the error that ended
// the read. An error longjmps out of libpng, so nothing here has a destructor.
struct Source {
  const unsigned char* data = nullptr;
  size_t size = 0;
  size_t position = 0;
  char message[256] = {};
};

void read_bytes(png_structp png, png_bytep out, size_t count) {
  auto* source = static_cast<Source*>(png_get_io_ptr(png));
  if (count > source->size - source->position) png_error(png, "truncated PNG file");
  std::memcpy(out, source->data + source->position, count);
  source->position += count;
}

[[noreturn]] void on_error(png_structp png, png_const_charp message) {
  auto* source = static_cast<Source*>(png_get_error_ptr(png));
  std::snprintf(source->message, sizeof(source->message), "%s", message);
  png_longjmp(png, 1);
}

// libpng's default prints warnings to stderr; what it only warns about (an ancillary chunk's bad
// CRC, an incorrect sRGB profile) does not change the pixels read here.
void on_warning(png_structp, png_const_charp) {}

}  // namespace

bool is_png(std::span<const std::byte> bytes) {
  return bytes.size() >= kSignatureBytes &&
         std::memcmp(bytes.data(), kSignature, kSignatureBytes) == 0;
}

struct PngDecoder::Impl {
  uint64_t max_pixels = 0;
  std::vector<png_bytep> rows;
  // One image's read: libpng's structures live from start() to finish().
  png_structp png = nullptr;
  png_infop info = nullptr;
  Source source;

  ~Impl() { finish(); }

  void finish() {
    if (png != nullptr) png_destroy_read_struct(&png, info != nullptr ? &info : nullptr, nullptr);
    png = nullptr;
    info = nullptr;
  }

  // Creates the read structures and reads every chunk up to the image data. Returns false with
  // source.message set on failure. `expand`: set up the transformations to 8-bit RGB too.
  bool read_info(bool expand, png_uint_32* width, png_uint_32* height) {
    if (setjmp(png_jmpbuf(png)) != 0) return false;
    png_set_read_fn(png, &source, read_bytes);
    // max_pixels is the limit, checked by the caller with its own message; libpng's own default
    // (1,000,000 per side) would refuse a 1 x 2,000,000 strip that max_pixels allows.
    png_set_user_limits(png, PNG_UINT_31_MAX, PNG_UINT_31_MAX);
    png_read_info(png, info);
    *width = png_get_image_width(png, info);
    *height = png_get_image_height(png, info);
    if (!expand) return true;
    const int colour = png_get_color_type(png, info);
    const int depth = png_get_bit_depth(png, info);
    if (colour == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (colour == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (depth == 16) png_set_strip_16(png);
    // An alpha channel, or the one the expansions above make of a tRNS chunk: dropped.
    png_set_strip_alpha(png);
    if (colour == PNG_COLOR_TYPE_GRAY || colour == PNG_COLOR_TYPE_GRAY_ALPHA) {
      png_set_gray_to_rgb(png);
    }
    static_cast<void>(png_set_interlace_handling(png));
    png_read_update_info(png, info);
    if (png_get_channels(png, info) != 3 || png_get_bit_depth(png, info) != 8 ||
        png_get_rowbytes(png, info) != size_t{*width} * 3) {
      std::snprintf(source.message, sizeof(source.message),
                    "internal error: libpng's output is not 8-bit RGB");
      return false;
    }
    return true;
  }

  // After read_info(true): the image into `rows`, then the chunks after it up to IEND.
  bool read_image() {
    if (setjmp(png_jmpbuf(png)) != 0) return false;
    png_read_image(png, rows.data());
    png_read_end(png, nullptr);
    return true;
  }

  void start(std::span<const std::byte> bytes, const std::string& path) {
    finish();
    if (bytes.empty()) throw DecodeError(path, "empty file");
    if (!is_png(bytes)) throw DecodeError(path, "not a PNG file (bad signature)");
    source = Source{};
    source.data = reinterpret_cast<const unsigned char*>(bytes.data());
    source.size = bytes.size();
    png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &source, on_error, on_warning);
    if (png != nullptr) info = png_create_info_struct(png);
    if (png == nullptr || info == nullptr) {
      finish();
      throw Error("cannot create a libpng reader (out of memory)");
    }
  }

  ImageHeader header(std::span<const std::byte> bytes, bool expand, const std::string& path) {
    start(bytes, path);
    png_uint_32 width = 0, height = 0;
    if (!read_info(expand, &width, &height)) {
      finish();
      throw DecodeError(path, std::string("cannot read PNG header: ") + source.message);
    }
    const uint64_t pixels = uint64_t{width} * uint64_t{height};
    if (width == 0 || height == 0 || pixels > max_pixels) {
      finish();
      throw DecodeError(path, std::to_string(width) + " x " + std::to_string(height) +
                                  " pixels exceeds max_pixels " + std::to_string(max_pixels));
    }
    return ImageHeader{static_cast<int>(width), static_cast<int>(height)};
  }
};

PngDecoder::PngDecoder(uint64_t max_pixels) : impl_(std::make_unique<Impl>()) {
  impl_->max_pixels = max_pixels;
}

PngDecoder::~PngDecoder() = default;

ImageHeader PngDecoder::header(std::span<const std::byte> png, const std::string& path) {
  const ImageHeader header = impl_->header(png, false, path);
  impl_->finish();
  return header;
}

void PngDecoder::decode(std::span<const std::byte> png, std::span<std::byte> out,
                        const std::string& path) {
  const ImageHeader header = impl_->header(png, true, path);
  const size_t stride = size_t(header.width) * 3;
  if (out.size() != stride * size_t(header.height)) {
    impl_->finish();
    throw std::logic_error("PngDecoder::decode: output buffer has the wrong size");
  }
  // Sides are below 2^31 and the pixels within max_pixels: the rows fit in memory.
  if (impl_->rows.size() < size_t(header.height)) impl_->rows.resize(size_t(header.height));
  auto* first = reinterpret_cast<png_bytep>(out.data());
  for (size_t y = 0; y < size_t(header.height); ++y) impl_->rows[y] = first + y * stride;
  const bool ok = impl_->read_image();
  impl_->finish();
  if (!ok) throw DecodeError(path, std::string("cannot decode PNG data: ") + impl_->source.message);
}

}  // namespace prestage::detail
