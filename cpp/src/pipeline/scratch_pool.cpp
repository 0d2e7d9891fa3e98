#include "pipeline/scratch_pool.hpp"

namespace prestage::detail {

ScratchPool::~ScratchPool() {
  for (const Scratch& scratch : free_) held_.fetch_sub(scratch.counted);
}

ScratchPool::Lent ScratchPool::take() {
  std::lock_guard lock(mutex_);
  if (free_.empty()) return Lent(*this, Scratch{std::make_unique<BatchScratch>()});
  Scratch scratch = std::move(free_.back());
  free_.pop_back();
  return Lent(*this, std::move(scratch));
}

void ScratchPool::give_back(Scratch scratch) {
  const uint64_t held = scratch.bytes->held_bytes();
  held_.fetch_add(held - scratch.counted);  // modulo 2^64
  scratch.counted = held;
  std::lock_guard lock(mutex_);
  free_.push_back(std::move(scratch));
}

}  // namespace prestage::detail
