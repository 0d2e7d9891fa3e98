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

// The passes are compiled twice, for AVX2 and for the baseline, and the loader picks one at load
// time (GCC/Clang function multiversioning through an ifunc): the library runs on any x86-64 and
// uses 8 lanes of 32-bit arithmetic where it can. The integer results do not depend on the version.
// Not under ThreadSanitizer: an ifunc resolver runs before its runtime is set up, and crashes.
#if defined(__SANITIZE_THREAD__)
#define PRESTAGE_NO_IFUNC 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define PRESTAGE_NO_IFUNC 1
#endif
#endif
#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__) && !defined(PRESTAGE_NO_IFUNC)
#define PRESTAGE_MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define PRESTAGE_MULTIVERSION
#endif

// Pillow's sum for kLanes contiguous bytes: each lane is the weighted sum of the bytes `step` apart
// in n rows (kTaps > 0: n is kTaps, so the loop unrolls). Fixed-length lane loops with the sums in
// (vector) registers are what compilers vectorise, at -O2 as well: the two passes below only
// arrange their data so that the taps of kLanes outputs lie `step` bytes apart.
template <size_t kLanes, int kTaps>
[[gnu::always_inline]] inline void convolve(const uint8_t* p, size_t step, const int32_t* w,
                                            int32_t n, uint8_t* out) {
  int32_t sums[kLanes];
  for (size_t j = 0; j < kLanes; ++j) sums[j] = kRoundingBias;
  if constexpr (kTaps > 0) n = kTaps;
  for (int32_t k = 0; k < n; ++k, p += step) {
    const int32_t weight = w[k];
    for (size_t j = 0; j < kLanes; ++j) sums[j] += int32_t{p[j]} * weight;
  }
  for (size_t j = 0; j < kLanes; ++j) out[j] = clip8(sums[j]);
}

// Resamples `columns` columns along y. `src` holds source row `row_offset` at its start.
PRESTAGE_MULTIVERSION
void vertical_pass(const uint8_t* src, size_t src_stride, int row_offset, int columns,
                   const ResampleTaps& taps, int out_h, uint8_t* dst, size_t dst_stride) {
  constexpr size_t kWide = 64;
  constexpr size_t kNarrow = 16;
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
    for (; x + kWide <= row_bytes; x += kWide) {
      convolve<kWide, 0>(in + x, src_stride, w, n, out + x);
    }
    for (; x + kNarrow <= row_bytes; x += kNarrow) {
      convolve<kNarrow, 0>(in + x, src_stride, w, n, out + x);
    }
    if (x == row_bytes) continue;
    if (row_bytes >= kNarrow) {
      // The last bytes again, overlapping ones already written: they get the same values.
      x = row_bytes - kNarrow;
      convolve<kNarrow, 0>(in + x, src_stride, w, n, out + x);
      continue;
    }
    for (; x < row_bytes; ++x) convolve<1, 0>(in + x, src_stride, w, n, out + x);
  }
}

// The horizontal pass works on strips of kStripRows rows, transposed so that each source column's
// kStripRows pixels are contiguous: every output pixel is then the same fixed-length weighted sum
// of whole columns as in the vertical pass, instead of three scattered 3- to 7-tap sums.
constexpr int kStripRows = 16;
constexpr size_t kStripLanes = kStripRows * kChannels;

template <int kTaps>
[[gnu::always_inline]] inline void horizontal_strips(const uint8_t* src, size_t src_stride,
                                                     int column_offset, int rows,
                                                     const ResampleTaps& taps, int out_w,
                                                     uint8_t* dst, size_t dst_stride, bool flip,
                                                     uint8_t* columns, uint8_t* resampled) {
  const size_t taps_per_pixel = static_cast<size_t>(taps.taps_per_pixel);
  const int32_t* const first = taps.first.data();
  const int32_t* const count = taps.count.data();
  const int32_t* const weights = taps.weights.data();
  const int begin = first[0];
  const size_t last = static_cast<size_t>(out_w) - 1;
  const size_t width = static_cast<size_t>(first[last] + count[last] - begin);
  for (int y0 = 0; y0 < rows; y0 += kStripRows) {
    const int strip_rows = std::min(kStripRows, rows - y0);
    // A short last strip repeats its last row: the lanes stay fixed, and only real rows are
    // written back.
    const uint8_t* row[kStripRows];
    for (int r = 0; r < kStripRows; ++r) {
      row[r] = src + static_cast<size_t>(y0 + std::min(r, strip_rows - 1)) * src_stride +
               static_cast<size_t>(begin - column_offset) * kChannels;
    }
    // Pixels move as 4-byte words, whose fourth byte is overwritten by the next pixel stored (the
    // buffers have a byte to spare at the end); the last column, whose word would read past the
    // source row, moves as 3 bytes.
    for (size_t x = 0; x + 1 < width; ++x) {
      uint8_t* column = columns + x * kStripLanes;
      for (int r = 0; r < kStripRows; ++r) {
        std::memcpy(column + static_cast<size_t>(r) * kChannels, row[r] + x * kChannels, 4);
      }
    }
    for (int r = 0; r < kStripRows; ++r) {
      std::memcpy(columns + (width - 1) * kStripLanes + static_cast<size_t>(r) * kChannels,
                  row[r] + (width - 1) * kChannels, kChannels);
    }
    const int32_t* w = weights;
    for (size_t xx = 0; xx <= last; ++xx, w += taps_per_pixel) {
      convolve<kStripLanes, kTaps>(columns + static_cast<size_t>(first[xx] - begin) * kStripLanes,
                                   kStripLanes, w, count[xx], resampled + xx * kStripLanes);
    }
    for (int r = 0; r < strip_rows; ++r) {
      uint8_t* out = dst + static_cast<size_t>(y0 + r) * dst_stride;
      const uint8_t* in = resampled + static_cast<size_t>(r) * kChannels;
      // In increasing order of destination, as words again; the last pixel of the row as 3 bytes.
      if (flip) {
        for (size_t x = 0; x < last; ++x) {
          std::memcpy(out + x * kChannels, in + (last - x) * kStripLanes, 4);
        }
        std::memcpy(out + last * kChannels, in, kChannels);
      } else {
        for (size_t x = 0; x < last; ++x) {
          std::memcpy(out + x * kChannels, in + x * kStripLanes, 4);
        }
        std::memcpy(out + last * kChannels, in + last * kStripLanes, kChannels);
      }
    }
  }
}

// Resamples `rows` rows along x, mirrored if `flip`. `src` holds source column `column_offset` at
// the start of each row.
PRESTAGE_MULTIVERSION
void horizontal_pass(const uint8_t* src, size_t src_stride, int column_offset, int rows,
                     const ResampleTaps& taps, int out_w, uint8_t* dst, size_t dst_stride,
                     bool flip, ResizeScratch& scratch) {
  const size_t last = static_cast<size_t>(out_w) - 1;
  const size_t width = static_cast<size_t>(taps.first[last] + taps.count[last] - taps.first[0]);
  grow(scratch.columns, width * kStripLanes + 1);
  grow(scratch.resampled, static_cast<size_t>(out_w) * kStripLanes + 1);
  uint8_t* const columns = scratch.columns.data();
  uint8_t* const resampled = scratch.resampled.data();
  // Widths 3, 5 and 7 cover every downscale up to 3x; after DCT scaling what is left is under 2x
  // unless even 1/8 was not enough.
  switch (taps.uniform ? taps.taps_per_pixel : 0) {
    case 3:
      return horizontal_strips<3>(src, src_stride, column_offset, rows, taps, out_w, dst,
                                  dst_stride, flip, columns, resampled);
    case 5:
      return horizontal_strips<5>(src, src_stride, column_offset, rows, taps, out_w, dst,
                                  dst_stride, flip, columns, resampled);
    case 7:
      return horizontal_strips<7>(src, src_stride, column_offset, rows, taps, out_w, dst,
                                  dst_stride, flip, columns, resampled);
    default:
      return horizontal_strips<0>(src, src_stride, column_offset, rows, taps, out_w, dst,
                                  dst_stride, flip, columns, resampled);
  }
}

void flip_rows(uint8_t* image, int width, int height, size_t stride) {
  for (int y = 0; y < height; ++y) {
    uint8_t* row = image + static_cast<size_t>(y) * stride;
    for (int a = 0, b = width - 1; a < b; ++a, --b) {
      std::swap_ranges(row + a * kChannels, row + (a + 1) * kChannels, row + b * kChannels);
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
                ResizeScratch& scratch, bool flip) {
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
    if (flip) flip_rows(dst, dst_w, dst_h, dst_stride);
    return;
  }
  if (!need_vertical) {
    compute_taps(src_w, x0, x1, dst_w, horizontal);
    make_uniform(horizontal, src_w, dst_w);
    horizontal_pass(src, src_stride, 0, src_h, horizontal, dst_w, dst, dst_stride, flip, scratch);
    return;
  }
  if (!need_horizontal) {
    compute_taps(src_h, y0, y1, dst_h, vertical);
    vertical_pass(src, src_stride, 0, src_w, vertical, dst_h, dst, dst_stride);
    if (flip) flip_rows(dst, dst_w, dst_h, dst_stride);
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
                    dst_stride, flip, scratch);
  } else {
    const int first = taps_first(vertical);
    const int rows = taps_end(vertical, dst_h) - first;
    grow(scratch.rows, static_cast<size_t>(rows) * dst_row_bytes);
    // Mirroring the columns before the vertical pass is mirroring its result: it treats every
    // column alike.
    horizontal_pass(src + static_cast<size_t>(first) * src_stride, src_stride, 0, rows, horizontal,
                    dst_w, scratch.rows.data(), dst_row_bytes, flip, scratch);
    vertical_pass(scratch.rows.data(), dst_row_bytes, first, dst_w, vertical, dst_h, dst,
                  dst_stride);
  }
}

}  // namespace prestage::detail
