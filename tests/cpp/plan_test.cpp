#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <vector>

#include "util/prng.hpp"
#include "prestage/error.hpp"
#include "prestage/plan.hpp"

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

TEST_CASE("plan: without drop_last, every sample comes once per epoch, padding only to even ranks") {
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
  CHECK_THROWS_AS(prestage::batches_per_epoch({10, 0, 0, true, false, 0, 1}), prestage::ConfigError);
  CHECK_THROWS_AS(prestage::batches_per_epoch({10, 2, 0, true, false, 2, 2}), prestage::ConfigError);
  CHECK_THROWS_AS(prestage::batches_per_epoch({10, 2, 0, true, false, 0, 0}), prestage::ConfigError);
  EpochPlan plan({10, 4, 0, true, false, 0, 1}, 0);
  CHECK_THROWS_AS(plan.batch_size(3), prestage::ConfigError);
}
