// Stage 3 random-resized-crop draws and image conversion.
#include "decode/transform.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

namespace {
using namespace prestage::detail;
}

TEST_CASE("transform: crops lie inside the image with torchvision's area and ratio bounds") {
  int fallbacks = 0;
  for (uint64_t index = 0; index < 2000; ++index) {
    const int h = 100 + static_cast<int>(index % 400);
    const int w = 700 - static_cast<int>(index % 500);
    const CropBox box = random_resized_crop(5, 1, index, h, w);
    REQUIRE(box.top >= 0);
    REQUIRE(box.left >= 0);
    REQUIRE(box.top + box.height <= h);
    REQUIRE(box.left + box.width <= w);
    const double area = double(box.height) * box.width / (double(h) * w);
    const double ratio = double(box.width) / box.height;
    if (box.height == h || box.width == w) {
      ++fallbacks;
      continue;
    }
    // Rounding moves the box by up to half a pixel per side.
    REQUIRE(area > 0.07);
    REQUIRE(ratio > 0.74 * (1 - 2.0 / box.height));
    REQUIRE(ratio < 1.34 * (1 + 2.0 / box.height));
  }
  CHECK(fallbacks < 200);
}

TEST_CASE("transform: the same (seed, epoch, index) gives the same crop, others differ") {
  const auto a = random_resized_crop(1, 2, 3, 375, 500);
  const auto b = random_resized_crop(1, 2, 3, 375, 500);
  CHECK(a.top == b.top);
  CHECK(a.left == b.left);
  CHECK(a.height == b.height);
  CHECK(a.width == b.width);
  CHECK(a.flip == b.flip);
  int same = 0, flips = 0;
  for (uint64_t i = 0; i < 100; ++i) {
    const auto c = random_resized_crop(1, 2, i, 375, 500);
    const auto d = random_resized_crop(1, 3, i, 375, 500);
    same += c.top == d.top && c.left == d.left && c.height == d.height;
    flips += c.flip;
  }
  CHECK(same < 5);
  CHECK(flips > 30);
  CHECK(flips < 70);
}

TEST_CASE("transform: an image too thin for any try falls back to torchvision's centre crop") {
  // 5 x 900: ratio 180, beyond 4/3: h = 5, w = round(5 * 4/3) = 7, centred.
  const auto box = random_resized_crop(0, 0, 0, 5, 900);
  CHECK(box.height == 5);
  CHECK(box.width == 7);
  CHECK(box.left == (900 - 7) / 2);
  CHECK(box.top == 0);
}

TEST_CASE("transform: float32 NCHW output is the normalised, transposed image") {
  prestage::LoaderOptions o;
  o.mean[0] = 0.5f;
  o.stddev[2] = 0.25f;
  const Normalizer norm(o);
  const uint8_t rgb[2 * 3] = {0, 51, 255, 255, 102, 0};  // two pixels
  std::vector<float> out(6);
  convert_image(rgb, 1, 2, prestage::Layout::kNCHW, prestage::OutputType::kFloat32, &norm,
                reinterpret_cast<std::byte*>(out.data()));
  CHECK(out[0] == doctest::Approx(-0.5));  // R of pixel 0
  CHECK(out[1] == doctest::Approx(0.5));   // R of pixel 1
  CHECK(out[2] == doctest::Approx(0.2));   // G of pixel 0
  CHECK(out[4] == doctest::Approx(4.0));   // B of pixel 0: 1 / 0.25
  CHECK(out[5] == doctest::Approx(0.0));
  std::vector<uint8_t> planes(6);
  convert_image(rgb, 1, 2, prestage::Layout::kNCHW, prestage::OutputType::kUint8, nullptr,
                reinterpret_cast<std::byte*>(planes.data()));
  CHECK(planes == std::vector<uint8_t>{0, 255, 51, 102, 255, 0});
}
