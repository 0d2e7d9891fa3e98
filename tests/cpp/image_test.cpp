// Stage 3 image codecs beyond JPEG: PNG (libpng) and WebP (libwebp), chosen by signature, their
// pixels against the encoder's input, their crops against the JPEG codec's on the same pixels, and
// the refusal of hostile files. The Python tests check the pixels against Pillow.
#include "decode/image.hpp"

#include <doctest/doctest.h>
#include <png.h>
#include <turbojpeg.h>
#include <webp/encode.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "decode/jpeg.hpp"
#include "decode/png.hpp"
#include "decode/webp.hpp"
#include "prestage/error.hpp"
#include "prestage/options.hpp"

namespace {

using prestage::DecodeError;
using prestage::ImageSize;
using prestage::detail::CropBox;
using prestage::detail::ImageDecoder;
using prestage::detail::ImageFormat;
using prestage::detail::JpegDecoder;
using prestage::detail::sniff_image;

using Bytes = std::vector<std::byte>;
const uint64_t kMaxPixels = prestage::LoaderOptions{}.max_pixels;

std::vector<uint8_t> smooth_rgb(int w, int h) {
  std::vector<uint8_t> px(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int c = 0; c < 3; ++c) {
        const double v = 128 + 60 * std::sin(x * 0.031 + c) + 40 * std::cos(y * 0.047 * (c + 1)) +
                         20 * std::sin((x + y) * 0.11);
        px[(static_cast<size_t>(y) * w + x) * 3 + c] = static_cast<uint8_t>(std::lround(v));
      }
    }
  }
  return px;
}

// libpng's simplified writer: `channels` 1 (grey), 3 (RGB) or 4 (RGBA), 8 bits.
Bytes encode_png(const std::vector<uint8_t>& pixels, int w, int h, int channels) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(w);
  image.height = static_cast<png_uint_32>(h);
  image.format = channels == 1 ? PNG_FORMAT_GRAY : channels == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_RGBA;
  png_alloc_size_t size = 0;
  REQUIRE(png_image_write_to_memory(&image, nullptr, &size, 0, pixels.data(), 0, nullptr) != 0);
  Bytes out(size);
  REQUIRE(png_image_write_to_memory(&image, out.data(), &size, 0, pixels.data(), 0, nullptr) != 0);
  out.resize(size);
  return out;
}

Bytes encode_webp_lossless(const std::vector<uint8_t>& rgb, int w, int h) {
  uint8_t* data = nullptr;
  const size_t size = WebPEncodeLosslessRGB(rgb.data(), w, h, w * 3, &data);
  REQUIRE(size > 0);
  Bytes out(size);
  std::memcpy(out.data(), data, size);
  WebPFree(data);
  return out;
}

Bytes encode_jpeg(const std::vector<uint8_t>& rgb, int w, int h) {
  tjhandle compressor = tjInitCompress();
  REQUIRE(compressor != nullptr);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  REQUIRE(tjCompress2(compressor, rgb.data(), w, 0, h, TJPF_RGB, &buffer, &size, TJSAMP_420, 90,
                      0) == 0);
  Bytes out(size);
  std::memcpy(out.data(), buffer, size);
  tjFree(buffer);
  tjDestroy(compressor);
  return out;
}

Bytes decode_exact(ImageDecoder& decoder, const Bytes& file, int w, int h) {
  Bytes out(size_t(w) * h * 3);
  decoder.decode_exact(file, ImageSize{uint32_t(h), uint32_t(w)}, out, "x");
  return out;
}

bool same(const Bytes& a, const std::vector<uint8_t>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

// Overwrites the big-endian u32 at `at`.
void put_u32(Bytes& bytes, size_t at, uint32_t v) {
  for (int k = 0; k < 4; ++k) bytes[at + k] = std::byte(v >> (24 - 8 * k));
}

}  // namespace

TEST_CASE("image: the format is told by the signature, not the name") {
  const auto rgb = smooth_rgb(8, 6);
  CHECK(sniff_image(encode_png(rgb, 8, 6, 3)) == ImageFormat::kPng);
  CHECK(sniff_image(encode_webp_lossless(rgb, 8, 6)) == ImageFormat::kWebp);
  CHECK(sniff_image(encode_jpeg(rgb, 8, 6)) == ImageFormat::kJpeg);
  const Bytes riff_wave = {std::byte{'R'}, std::byte{'I'}, std::byte{'F'}, std::byte{'F'},
                           std::byte{0},   std::byte{0},   std::byte{0},   std::byte{0},
                           std::byte{'W'}, std::byte{'A'}, std::byte{'V'}, std::byte{'E'}};
  CHECK(sniff_image(riff_wave) == ImageFormat::kUnknown);
  CHECK(sniff_image({}) == ImageFormat::kUnknown);
}

TEST_CASE("image: lossless PNG and WebP decode to the pixels that were encoded") {
  const int w = 37, h = 23;
  const auto rgb = smooth_rgb(w, h);
  ImageDecoder decoder(kMaxPixels, true);
  CHECK(same(decode_exact(decoder, encode_png(rgb, w, h, 3), w, h), rgb));
  CHECK(same(decode_exact(decoder, encode_webp_lossless(rgb, w, h), w, h), rgb));

  SUBCASE("grey is replicated to three channels") {
    std::vector<uint8_t> grey(size_t(w) * h), expected;
    for (size_t i = 0; i < grey.size(); ++i) grey[i] = uint8_t(i * 7);
    for (const uint8_t g : grey) expected.insert(expected.end(), {g, g, g});
    CHECK(same(decode_exact(decoder, encode_png(grey, w, h, 1), w, h), expected));
  }
  SUBCASE("alpha is dropped, not composited") {
    std::vector<uint8_t> rgba;
    for (size_t i = 0; i < rgb.size(); i += 3) {
      rgba.insert(rgba.end(), {rgb[i], rgb[i + 1], rgb[i + 2], uint8_t(i % 256)});
    }
    CHECK(same(decode_exact(decoder, encode_png(rgba, w, h, 4), w, h), rgb));
  }
}

TEST_CASE("image: a PNG's crops and resizes are the JPEG codec's on the same pixels") {
  // The JPEG's own decode is the PNG's content, so both routes resample the same pixels; boxes are
  // under twice the output, where the JPEG codec decodes at full scale.
  const int w = 61, h = 45;
  const Bytes jpeg = encode_jpeg(smooth_rgb(w, h), w, h);
  ImageDecoder decoder(kMaxPixels, true);
  const Bytes pixels = decode_exact(decoder, jpeg, w, h);
  std::vector<uint8_t> as_rgb(pixels.size());
  std::memcpy(as_rgb.data(), pixels.data(), pixels.size());
  const Bytes png = encode_png(as_rgb, w, h, 3);
  const Bytes webp = encode_webp_lossless(as_rgb, w, h);
  const ImageSize size{32, 40};
  Bytes a(size_t(32) * 40 * 3), b(a.size()), c(a.size());
  decoder.decode_resized(jpeg, size, a, "a.jpg");
  decoder.decode_resized(png, size, b, "b.png");
  decoder.decode_resized(webp, size, c, "c.webp");
  CHECK(a == b);
  CHECK(a == c);
  const CropBox box{5, 7, 30, 41, true};
  decoder.decode_crop(jpeg, box, size, a, "a.jpg");
  decoder.decode_crop(png, box, size, b, "b.png");
  CHECK(a == b);
  for (uint64_t index = 0; index < 20; ++index) {
    const CropBox ja = decoder.decode_random_crop(jpeg, size, 3, 1, index, a, "a.jpg");
    const CropBox pb = decoder.decode_random_crop(png, size, 3, 1, index, b, "b.png");
    CHECK(ja.left == pb.left);
    CHECK(ja.top == pb.top);
    CHECK(ja.width == pb.width);
    CHECK(ja.flip == pb.flip);
    CHECK(a == b);
  }
}

TEST_CASE("image: decode=jpeg refuses PNG and WebP, decode=image refuses other formats") {
  const auto rgb = smooth_rgb(8, 8);
  ImageDecoder jpeg_only(kMaxPixels, false);
  Bytes out(8 * 8 * 3);
  CHECK_THROWS_AS(jpeg_only.header(encode_png(rgb, 8, 8, 3), "a.png"), DecodeError);
  CHECK_THROWS_AS(
      jpeg_only.decode_resized(encode_webp_lossless(rgb, 8, 8), ImageSize{8, 8}, out, "a.webp"),
      DecodeError);
  CHECK(jpeg_only.header(encode_jpeg(rgb, 8, 8), "a.jpg").width == 8);
  ImageDecoder any(kMaxPixels, true);
  const Bytes gif = {std::byte{'G'}, std::byte{'I'}, std::byte{'F'}, std::byte{'8'},
                     std::byte{'9'}, std::byte{'a'}, std::byte{1},   std::byte{0}};
  CHECK_THROWS_AS(any.header(gif, "a.gif"), DecodeError);
  CHECK_THROWS_AS(any.header({}, "empty"), DecodeError);
}

TEST_CASE("image: hostile PNG files are refused with a DecodeError, and the decoder goes on") {
  const int w = 40, h = 30;
  const auto rgb = smooth_rgb(w, h);
  const Bytes good = encode_png(rgb, w, h, 3);
  ImageDecoder decoder(kMaxPixels, true);
  Bytes out(size_t(w) * h * 3);
  const ImageSize size{uint32_t(h), uint32_t(w)};
  SUBCASE("truncated anywhere") {
    for (size_t keep :
         {size_t(8), size_t(20), size_t(33), good.size() / 2, good.size() - 13, good.size() - 1}) {
      const Bytes cut(good.begin(), good.begin() + long(keep));
      CAPTURE(keep);
      CHECK_THROWS_AS(decoder.decode_exact(cut, size, out, "cut.png"), DecodeError);
    }
  }
  SUBCASE("a bad CRC in the image data") {
    Bytes bad = good;
    // The first IDAT chunk (length, type, data, CRC): its CRC's last byte flipped.
    size_t idat = 8;
    while (idat + 8 < bad.size() && std::memcmp(bad.data() + idat + 4, "IDAT", 4) != 0) ++idat;
    REQUIRE(idat + 8 < bad.size());
    const uint32_t length = (uint32_t(bad[idat]) << 24) | (uint32_t(bad[idat + 1]) << 16) |
                            (uint32_t(bad[idat + 2]) << 8) | uint32_t(bad[idat + 3]);
    bad[idat + 8 + length + 3] ^= std::byte{0x01};
    CHECK_THROWS_AS(decoder.decode_exact(bad, size, out, "crc.png"), DecodeError);
  }
  SUBCASE("dimensions past max_pixels, refused before any pixel is decoded") {
    Bytes huge = good;
    put_u32(huge, 16, 100000);  // IHDR width
    put_u32(huge, 20, 100000);  // IHDR height (the CRC no longer matches: refused either way)
    CHECK_THROWS_AS(decoder.header(huge, "huge.png"), DecodeError);
    ImageDecoder small(uint64_t(w) * h - 1, true);
    try {
      small.header(good, "big.png");
      FAIL("no error");
    } catch (const DecodeError& e) {
      CHECK(std::string(e.what()).find("max_pixels") != std::string::npos);
      CHECK(std::string(e.what()).find("big.png") != std::string::npos);
    }
  }
  // Whatever failed, the next good image decodes.
  CHECK(same(decode_exact(decoder, good, w, h), rgb));
}

TEST_CASE("image: hostile WebP files are refused with a DecodeError, and the decoder goes on") {
  const int w = 40, h = 30;
  const auto rgb = smooth_rgb(w, h);
  const Bytes good = encode_webp_lossless(rgb, w, h);
  ImageDecoder decoder(kMaxPixels, true);
  Bytes out(size_t(w) * h * 3);
  const ImageSize size{uint32_t(h), uint32_t(w)};
  for (size_t keep : {size_t(12), size_t(20), good.size() / 2, good.size() - 1}) {
    const Bytes cut(good.begin(), good.begin() + long(keep));
    CAPTURE(keep);
    CHECK_THROWS_AS(decoder.decode_exact(cut, size, out, "cut.webp"), DecodeError);
  }
  ImageDecoder small(uint64_t(w) * h - 1, true);
  try {
    small.header(good, "big.webp");
    FAIL("no error");
  } catch (const DecodeError& e) {
    CHECK(std::string(e.what()).find("max_pixels") != std::string::npos);
    CHECK(std::string(e.what()).find("big.webp") != std::string::npos);
  }
  CHECK(same(decode_exact(decoder, good, w, h), rgb));
}
