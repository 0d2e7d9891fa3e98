// Stage 1, the plan: an epoch's mini-batches as lists of catalog indices. Pure functions of their
// arguments, identical on every machine, standard library and thread count.
#pragma once

#include <cstdint>
#include <vector>

namespace prestage {

// A set of positions of an epoch's global order (0..N-1, before any padding): half-open ranges,
// sorted, disjoint and not touching one another (the form consumed_positions() gives).
struct PositionRange {
  uint64_t begin = 0;
  uint64_t end = 0;
  friend bool operator==(const PositionRange& a, const PositionRange& b) noexcept {
    return a.begin == b.begin && a.end == b.end;
  }
};
using Positions = std::vector<PositionRange>;

// The global position of a resume: the positions of epoch `epoch`'s global order already consumed,
// by any number of ranks with any batch size. Usually one range [0, K): K samples consumed.
struct Resume {
  uint64_t epoch = 0;
  Positions consumed;  // empty: no resume
  friend bool operator==(const Resume&, const Resume&) = default;
};

struct PlanOptions {
  uint64_t num_samples = 0;
  uint64_t batch_size = 1;  // per rank
  uint64_t seed = 0;
  bool shuffle = true;
  bool drop_last = false;
  uint64_t rank = 0;
  uint64_t world_size = 1;
  // Epoch resume.epoch runs only the positions of its global order that resume.consumed does not
  // hold (the remaining ones), split over this plan's ranks and batch size as a whole epoch is;
  // every other epoch is whole. Ranges must be sorted, disjoint and within N (ConfigError).
  Resume resume;
};

// The global order of an epoch: a permutation of 0..N-1 (shuffle), or 0..N-1 itself (no shuffle).
std::vector<uint64_t> epoch_order(uint64_t num_samples, uint64_t seed, uint64_t epoch,
                                  bool shuffle);

// Batches per epoch for one rank; the same for every rank.
//  drop_last = false: the order is padded to a multiple of world_size by repeating its first
//  samples
//    (as torch's DistributedSampler), each rank gets ceil(N / world_size) samples, the last batch
//    may be short.
//  drop_last = true: only whole global batches (batch_size * world_size samples) are kept.
// Of a whole epoch: the resumed one (options.resume) may have fewer, see batches_in_epoch().
uint64_t batches_per_epoch(const PlanOptions& options);

// Batches of epoch `epoch` for one rank, the same for every rank. For the resumed epoch, the rules
// above with the R remaining samples in place of N: drop_last = false gives each rank ceil(R / W)
// of them, padded (if W does not divide R) with the epoch order's first samples, as a whole epoch
// is, so a sample may come once more; drop_last = true keeps floor(R / (B * W)) whole global
// batches and leaves the rest of the epoch out (0 batches when fewer than B * W remain).
uint64_t batches_in_epoch(const PlanOptions& options, uint64_t epoch);

// The global position after each rank r of `options`' plan has delivered its first delivered[r]
// batches of epoch `epoch` (options.resume's positions included for the resumed epoch): the
// positions of the epoch's order consumed, padding repeats left out. delivered has world_size
// entries, none above batches_in_epoch() (ConfigError). Resuming a plan of any world size, batch
// size and drop_last from it (PlanOptions::resume) gives each remaining sample exactly once (but
// for padding). With equal counts, the usual case, this is one range [0, K) and costs O(1).
Positions consumed_positions(const PlanOptions& options, uint64_t epoch,
                             const std::vector<uint64_t>& delivered);

// Global batch g holds positions [g * B * W, ...) of the (padded) epoch order, or of its remaining
// samples for the resumed epoch; rank r takes the r-th contiguous slice of it. So every rank knows
// every other rank's future.
class EpochPlan {
 public:
  EpochPlan(const PlanOptions& options, uint64_t epoch);
  uint64_t epoch() const noexcept { return epoch_; }
  uint64_t num_batches() const noexcept { return num_batches_; }
  uint64_t batch_size(uint64_t b) const;    // samples in this rank's batch b
  const uint64_t* batch(uint64_t b) const;  // batch_size(b) catalog indices
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
