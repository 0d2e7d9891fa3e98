// Throttle: the slowness of the emulated parallel file system, independent of FUSE.
//
// Every operation first waits for one of `max_ops` service slots (first come, first served: the
// queue of a busy metadata or object server), then sleeps its latency (the round trip of one RPC).
// A read then waits for its turn on one shared link of `bytes_per_s`: transfers are served back to
// back, so the aggregate rate never exceeds the cap, whatever the number of readers. The slot is
// held until the operation completes.
//
// Thread-safety: every member function may be called from any number of threads at once.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>

namespace prestage::pfs {

enum class Op : size_t { kOpen = 0, kRead, kGetattr, kReaddir };
inline constexpr size_t kOpCount = 4;
const char* op_name(Op op) noexcept;

struct ThrottleConfig {
  std::array<std::chrono::nanoseconds, kOpCount> latency{};  // per operation, indexed by Op
  double bytes_per_s = 0;                                    // 0: no bandwidth cap
  unsigned max_ops = 0;                                      // 0: no cap on concurrent operations
};

struct ThrottleCounters {
  std::array<uint64_t, kOpCount> ops{};
  uint64_t bytes = 0;
  double queued_s = 0;    // summed time operations waited for a slot
  double transfer_s = 0;  // summed time reads waited for and used the link
  unsigned max_in_flight = 0;
};

class Throttle {
 public:
  explicit Throttle(const ThrottleConfig& config);
  Throttle(const Throttle&) = delete;
  Throttle& operator=(const Throttle&) = delete;

  // Holds a service slot from construction (after the queue and the operation's latency) to
  // destruction. Not movable: it lives on the stack of the thread that serves the operation.
  class Operation {
   public:
    Operation(Throttle& throttle, Op op);
    ~Operation();
    Operation(const Operation&) = delete;
    Operation& operator=(const Operation&) = delete;

    // Waits until `bytes` have crossed the shared link; call once the bytes are read.
    void transfer(size_t bytes);

   private:
    Throttle& throttle_;
  };

  ThrottleCounters counters() const;
  const ThrottleConfig& config() const noexcept { return config_; }

 private:
  void acquire();
  void release();

  const ThrottleConfig config_;

  std::mutex slots_mutex_;
  std::condition_variable slots_cv_;
  uint64_t next_ticket_ = 0;  // FIFO: tickets take slots in the order they were drawn
  uint64_t head_ = 0;         // the ticket that may take the next free slot
  unsigned in_flight_ = 0;

  std::mutex link_mutex_;
  std::chrono::steady_clock::time_point link_free_at_{};

  std::array<std::atomic<uint64_t>, kOpCount> ops_{};
  std::atomic<uint64_t> bytes_{0};
  std::atomic<int64_t> queued_ns_{0};
  std::atomic<int64_t> transfer_ns_{0};
  std::atomic<unsigned> max_in_flight_{0};
};

}  // namespace prestage::pfs
