#include <doctest/doctest.h>

#include <fstream>
#include <thread>

#include "prestage/catalog.hpp"
#include "prestage/error.hpp"
#include "staging/file_io.hpp"
#include "staging/stage_directory.hpp"
#include "staging/stager.hpp"
#include "test_util.hpp"

using prestage::Catalog;
using prestage::detail::StageDirectory;
using prestage::test::TempDir;

namespace {
std::span<const std::byte> as_bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}
std::string read_text(const std::string& path) {
  std::vector<std::byte> buffer;
  prestage::detail::read_file(path, buffer);
  return {reinterpret_cast<const char*>(buffer.data()), buffer.size()};
}
}  // namespace

TEST_CASE("stage directory: a published copy is staged, under a name made from its id") {
  TempDir dir;
  const Catalog cat = Catalog::from_paths(dir / "src", {"a", "b"});
  StageDirectory stage(dir / "stage", cat);
  CHECK(!stage.is_staged(1));
  REQUIRE(stage.try_claim(1));
  CHECK(!stage.try_claim(1));  // one copier per sample
  stage.publish(1, as_bytes("hello"));
  CHECK(stage.is_staged(1));
  CHECK(read_text(stage.staged_path(1)) == "hello");
  const auto rel = std::filesystem::path(stage.staged_path(1)).lexically_relative(dir / "stage");
  CHECK(rel.begin()->string().rfind("prestage-", 0) == 0);
  CHECK(rel.filename() == "1");
}

TEST_CASE("stage directory: a second run finds the copies of the first") {
  TempDir dir;
  const Catalog cat = Catalog::from_paths(dir / "src", {"a", "b", "c"});
  {
    StageDirectory stage(dir / "stage", cat);
    REQUIRE(stage.try_claim(0));
    stage.publish(0, as_bytes("zero"));
    REQUIRE(stage.try_claim(2));
    stage.publish(2, as_bytes("two"));
  }
  StageDirectory again(dir / "stage", cat);
  CHECK(again.found_at_start() == 2);
  CHECK(again.is_staged(0));
  CHECK(!again.is_staged(1));
  CHECK(again.is_staged(2));
  // Another catalog gets an area of its own.
  StageDirectory other(dir / "stage", Catalog::from_paths(dir / "src", {"a", "b", "d"}));
  CHECK(other.found_at_start() == 0);
}

TEST_CASE("stage directory: a temporary file left by a dead process is neither served nor kept") {
  TempDir dir;
  const Catalog cat = Catalog::from_paths(dir / "src", {"a", "b"});
  std::string tmp;
  {
    StageDirectory stage(dir / "stage", cat);
    // A pid far above any pid_max: no such process.
    tmp = stage.staged_path(1) + ".tmp.99999999.0";
    std::ofstream(tmp) << "half a fi";
  }
  StageDirectory again(dir / "stage", cat);
  CHECK(!again.is_staged(1));
  CHECK(!std::filesystem::exists(tmp));
}

TEST_CASE("stage directory: publishing into a vanished directory is an IoError, and the sample is absent") {
  TempDir dir;
  const Catalog cat = Catalog::from_paths(dir / "src", {"a"});
  StageDirectory stage(dir / "stage", cat);
  std::filesystem::remove_all(dir / "stage");
  REQUIRE(stage.try_claim(0));
  CHECK_THROWS_AS(stage.publish(0, as_bytes("x")), prestage::IoError);
  CHECK(!stage.is_staged(0));
  CHECK(stage.try_claim(0));  // absent again: claimable
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
      prestage::detail::Stager stager(cat, &stage, threads);
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
  prestage::detail::Stager stager(cat, &stage, 2);
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
