// The batch ring: `depth` batch buffers allocated once, page-aligned and page-locked when the system
// allows, lent to the consumer and recycled.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "prestage/options.hpp"

namespace prestage::detail {

// A page-aligned buffer, page-locked (mlock) when RLIMIT_MEMLOCK allows. Grows only when asked to.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  // Makes room for at least `bytes` (contents are not kept). Throws std::bad_alloc.
  void reserve(size_t bytes);
  std::byte* data() noexcept { return data_; }
  const std::byte* data() const noexcept { return data_; }
  size_t capacity() const noexcept { return capacity_; }
  bool locked() const noexcept { return locked_; }

 private:
  void free() noexcept;
  std::byte* data_ = nullptr;
  size_t capacity_ = 0;
  bool locked_ = false;
};

// One batch buffer and what travels with it to the consumer.
struct Slot {
  PinnedBuffer data;
  std::vector<int64_t> labels;    // capacity batch_size, allocated once
  std::vector<int64_t> indices;
  std::vector<uint64_t> offsets;  // count + 1 offsets into data
  DecodeMode mode = DecodeMode::kJpeg;
  std::array<size_t, 4> shape{};  // kJpeg: count, height, width, 3 (NHWC) or count, 3, height, width
  std::string dtype = "|u1";      // NumPy type string of the elements
  bool ragged = false;            // the samples' shapes differ
  std::vector<uint64_t> dims;         // every sample's shape, back to back
  std::vector<uint64_t> dim_offsets;  // count + 1 offsets into dims
  size_t data_bytes = 0;          // bytes of data in use
  uint64_t epoch = 0;
  uint64_t index = 0;
  std::exception_ptr error;  // the first failed sample's error, raised at the consumer
  // on_error=skip: the samples of the plan replaced in this batch, by position; the replacement is
  // indices[position].
  struct Skip {
    size_t position = 0;
    uint64_t sample = 0;  // catalog index of the failed sample
    std::string error;
  };
  std::vector<Skip> skipped;
};

class BatchRing {
 public:
  // `slot_bytes`: each buffer's initial size (kJpeg: a whole batch of images).
  BatchRing(size_t depth, size_t batch_size, size_t slot_bytes, DecodeMode mode);

  // A free slot. The caller guarantees one is free (the pipeline's limiter counts them).
  Slot* acquire();
  // Returns a slot; then calls the release hook (the pipeline's back-pressure), if any. The hook
  // must not block.
  void release(Slot* slot, bool lent = false) noexcept;
  void set_release_hook(std::function<void()> hook);

  // A slot handed to the consumer (as a Batch), until its release.
  void lend() noexcept { lent_.fetch_add(1, std::memory_order_relaxed); }
  size_t lent() const noexcept { return lent_.load(std::memory_order_relaxed); }

  size_t depth() const noexcept { return slots_.size(); }
  size_t free_count() const;
  bool pinned() const noexcept;

 private:
  std::vector<std::unique_ptr<Slot>> slots_;
  mutable std::mutex mutex_;
  std::vector<Slot*> free_;
  std::atomic<size_t> lent_{0};
  std::mutex hook_mutex_;
  std::function<void()> hook_;
};

}  // namespace prestage::detail
