// LoaderOptions: everything a Loader is configured with. Names follow Serizawa & Tatebe (BDCAT'19) where
// they have one: prefetchers (stage 2 threads), readers (stage 3 threads), lookahead, depth.
#pragma once

#include <cstdint>
#include <string>

namespace prestage {

enum class DecodeMode {
  kJpeg,  // JPEG -> uint8 RGB, NHWC
  kRaw,   // the sample's bytes as they are (ragged: one buffer plus offsets)
};

struct ImageSize {
  uint32_t height = 0;
  uint32_t width = 0;
  bool empty() const noexcept { return height == 0 && width == 0; }
};

struct LoaderOptions {
  uint64_t batch_size = 32;  // samples per batch on this rank
  // Output size. Empty: no resize, and every image must have the size of the first one. Otherwise the
  // shorter side is resized to cover it, then the centre is cropped (torchvision Resize + CenterCrop).
  ImageSize image_size{};
  DecodeMode decode = DecodeMode::kJpeg;

  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;
  uint64_t rank = 0;
  uint64_t world_size = 1;

  // Node-local directory that stage 2 copies the samples to. Empty: stage 3 reads the source directly.
  std::string stage_dir;

  uint64_t prefetchers = 4;  // stage 2 threads (I/O bound: more than cores is normal)
  uint64_t readers = 2;      // stage 3 threads (CPU bound: about the cores you can spare)
  uint64_t lookahead = 4;    // batches that stage 2 may work on ahead of stage 3
  uint64_t depth = 4;        // batch buffers in the ring: batches decoded ahead plus those lent out

  // Images with more pixels than this are refused before any large allocation (decompression bombs).
  uint64_t max_pixels = 89'478'485;  // PIL's default MAX_IMAGE_PIXELS

  // Throws ConfigError naming the first invalid option.
  void validate() const;
};

}  // namespace prestage
