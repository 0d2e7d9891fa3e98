#include "staging/stage_cache.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "prestage/catalog.hpp"
#include "prestage/options.hpp"
#include "prestage/plan.hpp"
#include "prestage/stats.hpp"
#include "test_util.hpp"
#include "tiers/stage_directory.hpp"

using prestage::Catalog;
using prestage::EpochPlan;
using prestage::Eviction;
using prestage::PlanOptions;
using prestage::detail::StageCache;
using prestage::detail::StageDirectory;
using prestage::test::TempDir;

namespace {

constexpr uint64_t kFiles = 960;
constexpr uint64_t kBatch = 4;
constexpr uint64_t kEpochs = 6;

// kFiles files of unequal sizes (100 bytes to 4 KB, in no order), one sample each, and a stage
// directory for them: made once, as file creation dominates the run time on a busy disk.
struct Data {
  TempDir dir;
  Catalog catalog;
  StageDirectory directory;
  Data() : catalog(make_files(dir)), directory(dir / "stage", catalog) {}
  static Catalog make_files(const TempDir& dir) {
    std::filesystem::create_directories(dir / "src");
    std::ofstream list(dir / "list");
    uint64_t state = 12345;
    for (uint64_t f = 0; f < kFiles; ++f) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      const std::string name = "f" + std::to_string(f);
      std::ofstream(dir / ("src/" + name)) << std::string(100 + (state >> 33) % 4000, 'x');
      list << name << "\n";
    }
    list.close();
    return Catalog::from_list(dir / "list", dir / "src");
  }
};

Data& data() {
  static Data shared;
  return shared;
}

uint64_t set_bytes(const Catalog& catalog) {
  uint64_t total = 0;
  for (uint64_t f = 0; f < catalog.num_files(); ++f) total += catalog.file_size(f);
  return total;
}

PlanOptions rank_plan(uint64_t rank, uint64_t world_size) {
  PlanOptions plan;
  plan.num_samples = kFiles;
  plan.batch_size = kBatch;
  plan.seed = 11;
  plan.rank = rank;
  plan.world_size = world_size;
  return plan;
}

struct Outcome {
  std::vector<uint64_t> misses;       // per epoch
  std::vector<uint64_t> bytes;        // read from the source, per epoch
  bool bound_held = true;             // the copies on disk never exceeded the bound
  bool window_kept = true;            // no file of the last `window` batches was gone
  std::vector<uint64_t> home_misses;  // per epoch, of files HomeFirst::home names (with one)
};

// The peer tier's hybrid layout (StageCache::set_home_first): the files this node is the home of,
// and the layout in each epoch.
using Layout = StageCache::HomeLayout;
struct HomeFirst {
  std::vector<uint8_t> home;  // per file
  std::function<Layout(uint64_t epoch)> on;
};

// Runs kEpochs epochs of one rank through a StageCache. `copy`: does stage 2's part at once,
// copying every file claimed into the stage directory before the next batch; else the claims stay
// on their way (as while stage 2 copies them), which the cache counts the same and costs no disk
// traffic.
// Checks the bytes claimed or staged against the bound after each batch, and those of the copies on
// disk after each epoch; and after each batch, that every file that was in the directory for one of
// the last `window` batches still is.
Outcome run_cache(const Catalog& catalog, const PlanOptions& plan, uint64_t capacity,
                  Eviction eviction, uint64_t window, bool copy = false,
                  const HomeFirst* home_first = nullptr, StageDirectory* fresh = nullptr) {
  StageDirectory& directory = fresh != nullptr ? *fresh : data().directory;
  for (uint64_t f = 0; f < catalog.num_files(); ++f) {  // an empty directory
    if (!directory.is_absent(f)) directory.evict(f);
  }
  StageCache cache(catalog, plan, directory, capacity, eviction, window);
  uint64_t epoch_now = 0;
  if (home_first != nullptr) {
    cache.set_home_first([home_first](uint64_t f) { return home_first->home[f] != 0; },
                         [home_first, &epoch_now] { return home_first->on(epoch_now); });
  }
  Outcome out;
  std::deque<std::vector<uint64_t>> recent;  // files present for each of the last `window` batches
  std::vector<uint64_t> to_stage;
  std::vector<size_t> declined;
  std::vector<std::byte> buffer;
  for (uint64_t e = 0; e < kEpochs; ++e) {
    prestage::detail::Admission stats;
    const EpochPlan epoch(plan, e);
    epoch_now = e;
    uint64_t home_misses = 0;
    for (uint64_t b = 0; b < epoch.num_batches(); ++b) {
      to_stage.clear();
      declined.clear();
      cache.admit(e, b, epoch.batch(b), epoch.batch_size(b), to_stage, declined, stats);
      if (home_first != nullptr) {  // one sample per file: a miss is a file claimed or declined
        for (const uint64_t f : to_stage) home_misses += home_first->home[f];
        for (const size_t k : declined) home_misses += home_first->home[epoch.batch(b)[k]];
      }
      for (const uint64_t f : to_stage) {
        if (copy) {
          REQUIRE(directory.stage(f, catalog.file_source_path(f).string(), buffer) ==
                  StageDirectory::Outcome::kStaged);
        }
      }
      std::vector<uint64_t> present;
      for (uint64_t k = 0; k < epoch.batch_size(b); ++k) {
        if (!directory.is_absent(epoch.batch(b)[k])) present.push_back(epoch.batch(b)[k]);
      }
      recent.push_back(std::move(present));
      if (recent.size() > window) recent.pop_front();
      for (const auto& files : recent) {
        for (const uint64_t f : files) out.window_kept = out.window_kept && !directory.is_absent(f);
      }
      uint64_t held = 0;
      for (uint64_t f = 0; f < catalog.num_files(); ++f) {
        if (!directory.is_absent(f)) held += catalog.file_size(f);
      }
      out.bound_held = out.bound_held && held <= capacity && cache.used_bytes() <= capacity;
    }
    uint64_t on_disk = 0;  // the files themselves, once per epoch
    for (uint64_t f = 0; f < catalog.num_files(); ++f) {
      if (directory.is_staged(f)) on_disk += std::filesystem::file_size(directory.staged_path(f));
    }
    out.bound_held = out.bound_held && on_disk <= capacity;
    out.misses.push_back(stats.misses);
    out.bytes.push_back(stats.bytes_missed);
    out.home_misses.push_back(home_misses);
  }
  return out;
}

// The same stream through an independent simulation: Belady's rule with bypass (on a miss, give up
// the files used farthest ahead, unless the incoming one is used later still: then it is read and
// not kept), or LRU, never giving up a file of the last `window` batches. Belady's next uses come
// from the plan of `kEpochs + extra` epochs, so it sees well past the last epoch read.
// With several `ranks` (of plan.world_size) sharing the cache, the stream is their batches in
// turn, batch b of each before batch b + 1 of any, and `window` counts such steps.
// With `home_first`, in the epochs it is on, a file it names ranks ahead of every other (their
// Belady keys on two levels, the home files' below the others'), and the room of the home files not
// cached is kept for them: another file enters only room beyond it.
Outcome simulate(const Catalog& catalog, const PlanOptions& plan, uint64_t capacity,
                 Eviction eviction, uint64_t window, uint64_t extra,
                 std::vector<uint64_t> ranks = {}, const HomeFirst* home_first = nullptr) {
  constexpr uint64_t kNone = ~uint64_t{0};
  struct Use {
    uint64_t epoch, batch_seq, file;
  };
  if (ranks.empty()) ranks.push_back(plan.rank);
  std::vector<Use> stream;
  uint64_t seq = 0;
  for (uint64_t e = 0; e < kEpochs + extra; ++e) {
    std::vector<EpochPlan> epochs;
    for (const uint64_t r : ranks) {
      PlanOptions of_rank = plan;
      of_rank.rank = r;
      epochs.emplace_back(of_rank, e);
    }
    for (uint64_t b = 0; b < epochs[0].num_batches(); ++b) {
      ++seq;
      for (const EpochPlan& epoch : epochs) {
        for (uint64_t k = 0; k < epoch.batch_size(b); ++k) {
          stream.push_back({e, seq, epoch.batch(b)[k]});
        }
      }
    }
  }
  std::vector<uint64_t> next(stream.size());
  std::vector<uint64_t> later(catalog.num_files(), kNone);
  for (uint64_t i = stream.size(); i-- > 0;) {
    next[i] = later[stream[i].file];
    later[stream[i].file] = i;
  }
  Outcome out;
  out.misses.assign(kEpochs, 0);
  out.bytes.assign(kEpochs, 0);
  std::vector<uint64_t> key(catalog.num_files(), kNone);  // kNone: not cached
  std::vector<uint64_t> last_seq(catalog.num_files(), 0);
  std::set<std::pair<uint64_t, uint64_t>> cached;  // (key, file)
  uint64_t used = 0;
  const bool belady = eviction == Eviction::kClairvoyant;
  constexpr uint64_t kOthers = uint64_t{1} << 62;             // above every stream index
  std::vector<uint64_t> next_of(catalog.num_files(), kNone);  // per cached file: its next use
  bool ranked_home_first = false;
  uint64_t home_missing = 0;  // bytes of the home files not cached
  uint64_t home_unmade = 0;   // of those, never cached (what undecided keeps room for)
  std::vector<uint8_t> made(catalog.num_files(), 0);
  if (home_first != nullptr) {
    for (uint64_t f = 0; f < catalog.num_files(); ++f) {
      if (home_first->home[f]) home_missing += catalog.file_size(f);
    }
    home_unmade = home_missing;
  }
  const auto is_home = [&](uint64_t f) { return home_first != nullptr && home_first->home[f]; };
  const auto key_of = [&](uint64_t file, uint64_t next_use) {
    const uint64_t k = next_use == kNone ? kOthers - 1 : next_use;
    return ranked_home_first && !home_first->home[file] ? kOthers + k : k;
  };
  for (uint64_t i = 0; i < stream.size() && stream[i].epoch < kEpochs; ++i) {
    const uint64_t f = stream[i].file;
    const uint64_t size = catalog.file_size(f);
    const Layout layout =
        belady && home_first != nullptr ? home_first->on(stream[i].epoch) : Layout::kOwnFirst;
    if ((layout == Layout::kHomeFirst) != ranked_home_first) {
      ranked_home_first = !ranked_home_first;
      std::set<std::pair<uint64_t, uint64_t>> again;
      for (const auto& [old_key, file] : cached) {
        key[file] = key_of(file, next_of[file]);
        again.insert({key[file], file});
      }
      cached = std::move(again);
    }
    // Belady: the next use (after every use if none); LRU: this use.
    const uint64_t k = belady ? key_of(f, next[i]) : i;
    next_of[f] = next[i];
    last_seq[f] = stream[i].batch_seq;
    if (key[f] != kNone) {
      cached.erase({key[f], f});
      cached.insert({k, f});
      key[f] = k;
      continue;
    }
    ++out.misses[stream[i].epoch];
    out.bytes[stream[i].epoch] += size;
    // Undecided keeps room in the start epoch (the stream's first) only where every sample is a
    // file of its own (here: files of several samples are the Python peer tests').
    const bool as_off = layout == Layout::kOwnFirst ||
                        (layout == Layout::kUndecided && stream[i].epoch == stream[0].epoch &&
                         catalog.num_files() != catalog.size());
    const uint64_t kept = as_off || is_home(f)           ? 0
                          : layout == Layout::kHomeFirst ? std::min(home_missing, capacity)
                                                         : std::min(home_unmade, capacity);
    if (size + kept > capacity) continue;
    std::vector<uint64_t> victims;
    uint64_t freed = 0;
    auto consider = [&](const std::pair<uint64_t, uint64_t>& entry) {
      if (last_seq[entry.second] + window > stream[i].batch_seq) return true;  // in flight
      if (belady && entry.first <= k) return false;
      victims.push_back(entry.second);
      freed += catalog.file_size(entry.second);
      return used - freed + size + kept > capacity;
    };
    if (used + size + kept > capacity) {
      if (belady) {
        for (auto it = cached.rbegin(); it != cached.rend() && consider(*it); ++it) {
        }
      } else {
        for (auto it = cached.begin(); it != cached.end() && consider(*it); ++it) {
        }
      }
      if (used - freed + size + kept > capacity) continue;  // read, not kept
    }
    for (const uint64_t v : victims) {
      cached.erase({key[v], v});
      key[v] = kNone;
      used -= catalog.file_size(v);
      if (is_home(v)) home_missing += catalog.file_size(v);
    }
    cached.insert({k, f});
    key[f] = k;
    used += size;
    if (is_home(f)) {
      home_missing -= size;
      if (!made[f]) home_unmade -= size;
      made[f] = 1;
    }
  }
  return out;
}

uint64_t after_first(const std::vector<uint64_t>& per_epoch) {
  uint64_t sum = 0;
  for (size_t e = 1; e < per_epoch.size(); ++e) sum += per_epoch[e];
  return sum;
}

// The hybrid through a StageCache (each batch's copies made at once) and through the two-level
// oracle: the same misses and bytes per epoch, within the bound and the window. Returns the
// cache's outcome. `fresh`: a directory in which no earlier test has published a copy (what the
// undecided layout looks at).
Outcome run_against_oracle(const PlanOptions& plan, uint64_t capacity, const HomeFirst& hybrid,
                           StageDirectory* fresh = nullptr) {
  const Catalog& catalog = data().catalog;
  const Outcome got =
      run_cache(catalog, plan, capacity, Eviction::kClairvoyant, 3, true, &hybrid, fresh);
  const Outcome want = simulate(catalog, plan, capacity, Eviction::kClairvoyant, 3, 8, {}, &hybrid);
  CHECK(got.misses == want.misses);
  CHECK(got.bytes == want.bytes);
  CHECK(got.bound_held);
  CHECK(got.window_kept);
  return got;
}

}  // namespace

// Cache sizes are fractions of the bytes one rank reads per epoch (the set / world_size).
TEST_CASE("stage cache: on one rank, reads from the source exactly what Belady's rule reads") {
  const Catalog& catalog = data().catalog;
  const PlanOptions plan = rank_plan(0, 1);
  for (const double fraction : {0.25, 0.5, 0.75}) {
    CAPTURE(fraction);
    const auto capacity = static_cast<uint64_t>(fraction * set_bytes(catalog));
    const Outcome got = run_cache(catalog, plan, capacity, Eviction::kClairvoyant, 3);
    const Outcome want = simulate(catalog, plan, capacity, Eviction::kClairvoyant, 3, 8);
    CHECK(got.misses == want.misses);
    CHECK(got.bytes == want.bytes);
    CHECK(got.bound_held);
    CHECK(got.window_kept);
  }
}

TEST_CASE("stage cache: on a rank of 3 or 8, reads within 1% of Belady's rule seeing every epoch") {
  const Catalog& catalog = data().catalog;
  // Files next used by the rank three or more epochs ahead are many here: a rank uses a given file
  // in an epoch with probability 1 / world_size.
  for (const uint64_t world_size : {3, 8}) {
    const PlanOptions plan = rank_plan(1, world_size);
    for (const double fraction : {0.25, 0.5, 0.75}) {
      CAPTURE(world_size);
      CAPTURE(fraction);
      const auto capacity = static_cast<uint64_t>(fraction * set_bytes(catalog) / world_size);
      const Outcome got = run_cache(catalog, plan, capacity, Eviction::kClairvoyant, 3);
      const Outcome want = simulate(catalog, plan, capacity, Eviction::kClairvoyant, 3, 100);
      CHECK(got.misses[0] == want.misses[0]);  // the first epoch misses every file once
      const auto got_bytes = static_cast<double>(after_first(got.bytes));
      const auto want_bytes = static_cast<double>(after_first(want.bytes));
      CHECK(got_bytes <= 1.01 * want_bytes);
      CHECK(got_bytes >= 0.99 * want_bytes);
      CHECK(got.bound_held);
      CHECK(got.window_kept);
    }
  }
}

TEST_CASE("stage cache: files of the batches in flight are never evicted, even if that declines") {
  const Catalog& catalog = data().catalog;
  // A window of 12 batches (48 samples) against room for about 30 files: the window binds.
  for (const uint64_t world_size : {1, 8}) {
    CAPTURE(world_size);
    const PlanOptions plan = rank_plan(world_size - 1, world_size);
    const uint64_t capacity = set_bytes(catalog) / 32;
    const Outcome got = run_cache(catalog, plan, capacity, Eviction::kClairvoyant, 12, true);
    CHECK(got.window_kept);
    CHECK(got.bound_held);
    const Outcome want = simulate(catalog, plan, capacity, Eviction::kClairvoyant, 12, 100);
    CHECK(static_cast<double>(after_first(got.bytes)) <= 1.01 * after_first(want.bytes));
  }
}

TEST_CASE("stage cache: each file it declines is reported, so the peer tier knows none is coming") {
  const Catalog& catalog = data().catalog;
  StageDirectory& directory = data().directory;
  for (uint64_t f = 0; f < catalog.num_files(); ++f) {  // an empty directory
    if (!directory.is_absent(f)) directory.evict(f);
  }
  const PlanOptions plan = rank_plan(0, 1);
  StageCache cache(catalog, plan, directory, set_bytes(catalog) / 8, Eviction::kClairvoyant, 4);
  std::vector<uint64_t> reported;
  cache.set_on_declined([&](uint64_t file) { reported.push_back(file); });
  std::vector<uint64_t> to_stage, want;
  std::vector<size_t> declined;
  std::vector<std::byte> buffer;
  prestage::detail::Admission stats;
  for (uint64_t e = 0; e < 2; ++e) {
    const EpochPlan epoch(plan, e);
    for (uint64_t b = 0; b < epoch.num_batches(); ++b) {
      to_stage.clear();
      declined.clear();
      cache.admit(e, b, epoch.batch(b), epoch.batch_size(b), to_stage, declined, stats);
      for (const size_t k : declined) want.push_back(catalog.locator(epoch.batch(b)[k]).file);
      for (const uint64_t f : to_stage) {
        REQUIRE(directory.stage(f, catalog.file_source_path(f).string(), buffer) ==
                StageDirectory::Outcome::kStaged);
      }
    }
  }
  CHECK(!want.empty());  // an eighth of the set: Belady's rule bypasses some
  CHECK(reported == want);
  cache.let_go_all();
}

TEST_CASE(
    "stage cache: home first, the node's home copies rank ahead of other files, as the "
    "two-level Belady rule does") {
  const Catalog& catalog = data().catalog;
  const PlanOptions plan = rank_plan(0, 1);
  HomeFirst hybrid;
  hybrid.home.assign(catalog.num_files(), 0);
  uint64_t home_bytes = 0;
  for (uint64_t f = 0; f < catalog.num_files(); f += 2) {  // every other file: about half the set
    hybrid.home[f] = 1;
    home_bytes += catalog.file_size(f);
  }
  SUBCASE("on from the start: after the first epoch, no home copy is ever missed") {
    hybrid.on = [](uint64_t) { return Layout::kHomeFirst; };
    // Room for the home copies and a tenth of the set more; and less room than they take.
    for (const uint64_t capacity : {home_bytes + set_bytes(catalog) / 10, home_bytes / 2}) {
      CAPTURE(capacity);
      const Outcome got = run_against_oracle(plan, capacity, hybrid);
      const Outcome plain = run_cache(catalog, plan, capacity, Eviction::kClairvoyant, 3);
      if (capacity > home_bytes) {
        uint64_t others = 0;  // uses of other files per epoch
        for (uint64_t f = 0; f < catalog.num_files(); ++f) others += hybrid.home[f] == 0;
        for (uint64_t e = 1; e < kEpochs; ++e) {
          CHECK(got.home_misses[e] == 0);
          // The room beyond the home copies serves other files.
          CHECK(got.misses[e] - got.home_misses[e] < others);
        }
        // The other files pay for it: more misses in all than Belady's rule alone.
        CHECK(after_first(got.misses) > after_first(plain.misses));
      } else {  // the home copies themselves compete, by their next use
        CHECK(after_first(got.home_misses) > 0);
      }
    }
  }
  SUBCASE("switched on, off and on: the files tracked are ranked again at each change") {
    hybrid.on = [](uint64_t epoch) {
      return epoch == 2 || epoch >= 4 ? Layout::kHomeFirst : Layout::kOwnFirst;
    };
    const uint64_t capacity = home_bytes + set_bytes(catalog) / 10;
    const Outcome got = run_against_oracle(plan, capacity, hybrid);
    // Off, it is Belady's rule: the first two epochs are those of the plain rule.
    const Outcome plain = simulate(catalog, plan, capacity, Eviction::kClairvoyant, 3, 8);
    CHECK(got.misses[0] == plain.misses[0]);
    CHECK(got.misses[1] == plain.misses[1]);
    CHECK(got.home_misses[1] > 0);   // the plain rule gives home copies up
    CHECK(got.home_misses[5] == 0);  // on since epoch 4: each came back at its first use there
  }
  SUBCASE(
      "undecided, then home first: ranked as Belady's rule, other files kept out of the home "
      "copies' room (in the start epoch, where each sample is a file of its own)") {
    hybrid.on = [](uint64_t epoch) { return epoch < 2 ? Layout::kUndecided : Layout::kHomeFirst; };
    const uint64_t capacity = home_bytes + set_bytes(catalog) / 10;
    TempDir dir;
    StageDirectory fresh(dir / "stage", catalog);
    const Outcome got = run_against_oracle(plan, capacity, hybrid, &fresh);
    // The first epoch is Belady's rule's but for the room kept: it misses no more home copies.
    const Outcome plain = simulate(catalog, plan, capacity, Eviction::kClairvoyant, 3, 8);
    CHECK(got.misses[0] == plain.misses[0]);
  }
  SUBCASE("LRU keeps its own order") {
    hybrid.on = [](uint64_t) { return Layout::kHomeFirst; };
    const uint64_t capacity = home_bytes + set_bytes(catalog) / 10;
    const Outcome got = run_cache(catalog, plan, capacity, Eviction::kLru, 3, false, &hybrid);
    const Outcome want = simulate(catalog, plan, capacity, Eviction::kLru, 3, 8);
    CHECK(got.misses == want.misses);
  }
}

TEST_CASE("stage cache: LRU reads exactly what the simulation of LRU reads, on any rank") {
  const Catalog& catalog = data().catalog;
  for (const uint64_t world_size : {1, 3}) {
    const PlanOptions plan = rank_plan(world_size - 1, world_size);
    for (const double fraction : {0.25, 0.75}) {
      CAPTURE(world_size);
      CAPTURE(fraction);
      const auto capacity = static_cast<uint64_t>(fraction * set_bytes(catalog) / world_size);
      const Outcome got = run_cache(catalog, plan, capacity, Eviction::kLru, 3);
      const Outcome want = simulate(catalog, plan, capacity, Eviction::kLru, 3, 0);
      CHECK(got.misses == want.misses);
      CHECK(got.bytes == want.bytes);
      CHECK(got.bound_held);
      CHECK(got.window_kept);
    }
  }
}

// Two ranks (`ranks`, of world_size) sharing one stage directory through two views of it (two
// processes' StageDirectory), kEpochs epochs, each batch's copies made at once.
struct NodeRun {
  std::vector<uint64_t> bytes = std::vector<uint64_t>(kEpochs, 0);  // from the source, per epoch
  bool bound_held = true, window_kept = true;
  bool on_disk_counted = true;  // the node's count was the bytes on disk after each epoch
  bool home_kept = true;        // no file `watch` names left the disk once on it, from epoch 1
  bool all_removed = false;     // after the caches let go, every copy could be removed
};

NodeRun run_node(const std::vector<uint64_t>& ranks, uint64_t world_size, uint64_t capacity,
                 uint64_t window, const HomeFirst* home_first = nullptr,
                 const std::vector<uint8_t>* watch = nullptr) {
  const Catalog& catalog = data().catalog;
  StageDirectory& first = data().directory;
  for (uint64_t f = 0; f < catalog.num_files(); ++f) {  // an empty directory
    if (!first.is_absent(f)) first.evict(f);
  }
  StageDirectory second(data().dir / "stage", catalog);  // another process's view of it
  StageDirectory* directories[2] = {&first, &second};
  std::vector<std::unique_ptr<StageCache>> caches;
  uint64_t epoch_now = 0;
  for (size_t i = 0; i < 2; ++i) {
    caches.push_back(std::make_unique<StageCache>(catalog, rank_plan(ranks[i], world_size),
                                                  *directories[i], capacity, Eviction::kClairvoyant,
                                                  window));
    if (home_first != nullptr) {
      caches.back()->set_home_first([home_first](uint64_t f) { return home_first->home[f] != 0; },
                                    [home_first, &epoch_now] { return home_first->on(epoch_now); });
    }
  }
  NodeRun out;
  std::vector<uint8_t> home_seen(catalog.num_files(), 0);  // a home copy was on disk
  std::deque<std::vector<uint64_t>> recent;  // files each step's batches use, last `window` steps
  std::vector<std::byte> buffer;
  for (uint64_t e = 0; e < kEpochs; ++e) {
    epoch_now = e;
    const EpochPlan plans[2] = {EpochPlan(rank_plan(ranks[0], world_size), e),
                                EpochPlan(rank_plan(ranks[1], world_size), e)};
    for (uint64_t b = 0; b < plans[0].num_batches(); ++b) {
      std::vector<uint64_t> used_now;
      for (size_t i = 0; i < 2; ++i) {
        std::vector<uint64_t> to_stage;
        std::vector<size_t> declined;
        prestage::detail::Admission stats;
        caches[i]->admit(e, b, plans[i].batch(b), plans[i].batch_size(b), to_stage, declined,
                         stats);
        for (const uint64_t f : to_stage) {
          if (directories[i]->is_staged(f)) continue;  // a copy to check: none here
          const auto outcome =
              directories[i]->stage(f, catalog.file_source_path(f).string(), buffer);
          REQUIRE((outcome == StageDirectory::Outcome::kStaged ||
                   outcome == StageDirectory::Outcome::kAdopted));
          if (outcome == StageDirectory::Outcome::kStaged) out.bytes[e] += catalog.file_size(f);
        }
        for (const size_t k : declined) out.bytes[e] += catalog.file_size(plans[i].batch(b)[k]);
        for (uint64_t k = 0; k < plans[i].batch_size(b); ++k) {
          const uint64_t f = plans[i].batch(b)[k];
          if (first.node().on_disk(f)) used_now.push_back(f);
        }
      }
      recent.push_back(std::move(used_now));
      if (recent.size() > window) recent.pop_front();
      for (const auto& files : recent) {
        for (const uint64_t f : files) out.window_kept = out.window_kept && first.node().on_disk(f);
      }
      out.bound_held = out.bound_held && first.node().used() <= capacity;
      if (watch != nullptr && e >= 1) {
        for (uint64_t f = 0; f < catalog.num_files(); ++f) {
          if (!(*watch)[f]) continue;
          const bool on_disk = first.node().on_disk(f);
          out.home_kept = out.home_kept && (on_disk || !home_seen[f]);
          home_seen[f] = home_seen[f] || on_disk;
        }
      }
    }
    uint64_t on_disk = 0;  // the files themselves, once per epoch
    for (uint64_t f = 0; f < catalog.num_files(); ++f) {
      if (std::filesystem::exists(first.staged_path(f))) {
        on_disk += std::filesystem::file_size(first.staged_path(f));
      }
    }
    out.on_disk_counted = out.on_disk_counted && on_disk == first.node().used();
    out.bound_held = out.bound_held && on_disk <= capacity;
  }
  caches.clear();  // they let go of what they held: every copy can be removed now
  first.take_over_published();
  out.all_removed = true;
  for (uint64_t f = 0; f < catalog.num_files(); ++f) {
    if (first.node().on_disk(f)) out.all_removed = first.evict(f) && out.all_removed;
  }
  out.all_removed = out.all_removed && first.node().used() == 0;
  return out;
}

TEST_CASE(
    "stage cache: ranks sharing a directory keep one bound for the node, never remove what "
    "another holds, and read about what Belady's rule reads over the node's stream") {
  const Catalog& catalog = data().catalog;
  constexpr uint64_t kWindow = 3;
  const uint64_t world_size = 4;  // ranks 1 and 2 of 4 share the directory: half the set per epoch
  const uint64_t capacity = set_bytes(catalog) / 4;
  const std::vector<uint64_t> ranks = {1, 2};
  const NodeRun got = run_node(ranks, world_size, capacity, kWindow);
  CHECK(got.bound_held);
  CHECK(got.window_kept);
  CHECK(got.on_disk_counted);
  CHECK(got.all_removed);
  const Outcome want = simulate(catalog, rank_plan(ranks[0], world_size), capacity,
                                Eviction::kClairvoyant, kWindow, 100, ranks);
  CHECK(got.bytes[0] == want.bytes[0]);  // the first epoch reads the node's share once
  const auto got_bytes = static_cast<double>(after_first(got.bytes));
  const auto want_bytes = static_cast<double>(after_first(want.bytes));
  MESSAGE("node's bytes from the source after the first epoch: ", got_bytes,
          ", Belady's rule: ", want_bytes, " (", got_bytes / want_bytes, "x)");
  CHECK(got_bytes <= 1.05 * want_bytes);
}

TEST_CASE(
    "stage cache: ranks sharing a directory, home first from the second epoch: a home copy "
    "on the node stays there, within the node's one bound") {
  const Catalog& catalog = data().catalog;
  HomeFirst hybrid;
  hybrid.home.assign(catalog.num_files(), 0);
  for (uint64_t f = 0; f < catalog.num_files(); f += 5) hybrid.home[f] = 1;  // about a fifth
  hybrid.on = [](uint64_t epoch) { return epoch >= 1 ? Layout::kHomeFirst : Layout::kUndecided; };
  const uint64_t capacity = set_bytes(catalog) / 4;
  const NodeRun got = run_node({1, 2}, 4, capacity, 3, &hybrid, &hybrid.home);
  CHECK(got.home_kept);
  CHECK(got.bound_held);
  CHECK(got.window_kept);
  CHECK(got.on_disk_counted);
  CHECK(got.all_removed);
  // Without it, Belady's rule gives up home copies the node's ranks use later than others.
  const NodeRun plain = run_node({1, 2}, 4, capacity, 3, nullptr, &hybrid.home);
  CHECK(!plain.home_kept);
  CHECK(plain.bound_held);
}

TEST_CASE(
    "stage cache: ranks sharing a directory, one reading ahead into the next epoch while the "
    "other's copies are still to come: a file both claim takes its room once, and home copies "
    "that fill the bound all stay") {
  // As stage 1 and 2 run: each rank's copies are made `kLag` steps after its admission, and the
  // second rank plans `kAhead` batches ahead of the first. At each epoch's end it claims files of
  // the next epoch that the first has claimed and not copied yet. The node's home copies (the
  // files its ranks use in epoch 0) fill the bound exactly, home first from the start: a claim
  // counted twice would leave no room for a home copy, and another would be evicted for it.
  const Catalog& catalog = data().catalog;
  constexpr uint64_t kWindow = 8, kLag = 6, kAhead = 6, kWorld = 4;
  const std::vector<uint64_t> ranks = {1, 2};
  StageDirectory& first = data().directory;
  for (uint64_t f = 0; f < catalog.num_files(); ++f) {  // an empty directory
    if (!first.is_absent(f)) first.evict(f);
  }
  StageDirectory second(data().dir / "stage", catalog);  // another process's view of it
  StageDirectory* directories[2] = {&first, &second};
  std::vector<uint8_t> home(catalog.num_files(), 0);
  uint64_t capacity = 0;
  for (const uint64_t r : ranks) {
    const EpochPlan p(rank_plan(r, kWorld), 0);
    for (uint64_t b = 0; b < p.num_batches(); ++b) {
      for (uint64_t k = 0; k < p.batch_size(b); ++k) {
        const uint64_t f = p.batch(b)[k];
        if (!home[f]) capacity += catalog.file_size(f);
        home[f] = 1;
      }
    }
  }
  std::vector<std::unique_ptr<StageCache>> caches;
  // Each rank's batches, epochs in turn.
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> stream(2);
  for (size_t i = 0; i < 2; ++i) {
    caches.push_back(std::make_unique<StageCache>(catalog, rank_plan(ranks[i], kWorld),
                                                  *directories[i], capacity, Eviction::kClairvoyant,
                                                  kWindow));
    caches.back()->set_home_first([&home](uint64_t f) { return home[f] != 0; },
                                  [] { return Layout::kHomeFirst; });
    for (uint64_t e = 0; e < kEpochs; ++e) {
      const uint64_t batches = EpochPlan(rank_plan(ranks[i], kWorld), 0).num_batches();
      for (uint64_t b = 0; b < batches; ++b) stream[i].push_back({e, b});
    }
  }
  const uint64_t epoch_batches = stream[0].size() / kEpochs;
  std::deque<std::vector<uint64_t>> to_copy[2];  // per rank, the claims of its last steps
  std::vector<std::byte> buffer;
  uint64_t shared_claims = 0, home_lost = 0, home_declined = 0;
  bool bound_held = true;
  for (uint64_t t = 0; t < stream[0].size() + kAhead + kLag; ++t) {
    for (size_t i = 0; i < 2; ++i) {
      // The second rank is kAhead steps ahead: at step t it plans its batch t, the first t -
      // kAhead.
      const uint64_t at = i == 1 ? t : t - kAhead;
      std::vector<uint64_t> to_stage;
      if (t >= (i == 1 ? 0 : kAhead) && at < stream[i].size()) {
        const auto [e, b] = stream[i][at];
        const EpochPlan plan(rank_plan(ranks[i], kWorld), e);
        std::vector<size_t> declined;
        prestage::detail::Admission stats;
        caches[i]->admit(e, b, plan.batch(b), plan.batch_size(b), to_stage, declined, stats);
        for (const uint64_t f : to_stage) shared_claims += first.node().claimants(f) > 1;
        for (const size_t k : declined) home_declined += home[plan.batch(b)[k]];
      }
      to_copy[i].push_back(std::move(to_stage));
      if (to_copy[i].size() > kLag) {  // stage 2 copies the claims of kLag steps ago
        for (const uint64_t f : to_copy[i].front()) {
          if (directories[i]->is_staged(f)) continue;
          const auto outcome =
              directories[i]->stage(f, catalog.file_source_path(f).string(), buffer);
          REQUIRE(outcome != StageDirectory::Outcome::kBusy);
        }
        to_copy[i].pop_front();
      }
    }
    bound_held = bound_held && first.node().used() <= capacity;
    // From the end of the first rank's epoch 0 and its copies, every home copy is on disk.
    if (t >= epoch_batches + kAhead + kLag) {
      for (uint64_t f = 0; f < catalog.num_files(); ++f)
        home_lost += home[f] && !first.node().on_disk(f);
    }
  }
  MESSAGE("claims shared with a neighbour: ", shared_claims,
          ", home copies missing (summed over steps): ", home_lost,
          ", home copies declined: ", home_declined);
  CHECK(shared_claims > 0);  // the case arose
  CHECK(bound_held);
  CHECK(home_lost == 0);
  caches.clear();
}

namespace {

// Copies every file of `catalog` into the stage directory at `dir`, as a run before this one did;
// the directory object goes away with it (that run's processes have ended).
void stage_everything(const std::filesystem::path& dir, const Catalog& catalog) {
  StageDirectory earlier(dir, catalog);
  std::vector<std::byte> buffer;
  for (uint64_t f = 0; f < catalog.num_files(); ++f) {
    REQUIRE(earlier.try_claim(f));
    REQUIRE(earlier.stage(f, catalog.file_source_path(f).string(), buffer) ==
            StageDirectory::Outcome::kStaged);
  }
}

// The files a restart at (`epoch`, batch 0) of `plan` keeps within `capacity`: ordered by their
// next use by any of `ranks` (position b * batch_size + k in an epoch, epochs in turn, from
// `epoch` to the two after it, where every file of this set is used), the longest prefix that fits.
std::set<uint64_t> kept_by_plan_order(const Catalog& catalog, const PlanOptions& plan,
                                      const std::vector<uint64_t>& ranks, uint64_t epoch,
                                      uint64_t capacity) {
  constexpr uint64_t kNone = ~uint64_t{0};
  std::vector<uint64_t> next(catalog.num_files(), kNone);
  for (uint64_t e = epoch; e < epoch + 3; ++e) {
    for (const uint64_t r : ranks) {
      PlanOptions of_rank = plan;
      of_rank.rank = r;
      const EpochPlan p(of_rank, e);
      for (uint64_t b = 0; b < p.num_batches(); ++b) {
        for (uint64_t k = 0; k < p.batch_size(b); ++k) {
          const uint64_t f = p.batch(b)[k];
          next[f] = std::min(next[f], (e - epoch) * 1000000 + b * plan.batch_size + k);
        }
      }
    }
  }
  std::vector<std::pair<uint64_t, uint64_t>> order;
  for (uint64_t f = 0; f < catalog.num_files(); ++f) {
    REQUIRE(next[f] != kNone);
    order.push_back({next[f], f});
  }
  std::sort(order.begin(), order.end());
  std::set<uint64_t> kept;
  uint64_t used = 0;
  for (const auto& [use, f] : order) {
    if (used + catalog.file_size(f) > capacity) break;
    used += catalog.file_size(f);
    kept.insert(f);
  }
  return kept;
}

std::set<uint64_t> on_disk(StageDirectory& directory, const Catalog& catalog) {
  std::set<uint64_t> files;
  for (uint64_t f = 0; f < catalog.num_files(); ++f) {
    if (directory.node().on_disk(f)) {
      REQUIRE(std::filesystem::exists(directory.staged_path(f)));
      files.insert(f);
    }
  }
  return files;
}

}  // namespace

TEST_CASE(
    "stage cache: a warm restart mid-epoch keeps the copies the resumed plan uses first, "
    "within the bound, and copies none of them again") {
  const Catalog& catalog = data().catalog;
  TempDir dir;
  stage_everything(dir / "stage", catalog);  // a job with room for the whole set
  // It comes back with a third of that room, resumed mid-epoch 1 on one rank with another batch
  // size: 300 samples of the epoch consumed.
  StageDirectory directory(dir / "stage", catalog);
  CHECK(directory.found_at_start() == kFiles);
  PlanOptions plan = rank_plan(0, 1);
  plan.batch_size = 5;
  plan.resume = {1, {{0, 300}}};
  const uint64_t capacity = set_bytes(catalog) / 3;
  StageCache cache(catalog, plan, directory, capacity, Eviction::kClairvoyant, 3);
  cache.restart(1, 0);
  const std::set<uint64_t> kept = kept_by_plan_order(catalog, plan, {0}, 1, capacity);
  CHECK(on_disk(directory, catalog) == kept);
  CHECK(directory.node().used() <= capacity);
  CHECK(cache.used_bytes() == directory.node().used());
  // The rest of the epoch (660 samples, more than the bound holds) uses each kept copy before
  // anything could displace it: each is a hit, handed to stage 2 only to check its bytes, never
  // read from the source again.
  const EpochPlan epoch(plan, 1);
  uint64_t hits = 0, from_source = 0, checked = 0;
  std::vector<std::byte> buffer;
  for (uint64_t b = 0; b < epoch.num_batches(); ++b) {
    std::vector<uint64_t> to_stage;
    std::vector<size_t> declined;
    prestage::detail::Admission stats;
    cache.admit(1, b, epoch.batch(b), epoch.batch_size(b), to_stage, declined, stats);
    hits += stats.hits;
    for (const uint64_t f : to_stage) {
      if (directory.is_staged(f)) {
        CHECK(directory.unverified(f));
        CHECK(directory.verify(f, buffer));
        ++checked;
      } else {
        CHECK(kept.count(f) == 0);
        REQUIRE(directory.stage(f, catalog.file_source_path(f).string(), buffer) ==
                StageDirectory::Outcome::kStaged);
        ++from_source;
      }
    }
    for (const size_t k : declined) {
      CHECK(kept.count(epoch.batch(b)[k]) == 0);
      ++from_source;
    }
  }
  CHECK(hits == kept.size());
  CHECK(checked == kept.size());
  CHECK(hits + from_source == kFiles - 300);
}

TEST_CASE(
    "stage cache: ranks restarting on one warm directory keep the copies the node uses "
    "first, whichever rank brings it within the bound") {
  const Catalog& catalog = data().catalog;
  TempDir dir;
  stage_everything(dir / "stage", catalog);
  // Two ranks of two on the node, with half the room, resuming mid-epoch 2. Both have made their
  // loaders (joined the directory) before rank 0's pipeline starts, as ranks starting together do.
  StageDirectory first(dir / "stage", catalog);
  StageDirectory second(dir / "stage", catalog);  // the other process's view
  PlanOptions plan = rank_plan(0, 2);
  plan.resume = {2, {{0, 200}}};
  PlanOptions plan1 = plan;
  plan1.rank = 1;
  const uint64_t capacity = set_bytes(catalog) / 2;
  StageCache cache0(catalog, plan, first, capacity, Eviction::kClairvoyant, 3);
  StageCache cache1(catalog, plan1, second, capacity, Eviction::kClairvoyant, 3);
  cache0.restart(2, 0);
  const std::set<uint64_t> kept = kept_by_plan_order(catalog, plan, {0, 1}, 2, capacity);
  CHECK(on_disk(first, catalog) == kept);
  cache1.restart(2, 0);  // within the bound already: nothing more goes
  CHECK(on_disk(first, catalog) == kept);
  CHECK(first.node().used() <= capacity);
}
