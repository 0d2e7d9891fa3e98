// Batch: a filled buffer lent by the loader's ring. Move-only; the buffer goes back to the ring when the
// Batch is destroyed, so hold it only as long as its data are needed.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "prestage/options.hpp"

namespace prestage {

namespace detail {
class BatchRing;
struct Slot;
}  // namespace detail

class Batch {
 public:
  Batch(std::shared_ptr<detail::BatchRing> ring, detail::Slot* slot) noexcept;
  Batch(Batch&& other) noexcept;
  Batch& operator=(Batch&& other) noexcept;
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;
  ~Batch();

  uint64_t epoch() const noexcept;
  uint64_t index() const noexcept;  // position in the epoch, 0-based
  size_t size() const noexcept;     // samples in the batch
  DecodeMode mode() const noexcept;

  // kJpeg: size() images of shape (height, width, 3), uint8, contiguous (NHWC).
  std::array<size_t, 4> shape() const noexcept;
  // The batch buffer: images (kJpeg) or the samples' bytes back to back (kRaw).
  std::span<const std::byte> data() const noexcept;
  // kRaw: size() + 1 offsets into data(); sample i is [offsets[i], offsets[i + 1]).
  std::span<const uint64_t> offsets() const noexcept;
  std::span<const int64_t> labels() const noexcept;
  std::span<const int64_t> indices() const noexcept;  // catalog indices
  bool pinned() const noexcept;  // the buffer is page-locked

 private:
  void release() noexcept;
  std::shared_ptr<detail::BatchRing> ring_;
  detail::Slot* slot_;
};

}  // namespace prestage
