// The consumer's end of the pipeline: decoded batches, in plan order, waited for by
// Pipeline::pop().
// Past the loader's stage_patience, the wait asks the pipeline to expedite the batch waited for.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>

#include "memory/batch_ring.hpp"

namespace prestage::detail {

class HandOff {
 public:
  explicit HandOff(BatchRing& ring) : ring_(ring) {}
  // Gives the buffers of batches decoded and never delivered back to the ring.
  ~HandOff();

  // The next batch in plan order (the decode's sequencer's order), decoded.
  void push(Slot* slot);
  // A failure that stops the pipeline: pop() raises it from now on.
  void fail(std::exception_ptr error);
  // pop()'s calls under way and every later one return nullptr at once.
  void interrupt();
  // Drops the next `batches` batches, undelivered, if stage 1 has planned them all (`planned`: the
  // batches it has, counted from the first); `drop_before` is then the first batch not dropped.
  bool skip(uint64_t batches, const std::atomic<uint64_t>& planned,
            std::atomic<uint64_t>& drop_before);
  // The next batch, or nullptr if none came within `timeout` (or interrupt()). With `patience`, a
  // wait for one batch longer than it calls `expedite(its sequence number)` once.
  Slot* pop(std::chrono::milliseconds timeout, std::optional<std::chrono::milliseconds> patience,
            const std::function<void(uint64_t)>& expedite);

 private:
  using Clock = std::chrono::steady_clock;
  bool ready() const { return !ready_.empty() || failure_ || interrupted_; }

  BatchRing& ring_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Slot*> ready_;
  std::exception_ptr failure_;
  bool interrupted_ = false;
  uint64_t delivered_ = 0;            // batches popped: the seq of the one the consumer waits for
  uint64_t to_drop_ = 0;              // batches pop() passes over, undelivered, before the next
  uint64_t waited_seq_ = UINT64_MAX;  // the batch the consumer has been waiting for, since when
  Clock::time_point waited_since_;
};

}  // namespace prestage::detail
