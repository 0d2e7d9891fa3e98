// Stage 1, the plan: an epoch's mini-batches as lists of catalog indices. Pure functions of their
// arguments, identical on every machine, standard library and thread count.
#pragma once

#include <cstdint>
#include <vector>

namespace prestage {

struct PlanOptions {
  uint64_t num_samples = 0;
  uint64_t batch_size = 1;  // per rank
  uint64_t seed = 0;
  bool shuffle = true;
  bool drop_last = false;
  uint64_t rank = 0;
  uint64_t world_size = 1;
};

// The global order of an epoch: a permutation of 0..N-1 (shuffle), or 0..N-1 itself (no shuffle).
std::vector<uint64_t> epoch_order(uint64_t num_samples, uint64_t seed, uint64_t epoch, bool shuffle);

// Batches per epoch for one rank; the same for every rank.
//  drop_last = false: the order is padded to a multiple of world_size by repeating its first samples
//    (as torch's DistributedSampler), each rank gets ceil(N / world_size) samples, the last batch may
//    be short.
//  drop_last = true: only whole global batches (batch_size * world_size samples) are kept.
uint64_t batches_per_epoch(const PlanOptions& options);

// Global batch g holds positions [g * B * W, ...) of the (padded) epoch order; rank r takes the r-th
// contiguous slice of it. So every rank knows every other rank's future.
class EpochPlan {
 public:
  EpochPlan(const PlanOptions& options, uint64_t epoch);
  uint64_t epoch() const noexcept { return epoch_; }
  uint64_t num_batches() const noexcept { return num_batches_; }
  uint64_t batch_size(uint64_t b) const;          // samples in this rank's batch b
  const uint64_t* batch(uint64_t b) const;        // batch_size(b) catalog indices
  // Rank `rank`'s batch b (of the same size): every rank knows every other's. Throws ConfigError
  // for a rank not below world_size.
  const uint64_t* batch_of(uint64_t b, uint64_t rank) const;
  std::vector<std::vector<uint64_t>> batches() const;

 private:
  uint64_t epoch_;
  uint64_t num_batches_;
  uint64_t batch_size_;
  uint64_t world_size_;
  uint64_t rank_;
  uint64_t per_rank_;  // samples per rank in this epoch
  std::vector<uint64_t> order_;
};

}  // namespace prestage
