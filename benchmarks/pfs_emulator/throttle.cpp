#include "throttle.hpp"

#include <algorithm>
#include <thread>

namespace prestage::pfs {

namespace {

using Clock = std::chrono::steady_clock;

int64_t nanoseconds_since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
}

}  // namespace

const char* op_name(Op op) noexcept {
  switch (op) {
    case Op::kOpen:
      return "open";
    case Op::kRead:
      return "read";
    case Op::kGetattr:
      return "getattr";
    case Op::kReaddir:
      return "readdir";
  }
  return "?";
}

Throttle::Throttle(const ThrottleConfig& config) : config_(config) {}

void Throttle::acquire() {
  const auto start = Clock::now();
  std::unique_lock lock(slots_mutex_);
  const uint64_t ticket = next_ticket_++;
  if (config_.max_ops != 0) {
    slots_cv_.wait(lock, [&] { return ticket == head_ && in_flight_ < config_.max_ops; });
  }
  ++head_;
  ++in_flight_;
  const unsigned now_in_flight = in_flight_;
  lock.unlock();
  // The next ticket may be waiting for the head position only, with a slot already free.
  if (config_.max_ops != 0) slots_cv_.notify_all();
  queued_ns_.fetch_add(nanoseconds_since(start), std::memory_order_relaxed);
  unsigned seen = max_in_flight_.load(std::memory_order_relaxed);
  while (now_in_flight > seen && !max_in_flight_.compare_exchange_weak(seen, now_in_flight)) {
  }
}

void Throttle::release() {
  {
    std::lock_guard lock(slots_mutex_);
    --in_flight_;
  }
  if (config_.max_ops != 0) slots_cv_.notify_all();
}

Throttle::Operation::Operation(Throttle& throttle, Op op) : throttle_(throttle) {
  throttle_.acquire();
  throttle_.ops_[static_cast<size_t>(op)].fetch_add(1, std::memory_order_relaxed);
  const auto latency = throttle_.config_.latency[static_cast<size_t>(op)];
  if (latency.count() > 0) std::this_thread::sleep_for(latency);
}

Throttle::Operation::~Operation() { throttle_.release(); }

void Throttle::Operation::transfer(size_t bytes) {
  throttle_.bytes_.fetch_add(bytes, std::memory_order_relaxed);
  if (throttle_.config_.bytes_per_s <= 0 || bytes == 0) return;
  const auto start = Clock::now();
  const auto duration = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(static_cast<double>(bytes) / throttle_.config_.bytes_per_s));
  Clock::time_point done;
  {
    // The link is one queue: a transfer starts when the previous one ends, or now if it is idle
    // (no credit is saved up while idle, so there are no bursts above the cap).
    std::lock_guard lock(throttle_.link_mutex_);
    done = std::max(start, throttle_.link_free_at_) + duration;
    throttle_.link_free_at_ = done;
  }
  std::this_thread::sleep_until(done);
  throttle_.transfer_ns_.fetch_add(nanoseconds_since(start), std::memory_order_relaxed);
}

ThrottleCounters Throttle::counters() const {
  ThrottleCounters c;
  for (size_t i = 0; i < kOpCount; ++i) c.ops[i] = ops_[i].load(std::memory_order_relaxed);
  c.bytes = bytes_.load(std::memory_order_relaxed);
  c.queued_s = queued_ns_.load(std::memory_order_relaxed) * 1e-9;
  c.transfer_s = transfer_ns_.load(std::memory_order_relaxed) * 1e-9;
  c.max_in_flight = max_in_flight_.load(std::memory_order_relaxed);
  return c;
}

}  // namespace prestage::pfs
