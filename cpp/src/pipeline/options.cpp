#include <string>

#include "formats/array.hpp"
#include "prestage/error.hpp"
#include "prestage/options.hpp"

namespace prestage {

namespace {
void at_least(const char* name, uint64_t value, uint64_t minimum) {
  if (value < minimum) {
    throw ConfigError(std::string(name) + " must be at least " + std::to_string(minimum) +
                      ", got " + std::to_string(value));
  }
}

// raw_dtype and raw_shape: a type string the decoder knows and a shape that can be fitted to a
// sample (at most one -1, no other negative, not larger than max_sample_bytes).
void validate_raw_array(const LoaderDecodeOptions& o) {
  if (o.raw_dtype.empty()) {
    if (o.raw_shape) throw ConfigError("raw_shape needs a raw_dtype (the type of its items)");
    return;
  }
  if (o.decode != DecodeMode::kRaw) {
    throw ConfigError("raw_dtype and raw_shape apply to decode=raw only");
  }
  std::string why;
  const uint64_t item = detail::dtype_item_size(o.raw_dtype, why);
  if (item == 0) throw ConfigError("raw_dtype '" + o.raw_dtype + "' is not supported: " + why);
  if (!o.raw_shape) return;
  const auto& shape = *o.raw_shape;
  if (shape.size() > detail::kMaxDims) {
    throw ConfigError("raw_shape has " + std::to_string(shape.size()) + " dimensions, more than " +
                      std::to_string(detail::kMaxDims));
  }
  bool inferred = false;
  uint64_t bytes = item;
  for (const int64_t d : shape) {
    if (d == -1 && !inferred) {
      inferred = true;
      continue;
    }
    if (d < 0) {
      throw ConfigError("raw_shape takes sizes of at least 0 and at most one -1, got " +
                        std::to_string(d) + (d == -1 ? " twice" : ""));
    }
    const auto n = static_cast<uint64_t>(d);
    if (n != 0 && bytes > o.max_sample_bytes / n) {
      throw ConfigError("raw_shape describes samples larger than max_sample_bytes (" +
                        std::to_string(o.max_sample_bytes) + ")");
    }
    bytes *= n;
  }
  if (inferred && bytes == 0) {
    throw ConfigError("raw_shape cannot infer its -1 beside a dimension of size 0");
  }
}

}  // namespace

void LoaderPlanOptions::validate() const {
  at_least("batch_size", batch_size, 1);
  at_least("world_size", world_size, 1);
  if (rank >= world_size) {
    throw ConfigError("rank must be below world_size (" + std::to_string(world_size) + "), got " +
                      std::to_string(rank));
  }
}

// stage_dir and stage_group are checked where the loader opens them (IoError, UnsafePath,
// ConfigError); every cache_bytes, eviction and stage_patience_ms is valid.
void LoaderStagingOptions::validate() const {}

void LoaderDecodeOptions::validate() const {
  at_least("max_pixels", max_pixels, 1);
  if ((image_size.height == 0) != (image_size.width == 0)) {
    throw ConfigError("image_size needs both a height and a width (or neither)");
  }
  if (!decodes_images(decode) && !image_size.empty()) {
    throw ConfigError("image_size applies to decode=jpeg or image only");
  }
  if (!decodes_images(decode) && (layout != Layout::kNHWC || dtype != OutputType::kUint8 ||
                                  transform != Transform::kCenterCrop)) {
    throw ConfigError("transform, layout and dtype apply to decode=jpeg or image only");
  }
  if (transform == Transform::kRandomResizedCrop && image_size.empty()) {
    throw ConfigError("transform=random-resized-crop needs an image_size");
  }
  for (int c = 0; c < 3; ++c) {
    // Written so that NaN fails too.
    if (!(stddev[c] > 0.0f) || !(mean[c] == mean[c]) || stddev[c] > 1e30f || mean[c] > 1e30f ||
        mean[c] < -1e30f) {
      throw ConfigError("std must be positive and mean and std finite, per channel");
    }
    // uint8 images are not normalised: a mean or std given for them would be silently ignored.
    if (dtype != OutputType::kFloat32 && (mean[c] != 0.0f || stddev[c] != 1.0f)) {
      throw ConfigError("mean and std apply to dtype=float32 only");
    }
  }
  if (decode_device != DecodeDevice::kCpu && decode_device != DecodeDevice::kCuda) {
    throw ConfigError("decode_device must be cpu or cuda, got " +
                      std::to_string(static_cast<int>(decode_device)));
  }
  if (gpu_crop != GpuCrop::kAuto && gpu_crop != GpuCrop::kResize && gpu_crop != GpuCrop::kRoi) {
    throw ConfigError("gpu_crop must be auto, resize or roi, got " +
                      std::to_string(static_cast<int>(gpu_crop)));
  }
  if (gpu_cpu_share != kAutoShare && !(gpu_cpu_share >= 0.0 && gpu_cpu_share < 1.0)) {
    throw ConfigError("gpu_cpu_share must be in [0, 1) (or unset: sized at run time), got " +
                      std::to_string(gpu_cpu_share));
  }
  if (decode_device == DecodeDevice::kCuda) {
    if (decode != DecodeMode::kJpeg) {
      throw ConfigError("decode_device=cuda decodes JPEG images only (decode=jpeg)");
    }
    if (image_size.empty()) {
      throw ConfigError("decode_device=cuda needs an image_size (a device batch of one shape)");
    }
    if (layout != Layout::kNHWC || dtype != OutputType::kUint8) {
      throw ConfigError(
          "decode_device=cuda writes NHWC uint8 batches (layout=NHWC, dtype=uint8): convert or "
          "normalise on the device");
    }
  }
  at_least("max_sample_bytes", max_sample_bytes, 1);
  validate_raw_array(*this);
  if (on_error != OnError::kRaise && on_error != OnError::kSkip) {
    throw ConfigError("on_error must be raise or skip, got " +
                      std::to_string(static_cast<int>(on_error)));
  }
}

void LoaderTuningOptions::validate() const {
  // readers, prefetchers and lookahead: kAuto (0) or any count (the limits below).
  at_least("depth", depth, 2);
  constexpr uint64_t kMaxThreads = 1024;
  if (readers > kMaxThreads || prefetchers > kMaxThreads) {
    throw ConfigError("readers and prefetchers must be at most " + std::to_string(kMaxThreads));
  }
  if (depth > 4096 || lookahead > 1 << 20)
    throw ConfigError("depth or lookahead is unreasonably large");
}

void LoaderPeerOptions::validate() const {
  if (peers) at_least("peer_timeout_ms", peer_timeout_ms, 1);
}

// trace is opened, and io_timeout_ms taken as it is, when the loader is made.
void LoaderIoOptions::validate() const {}

void LoaderOptions::validate() const {
  // Options with several faults: the first named is the first in this order.
  LoaderPlanOptions::validate();
  LoaderTuningOptions::validate();
  LoaderDecodeOptions::validate();
  LoaderPeerOptions::validate();
  LoaderStagingOptions::validate();
  LoaderIoOptions::validate();
  // No rule spans two parts today: a new one goes here.
}

}  // namespace prestage
