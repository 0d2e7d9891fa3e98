// Stage 3: antialiased bilinear resampling of interleaved 8-bit RGB images, with the crop folded
// in. Gives the pixels of Pillow's Image.resize((w, h), Image.BILINEAR, box=...) exactly (the same
// fixed-point taps and sums), so that batches are the ones torchvision pipelines produce.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace prestage::detail {

// Per-output-pixel filter taps along one axis (private to resize.cpp; here because ResizeScratch
// owns it).
struct ResampleTaps {
  int taps_per_pixel = 0;        // stride of `weights`
  bool uniform = false;          // every count is taps_per_pixel
  std::vector<int32_t> first;    // first source index read by each output pixel
  std::vector<int32_t> count;    // number of source pixels read by each output pixel
  std::vector<int32_t> weights;  // fixed-point, taps_per_pixel per output pixel
  std::vector<double> exact;     // unrounded weights of one output pixel
};

// Working memory of resize_rgb. One per thread, reused for every image: buffers only grow, so once
// they have seen the largest image no call allocates. Not thread-safe.
struct ResizeScratch {
  ResampleTaps horizontal;
  ResampleTaps vertical;
  std::vector<uint8_t> rows;       // the image between the two passes
  std::vector<uint8_t> columns;    // a strip of rows of the horizontal pass's input, transposed
  std::vector<uint8_t> resampled;  // the same strip resampled, before it is transposed back
};

// Resamples the box [x0, x1) x [y0, y1) of `src` (src_w x src_h RGB pixels, rows `src_stride` bytes
// apart; box in source pixel units, fractional allowed) to dst_w x dst_h RGB pixels at `dst`, rows
// `dst_stride` bytes apart, with a triangle filter widened by the downscale factor. The source and
// destination must not overlap. `flip`: the result is mirrored left to right (as a flip after the
// resize; it costs nothing extra). The integer arithmetic is Pillow's, so the pixels are Pillow's
// whatever the instruction set the passes run on. Throws std::invalid_argument if a size is not
// positive, a stride is too small, or the box is empty or not inside the source (all programming
// errors).
void resize_rgb(const uint8_t* src, int src_w, int src_h, size_t src_stride, double x0, double y0,
                double x1, double y1, uint8_t* dst, int dst_w, int dst_h, size_t dst_stride,
                ResizeScratch& scratch, bool flip = false);

}  // namespace prestage::detail
