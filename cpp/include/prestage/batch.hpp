// Batch: a filled buffer lent by the loader's ring. Move-only; the buffer goes back to the ring
// when the Batch is destroyed, so hold it only as long as its data are needed.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "prestage/options.hpp"
#include "prestage/pinning.hpp"

namespace prestage {

namespace detail {
class BatchRing;
struct Slot;
}  // namespace detail

class Batch {
 public:
  // Takes a slot lent to the consumer (BatchRing::lend()); gives it back when destroyed.
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

  // kJpeg: size() images of shape (height, width, 3) (NHWC) or (3, height, width) (NCHW),
  // contiguous; when ragged() (no image_size, images of mixed sizes), the first image's, and
  // sample_shape(i) gives each image's.
  std::array<size_t, 4> shape() const noexcept;
  // The batch buffer: images (kJpeg), arrays (kNpy, kNpz, kHdf5: C order, back to back) or the
  // samples' bytes back to back (kRaw).
  std::span<const std::byte> data() const noexcept;
  // size() + 1 offsets into data(); sample i is [offsets[i], offsets[i + 1]).
  std::span<const uint64_t> offsets() const noexcept;
  // The elements' type as a NumPy array-interface type string: "|u1" for images and raw bytes,
  // "<f4" for float32 images, an array's own ("<i8", ">f8", "|b1", ...) for kNpy, kNpz and kHdf5.
  std::string_view dtype() const noexcept;
  // Whether the samples' shapes differ (arrays; raw bytes; JPEGs of mixed sizes without an
  // image_size). If not, data() is one (size(), *sample_shape(0)) array.
  bool ragged() const noexcept;
  // The shape of sample i (kRaw: its length in bytes). Valid while the Batch lives.
  std::span<const uint64_t> sample_shape(size_t i) const noexcept;
  std::span<const int64_t> labels() const noexcept;
  // Catalog indices of the samples delivered: with on_error=skip, a replaced sample's is its
  // replacement's (as is its label).
  std::span<const int64_t> indices() const noexcept;
  // The buffer is page-locked, by mlock or by CUDA registration (pinning() says which).
  bool pinned() const noexcept;
  Pinning pinning() const noexcept;

  // decode_device=cuda: the images, shape() NHWC uint8, in the memory of the CUDA device that was
  // current when the loader was made; data() is then empty. Null otherwise. Valid while this Batch
  // lives; the work that writes them ran on device_stream() (a cudaStream_t) and ends with
  // device_ready() (a cudaEvent_t): make the stream that reads them wait for that event
  // (cudaStreamWaitEvent) first. The caller also guarantees that no work it queued still reads
  // them when the Batch is destroyed: the slot's next batch is then written over them (for
  // example, synchronise with an event recorded after the last such work before letting go).
  const void* device_data() const noexcept;
  void* device_ready() const noexcept;
  void* device_stream() const noexcept;

 private:
  void release() noexcept;
  std::shared_ptr<detail::BatchRing> ring_;
  detail::Slot* slot_;
};

}  // namespace prestage
