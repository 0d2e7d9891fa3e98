#include "decode/transform.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "util/prng.hpp"

namespace prestage::detail {
namespace {

constexpr double kMinScale = 0.08;
constexpr double kMaxScale = 1.0;
constexpr double kMinRatio = 3.0 / 4.0;
constexpr double kMaxRatio = 4.0 / 3.0;
constexpr int kTries = 10;
// Keeps crop streams apart from the plan's permutation streams of the same seed.
constexpr uint64_t kCropTag = 0x6372'6f70'5f72'7263ULL;

// A generator of its own for each (seed, epoch, sample).
class Draws {
 public:
  Draws(uint64_t seed, uint64_t epoch, uint64_t index)
      : rng_(seed ^ kCropTag, stream(epoch, index)) {}
  double uniform() { return static_cast<double>(rng_.next() >> 11) * 0x1.0p-53; }

 private:
  static uint64_t stream(uint64_t epoch, uint64_t index) {
    uint64_t state = epoch;
    uint64_t mixed = splitmix64(state) ^ index;
    return splitmix64(mixed);
  }
  Xoshiro256 rng_;
};

// Python's round(): half to even (the default floating-point rounding mode).
int64_t round_half_even(double x) {
  const double r = x - std::floor(x) == 0.5 ? 2.0 * std::round(x / 2.0) : std::round(x);
  return static_cast<int64_t>(r);
}

// torch.randint(0, n): a value in [0, n).
int randint(double u, int64_t n) {
  return static_cast<int>(
      std::min<int64_t>(static_cast<int64_t>(u * static_cast<double>(n)), n - 1));
}

}  // namespace

CropBox random_resized_crop(uint64_t seed, uint64_t epoch, uint64_t index, int height, int width) {
  Draws draws(seed, epoch, index);
  CropBox box;
  const double area = static_cast<double>(height) * static_cast<double>(width);
  const double log_min = std::log(kMinRatio);
  const double log_max = std::log(kMaxRatio);
  bool found = false;
  for (int attempt = 0; attempt < kTries && !found; ++attempt) {
    const double target_area = area * (kMinScale + (kMaxScale - kMinScale) * draws.uniform());
    const double aspect = std::exp(log_min + (log_max - log_min) * draws.uniform());
    const int64_t w = round_half_even(std::sqrt(target_area * aspect));
    const int64_t h = round_half_even(std::sqrt(target_area / aspect));
    if (0 < w && w <= width && 0 < h && h <= height) {
      box.top = randint(draws.uniform(), height - h + 1);
      box.left = randint(draws.uniform(), width - w + 1);
      box.height = static_cast<int>(h);
      box.width = static_cast<int>(w);
      found = true;
    }
  }
  if (!found) {
    const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
    int64_t w = width;
    int64_t h = height;
    if (in_ratio < kMinRatio) {
      h = round_half_even(static_cast<double>(w) / kMinRatio);
    } else if (in_ratio > kMaxRatio) {
      w = round_half_even(static_cast<double>(h) * kMaxRatio);
    }
    box.height = static_cast<int>(std::clamp<int64_t>(h, 1, height));
    box.width = static_cast<int>(std::clamp<int64_t>(w, 1, width));
    box.top = (height - box.height) / 2;
    box.left = (width - box.width) / 2;
  }
  box.flip = draws.uniform() < 0.5;
  return box;
}

std::vector<double> crop_draws(uint64_t seed, uint64_t epoch, uint64_t index, size_t count) {
  Draws draws(seed, epoch, index);
  std::vector<double> out(count);
  for (auto& u : out) u = draws.uniform();
  return out;
}

Normalizer::Normalizer(const LoaderDecodeOptions& options) {
  for (int c = 0; c < 3; ++c) {
    for (int v = 0; v < 256; ++v) {
      table[c][v] = static_cast<float>((v / 255.0 - options.mean[c]) / options.stddev[c]);
    }
  }
}

size_t image_sample_bytes(uint32_t height, uint32_t width, OutputType type) {
  return size_t{height} * width * 3 * (type == OutputType::kFloat32 ? sizeof(float) : 1);
}

void convert_image(const uint8_t* rgb, int height, int width, Layout layout, OutputType type,
                   const Normalizer* normalizer, std::byte* out) {
  const size_t pixels = static_cast<size_t>(height) * static_cast<size_t>(width);
  if (type == OutputType::kUint8) {
    auto* dst = reinterpret_cast<uint8_t*>(out);
    if (layout == Layout::kNHWC) {
      std::memcpy(dst, rgb, pixels * 3);
      return;
    }
    for (size_t i = 0; i < pixels; ++i) {
      dst[i] = rgb[3 * i];
      dst[pixels + i] = rgb[3 * i + 1];
      dst[2 * pixels + i] = rgb[3 * i + 2];
    }
    return;
  }
  // The batch buffer is page-aligned and every image's size is a multiple of 4 bytes, so floats
  // are aligned; memcpy keeps that an assumption the compiler need not trust.
  const auto& t = normalizer->table;
  if (layout == Layout::kNHWC) {
    for (size_t i = 0; i < pixels; ++i) {
      const float v[3] = {t[0][rgb[3 * i]], t[1][rgb[3 * i + 1]], t[2][rgb[3 * i + 2]]};
      std::memcpy(out + 3 * i * sizeof(float), v, sizeof(v));
    }
    return;
  }
  for (int c = 0; c < 3; ++c) {
    std::byte* plane = out + static_cast<size_t>(c) * pixels * sizeof(float);
    for (size_t i = 0; i < pixels; ++i) {
      const float v = t[c][rgb[3 * i + static_cast<size_t>(c)]];
      std::memcpy(plane + i * sizeof(float), &v, sizeof(float));
    }
  }
}

}  // namespace prestage::detail
