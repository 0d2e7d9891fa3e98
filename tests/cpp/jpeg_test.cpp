// Stage 3 JPEG codec: exact and resized decode, and refusal of every kind of bad input.
#include "decode/jpeg.hpp"

#include <doctest/doctest.h>
#include <turbojpeg.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "decode/resize.hpp"
#include "prestage/error.hpp"
#include "prestage/options.hpp"

namespace {

using prestage::DecodeError;
using prestage::ImageSize;
using prestage::detail::JpegDecoder;

const uint64_t kDefaultMaxPixels = prestage::LoaderOptions{}.max_pixels;

using Bytes = std::vector<std::byte>;

// A smooth image with some structure at several scales, like a photograph's low frequencies.
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

Bytes encode(const std::vector<uint8_t>& pixels, int w, int h, int pixel_format, int subsampling,
             int quality = 95) {
  tjhandle compressor = tjInitCompress();
  REQUIRE(compressor != nullptr);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  const int rc = tjCompress2(compressor, pixels.data(), w, 0, h, pixel_format, &buffer, &size,
                             subsampling, quality, 0);
  INFO(tjGetErrorStr2(compressor));
  REQUIRE(rc == 0);
  Bytes jpeg(size);
  std::memcpy(jpeg.data(), buffer, size);
  tjFree(buffer);
  tjDestroy(compressor);
  return jpeg;
}

Bytes encode_rgb(int w, int h, int subsampling = TJSAMP_420, int quality = 95) {
  return encode(smooth_rgb(w, h), w, h, TJPF_RGB, subsampling, quality);
}

// Offset of the first byte after the two-byte marker `code` (0xFF, code).
size_t find_marker(const Bytes& jpeg, uint8_t code) {
  for (size_t i = 0; i + 1 < jpeg.size(); ++i) {
    if (jpeg[i] == std::byte{0xFF} && jpeg[i + 1] == std::byte{code}) return i + 2;
  }
  FAIL("marker not found");
  return 0;
}

Bytes text_bytes(const std::string& text) {
  Bytes bytes(text.size());
  std::memcpy(bytes.data(), text.data(), text.size());
  return bytes;
}

std::vector<uint8_t> decode(JpegDecoder& decoder, const Bytes& jpeg, int w, int h) {
  std::vector<uint8_t> out(static_cast<size_t>(w) * h * 3);
  decoder.decode_exact(jpeg, ImageSize{static_cast<uint32_t>(h), static_cast<uint32_t>(w)},
                       std::as_writable_bytes(std::span(out)), "test.jpg");
  return out;
}

std::vector<uint8_t> decode_resized(JpegDecoder& decoder, const Bytes& jpeg, int w, int h) {
  std::vector<uint8_t> out(static_cast<size_t>(w) * h * 3);
  decoder.decode_resized(jpeg, ImageSize{static_cast<uint32_t>(h), static_cast<uint32_t>(w)},
                         std::as_writable_bytes(std::span(out)), "test.jpg");
  return out;
}

double mean_abs_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  REQUIRE(a.size() == b.size());
  double total = 0;
  for (size_t i = 0; i < a.size(); ++i) total += std::abs(int{a[i]} - int{b[i]});
  return total / static_cast<double>(a.size());
}

// Every way of decoding must refuse `jpeg` with a DecodeError (and not crash).
void check_refused(const Bytes& jpeg) {
  JpegDecoder decoder(kDefaultMaxPixels);
  std::vector<std::byte> out(64 * 48 * 3);
  CHECK_THROWS_AS(decoder.decode_exact(jpeg, ImageSize{48, 64}, out, "bad.jpg"), DecodeError);
  CHECK_THROWS_AS(decoder.decode_resized(jpeg, ImageSize{48, 64}, out, "bad.jpg"), DecodeError);
}

}  // namespace

TEST_CASE("jpeg: header reports the image size") {
  JpegDecoder decoder(kDefaultMaxPixels);
  const auto header = decoder.header(encode_rgb(123, 45), "a.jpg");
  CHECK(header.width == 123);
  CHECK(header.height == 45);
}

TEST_CASE("jpeg: decode_exact round-trips a smooth image within JPEG's loss") {
  const int w = 160;
  const int h = 120;
  const std::vector<uint8_t> original = smooth_rgb(w, h);
  JpegDecoder decoder(kDefaultMaxPixels);
  for (const int subsampling : {TJSAMP_444, TJSAMP_422, TJSAMP_420}) {
    CAPTURE(subsampling);
    const auto decoded = decode(decoder, encode(original, w, h, TJPF_RGB, subsampling, 95), w, h);
    CHECK(mean_abs_diff(decoded, original) < 2.0);
  }
}

TEST_CASE("jpeg: an image of another size than expected is a DecodeError") {
  JpegDecoder decoder(kDefaultMaxPixels);
  const Bytes jpeg = encode_rgb(64, 48);
  std::vector<std::byte> out(48 * 64 * 3);
  CHECK_THROWS_AS(decoder.decode_exact(jpeg, ImageSize{64, 48}, out, "a.jpg"), DecodeError);
  CHECK_THROWS_AS(decoder.decode_exact(jpeg, ImageSize{48, 63}, out, "a.jpg"), DecodeError);
}

TEST_CASE("jpeg: an output buffer of the wrong size is a logic error") {
  JpegDecoder decoder(kDefaultMaxPixels);
  const Bytes jpeg = encode_rgb(64, 48);
  std::vector<std::byte> out(48 * 64 * 3 - 1);
  CHECK_THROWS_AS(decoder.decode_exact(jpeg, ImageSize{48, 64}, out, "a.jpg"), std::logic_error);
  CHECK_THROWS_AS(decoder.decode_resized(jpeg, ImageSize{48, 64}, out, "a.jpg"), std::logic_error);
}

TEST_CASE("jpeg: a truncated file is a DecodeError") {
  const Bytes jpeg = encode_rgb(64, 48);
  check_refused(Bytes(jpeg.begin(), jpeg.begin() + static_cast<std::ptrdiff_t>(jpeg.size() / 2)));
  check_refused(Bytes(jpeg.begin(), jpeg.end() - 2));  // only the end-of-image marker missing
  check_refused(Bytes(jpeg.begin(), jpeg.begin() + 20));
}

TEST_CASE("jpeg: corrupt entropy-coded data is a DecodeError") {
  // JPEG has no checksum: a flip that still spells valid Huffman codes decodes to wrong pixels
  // unnoticed. What a decoder can catch is data that breaks the code structure, as flipping every
  // bit of a long run does (stray markers, bad codes, a scan that ends early or late).
  const Bytes original = encode_rgb(256, 192);
  const size_t sos = find_marker(original, 0xDA);
  const size_t scan = sos + ((std::to_integer<size_t>(original[sos]) << 8) |
                             std::to_integer<size_t>(original[sos + 1]));
  const size_t end = original.size() - 2;  // the end-of-image marker

  Bytes flipped = original;
  for (size_t i = scan + (end - scan) / 4; i < scan + (end - scan) / 2; ++i) {
    flipped[i] ^= std::byte{0xFF};
  }
  check_refused(flipped);

  Bytes stray_marker = original;
  stray_marker[(scan + end) / 2] = std::byte{0xFF};
  stray_marker[(scan + end) / 2 + 1] = std::byte{0x99};
  check_refused(stray_marker);
}

TEST_CASE("jpeg: bytes that are not a JPEG are a DecodeError") {
  check_refused(text_bytes(std::string("\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16)));
  check_refused(text_bytes("path,label\nimages/cat.jpg,3\n"));
  check_refused(text_bytes("\xFF\xD8"));  // a start-of-image marker and nothing else
  JpegDecoder decoder(kDefaultMaxPixels);
  CHECK_THROWS_AS(decoder.header(text_bytes("GIF89a"), "a.gif"), DecodeError);
}

TEST_CASE("jpeg: empty input is a DecodeError") {
  check_refused(Bytes{});
  JpegDecoder decoder(kDefaultMaxPixels);
  CHECK_THROWS_AS(decoder.header(Bytes{}, "empty.jpg"), DecodeError);
}

TEST_CASE("jpeg: a header claiming 60000 x 60000 pixels is refused before decoding") {
  Bytes jpeg = encode_rgb(64, 48);
  // SOF0 segment: length (2 bytes), precision (1), height (2), width (2).
  const size_t sof = find_marker(jpeg, 0xC0);
  for (const size_t field : {sof + 3, sof + 5}) {
    jpeg[field] = std::byte{60000 >> 8};
    jpeg[field + 1] = std::byte{60000 & 0xFF};
  }
  JpegDecoder decoder(kDefaultMaxPixels);
  CHECK_THROWS_AS(decoder.header(jpeg, "bomb.jpg"), DecodeError);
  check_refused(jpeg);
  std::vector<std::byte> out(3);
  CHECK_THROWS_AS(decoder.decode_resized(jpeg, ImageSize{1, 1}, out, "bomb.jpg"), DecodeError);
}

TEST_CASE("jpeg: images over max_pixels are refused and images at the limit are not") {
  const Bytes jpeg = encode_rgb(20, 10);
  JpegDecoder strict(199);
  CHECK_THROWS_AS(strict.header(jpeg, "a.jpg"), DecodeError);
  JpegDecoder exact(200);
  CHECK(exact.header(jpeg, "a.jpg").width == 20);
}

TEST_CASE("jpeg: the DecodeError names the file") {
  JpegDecoder decoder(kDefaultMaxPixels);
  try {
    decoder.header(text_bytes("not a jpeg"), "dir/sample.jpg");
    FAIL("no exception");
  } catch (const DecodeError& error) {
    CHECK(error.path() == "dir/sample.jpg");
  }
}

TEST_CASE("jpeg: a greyscale JPEG decodes to RGB with equal channels") {
  const int w = 50;
  const int h = 30;
  std::vector<uint8_t> grey(static_cast<size_t>(w) * h);
  for (int i = 0; i < w * h; ++i) grey[static_cast<size_t>(i)] = static_cast<uint8_t>(i % w * 5);
  const Bytes jpeg = encode(grey, w, h, TJPF_GRAY, TJSAMP_GRAY);
  JpegDecoder decoder(kDefaultMaxPixels);
  for (const auto& rgb : {decode(decoder, jpeg, w, h), decode_resized(decoder, jpeg, 20, 10)}) {
    for (size_t i = 0; i < rgb.size(); i += 3) {
      REQUIRE(rgb[i] == rgb[i + 1]);
      REQUIRE(rgb[i] == rgb[i + 2]);
    }
  }
  const auto rgb = decode(decoder, jpeg, w, h);
  double error = 0;
  for (size_t i = 0; i < grey.size(); ++i) error += std::abs(int{rgb[i * 3]} - int{grey[i]});
  CHECK(error / static_cast<double>(grey.size()) < 2.0);
}

TEST_CASE("jpeg: a CMYK (YCCK) JPEG decodes to RGB") {
  // Stored CMYK samples (Adobe-inverted, as in CMYK JPEGs): R = C * K / 255 and so on.
  const int w = 48;
  const int h = 32;
  std::vector<uint8_t> cmyk(static_cast<size_t>(w) * h * 4);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      uint8_t* p = &cmyk[(static_cast<size_t>(y) * w + x) * 4];
      p[0] = static_cast<uint8_t>(x * 5);
      p[1] = static_cast<uint8_t>(y * 7);
      p[2] = 200;
      p[3] = static_cast<uint8_t>(255 - x);
    }
  }
  const Bytes jpeg = encode(cmyk, w, h, TJPF_CMYK, TJSAMP_444, 100);
  JpegDecoder decoder(kDefaultMaxPixels);
  const auto rgb = decode(decoder, jpeg, w, h);
  double error = 0;
  for (size_t i = 0; i < static_cast<size_t>(w) * h; ++i) {
    for (size_t c = 0; c < 3; ++c) {
      const double expected = cmyk[i * 4 + c] * cmyk[i * 4 + 3] / 255.0;
      error += std::abs(rgb[i * 3 + c] - expected);
    }
  }
  CHECK(error / (w * h * 3) < 2.0);
  CHECK(decode_resized(decoder, jpeg, 24, 16).size() == 24 * 16 * 3);
}

TEST_CASE("jpeg: decode_resized gives the requested size for any aspect ratio") {
  JpegDecoder decoder(kDefaultMaxPixels);
  struct Case {
    int w, h, out_w, out_h;
  };
  for (const Case& c :
       {Case{400, 300, 224, 224}, Case{300, 400, 224, 224}, Case{224, 224, 224, 224},
        Case{640, 480, 256, 160}, Case{100, 75, 224, 224}, Case{1, 1, 3, 2}, Case{999, 7, 5, 5}}) {
    CAPTURE(c.w);
    CAPTURE(c.h);
    CAPTURE(c.out_w);
    CAPTURE(c.out_h);
    const std::vector<uint8_t> out =
        decode_resized(decoder, encode_rgb(c.w, c.h), c.out_w, c.out_h);
    CHECK(out.size() == static_cast<size_t>(c.out_w) * c.out_h * 3);
  }
}

TEST_CASE("jpeg: decode_resized of an image already at the output size is decode_exact") {
  JpegDecoder decoder(kDefaultMaxPixels);
  const Bytes jpeg = encode_rgb(224, 160);
  CHECK(decode_resized(decoder, jpeg, 224, 160) == decode(decoder, jpeg, 224, 160));
}

TEST_CASE("jpeg: decode_resized keeps a constant-colour image that colour") {
  const int w = 640;
  const int h = 480;
  std::vector<uint8_t> flat(static_cast<size_t>(w) * h * 3);
  for (size_t i = 0; i < flat.size(); i += 3) {
    flat[i] = 200;
    flat[i + 1] = 90;
    flat[i + 2] = 30;
  }
  const Bytes jpeg = encode(flat, w, h, TJPF_RGB, TJSAMP_420, 95);
  JpegDecoder decoder(kDefaultMaxPixels);
  const std::vector<uint8_t> full = decode(decoder, jpeg, w, h);
  // 224 x 224 is decoded at 1/2 scale, 500 x 400 at full scale and 64 x 32 at 1/8.
  struct Size {
    int w, h;
  };
  for (const Size size : {Size{224, 224}, Size{500, 400}, Size{64, 32}}) {
    const int out_w = size.w;
    const int out_h = size.h;
    CAPTURE(out_w);
    CAPTURE(out_h);
    const std::vector<uint8_t> out = decode_resized(decoder, jpeg, out_w, out_h);
    for (size_t i = 0; i < out.size(); ++i) REQUIRE(std::abs(int{out[i]} - int{full[i % 3]}) <= 1);
  }
}

TEST_CASE("jpeg: decode_resized with DCT scaling agrees with a full decode then resize") {
  // 2000 x 1500 -> 224 x 224: resized to 298 x 224, so TurboJPEG decodes at 1/4 (500 x 375).
  const int w = 2000;
  const int h = 1500;
  const Bytes jpeg = encode_rgb(w, h, TJSAMP_420, 90);
  JpegDecoder decoder(kDefaultMaxPixels);
  const std::vector<uint8_t> scaled = decode_resized(decoder, jpeg, 224, 224);

  const std::vector<uint8_t> full = decode(decoder, jpeg, w, h);
  const int resized_w = 224 * w / h;  // 298, as torchvision's Resize(224) computes it
  const int left = 37;                // round((298 - 224) / 2)
  const double x0 = left * static_cast<double>(w) / resized_w;
  const double x1 = (left + 224) * static_cast<double>(w) / resized_w;
  std::vector<uint8_t> reference(224 * 224 * 3);
  prestage::detail::ResizeScratch scratch;
  prestage::detail::resize_rgb(full.data(), w, h, static_cast<size_t>(w) * 3, x0, 0, x1, h,
                               reference.data(), 224, 224, 224 * 3, scratch);
  CHECK(mean_abs_diff(scaled, reference) < 3.0);
}

TEST_CASE("jpeg: the centre crop is centred") {
  // Left half black, right half white, wide image: the crop straddles the middle, so its left
  // half must be dark and its right half bright.
  const int w = 800;
  const int h = 200;
  std::vector<uint8_t> px(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int c = 0; c < 3; ++c)
        px[(static_cast<size_t>(y) * w + x) * 3 + c] = x < w / 2 ? 0 : 255;
    }
  }
  const Bytes jpeg = encode(px, w, h, TJPF_RGB, TJSAMP_444, 95);
  JpegDecoder decoder(kDefaultMaxPixels);
  const std::vector<uint8_t> out = decode_resized(decoder, jpeg, 100, 100);
  for (int y = 0; y < 100; ++y) {
    CHECK(out[(static_cast<size_t>(y) * 100 + 40) * 3] < 10);
    CHECK(out[(static_cast<size_t>(y) * 100 + 59) * 3] > 245);
  }
}

TEST_CASE("jpeg: a decoder reused across sizes and errors gives the same pixels as a fresh one") {
  const Bytes small = encode_rgb(90, 70);
  const Bytes big = encode_rgb(1200, 900);
  JpegDecoder reused(kDefaultMaxPixels);
  decode_resized(reused, big, 224, 224);
  CHECK_THROWS_AS(decode(reused, text_bytes("junk"), 90, 70), DecodeError);
  const Bytes truncated(big.begin(), big.begin() + static_cast<std::ptrdiff_t>(big.size() / 3));
  CHECK_THROWS_AS(decode_resized(reused, truncated, 224, 224), DecodeError);
  const auto resized_again = decode_resized(reused, small, 64, 48);
  const auto exact_again = decode(reused, small, 90, 70);

  JpegDecoder fresh(kDefaultMaxPixels);
  CHECK(resized_again == decode_resized(fresh, small, 64, 48));
  CHECK(exact_again == decode(fresh, small, 90, 70));
}

TEST_CASE("jpeg: decode_crop without DCT scaling equals a full decode, cropped, then resized") {
  const int w = 300;
  const int h = 200;
  JpegDecoder decoder(kDefaultMaxPixels);
  for (const int subsampling : {TJSAMP_420, TJSAMP_444, TJSAMP_GRAY}) {
    CAPTURE(subsampling);
    const std::vector<uint8_t> rgb = smooth_rgb(w, h);
    const Bytes jpeg = subsampling == TJSAMP_GRAY
                           ? encode(std::vector<uint8_t>(rgb.begin(), rgb.begin() + w * h), w, h,
                                    TJPF_GRAY, TJSAMP_GRAY)
                           : encode_rgb(w, h, subsampling);
    const std::vector<uint8_t> full = decode(decoder, jpeg, w, h);
    for (const prestage::detail::CropBox box :
         // Each box is less than twice the 48 x 40 output along one side, so no DCT scaling
         // applies.
         {prestage::detail::CropBox{0, 0, 79, 300, false},
          prestage::detail::CropBox{17, 33, 60, 95, true},
          prestage::detail::CropBox{150, 250, 50, 50, false},
          prestage::detail::CropBox{1, 2, 63, 47, true},
          prestage::detail::CropBox{121, 204, 79, 96, false}}) {
      CAPTURE(box.top);
      CAPTURE(box.left);
      std::vector<uint8_t> out(48 * 40 * 3);
      decoder.decode_crop(jpeg, box, ImageSize{40, 48}, std::as_writable_bytes(std::span(out)),
                          "a.jpg");
      std::vector<uint8_t> expected(out.size());
      prestage::detail::ResizeScratch scratch;
      const uint8_t* corner = full.data() + (static_cast<size_t>(box.top) * w + box.left) * 3;
      prestage::detail::resize_rgb(corner, box.width, box.height, static_cast<size_t>(w) * 3, 0, 0,
                                   box.width, box.height, expected.data(), 48, 40, 48 * 3, scratch);
      if (box.flip) {
        for (int y = 0; y < 40; ++y) {
          for (int a = 0, b = 47; a < b; ++a, --b) {
            std::swap_ranges(&expected[(y * 48 + a) * 3], &expected[(y * 48 + a) * 3 + 3],
                             &expected[(y * 48 + b) * 3]);
          }
        }
      }
      CHECK(out == expected);
    }
  }
}

TEST_CASE(
    "jpeg: decode_crop with DCT scaling stays close to a full decode, cropped, then resized") {
  const int w = 1200;
  const int h = 900;
  const Bytes jpeg = encode_rgb(w, h, TJSAMP_420, 90);
  JpegDecoder decoder(kDefaultMaxPixels);
  const std::vector<uint8_t> full = decode(decoder, jpeg, w, h);
  // 8x, 4x and 2x the 64 x 64 output: decoded at 1/8, 1/4 and 1/2.
  for (const int side : {512, 300, 150}) {
    CAPTURE(side);
    const prestage::detail::CropBox box{101, 333, side, side, false};
    std::vector<uint8_t> out(64 * 64 * 3);
    decoder.decode_crop(jpeg, box, ImageSize{64, 64}, std::as_writable_bytes(std::span(out)),
                        "a.jpg");
    std::vector<uint8_t> expected(out.size());
    prestage::detail::ResizeScratch scratch;
    prestage::detail::resize_rgb(full.data() + (static_cast<size_t>(box.top) * w + box.left) * 3,
                                 side, side, static_cast<size_t>(w) * 3, 0, 0, side, side,
                                 expected.data(), 64, 64, 64 * 3, scratch);
    CHECK(mean_abs_diff(out, expected) < 3.0);
  }
}

TEST_CASE("jpeg: decode_random_crop draws its box from (seed, epoch, index) and the image size") {
  const Bytes jpeg = encode_rgb(500, 375);
  JpegDecoder decoder(kDefaultMaxPixels);
  std::vector<std::byte> a(224 * 224 * 3), b(224 * 224 * 3);
  const auto box = decoder.decode_random_crop(jpeg, ImageSize{224, 224}, 1, 2, 3, a, "a.jpg");
  const auto expected = prestage::detail::random_resized_crop(1, 2, 3, 375, 500);
  CHECK(box.top == expected.top);
  CHECK(box.width == expected.width);
  decoder.decode_random_crop(jpeg, ImageSize{224, 224}, 1, 2, 3, b, "a.jpg");
  CHECK(a == b);
}

TEST_CASE("jpeg: the crop path refuses truncated, corrupt, foreign and oversized data") {
  const Bytes jpeg = encode_rgb(256, 192);
  JpegDecoder decoder(kDefaultMaxPixels);
  std::vector<std::byte> out(32 * 32 * 3);
  const prestage::detail::CropBox top_rows{0, 0, 32, 32, false};  // before any truncation point
  CHECK_THROWS_AS(decoder.decode_crop(Bytes(jpeg.begin(), jpeg.end() - 2), top_rows,
                                      ImageSize{32, 32}, out, "a.jpg"),
                  DecodeError);
  CHECK_THROWS_AS(decoder.decode_crop(Bytes(jpeg.begin(), jpeg.begin() + 200), top_rows,
                                      ImageSize{32, 32}, out, "a.jpg"),
                  DecodeError);
  CHECK_THROWS_AS(decoder.decode_crop(text_bytes("not a jpeg at all"), top_rows, ImageSize{32, 32},
                                      out, "a.jpg"),
                  DecodeError);
  Bytes bomb = jpeg;
  const size_t sof = find_marker(bomb, 0xC0);
  for (const size_t field : {sof + 3, sof + 5}) {
    bomb[field] = std::byte{60000 >> 8};
    bomb[field + 1] = std::byte{60000 & 0xFF};
  }
  CHECK_THROWS_AS(decoder.decode_random_crop(bomb, ImageSize{32, 32}, 0, 0, 0, out, "a.jpg"),
                  DecodeError);
  Bytes flipped = jpeg;
  const size_t sos = find_marker(flipped, 0xDA);
  for (size_t i = sos + 20; i < flipped.size() - 2; ++i) flipped[i] ^= std::byte{0xFF};
  CHECK_THROWS_AS(decoder.decode_crop(flipped, prestage::detail::CropBox{0, 0, 192, 256, false},
                                      ImageSize{32, 32}, out, "a.jpg"),
                  DecodeError);
  // The decoder is still usable.
  CHECK_NOTHROW(decoder.decode_crop(jpeg, top_rows, ImageSize{32, 32}, out, "a.jpg"));
}

TEST_CASE(
    "jpeg: after any refused image, every decoding path decodes the next good one as a fresh "
    "decoder") {
  // A TurboJPEG or libjpeg state left behind by an error must not fail (or change) the next image.
  const Bytes good = encode_rgb(256, 192);
  const size_t sos = find_marker(good, 0xDA);
  Bytes flipped = good;
  for (size_t i = sos + 20; i < flipped.size() - 2; ++i) flipped[i] ^= std::byte{0xFF};
  Bytes stray = good;
  stray[(sos + good.size()) / 2] = std::byte{0xFF};
  stray[(sos + good.size()) / 2 + 1] = std::byte{0x99};
  // Garbage over the second half of a small file reaches into its tables: the header read fails
  // part-way (TurboJPEG 2.1 then left its handle mid-header, and failed the next good header).
  Bytes small = encode_rgb(24, 16);
  uint32_t x = 12345;
  for (size_t k = small.size() / 2; k < small.size(); ++k) {
    x = x * 1664525u + 1013904223u;
    small[k] = static_cast<std::byte>(x >> 24);
  }
  const std::vector<Bytes> bad = {
      flipped,
      stray,
      Bytes(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(good.size() / 2)),
      Bytes(good.begin(), good.begin() + 20),
      text_bytes("not a jpeg at all"),
      small};
  const ImageSize out_size{48, 48};
  std::vector<std::byte> out(48 * 48 * 3), expected(48 * 48 * 3), exact(256 * 192 * 3),
      exact_expected(256 * 192 * 3);
  const prestage::detail::CropBox box{10, 20, 120, 150, true};
  using Path = std::function<void(JpegDecoder&, const Bytes&, std::vector<std::byte>&)>;
  const std::vector<std::pair<const char*, Path>> paths = {
      {"exact",
       [&](JpegDecoder& d, const Bytes& b, std::vector<std::byte>& o) {
         o.resize(256 * 192 * 3);
         d.decode_exact(b, ImageSize{192, 256}, o, "a.jpg");
       }},
      {"resized",
       [&](JpegDecoder& d, const Bytes& b, std::vector<std::byte>& o) {
         o.resize(48 * 48 * 3);
         d.decode_resized(b, out_size, o, "a.jpg");
       }},
      {"crop",
       [&](JpegDecoder& d, const Bytes& b, std::vector<std::byte>& o) {
         o.resize(48 * 48 * 3);
         d.decode_crop(b, box, out_size, o, "a.jpg");
       }},
      {"random crop",
       [&](JpegDecoder& d, const Bytes& b, std::vector<std::byte>& o) {
         o.resize(48 * 48 * 3);
         d.decode_random_crop(b, out_size, 1, 2, 3, o, "a.jpg");
       }},
  };
  for (const auto& [name, decode_with] : paths) {
    JpegDecoder fresh(kDefaultMaxPixels);
    decode_with(fresh, good, expected);
    for (size_t k = 0; k < bad.size(); ++k) {
      for (const auto& [failing_name, fail_with] : paths) {
        CAPTURE(name);
        CAPTURE(failing_name);
        CAPTURE(k);
        JpegDecoder reused(kDefaultMaxPixels);
        CHECK_THROWS_AS(fail_with(reused, bad[k], out), DecodeError);
        const auto header = reused.header(good, "a.jpg");
        CHECK((header.width == 256 && header.height == 192));
        REQUIRE_NOTHROW(decode_with(reused, good, out));
        CHECK(out == expected);
      }
    }
  }
}
