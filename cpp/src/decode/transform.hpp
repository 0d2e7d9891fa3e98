// Stage 3, image transforms around the JPEG codec: torchvision's RandomResizedCrop parameters drawn
// from a per-(seed, epoch, sample) generator, and the conversion of decoded RGB images to the
// batch's layout and element type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "prestage/options.hpp"

namespace prestage::detail {

// A crop box in source pixels, and whether the crop is then flipped left to right.
struct CropBox {
  int top = 0;
  int left = 0;
  int height = 0;
  int width = 0;
  bool flip = false;
};

// torchvision's RandomResizedCrop.get_params with scale (0.08, 1) and ratio (3/4, 4/3): ten tries
// of area = scale * H * W and a log-uniform aspect ratio, w = round(sqrt(area * ratio)), h =
// round(sqrt(area / ratio)) (half to even, as Python's round), accepted if it fits; else the centre
// crop with the ratio clamped. Then RandomHorizontalFlip(0.5). Every random number is a uniform
// double u in [0, 1) from CropDraws (randint(0, n) is floor(u * n)), so the same (seed, epoch,
// index) gives the same box on every machine.
CropBox random_resized_crop(uint64_t seed, uint64_t epoch, uint64_t index, int height, int width);

// The uniform doubles that random_resized_crop(seed, epoch, index, ...) consumes, in order (at most
// 23: 10 tries of 2, a position of 2, the flip). For tests that replay torchvision's algorithm.
std::vector<double> crop_draws(uint64_t seed, uint64_t epoch, uint64_t index, size_t count);

// Per-channel lookup tables for the float32 output: (v / 255 - mean[c]) / std[c].
struct Normalizer {
  float table[3][256];
  explicit Normalizer(const LoaderDecodeOptions& options);
};

// Writes an RGB image (height x width x 3, packed) as one sample of the batch: NHWC or NCHW, uint8
// or float32 (through `normalizer`, which kUint8 ignores: it may be null then).
void convert_image(const uint8_t* rgb, int height, int width, Layout layout, OutputType type,
                   const Normalizer* normalizer, std::byte* out);

// Bytes of one image in the batch buffer.
size_t image_sample_bytes(uint32_t height, uint32_t width, OutputType type);

}  // namespace prestage::detail
