// on_error: a sample that cannot be read or decoded raises at its batch, or is replaced by the next
// good sample of this rank's epoch, the same way for any thread counts.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "prestage/prestage.hpp"
#include "test_util.hpp"
#include "util/file_io.hpp"

using prestage::Catalog;
using prestage::Loader;
using prestage::LoaderOptions;
using prestage::OnError;
using prestage::test::Epoch;
using prestage::test::run_epoch;
using prestage::test::TempDir;

namespace {

// What on_error=skip must deliver: this rank's samples of the epoch, each bad one replaced by the
// first good one that follows it, wrapping around, among the next kSkipCandidates.
std::vector<int64_t> expected_delivery(const Catalog& cat, const LoaderOptions& o, uint64_t epoch,
                                       const std::set<int64_t>& bad) {
  prestage::PlanOptions p;
  p.num_samples = cat.size();
  p.batch_size = o.batch_size;
  p.seed = o.seed;
  p.shuffle = o.shuffle;
  p.drop_last = o.drop_last;
  p.rank = o.rank;
  p.world_size = o.world_size;
  std::vector<int64_t> order;
  for (const auto& batch : prestage::EpochPlan(p, epoch).batches()) {
    order.insert(order.end(), batch.begin(), batch.end());
  }
  std::vector<int64_t> out;
  const size_t n = order.size();

  for (size_t q = 0; q < n; ++q) {
    for (size_t k = 0; k <= std::min<size_t>(n - 1, prestage::kSkipCandidates); ++k) {
      if (!bad.count(order[(q + k) % n])) {
        out.push_back(order[(q + k) % n]);
        break;
      }
    }
  }
  return out;
}

void overwrite(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Spoils a JPEG file: 0 deleted, 1 its entropy-coded data garbage, 2 truncated, 3 not a JPEG.
void corrupt(const std::filesystem::path& path, int fault) {
  switch (fault) {
    case 0:
      std::filesystem::remove(path);
      break;
    case 1: {
      std::string bytes(std::filesystem::file_size(path), '\0');
      std::ifstream(path, std::ios::binary)
          .read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      uint32_t x = 12345;
      for (size_t k = bytes.size() / 2; k < bytes.size(); ++k) {
        x = x * 1664525u + 1013904223u;
        bytes[k] = static_cast<char>(x >> 24);
      }
      overwrite(path, bytes);
      break;
    }
    case 2:
      std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2);
      break;
    default:
      overwrite(path, "GIF89a, not a JPEG");
  }
}

// A folder of 2 classes x 12 JPEGs with one file of each kind of fault: missing (deleted after the
// catalog was built), corrupt, truncated, not a JPEG. Returns the bad samples' indices.
std::set<int64_t> make_faulty_folder(const std::filesystem::path& root, Catalog& cat) {
  prestage::test::make_image_folder(root, 2, 12);
  cat = Catalog::from_folder(root);
  const std::vector<std::string> bad_names = {"class_0/img_3.jpg", "class_0/img_7.jpg",
                                              "class_1/img_2.jpg", "class_1/img_9.jpg"};
  std::set<int64_t> bad;
  for (size_t i = 0; i < cat.size(); ++i) {
    const auto it = std::find(bad_names.begin(), bad_names.end(), cat.path(i));
    if (it == bad_names.end()) continue;
    bad.insert(static_cast<int64_t>(i));
    const auto path = cat.source_path(i);
    corrupt(path, static_cast<int>(it - bad_names.begin()));
  }
  REQUIRE(bad.size() == 4);
  return bad;
}

LoaderOptions skip_options(uint64_t batch_size, uint64_t readers, const std::string& stage_dir) {
  LoaderOptions o;
  o.batch_size = batch_size;
  o.seed = 7;
  o.readers = readers;
  o.prefetchers = readers;
  o.stage_dir = stage_dir;
  o.on_error = OnError::kSkip;
  return o;
}

}  // namespace

TEST_CASE(
    "error policy: skip replaces each bad sample by the next good one of the plan, alike "
    "for 1, 2 and 4 readers") {
  TempDir dir;
  Catalog cat = Catalog::from_paths(dir.path(), {"x"});
  const std::set<int64_t> bad = make_faulty_folder(dir / "data", cat);
  std::vector<int64_t> first;
  for (const uint64_t readers : {1, 2, 4}) {
    CAPTURE(readers);
    const std::string stage = (dir / ("stage" + std::to_string(readers))).string();
    const LoaderOptions o = skip_options(5, readers, stage);
    Loader loader(cat, o);
    for (const uint64_t epoch : {0, 1}) {
      CAPTURE(epoch);
      const Epoch seen = run_epoch(loader, epoch);
      // Batches keep their sizes: 24 samples in batches of 5.
      CHECK(seen.sizes == std::vector<size_t>{5, 5, 5, 5, 4});
      const auto expected = expected_delivery(cat, o, epoch, bad);
      CHECK(seen.indices == expected);
      for (size_t k = 0; k < seen.indices.size(); ++k) {
        CHECK(!bad.count(seen.indices[k]));
        CHECK(seen.labels[k] == cat.label(seen.indices[k]));
        const auto pixels = prestage::test::decode_with_turbojpeg(cat.source_path(seen.indices[k]));
        REQUIRE(seen.data.size() >= (k + 1) * pixels.size());
        CHECK(std::memcmp(pixels.data(), seen.data.data() + k * pixels.size(), pixels.size()) == 0);
      }
      if (epoch == 0 && readers == 1) first = seen.indices;
      if (epoch == 0) CHECK(seen.indices == first);
    }
    const prestage::Stats stats = loader.stats();
    CHECK(stats.skipped == 8);  // each bad sample once per epoch
    REQUIRE(stats.skipped_samples.size() == 8);
    std::multiset<std::string> listed;
    for (const auto& s : stats.skipped_samples) {
      CHECK(bad.count(static_cast<int64_t>(s.sample)));
      CHECK(!bad.count(static_cast<int64_t>(s.replacement)));
      CHECK(s.path == cat.source_path(s.sample).string());
      CHECK(!s.error.empty());
      listed.insert(s.path);
    }
    for (const int64_t b : bad) CHECK(listed.count(cat.source_path(b).string()) == 2);
  }
}

TEST_CASE("error policy: raise, the default, raises the bad sample's error naming its path") {
  TempDir dir;
  Catalog cat = Catalog::from_paths(dir.path(), {"x"});
  const std::set<int64_t> bad = make_faulty_folder(dir / "data", cat);
  std::set<std::string> bad_paths;
  for (const int64_t i : bad) bad_paths.insert(cat.source_path(i).string());
  LoaderOptions o = skip_options(4, 2, "");
  o.on_error = LoaderOptions{}.on_error;
  CHECK(o.on_error == OnError::kRaise);
  Loader loader(cat, o);
  loader.start_epoch(0);
  int failed = 0;
  for (uint64_t b = 0; b < loader.batches_per_epoch(); ++b) {
    try {
      loader.next();
    } catch (const prestage::IoError& e) {
      ++failed;
      CHECK(bad_paths.count(e.path()) == 1);
      // Missing, or shorter than its catalog says (truncated, not a JPEG): it changed since.
      CHECK((e.error_code() == ENOENT || e.error_code() == EIO));
    } catch (const prestage::DecodeError& e) {
      ++failed;
      CHECK(bad_paths.count(e.path()) == 1);
    }
  }
  CHECK(failed >= 1);
  CHECK(loader.stats().skipped == 0);
}

TEST_CASE("error policy: after a bad image, a reader thread decodes the next good ones") {
  TempDir dir;
  std::vector<std::string> paths;
  for (int i = 0; i < 8; ++i) {
    paths.push_back("f" + std::to_string(i) + ".jpg");
    prestage::test::write_jpeg(dir / paths.back(), 24, 16, static_cast<uint32_t>(i));
  }
  const Catalog cat = Catalog::from_paths(dir.path(), paths);
  for (const int fault : {1, 2, 3}) {
    CAPTURE(fault);
    prestage::test::write_jpeg(cat.source_path(1), 24, 16, 1);
    corrupt(cat.source_path(1), fault);
    LoaderOptions o = skip_options(2, 1, "");
    o.shuffle = false;
    o.on_error = OnError::kRaise;
    Loader loader(cat, o);
    loader.start_epoch(0);
    CHECK_THROWS_AS(loader.next(), prestage::DecodeError);
    for (int b = 1; b < 4; ++b) CHECK(loader.next().has_value());  // the first by the failed thread
  }
}

TEST_CASE("error policy: with every file bad, skip raises instead of looping") {
  TempDir dir;
  std::vector<std::string> paths;
  for (int i = 0; i < 6; ++i) {
    paths.push_back("bad_" + std::to_string(i) + ".jpg");
    overwrite(dir / paths.back(), "not a jpeg");
  }
  // Resized or not: each batch raises its first sample's error, none is built from the bad files.
  for (const prestage::ImageSize size : {prestage::ImageSize{8, 8}, prestage::ImageSize{}}) {
    CAPTURE(size.height);
    LoaderOptions o = skip_options(3, 2, (dir / ("stage" + std::to_string(size.height))).string());
    o.image_size = size;
    Loader loader(Catalog::from_paths(dir.path(), paths), o);
    const auto start = std::chrono::steady_clock::now();
    loader.start_epoch(0);
    CHECK_THROWS_AS(loader.next(), prestage::DecodeError);
    CHECK_THROWS_AS(loader.next(), prestage::DecodeError);
    CHECK(!loader.next().has_value());
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
    CHECK(loader.stats().skipped == 0);
  }
}

TEST_CASE("error policy: more bad samples in a row than kSkipCandidates raise the first's error") {
  TempDir dir;
  std::vector<std::string> paths;
  const size_t bad_run = prestage::kSkipCandidates + 2;
  for (size_t i = 0; i < bad_run + 6; ++i) {
    paths.push_back("f" + std::to_string(i) + ".jpg");
    if (i < bad_run) {
      overwrite(dir / paths.back(), "not a jpeg");
    } else {
      prestage::test::write_jpeg(dir / paths.back(), 8, 8, static_cast<uint32_t>(i));
    }
  }
  const Catalog cat = Catalog::from_paths(dir.path(), paths);
  LoaderOptions o = skip_options(4, 2, "");
  o.shuffle = false;
  Loader loader(cat, o);
  loader.start_epoch(0);
  // Sample 0's candidates, 1..kSkipCandidates, are all bad; samples 2 and 3 reach a good one.
  try {
    loader.next();
    FAIL("batch 0 did not raise");
  } catch (const prestage::DecodeError& e) {
    CHECK(e.path() == cat.source_path(0).string());
  }
  // The run's last bad samples are within reach of good ones: their batches are whole.
  bool whole = false;
  for (uint64_t b = 1; b < loader.batches_per_epoch(); ++b) {
    try {
      auto batch = loader.next();
      REQUIRE(batch.has_value());
      CHECK(batch->size() == 4);
      for (const int64_t id : batch->indices()) CHECK(static_cast<size_t>(id) >= bad_run);
      whole = true;
    } catch (const prestage::DecodeError&) {
    }
  }
  CHECK(whole);
}

TEST_CASE("error policy: a read that times out is skipped like any failed read") {
  TempDir dir;
  std::vector<std::string> paths;
  for (int i = 0; i < 6; ++i) {
    paths.push_back("f" + std::to_string(i) + ".jpg");
    if (i == 2) continue;
    prestage::test::write_jpeg(dir / paths.back(), 8, 8, static_cast<uint32_t>(i));
  }
  const prestage::test::StalledFile stalled(dir / "f2.jpg");
  const Catalog cat = Catalog::from_paths(dir.path(), paths);
  LoaderOptions o = skip_options(3, 2, "");
  o.shuffle = false;
  o.io_timeout_ms = 1000;  // far above a good read, even on a loaded machine
  {
    Loader loader(cat, o);
    const Epoch seen = run_epoch(loader, 0);
    CHECK(seen.indices == std::vector<int64_t>{0, 1, 3, 3, 4, 5});
    const auto stats = loader.stats();
    REQUIRE(stats.skipped_samples.size() == 1);
    CHECK(stats.skipped_samples[0].sample == 2);
    CHECK(stats.skipped_samples[0].replacement == 3);
  }
}

TEST_CASE("error policy: a rank's replacements come from its own samples") {
  TempDir dir;
  Catalog cat = Catalog::from_paths(dir.path(), {"x"});
  const std::set<int64_t> bad = make_faulty_folder(dir / "data", cat);
  for (const uint64_t rank : {0, 1}) {
    CAPTURE(rank);
    LoaderOptions o = skip_options(3, 2, "");
    o.rank = rank;
    o.world_size = 2;
    Loader loader(cat, o);
    const Epoch seen = run_epoch(loader, 0);
    CHECK(seen.indices == expected_delivery(cat, o, 0, bad));
    prestage::PlanOptions p{cat.size(), o.batch_size, o.seed, o.shuffle, o.drop_last, rank, 2};
    std::set<int64_t> own;
    for (const auto& batch : prestage::EpochPlan(p, 0).batches()) {
      own.insert(batch.begin(), batch.end());
    }
    for (const int64_t id : seen.indices) CHECK(own.count(id) == 1);
  }
}

TEST_CASE("error policy: raw samples that cannot be read are skipped") {
  TempDir dir;
  std::vector<std::string> paths;
  for (int i = 0; i < 10; ++i) {
    paths.push_back("f" + std::to_string(i) + ".bin");
    std::ofstream(dir / paths.back())
        << std::string(static_cast<size_t>(i + 1), static_cast<char>('a' + i));
  }
  const Catalog cat = Catalog::from_paths(dir.path(), paths);
  std::filesystem::remove(dir / "f3.bin");
  std::filesystem::remove(dir / "f8.bin");
  for (const uint64_t readers : {1, 4}) {
    const std::string stage = (dir / ("stage" + std::to_string(readers))).string();
    LoaderOptions o = skip_options(4, readers, stage);
    o.decode = prestage::DecodeMode::kRaw;
    Loader loader(cat, o);
    loader.start_epoch(0);
    std::vector<int64_t> indices;
    while (auto b = loader.next()) {
      for (size_t k = 0; k < b->size(); ++k) {
        const int64_t id = b->indices()[k];
        indices.push_back(id);
        REQUIRE(b->offsets()[k + 1] - b->offsets()[k] == static_cast<uint64_t>(id + 1));
        CHECK(static_cast<char>(b->data()[b->offsets()[k]]) == static_cast<char>('a' + id));
      }
    }
    CHECK(indices == expected_delivery(cat, o, 0, {3, 8}));
    CHECK(loader.stats().skipped == 2);
  }
}

TEST_CASE("error policy: the list of skipped samples is bounded, the count is not") {
  TempDir dir;
  prestage::test::write_jpeg(dir / "good.jpg", 8, 8, 1);
  overwrite(dir / "bad.jpg", "not a jpeg");
  LoaderOptions o = skip_options(2, 1, "");
  Loader loader(Catalog::from_paths(dir.path(), {"good.jpg", "bad.jpg"}), o);
  const uint64_t epochs = prestage::Stats::kMaxSkippedListed + 5;
  for (uint64_t e = 0; e < epochs; ++e) {
    const Epoch seen = run_epoch(loader, e);
    REQUIRE(seen.indices == std::vector<int64_t>{0, 0});
  }
  const auto stats = loader.stats();
  CHECK(stats.skipped == epochs);
  CHECK(stats.skipped_samples.size() == prestage::Stats::kMaxSkippedListed);
  CHECK(stats.skipped_samples.back().epoch == prestage::Stats::kMaxSkippedListed - 1);
}

TEST_CASE("error policy: an unknown on_error is a ConfigError") {
  TempDir dir;
  prestage::test::write_jpeg(dir / "good.jpg", 8, 8, 1);
  LoaderOptions o;
  o.on_error = static_cast<OnError>(7);
  CHECK_THROWS_AS(o.validate(), prestage::ConfigError);
  CHECK_THROWS_AS(Loader(Catalog::from_paths(dir.path(), {"good.jpg"}), o), prestage::ConfigError);
}
