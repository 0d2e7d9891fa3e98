// on_error=skip's policy, as pure functions of the plan: which samples may replace a failed one,
// and which failures may be skipped at all. The same run skips alike for any thread counts.
#pragma once

#include <cstdint>
#include <exception>

#include "prestage/plan.hpp"

namespace prestage::detail {

// The candidates to replace the sample at `position` of batch `batch` of this rank's epoch `plan`:
// the samples that follow it in this rank's epoch (its batches laid end to end), in that order,
// wrapping around, never the sample's own place, at most `limit` of them.
class SkipCandidates {
 public:
  SkipCandidates(const EpochPlan& plan, uint64_t batch_size, uint64_t batch, uint64_t position,
                 uint64_t limit);

  uint64_t size() const noexcept { return count_; }
  // Candidate k (0 <= k < size()): a catalog sample index.
  uint64_t operator[](uint64_t k) const;

 private:
  const EpochPlan& plan_;
  uint64_t batch_size_;
  uint64_t samples_;  // this rank's samples in the epoch
  uint64_t place_;    // the failed sample's place among them
  uint64_t count_;
};

// Whether on_error=skip may skip a sample that failed with `error`: the sample's own I/O or decode
// error (IoError, DecodeError), not a bug or an exhausted machine.
bool skippable(const std::exception_ptr& error);

}  // namespace prestage::detail
