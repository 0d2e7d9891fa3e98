// The batch ring: `depth` batch buffers allocated once, page-aligned, CUDA-registered or
// page-locked when the system allows, lent to the consumer and recycled. A Batch holds the ring
// (shared_ptr): its buffers are unregistered and freed only when the ring's last owner, loader or
// Batch, lets go.
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
#include "prestage/pinning.hpp"

namespace prestage::detail {

class CudaHost;

// What the buffers of one ring share about their sizes (PinnedBuffer::share_growth).
struct RingGrowth {
  std::atomic<size_t> high_water{0};  // the size the buffers grow to
  std::atomic<size_t> held{0};        // the bytes they hold, all of them
};

// A page-aligned buffer, pinned as well as the system allows: registered with the CUDA driver when
// the CudaHost given to use_cuda() is available, else page-locked with mlock when RLIMIT_MEMLOCK
// allows, else pageable; pinning() and status() say which, and why. Grows only when asked to: the
// old memory is unregistered (and unlocked) before it is freed, the new one registered after it is
// allocated.
//
// Thread-safety: use_cuda(), reserve() and data() belong to the slot's holder (one thread at a
// time); pinning(), locked() and status() may be called from any thread, also during a reserve()
// (stats()).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  // Registers this buffer's memory with `cuda` from now on (not owned: it must outlive the buffer),
  // with `device` current (-1: the thread's own). Before the first reserve().
  void use_cuda(const CudaHost* cuda, int device) noexcept;
  // Shares its size with the other buffers of a ring (`growth`, not owned: it must outlive the
  // buffer). Before the first reserve().
  void share_growth(RingGrowth* growth) noexcept { growth_ = growth; }
  // Makes room for at least `bytes` (contents are not kept). Throws std::bad_alloc. The first
  // allocation is what is asked for; a buffer that grows takes a quarter more than asked; either
  // takes at least what the other buffers sharing its growth have grown to: batches of varying
  // sizes (ragged) make each buffer of a ring grow a few times in the first batches, not once more
  // every few epochs, and none holds more than a quarter more than the largest batch asked for.
  void reserve(size_t bytes);
  std::byte* data() noexcept { return data_; }
  const std::byte* data() const noexcept { return data_; }
  size_t capacity() const noexcept { return capacity_; }

  struct Status {
    Pinning pinning = Pinning::kNone;
    std::string why;  // why not better; for kCuda, the runtime that registered it
  };
  // What was last published: a regrowth under way shows the old buffer's until the new one is
  // pinned.
  Pinning pinning() const noexcept { return pinning_.load(std::memory_order_acquire); }
  bool locked() const noexcept { return pinning() != Pinning::kNone; }  // page-locked in any way
  Status status() const;

 private:
  void pin();
  void free() noexcept;
  std::byte* data_ = nullptr;
  size_t capacity_ = 0;
  Pinning held_ = Pinning::kNone;  // what free() must undo; the holder's alone
  const CudaHost* cuda_ = nullptr;
  int device_ = -1;
  RingGrowth* growth_ = nullptr;
  // Published for other threads, both under why_mutex_ (pinning_ is also read without it).
  std::atomic<Pinning> pinning_{Pinning::kNone};
  mutable std::mutex why_mutex_;
  std::string why_ = "no memory yet";
};

// One batch buffer and what travels with it to the consumer.
struct Slot {
  PinnedBuffer data;
  std::vector<int64_t> labels;  // capacity batch_size, allocated once
  std::vector<int64_t> indices;
  std::vector<uint64_t> offsets;  // count + 1 offsets into data
  DecodeMode mode = DecodeMode::kJpeg;
  std::array<size_t, 4>
      shape{};                 // kJpeg: count, height, width, 3 (NHWC) or count, 3, height, width
  std::string dtype = "|u1";   // NumPy type string of the elements
  bool ragged = false;         // the samples' shapes differ
  std::vector<uint64_t> dims;  // every sample's shape, back to back
  std::vector<uint64_t> dim_offsets;  // count + 1 offsets into dims
  size_t data_bytes = 0;              // bytes of data in use
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
  // decode_device=cuda: the slot's GPU decoder (decode/gpu_jpeg.hpp; type-erased so that
  // memory/ does not depend on decode/), made at the slot's first batch and destroyed with the
  // slot, so that a device batch lives as long as the Batch that lends it. Its holder's alone, as
  // `data`.
  std::shared_ptr<void> gpu;
  // The device batch the last decode wrote (null: none, the batch is in `data`), the event recorded
  // after that work and the stream it ran on (cudaEvent_t, cudaStream_t).
  const std::byte* device_data = nullptr;
  void* device_ready = nullptr;
  void* device_stream = nullptr;
};

class BatchRing {
 public:
  // `slot_bytes`: each buffer's initial size (kJpeg: a whole batch of images). The buffers are
  // registered with `cuda` (which must outlive the ring and every Batch of it) when it is
  // available, with the calling thread's current device current, also when a buffer grows in
  // another thread.
  BatchRing(size_t depth, size_t batch_size, size_t slot_bytes, DecodeMode mode,
            const CudaHost& cuda);
  BatchRing(size_t depth, size_t batch_size, size_t slot_bytes,
            DecodeMode mode);  // CudaHost::instance()

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
  // The bytes its buffers hold, all of them (the largest any grew to, times depth at most). Any
  // thread.
  size_t held_bytes() const noexcept { return growth_.held.load(std::memory_order_relaxed); }
  size_t free_count() const;
  // The least pinned of the buffers, and why (see PinnedBuffer::status()), read together. Any
  // thread.
  PinnedBuffer::Status status() const;
  Pinning pinned() const { return status().pinning; }

 private:
  RingGrowth growth_;  // declared before the slots: they report to it until they are destroyed
  std::vector<std::unique_ptr<Slot>> slots_;
  mutable std::mutex mutex_;
  std::vector<Slot*> free_;
  std::atomic<size_t> lent_{0};
  std::mutex hook_mutex_;
  std::function<void()> hook_;
};

}  // namespace prestage::detail
