#include "decode/resize.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace prestage::detail {
namespace {

constexpr size_t kChannels = 3;

// Pillow's fixed point (Resample.c): 8 bits of result plus 2 bits of headroom in an int32 sum. With
// a triangle filter every weight is non-negative and they sum to one, so 255 * 2^22 cannot
// overflow.
constexpr int kPrecisionBits = 32 - 8 - 2;
constexpr int32_t kRoundingBias = int32_t{1} << (kPrecisionBits - 1);

// Grows only: a buffer that has seen the largest image never reallocates, and a smaller image does
// not pay for re-initialising elements when a larger one comes back.
template <typename T>
void grow(std::vector<T>& buffer, size_t size) {
  if (buffer.size() < size) buffer.resize(size);
}

double triangle(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

uint8_t clip8(int32_t sum) {
  return static_cast<uint8_t>(std::clamp(sum >> kPrecisionBits, 0, 255));
}

// Pillow's precompute_coeffs + normalize_coeffs_8bpc, kept step for step (including its truncating
// casts) so that the taps, and hence the pixels, are the ones Pillow computes.
void compute_taps(int in_size, double in0, double in1, int out_size, ResampleTaps& taps) {
  const double scale = (in1 - in0) / out_size;
  // Widening the filter by the downscale factor makes each output pixel average every source pixel
  // it covers instead of sampling a few of them (antialiasing).
  const double filter_scale = std::max(scale, 1.0);
  const double support = filter_scale;  // the triangle's support is 1
  const double inverse_filter_scale = 1.0 / filter_scale;
  const int taps_per_pixel = static_cast<int>(std::ceil(support)) * 2 + 1;
  const size_t out = static_cast<size_t>(out_size);

  taps.taps_per_pixel = taps_per_pixel;
  taps.uniform = false;
  grow(taps.first, out);
  grow(taps.count, out);
  grow(taps.weights, out * static_cast<size_t>(taps_per_pixel));
  grow(taps.exact, static_cast<size_t>(taps_per_pixel));

  for (int xx = 0; xx < out_size; ++xx) {
    const double center = in0 + (xx + 0.5) * scale;
    int xmin = std::max(static_cast<int>(center - support + 0.5), 0);
    int xmax = std::min(static_cast<int>(center + support + 0.5), in_size);
    // Unreachable for a valid box; keeps every read inside the source whatever the rounding.
    xmin = std::min(xmin, in_size - 1);
    xmax = std::clamp(xmax, xmin + 1, xmin + taps_per_pixel);
    const int count = xmax - xmin;

    double total = 0.0;
    for (int x = 0; x < count; ++x) {
      const double w = triangle((x + xmin - center + 0.5) * inverse_filter_scale);
      taps.exact[static_cast<size_t>(x)] = w;
      total += w;
    }
    int32_t* weights = &taps.weights[static_cast<size_t>(xx) * static_cast<size_t>(taps_per_pixel)];
    for (int x = 0; x < count; ++x) {
      double w = taps.exact[static_cast<size_t>(x)];
      if (total != 0.0) w /= total;
      const double fixed = w * (1 << kPrecisionBits);
      weights[x] = static_cast<int32_t>(fixed < 0 ? fixed - 0.5 : fixed + 0.5);
    }
    taps.first[static_cast<size_t>(xx)] = xmin;
    taps.count[static_cast<size_t>(xx)] = count;
  }
}

// Gives every output pixel taps_per_pixel taps: zero weights are added around its own, and the
// window is moved back inside the image at the right edge. The horizontal inner loop then has a
// fixed trip count, where varying counts cost a mispredicted branch every few pixels. The sums are
// of integers, so the pixels do not change.
void make_uniform(ResampleTaps& taps, int in_size, int out_size) {
  const int width = taps.taps_per_pixel;
  if (in_size < width) return;
  for (int xx = 0; xx < out_size; ++xx) {
    const size_t i = static_cast<size_t>(xx);
    int32_t* weights = &taps.weights[i * static_cast<size_t>(width)];
    const int count = taps.count[i];
    const int start = std::min(taps.first[i], in_size - width);
    const int shift = taps.first[i] - start;
    std::copy_backward(weights, weights + count, weights + shift + count);
    std::fill(weights, weights + shift, 0);
    std::fill(weights + shift + count, weights + width, 0);
    taps.first[i] = start;
    taps.count[i] = width;
  }
  taps.uniform = true;
}

// Resamples `rows` rows along x. `src` holds source column `column_offset` at the start of each
// row. The tables are read through local pointers: every byte stored to `dst` could otherwise alias
// the vectors' internals and force the compiler to reload them. kTaps > 0: every pixel has that
// many taps (see make_uniform), so the tap loop unrolls; kTaps == 0: counts vary.
template <int kTaps>
void horizontal_pass(const uint8_t* src, size_t src_stride, int column_offset, int rows,
                     const ResampleTaps& taps, int out_w, uint8_t* dst, size_t dst_stride) {
  const size_t taps_per_pixel = static_cast<size_t>(taps.taps_per_pixel);
  const int32_t* const first = taps.first.data();
  const int32_t* const count = taps.count.data();
  const int32_t* const weights = taps.weights.data();
  for (int y = 0; y < rows; ++y) {
    const uint8_t* in = src + static_cast<size_t>(y) * src_stride;
    uint8_t* out = dst + static_cast<size_t>(y) * dst_stride;
    const int32_t* w = weights;
    for (int xx = 0; xx < out_w; ++xx, w += taps_per_pixel, out += kChannels) {
      const uint8_t* p = in + static_cast<size_t>(first[xx] - column_offset) * kChannels;
      const int32_t n = kTaps > 0 ? kTaps : count[xx];
      int32_t r = kRoundingBias;
      int32_t g = kRoundingBias;
      int32_t b = kRoundingBias;
#pragma GCC unroll 8
      for (int32_t k = 0; k < n; ++k, p += kChannels) {
        r += p[0] * w[k];
        g += p[1] * w[k];
        b += p[2] * w[k];
      }
      out[0] = clip8(r);
      out[1] = clip8(g);
      out[2] = clip8(b);
    }
  }
}

void horizontal_pass(const uint8_t* src, size_t src_stride, int column_offset, int rows,
                     const ResampleTaps& taps, int out_w, uint8_t* dst, size_t dst_stride) {
  // Widths 3, 5 and 7 cover every downscale up to 3x; after DCT scaling what is left is under 2x
  // unless even 1/8 was not enough.
  auto* pass = &horizontal_pass<0>;
  if (taps.uniform) {
    switch (taps.taps_per_pixel) {
      case 3:
        pass = &horizontal_pass<3>;
        break;
      case 5:
        pass = &horizontal_pass<5>;
        break;
      case 7:
        pass = &horizontal_pass<7>;
        break;
      default:
        break;
    }
  }
  pass(src, src_stride, column_offset, rows, taps, out_w, dst, dst_stride);
}

// Resamples `columns` columns along y. `src` holds source row `row_offset` at its start. Each
// output row is computed in blocks of contiguous bytes whose sums stay in (vector) registers: the
// fixed block length lets the compiler vectorise even at -O2, whose cost model refuses loops that
// need alias checks or a scalar epilogue.
void vertical_pass(const uint8_t* src, size_t src_stride, int row_offset, int columns,
                   const ResampleTaps& taps, int out_h, uint8_t* dst, size_t dst_stride) {
  constexpr size_t kBlock = 16;
  const size_t row_bytes = static_cast<size_t>(columns) * kChannels;
  const size_t taps_per_pixel = static_cast<size_t>(taps.taps_per_pixel);
  const int32_t* const first = taps.first.data();
  const int32_t* const count = taps.count.data();
  const int32_t* w = taps.weights.data();
  for (int yy = 0; yy < out_h; ++yy, w += taps_per_pixel) {
    const uint8_t* in = src + static_cast<size_t>(first[yy] - row_offset) * src_stride;
    uint8_t* out = dst + static_cast<size_t>(yy) * dst_stride;
    const int32_t n = count[yy];
    size_t x = 0;
    for (; x + kBlock <= row_bytes; x += kBlock) {
      int32_t sums[kBlock];
      for (size_t j = 0; j < kBlock; ++j) sums[j] = kRoundingBias;
      const uint8_t* p = in + x;
      for (int32_t k = 0; k < n; ++k, p += src_stride) {
        for (size_t j = 0; j < kBlock; ++j) sums[j] += p[j] * w[k];
      }
      for (size_t j = 0; j < kBlock; ++j) out[x + j] = clip8(sums[j]);
    }
    for (; x < row_bytes; ++x) {
      int32_t sum = kRoundingBias;
      const uint8_t* p = in + x;
      for (int32_t k = 0; k < n; ++k, p += src_stride) sum += *p * w[k];
      out[x] = clip8(sum);
    }
  }
}

// The source pixels [first, end) that `taps` read, in increasing order.
int taps_first(const ResampleTaps& taps) { return taps.first[0]; }
int taps_end(const ResampleTaps& taps, int out_size) {
  const size_t last = static_cast<size_t>(out_size) - 1;
  return taps.first[last] + taps.count[last];
}

}  // namespace

void resize_rgb(const uint8_t* src, int src_w, int src_h, size_t src_stride, double x0, double y0,
                double x1, double y1, uint8_t* dst, int dst_w, int dst_h, size_t dst_stride,
                ResizeScratch& scratch) {
  if (src == nullptr || dst == nullptr) throw std::invalid_argument("resize_rgb: null image");
  if (src_w <= 0 || src_h <= 0 || dst_w <= 0 || dst_h <= 0) {
    throw std::invalid_argument("resize_rgb: image sizes must be positive");
  }
  const size_t src_row_bytes = static_cast<size_t>(src_w) * kChannels;
  const size_t dst_row_bytes = static_cast<size_t>(dst_w) * kChannels;
  if (src_stride < src_row_bytes || dst_stride < dst_row_bytes) {
    throw std::invalid_argument("resize_rgb: stride shorter than a row");
  }
  // Written so that NaN fails too.
  if (!(0.0 <= x0 && x0 < x1 && x1 <= src_w && 0.0 <= y0 && y0 < y1 && y1 <= src_h)) {
    throw std::invalid_argument("resize_rgb: box is empty or outside the source image");
  }

  // The same tests as Pillow: a pass that would be the identity is skipped.
  const bool need_horizontal = dst_w != src_w || x0 != 0.0 || x1 != src_w;
  const bool need_vertical = dst_h != src_h || y0 != 0.0 || y1 != src_h;
  ResampleTaps& horizontal = scratch.horizontal;
  ResampleTaps& vertical = scratch.vertical;

  if (!need_horizontal && !need_vertical) {
    for (int y = 0; y < src_h; ++y) {
      std::memcpy(dst + static_cast<size_t>(y) * dst_stride,
                  src + static_cast<size_t>(y) * src_stride, src_row_bytes);
    }
    return;
  }
  if (!need_vertical) {
    compute_taps(src_w, x0, x1, dst_w, horizontal);
    make_uniform(horizontal, src_w, dst_w);
    horizontal_pass(src, src_stride, 0, src_h, horizontal, dst_w, dst, dst_stride);
    return;
  }
  if (!need_horizontal) {
    compute_taps(src_h, y0, y1, dst_h, vertical);
    vertical_pass(src, src_stride, 0, src_w, vertical, dst_h, dst, dst_stride);
    return;
  }

  compute_taps(src_w, x0, x1, dst_w, horizontal);
  make_uniform(horizontal, src_w, dst_w);
  compute_taps(src_h, y0, y1, dst_h, vertical);
  // Pillow (from 13.0) runs the vertical pass first when the height shrinks by more than twice as
  // many pixels as the width; the intermediate image is rounded to 8 bits, so the order shows in
  // the last bit and is kept the same here. Either way, the first pass covers only the source
  // rows or columns that the second pass reads.
  const int64_t rows_removed = int64_t{src_h} - dst_h;
  const int64_t columns_removed = int64_t{src_w} - dst_w;
  if (rows_removed > 0 && rows_removed > 2 * columns_removed) {
    const int first = taps_first(horizontal);
    const int columns = taps_end(horizontal, dst_w) - first;
    const size_t row_bytes = static_cast<size_t>(columns) * kChannels;
    grow(scratch.rows, static_cast<size_t>(dst_h) * row_bytes);
    vertical_pass(src + static_cast<size_t>(first) * kChannels, src_stride, 0, columns, vertical,
                  dst_h, scratch.rows.data(), row_bytes);
    horizontal_pass(scratch.rows.data(), row_bytes, first, dst_h, horizontal, dst_w, dst,
                    dst_stride);
  } else {
    const int first = taps_first(vertical);
    const int rows = taps_end(vertical, dst_h) - first;
    grow(scratch.rows, static_cast<size_t>(rows) * dst_row_bytes);
    horizontal_pass(src + static_cast<size_t>(first) * src_stride, src_stride, 0, rows, horizontal,
                    dst_w, scratch.rows.data(), dst_row_bytes);
    vertical_pass(scratch.rows.data(), dst_row_bytes, first, dst_w, vertical, dst_h, dst,
                  dst_stride);
  }
}

}  // namespace prestage::detail
