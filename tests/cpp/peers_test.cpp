#include <doctest/doctest.h>

#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "prestage/error.hpp"
#include "prestage/options.hpp"
#include "prestage/plan.hpp"
#include "tiers/peers.hpp"

using prestage::PlanOptions;
using prestage::detail::Ownership;

namespace {

// The rule restated from the epoch's global order alone (plan.hpp: global batch g holds positions
// [g * B * W, ...) of the padded order, rank r its r-th slice): per sample, the rank at its first
// position.
std::vector<uint64_t> owners_from_order(const PlanOptions& p, uint64_t epoch) {
  std::vector<uint64_t> order = prestage::epoch_order(p.num_samples, p.seed, epoch, p.shuffle);
  const uint64_t per_rank = (p.num_samples + p.world_size - 1) / p.world_size;
  for (uint64_t i = 0; order.size() < per_rank * p.world_size; ++i) order.push_back(order[i]);
  std::vector<uint64_t> owner(p.num_samples, Ownership::kNoOwner);
  for (uint64_t pos = 0; pos < order.size(); ++pos) {
    const uint64_t g = pos / (p.batch_size * p.world_size);
    const uint64_t in_batch = std::min(p.batch_size, per_rank - g * p.batch_size);  // last: short
    const uint64_t rank = (pos - g * p.batch_size * p.world_size) / in_batch;
    if (owner[order[pos]] == Ownership::kNoOwner) owner[order[pos]] = rank;
  }
  return owner;
}

std::vector<uint64_t> identity(uint64_t n) {
  std::vector<uint64_t> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

}  // namespace

TEST_CASE("peers: the owner of a file is the first rank to use it in the start epoch") {
  for (const uint64_t n : {64, 61, 7}) {  // even, padded (duplicates of the first samples), tiny
    PlanOptions p;
    p.num_samples = n;
    p.batch_size = 3;
    p.seed = 11;
    p.world_size = 4;
    const std::vector<uint64_t> node_of = {0, 0, 2, 2};
    const Ownership own = Ownership::compute(identity(n), std::vector<uint64_t>(n, 10), p, 5, node_of,
                                             std::vector<uint64_t>(4, 0));
    CHECK(own.owner == owners_from_order(p, 5));
    CHECK(own.home == std::vector<uint8_t>(n, 1));  // no budget: every file has a home copy
  }
}

TEST_CASE("peers: files sharing a container are owned together, by the first user of any of them") {
  PlanOptions p;
  p.num_samples = 40;
  p.batch_size = 2;
  p.world_size = 2;
  std::vector<uint64_t> file_of(40);
  for (uint64_t s = 0; s < 40; ++s) file_of[s] = s / 4;  // 10 shards of 4 samples
  const Ownership own = Ownership::compute(file_of, std::vector<uint64_t>(10, 1), p, 0, {0, 1},
                                           {0, 0});
  const std::vector<uint64_t> by_sample = owners_from_order(p, 0);
  // A shard's owner is the owner of its sample used first.
  const std::vector<uint64_t> order = prestage::epoch_order(40, 0, 0, true);
  std::vector<uint64_t> expected(10, Ownership::kNoOwner);
  for (const uint64_t s : order) {
    if (expected[file_of[s]] == Ownership::kNoOwner) expected[file_of[s]] = by_sample[s];
  }
  CHECK(own.owner == expected);
}

TEST_CASE("peers: a node keeps its files in order of first use while they fit its budget") {
  PlanOptions p;
  p.num_samples = 50;
  p.batch_size = 4;
  p.seed = 3;
  p.world_size = 4;
  std::vector<uint64_t> sizes(50);
  for (uint64_t f = 0; f < 50; ++f) sizes[f] = 100 + 37 * (f % 7);
  const std::vector<uint64_t> node_of = {0, 0, 2, 2};
  const std::vector<uint64_t> budget_of = {1500, 1500, 4000, 4000};
  const Ownership own = Ownership::compute(identity(50), sizes, p, 0, node_of, budget_of);
  const std::vector<uint64_t> owner = owners_from_order(p, 0);
  CHECK(own.owner == owner);
  // Walk each node's files in order of first use: a prefix is home, within the budget, and the next
  // file would not have fit.
  std::vector<uint64_t> order = prestage::epoch_order(50, 3, 0, true);
  std::map<uint64_t, std::vector<uint64_t>> by_node;
  std::set<uint64_t> seen;
  for (const uint64_t s : order) {
    if (seen.insert(s).second) by_node[node_of[owner[s]]].push_back(s);
  }
  // The global order visits batch by batch and rank by rank within each: the first-use order.
  for (const auto& [node, files] : by_node) {
    uint64_t used = 0;
    size_t k = 0;
    while (k < files.size() && used + sizes[files[k]] <= budget_of[node]) used += sizes[files[k++]];
    CHECK(k > 0);
    CHECK(k < files.size());  // the budgets are below what each node owns
    for (size_t i = 0; i < files.size(); ++i) CHECK(own.home[files[i]] == (i < k ? 1 : 0));
  }
}

TEST_CASE("peers: with drop_last, files no rank uses in the start epoch have no owner") {
  PlanOptions p;
  p.num_samples = 30;
  p.batch_size = 4;
  p.world_size = 2;
  p.drop_last = true;  // 3 global batches of 8: 6 samples left out
  const Ownership own = Ownership::compute(identity(30), std::vector<uint64_t>(30, 1), p, 2, {0, 1},
                                           {0, 0});
  uint64_t unowned = 0;
  for (uint64_t f = 0; f < 30; ++f) unowned += own.owner[f] == Ownership::kNoOwner ? 1 : 0;
  CHECK(unowned == 6);
  for (uint64_t f = 0; f < 30; ++f) {
    if (own.owner[f] == Ownership::kNoOwner) CHECK(own.home[f] == 0);
  }
}

TEST_CASE("peers: without the plugin or an MPI launcher the tier stays off and says why") {
  // Run without mpiexec: no plugin path that exists, then (where the test builds it) the real one.
  prestage::Catalog catalog = prestage::Catalog::from_paths(".", {"a", "b"});
  PlanOptions p;
  p.num_samples = 2;
  p.world_size = 2;
  const prestage::detail::Peers one(catalog, PlanOptions{2, 1, 0, true, false, 0, 1}, nullptr, 0, {});
  CHECK_FALSE(one.on());
  CHECK(one.why_off().find("world_size 1") != std::string::npos);
  if (std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr && std::getenv("PMI_RANK") == nullptr) {
    const prestage::detail::Peers two(catalog, p, nullptr, 0, {});
    CHECK_FALSE(two.on());
    const std::string why = two.why_off();
    CHECK((why.rfind("plugin missing", 0) == 0 || why.rfind("MPI world of 1 does not match", 0) == 0));
  }
}

TEST_CASE("peers: a peer timeout of zero is refused") {
  prestage::LoaderOptions o;
  o.peers = true;
  o.peer_timeout_ms = 0;
  CHECK_THROWS_AS(o.validate(), prestage::ConfigError);
  o.peer_timeout_ms = 1;
  CHECK_NOTHROW(o.validate());
}
