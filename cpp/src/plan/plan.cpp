#include "prestage/plan.hpp"

#include <algorithm>
#include <numeric>
#include <string>

#include "prestage/error.hpp"
#include "util/prng.hpp"

namespace prestage {

std::vector<uint64_t> epoch_order(uint64_t num_samples, uint64_t seed, uint64_t epoch,
                                  bool shuffle) {
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
  uint64_t end = 0;
  for (const PositionRange& r : o.resume.consumed) {
    if (r.begin >= r.end || r.begin < end || r.end > o.num_samples) {
      throw ConfigError("resume: consumed positions must be sorted, disjoint ranges of the " +
                        std::to_string(o.num_samples) + " samples; got [" +
                        std::to_string(r.begin) + ", " + std::to_string(r.end) + ")");
    }
    end = r.end;
  }
}

bool resumed(const PlanOptions& o, uint64_t epoch) {
  return !o.resume.consumed.empty() && o.resume.epoch == epoch;
}

// The samples epoch `epoch` runs: all, or those the resume left.
uint64_t samples_in_epoch(const PlanOptions& o, uint64_t epoch) {
  if (!resumed(o, epoch)) return o.num_samples;
  uint64_t consumed = 0;
  for (const PositionRange& r : o.resume.consumed) consumed += r.end - r.begin;
  return o.num_samples - consumed;
}

// Samples each rank gets of `samples`.
uint64_t per_rank(const PlanOptions& o, uint64_t samples) {
  if (o.drop_last) return samples / (o.batch_size * o.world_size) * o.batch_size;
  return (samples + o.world_size - 1) / o.world_size;
}

// Sorted by start, touching and overlapping ranges joined.
Positions joined(Positions ranges) {
  std::sort(ranges.begin(), ranges.end(),
            [](const PositionRange& a, const PositionRange& b) { return a.begin < b.begin; });
  Positions out;
  for (const PositionRange& r : ranges) {
    if (!out.empty() && r.begin <= out.back().end) {
      out.back().end = std::max(out.back().end, r.end);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

}  // namespace

uint64_t batches_per_epoch(const PlanOptions& o) {
  check(o);
  return (per_rank(o, o.num_samples) + o.batch_size - 1) / o.batch_size;
}

uint64_t batches_in_epoch(const PlanOptions& o, uint64_t epoch) {
  check(o);
  return (per_rank(o, samples_in_epoch(o, epoch)) + o.batch_size - 1) / o.batch_size;
}

Positions consumed_positions(const PlanOptions& o, uint64_t epoch,
                             const std::vector<uint64_t>& delivered) {
  const uint64_t batches = batches_in_epoch(o, epoch);
  if (delivered.size() != o.world_size) {
    throw ConfigError("consumed_positions: " + std::to_string(delivered.size()) +
                      " counts of delivered batches for a world_size of " +
                      std::to_string(o.world_size));
  }
  for (const uint64_t d : delivered) {
    if (d > batches) {
      throw ConfigError("consumed_positions: " + std::to_string(d) +
                        " batches delivered of an epoch of " + std::to_string(batches));
    }
  }
  const uint64_t samples = samples_in_epoch(o, epoch);
  const uint64_t per = per_rank(o, samples);
  const uint64_t b = o.batch_size, w = o.world_size;
  // Indices into the epoch's (remaining) order that the ranks took; those at or past `samples` are
  // padding. Global batches every rank has delivered are one prefix; past it, each rank's slices.
  Positions taken;
  const auto take = [&](uint64_t begin, uint64_t end) {
    end = std::min(end, samples);
    if (begin < end) taken.push_back({begin, end});
  };
  const uint64_t common = *std::min_element(delivered.begin(), delivered.end());
  take(0, w * std::min(common * b, per));
  for (uint64_t r = 0; r < w; ++r) {
    for (uint64_t g = common; g < delivered[r]; ++g) {
      const uint64_t size = std::min(b, per - g * b);
      take(g * b * w + r * size, g * b * w + (r + 1) * size);
    }
  }
  taken = joined(std::move(taken));
  // The remaining order is the gaps of the consumed positions, in order: map each taken index range
  // through them.
  const Positions none;
  const Positions& before = resumed(o, epoch) ? o.resume.consumed : none;
  Positions out = before;
  size_t t = 0;
  uint64_t first_index = 0;  // of the gap's first position in the remaining order
  for (size_t k = 0; k <= before.size() && t < taken.size(); ++k) {
    const uint64_t gap_begin = k == 0 ? 0 : before[k - 1].end;
    const uint64_t gap_end = k < before.size() ? before[k].begin : o.num_samples;
    const uint64_t last_index = first_index + (gap_end - gap_begin);
    while (t < taken.size() && taken[t].begin < last_index) {
      const uint64_t from = std::max(taken[t].begin, first_index);
      const uint64_t to = std::min(taken[t].end, last_index);
      out.push_back({gap_begin + (from - first_index), gap_begin + (to - first_index)});
      if (taken[t].end > last_index) break;  // goes on in the next gap
      ++t;
    }
    first_index = last_index;
  }
  return joined(std::move(out));
}

EpochPlan::EpochPlan(const PlanOptions& o, uint64_t epoch)
    : epoch_(epoch),
      num_batches_(batches_in_epoch(o, epoch)),
      batch_size_(o.batch_size),
      world_size_(o.world_size),
      rank_(o.rank),
      per_rank_(per_rank(o, samples_in_epoch(o, epoch))),
      order_(epoch_order(o.num_samples, o.seed, epoch, o.shuffle)) {
  // Pad to a multiple of world_size by repeating the first samples, as DistributedSampler does, so
  // that every rank gets the same number of batches (a short rank would hang collective
  // operations).
  const uint64_t padded = per_rank_ * world_size_;
  if (resumed(o, epoch)) {
    // The remaining samples in their order, padded as a whole epoch is: so a resume on the same
    // ranks from a batch boundary gives the very batches the uninterrupted epoch would have.
    std::vector<uint64_t> rest;
    rest.reserve(std::max<uint64_t>(padded, o.num_samples));
    uint64_t next = 0;
    for (const PositionRange& r : o.resume.consumed) {
      rest.insert(rest.end(), order_.begin() + next, order_.begin() + r.begin);
      next = r.end;
    }
    rest.insert(rest.end(), order_.begin() + next, order_.end());
    const uint64_t remaining = rest.size();
    for (uint64_t i = remaining; i < padded; ++i)
      rest.push_back(order_[(i - remaining) % o.num_samples]);
    order_ = std::move(rest);
    return;
  }
  for (uint64_t i = order_.size(); i < padded; ++i) order_.push_back(order_[i % o.num_samples]);
}

uint64_t EpochPlan::batch_size(uint64_t b) const {
  if (b >= num_batches_)
    throw ConfigError("batch " + std::to_string(b) + " is past the epoch's end");
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
