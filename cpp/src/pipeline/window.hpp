// The pipeline's window: the batches between stage 1 and the consumer, at most lookahead_max +
// depth, counted by a limiter. A lookahead below lookahead_max (the self-tuning's) holds slots of
// it back: counted in the limiter as if each held a batch, or owed: held back at the consumer's
// next releases, which then do not give their slot back.
#pragma once

#include <cstdint>
#include <mutex>

namespace prestage::detail {

class WindowHold {
 public:
  explicit WindowHold(uint64_t lookahead_max) : max_(lookahead_max) {}
  // At the start, with `lookahead` in effect: the slots to take from the limiter now.
  uint64_t start(uint64_t lookahead);
  // The consumer released a buffer: true if its slot is held back (not given to the limiter).
  bool hold_release();
  // The lookahead is now `lookahead`: the slots to give to the limiter now (fewer held back), or 0
  // (more to hold back: owed, taken at the next releases).
  uint64_t set(uint64_t lookahead);

 private:
  const uint64_t max_;
  std::mutex mutex_;
  uint64_t held_back_ = 0;  // mutex_
  uint64_t owed_ = 0;       // mutex_
};

}  // namespace prestage::detail
