#include "prestage/plan.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <vector>

#include "prestage/error.hpp"
#include "util/prng.hpp"

using prestage::EpochPlan;
using prestage::PlanOptions;

TEST_CASE("plan: the generator reproduces the published xoshiro256** and SplitMix64 outputs") {
  // Reference outputs of the authors' C code, xoshiro256starstar.c from state {1, 2, 3, 4}.
  prestage::detail::Xoshiro256 rng = prestage::detail::Xoshiro256::from_state(1, 2, 3, 4);
  const uint64_t expected[] = {11520ULL, 0ULL, 1509978240ULL, 1215971899390074240ULL};
  for (uint64_t want : expected) CHECK(rng.next() == want);
}

TEST_CASE("plan: the same seed and epoch give the same order, another epoch another order") {
  const auto a = prestage::epoch_order(1000, 7, 3, true);
  CHECK(a == prestage::epoch_order(1000, 7, 3, true));
  CHECK(a != prestage::epoch_order(1000, 7, 4, true));
  CHECK(a != prestage::epoch_order(1000, 8, 3, true));
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<uint64_t> iota(1000);
  std::iota(iota.begin(), iota.end(), 0);
  CHECK(sorted == iota);  // a permutation
  CHECK(a != iota);
}

TEST_CASE("plan: shuffle=false gives the catalog order") {
  const auto order = prestage::epoch_order(17, 1, 5, false);
  for (uint64_t i = 0; i < order.size(); ++i) CHECK(order[i] == i);
}

TEST_CASE("plan: the shuffle is unbiased enough that every position sees every sample") {
  // 3 samples, 6000 epochs: each of the 6 permutations should come up about 1000 times.
  std::map<std::vector<uint64_t>, int> counts;
  for (uint64_t e = 0; e < 6000; ++e) ++counts[prestage::epoch_order(3, 11, e, true)];
  CHECK(counts.size() == 6);
  for (const auto& [perm, n] : counts) CHECK((n > 850 && n < 1150));
}

namespace {
std::map<uint64_t, int> coverage(PlanOptions o, uint64_t epoch, uint64_t* batches_per_rank) {
  std::map<uint64_t, int> seen;
  const uint64_t nb = prestage::batches_per_epoch(o);
  *batches_per_rank = nb;
  for (uint64_t r = 0; r < o.world_size; ++r) {
    o.rank = r;
    EpochPlan plan(o, epoch);
    REQUIRE(plan.num_batches() == nb);
    for (const auto& b : plan.batches()) {
      CHECK(b.size() <= o.batch_size);
      for (uint64_t i : b) ++seen[i];
    }
  }
  return seen;
}
}  // namespace

TEST_CASE(
    "plan: without drop_last, every sample comes once per epoch, padding only to even ranks") {
  for (uint64_t n : {1ULL, 10ULL, 97ULL, 100ULL}) {
    for (uint64_t world : {1ULL, 2ULL, 3ULL}) {
      for (uint64_t bs : {1ULL, 4ULL, 7ULL}) {
        CAPTURE(n);
        CAPTURE(world);
        CAPTURE(bs);
        PlanOptions o{n, bs, 5, true, false, 0, world};
        uint64_t nb = 0;
        const auto seen = coverage(o, 2, &nb);
        CHECK(seen.size() == n);  // every sample
        const uint64_t per_rank = (n + world - 1) / world;
        const uint64_t padding = per_rank * world - n;
        uint64_t total = 0, repeated = 0;
        for (const auto& [i, count] : seen) {
          CHECK(count >= 1);
          CHECK(static_cast<uint64_t>(count) <= 1 + (padding + n - 1) / n);
          total += count;
          repeated += count - 1;
        }
        CHECK(total == per_rank * world);
        CHECK(repeated == padding);  // fewer than world_size repeats
        CHECK(padding < world);
        CHECK(nb == (per_rank + bs - 1) / bs);
      }
    }
  }
}

TEST_CASE("plan: with drop_last, only whole global batches, no sample twice") {
  for (uint64_t n : {10ULL, 97ULL, 100ULL}) {
    for (uint64_t world : {1ULL, 2ULL, 3ULL}) {
      const uint64_t bs = 4;
      CAPTURE(n);
      CAPTURE(world);
      PlanOptions o{n, bs, 5, true, true, 0, world};
      uint64_t nb = 0;
      const auto seen = coverage(o, 0, &nb);
      CHECK(nb == n / (bs * world));
      CHECK(seen.size() == nb * bs * world);
      for (const auto& [i, count] : seen) CHECK(count == 1);
      for (uint64_t r = 0; r < world; ++r) {
        o.rank = r;
        for (const auto& b : EpochPlan(o, 0).batches()) CHECK(b.size() == bs);
      }
    }
  }
}

TEST_CASE("plan: rank r takes the r-th slice of each global batch of the global order") {
  PlanOptions o{20, 3, 9, true, false, 0, 2};
  const auto order = prestage::epoch_order(20, 9, 1, true);
  for (uint64_t r = 0; r < 2; ++r) {
    o.rank = r;
    EpochPlan plan(o, 1);
    CHECK(plan.batch(0)[0] == order[r * 3]);
    CHECK(plan.batch(1)[0] == order[6 + r * 3]);
    // The last global batch (positions 18, 19) is short: one sample per rank.
    CHECK(plan.batch_size(3) == 1);
    CHECK(plan.batch(3)[0] == order[18 + r]);
  }
}

TEST_CASE("plan: any rank's plan gives every other rank's batches, as their own plans do") {
  for (const bool drop_last : {false, true}) {
    PlanOptions o{23, 3, 5, true, drop_last, 0, 4};  // padded, with a short last global batch
    const EpochPlan seen_from_0(o, 2);
    for (uint64_t r = 0; r < 4; ++r) {
      o.rank = r;
      const EpochPlan own(o, 2);
      for (uint64_t b = 0; b < own.num_batches(); ++b) {
        const std::vector<uint64_t> want(own.batch(b), own.batch(b) + own.batch_size(b));
        const std::vector<uint64_t> got(seen_from_0.batch_of(b, r),
                                        seen_from_0.batch_of(b, r) + seen_from_0.batch_size(b));
        CHECK(got == want);
      }
    }
    CHECK_THROWS_AS(seen_from_0.batch_of(0, 4), prestage::ConfigError);
  }
}

TEST_CASE("plan: bad arguments are configuration errors") {
  CHECK_THROWS_AS(prestage::batches_per_epoch({10, 0, 0, true, false, 0, 1}),
                  prestage::ConfigError);
  CHECK_THROWS_AS(prestage::batches_per_epoch({10, 2, 0, true, false, 2, 2}),
                  prestage::ConfigError);
  CHECK_THROWS_AS(prestage::batches_per_epoch({10, 2, 0, true, false, 0, 0}),
                  prestage::ConfigError);
  EpochPlan plan({10, 4, 0, true, false, 0, 1}, 0);
  CHECK_THROWS_AS(plan.batch_size(3), prestage::ConfigError);
}

namespace {

// Every rank's batches of `epoch`, as (sample, is padding) in global batch order.
std::vector<std::vector<uint64_t>> rank_batches(PlanOptions o, uint64_t epoch) {
  std::vector<std::vector<uint64_t>> out;
  for (uint64_t r = 0; r < o.world_size; ++r) {
    o.rank = r;
    const EpochPlan plan(o, epoch);
    std::vector<uint64_t> all;
    for (const auto& b : plan.batches()) all.insert(all.end(), b.begin(), b.end());
    out.push_back(all);
  }
  return out;
}

// The positions of the epoch's order that the ranks' first delivered[r] batches hold, found by
// brute force: each sample's position in the order, padding (samples past the remaining ones in
// the global batches' layout) left out. Independent of consumed_positions()'s range arithmetic.
std::vector<bool> brute_consumed(const PlanOptions& o, uint64_t epoch,
                                 const std::vector<uint64_t>& delivered) {
  const auto order = prestage::epoch_order(o.num_samples, o.seed, epoch, o.shuffle);
  std::vector<uint64_t> position(o.num_samples);
  for (uint64_t i = 0; i < order.size(); ++i) position[order[i]] = i;
  std::vector<bool> consumed(o.num_samples, false);
  uint64_t remaining = o.num_samples;
  if (o.resume.epoch == epoch) {
    for (const auto& r : o.resume.consumed) {
      for (uint64_t p = r.begin; p < r.end; ++p) consumed[p] = true;
      remaining -= r.end - r.begin;
    }
  }
  const EpochPlan plan(o, epoch);
  std::vector<bool> taken = consumed;
  for (uint64_t r = 0; r < o.world_size; ++r) {
    for (uint64_t g = 0; g < delivered[r]; ++g) {
      const uint64_t size = plan.batch_size(g);
      for (uint64_t k = 0; k < size; ++k) {
        const uint64_t index = g * o.batch_size * o.world_size + r * size + k;  // in the layout
        if (index < remaining) taken[position[plan.batch_of(g, r)[k]]] = true;
      }
    }
  }
  return taken;
}

std::vector<bool> as_bits(const prestage::Positions& p, uint64_t n) {
  std::vector<bool> bits(n, false);
  for (const auto& r : p) {
    REQUIRE(r.begin < r.end);
    REQUIRE(r.end <= n);
    for (uint64_t i = r.begin; i < r.end; ++i) bits[i] = true;
  }
  for (size_t k = 1; k < p.size(); ++k) CHECK(p[k - 1].end < p[k].begin);  // sorted, not touching
  return bits;
}

}  // namespace

TEST_CASE(
    "plan: a resume on the same ranks from a batch boundary gives the rest of the uninterrupted "
    "epoch") {
  for (const bool drop_last : {false, true}) {
    for (uint64_t world : {1ULL, 3ULL}) {
      for (uint64_t n : {23ULL, 24ULL}) {
        CAPTURE(drop_last);
        CAPTURE(world);
        CAPTURE(n);
        PlanOptions o{n, 2, 5, true, drop_last, 0, world};
        const auto whole = rank_batches(o, 3);
        const uint64_t nb = prestage::batches_per_epoch(o);
        for (uint64_t b = 0; b < nb; ++b) {
          PlanOptions resumed = o;
          resumed.resume = {3, prestage::consumed_positions(o, 3, std::vector<uint64_t>(world, b))};
          CHECK(prestage::batches_in_epoch(resumed, 3) == nb - b);
          const auto rest = rank_batches(resumed, 3);
          for (uint64_t r = 0; r < world; ++r) {
            const auto& all = whole[r];
            // Rank r's samples from its batch b on; padding included, as the whole epoch pads.
            const uint64_t from = std::min<uint64_t>(b * 2, all.size());
            CHECK(rest[r] == std::vector<uint64_t>(all.begin() + from, all.end()));
          }
        }
      }
    }
  }
}

TEST_CASE("plan: the global position of any per-rank counts is the union of the ranks' batches") {
  for (const bool drop_last : {false, true}) {
    PlanOptions o{47, 3, 11, true, drop_last, 0, 4};  // padded, short last global batch
    const uint64_t nb = prestage::batches_per_epoch(o);
    const std::vector<std::vector<uint64_t>> counts = {{0, 0, 0, 0},     {2, 2, 2, 2},
                                                       {3, 2, 2, 1},     {0, nb, 1, 2},
                                                       {nb, nb, nb, nb}, {nb, nb - 1, nb, 0}};
    for (const auto& delivered : counts) {
      CAPTURE(drop_last);
      CHECK(as_bits(prestage::consumed_positions(o, 2, delivered), 47) ==
            brute_consumed(o, 2, delivered));
    }
    // Equal counts: one range [0, K), K = b * B * W, all positions once the epoch is over.
    CHECK(prestage::consumed_positions(o, 2, {2, 2, 2, 2}) == prestage::Positions{{0, 24}});
    CHECK(prestage::consumed_positions(o, 2, {0, 0, 0, 0}).empty());
    // The same from a plan that itself resumed, on other ranks, with holes in what it resumed from.
    PlanOptions resumed{47, 2, 11, true, drop_last, 0, 3};
    resumed.resume = {2, {{0, 5}, {9, 12}, {30, 31}}};
    const uint64_t rb = prestage::batches_in_epoch(resumed, 2);
    for (const auto& delivered :
         std::vector<std::vector<uint64_t>>{{0, 0, 0}, {1, 1, 1}, {3, 1, 2}, {rb, rb, rb}}) {
      CHECK(as_bits(prestage::consumed_positions(resumed, 2, delivered), 47) ==
            brute_consumed(resumed, 2, delivered));
    }
    // Another epoch of the same plan is whole.
    CHECK(prestage::consumed_positions(resumed, 3, {1, 1, 1}) == prestage::Positions{{0, 6}});
  }
}

TEST_CASE("plan: 4 -> 2 -> 3 ranks with other batch sizes: each sample of the epoch exactly once") {
  // 120 samples: 4 ranks x 3 take 2 batches (24), 2 ranks x 5 take 3 (30), 3 ranks x 2 take the
  // remaining 66 in 11 batches; no step pads. Then epoch 8 is a fresh epoch on 3 ranks.
  PlanOptions four{120, 3, 21, true, false, 0, 4};
  std::multiset<uint64_t> seen;
  const auto take = [&](const PlanOptions& o, uint64_t batches) {
    for (const auto& all : rank_batches(o, 7)) {
      const uint64_t count = std::min<uint64_t>(batches * o.batch_size, all.size());
      seen.insert(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(count));
    }
  };
  take(four, 2);
  PlanOptions two{120, 5, 21, true, false, 0, 2};
  two.resume = {7, prestage::consumed_positions(four, 7, {2, 2, 2, 2})};
  CHECK(two.resume.consumed == prestage::Positions{{0, 24}});
  take(two, 3);
  PlanOptions three{120, 2, 21, true, false, 0, 3};
  three.resume = {7, prestage::consumed_positions(two, 7, {3, 3})};
  CHECK(three.resume.consumed == prestage::Positions{{0, 54}});
  CHECK(prestage::batches_in_epoch(three, 7) == 11);
  take(three, 11);
  std::multiset<uint64_t> epoch;
  for (uint64_t i = 0; i < 120; ++i) epoch.insert(i);
  CHECK(seen == epoch);
  // Order after the resume: the rest of the epoch's permutation in global-batch slices.
  const auto order = prestage::epoch_order(120, 21, 7, true);
  CHECK(rank_batches(three, 7)[1][0] == order[54 + 2]);
  PlanOptions fresh{120, 2, 21, true, false, 0, 3};
  CHECK(rank_batches(three, 8) == rank_batches(fresh, 8));
  CHECK(prestage::batches_in_epoch(three, 8) == prestage::batches_per_epoch(fresh));
}

TEST_CASE("plan: a resumed remainder pads without drop_last and is cut with it") {
  // 10 remain over 4 ranks of 2: without drop_last each rank gets 3 (2 pad samples, the epoch
  // order's first two); with it, one global batch of 8 and 2 samples left out of the epoch.
  const auto order = prestage::epoch_order(50, 4, 0, true);
  PlanOptions o{50, 2, 4, true, false, 0, 4};
  o.resume = {0, {{0, 40}}};
  CHECK(prestage::batches_in_epoch(o, 0) == 2);
  std::vector<uint64_t> all;
  for (const auto& r : rank_batches(o, 0)) all.insert(all.end(), r.begin(), r.end());
  std::multiset<uint64_t> got(all.begin(), all.end());
  std::multiset<uint64_t> want(order.begin() + 40, order.end());
  want.insert(order[0]);
  want.insert(order[1]);
  CHECK(got == want);
  o.drop_last = true;
  CHECK(prestage::batches_in_epoch(o, 0) == 1);
  o.resume = {0, {{0, 44}}};  // 6 remain: fewer than a global batch
  CHECK(prestage::batches_in_epoch(o, 0) == 0);
  CHECK(prestage::batches_in_epoch(o, 1) == 6);
}

TEST_CASE("plan: a bad resume or bad counts are configuration errors") {
  PlanOptions o{20, 2, 0, true, false, 0, 2};
  for (const prestage::Positions& bad : std::vector<prestage::Positions>{
           {{3, 3}}, {{5, 2}}, {{0, 21}}, {{4, 8}, {6, 9}}, {{6, 9}, {0, 2}}}) {
    o.resume = {0, bad};
    CHECK_THROWS_AS(prestage::batches_in_epoch(o, 0), prestage::ConfigError);
    CHECK_THROWS_AS(EpochPlan(o, 0), prestage::ConfigError);
  }
  o.resume = {};
  CHECK_THROWS_AS(prestage::consumed_positions(o, 0, {1}), prestage::ConfigError);
  CHECK_THROWS_AS(prestage::consumed_positions(o, 0, {1, 6}), prestage::ConfigError);
}
