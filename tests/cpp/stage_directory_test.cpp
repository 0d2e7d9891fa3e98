#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <thread>

#include "prestage/catalog.hpp"
#include "prestage/error.hpp"
#include "staging/stager.hpp"
#include "tiers/stage_directory.hpp"
#include "tiers/tiers.hpp"
#include "util/file_io.hpp"
#include "test_util.hpp"

using prestage::Catalog;
using prestage::detail::StageDirectory;
using prestage::test::TempDir;

namespace {
std::string read_text(const std::string& path) {
  std::vector<std::byte> buffer;
  prestage::detail::read_file(path, buffer);
  return {reinterpret_cast<const char*>(buffer.data()), buffer.size()};
}
}  // namespace

namespace {
void write(const std::filesystem::path& p, const std::string& text) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p, std::ios::trunc) << text;
}
using Outcome = StageDirectory::Outcome;
}  // namespace

TEST_CASE("stage directory: a staged copy holds the source's bytes, under a name made from its id") {
  TempDir dir;
  write(dir / "src/a", "alpha");
  write(dir / "src/b", "hello");
  const Catalog cat = Catalog::from_paths(dir / "src", {"a", "b"});
  StageDirectory stage(dir / "stage", cat);
  std::vector<std::byte> buffer;
  CHECK(!stage.is_staged(1));
  REQUIRE(stage.try_claim(1));
  CHECK(!stage.try_claim(1));  // one copier per file
  CHECK(stage.stage(1, cat.file_source_path(1).string(), buffer) == Outcome::kStaged);
  CHECK(stage.is_staged(1));
  CHECK(!stage.unverified(1));
  CHECK(read_text(stage.staged_path(1)) == "hello");
  const auto rel = std::filesystem::path(stage.staged_path(1)).lexically_relative(dir / "stage");
  CHECK(rel.begin()->string().rfind("prestage-", 0) == 0);
  CHECK(rel.filename() == "1");
}

TEST_CASE("stage directory: a second run finds the copies of the first and checks their bytes") {
  TempDir dir;
  write(dir / "src/a", "zero");
  write(dir / "src/b", "one");
  write(dir / "src/c", "two");
  const Catalog cat = Catalog::from_list((write(dir / "list", "a\nb\nc\n"), dir / "list"), dir / "src");
  std::vector<std::byte> buffer;
  {
    StageDirectory stage(dir / "stage", cat);
    for (uint64_t id : {0, 2}) {
      REQUIRE(stage.try_claim(id));
      REQUIRE(stage.stage(id, cat.file_source_path(id).string(), buffer) == Outcome::kStaged);
    }
  }
  StageDirectory again(dir / "stage", cat);
  CHECK(again.found_at_start() == 2);
  CHECK(again.is_staged(0));
  CHECK(!again.is_staged(1));
  CHECK(again.unverified(2));
  CHECK(again.verify(2, buffer));
  CHECK(!again.unverified(2));
  // A copy corrupted on the SSD fails its check and is evicted.
  {
    std::fstream f(again.staged_path(0), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1);
    f.put('X');
  }
  CHECK(!again.verify(0, buffer));
  CHECK(again.is_absent(0));
  CHECK(!std::filesystem::exists(again.staged_path(0)));
  // Another catalog gets an area of its own.
  StageDirectory other(dir / "stage", Catalog::from_paths(dir / "src", {"a", "b", "x"}));
  CHECK(other.found_at_start() == 0);
}

TEST_CASE("stage directory: a copy nobody vouched for, or a dead writer's part file, is removed") {
  TempDir dir;
  write(dir / "src/a", "aaaa");
  write(dir / "src/b", "bbbb");
  const Catalog cat = Catalog::from_paths(dir / "src", {"a", "b"});
  std::string copy, part;
  {
    StageDirectory stage(dir / "stage", cat);
    copy = stage.staged_path(0);
    part = stage.staged_path(1) + ".part";
  }
  write(copy, "aaaa");       // renamed into place, killed before its index record
  write(part, "half a fi");  // killed while writing
  StageDirectory again(dir / "stage", cat);
  CHECK(!again.is_staged(0));
  CHECK(!again.is_staged(1));
  CHECK(!std::filesystem::exists(copy));
  CHECK(!std::filesystem::exists(part));
}

TEST_CASE("stage directory: a copy whose source changed since is not used") {
  TempDir dir;
  write(dir / "src/c0/a.jpg", "original");
  std::vector<std::byte> buffer;
  {
    const Catalog cat = Catalog::from_folder(dir / "src");
    StageDirectory stage(dir / "stage", cat);
    REQUIRE(stage.try_claim(0));
    REQUIRE(stage.stage(0, cat.file_source_path(0).string(), buffer) == Outcome::kStaged);
  }
  write(dir / "src/c0/a.jpg", "replaced!");  // another size and time
  const Catalog fresh = Catalog::from_folder(dir / "src");
  StageDirectory again(dir / "stage", fresh);
  CHECK(!again.is_staged(0));
  REQUIRE(again.try_claim(0));
  CHECK(again.stage(0, fresh.file_source_path(0).string(), buffer) == Outcome::kStaged);
  CHECK(read_text(again.staged_path(0)) == "replaced!");
  // A source that changes after its catalog was built is not staged from the stale catalog.
  const Catalog stale = Catalog::from_folder(dir / "src");
  write(dir / "src/c0/a.jpg", "changed once more");
  StageDirectory third(dir / "stage2", stale);
  REQUIRE(third.try_claim(0));
  CHECK(third.stage(0, stale.file_source_path(0).string(), buffer) == Outcome::kChanged);
  CHECK(third.is_absent(0));
}

TEST_CASE("stage directory: two processes sharing it never copy a file twice") {
  TempDir dir;
  write(dir / "src/a", "shared");
  write(dir / "src/b", "other");
  const Catalog cat = Catalog::from_paths(dir / "src", {"a", "b"});
  StageDirectory first(dir / "stage", cat);
  StageDirectory second(dir / "stage", cat);  // as another rank on the node would
  std::vector<std::byte> buffer;
  REQUIRE(first.try_claim(0));
  REQUIRE(first.stage(0, cat.file_source_path(0).string(), buffer) == Outcome::kStaged);
  std::filesystem::remove(dir / "src/a");  // the second must not need the source
  REQUIRE(second.try_claim(0));
  CHECK(second.stage(0, cat.file_source_path(0).string(), buffer) == Outcome::kAdopted);
  CHECK(second.is_staged(0));
  CHECK(second.verify(0, buffer));
  // While one holds the lock of a copy in progress, the other leaves it alone.
  const int fd = ::open((second.staged_path(1) + ".part").c_str(), O_CREAT | O_WRONLY, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX) == 0);
  REQUIRE(first.try_claim(1));
  CHECK(first.stage(1, cat.file_source_path(1).string(), buffer) == Outcome::kBusy);
  CHECK(first.is_absent(1));
  StageDirectory third(dir / "stage", cat);  // a scan keeps a locked part file
  CHECK(std::filesystem::exists(second.staged_path(1) + ".part"));
  ::close(fd);
}

TEST_CASE("stage directory: source and directory failures give the claim back") {
  TempDir dir;
  write(dir / "src/a", "x");
  const Catalog cat = Catalog::from_paths(dir / "src", {"a", "missing"});
  StageDirectory stage(dir / "stage", cat);
  std::vector<std::byte> buffer;
  REQUIRE(stage.try_claim(1));
  CHECK_THROWS_AS(stage.stage(1, cat.file_source_path(1).string(), buffer), StageDirectory::SourceError);
  CHECK(stage.is_absent(1));
  std::filesystem::remove_all(dir / "stage");
  REQUIRE(stage.try_claim(0));
  CHECK_THROWS_AS(stage.stage(0, cat.file_source_path(0).string(), buffer), prestage::IoError);
  CHECK(stage.is_absent(0));
}

TEST_CASE("stager: copies every claimed file of its tasks, and calls each task's done once") {
  for (size_t threads : {1, 2, 4}) {
    CAPTURE(threads);
    TempDir dir;
    std::vector<std::string> paths;
    for (int i = 0; i < 40; ++i) {
      paths.push_back("f" + std::to_string(i));
      std::ofstream(dir / paths.back()) << "content " << i;
    }
    const Catalog cat = Catalog::from_paths(dir.path(), paths);
    StageDirectory stage(dir / "stage", cat);
    std::vector<uint64_t> ids(40);
    for (uint64_t i = 0; i < 40; ++i) {
      ids[i] = (i * 7) % 40;
      REQUIRE(stage.try_claim(ids[i]));  // stage 1 claims what stage 2 copies
    }
    std::atomic<int> done{0};
    {
      prestage::detail::Tiers tiers(cat, &stage, UINT64_MAX);
      prestage::detail::Stager stager(tiers, threads);
      prestage::detail::StageTask a, b;
      for (auto* t : {&a, &b}) {
        t->done = [](void* c) { static_cast<std::atomic<int>*>(c)->fetch_add(1); };
        t->context = &done;
      }
      a.ids = ids.data();
      a.count = 25;
      b.ids = ids.data() + 25;
      b.count = 15;
      stager.submit(&a);
      stager.submit(&b);
      while (done.load() < 2) std::this_thread::yield();
      prestage::Stats stats;
      stager.add_to(stats, 1.0);
      CHECK(stats.staged_files == 40);
      CHECK(stats.stage_failures == 0);
    }
    CHECK(done.load() == 2);
    for (uint64_t i = 0; i < 40; ++i) {
      CHECK(stage.is_staged(i));
      CHECK(stage.staged_size(i) == ("content " + std::to_string(i)).size());
      CHECK(read_text(stage.staged_path(i)) == "content " + std::to_string(i));
    }
  }
}

TEST_CASE("stager: a missing source file is given up on, and the other samples are staged") {
  TempDir dir;
  std::ofstream(dir / "ok") << "fine";
  const Catalog cat = Catalog::from_paths(dir.path(), {"ok", "missing"});
  StageDirectory stage(dir / "stage", cat);
  std::atomic<int> done{0};
  prestage::detail::Tiers tiers(cat, &stage, UINT64_MAX);
  prestage::detail::Stager stager(tiers, 2);
  std::vector<uint64_t> ids{0, 1};
  REQUIRE(stage.try_claim(0));
  REQUIRE(stage.try_claim(1));
  prestage::detail::StageTask task;
  task.ids = ids.data();
  task.count = 2;
  task.done = [](void* c) { static_cast<std::atomic<int>*>(c)->fetch_add(1); };
  task.context = &done;
  stager.submit(&task);
  while (done.load() < 1) std::this_thread::yield();
  CHECK(stage.is_staged(0));
  CHECK(!stage.is_staged(1));
  CHECK(stage.is_absent(1));  // the claim was given back
  prestage::Stats stats;
  stager.add_to(stats, 1.0);
  CHECK(stats.stage_failures == 1);
  CHECK(!stats.stage_dir_disabled);
}

TEST_CASE("stager: declined samples are read into memory; a failed read is left to stage 3") {
  TempDir dir;
  std::ofstream(dir / "a") << "alpha";
  std::ofstream(dir / "b") << "bravo!";
  std::ofstream(dir / "c") << "copied";
  const Catalog cat = Catalog::from_paths(dir.path(), {"a", "missing", "b", "c"});
  StageDirectory stage(dir / "stage", cat);
  std::atomic<int> done{0};
  prestage::detail::Tiers tiers(cat, &stage, UINT64_MAX);
  prestage::detail::Stager stager(tiers, 2);
  std::vector<uint64_t> files{3};
  std::vector<uint64_t> read_ahead{0, 1, 2};
  std::vector<std::vector<std::byte>> held(3);
  std::vector<uint8_t> held_ok(3, 7);  // submit() clears them
  REQUIRE(stage.try_claim(3));
  prestage::detail::StageTask task;
  task.ids = files.data();
  task.count = files.size();
  task.read_ahead = read_ahead.data();
  task.read_ahead_count = read_ahead.size();
  task.held = held.data();
  task.held_ok = held_ok.data();
  task.done = [](void* c) { static_cast<std::atomic<int>*>(c)->fetch_add(1); };
  task.context = &done;
  stager.submit(&task);
  while (done.load() < 1) std::this_thread::yield();
  const auto text = [](const std::vector<std::byte>& bytes) {
    return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  };
  CHECK(held_ok == std::vector<uint8_t>{1, 0, 1});
  CHECK(text(held[0]) == "alpha");
  CHECK(text(held[2]) == "bravo!");
  CHECK(stage.is_staged(3));
  CHECK(stage.is_absent(0));  // read ahead, not staged
  prestage::Stats stats;
  stager.add_to(stats, 1.0);
  CHECK(stats.read_ahead == 2);
  CHECK(stats.read_ahead_bytes == 11);
  CHECK(stats.staged_files == 1);
  CHECK(stats.stage_failures == 0);  // the missing file is stage 3's to report
}

TEST_CASE("stager: an expedited task completes once the copies under way finish") {
  TempDir dir;
  // The first file is a FIFO with no writer: the one stager thread blocks in it, as on a slow PFS.
  REQUIRE(::mkfifo((dir / "slow").c_str(), 0644) == 0);
  for (const char* name : {"b", "c", "d"}) std::ofstream(dir / name) << name;
  const Catalog cat = Catalog::from_paths(dir.path(), {"slow", "b", "c", "d"});
  StageDirectory stage(dir / "stage", cat);
  std::atomic<int> done{0};
  prestage::detail::Tiers tiers(cat, &stage, UINT64_MAX);
  prestage::detail::Stager stager(tiers, 1);
  std::vector<uint64_t> ids{0, 1, 2, 3};
  for (const uint64_t id : ids) REQUIRE(stage.try_claim(id));
  std::vector<uint64_t> read_ahead{1};
  std::vector<std::byte> held;
  uint8_t held_ok = 0;
  prestage::detail::StageTask task;
  task.ids = ids.data();
  task.count = ids.size();
  task.read_ahead = read_ahead.data();
  task.read_ahead_count = 1;
  task.held = &held;
  task.held_ok = &held_ok;
  task.done = [](void* c) { static_cast<std::atomic<int>*>(c)->fetch_add(1); };
  task.context = &done;
  stager.submit(&task);
  while (task.next.load() == 0) std::this_thread::yield();  // the thread has taken "slow"

  stager.expedite(&task);
  for (const uint64_t id : {1, 2, 3}) CHECK(stage.is_absent(id));  // given back: stage 3 reads them
  CHECK(done.load() == 0);  // the copy under way is not abandoned
  stager.expedite(&task);  // a second call changes nothing
  // A writer lets the copy finish; opening fails (ENXIO) until the thread has opened its end.
  int fd = -1;
  for (int tries = 0; fd < 0 && tries < 1000; ++tries) {
    fd = ::open((dir / "slow").c_str(), O_WRONLY | O_NONBLOCK);
    if (fd < 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  REQUIRE(fd >= 0);
  ::close(fd);
  while (done.load() == 0) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(done.load() == 1);  // exactly once
  prestage::Stats stats;
  stager.add_to(stats, 1.0);
  CHECK(stats.stage_expedited == 4);  // three copies and the read-ahead
  CHECK(stats.staged_files + stats.stage_failures == 1);  // only "slow" was dealt with
  CHECK(held_ok == 0);
  CHECK(stats.read_ahead == 0);
  for (const uint64_t id : {1, 2, 3}) CHECK(!stage.is_staged(id));
}

TEST_CASE("stage directory: records appended after a torn one still vouch for their copies") {
  TempDir dir;
  write(dir / "src/a", "first");
  write(dir / "src/b", "second");
  const Catalog cat = Catalog::from_paths(dir / "src", {"a", "b"});
  std::vector<std::byte> buffer;
  std::string index;
  {
    StageDirectory stage(dir / "stage", cat);
    REQUIRE(stage.try_claim(0));
    REQUIRE(stage.stage(0, cat.file_source_path(0).string(), buffer) == Outcome::kStaged);
    index = (stage.path() / "index.log").string();
  }
  std::ofstream(index, std::ios::app | std::ios::binary) << "torn: a short append";
  {
    StageDirectory stage(dir / "stage", cat);  // appends its record after the torn bytes
    REQUIRE(stage.try_claim(1));
    REQUIRE(stage.stage(1, cat.file_source_path(1).string(), buffer) == Outcome::kStaged);
  }
  StageDirectory again(dir / "stage", cat);
  CHECK(again.found_at_start() == 2);
  CHECK(again.is_staged(0));
  CHECK(again.is_staged(1));
}

namespace {
// A stage directory whose index holds 2,001 records for its 2 live copies, as eviction churn leaves it.
std::filesystem::path churned_index(const TempDir& dir, const Catalog& cat) {
  std::vector<std::byte> buffer;
  StageDirectory stage(dir / "stage", cat);
  REQUIRE(stage.try_claim(0));
  REQUIRE(stage.stage(0, cat.file_source_path(0).string(), buffer) == Outcome::kStaged);
  for (int i = 0; i < 2000; ++i) {  // staged, evicted, staged again: one record each time
    REQUIRE(stage.try_claim(1));
    REQUIRE(stage.stage(1, cat.file_source_path(1).string(), buffer) == Outcome::kStaged);
    if (i + 1 < 2000) stage.evict(1);
  }
  return std::filesystem::path(stage.path()) / "index.log";
}
}  // namespace

TEST_CASE("stage directory: a compaction that cannot write its index leaves the old one in use") {
  TempDir dir;
  write(dir / "src/a", "kept");
  write(dir / "src/b", "churned");
  const Catalog cat = Catalog::from_paths(dir / "src", {"a", "b"});
  const auto index = churned_index(dir, cat);
  const auto grown = std::filesystem::file_size(index);
  // The compacted index cannot be written (its temporary name is taken by a directory, as a full
  // or failing disk would refuse it): start-up goes on with the old index.
  std::filesystem::create_directory(index.string() + ".compact");
  {
    StageDirectory stage(dir / "stage", cat);
    CHECK(std::filesystem::file_size(index) == grown);
    CHECK(stage.found_at_start() == 2);
    CHECK(read_text(stage.staged_path(1)) == "churned");
    std::vector<std::byte> buffer;
    stage.evict(0);
    REQUIRE(stage.try_claim(0));
    REQUIRE(stage.stage(0, cat.file_source_path(0).string(), buffer) == Outcome::kStaged);
    CHECK(std::filesystem::file_size(index) == grown + 40);  // still appended to
  }
  std::filesystem::remove(index.string() + ".compact");
  StageDirectory again(dir / "stage", cat);  // now it can
  CHECK(again.found_at_start() == 2);
  CHECK(std::filesystem::file_size(index) == 2 * 40);
}

TEST_CASE("stage directory: a lone start-up removes a compaction's leftover temporary index") {
  TempDir dir;
  write(dir / "src/a", "kept");
  const Catalog cat = Catalog::from_paths(dir / "src", {"a"});
  std::filesystem::path index;
  {
    StageDirectory stage(dir / "stage", cat);
    index = std::filesystem::path(stage.path()) / "index.log";
    std::vector<std::byte> buffer;
    REQUIRE(stage.try_claim(0));
    REQUIRE(stage.stage(0, cat.file_source_path(0).string(), buffer) == Outcome::kStaged);
  }
  write(index.string() + ".compact", "half a compacted index, its writer killed");
  StageDirectory stage(dir / "stage", cat);  // a small index: nothing to compact
  CHECK(!std::filesystem::exists(index.string() + ".compact"));
  CHECK(stage.found_at_start() == 1);
  CHECK(std::filesystem::file_size(index) == 40);
}

TEST_CASE("stage directory: an index of mostly dead records is compacted by a process alone") {
  constexpr uint64_t kRecord = 40;  // bytes of an index record
  TempDir dir;
  write(dir / "src/a", "kept");
  write(dir / "src/b", "churned");
  const Catalog cat = Catalog::from_paths(dir / "src", {"a", "b"});
  std::vector<std::byte> buffer;
  const auto index = churned_index(dir, cat);
  const auto grown = std::filesystem::file_size(index);
  CHECK(grown == 2001 * kRecord);
  {
    StageDirectory keeper(dir / "stage", cat);  // compacts: nobody else uses the directory
    CHECK(std::filesystem::file_size(index) == 2 * kRecord);
    CHECK(keeper.found_at_start() == 2);
    CHECK(read_text(keeper.staged_path(1)) == "churned");
    // A second user meanwhile shares the index: it finds the same copies, and never compacts.
    REQUIRE(keeper.try_claim(1) == false);
    StageDirectory other(dir / "stage", cat);
    CHECK(other.found_at_start() == 2);
    keeper.evict(0);
    REQUIRE(keeper.try_claim(0));
    REQUIRE(keeper.stage(0, cat.file_source_path(0).string(), buffer) == Outcome::kStaged);
    CHECK(std::filesystem::file_size(index) == 3 * kRecord);  // appended
  }
  StageDirectory again(dir / "stage", cat);
  CHECK(again.found_at_start() == 2);  // small index: left as it is
  CHECK(std::filesystem::file_size(index) == 3 * kRecord);
}
