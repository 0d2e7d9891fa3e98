// Stage 2's Stager driven directly, over a real StageDirectory in a temporary folder: each test
// plays stage 1's part (claims) and stage 3's (waits for `done`).
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "prestage/catalog.hpp"
#include "prestage/error.hpp"
#include "staging/stager.hpp"
#include "test_util.hpp"
#include "tiers/stage_directory.hpp"
#include "tiers/tiers.hpp"
#include "util/file_io.hpp"

using prestage::Catalog;
using prestage::detail::ReadAhead;
using prestage::detail::StageDirectory;
using prestage::detail::Stager;
using prestage::detail::StageTask;
using prestage::test::TempDir;

namespace {

using Outcome = StageDirectory::Outcome;

std::string read_text(const std::string& path) {
  std::vector<std::byte> buffer;
  prestage::detail::read_file(path, buffer);
  return {reinterpret_cast<const char*>(buffer.data()), buffer.size()};
}

void write(const std::filesystem::path& p, const std::string& text) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p, std::ios::trunc | std::ios::binary) << text;
}

std::string content(const std::string& name) { return "the bytes of " + name; }

// A task whose `done` counts its calls in `calls`.
void count_done(StageTask& task, std::atomic<int>& calls) {
  task.done = [](void* c) { static_cast<std::atomic<int>*>(c)->fetch_add(1); };
  task.context = &calls;
}

// Waits (at most 60 s) until `calls` reaches `n`.
bool wait_for(const std::atomic<int>& calls, int n) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (calls.load() < n) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

prestage::Stats stats_of(const Stager& stager) {
  prestage::Stats stats;
  stager.add_to(stats);
  return stats;
}

// A catalog over `slow` FIFOs with no writer ("slow0", ...), then `files` regular files ("f0", ...,
// each holding content(name)): a thread that copies a FIFO blocks in its open, as on a hung file
// server, until release() lets it go on (its copy then fails: a FIFO is no regular file).
struct Source {
  Source(const TempDir& dir, size_t slow, size_t files) : root(dir / "src") {
    std::filesystem::create_directories(root);
    for (size_t i = 0; i < slow; ++i) {
      paths.push_back("slow" + std::to_string(i));
      REQUIRE(::mkfifo((root / paths.back()).c_str(), 0644) == 0);
    }
    for (size_t i = 0; i < files; ++i) {
      paths.push_back("f" + std::to_string(i));
      write(root / paths.back(), content(paths.back()));
    }
    catalog = Catalog::from_paths(root, paths);
    this->slow = slow;
  }
  uint64_t file(size_t i) const { return slow + i; }  // the id of "f<i>"
  std::string text(uint64_t id) const { return content(paths[id]); }
  void release() const {
    for (size_t i = 0; i < slow; ++i) REQUIRE(prestage::test::release_fifo_reader(root / paths[i]));
  }

  std::filesystem::path root;
  std::vector<std::string> paths;
  Catalog catalog = Catalog::from_paths(".", {"x"});
  size_t slow = 0;
};

// Stages the files `ids` as an earlier run would have, so that a StageDirectory made afterwards
// finds them as copies to check (unverified).
void stage_in_earlier_run(const std::filesystem::path& stage_dir, const Catalog& cat,
                          const std::vector<uint64_t>& ids) {
  StageDirectory earlier(stage_dir, cat);
  std::vector<std::byte> buffer;
  for (const uint64_t id : ids) {
    REQUIRE(earlier.try_claim(id));
    REQUIRE(earlier.stage(id, cat.file_source_path(id).string(), buffer) == Outcome::kStaged);
  }
}

// Changes one byte of a file, keeping its size: only the CRC check can tell.
void corrupt(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(2);
  f.put('#');
}

// Blocks every thread of a stager in a copy of its own: a task over the source's `slow` FIFOs, all
// handed out when this returns. Tasks submitted afterwards wait in the queue until release().
struct BlockedThreads {
  BlockedThreads(Stager& stager, StageDirectory& stage, const Source& src) : src(src) {
    for (uint64_t id = 0; id < src.slow; ++id) {
      ids.push_back(id);
      REQUIRE(stage.try_claim(id));
    }
    task.ids = ids.data();
    task.count = ids.size();
    count_done(task, done);
    const uint64_t items_before = stats_of(stager).stage.items;
    stager.submit(&task);
    // Waits until every thread is copying its FIFO (counted in stage.items), not only until each
    // took one: a thread that took its FIFO but had not yet looked whether the stager is cancelled
    // would see a cancel(true) that follows, skip the copy, and leave its FIFO with no reader.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (stats_of(stager).stage.items < items_before + ids.size()) {
      REQUIRE(std::chrono::steady_clock::now() < until);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  void release() {
    src.release();
    REQUIRE(wait_for(done, 1));
  }

  const Source& src;
  std::vector<uint64_t> ids;
  StageTask task;
  std::atomic<int> done{0};
};

}  // namespace

TEST_CASE("stager: every file of every task is dealt with once, and each task's done runs once") {
  for (size_t threads : {1, 2, 4}) {
    CAPTURE(threads);
    TempDir dir;
    const Source src(dir, 0, 60);
    StageDirectory stage(dir / "stage", src.catalog);
    std::vector<uint64_t> ids(60);
    for (uint64_t i = 0; i < 60; ++i) {
      ids[i] = (i * 7) % 60;
      REQUIRE(stage.try_claim(ids[i]));  // stage 1 claims what stage 2 copies
    }
    // Tasks of 0 to 16 files, laid end to end over the 60.
    const size_t sizes[] = {1, 16, 0, 5, 13, 2, 9, 14};
    std::vector<StageTask> tasks(std::size(sizes));
    std::vector<std::atomic<int>> done(tasks.size());
    {
      prestage::detail::Tiers tiers(src.catalog, &stage, UINT64_MAX);
      Stager stager(tiers, threads);
      size_t at = 0;
      for (size_t t = 0; t < tasks.size(); ++t) {
        tasks[t].ids = ids.data() + at;
        tasks[t].count = sizes[t];
        at += sizes[t];
        count_done(tasks[t], done[t]);
        stager.submit(&tasks[t]);
      }
      REQUIRE(at == 60);
      for (auto& d : done) REQUIRE(wait_for(d, 1));
      const auto stats = stats_of(stager);
      CHECK(stats.staged_files == 60);
      CHECK(stats.stage.items == 60);
      CHECK(stats.stage_failures == 0);
      CHECK(stats.stage_expedited == 0);
    }
    for (size_t t = 0; t < tasks.size(); ++t) CHECK(done[t].load() == 1);  // and not again at stop
    for (uint64_t i = 0; i < 60; ++i) {
      CHECK(stage.is_staged(i));
      CHECK(!stage.unverified(i));
      CHECK(stage.staged_size(i) == src.text(i).size());
      CHECK(read_text(stage.staged_path(i)) == src.text(i));
    }
  }
}

TEST_CASE("stager: a missing source file is given up on, and the other files are staged") {
  for (size_t threads : {1, 2, 4}) {
    CAPTURE(threads);
    TempDir dir;
    write(dir / "ok", "fine");
    const Catalog cat = Catalog::from_paths(dir.path(), {"ok", "missing"});
    StageDirectory stage(dir / "stage", cat);
    std::atomic<int> done{0};
    prestage::detail::Tiers tiers(cat, &stage, UINT64_MAX);
    Stager stager(tiers, threads);
    std::vector<uint64_t> ids{0, 1};
    REQUIRE(stage.try_claim(0));
    REQUIRE(stage.try_claim(1));
    StageTask task;
    task.ids = ids.data();
    task.count = 2;
    count_done(task, done);
    stager.submit(&task);
    REQUIRE(wait_for(done, 1));
    CHECK(stage.is_staged(0));
    CHECK(stage.is_absent(1));  // the claim was given back: stage 3 meets the error and reports it
    CHECK(stage.try_claim(1));
    const auto stats = stats_of(stager);
    CHECK(stats.stage_failures == 1);
    CHECK(!stats.stage_dir_disabled);
    CHECK(!stager.disabled());
  }
}

TEST_CASE("stager: declined samples are read into memory; a failed read is left to stage 3") {
  for (size_t threads : {1, 2, 4}) {
    CAPTURE(threads);
    TempDir dir;
    write(dir / "a", "alpha");
    write(dir / "b", "bravo!");
    write(dir / "c", "copied");
    // Read ahead: samples whose sizes the catalog records (byte ranges, here whole files).
    const Catalog cat = Catalog::from_ranges(dir.path(), {"a", "missing", "b", "c"},
                                             {{0, 0, 5}, {1, 0, 4}, {2, 0, 6}, {3, 0, 6}});
    StageDirectory stage(dir / "stage", cat);
    std::atomic<int> done{0};
    prestage::detail::Tiers tiers(cat, &stage, UINT64_MAX);
    Stager stager(tiers, threads);
    std::vector<uint64_t> files{3};
    ReadAhead read_ahead;
    read_ahead.plan(3);
    for (size_t k = 0; k < 3; ++k) {
      read_ahead.add(k, k, cat.locator(k).length);
      read_ahead.read(k);  // submit() clears them
    }
    read_ahead.lay_out(0);
    REQUIRE(stage.try_claim(3));
    StageTask task;
    task.ids = files.data();
    task.count = files.size();
    task.read_ahead = &read_ahead;
    count_done(task, done);
    stager.submit(&task);
    REQUIRE(wait_for(done, 1));
    const auto text = [](std::span<const std::byte> bytes) {
      return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    };
    REQUIRE(read_ahead.at(0).has_value());
    CHECK(!read_ahead.at(1).has_value());  // its read failed
    REQUIRE(read_ahead.at(2).has_value());
    CHECK(text(*read_ahead.at(0)) == "alpha");
    CHECK(text(*read_ahead.at(2)) == "bravo!");
    CHECK(!read_ahead.at(3).has_value());  // past the batch
    CHECK(stage.is_staged(3));
    CHECK(stage.is_absent(0));  // read ahead, not staged
    const auto stats = stats_of(stager);
    CHECK(stats.read_ahead == 2);
    CHECK(stats.read_ahead_bytes == 11);
    CHECK(stats.staged_files == 1);
    CHECK(stats.stage_failures == 0);  // the missing file is stage 3's to report
  }
}

TEST_CASE("stager: with no directory or no threads, a task completes at once and reads nothing") {
  TempDir dir;
  write(dir / "a", "alpha");
  const Catalog cat = Catalog::from_paths(dir.path(), {"a"});
  ReadAhead read_ahead;
  read_ahead.plan(1);
  read_ahead.add(0, 0, 5);
  read_ahead.lay_out(0);
  read_ahead.read(0);
  StageTask task;
  task.read_ahead = &read_ahead;
  std::atomic<int> done{0};
  count_done(task, done);
  {
    prestage::detail::Tiers tiers(cat, nullptr, UINT64_MAX);
    Stager stager(tiers, 0);
    stager.submit(&task);
    CHECK(done.load() == 1);  // on the caller's thread, before submit() returns
    CHECK(!read_ahead.at(0).has_value());
  }
  StageDirectory stage(dir / "stage", cat);
  std::vector<uint64_t> ids{0};
  REQUIRE(stage.try_claim(0));
  task.ids = ids.data();
  task.count = 1;
  prestage::detail::Tiers tiers(cat, &stage, UINT64_MAX);
  Stager stager(tiers, 0);
  stager.submit(&task);
  CHECK(done.load() == 2);
  CHECK(stage.is_absent(0));  // the claim was given back
  CHECK(stats_of(stager).staged_files == 0);
}

TEST_CASE("stager: an expedited task completes once the copies under way finish") {
  for (size_t threads : {1, 2, 4}) {
    CAPTURE(threads);
    TempDir dir;
    // The task's first `threads` files are FIFOs: every thread blocks in one, as on a slow PFS.
    const Source src(dir, threads, 3);
    StageDirectory stage(dir / "stage", src.catalog);
    prestage::detail::Tiers tiers(src.catalog, &stage, UINT64_MAX);
    Stager stager(tiers, threads);
    std::vector<uint64_t> ids;
    for (uint64_t id = 0; id < src.catalog.num_files(); ++id) {
      ids.push_back(id);
      REQUIRE(stage.try_claim(id));
    }
    ReadAhead read_ahead;
    read_ahead.plan(1);
    read_ahead.add(0, src.file(0), 1);  // given up before it is read
    read_ahead.lay_out(0);
    StageTask task;
    task.ids = ids.data();
    task.count = ids.size();
    task.read_ahead = &read_ahead;
    std::atomic<int> done{0};
    count_done(task, done);
    stager.submit(&task);
    while (task.next.load() < threads) std::this_thread::yield();  // each thread has its FIFO

    stager.expedite(&task);
    // The files no thread started are given back: stage 3 reads them, and a later claim works.
    for (size_t i = 0; i < 3; ++i) CHECK(stage.is_absent(src.file(i)));
    CHECK(done.load() == 0);  // the copies under way are not abandoned
    stager.expedite(&task);   // a second call changes nothing
    src.release();
    REQUIRE(wait_for(done, 1));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK(done.load() == 1);  // exactly once
    const auto stats = stats_of(stager);
    CHECK(stats.stage_expedited == 4);  // three copies and the read-ahead
    CHECK(stats.staged_files == 0);
    CHECK(stats.stage.items == threads);  // only the FIFOs were dealt with
    CHECK(!read_ahead.at(0).has_value());
    CHECK(stats.read_ahead == 0);
    for (size_t i = 0; i < 3; ++i) {
      CHECK(!std::filesystem::exists(stage.staged_path(src.file(i))));
      CHECK(stage.try_claim(src.file(i)));
    }
  }
}

TEST_CASE("stager: an unverified copy from an earlier run is verified, and a corrupt one evicted") {
  for (size_t threads : {1, 2, 4}) {
    CAPTURE(threads);
    TempDir dir;
    const Source src(dir, 0, 8);
    stage_in_earlier_run(dir / "stage", src.catalog, {0, 1, 2, 3, 4, 5, 6, 7});
    StageDirectory stage(dir / "stage", src.catalog);
    REQUIRE(stage.found_at_start() == 8);
    corrupt(stage.staged_path(3));
    std::filesystem::remove_all(src.root);  // checking a copy never reads the source
    std::vector<uint64_t> ids{0, 1, 2, 3, 4, 5, 6, 7};
    for (const uint64_t id : ids) REQUIRE(stage.unverified(id));
    StageTask task;  // as stage 1 hands them over: staged, not claimed
    task.ids = ids.data();
    task.count = ids.size();
    std::atomic<int> done{0};
    count_done(task, done);
    prestage::detail::Tiers tiers(src.catalog, &stage, UINT64_MAX);
    Stager stager(tiers, threads);
    stager.submit(&task);
    REQUIRE(wait_for(done, 1));
    for (const uint64_t id : ids) {
      CAPTURE(id);
      if (id == 3) {
        CHECK(stage.is_absent(id));
        CHECK(!std::filesystem::exists(stage.staged_path(id)));
      } else {
        CHECK(stage.is_staged(id));
        CHECK(!stage.unverified(id));
        CHECK(read_text(stage.staged_path(id)) == src.text(id));
      }
    }
    const auto stats = stats_of(stager);
    CHECK(stats.stage_failures == 1);
    CHECK(stats.staged_files == 0);
  }
}

TEST_CASE("stager: expediting keeps the earlier run's copies it was to check, and checks them") {
  for (size_t threads : {1, 2, 4}) {
    CAPTURE(threads);
    TempDir dir;
    const Source src(dir, threads, 6);
    const uint64_t kept[] = {src.file(0), src.file(1), src.file(2), src.file(3)};
    stage_in_earlier_run(dir / "stage", src.catalog, {kept, kept + 4});
    StageDirectory stage(dir / "stage", src.catalog);
    corrupt(stage.staged_path(src.file(1)));
    prestage::detail::Tiers tiers(src.catalog, &stage, UINT64_MAX);
    Stager stager(tiers, threads);
    BlockedThreads blocked(stager, stage, src);

    // A batch of two files to copy (claimed) and four copies from the earlier run to check, queued
    // behind the blocked threads: no thread has started any when the consumer's patience ends.
    std::vector<uint64_t> ids{src.file(4), src.file(0), src.file(1),
                              src.file(5), src.file(2), src.file(3)};
    REQUIRE(stage.try_claim(src.file(4)));
    REQUIRE(stage.try_claim(src.file(5)));
    StageTask task;
    task.ids = ids.data();
    task.count = ids.size();
    std::atomic<int> done{0};
    count_done(task, done);
    stager.submit(&task);
    stager.expedite(&task);
    CHECK(done.load() == 1);  // nothing was under way: complete at once

    // The claims went back: stage 3 reads those files from the source, and a later claim works.
    for (const size_t i : {4, 5}) {
      CHECK(stage.is_absent(src.file(i)));
      CHECK(!std::filesystem::exists(stage.staged_path(src.file(i))));
    }
    // The copies were not forgotten (they are on disk, with their index records): stage 3 reads
    // them from the stage directory, checked first, and a corrupt one is never served.
    for (const size_t i : {0, 2, 3}) {
      CAPTURE(i);
      CHECK(stage.is_staged(src.file(i)));
      CHECK(!stage.unverified(src.file(i)));
      CHECK(read_text(stage.staged_path(src.file(i))) == src.text(src.file(i)));
    }
    CHECK(stage.is_absent(src.file(1)));
    CHECK(!std::filesystem::exists(stage.staged_path(src.file(1))));
    for (const size_t i : {4, 5}) {
      CHECK(stage.try_claim(src.file(i)));
      stage.abandon(src.file(i));
    }
    blocked.release();
    const auto stats = stats_of(stager);
    CHECK(stats.stage_expedited == 6);
    CHECK(stats.staged_files == 0);
    CHECK(stats.stage_failures == threads + 1);  // the FIFOs, and the corrupt copy
  }
}

TEST_CASE("stager: cancelled, it completes queued and new tasks without copying; copies stay") {
  for (size_t threads : {1, 2, 4}) {
    CAPTURE(threads);
    TempDir dir;
    const Source src(dir, threads, 6);
    const uint64_t kept[] = {src.file(0), src.file(1), src.file(2), src.file(3)};
    stage_in_earlier_run(dir / "stage", src.catalog, {kept, kept + 4});
    StageDirectory stage(dir / "stage", src.catalog);
    prestage::detail::Tiers tiers(src.catalog, &stage, UINT64_MAX);
    Stager stager(tiers, threads);
    BlockedThreads blocked(stager, stage, src);

    std::vector<uint64_t> queued_ids{src.file(0), src.file(4), src.file(1),
                                     src.file(2), src.file(5), src.file(3)};
    REQUIRE(stage.try_claim(src.file(4)));
    REQUIRE(stage.try_claim(src.file(5)));
    StageTask queued;
    queued.ids = queued_ids.data();
    queued.count = queued_ids.size();
    std::atomic<int> queued_done{0};
    count_done(queued, queued_done);
    stager.submit(&queued);
    stager.cancel(true);  // a pipeline that stops
    blocked.release();    // the threads go on, and drain the queue without copying
    REQUIRE(wait_for(queued_done, 1));

    // A task submitted while cancelled completes before submit() returns.
    std::vector<uint64_t> late_ids{src.file(4)};
    REQUIRE(stage.try_claim(src.file(4)));
    StageTask late;
    late.ids = late_ids.data();
    late.count = 1;
    std::atomic<int> late_done{0};
    count_done(late, late_done);
    stager.submit(&late);
    CHECK(late_done.load() == 1);

    auto stats = stats_of(stager);
    CHECK(stats.staged_files == 0);
    CHECK(stats.stage_failures == 0);  // reads given up because the pipeline stops are no failures
    for (const size_t i : {4, 5}) {
      CHECK(stage.is_absent(src.file(i)));
      CHECK(!std::filesystem::exists(stage.staged_path(src.file(i))));
    }
    // The earlier run's copies stay known, unchecked: their next use checks them.
    for (const size_t i : {0, 1, 2, 3}) {
      CAPTURE(i);
      CHECK(stage.is_staged(src.file(i)));
      CHECK(stage.unverified(src.file(i)));
      CHECK(std::filesystem::exists(stage.staged_path(src.file(i))));
    }

    // Resumed, it copies again.
    stager.cancel(false);
    std::vector<uint64_t> again_ids{src.file(4), src.file(5)};
    for (const uint64_t id : again_ids) REQUIRE(stage.try_claim(id));
    StageTask again;
    again.ids = again_ids.data();
    again.count = again_ids.size();
    std::atomic<int> again_done{0};
    count_done(again, again_done);
    stager.submit(&again);
    REQUIRE(wait_for(again_done, 1));
    stats = stats_of(stager);
    CHECK(stats.staged_files == 2);
    for (const uint64_t id : again_ids) CHECK(read_text(stage.staged_path(id)) == src.text(id));
    CHECK(queued_done.load() == 1);
    CHECK(late_done.load() == 1);
  }
}

TEST_CASE("stager: a stage directory that fails mid-run disables staging; the rest is given back") {
  for (size_t threads : {1, 2, 4}) {
    CAPTURE(threads);
    TempDir dir;
    const Source src(dir, 0, 24);
    StageDirectory stage(dir / "stage", src.catalog);
    // A regular file where the shard directory of file 5 should be: its copy cannot be created.
    const auto shard = std::filesystem::path(stage.staged_path(5)).parent_path();
    std::filesystem::remove_all(shard);
    write(shard, "not a directory");
    std::vector<uint64_t> ids(12);
    for (uint64_t i = 0; i < 12; ++i) {
      ids[i] = i;
      REQUIRE(stage.try_claim(i));
    }
    prestage::detail::Tiers tiers(src.catalog, &stage, UINT64_MAX);
    Stager stager(tiers, threads);
    StageTask task;
    task.ids = ids.data();
    task.count = ids.size();
    std::atomic<int> done{0};
    count_done(task, done);
    stager.submit(&task);
    REQUIRE(wait_for(done, 1));
    CHECK(stager.disabled());
    auto stats = stats_of(stager);
    CHECK(stats.stage_dir_disabled);
    CHECK(!stats.stage_dir_error.empty());
    CHECK(stats.stage_failures >= 1);
    CHECK(stage.is_absent(5));
    // Every file was dealt with: staged (those under way before the failure), or given back.
    uint64_t staged = 0;
    for (uint64_t i = 0; i < 12; ++i) {
      CAPTURE(i);
      CHECK((stage.is_staged(i) || stage.is_absent(i)));
      if (stage.is_staged(i)) {
        ++staged;
        CHECK(read_text(stage.staged_path(i)) == src.text(i));
      }
      // One thread takes the files in order: none after the failing one is copied.
      if (threads == 1 && i > 5) CHECK(stage.is_absent(i));
    }
    CHECK(stats.staged_files == staged);

    // Once disabled, nothing more is copied: a new task's claims all go back.
    std::vector<uint64_t> more(12);
    for (uint64_t i = 0; i < 12; ++i) {
      more[i] = 12 + i;
      REQUIRE(stage.try_claim(more[i]));
    }
    StageTask next;
    next.ids = more.data();
    next.count = more.size();
    std::atomic<int> next_done{0};
    count_done(next, next_done);
    stager.submit(&next);
    REQUIRE(wait_for(next_done, 1));
    for (const uint64_t id : more) CHECK(stage.is_absent(id));
    stats = stats_of(stager);
    CHECK(stats.staged_files == staged);
    CHECK(done.load() == 1);
  }
}

TEST_CASE("stager: set_threads starts threads as the limit grows; a stager with none keeps none") {
  TempDir dir;
  // Three FIFOs: a thread that copies one blocks in it until release().
  const Source src(dir, 3, 0);
  StageDirectory stage(dir / "stage", src.catalog);
  prestage::detail::Tiers tiers(src.catalog, &stage, UINT64_MAX);
  Stager stager(tiers, 1);
  std::vector<uint64_t> ids{0, 1, 2};
  for (const uint64_t id : ids) REQUIRE(stage.try_claim(id));
  StageTask task;
  task.ids = ids.data();
  task.count = ids.size();
  std::atomic<int> done{0};
  count_done(task, done);
  stager.submit(&task);
  while (task.next.load() < 1) std::this_thread::yield();
  // One thread, blocked in the first FIFO: the others wait for it.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(task.next.load() == 1);
  stager.set_threads(3);
  CHECK(stager.threads() == 3);
  // Two more threads take the other two FIFOs while the first is still blocked.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (task.next.load() < 3) {
    REQUIRE(std::chrono::steady_clock::now() < until);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  src.release();
  REQUIRE(wait_for(done, 1));
  stager.set_threads(1);
  CHECK(stager.threads() == 1);
  const auto stats = stats_of(stager);
  CHECK(stats.stage.items == 3);

  Stager none(tiers, 0);
  none.set_threads(4);
  CHECK(none.threads() == 0);
}

TEST_CASE(
    "read ahead: the items lie back to back in one buffer that grows a quarter past the need") {
  ReadAhead ahead;
  ahead.plan(4);
  ahead.add(1, 10, 100);
  ahead.add(3, 11, 60);
  CHECK(ahead.lay_out(0) == 200);  // 160 and a quarter
  CHECK(ahead.fill(0).size() == 100);
  CHECK(ahead.fill(1).size() == 60);
  CHECK(ahead.fill(1).data() == ahead.fill(0).data() + 100);
  ahead.read(1);
  CHECK(!ahead.at(1).has_value());  // not read
  CHECK(ahead.at(3)->size() == 60);
  CHECK(!ahead.at(0).has_value());  // not planned
  // A smaller batch keeps the buffer; a larger one takes what another work item grew to.
  ahead.plan(2);
  ahead.add(0, 12, 150);
  CHECK(ahead.lay_out(0) == 200);
  ahead.plan(2);
  ahead.add(0, 12, 150);
  ahead.add(1, 13, 100);
  CHECK(ahead.lay_out(1000) == 1000);
  CHECK(ahead.capacity() == 1000);
}
