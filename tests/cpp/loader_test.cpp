#include <dirent.h>
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <map>
#include <set>
#include <thread>

#include "prestage/prestage.hpp"
#include "test_util.hpp"
#include "util/file_io.hpp"

using prestage::Catalog;
using prestage::Loader;
using prestage::LoaderOptions;
using prestage::test::Epoch;
using prestage::test::run_epoch;
using prestage::test::stalled_third;
using prestage::test::TempDir;

namespace {

LoaderOptions options(uint64_t batch_size, const std::string& stage_dir = "") {
  LoaderOptions o;
  o.batch_size = batch_size;
  o.seed = 3;
  o.stage_dir = stage_dir;
  // Stage 3 waits for stage 2, so what is staged follows the plan exactly, however slow the
  // machine.
  o.stage_patience_ms = LoaderOptions::kWaitForStaging;
  return o;
}

int thread_count() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (::readdir(d) != nullptr) ++n;
    ::closedir(d);
  }
  return n - 2;  // "." and ".."
}

}  // namespace

TEST_CASE("loader: every sample once per epoch, each image as TurboJPEG decodes it") {
  TempDir dir;
  prestage::test::make_image_folder(dir / "data", 3, 9);  // 27 images: batches of 4 leave 3
  const Catalog cat = Catalog::from_folder(dir / "data");
  Loader loader(cat, options(4, (dir / "stage").string()));
  CHECK(loader.batches_per_epoch() == 7);
  const Epoch seen = run_epoch(loader, 0);
  REQUIRE(seen.indices.size() == 27);
  std::vector<int64_t> sorted = seen.indices;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 27; ++i) CHECK(sorted[i] == i);
  const size_t image_bytes = 24 * 16 * 3;
  for (size_t k = 0; k < seen.indices.size(); ++k) {
    CHECK(seen.labels[k] == cat.label(seen.indices[k]));
    const auto expected = prestage::test::decode_with_turbojpeg(cat.source_path(seen.indices[k]));
    CHECK(std::memcmp(expected.data(), seen.data.data() + k * image_bytes, image_bytes) == 0);
  }
}

TEST_CASE("loader: batches are identical for 1, 2 and 4 readers and prefetchers") {
  TempDir dir;
  prestage::test::make_image_folder(dir / "data", 2, 15);
  const Catalog cat = Catalog::from_folder(dir / "data");
  Epoch reference;
  for (uint64_t threads : {1, 2, 4}) {
    CAPTURE(threads);
    LoaderOptions o = options(4, (dir / ("stage" + std::to_string(threads))).string());
    o.readers = threads;
    o.prefetchers = threads;
    o.image_size = {8, 8};
    Loader loader(cat, o);
    const Epoch seen = run_epoch(loader, 1);
    if (threads == 1) {
      reference = seen;
      continue;
    }
    CHECK(seen.indices == reference.indices);
    CHECK(seen.labels == reference.labels);
    CHECK(seen.data == reference.data);
  }
}

TEST_CASE("loader: epochs run back to back, each a new order, without a restart") {
  TempDir dir;
  prestage::test::make_image_folder(dir / "data", 2, 10);
  Loader loader(Catalog::from_folder(dir / "data"), options(3));
  const Epoch e0 = run_epoch(loader, 0);
  const Epoch e1 = run_epoch(loader, 1);
  CHECK(e0.indices.size() == 20);
  CHECK(e1.indices.size() == 20);
  CHECK(e0.indices != e1.indices);
  // The same epoch again gives the same order (a restart).
  CHECK(run_epoch(loader, 0).indices == e0.indices);
}

TEST_CASE("loader: starting mid-epoch gives the rest of the epoch") {
  TempDir dir;
  prestage::test::make_image_folder(dir / "data", 2, 10);
  Loader loader(Catalog::from_folder(dir / "data"), options(3));
  const Epoch full = run_epoch(loader, 4);
  loader.start_epoch(4, 2);
  std::vector<int64_t> rest;
  while (auto b = loader.next()) rest.insert(rest.end(), b->indices().begin(), b->indices().end());
  CHECK(rest == std::vector<int64_t>(full.indices.begin() + 6, full.indices.end()));
}

TEST_CASE(
    "loader: built with another world size from a global position, it gives the rest of the epoch, "
    "then whole epochs") {
  TempDir dir;
  prestage::test::make_image_folder(dir / "data", 2, 10);
  const Catalog catalog = Catalog::from_folder(dir / "data");
  // The saved job: 4 ranks of 2, one batch each of epoch 5 (8 samples); resumed on 3 ranks of 2.
  prestage::PlanOptions saved{20, 2, 3, true, false, 0, 4, {}};
  const prestage::Positions consumed = prestage::consumed_positions(saved, 5, {1, 1, 1, 1});
  const auto order = prestage::epoch_order(20, 3, 5, true);
  std::multiset<int64_t> seen(order.begin(), order.begin() + 8);
  for (uint64_t r = 0; r < 3; ++r) {
    LoaderOptions o = options(2, r == 1 ? (dir / "stage").string() : "");
    o.world_size = 3;
    o.rank = r;
    o.resume = {5, consumed};
    Loader loader(catalog, o);
    CHECK(loader.batches_in_epoch(5) == 2);  // 12 remain: 4 per rank
    CHECK(loader.batches_in_epoch(6) == loader.batches_per_epoch());
    const Epoch rest = run_epoch(loader, 5);
    CHECK(rest.indices.size() == 4);
    seen.insert(rest.indices.begin(), rest.indices.end());
    // The next epoch is the one a fresh loader on 3 ranks gives.
    LoaderOptions fresh_options = options(2);
    fresh_options.world_size = 3;
    fresh_options.rank = r;
    Loader fresh(catalog, fresh_options);
    CHECK(run_epoch(loader, 6).indices == run_epoch(fresh, 6).indices);
  }
  std::multiset<int64_t> epoch;
  for (int64_t i = 0; i < 20; ++i) epoch.insert(i);
  CHECK(seen == epoch);
}

TEST_CASE(
    "loader: a resumed epoch with no batch left is passed over, also by the pipeline running "
    "ahead") {
  TempDir dir;
  prestage::test::make_image_folder(dir / "data", 2, 10);
  for (int run = 0; run < 3; ++run) {
    // drop_last, 8 per batch: 2 batches per epoch; epoch 1 resumed with 6 left: none.
    LoaderOptions o = options(8, (dir / "stage").string());
    o.drop_last = true;
    o.lookahead = 4;
    o.resume = {1, {{0, 14}}};
    Loader loader(Catalog::from_folder(dir / "data"), o);
    CHECK(loader.batches_in_epoch(1) == 0);
    CHECK(run_epoch(loader, 0).sizes == std::vector<size_t>{8, 8});  // runs ahead through epoch 1
    CHECK(run_epoch(loader, 1).sizes.empty());
    CHECK(run_epoch(loader, 2).sizes == std::vector<size_t>{8, 8});
  }
}

TEST_CASE(
    "loader: starting the next epoch keeps what was read ahead for it; another epoch gives exactly "
    "its plan") {
  TempDir dir;
  prestage::test::make_image_folder(dir / "data", 3, 10);  // 30 images, 10 batches of 3
  const Catalog cat = Catalog::from_folder(dir / "data");
  LoaderOptions o = options(3);  // direct reads: each sample read from the source once per epoch
  o.lookahead = 2;
  o.depth = 3;
  Loader fresh(cat, o);
  std::map<uint64_t, Epoch> expected;
  for (const uint64_t e : {0, 1, 2, 5, 6}) expected[e] = run_epoch(fresh, e);
  Loader loader(cat, o);
  for (uint64_t e = 0; e < 3; ++e) {
    // The pipeline ran on into epoch e while epoch e - 1's last batches were used.
    const Epoch seen = run_epoch(loader, e);
    CHECK(seen.indices == expected[e].indices);
    CHECK(seen.data == expected[e].data);
  }
  // Left mid-epoch for an epoch the pipeline is not running into: started anew, nothing stale.
  loader.start_epoch(3);
  REQUIRE(loader.next().has_value());
  CHECK(run_epoch(loader, 5).indices == expected[5].indices);
  CHECK(run_epoch(loader, 6).indices == expected[6].indices);
  loader.close();
  std::map<uint64_t, uint64_t> reads;
  for (const prestage::EpochStats& e : loader.stats().epochs) reads[e.epoch] = e.source_reads;
  // Not one sample of epochs 1 and 2 read twice: what was read ahead across the boundary was used.
  CHECK(reads[0] == 30);
  CHECK(reads[1] == 30);
  CHECK(reads[2] == 30);
  CHECK(reads[5] == 30);
}

TEST_CASE(
    "loader: leaving an epoch a few batches early for the next keeps what was read ahead for it, "
    "and drops the rest") {
  TempDir dir;
  prestage::test::make_image_folder(dir / "data", 3, 10);  // 30 images, 10 batches of 3
  const Catalog cat = Catalog::from_folder(dir / "data");
  LoaderOptions o = options(3);  // direct reads: each sample read from the source once per epoch
  o.lookahead = 2;
  o.depth = 3;
  o.readers = 2;
  Loader fresh(cat, o);
  const Epoch e1 = run_epoch(fresh, 1);
  const Epoch e2 = run_epoch(fresh, 2);
  for (int run = 0; run < 3; ++run) {
    Loader loader(cat, o);
    loader.start_epoch(0);
    for (int b = 0; b < 8; ++b) REQUIRE(loader.next().has_value());  // 2 of 10 left
    // Every buffer is free: the pipeline decodes on until batch 0 of epoch 1 (3 ahead) is done.
    for (int wait = 0; wait < 10000 && loader.stats().decode.items < 11 * 3; ++wait) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    const Epoch seen = run_epoch(loader, 1);
    CHECK(seen.indices == e1.indices);
    CHECK(seen.data == e1.data);
    CHECK(run_epoch(loader, 2).indices == e2.indices);
    loader.close();
    std::map<uint64_t, uint64_t> reads;
    for (const prestage::EpochStats& e : loader.stats().epochs) reads[e.epoch] = e.source_reads;
    CHECK(reads[0] <= 30);  // the 2 batches left may or may not have been read
    CHECK(reads[1] == 30);  // none read twice: its first batches, decoded ahead, were delivered
    CHECK(reads[2] == 30);
  }
}

TEST_CASE("loader: a second run over the same stage directory copies nothing") {
  TempDir dir;
  prestage::test::make_image_folder(dir / "data", 2, 8);
  const Catalog cat = Catalog::from_folder(dir / "data");
  const std::string stage = (dir / "stage").string();
  {
    Loader first(cat, options(4, stage));
    run_epoch(first, 0);
    CHECK(first.stats().staged_files == 16);
  }
  Loader second(cat, options(4, stage));
  run_epoch(second, 0);
  const auto stats = second.stats();
  CHECK(stats.staged_files == 0);
  CHECK(stats.already_staged >= 16);
  CHECK(stats.misses == 0);
}

TEST_CASE(
    "loader: a missing or corrupt file raises at its batch, naming it, and the epoch goes on") {
  TempDir dir;
  prestage::test::make_image_folder(dir / "data", 1, 12);
  // The corrupt file is written before the catalog is built: one that changed size since is an
  // IoError (EIO), not a DecodeError.
  std::ofstream(dir / "data" / "class_0" / "img_9.jpg", std::ios::trunc) << "not a jpeg at all";
  const Catalog cat = Catalog::from_folder(dir / "data");
  LoaderOptions o = options(4, (dir / "stage").string());
  o.shuffle = false;  // catalog order: sample 5 is in batch 1, sample 10 in batch 2
  // Sorted names: img_0, img_1, img_10, img_11, img_2, ... so find the indices by path.
  int64_t missing = -1, corrupt = -1;
  for (size_t i = 0; i < cat.size(); ++i) {
    if (cat.path(i) == "class_0/img_5.jpg") missing = static_cast<int64_t>(i);
    if (cat.path(i) == "class_0/img_9.jpg") corrupt = static_cast<int64_t>(i);
  }
  REQUIRE(missing / 4 != corrupt / 4);
  std::filesystem::remove(cat.source_path(missing));
  Loader loader(cat, o);
  loader.start_epoch(0);
  int batches = 0;
  int io_errors = 0, decode_errors = 0;
  for (int b = 0; b < 3; ++b) {
    try {
      auto batch = loader.next();
      REQUIRE(batch.has_value());
      CHECK(batch->index() == static_cast<uint64_t>(b));
      ++batches;
    } catch (const prestage::IoError& e) {
      ++io_errors;
      CHECK(b == missing / 4);
      CHECK(e.path() == cat.source_path(missing).string());
      CHECK(e.error_code() == ENOENT);
    } catch (const prestage::DecodeError& e) {
      ++decode_errors;
      CHECK(b == corrupt / 4);
      CHECK(e.path() == cat.source_path(corrupt).string());
    }
  }
  CHECK(batches == 1);
  CHECK(io_errors == 1);
  CHECK(decode_errors == 1);
  CHECK(!loader.next().has_value());  // end of epoch
}

TEST_CASE(
    "loader: images of another size than the first keep their size when image_size is unset") {
  TempDir dir;
  prestage::test::write_jpeg(dir / "data/a/0.jpg", 24, 16, 1);
  prestage::test::write_jpeg(dir / "data/a/1.jpg", 30, 16, 2);
  LoaderOptions o = options(2);
  o.shuffle = false;
  Loader loader(Catalog::from_folder(dir / "data"), o);
  const auto batch = loader.next();
  REQUIRE(batch);
  CHECK(batch->ragged());
  CHECK(batch->sample_shape(0)[1] == 24);
  CHECK(batch->sample_shape(1)[1] == 30);
}

TEST_CASE("loader: a leftover partial file in the stage directory is never served") {
  TempDir dir;
  prestage::test::make_image_folder(dir / "data", 1, 6);
  const Catalog cat = Catalog::from_folder(dir / "data");
  const std::string stage = (dir / "stage").string();
  {
    Loader first(cat, options(6, stage));
    run_epoch(first, 0);
  }
  // As a process killed mid-copy leaves them: a half-written part file, a copy cut short.
  int k = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(stage)) {
    const auto p = entry.path();
    if (!entry.is_regular_file() || p.filename() == "index.log" || p.filename() == "node.table") {
      continue;
    }
    const auto size = std::filesystem::file_size(p);
    if (k++ % 2) {
      std::filesystem::rename(p, p.string() + ".part");
      std::filesystem::resize_file(p.string() + ".part", size / 2);
    } else {
      std::filesystem::resize_file(p, size / 2);
    }
  }
  Loader loader(cat, options(6, stage));
  const Epoch seen = run_epoch(loader, 0);
  REQUIRE(seen.indices.size() == 6);
  CHECK(loader.stats().staged_files == 6);
  for (size_t i = 0; i < 6; ++i) {
    const auto expected = prestage::test::decode_with_turbojpeg(cat.source_path(seen.indices[i]));
    CHECK(std::memcmp(expected.data(), seen.data.data() + i * expected.size(), expected.size()) ==
          0);
  }
}

TEST_CASE("loader: raw mode returns each file's bytes") {
  TempDir dir;
  std::vector<std::string> paths;
  for (int i = 0; i < 7; ++i) {
    paths.push_back("f" + std::to_string(i) + ".bin");
    std::ofstream(dir / paths.back())
        << std::string(static_cast<size_t>(i * 3), static_cast<char>('a' + i));
  }
  LoaderOptions o = options(3, (dir / "stage").string());
  o.decode = prestage::DecodeMode::kRaw;
  Loader loader(Catalog::from_paths(dir.path(), paths), o);
  loader.start_epoch(0);
  size_t samples = 0;
  while (auto b = loader.next()) {
    const auto offsets = b->offsets();
    REQUIRE(offsets.size() == b->size() + 1);
    for (size_t k = 0; k < b->size(); ++k) {
      const int64_t id = b->indices()[k];
      CHECK(offsets[k + 1] - offsets[k] == static_cast<uint64_t>(id * 3));
      for (uint64_t j = offsets[k]; j < offsets[k + 1]; ++j) {
        CHECK(static_cast<char>(b->data()[j]) == static_cast<char>('a' + id));
      }
      ++samples;
    }
  }
  CHECK(samples == 7);
}

TEST_CASE("loader: options are checked at construction, naming the option") {
  TempDir dir;
  prestage::test::make_image_folder(dir / "data", 1, 4);
  const Catalog cat = Catalog::from_folder(dir / "data");
  auto bad = [&](auto change) {
    LoaderOptions o = options(2);
    change(o);
    CHECK_THROWS_AS(Loader(cat, o), prestage::ConfigError);
  };
  bad([](LoaderOptions& o) { o.batch_size = 0; });
  bad([](LoaderOptions& o) { o.readers = 2000; });  // 0 is LoaderOptions::kAuto (machine_test)
  bad([](LoaderOptions& o) { o.depth = 1; });  // a loop holds one batch while asking for the next
  bad([](LoaderOptions& o) { o.rank = 2, o.world_size = 2; });
  bad([](LoaderOptions& o) { o.image_size = {0, 5}; });
  bad([](LoaderOptions& o) { o.batch_size = 5, o.drop_last = true; });  // no whole batch
  CHECK_THROWS_AS(Loader(Catalog::from_paths(dir.path(), {}), options(2)), prestage::ConfigError);
}

TEST_CASE("loader: an unusable stage directory falls back to reads ahead into memory and says so") {
  TempDir dir;
  prestage::test::make_image_folder(dir / "data", 1, 5);
  std::ofstream(dir / "not_a_dir") << "file";
  const Catalog cat = Catalog::from_folder(dir / "data");
  Loader loader(cat, options(2, (dir / "not_a_dir").string()));
  const Epoch seen = run_epoch(loader, 0);
  REQUIRE(seen.indices.size() == 5);
  const size_t image_bytes = 24 * 16 * 3;
  for (size_t k = 0; k < seen.indices.size(); ++k) {
    const auto expected = prestage::test::decode_with_turbojpeg(cat.source_path(seen.indices[k]));
    CHECK(std::memcmp(expected.data(), seen.data.data() + k * image_bytes, image_bytes) == 0);
  }
  loader.close();
  const auto stats = loader.stats();
  CHECK(stats.stage_dir_disabled);
  CHECK(!stats.stage_dir_error.empty());
  CHECK(stats.misses >= 5);
  CHECK(stats.read_ahead >= 5);  // stage 2 read every sample ahead: it could not copy any
  CHECK(stats.misses_read_ahead == stats.misses);
}

TEST_CASE("loader: stopping mid-epoch joins every thread promptly") {
  TempDir dir;
  prestage::test::make_image_folder(dir / "data", 2, 20);
  const Catalog cat = Catalog::from_folder(dir / "data");
  const int before = thread_count();
  for (uint64_t threads : {1, 2, 4}) {
    LoaderOptions o = options(2, (dir / "stage").string());
    o.readers = threads;
    o.prefetchers = threads;
    auto loader = std::make_unique<Loader>(cat, o);
    loader->start_epoch(0);
    auto held = loader->next();  // hold a batch past the loader's end: it must stay valid
    REQUIRE(held.has_value());
    const auto start = std::chrono::steady_clock::now();
    loader.reset();
    // A bound far above a close's own time (milliseconds; 1.0-1.2 s seen under TSan on a loaded
    // machine), far below a wait for work that never ends.
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
    CHECK(held->size() == 2);
  }
  CHECK(thread_count() == before);
}

TEST_CASE(
    "loader: a bounded stage directory never holds more than its bound and serves right bytes") {
  TempDir dir;
  prestage::test::make_image_folder(dir / "data", 2, 30);
  const Catalog cat = Catalog::from_folder(dir / "data");
  uint64_t total = 0;
  for (size_t f = 0; f < cat.num_files(); ++f) total += cat.file_size(f);
  for (uint64_t threads : {1, 2, 4}) {
    CAPTURE(threads);
    for (auto eviction : {prestage::Eviction::kClairvoyant, prestage::Eviction::kLru}) {
      LoaderOptions o = options(2, (dir / ("stage" + std::to_string(threads))).string());
      // The files of (lookahead + depth + 2) batches are protected: 10 files, half the bound.
      o.lookahead = 1;
      o.depth = 2;
      o.cache_bytes = total / 3;
      o.eviction = eviction;
      o.readers = threads;
      o.prefetchers = threads;
      Loader loader(cat, o);
      for (uint64_t e = 0; e < 3; ++e) {
        const Epoch seen = run_epoch(loader, e);
        REQUIRE(seen.indices.size() == 60);
        const size_t image_bytes = 24 * 16 * 3;
        for (size_t k = 0; k < seen.indices.size(); ++k) {
          const auto expected =
              prestage::test::decode_with_turbojpeg(cat.source_path(seen.indices[k]));
          CHECK(std::memcmp(expected.data(), seen.data.data() + k * image_bytes, image_bytes) == 0);
        }
      }
      loader.close();  // the pipeline plans and copies ahead until it stops: measure a still
                       // directory
      const auto stats = loader.stats();  // stage 2's figures included, after close() too
      CHECK(stats.staged_files > 0);
      CHECK(stats.stage_bytes_peak <= o.cache_bytes);
      CHECK(stats.stage_bytes_peak > 0);
      uint64_t evictions = 0;
      for (const auto& e : stats.epochs) evictions += e.evictions;
      CHECK(evictions > 0);
      // Files kept out by the bound were read into memory by stage 2 (and their pixels checked
      // above).
      if (eviction == prestage::Eviction::kClairvoyant) CHECK(stats.read_ahead > 0);
      // Stage 3 read the source only for those: never for a staged file (evicted while being read,
      // its copy gone, stage 3 would read the source instead).
      CHECK(stats.misses_read_ahead == stats.misses);
      uint64_t on_disk = 0;
      for (const auto& entry : std::filesystem::recursive_directory_iterator(o.stage_dir)) {
        // The copies; index.log and node.table are bookkeeping outside the bound.
        if (entry.is_regular_file() && entry.path().filename() != "index.log" &&
            entry.path().filename() != "node.table") {
          on_disk += entry.file_size();
        }
      }
      CAPTURE(static_cast<int>(eviction));
      CAPTURE(stats.stage_bytes);
      CAPTURE(stats.stage_bytes_peak);
      CHECK(on_disk <= o.cache_bytes);
    }
  }
}

TEST_CASE("loader: a caller holding every buffer gets an error, not a hang") {
  TempDir dir;
  prestage::test::make_image_folder(dir / "data", 1, 8);
  LoaderOptions o = options(2);
  o.depth = 2;
  Loader loader(Catalog::from_folder(dir / "data"), o);
  loader.start_epoch(0);
  auto a = loader.next();
  auto b = loader.next();
  CHECK_THROWS_AS(loader.next(), prestage::ConfigError);
  a.reset();
  CHECK(loader.next().has_value());  // one buffer free again: the loader goes on
}

TEST_CASE("loader: a read that stalls fails after io_timeout instead of hanging") {
  TempDir dir;
  prestage::test::make_image_folder(dir / "data", 1, 5);
  const prestage::test::StalledFile stalled(dir / "data/class_0/stalled.jpg");
  const Catalog cat = stalled_third(dir);
  LoaderOptions o = options(2, (dir / "stage").string());
  o.shuffle = false;
  o.io_timeout_ms = 1000;  // far above a good read, even on a loaded machine
  const auto start = std::chrono::steady_clock::now();
  {
    Loader loader(cat, o);
    loader.start_epoch(0);
    CHECK(loader.next().has_value());
    try {
      loader.next();
      FAIL("the stalled read did not fail");
    } catch (const prestage::IoError& e) {
      CHECK(e.error_code() == ETIMEDOUT);
      CHECK(e.path() == cat.source_path(2).string());
    }
    CHECK(loader.next().has_value());  // the epoch goes on
    CHECK(!loader.next().has_value());
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
}

TEST_CASE("loader: closing does not wait out io_timeout for a stalled read") {
  TempDir dir;
  prestage::test::make_image_folder(dir / "data", 1, 5);
  const prestage::test::StalledFile stalled(dir / "data/class_0/stalled.jpg");
  const Catalog cat = stalled_third(dir);
  for (const bool staged : {true, false}) {
    CAPTURE(staged);
    // Stage 2 (with a stage directory) or stage 3 (without) is stuck in the second batch's read.
    LoaderOptions o = options(2, staged ? (dir / "stage").string() : "");
    o.shuffle = false;
    o.io_timeout_ms = 20'000;
    Loader loader(cat, o);
    loader.start_epoch(0);
    REQUIRE(loader.next().has_value());
    std::optional<prestage::Batch> none;
    CHECK(loader.next_for(std::chrono::milliseconds(200), none) == Loader::Wait::kTimeout);
    const auto closing = std::chrono::steady_clock::now();
    loader.close();
    // Not the stuck read's io_timeout (20 s): a bound far above a close's own time (1.0-1.2 s seen
    // under TSan on a loaded machine).
    CHECK(std::chrono::steady_clock::now() - closing < std::chrono::seconds(5));
    CHECK(loader.stats().stage_failures == 0);  // the copy given up is no failure of the file
  }
}

TEST_CASE("loader: each loader keeps its own io_timeout") {
  // A loader without a limit, started while another with one runs, must not lift the other's limit.
  TempDir dir;
  prestage::test::make_image_folder(dir / "data", 1, 24);
  const prestage::test::StalledFile stalled(dir / "data/class_0/stalled.jpg");
  std::vector<std::string> paths;
  for (int i = 0; i < 24; ++i) paths.push_back("class_0/img_" + std::to_string(i) + ".jpg");
  paths.insert(paths.begin() + 20, "class_0/stalled.jpg");  // far beyond the first batches
  const Catalog cat = Catalog::from_paths(dir / "data", paths);
  LoaderOptions limited = options(2, (dir / "stage").string());
  limited.shuffle = false;
  limited.depth = 2;
  limited.lookahead = 1;
  limited.io_timeout_ms = 300;
  Loader a(cat, limited);
  a.start_epoch(0);
  REQUIRE(a.next().has_value());

  prestage::test::make_image_folder(dir / "other", 1, 4);
  Loader b(Catalog::from_folder(dir / "other"), options(2));  // no limit
  b.start_epoch(0);
  REQUIRE(b.next().has_value());

  // Without a limit of its own the stalled read would never return: watch it from outside.
  auto rest = std::async(std::launch::async, [&] {
    size_t timed_out = 0;
    while (true) {
      try {
        if (!a.next().has_value()) return timed_out;
      } catch (const prestage::IoError& e) {
        if (e.error_code() == ETIMEDOUT && e.path() == cat.source_path(20).string()) ++timed_out;
      }
    }
  });
  if (rest.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    std::fprintf(stderr, "loader_test: a read of the loader with io_timeout hung\n");
    std::_Exit(1);  // the hung thread cannot be joined
  }
  CHECK(rest.get() == 1);
}

TEST_CASE(
    "loader: without image_size no image is read when the loader is built; a first one that stalls "
    "fails at its batch") {
  // Each image keeps its own size: there is no first image's size to learn at construction.
  TempDir dir;
  prestage::test::make_image_folder(dir / "data", 1, 2);
  const prestage::test::StalledFile stalled(dir / "data/class_0/stalled.jpg");
  const Catalog cat = Catalog::from_paths(
      dir / "data", {"class_0/stalled.jpg", "class_0/img_0.jpg", "class_0/img_1.jpg"});
  LoaderOptions o = options(2);
  o.shuffle = false;
  o.io_timeout_ms = 300;
  const auto start = std::chrono::steady_clock::now();
  {
    Loader loader(cat, o);
    CHECK(loader.image_size().empty());
    loader.start_epoch(0);
    try {
      loader.next();
      FAIL("the stalled read did not fail");
    } catch (const prestage::IoError& e) {
      CHECK(e.error_code() == ETIMEDOUT);
      CHECK(e.path() == cat.source_path(0).string());
    }
    const auto rest = loader.next();  // the epoch goes on
    REQUIRE(rest);
    CHECK(rest->indices()[0] == 2);
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
}

TEST_CASE("loader: decode=locate says where each sample's bytes are, and reads none of them") {
  TempDir dir;
  prestage::test::make_image_folder(dir / "data", 2, 10);
  const Catalog cat = Catalog::from_folder(dir / "data");
  LoaderOptions o = options(4, (dir / "stage").string());
  o.decode = prestage::DecodeMode::kLocate;
  o.stage_patience_ms = LoaderOptions::kWaitForStaging;
  Loader loader(cat, o);
  for (uint64_t epoch = 0; epoch < 2; ++epoch) {
    loader.start_epoch(epoch);
    size_t seen = 0;
    while (auto batch = loader.next()) {
      REQUIRE(batch->data().size() == batch->size());
      for (size_t i = 0; i < batch->size(); ++i) {
        const auto sample = static_cast<uint64_t>(batch->indices()[i]);
        CHECK(std::to_integer<uint8_t>(batch->data()[i]) == prestage::kLocatedStaged);
        // The staged copy holds the source's bytes.
        std::ifstream staged(loader.staged_path(sample), std::ios::binary);
        std::ifstream source(cat.source_path(sample), std::ios::binary);
        const std::string a((std::istreambuf_iterator<char>(staged)),
                            std::istreambuf_iterator<char>());
        const std::string b((std::istreambuf_iterator<char>(source)),
                            std::istreambuf_iterator<char>());
        CHECK(!a.empty());
        CHECK(a == b);
        ++seen;
      }
    }
    CHECK(seen == cat.size());
  }
  const auto stats = loader.stats();
  CHECK(stats.staged_files == cat.size());  // copied once, in the first epoch
  CHECK(stats.misses == 0);
  // Without a stage directory, every sample is at the source, and no staged path exists.
  o.stage_dir.clear();
  Loader direct(cat, o);
  direct.start_epoch(0);
  while (auto batch = direct.next()) {
    for (size_t i = 0; i < batch->size(); ++i) {
      CHECK(std::to_integer<uint8_t>(batch->data()[i]) == prestage::kLocatedSource);
    }
  }
  CHECK(direct.staged_path(0).empty());
}

TEST_CASE(
    "loader: what it holds for ragged batches stays within its options' bounds, epoch after "
    "epoch") {
  // Raw files of many sizes: every batch ragged; a stage directory bounded below the set (stage 2
  // reads what it declines into memory), and none (stage 3 reads the source).
  TempDir dir;
  std::filesystem::create_directories(dir / "data/c");
  uint64_t state = 7, total = 0, largest = 0;
  for (int i = 0; i < 48; ++i) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    const size_t n = 1 + (state >> 33) % 3000;
    prestage::test::write_file(dir / "data/c" / ("f" + std::to_string(100 + i) + ".bin"),
                               std::vector<unsigned char>(n, static_cast<unsigned char>(i)));
    total += n;
    largest = std::max<uint64_t>(largest, n);
  }
  const Catalog cat = Catalog::from_folder(dir / "data", {".bin"});
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  for (const bool bounded : {true, false}) {
    CAPTURE(bounded);
    LoaderOptions o = options(6, bounded ? (dir / "stage").string() : "");
    o.decode = prestage::DecodeMode::kRaw;
    o.depth = 3;
    o.lookahead = 2;
    o.readers = 2;
    o.prefetchers = 2;
    if (bounded) o.cache_bytes = total * 3 / 10;
    Loader loader(cat, o);
    const uint64_t pool = o.lookahead + o.depth + 1;  // batches the pipeline holds when bounded
    prestage::Stats::Memory last;
    for (uint64_t epoch = 0; epoch < 30; ++epoch) {
      const Epoch seen = run_epoch(loader, epoch);
      REQUIRE(seen.indices.size() == 48);
      last = loader.stats().memory;
      CHECK(last.batch_buffers <= o.depth * (o.batch_size * largest * 5 / 4 + page));
      CHECK(last.decode_scratch <= o.depth * o.batch_size * 2 * largest);
      CHECK(last.read_ahead <= pool * (o.batch_size * largest * 5 / 4));
    }
    CHECK(last.batch_buffers > 0);
    CHECK(last.decode_scratch > 0);
    CHECK((last.read_ahead > 0) == bounded);
  }
}

TEST_CASE(
    "loader: each epoch's stage 3 reads by tier add up to its samples, and over the epochs to "
    "the run's hits and misses") {
  TempDir dir;
  prestage::test::make_image_folder(dir / "data", 3, 10);  // 30 images, 10 batches of 3
  const Catalog cat = Catalog::from_folder(dir / "data");
  for (const bool staged : {false, true}) {
    CAPTURE(staged);
    Loader loader(cat, options(3, staged ? (dir / "stage").string() : ""));
    for (uint64_t e = 0; e < 3; ++e) run_epoch(loader, e);
    loader.close();
    const prestage::Stats s = loader.stats();
    uint64_t from_stage = 0, elsewhere = 0;
    for (const prestage::EpochStats& e : s.epochs) {
      CAPTURE(e.epoch);
      const uint64_t decoded = e.decoded_from_stage + e.decoded_from_memory + e.decoded_from_peers +
                               e.decoded_from_source;
      if (e.epoch < 3) {  // consumed whole; a later one only begun
        CHECK(decoded == 30);
        CHECK(e.hits + e.misses == 30);
      }
      // Without a stage directory every sample is read from the source; with one (stage 3
      // waiting for stage 2), from the copy, made in epoch 0 (misses) and found after (hits).
      CHECK(e.decoded_from_stage == (staged ? decoded : 0));
      if (staged && e.epoch > 0 && e.epoch < 3) CHECK(e.hits == decoded);
      from_stage += e.decoded_from_stage;
      elsewhere += e.decoded_from_memory + e.decoded_from_peers + e.decoded_from_source;
    }
    CHECK(s.hits == from_stage);
    CHECK(s.misses == elsewhere);
  }
}
