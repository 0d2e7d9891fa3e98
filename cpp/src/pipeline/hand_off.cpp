#include "pipeline/hand_off.hpp"

namespace prestage::detail {

HandOff::~HandOff() {
  std::lock_guard lock(mutex_);
  for (Slot* slot : ready_) ring_.release(slot);
  ready_.clear();
}

void HandOff::push(Slot* slot) {
  {
    std::lock_guard lock(mutex_);
    ready_.push_back(slot);
  }
  cv_.notify_one();
}

void HandOff::fail(std::exception_ptr error) {
  {
    std::lock_guard lock(mutex_);
    if (!failure_) failure_ = std::move(error);
  }
  cv_.notify_all();
}

void HandOff::interrupt() {
  {
    std::lock_guard lock(mutex_);
    interrupted_ = true;
  }
  cv_.notify_all();
}

bool HandOff::skip(uint64_t batches, const std::atomic<uint64_t>& planned,
                   std::atomic<uint64_t>& drop_before) {
  std::lock_guard lock(mutex_);
  const uint64_t from = delivered_ + to_drop_;
  if (batches > planned.load(std::memory_order_acquire) - from) return false;
  to_drop_ += batches;
  drop_before.store(from + batches, std::memory_order_release);
  return true;
}

Slot* HandOff::pop(std::chrono::milliseconds timeout,
                   std::optional<std::chrono::milliseconds> patience,
                   const std::function<void(uint64_t)>& expedite) {
  const auto deadline = Clock::now() + timeout;
  const auto is_ready = [&] { return ready(); };
  std::unique_lock lock(mutex_);
  if (!ready() && patience) {
    const uint64_t wanted = delivered_;
    if (waited_seq_ != wanted) {
      waited_seq_ = wanted;
      waited_since_ = Clock::now();
    }
    const auto patience_ends = waited_since_ + *patience;
    if (patience_ends < deadline && !cv_.wait_until(lock, patience_ends, is_ready)) {
      lock.unlock();
      expedite(wanted);
      lock.lock();
    }
  }
  for (;;) {
    if (!cv_.wait_until(lock, deadline, is_ready) || interrupted_) return nullptr;
    // Batches decoded after a failure were not decoded (the pipeline stops): none is delivered.
    if (failure_) std::rethrow_exception(failure_);
    Slot* slot = ready_.front();
    ready_.pop_front();
    ++delivered_;
    if (to_drop_ == 0) return slot;
    --to_drop_;
    // Its release lets a batch into the graph (the ring's hook): not under the lock push() takes.
    lock.unlock();
    ring_.release(slot);
    lock.lock();
  }
}

}  // namespace prestage::detail
