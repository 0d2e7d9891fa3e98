#include <string>

#include "prestage/error.hpp"
#include "prestage/options.hpp"

namespace prestage {

namespace {
void at_least(const char* name, uint64_t value, uint64_t minimum) {
  if (value < minimum) {
    throw ConfigError(std::string(name) + " must be at least " + std::to_string(minimum) + ", got " +
                      std::to_string(value));
  }
}
}  // namespace

void LoaderOptions::validate() const {
  at_least("batch_size", batch_size, 1);
  at_least("world_size", world_size, 1);
  if (rank >= world_size) {
    throw ConfigError("rank must be below world_size (" + std::to_string(world_size) + "), got " +
                      std::to_string(rank));
  }
  at_least("readers", readers, 1);
  at_least("prefetchers", prefetchers, 1);
  at_least("lookahead", lookahead, 1);
  at_least("depth", depth, 2);
  at_least("max_pixels", max_pixels, 1);
  if (peers) at_least("peer_timeout_ms", peer_timeout_ms, 1);
  constexpr uint64_t kMaxThreads = 1024;
  if (readers > kMaxThreads || prefetchers > kMaxThreads) {
    throw ConfigError("readers and prefetchers must be at most " + std::to_string(kMaxThreads));
  }
  if (depth > 4096 || lookahead > 1 << 20) throw ConfigError("depth or lookahead is unreasonably large");
  if ((image_size.height == 0) != (image_size.width == 0)) {
    throw ConfigError("image_size needs both a height and a width (or neither)");
  }
  if (decode != DecodeMode::kJpeg && !image_size.empty()) {
    throw ConfigError("image_size applies to decode=jpeg only");
  }
  if (decode != DecodeMode::kJpeg &&
      (layout != Layout::kNHWC || dtype != OutputType::kUint8 || transform != Transform::kCenterCrop)) {
    throw ConfigError("transform, layout and dtype apply to decode=jpeg only");
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
  at_least("max_sample_bytes", max_sample_bytes, 1);
  if (on_error != OnError::kRaise && on_error != OnError::kSkip) {
    throw ConfigError("on_error must be raise or skip, got " +
                      std::to_string(static_cast<int>(on_error)));
  }
}

}  // namespace prestage
