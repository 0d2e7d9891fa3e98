// Stage 3 resampler: antialiased bilinear resize of RGB images with a source box (Pillow's
// BILINEAR).
#include "decode/resize.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

namespace {

using prestage::detail::resize_rgb;
using prestage::detail::ResizeScratch;

struct Image {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;  // rows contiguous, RGB

  Image(int w, int h) : width(w), height(h), pixels(static_cast<size_t>(w) * h * 3) {}
  size_t stride() const { return static_cast<size_t>(width) * 3; }
  uint8_t& at(int x, int y, int c) { return pixels[(static_cast<size_t>(y) * width + x) * 3 + c]; }
  uint8_t at(int x, int y, int c) const {
    return pixels[(static_cast<size_t>(y) * width + x) * 3 + c];
  }
};

template <typename F>
Image make_image(int w, int h, F value) {
  Image image(w, h);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int c = 0; c < 3; ++c) image.at(x, y, c) = static_cast<uint8_t>(value(x, y, c));
    }
  }
  return image;
}

Image noise(int w, int h, unsigned seed) {
  uint32_t state = seed * 2654435761u + 1;
  return make_image(w, h, [&](int, int, int) {
    state = state * 1664525u + 1013904223u;
    return state >> 24;
  });
}

Image resize(const Image& src, double x0, double y0, double x1, double y1, int w, int h,
             ResizeScratch& scratch) {
  Image dst(w, h);
  resize_rgb(src.pixels.data(), src.width, src.height, src.stride(), x0, y0, x1, y1,
             dst.pixels.data(), w, h, dst.stride(), scratch);
  return dst;
}

Image resize(const Image& src, int w, int h) {
  ResizeScratch scratch;
  return resize(src, 0, 0, src.width, src.height, w, h, scratch);
}

// Pillow's Resample.c for 8-bit RGB, transcribed as plainly as possible (one pixel and one tap at a
// time, whole source), to check the optimised passes against.
struct PillowTaps {
  int taps = 0;
  std::vector<int> first, count;
  std::vector<int32_t> weights;
};

PillowTaps pillow_taps(int in_size, double in0, double in1, int out_size) {
  const double scale = (in1 - in0) / out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = filter_scale;
  PillowTaps t;
  t.taps = static_cast<int>(std::ceil(support)) * 2 + 1;
  t.first.resize(out_size);
  t.count.resize(out_size);
  t.weights.assign(static_cast<size_t>(out_size) * t.taps, 0);
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = in0 + (xx + 0.5) * scale;
    const int xmin = std::max(static_cast<int>(center - support + 0.5), 0);
    const int xmax = std::min(static_cast<int>(center + support + 0.5), in_size) - xmin;
    std::vector<double> k(t.taps, 0.0);
    double total = 0;
    for (int x = 0; x < xmax; ++x) {
      const double d = std::fabs((x + xmin - center + 0.5) / filter_scale);
      k[x] = d < 1.0 ? 1.0 - d : 0.0;
      total += k[x];
    }
    for (int x = 0; x < xmax; ++x) {
      const double w = total != 0.0 ? k[x] / total : k[x];
      const double fixed = w * (1 << 22);
      t.weights[static_cast<size_t>(xx) * t.taps + x] =
          static_cast<int32_t>(fixed < 0 ? fixed - 0.5 : fixed + 0.5);
    }
    t.first[xx] = xmin;
    t.count[xx] = xmax;
  }
  return t;
}

uint8_t pillow_clip(int32_t sum) { return static_cast<uint8_t>(std::clamp(sum >> 22, 0, 255)); }

Image pillow_horizontal(const Image& src, const PillowTaps& t, int w) {
  Image dst(w, src.height);
  for (int y = 0; y < src.height; ++y) {
    for (int xx = 0; xx < w; ++xx) {
      for (int c = 0; c < 3; ++c) {
        int32_t sum = 1 << 21;
        for (int k = 0; k < t.count[xx]; ++k) {
          sum += src.at(t.first[xx] + k, y, c) * t.weights[static_cast<size_t>(xx) * t.taps + k];
        }
        dst.at(xx, y, c) = pillow_clip(sum);
      }
    }
  }
  return dst;
}

Image pillow_vertical(const Image& src, const PillowTaps& t, int h) {
  Image dst(src.width, h);
  for (int yy = 0; yy < h; ++yy) {
    for (int x = 0; x < src.width; ++x) {
      for (int c = 0; c < 3; ++c) {
        int32_t sum = 1 << 21;
        for (int k = 0; k < t.count[yy]; ++k) {
          sum += src.at(x, t.first[yy] + k, c) * t.weights[static_cast<size_t>(yy) * t.taps + k];
        }
        dst.at(x, yy, c) = pillow_clip(sum);
      }
    }
  }
  return dst;
}

// Image.resize((w, h), Image.BILINEAR, box=(x0, y0, x1, y1)), Pillow 13: passes that would be the
// identity are skipped, and the vertical one goes first when it removes more than twice as many
// pixels.
Image pillow_resize(const Image& src, double x0, double y0, double x1, double y1, int w, int h) {
  const bool horizontal = w != src.width || x0 != 0 || x1 != src.width;
  const bool vertical = h != src.height || y0 != 0 || y1 != src.height;
  const PillowTaps th = pillow_taps(src.width, x0, x1, w);
  const PillowTaps tv = pillow_taps(src.height, y0, y1, h);
  if (horizontal && vertical && src.height - h > 0 &&
      src.height - h > 2 * (int64_t{src.width} - w)) {
    return pillow_horizontal(pillow_vertical(src, tv, h), th, w);
  }
  Image out = src;
  if (horizontal) out = pillow_horizontal(out, th, w);
  if (vertical) out = pillow_vertical(out, tv, h);
  return out;
}

Image mirrored(const Image& src) {
  return make_image(src.width, src.height,
                    [&](int x, int y, int c) { return src.at(src.width - 1 - x, y, c); });
}

}  // namespace

TEST_CASE("resize: same size and the full box is the identity") {
  const Image src = noise(37, 23, 1);
  CHECK(resize(src, 37, 23).pixels == src.pixels);
}

TEST_CASE("resize: a box at integer offsets with scale 1 is an exact crop") {
  const Image src = noise(64, 48, 2);
  ResizeScratch scratch;
  const Image dst = resize(src, 10, 5, 30, 35, 20, 30, scratch);
  const Image expected =
      make_image(20, 30, [&](int x, int y, int c) { return src.at(x + 10, y + 5, c); });
  CHECK(dst.pixels == expected.pixels);
}

TEST_CASE("resize: a constant image stays constant at every scale") {
  const Image src = make_image(101, 77, [](int, int, int c) {
    return c == 0 ? 200 : c == 1 ? 17 : 255;
  });
  ResizeScratch scratch;
  struct Size {
    int w, h;
  };
  for (const Size size : {Size{224, 224}, Size{13, 9}, Size{300, 40}, Size{1, 1}}) {
    const int w = size.w;
    const int h = size.h;
    CAPTURE(w);
    CAPTURE(h);
    const Image dst = resize(src, 3.25, 1.5, 99.75, 70.125, w, h, scratch);
    for (int y = 0; y < h; ++y) {
      for (int x = 0; x < w; ++x) {
        REQUIRE(dst.at(x, y, 0) == 200);
        REQUIRE(dst.at(x, y, 1) == 17);
        REQUIRE(dst.at(x, y, 2) == 255);
      }
    }
  }
}

TEST_CASE("resize: a horizontal gradient stays monotonic when shrunk or enlarged") {
  const Image src = make_image(256, 16, [](int x, int, int c) { return c == 2 ? 255 - x : x; });
  for (const int w : {100, 255, 257, 700}) {
    CAPTURE(w);
    const Image dst = resize(src, w, 7);
    for (int y = 0; y < dst.height; ++y) {
      for (int x = 1; x < w; ++x) {
        REQUIRE(dst.at(x, y, 0) >= dst.at(x - 1, y, 0));
        REQUIRE(dst.at(x, y, 1) >= dst.at(x - 1, y, 1));
        REQUIRE(dst.at(x, y, 2) <= dst.at(x - 1, y, 2));
      }
    }
    CHECK(dst.at(w - 1, 0, 0) - dst.at(0, 0, 0) > 200);
  }
}

TEST_CASE("resize: halving a one-pixel checkerboard gives mid-grey (antialiasing)") {
  const Image src =
      make_image(64, 64, [](int x, int y, int) { return (x + y) % 2 == 0 ? 0 : 255; });
  const Image dst = resize(src, 32, 32);
  // The border pixels see a truncated filter, as in Pillow; the interior sees whole periods.
  for (int y = 1; y < 31; ++y) {
    for (int x = 1; x < 31; ++x) {
      for (int c = 0; c < 3; ++c) {
        const int v = dst.at(x, y, c);
        REQUIRE(v >= 127);
        REQUIRE(v <= 128);
      }
    }
  }
}

TEST_CASE("resize: the box selects the region it names") {
  // Four quadrants of distinct colours; each box covers one quadrant (with a downscale).
  const Image src = make_image(80, 60, [](int x, int y, int c) {
    const int quadrant = (x >= 40 ? 1 : 0) + (y >= 30 ? 2 : 0);
    return quadrant * 60 + c * 10;
  });
  ResizeScratch scratch;
  struct Case {
    double x0, y0, x1, y1;
    int quadrant;
  };
  for (const Case& box : {Case{0, 0, 40, 30, 0}, Case{40, 0, 80, 30, 1}, Case{0, 30, 40, 60, 2},
                          Case{40, 30, 80, 60, 3}}) {
    CAPTURE(box.quadrant);
    // At a 4x reduction the filter reaches 4 px beyond the box; stay clear of the other quadrants.
    const Image dst = resize(src, box.x0, box.y0, box.x1, box.y1, 10, 6, scratch);
    for (int y = 1; y < 5; ++y) {
      for (int x = 1; x < 9; ++x) {
        for (int c = 0; c < 3; ++c) REQUIRE(dst.at(x, y, c) == box.quadrant * 60 + c * 10);
      }
    }
  }
}

TEST_CASE("resize: matches Pillow's BILINEAR resize on small examples") {
  const Image src =
      make_image(7, 5, [](int x, int y, int c) { return (x * 37 + y * 91 + c * 53) % 256; });
  ResizeScratch scratch;
  // Image.fromarray(src).resize((3, 4), Image.BILINEAR, box=(0.5, 0.25, 6.5, 4.75)), Pillow 13.
  const std::vector<uint8_t> with_box = {
      69, 122, 152, 143, 173, 159, 150, 139, 108, 140, 136, 125, 128, 146, 93,  96, 114, 167,
      99, 95,  119, 87,  140, 158, 161, 179, 126, 113, 166, 178, 146, 115, 104, 95, 125, 111};
  CHECK(resize(src, 0.5, 0.25, 6.5, 4.75, 3, 4, scratch).pixels == with_box);
  // .resize((11, 3), Image.BILINEAR): enlarges along x, shrinks along y.
  const std::vector<uint8_t> stretched = {
      39,  92,  145, 56,  109, 162, 79,  132, 175, 103, 156, 129, 126, 179, 122, 150, 203,
      146, 174, 157, 170, 167, 140, 153, 121, 164, 84,  134, 108, 94,  151, 58,  111, 125,
      178, 89,  142, 130, 106, 152, 76,  124, 86,  100, 111, 70,  123, 119, 94,  147, 143,
      118, 134, 130, 126, 137, 133, 113, 161, 157, 131, 153, 180, 148, 144, 197, 69,  122,
      175, 86,  139, 192, 109, 162, 202, 133, 186, 133, 156, 156, 116, 180, 87,  140, 111,
      111, 94,  81,  134, 77,  105, 158, 101, 128, 121, 124, 145, 88,  141};
  CHECK(resize(src, 0, 0, 7, 5, 11, 3, scratch).pixels == stretched);
}

TEST_CASE("resize: strides are honoured and bytes past each row are left alone") {
  const Image src = noise(30, 20, 3);
  const size_t src_stride = src.stride() + 7;
  std::vector<uint8_t> padded_src(src_stride * 20, 0xAB);
  for (int y = 0; y < 20; ++y) {
    std::copy_n(&src.pixels[static_cast<size_t>(y) * src.stride()], src.stride(),
                &padded_src[static_cast<size_t>(y) * src_stride]);
  }
  const int w = 17;
  const int h = 11;
  const size_t dst_stride = static_cast<size_t>(w) * 3 + 5;
  std::vector<uint8_t> padded_dst(dst_stride * h, 0xCD);
  ResizeScratch scratch;
  resize_rgb(padded_src.data(), 30, 20, src_stride, 1.5, 2.0, 29.0, 19.5, padded_dst.data(), w, h,
             dst_stride, scratch);
  const Image expected = resize(src, 1.5, 2.0, 29.0, 19.5, w, h, scratch);
  for (int y = 0; y < h; ++y) {
    const uint8_t* row = &padded_dst[static_cast<size_t>(y) * dst_stride];
    CHECK(std::equal(row, row + w * 3, &expected.pixels[static_cast<size_t>(y) * w * 3]));
    CHECK(std::all_of(row + w * 3, row + dst_stride, [](uint8_t b) { return b == 0xCD; }));
  }
}

TEST_CASE("resize: a reused scratch gives the same pixels as a fresh one") {
  const Image big = noise(400, 300, 4);
  const Image small = noise(50, 40, 5);
  ResizeScratch reused;
  resize(big, 0, 0, 400, 300, 333, 250, reused);
  const Image after = resize(small, 2.5, 1.0, 47.0, 39.0, 31, 17, reused);
  ResizeScratch fresh;
  CHECK(after.pixels == resize(small, 2.5, 1.0, 47.0, 39.0, 31, 17, fresh).pixels);
}

TEST_CASE("resize: an empty or out-of-bounds box or a bad size is rejected") {
  const Image src = noise(20, 10, 6);
  Image dst(5, 5);
  ResizeScratch scratch;
  auto call = [&](double x0, double y0, double x1, double y1, int w, int h) {
    resize_rgb(src.pixels.data(), 20, 10, src.stride(), x0, y0, x1, y1, dst.pixels.data(), w, h,
               dst.stride(), scratch);
  };
  CHECK_THROWS_AS(call(5, 0, 5, 10, 5, 5), std::invalid_argument);
  CHECK_THROWS_AS(call(-1, 0, 10, 10, 5, 5), std::invalid_argument);
  CHECK_THROWS_AS(call(0, 0, 20.5, 10, 5, 5), std::invalid_argument);
  CHECK_THROWS_AS(call(0, 0, 20, 10, 0, 5), std::invalid_argument);
  CHECK_THROWS_AS(call(0, 0, 20, 10, 6, 5), std::invalid_argument);  // stride too short
  CHECK_NOTHROW(call(0, 0, 20, 10, 5, 5));
}

TEST_CASE("resize: equals Pillow's algorithm, flipped or not, on random sizes and boxes") {
  // Covers both pass orders, enlarging and shrinking, 3 to 15 taps, strips of every height and
  // boxes that reach the source's edges.
  std::mt19937 random(7);
  auto uniform = [&](double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(random);
  };
  ResizeScratch scratch;
  for (int trial = 0; trial < 400; ++trial) {
    const int sw = 1 + static_cast<int>(random() % (trial % 10 == 0 ? 400 : 60));
    const int sh = 1 + static_cast<int>(random() % (trial % 10 == 0 ? 400 : 60));
    const int w = trial % 5 == 0 ? 224 : 1 + static_cast<int>(random() % 50);
    const int h = trial % 5 == 0 ? 224 : 1 + static_cast<int>(random() % 50);
    double x0 = 0, y0 = 0, x1 = sw, y1 = sh;
    if (trial % 3 != 0) {
      x0 = uniform(0, sw * 0.5);
      x1 = std::min<double>(sw, x0 + (sw - x0) * uniform(0.05, 1.0));
      y0 = uniform(0, sh * 0.5);
      y1 = std::min<double>(sh, y0 + (sh - y0) * uniform(0.05, 1.0));
    }
    if (!(x0 < x1 && y0 < y1)) continue;
    const bool flip = trial % 2 == 1;
    CAPTURE(sw);
    CAPTURE(sh);
    CAPTURE(w);
    CAPTURE(h);
    CAPTURE(flip);
    const Image src = noise(sw, sh, static_cast<unsigned>(trial));
    Image dst(w, h);
    resize_rgb(src.pixels.data(), sw, sh, src.stride(), x0, y0, x1, y1, dst.pixels.data(), w, h,
               dst.stride(), scratch, flip);
    const Image expected = pillow_resize(src, x0, y0, x1, y1, w, h);
    REQUIRE(dst.pixels == (flip ? mirrored(expected) : expected).pixels);
  }
}
