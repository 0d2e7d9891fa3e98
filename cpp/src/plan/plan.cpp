#include "prestage/plan.hpp"

#include <algorithm>
#include <numeric>
#include <string>

#include "util/prng.hpp"
#include "prestage/error.hpp"

namespace prestage {

std::vector<uint64_t> epoch_order(uint64_t num_samples, uint64_t seed, uint64_t epoch, bool shuffle) {
  std::vector<uint64_t> order(num_samples);
  std::iota(order.begin(), order.end(), uint64_t{0});
  if (!shuffle || num_samples < 2) return order;
  detail::Xoshiro256 rng(seed, epoch);
  for (uint64_t i = num_samples - 1; i > 0; --i) {  // Fisher-Yates
    std::swap(order[i], order[rng.below(i + 1)]);
  }
  return order;
}

namespace {

void check(const PlanOptions& o) {
  if (o.batch_size == 0) throw ConfigError("batch_size must be at least 1");
  if (o.world_size == 0) throw ConfigError("world_size must be at least 1");
  if (o.rank >= o.world_size) {
    throw ConfigError("rank " + std::to_string(o.rank) + " is not below world_size " +
                      std::to_string(o.world_size));
  }
}

// Samples each rank gets per epoch.
uint64_t per_rank(const PlanOptions& o) {
  if (o.drop_last) return o.num_samples / (o.batch_size * o.world_size) * o.batch_size;
  return (o.num_samples + o.world_size - 1) / o.world_size;
}

}  // namespace

uint64_t batches_per_epoch(const PlanOptions& o) {
  check(o);
  return (per_rank(o) + o.batch_size - 1) / o.batch_size;
}

EpochPlan::EpochPlan(const PlanOptions& o, uint64_t epoch)
    : epoch_(epoch),
      num_batches_(batches_per_epoch(o)),
      batch_size_(o.batch_size),
      world_size_(o.world_size),
      rank_(o.rank),
      per_rank_(per_rank(o)),
      order_(epoch_order(o.num_samples, o.seed, epoch, o.shuffle)) {
  // Pad to a multiple of world_size by repeating the first samples, as DistributedSampler does, so
  // that every rank gets the same number of batches (a short rank would hang collective operations).
  const uint64_t padded = per_rank_ * world_size_;
  for (uint64_t i = order_.size(); i < padded; ++i) order_.push_back(order_[i % o.num_samples]);
}

uint64_t EpochPlan::batch_size(uint64_t b) const {
  if (b >= num_batches_) throw ConfigError("batch " + std::to_string(b) + " is past the epoch's end");
  return std::min(batch_size_, per_rank_ - b * batch_size_);
}

const uint64_t* EpochPlan::batch(uint64_t b) const { return batch_of(b, rank_); }

const uint64_t* EpochPlan::batch_of(uint64_t b, uint64_t rank) const {
  if (rank >= world_size_) {
    throw ConfigError("rank " + std::to_string(rank) + " is not below world_size " +
                      std::to_string(world_size_));
  }
  // Global batch b spans batch_size * world_size positions; its last one may be short, then every
  // rank's slice is equally short.
  return order_.data() + b * batch_size_ * world_size_ + rank * batch_size(b);
}

std::vector<std::vector<uint64_t>> EpochPlan::batches() const {
  std::vector<std::vector<uint64_t>> out;
  out.reserve(num_batches_);
  for (uint64_t b = 0; b < num_batches_; ++b) out.emplace_back(batch(b), batch(b) + batch_size(b));
  return out;
}

}  // namespace prestage
