// on_error=skip's candidates: a pure function of the plan.
#include <doctest/doctest.h>

#include <set>
#include <stdexcept>
#include <vector>

#include "decode/skip_policy.hpp"
#include "prestage/error.hpp"
#include "prestage/plan.hpp"

using prestage::EpochPlan;
using prestage::PlanOptions;
using prestage::detail::SkipCandidates;

namespace {

PlanOptions options(uint64_t samples, uint64_t batch_size, uint64_t rank = 0, uint64_t world = 1) {
  PlanOptions o;
  o.num_samples = samples;
  o.batch_size = batch_size;
  o.seed = 7;
  o.rank = rank;
  o.world_size = world;
  return o;
}

// This rank's samples of the epoch, its batches laid end to end: the oracle.
std::vector<uint64_t> stream(const EpochPlan& plan) {
  std::vector<uint64_t> out;
  for (const auto& batch : plan.batches()) out.insert(out.end(), batch.begin(), batch.end());
  return out;
}

}  // namespace

TEST_CASE("skip policy: candidates follow the failed sample in the rank's epoch, wrapping around") {
  for (const uint64_t world : {1, 3}) {
    const EpochPlan plan(options(50, 4, world - 1, world), 2);
    const std::vector<uint64_t> all = stream(plan);
    for (uint64_t batch = 0; batch < plan.num_batches(); ++batch) {
      for (uint64_t i = 0; i < plan.batch_size(batch); ++i) {
        const SkipCandidates candidates(plan, 4, batch, i, 5);
        REQUIRE(candidates.size() == 5);
        const uint64_t place = batch * 4 + i;
        for (uint64_t k = 0; k < candidates.size(); ++k) {
          CHECK(candidates[k] == all[(place + 1 + k) % all.size()]);
        }
      }
    }
  }
}

TEST_CASE("skip policy: at most the limit, and never the sample's own place in a small epoch") {
  const EpochPlan plan(options(5, 2), 0);  // batches of 2, 2, 1
  const std::vector<uint64_t> all = stream(plan);
  REQUIRE(all.size() == 5);
  const SkipCandidates last(plan, 2, 2, 0, 32);
  CHECK(last.size() == 4);  // every other sample of the epoch, once
  std::set<uint64_t> seen;
  for (uint64_t k = 0; k < last.size(); ++k) seen.insert(last[k]);
  CHECK(seen.size() == 4);
  CHECK(seen.count(all[4]) == 0);
  CHECK(last[0] == all[0]);  // wraps to the epoch's start
  CHECK(SkipCandidates(plan, 2, 0, 0, 2).size() == 2);
  const EpochPlan one(options(1, 1), 0);
  CHECK(SkipCandidates(one, 1, 0, 0, 32).size() == 0);
}

TEST_CASE("skip policy: only a sample's own I/O or decode error may be skipped") {
  using prestage::detail::skippable;
  CHECK(skippable(std::make_exception_ptr(prestage::IoError("f", 5, "read"))));
  CHECK(skippable(std::make_exception_ptr(prestage::DecodeError("f", "bad"))));
  CHECK_FALSE(skippable(std::make_exception_ptr(std::logic_error("bug"))));
  CHECK_FALSE(skippable(std::make_exception_ptr(std::bad_alloc())));
  CHECK_FALSE(skippable(std::make_exception_ptr(prestage::ConfigError("bad option"))));
}
