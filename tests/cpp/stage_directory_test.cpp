#include "tiers/stage_directory.hpp"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <fstream>
#include <random>
#include <span>
#include <thread>

#include "prestage/catalog.hpp"
#include "prestage/error.hpp"
#include "test_util.hpp"
#include "util/file_io.hpp"

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

TEST_CASE(
    "stage directory: a staged copy holds the source's bytes, under a name made from its id") {
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
  const Catalog cat =
      Catalog::from_list((write(dir / "list", "a\nb\nc\n"), dir / "list"), dir / "src");
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

TEST_CASE(
    "stage directory: a checked read of a copy gives its bytes or nothing, never a wrong one") {
  TempDir dir;
  write(dir / "src/a", "0123456789");
  write(dir / "src/b", "other");
  const Catalog cat = Catalog::from_paths(dir / "src", {"a", "b"});
  constexpr uint64_t kWhole = StageDirectory::kWholeCopy;
  std::vector<std::byte> buffer, out, scratch;
  const auto text = [](const std::vector<std::byte>& b) {
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
  };
  const auto stage_anew = [&](StageDirectory& stage) {
    REQUIRE(stage.try_claim(0));
    REQUIRE(stage.stage(0, cat.file_source_path(0).string(), buffer) == Outcome::kStaged);
  };
  const auto corrupt = [](const std::string& path) {  // in place, same size, as a failing disk
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(3);
    f.put('X');
  };
  {
    StageDirectory stage(dir / "stage", cat);
    stage.set_settle_time(std::chrono::nanoseconds(0));  // a copy's identity is kept at once
    CHECK_FALSE(stage.read_checked(0, 0, kWhole, out, scratch));  // not staged
    stage_anew(stage);
    REQUIRE(stage.read_checked(0, 0, kWhole, out, scratch));
    CHECK(text(out) == "0123456789");
    // A part: the first read checks the copy whole and keeps its identity; the next reads the
    // range alone, and stale bytes of the copy's size in `scratch` are never taken for the copy's.
    REQUIRE(stage.read_checked(0, 2, 3, out, scratch));
    CHECK(text(out) == "234");
    scratch.assign(10, std::byte{'Z'});
    REQUIRE(stage.read_checked(0, 5, 3, out, scratch));
    CHECK(text(out) == "567");
    REQUIRE(stage.read_checked(0, 10, 0, out, scratch));
    CHECK(out.empty());
    // A range the copy does not hold is refused, and the copy is left alone.
    CHECK_FALSE(stage.read_checked(0, 8, 5, out, scratch));
    CHECK_FALSE(stage.read_checked(0, 11, 0, out, scratch));
    CHECK(stage.servable(0));
    // A copy changed on the SSD: refused, removed and counted, for a whole read and for a part.
    corrupt(stage.staged_path(0));
    CHECK_FALSE(stage.read_checked(0, 0, kWhole, out, scratch));
    CHECK(stage.corrupt() == 1);
    CHECK(stage.is_absent(0));
    stage_anew(stage);
    REQUIRE(stage.read_checked(0, 4, 2, out, scratch));
    CHECK(text(out) == "45");
    corrupt(stage.staged_path(0));
    CHECK_FALSE(stage.read_checked(0, 4, 2, out, scratch));
    CHECK(stage.corrupt() == 2);
    CHECK(stage.is_absent(0));
    stage_anew(stage);
  }
  // A copy an earlier run left is checked by stage 2's check first, for every reader from then on.
  {
    StageDirectory again(dir / "stage", cat);
    REQUIRE(again.unverified(0));
    REQUIRE(again.read_checked(0, 7, 3, out, scratch));
    CHECK(text(out) == "789");
    CHECK_FALSE(again.unverified(0));
  }
  {
    StageDirectory again(dir / "stage", cat);
    REQUIRE(again.unverified(0));
    corrupt(again.staged_path(0));
    CHECK_FALSE(again.read_checked(0, 0, kWhole, out, scratch));
    CHECK(again.is_absent(0));
  }
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
  CHECK_THROWS_AS(stage.stage(1, cat.file_source_path(1).string(), buffer),
                  StageDirectory::SourceError);
  CHECK(stage.is_absent(1));
  std::filesystem::remove_all(dir / "stage");
  REQUIRE(stage.try_claim(0));
  CHECK_THROWS_AS(stage.stage(0, cat.file_source_path(0).string(), buffer), prestage::IoError);
  CHECK(stage.is_absent(0));
}

TEST_CASE("stage directory: abandon gives back a claim, and leaves a staged copy alone") {
  TempDir dir;
  write(dir / "src/a", "alpha");
  write(dir / "src/b", "bravo");
  const Catalog cat = Catalog::from_paths(dir / "src", {"a", "b"});
  std::vector<std::byte> buffer;
  {
    StageDirectory earlier(dir / "stage", cat);
    REQUIRE(earlier.try_claim(0));
    REQUIRE(earlier.stage(0, cat.file_source_path(0).string(), buffer) == Outcome::kStaged);
    earlier.abandon(0);  // a copy of this run
    CHECK(earlier.is_staged(0));
  }
  StageDirectory stage(dir / "stage", cat);
  REQUIRE(stage.unverified(0));
  stage.abandon(0);  // a copy of an earlier run, not yet checked: neither forgotten nor checked
  CHECK(stage.is_staged(0));
  CHECK(stage.unverified(0));
  CHECK(!stage.try_claim(0));
  stage.abandon(1);  // absent stays absent
  CHECK(stage.is_absent(1));
  REQUIRE(stage.try_claim(1));
  stage.abandon(1);
  CHECK(stage.is_absent(1));
  CHECK(stage.try_claim(1));  // a claim given back can be taken again
}

TEST_CASE("stage directory: an evicted copy is no longer one to check") {
  TempDir dir;
  write(dir / "src/a", "alpha");
  const Catalog cat = Catalog::from_paths(dir / "src", {"a"});
  std::vector<std::byte> buffer;
  {
    StageDirectory earlier(dir / "stage", cat);
    REQUIRE(earlier.try_claim(0));
    REQUIRE(earlier.stage(0, cat.file_source_path(0).string(), buffer) == Outcome::kStaged);
  }
  StageDirectory stage(dir / "stage", cat);
  REQUIRE(stage.unverified(0));
  stage.evict(0);
  CHECK(stage.is_absent(0));
  // Stage 1 hands an unverified file to stage 2 as a copy to check: once claimed for a new copy, it
  // must not look like one.
  CHECK(!stage.unverified(0));
  REQUIRE(stage.try_claim(0));
  CHECK(!stage.unverified(0));
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
// A stage directory whose index holds 2,001 records for its 2 live copies, as eviction churn leaves
// it.
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

namespace {
// A catalog of `n` small files, "f<i>" holding "file <i>".
Catalog many_files(const TempDir& dir, size_t n) {
  std::vector<std::string> paths;
  for (size_t i = 0; i < n; ++i) {
    paths.push_back("f" + std::to_string(i));
    write(dir / "src" / paths.back(), "file " + std::to_string(i));
  }
  return Catalog::from_paths(dir / "src", paths);
}
using Fetch = StageDirectory::Fetch;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// Another process that opens `paths` (created with `mode`) and holds an exclusive lock on each
// until it is killed, as a rank stopped mid-copy does. Constructed once every lock is held.
class LockingNeighbour {
 public:
  LockingNeighbour(const std::vector<std::string>& paths, mode_t mode) {
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      for (const std::string& path : paths) {
        const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY, mode);
        if (fd < 0 || ::flock(fd, LOCK_EX) != 0) ::_exit(1);
      }
      (void)!::write(ready[1], "x", 1);
      ::pause();
      ::_exit(0);
    }
    ::close(ready[1]);
    char x = 0;
    const bool locked = ::read(ready[0], &x, 1) == 1;  // end of file: the neighbour failed
    ::close(ready[0]);
    if (!locked) stop();
    REQUIRE(locked);
  }
  ~LockingNeighbour() { stop(); }
  LockingNeighbour(const LockingNeighbour&) = delete;
  LockingNeighbour& operator=(const LockingNeighbour&) = delete;

 private:
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  pid_t pid_ = -1;
};
}  // namespace

TEST_CASE("stage directory: taking over a neighbour's copies reads each byte of its index once") {
  TempDir dir;
  const size_t n = 300;
  const Catalog cat = many_files(dir, n);
  StageDirectory first(dir / "stage", cat);
  StageDirectory second(dir / "stage", cat);  // another rank of the node
  std::vector<std::byte> buffer;
  for (uint64_t id = 0; id < n; ++id) {
    // Interleaved, as ranks run: each adoption follows the index from where the last one stopped.
    REQUIRE(first.try_claim(id));
    REQUIRE(first.stage(id, cat.file_source_path(id).string(), buffer) == Outcome::kStaged);
    if (id % 3 == 0) continue;  // not claimed: taken over as the index is followed
    REQUIRE(second.try_claim(id));
    REQUIRE(second.stage(id, "/nonexistent", buffer) == Outcome::kAdopted);  // never the source
  }
  second.take_over_published();
  CHECK(second.taken_over() == n / 3);
  for (uint64_t id = 0; id < n; ++id) {
    CHECK(second.is_staged(id));
    // Its first use is the one a neighbour's copy saved; stage() counts its own adoptions.
    CHECK(second.first_use_of_taken_over(id) == (id % 3 == 0));
    CHECK_FALSE(second.first_use_of_taken_over(id));
  }
  for (uint64_t id = 0; id < n; ++id) {
    // A neighbour's copy of this run is served at once, as this process's own: stage 3 does not
    // skip it for the source, as it does a copy of an earlier run that is not yet checked.
    CHECK_FALSE(second.unverified(id));
    REQUIRE(second.verify(id, buffer));  // the records taken over vouch for the bytes
    CHECK(read_text(second.staged_path(id)) == "file " + std::to_string(id));
  }
  // Nothing is taken over from the records this process found at its start.
  StageDirectory third(dir / "stage", cat);
  third.take_over_published();
  CHECK(third.taken_over() == 0);
  CHECK(third.unverified(0));  // a copy found at start-up is checked before it is served
  const uint64_t index_size = std::filesystem::file_size(first.path() / "index.log");
  CHECK(index_size == n * 40);
  CHECK(second.index_bytes_read() == index_size);
}

TEST_CASE(
    "stage directory: a file a neighbour is copying is waited for and taken, not read again") {
  TempDir dir;
  const Catalog cat = many_files(dir, 2);
  StageDirectory first(dir / "stage", cat);
  StageDirectory second(dir / "stage", cat);
  std::atomic<bool> fetching{false};
  Outcome copied = Outcome::kBusy;
  std::thread writer([&] {
    std::vector<std::byte> buffer;
    if (!first.try_claim(0)) return;
    copied = first.stage(
        0,
        [&](std::vector<std::byte>& out, int64_t& mtime) {
          fetching = true;
          std::this_thread::sleep_for(milliseconds(200));  // a slow PFS
          prestage::detail::read_file(cat.file_source_path(0).string(), out, &mtime);
        },
        buffer);
  });
  while (!fetching) std::this_thread::sleep_for(milliseconds(1));
  bool read_source = false;
  std::vector<std::byte> buffer;
  REQUIRE(second.try_claim(0));
  const Outcome waited = second.stage(
      0, [&](std::vector<std::byte>&, int64_t&) { read_source = true; }, buffer,
      milliseconds(10000));
  writer.join();
  CHECK(copied == Outcome::kStaged);
  CHECK(waited == Outcome::kAdopted);
  CHECK_FALSE(read_source);
  CHECK(second.verify(0, buffer));
}

TEST_CASE("stage directory: the wait for a neighbour's copy ends at its limit or when cancelled") {
  TempDir dir;
  const Catalog cat = many_files(dir, 2);
  StageDirectory stage(dir / "stage", cat);
  // A neighbour holds the copy's lock and never finishes.
  const int fd = ::open((stage.staged_path(1) + ".part").c_str(), O_CREAT | O_WRONLY, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX) == 0);
  std::vector<std::byte> buffer;
  const Fetch never = [](std::vector<std::byte>&, int64_t&) { FAIL("the source was read"); };

  REQUIRE(stage.try_claim(1));
  auto start = Clock::now();
  CHECK(stage.stage(1, never, buffer, milliseconds(60)) == Outcome::kBusy);
  const auto waited = Clock::now() - start;
  CHECK(waited >= milliseconds(60));
  CHECK(waited < milliseconds(3000));
  CHECK(stage.is_absent(1));  // the claim is given back

  std::atomic<bool> cancel{false};
  const prestage::detail::IoTimeoutScope scope(milliseconds(0), &cancel);
  std::thread canceller([&] {
    std::this_thread::sleep_for(milliseconds(50));
    cancel = true;
  });
  REQUIRE(stage.try_claim(1));
  start = Clock::now();
  CHECK(stage.stage(1, never, buffer, StageDirectory::kForever) == Outcome::kBusy);
  CHECK(Clock::now() - start < milliseconds(3000));
  canceller.join();
  CHECK(stage.is_absent(1));
  ::close(fd);
}

TEST_CASE(
    "stage directory: a neighbour that stalled holding copies costs one wait, not one per copy") {
  TempDir dir;
  const Catalog cat = many_files(dir, 3);
  StageDirectory stage(dir / "stage", cat);
  // Another process takes the locks of two copies, then stops (as a rank stopped mid-copy does).
  const LockingNeighbour neighbour({stage.staged_path(1) + ".part", stage.staged_path(2) + ".part"},
                                   0644);
  std::vector<std::byte> buffer;
  const Fetch never = [](std::vector<std::byte>&, int64_t&) { FAIL("the source was read"); };
  // The first copy is waited for until the wait runs out.
  REQUIRE(stage.try_claim(1));
  auto start = Clock::now();
  CHECK(stage.stage(1, never, buffer, milliseconds(300)) == Outcome::kBusy);
  CHECK(Clock::now() - start >= milliseconds(300));
  // The second is not: the process holding it has stalled.
  REQUIRE(stage.try_claim(2));
  start = Clock::now();
  CHECK(stage.stage(2, never, buffer, milliseconds(20000)) == Outcome::kBusy);
  CHECK(Clock::now() - start < milliseconds(10000));
  CHECK(stage.is_absent(2));  // the claim is given back
  // A copy nobody holds is still made.
  REQUIRE(stage.try_claim(0));
  CHECK(stage.stage(0, cat.file_source_path(0).string(), buffer, milliseconds(20000)) ==
        Outcome::kStaged);
}

TEST_CASE("stage directory: a neighbour that gives up its copy leaves it to the one waiting") {
  TempDir dir;
  const Catalog cat = many_files(dir, 2);
  StageDirectory first(dir / "stage", cat);
  StageDirectory second(dir / "stage", cat);
  std::atomic<bool> fetching{false};
  bool first_failed = false;
  std::thread writer([&] {
    std::vector<std::byte> buffer;
    if (!first.try_claim(0)) return;
    try {
      first.stage(
          0,
          [&](std::vector<std::byte>&, int64_t&) {
            fetching = true;
            std::this_thread::sleep_for(milliseconds(100));
            throw prestage::IoError("f0", EIO, "a read that failed");
          },
          buffer);
    } catch (const StageDirectory::SourceError&) {
      first_failed = true;
    }
  });
  while (!fetching) std::this_thread::sleep_for(milliseconds(1));
  std::vector<std::byte> buffer;
  REQUIRE(second.try_claim(0));
  CHECK(second.stage(0, cat.file_source_path(0).string(), buffer, milliseconds(10000)) ==
        Outcome::kStaged);
  writer.join();
  CHECK(first_failed);
  CHECK(first.is_absent(0));
  CHECK(read_text(second.staged_path(0)) == "file 0");
}

TEST_CASE("stage directory: an eviction and a neighbour's new copy of the same file never cross") {
  TempDir dir;
  const Catalog cat = many_files(dir, 2);
  StageDirectory first(dir / "stage", cat);
  StageDirectory second(dir / "stage", cat);
  std::vector<std::byte> buffer;
  REQUIRE(first.try_claim(0));
  REQUIRE(first.stage(0, cat.file_source_path(0).string(), buffer) == Outcome::kStaged);
  CHECK(first.node().used() == 6);  // "file 0"

  // A neighbour holds the file's copy lock (it is copying the file anew): not evicted now.
  {
    const int fd = ::open((first.staged_path(0) + ".part").c_str(), O_CREAT | O_WRONLY, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(::flock(fd, LOCK_EX) == 0);
    CHECK_FALSE(first.evict(0));
    CHECK(first.is_staged(0));
    CHECK(first.node().on_disk(0));
    CHECK(std::filesystem::exists(first.staged_path(0)));
    ::close(fd);
  }
  // A copy the node no longer counts (an eviction between its mark and its unlink) is not taken
  // over: the neighbour copies the file itself, and the node counts that copy.
  REQUIRE(first.node().remove(0));
  first.node().release(6);
  bool read_source = false;
  REQUIRE(second.try_claim(0));
  CHECK(second.stage(
            0,
            [&](std::vector<std::byte>& out, int64_t& mtime) {
              read_source = true;
              prestage::detail::read_file(cat.file_source_path(0).string(), out, &mtime);
            },
            buffer) == Outcome::kStaged);
  CHECK(read_source);
  CHECK(second.node().on_disk(0));
  CHECK(second.node().used() == 6);
  CHECK(read_text(second.staged_path(0)) == "file 0");
  // And an eviction with nobody in the way removes the copy and its bytes.
  CHECK(second.evict(0));
  CHECK_FALSE(std::filesystem::exists(second.staged_path(0)));
  CHECK_FALSE(std::filesystem::exists(second.staged_path(0) + ".part"));
  CHECK(second.node().used() == 0);
}

TEST_CASE("stage directory: a copy under way is not evicted, so its room is not given to another") {
  // Stage 3 may give up waiting for a copy (stage_patience) and its batch leave the window while
  // stage 2 still copies the file: stage 1 may then pick it to evict. Were its claim given back,
  // its reserved bytes would go to the next copy while both are written: the bound crossed.
  for (int run = 0; run < 20; ++run) {
    TempDir dir;
    const Catalog cat = many_files(dir, 2);  // "file 0", "file 1": 6 bytes each
    StageDirectory stage(dir / "stage", cat);
    const uint64_t bound = 6;
    REQUIRE(stage.reserve(0, 6, bound));
    REQUIRE(stage.try_claim(0));
    std::atomic<bool> fetching{false}, go_on{false};
    Outcome copied = Outcome::kBusy;
    std::thread copier([&] {
      std::vector<std::byte> buffer;
      copied = stage.stage(
          0,
          [&](std::vector<std::byte>& out, int64_t& mtime) {
            fetching = true;
            while (!go_on) std::this_thread::sleep_for(milliseconds(1));
            prestage::detail::read_file(cat.file_source_path(0).string(), out, &mtime);
          },
          buffer);
    });
    while (!fetching) std::this_thread::sleep_for(milliseconds(1));
    CHECK_FALSE(stage.evict(0));
    CHECK_FALSE(stage.reserve(1, 6, bound));  // no room for another copy meanwhile
    go_on = true;
    copier.join();
    CHECK(copied == Outcome::kStaged);
    CHECK(stage.is_staged(0));
    CHECK(stage.node().used() == 6);
    // Published, it is evicted as any copy is.
    CHECK(stage.evict(0));
    CHECK(stage.node().used() == 0);
  }
}

TEST_CASE("stage directory: a claim given back before its copy began is not copied") {
  TempDir dir;
  const Catalog cat = many_files(dir, 2);
  StageDirectory stage(dir / "stage", cat);
  REQUIRE(stage.reserve(1, 6, 6));
  REQUIRE(stage.try_claim(1));
  CHECK(stage.evict(1));  // its copy had not begun: the claim goes back
  CHECK(stage.node().used() == 0);
  std::vector<std::byte> buffer;
  const Fetch never = [](std::vector<std::byte>&, int64_t&) { FAIL("the source was read"); };
  CHECK(stage.stage(1, never, buffer) == Outcome::kDropped);
  CHECK(stage.is_absent(1));
  CHECK_FALSE(std::filesystem::exists(stage.staged_path(1)));
}

TEST_CASE("stage directory: a file two processes both claim is counted once, whoever copies it") {
  // Two ranks of a node both need a file neither has copied yet (one reads ahead into the next
  // epoch): the node's count reserves it once, so the bound does not lose a file's room for it.
  TempDir dir;
  const Catalog cat = many_files(dir, 3);  // 6 bytes each
  StageDirectory first(dir / "stage", cat);
  StageDirectory second(dir / "stage", cat);
  const uint64_t bound = 12;
  auto claim = [&](StageDirectory& s, uint64_t f) {
    return s.reserve(f, 6, bound) && s.try_claim(f);
  };
  std::vector<std::byte> buffer;
  const Fetch never = [](std::vector<std::byte>&, int64_t&) { FAIL("the source was read"); };

  SUBCASE("the first copies, the second takes its copy") {
    REQUIRE(claim(first, 0));
    REQUIRE(claim(second, 0));
    CHECK(first.node().used() == 6);
    REQUIRE(claim(first, 1));  // the room of a second file is still there
    CHECK(first.node().used() == 12);
    CHECK(first.stage(0, cat.file_source_path(0).string(), buffer) == Outcome::kStaged);
    CHECK(second.stage(0, never, buffer) == Outcome::kAdopted);
    CHECK(first.node().used() == 12);
    CHECK(first.evict(0));
    CHECK(first.node().used() == 6);
  }
  SUBCASE("the first gives its claim up, the second copies with the bytes still reserved") {
    REQUIRE(claim(first, 0));
    REQUIRE(claim(second, 0));
    first.abandon(0);
    CHECK(first.node().used() == 6);
    CHECK(second.stage(0, cat.file_source_path(0).string(), buffer) == Outcome::kStaged);
    CHECK(second.node().used() == 6);
    CHECK(second.evict(0));
    CHECK(second.node().used() == 0);
  }
  SUBCASE("both give it up: the bytes go back once") {
    REQUIRE(claim(first, 0));
    REQUIRE(claim(second, 0));
    CHECK(second.evict(0));
    CHECK(first.node().used() == 6);
    CHECK(first.evict(0));
    CHECK(first.node().used() == 0);
  }
  SUBCASE("a copy found corrupt while a neighbour claims it keeps its room for the new copy") {
    REQUIRE(claim(first, 0));
    REQUIRE(first.stage(0, cat.file_source_path(0).string(), buffer) == Outcome::kStaged);
    REQUIRE(claim(second, 0));  // before it took the first's copy over: a claim of a copy on disk
    CHECK(first.node().used() == 6);
    CHECK_FALSE(first.evict(0));  // claimed: not removed
    const std::string wrong = "file X";
    CHECK_FALSE(first.intact(0, std::as_bytes(std::span(wrong.data(), wrong.size()))));
    CHECK(first.corrupt() == 1);
    CHECK(first.node().used() == 6);
    CHECK(second.stage(0, cat.file_source_path(0).string(), buffer) == Outcome::kStaged);
    CHECK(second.node().used() == 6);
    CHECK(read_text(second.staged_path(0)) == "file 0");
  }
}

TEST_CASE("stage directory: a read that found a copy corrupt removes that copy, never a new one") {
  TempDir dir;
  const Catalog cat = many_files(dir, 3);
  StageDirectory stage(dir / "stage", cat);
  std::vector<std::byte> buffer;
  const auto stage_anew = [&] {
    REQUIRE(stage.try_claim(0));
    REQUIRE(stage.stage(0, cat.file_source_path(0).string(), buffer) == Outcome::kStaged);
  };
  // Changed on the SSD in place (same size), as a failing disk would; what a reader's fstat saw.
  const auto corrupt = [&] {
    const int fd = ::open(stage.staged_path(0).c_str(), O_WRONLY);
    REQUIRE(fd >= 0);
    REQUIRE(::pwrite(fd, "X", 1, 0) == 1);
    struct stat st{};
    REQUIRE(::fstat(fd, &st) == 0);
    ::close(fd);
    return st;
  };
  stage_anew();
  const struct stat old = corrupt();
  // Two readers of the copy at once (samples of one shard): the first finds it corrupt, removes
  // and counts it, and the file is copied anew...
  CHECK_FALSE(stage.unchanged(0, buffer));
  CHECK(stage.corrupt() == 1);
  CHECK(stage.is_absent(0));
  stage_anew();
  // ...before the second, which read the old copy, gets to its removal: the new copy stays.
  stage.reject_read(0, old);
  CHECK(stage.corrupt() == 1);
  CHECK(stage.servable(0));
  CHECK(stage.unchanged(0, buffer));
  CHECK(read_text(stage.staged_path(0)) == "file 0");
  // The copy a reader read, still on disk, is removed and counted.
  const struct stat now = corrupt();
  stage.reject_read(0, now);
  CHECK(stage.corrupt() == 2);
  CHECK(stage.is_absent(0));
  CHECK_FALSE(std::filesystem::exists(stage.staged_path(0)));
  // Under the lock of a copy being made (another process's), nothing is removed: the copy read is
  // being replaced.
  stage_anew();
  const struct stat again = corrupt();
  {
    const LockingNeighbour copier({stage.staged_path(0) + ".part"}, 0600);
    stage.reject_read(0, again);
    CHECK(stage.corrupt() == 2);
    CHECK(std::filesystem::exists(stage.staged_path(0)));
  }
  stage.reject_read(0, again);
  CHECK(stage.corrupt() == 3);
  // A `.part` that is no lock file, planted in the area. A link: nothing is removed, and what it
  // points at is neither created nor changed. A folder or a FIFO (which no copier can lock either):
  // the copy read is removed as on a disk too full for the lock file, and nothing waits on the
  // FIFO's other end.
  const std::filesystem::path theirs = dir / "theirs";
  write(theirs, "theirs");
  const std::string part = stage.staged_path(0) + ".part";
  for (const char* planted_as : {"link", "folder", "fifo"}) {
    CAPTURE(planted_as);
    const std::string kind = planted_as;
    stage_anew();
    const struct stat planted = corrupt();
    if (kind == "link") {
      REQUIRE(::symlink(theirs.c_str(), part.c_str()) == 0);
    } else if (kind == "folder") {
      REQUIRE(::mkdir(part.c_str(), 0700) == 0);
    } else {
      REQUIRE(::mkfifo(part.c_str(), 0600) == 0);
    }
    const uint64_t counted = stage.corrupt();
    stage.reject_read(0, planted);
    if (kind == "link") {
      CHECK(stage.corrupt() == counted);
      CHECK(std::filesystem::exists(stage.staged_path(0)));
      CHECK(read_text(theirs.string()) == "theirs");
      std::filesystem::remove(part);
      stage.reject_read(0, planted);  // the lock file made anew: the copy read goes
    }
    CHECK(stage.corrupt() == counted + 1);
    CHECK_FALSE(std::filesystem::exists(stage.staged_path(0)));
    std::filesystem::remove(part);
  }
}

TEST_CASE(
    "stage directory: the node's count is the bytes of the files on disk or claimed, in any "
    "order") {
  // Two processes claim, copy, give up, evict, take over and find corrupt three files in a random
  // order; after each step the node counts each file on its disk or claimed by either process
  // once, never past the bound, and a file is on disk exactly when the node's table says so.
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    TempDir dir;
    const Catalog cat = many_files(dir, 3);
    StageDirectory first(dir / "stage", cat);
    StageDirectory second(dir / "stage", cat);
    StageDirectory* procs[] = {&first, &second};
    const uint64_t bound = 12;
    std::mt19937 rng(seed);
    std::vector<std::byte> buffer;
    for (int step = 0; step < 200; ++step) {
      StageDirectory& s = *procs[rng() % 2];
      const uint64_t f = rng() % 3;
      switch (rng() % 6) {
        case 0:
          if (s.is_absent(f) && s.reserve(f, 6, bound) && !s.try_claim(f)) s.unreserve(f);
          break;
        case 1:
          if (!s.is_absent(f) && !s.is_staged(f)) {
            s.stage(f, cat.file_source_path(f).string(), buffer);
          }
          break;
        case 2:
          s.abandon(f);
          break;
        case 3:
          s.evict(f);
          break;
        case 4:
          s.take_over_published();
          break;
        default:
          if (s.is_staged(f)) {
            const std::string wrong = "file X";
            s.intact(f, std::as_bytes(std::span(wrong.data(), wrong.size())));
          }
      }
      uint64_t expected = 0;
      for (uint64_t g = 0; g < 3; ++g) {
        const bool on_disk = first.node().on_disk(g);
        if (on_disk || first.node().claimed(g)) expected += 6;
        INFO("seed " << seed << " step " << step << " file " << g);
        REQUIRE(std::filesystem::exists(first.staged_path(g)) == on_disk);
      }
      INFO("seed " << seed << " step " << step);
      REQUIRE(first.node().used() == expected);
      REQUIRE(expected <= bound);
    }
  }
}

TEST_CASE("stage directory: counting the disk's blocks, copies take whole blocks, own files too") {
  // A block of 4096 stands for the file system's (statvfs), whatever the disk the test runs on.
  TempDir dir;
  write(dir / "src/a", std::string(2100, 'a'));
  write(dir / "src/b", std::string(4200, 'b'));
  const Catalog cat = Catalog::from_paths(dir / "src", {"a", "b"});
  constexpr uint64_t kBlock = 4096;
  StageDirectory stage(dir / "stage", cat, kBlock);
  CHECK(stage.charge(0) == 0);
  CHECK(stage.charge(1) == kBlock);
  CHECK(stage.charge(2100) == kBlock);
  CHECK(stage.charge(4200) == 2 * kBlock);
  // The node's table (a page and a word per file) from the start, and the index's next record's
  // block, counted before it is written.
  const uint64_t table = 2 * kBlock;
  CHECK(stage.own_files_bytes() == table);  // on disk now: the index is empty
  CHECK(stage.node().used() == table + kBlock);

  std::vector<std::byte> buffer;
  const uint64_t bound = 6 * kBlock;
  REQUIRE(stage.reserve(0, stage.charge(2100), bound));
  REQUIRE(stage.try_claim(0));
  CHECK(stage.node().used() == table + kBlock + kBlock);  // a copy counts before it is written
  REQUIRE(stage.stage(0, cat.file_source_path(0).string(), buffer) == Outcome::kStaged);
  CHECK(stage.node().used() == table + kBlock + kBlock);  // 40 index bytes, 80 with the next
  // 4200 bytes take two blocks: they do not fit beside the rest under a bound of five.
  CHECK_FALSE(stage.reserve(1, stage.charge(4200), 5 * kBlock));
  REQUIRE(stage.reserve(1, stage.charge(4200), bound));
  REQUIRE(stage.try_claim(1));
  REQUIRE(stage.stage(1, cat.file_source_path(1).string(), buffer) == Outcome::kStaged);
  CHECK(stage.node().used() == table + kBlock + 2 * kBlock + kBlock);  // 120 index bytes: one block
  CHECK(stage.evict(1));
  CHECK(stage.node().used() == table + kBlock + kBlock);

  // Counting bytes (block 1), as a bound given in bytes does: the copies' bytes only.
  TempDir other;
  write(other / "src/a", std::string(2100, 'a'));
  const Catalog one = Catalog::from_paths(other / "src", {"a"});
  StageDirectory bytes(other / "stage", one);
  REQUIRE(bytes.try_claim(0));
  REQUIRE(bytes.stage(0, one.file_source_path(0).string(), buffer) == Outcome::kStaged);
  CHECK(bytes.node().used() == 2100);
}

TEST_CASE("stage directory: a second process counts the node's blocks as the first left them") {
  TempDir dir;
  write(dir / "src/a", std::string(100, 'a'));
  const Catalog cat = Catalog::from_paths(dir / "src", {"a"});
  std::vector<std::byte> buffer;
  {
    StageDirectory earlier(dir / "stage", cat, 4096);
    REQUIRE(earlier.try_claim(0));
    REQUIRE(earlier.stage(0, cat.file_source_path(0).string(), buffer) == Outcome::kStaged);
  }
  // Alone at start-up: its copy, the index and the table, each in whole blocks.
  StageDirectory later(dir / "stage", cat, 4096);
  CHECK(later.is_staged(0));
  CHECK(later.node().used() == 4096 + 4096 + 2 * 4096);
  StageDirectory neighbour(dir / "stage", cat, 4096);
  CHECK(neighbour.node().used() == 4096 + 4096 + 2 * 4096);
}

TEST_CASE(
    "stage directory: the area and everything in it are the user's alone, whatever the umask") {
  for (const mode_t umask : {mode_t{022}, mode_t{0}}) {
    TempDir dir;
    write(dir / "src/a", "alpha");
    write(dir / "src/b", "hello");
    const Catalog cat = Catalog::from_paths(dir / "src", {"a", "b"});
    const mode_t old = ::umask(umask);
    {
      StageDirectory stage(dir / "stage", cat);
      std::vector<std::byte> buffer;
      for (uint64_t id : {0, 1}) {
        REQUIRE(stage.try_claim(id));
        REQUIRE(stage.stage(id, cat.file_source_path(id).string(), buffer) == Outcome::kStaged);
      }
      CHECK(stage.evict(0));  // made and removed its ".part" lock file
    }
    ::umask(old);
    const auto area = StageDirectory::area_of(dir / "stage", cat);
    int dirs = 0, files = 0;
    struct stat st{};
    REQUIRE(::lstat(area.c_str(), &st) == 0);
    CHECK((st.st_mode & 07777) == 0700);
    for (const auto& entry : std::filesystem::recursive_directory_iterator(area)) {
      REQUIRE(::lstat(entry.path().c_str(), &st) == 0);
      CHECK(st.st_uid == ::geteuid());
      if (S_ISDIR(st.st_mode)) {
        CHECK((st.st_mode & 07777) == 0700);
        ++dirs;
      } else {
        CHECK(S_ISREG(st.st_mode));
        CHECK((st.st_mode & 07777) == 0600);
        ++files;
      }
    }
    CHECK(dirs == 256);
    CHECK(files == 4);  // start.lock, index.log, node.table, the copy of file 1
  }
}

TEST_CASE("stage directory: a link in the area is refused, never followed") {
  TempDir dir;
  write(dir / "src/a", "alpha");
  write(dir / "victim", "the user's own file");
  const Catalog cat = Catalog::from_paths(dir / "src", {"a"});
  const auto area = StageDirectory::area_of(dir / "stage", cat);
  for (const char* name : {"node.table", "index.log", "start.lock", "00/0"}) {
    std::filesystem::remove_all(dir / "stage");
    {
      StageDirectory made(dir / "stage", cat);
    }
    std::filesystem::remove(area / name);
    std::filesystem::create_symlink(dir / "victim", area / name);
    CAPTURE(name);
    try {
      StageDirectory stage(dir / "stage", cat);
      FAIL("a link in the area was not refused");
    } catch (const prestage::detail::UnsafePath& e) {
      CHECK(e.error_code() == ELOOP);
      CHECK(e.path() == (area / name).string());
    }
    CHECK(read_text((dir / "victim").string()) == "the user's own file");
  }
}

TEST_CASE("stage directory: a FIFO in the area is refused, never waited on") {
  // Opened as a file, a FIFO holds the open until someone opens its other end: a FIFO planted
  // under one of the area's names must be refused at once, as a link is.
  TempDir dir;
  write(dir / "src/a", "alpha");
  const Catalog cat = Catalog::from_paths(dir / "src", {"a"});
  const auto area = StageDirectory::area_of(dir / "stage", cat);
  std::vector<std::byte> buffer;
  const auto made_with_a_copy = [&] {
    std::filesystem::remove_all(dir / "stage");
    StageDirectory made(dir / "stage", cat);
    REQUIRE(made.try_claim(0));
    REQUIRE(made.stage(0, cat.file_source_path(0).string(), buffer) == Outcome::kStaged);
  };
  for (const char* name : {"node.table", "index.log", "start.lock"}) {
    made_with_a_copy();
    std::filesystem::remove(area / name);
    REQUIRE(::mkfifo((area / name).c_str(), 0600) == 0);
    const std::string named = name;
    CAPTURE(named);
    try {
      StageDirectory stage(dir / "stage", cat);
      FAIL("a FIFO in the area was not refused");
    } catch (const prestage::detail::UnsafePath& e) {
      CHECK(e.path() == (area / name).string());
    }
  }
  // Where a copy belongs: no copy there, to check or to read.
  made_with_a_copy();
  std::filesystem::remove(area / "00/0");
  REQUIRE(::mkfifo((area / "00/0").c_str(), 0600) == 0);
  {
    StageDirectory stage(dir / "stage", cat);
    CHECK_FALSE(stage.is_staged(0));  // the start-up scan takes no FIFO for a copy
    CHECK_FALSE(stage.unchanged(0, buffer));
  }
  // A copy's lock file: the copy fails with an error, and gives its claim back.
  std::filesystem::remove_all(dir / "stage");
  StageDirectory stage(dir / "stage", cat);
  REQUIRE(::mkfifo((stage.staged_path(0) + ".part").c_str(), 0600) == 0);
  REQUIRE(stage.try_claim(0));
  CHECK_THROWS_AS(stage.stage(0, cat.file_source_path(0).string(), buffer), prestage::IoError);
  CHECK(stage.is_absent(0));
}

TEST_CASE(
    "stage directory: an area or folder others can write is refused, one only they can read is "
    "tightened") {
  TempDir dir;
  write(dir / "src/a", "alpha");
  const Catalog cat = Catalog::from_paths(dir / "src", {"a"});
  const auto area = StageDirectory::area_of(dir / "stage", cat);
  {
    StageDirectory made(dir / "stage", cat);
  }
  REQUIRE(::chmod((area / "3f").c_str(), 0777) == 0);
  CHECK_THROWS_AS(StageDirectory(dir / "stage", cat), prestage::detail::UnsafePath);
  REQUIRE(::chmod((area / "3f").c_str(), 0755) == 0);
  REQUIRE(::chmod(area.c_str(), 0757) == 0);
  try {
    StageDirectory stage(dir / "stage", cat);
    FAIL("an area others can write was not refused");
  } catch (const prestage::IoError& e) {
    CHECK(e.error_code() == EPERM);
    CHECK(e.path() == area.string());
  }
  REQUIRE(::chmod(area.c_str(), 0755) == 0);  // an older version's
  {
    StageDirectory stage(dir / "stage", cat);
  }
  struct stat st{};
  REQUIRE(::stat(area.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0700);
  REQUIRE(::stat((area / "3f").c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0700);
  // A parent open to all without its sticky bit: another user could swap the area.
  REQUIRE(::chmod((dir / "stage").c_str(), 0777) == 0);
  CHECK_THROWS_AS(StageDirectory(dir / "stage", cat), prestage::detail::UnsafePath);
  REQUIRE(::chmod((dir / "stage").c_str(), 01777) == 0);
  CHECK_NOTHROW(StageDirectory(dir / "stage", cat));
}

TEST_CASE(
    "stage directory: a copy that must not wait waits on no neighbour, and marks none stalled") {
  TempDir dir;
  const Catalog cat = many_files(dir, 3);
  StageDirectory stage(dir / "stage", cat);
  // Another process is copying file 1 (its part file's lock) and publishing file 2 (renamed to its
  // name, its record not yet appended: the lock still held), and stays there.
  const LockingNeighbour neighbour({stage.staged_path(1) + ".part", stage.staged_path(2)}, 0600);
  std::vector<std::byte> buffer;
  const Fetch never = [](std::vector<std::byte>&, int64_t&) { FAIL("the source was read"); };
  for (const uint64_t id : {uint64_t{1}, uint64_t{2}}) {
    CAPTURE(id);
    REQUIRE(stage.try_claim(id));
    const auto start = Clock::now();
    CHECK(stage.stage(id, never, buffer, StageDirectory::kNoWait) == Outcome::kBusy);
    CHECK(Clock::now() - start < milliseconds(2000));  // a wait on the lock would be for ever
    CHECK(stage.is_absent(id));                        // the claim is given back
    CHECK_FALSE(stage.node().claimed(id));
  }
  // The neighbour is not taken for stalled: a later copy with a wait still waits for it.
  REQUIRE(stage.try_claim(1));
  const auto start = Clock::now();
  CHECK(stage.stage(1, never, buffer, milliseconds(200)) == Outcome::kBusy);
  CHECK(Clock::now() - start >= milliseconds(200));
  // A copy nobody holds is made as any other.
  REQUIRE(stage.try_claim(0));
  CHECK(stage.stage(0, cat.file_source_path(0).string(), buffer, StageDirectory::kNoWait) ==
        Outcome::kStaged);
}
