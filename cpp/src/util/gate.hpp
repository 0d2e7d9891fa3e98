// A gate that lets at most `limit` threads through at once, the limit changeable at any time: how
// the self-tuning sets the samples stage 3 decodes at once without resizing oneTBB's arena (whose
// size is fixed once it runs). Open (no limit), passing costs one atomic load.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace prestage::detail {

class Gate {
 public:
  static constexpr uint64_t kOpen = UINT64_MAX;

  // Any thread. Lowering it lets the threads inside finish; raising it wakes those waiting.
  void set_limit(uint64_t limit) {
    {
      std::lock_guard lock(mutex_);
      limit_ = limit;
      open_.store(limit == kOpen, std::memory_order_release);
    }
    wake_.notify_all();
  }

  // Holds a place for its lifetime (waits for one while the gate is full).
  class Pass {
   public:
    explicit Pass(Gate& gate) : gate_(gate), counted_(gate.enter()) {}
    ~Pass() {
      if (counted_) gate_.leave();
    }
    Pass(const Pass&) = delete;
    Pass& operator=(const Pass&) = delete;

   private:
    Gate& gate_;
    bool counted_;
  };

 private:
  // Whether the place taken was counted: threads that passed while the gate was open are not (for
  // a moment after it closes, more than `limit` may be inside).
  bool enter() {
    if (open_.load(std::memory_order_acquire)) return false;
    std::unique_lock lock(mutex_);
    wake_.wait(lock, [&] { return limit_ == kOpen || inside_ < limit_; });
    if (limit_ == kOpen) return false;
    ++inside_;
    return true;
  }
  void leave() {
    {
      std::lock_guard lock(mutex_);
      --inside_;
    }
    wake_.notify_one();
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::atomic<bool> open_{true};
  uint64_t limit_ = kOpen;  // mutex_
  uint64_t inside_ = 0;     // mutex_
};

}  // namespace prestage::detail
