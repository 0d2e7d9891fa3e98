#include "memory/batch_ring.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <utility>

#include "memory/cuda_host.hpp"
#include "prestage/batch.hpp"

namespace prestage::detail {

namespace {
size_t page_size() {
  static const size_t size = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return size;
}
}  // namespace

PinnedBuffer::~PinnedBuffer() { free(); }

void PinnedBuffer::use_cuda(const CudaHost* cuda, int device) noexcept {
  cuda_ = cuda;
  device_ = device;
}

void PinnedBuffer::free() noexcept {
  if (data_ == nullptr) return;
  // Unregistered before it is freed: the allocator may hand the range out again, and the driver
  // refuses to register a range twice. A failed unregister (the runtime shutting down at exit) does
  // not keep the memory: the next registration of the range then fails and says so.
  switch (held_) {
    case Pinning::kCuda:
      (void)cuda_->unregister_memory(data_);
      break;
    case Pinning::kMlock:
      ::munlock(data_, capacity_);
      break;
    case Pinning::kNone:
      break;
  }
  held_ = Pinning::kNone;
  if (growth_ != nullptr) growth_->held.fetch_sub(capacity_, std::memory_order_relaxed);
  std::free(data_);
  data_ = nullptr;
  capacity_ = 0;
}

void PinnedBuffer::reserve(size_t bytes) {
  if (bytes <= capacity_ && data_ != nullptr) return;
  const size_t page = page_size();
  if (bytes > SIZE_MAX / 2) throw std::bad_alloc();
  // The first allocation is what was asked for (a batch of fixed-size samples never grows).
  size_t want = data_ == nullptr ? bytes : bytes + bytes / 4;
  if (growth_ != nullptr)
    want = std::max(want, growth_->high_water.load(std::memory_order_relaxed));
  if (want > SIZE_MAX - page) throw std::bad_alloc();
  want = (std::max<size_t>(want, 1) + page - 1) / page * page;
  free();
  void* p = std::aligned_alloc(page, want);
  if (p == nullptr) {
    std::lock_guard lock(why_mutex_);
    why_ = "no memory";
    pinning_.store(Pinning::kNone, std::memory_order_release);
    throw std::bad_alloc();
  }
  data_ = static_cast<std::byte*>(p);
  capacity_ = want;
  if (growth_ != nullptr) {
    growth_->held.fetch_add(want, std::memory_order_relaxed);
    size_t seen = growth_->high_water.load(std::memory_order_relaxed);
    while (seen < want &&
           !growth_->high_water.compare_exchange_weak(seen, want, std::memory_order_relaxed)) {
    }
  }
  pin();
}

void PinnedBuffer::pin() {
  std::string why;
  Pinning pinning = Pinning::kNone;
  if (cuda_ != nullptr && cuda_->available()) {
    why = cuda_->register_memory(data_, capacity_, device_);
    if (why.empty()) {
      pinning = Pinning::kCuda;
      why = cuda_->why();
    }
  } else {
    why = cuda_ != nullptr ? cuda_->why() : "no CUDA registration asked for";
  }
  if (pinning == Pinning::kNone) {
    // Registration failed or is not possible: page-locking is the fallback, itself limited by
    // RLIMIT_MEMLOCK; the buffer then stays pageable and says so.
    if (::mlock(data_, capacity_) == 0) {
      pinning = Pinning::kMlock;
    } else {
      const int error = errno;
      why = (error == ENOMEM || error == EPERM
                 ? std::string("RLIMIT_MEMLOCK too low")
                 : std::string("mlock failed: ") + std::strerror(error)) +
            "; " + why;
    }
  }
  held_ = pinning;
  std::lock_guard lock(why_mutex_);
  why_ = std::move(why);
  pinning_.store(pinning, std::memory_order_release);
}

PinnedBuffer::Status PinnedBuffer::status() const {
  std::lock_guard lock(why_mutex_);
  return {pinning(), why_};
}

BatchRing::BatchRing(size_t depth, size_t batch_size, size_t slot_bytes, DecodeMode mode)
    : BatchRing(depth, batch_size, slot_bytes, mode, CudaHost::instance()) {}

BatchRing::BatchRing(size_t depth, size_t batch_size, size_t slot_bytes, DecodeMode mode,
                     const CudaHost& cuda) {
  const int device = cuda.current_device();
  slots_.reserve(depth);
  free_.reserve(depth);
  for (size_t i = 0; i < depth; ++i) {
    auto slot = std::make_unique<Slot>();
    slot->data.use_cuda(&cuda, device);
    slot->data.share_growth(&growth_);
    slot->data.reserve(slot_bytes);
    slot->mode = mode;
    slot->labels.reserve(batch_size);
    slot->indices.reserve(batch_size);
    slot->offsets.reserve(batch_size + 1);
    slot->dim_offsets.reserve(batch_size + 1);
    slot->dims.reserve(batch_size * 4);
    free_.push_back(slot.get());
    slots_.push_back(std::move(slot));
  }
}

Slot* BatchRing::acquire() {
  std::lock_guard lock(mutex_);
  if (free_.empty()) throw std::logic_error("batch ring: no free slot (limiter out of step)");
  Slot* slot = free_.back();
  free_.pop_back();
  return slot;
}

void BatchRing::release(Slot* slot, bool lent) noexcept {
  if (lent) lent_.fetch_sub(1, std::memory_order_relaxed);
  {
    std::lock_guard lock(mutex_);
    slot->error = nullptr;
    free_.push_back(slot);
  }
  // Held while the hook runs, so that set_release_hook() returns only when no call of the old hook
  // is still running (its pipeline is about to be destroyed).
  std::lock_guard hook_lock(hook_mutex_);
  if (hook_) hook_();
}

void BatchRing::set_release_hook(std::function<void()> hook) {
  std::lock_guard lock(hook_mutex_);
  hook_ = std::move(hook);
}

size_t BatchRing::free_count() const {
  std::lock_guard lock(mutex_);
  return free_.size();
}

PinnedBuffer::Status BatchRing::status() const {
  PinnedBuffer::Status least{Pinning::kNone, "no buffers"};
  for (size_t i = 0; i < slots_.size(); ++i) {
    PinnedBuffer::Status s = slots_[i]->data.status();
    // The enumerators are in order of strength.
    if (i == 0 || s.pinning < least.pinning) least = std::move(s);
  }
  return least;
}

}  // namespace prestage::detail

namespace prestage {

Batch::Batch(std::shared_ptr<detail::BatchRing> ring, detail::Slot* slot) noexcept
    : ring_(std::move(ring)), slot_(slot) {}

Batch::Batch(Batch&& other) noexcept
    : ring_(std::move(other.ring_)), slot_(std::exchange(other.slot_, nullptr)) {}

Batch& Batch::operator=(Batch&& other) noexcept {
  if (this != &other) {
    release();
    ring_ = std::move(other.ring_);
    slot_ = std::exchange(other.slot_, nullptr);
  }
  return *this;
}

Batch::~Batch() { release(); }

void Batch::release() noexcept {
  if (slot_ != nullptr) ring_->release(slot_, /*lent=*/true);
  slot_ = nullptr;
  ring_.reset();
}

uint64_t Batch::epoch() const noexcept { return slot_->epoch; }
uint64_t Batch::index() const noexcept { return slot_->index; }
size_t Batch::size() const noexcept { return slot_->indices.size(); }
DecodeMode Batch::mode() const noexcept { return slot_->mode; }
std::array<size_t, 4> Batch::shape() const noexcept { return slot_->shape; }
std::span<const std::byte> Batch::data() const noexcept {
  return {slot_->data.data(), slot_->data_bytes};
}
std::span<const uint64_t> Batch::offsets() const noexcept { return slot_->offsets; }
std::span<const int64_t> Batch::labels() const noexcept { return slot_->labels; }
std::span<const int64_t> Batch::indices() const noexcept { return slot_->indices; }
bool Batch::pinned() const noexcept { return slot_->data.locked(); }
Pinning Batch::pinning() const noexcept { return slot_->data.pinning(); }
const void* Batch::device_data() const noexcept { return slot_->device_data; }
void* Batch::device_ready() const noexcept { return slot_->device_ready; }
void* Batch::device_stream() const noexcept { return slot_->device_stream; }
std::string_view Batch::dtype() const noexcept { return slot_->dtype; }
bool Batch::ragged() const noexcept { return slot_->ragged; }
std::span<const uint64_t> Batch::sample_shape(size_t i) const noexcept {
  if (i + 1 >= slot_->dim_offsets.size()) return {};
  return std::span<const uint64_t>(slot_->dims)
      .subspan(slot_->dim_offsets[i], slot_->dim_offsets[i + 1] - slot_->dim_offsets[i]);
}

}  // namespace prestage
