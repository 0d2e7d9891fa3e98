#include "decode/skip_policy.hpp"

#include <algorithm>

#include "prestage/error.hpp"

namespace prestage::detail {

SkipCandidates::SkipCandidates(const EpochPlan& plan, uint64_t batch_size, uint64_t batch,
                               uint64_t position, uint64_t limit)
    : plan_(plan), batch_size_(batch_size) {
  const uint64_t last = plan.num_batches() - 1;
  samples_ = last * batch_size + plan.batch_size(last);
  place_ = batch * batch_size + position;
  count_ = std::min(samples_ - 1, limit);
}

uint64_t SkipCandidates::operator[](uint64_t k) const {
  const uint64_t at = (place_ + 1 + k) % samples_;
  return plan_.batch(at / batch_size_)[at % batch_size_];
}

bool skippable(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const IoError&) {
    return true;
  } catch (const DecodeError&) {
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace prestage::detail
