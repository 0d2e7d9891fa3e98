#include <doctest/doctest.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "prestage/catalog.hpp"
#include "prestage/error.hpp"
#include "test_util.hpp"
#include "tiers/stage_directory.hpp"
#include "util/file_io.hpp"

using prestage::Catalog;
using prestage::test::TempDir;
using prestage::test::write_npy;
namespace fs = std::filesystem;

namespace {
void touch(const fs::path& p, const std::string& text = "x") {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

// Sample i's bytes, read as the loader reads a catalog's source files.
std::string read_sample(const Catalog& cat, size_t i) {
  std::vector<std::byte> bytes;
  const std::string path = cat.source_path(i).string();
  prestage::detail::read_located(prestage::detail::source_file(cat, path), cat.locator(i), bytes);
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// The IoError `read` throws (fails the test if none).
template <typename Read>
prestage::IoError io_error_of(Read read) {
  try {
    read();
  } catch (const prestage::IoError& e) {
    return e;
  }
  FAIL("no IoError");
  return prestage::IoError("", 0, "");
}
}  // namespace

TEST_CASE("catalog: from_folder labels classes in sorted order and sorts files within each") {
  TempDir dir;
  touch(dir / "zebra/b.jpg");
  touch(dir / "zebra/a.JPEG");
  touch(dir / "apple/sub/c.jpg");
  touch(dir / "apple/d.jpg");
  touch(dir / "apple/notes.txt");
  touch(dir / "stray.jpg");  // not in a class folder
  const Catalog cat = Catalog::from_folder(dir.path());
  REQUIRE(cat.size() == 4);
  CHECK(cat.classes() == std::vector<std::string>{"apple", "zebra"});
  CHECK(cat.path(0) == "apple/d.jpg");  // files of "apple" before those of "apple/sub"
  CHECK(cat.path(1) == "apple/sub/c.jpg");
  CHECK(cat.path(2) == "zebra/a.JPEG");
  CHECK(cat.path(3) == "zebra/b.jpg");
  CHECK(cat.label(0) == 0);
  CHECK(cat.label(1) == 0);
  CHECK(cat.label(2) == 1);
  CHECK(cat.source_path(3) == dir.path() / "zebra/b.jpg");
}

TEST_CASE(
    "catalog: from_folder refuses a missing root and a root with neither class folders nor files") {
  TempDir dir;
  CHECK_THROWS_AS(Catalog::from_folder(dir / "missing"), prestage::IoError);
  touch(dir / "notes.txt");  // not of the extensions asked for
  CHECK_THROWS_AS(Catalog::from_folder(dir.path()), prestage::ConfigError);
}

TEST_CASE("catalog: a flat folder's files are samples without a class (label -1), sorted") {
  TempDir dir;
  touch(dir / "b.jpg");
  touch(dir / "a.JPEG");
  touch(dir / "notes.txt");
  const Catalog cat = Catalog::from_folder(dir.path());
  REQUIRE(cat.size() == 2);
  CHECK(cat.classes().empty());
  CHECK(cat.path(0) == "a.JPEG");
  CHECK(cat.path(1) == "b.jpg");
  CHECK(cat.label(0) == -1);
  CHECK(cat.label(1) == -1);
  CHECK(cat.source_path(1) == dir.path() / "b.jpg");
}

TEST_CASE("catalog: from_list reads paths and labels, skipping blanks and comments") {
  TempDir dir;
  std::ofstream(dir / "list.txt") << "# header\na/1.jpg,3\n\nb/2.jpg\r\nc,with,comma.jpg,7\n";
  const Catalog cat = Catalog::from_list(dir / "list.txt", dir.path());
  REQUIRE(cat.size() == 3);
  CHECK(cat.path(0) == "a/1.jpg");
  CHECK(cat.label(0) == 3);
  CHECK(cat.label(1) == -1);
  CHECK(cat.path(2) == "c,with,comma.jpg");
  CHECK(cat.label(2) == 7);
}

TEST_CASE("catalog: a path that escapes the root is refused") {
  TempDir dir;
  for (const char* bad : {"../etc/passwd", "a/../../b.jpg", "/etc/passwd", "a/..", ""}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(Catalog::from_paths(dir.path(), {bad}), prestage::ConfigError);
  }
  std::ofstream(dir / "list.txt") << "ok.jpg\n../escape.jpg\n";
  CHECK_THROWS_AS(Catalog::from_list(dir / "list.txt", dir.path()), prestage::ConfigError);
  CHECK_NOTHROW(Catalog::from_paths(dir.path(), {"a..b/c.jpg", "./x.jpg"}));
}

TEST_CASE("catalog: from_list refuses a label that is not an integer and a missing file") {
  TempDir dir;
  std::ofstream(dir / "list.txt") << "a.jpg,cat\n";
  CHECK_THROWS_AS(Catalog::from_list(dir / "list.txt", dir.path()), prestage::ConfigError);
  CHECK_THROWS_AS(Catalog::from_list(dir / "none.txt", dir.path()), prestage::IoError);
}

TEST_CASE("catalog: save and load give back the same catalog") {
  TempDir dir;
  const Catalog cat =
      Catalog::from_paths("/data/set", {"a/1.jpg", "b/2.jpg", "c/3.jpg"}, {0, 1, 5}, {"a", "b"});
  cat.save(dir / "cat.bin");
  const Catalog back = Catalog::load(dir / "cat.bin");
  REQUIRE(back.size() == cat.size());
  CHECK(back.root() == cat.root());
  CHECK(back.classes() == cat.classes());
  CHECK(back.fingerprint() == cat.fingerprint());
  for (size_t i = 0; i < cat.size(); ++i) {
    CHECK(back.path(i) == cat.path(i));
    CHECK(back.label(i) == cat.label(i));
  }
}

TEST_CASE("catalog: from_located keeps its ranges, classes and damage, records sizes, and saves") {
  TempDir dir;
  touch(dir / "part/a.arrow", "0123456789");
  touch(dir / "part/b.arrow", "abcdefgh");
  const Catalog cat = Catalog::from_located(dir.path(), {"part/a.arrow", "part/b.arrow"},
                                            {{0, 2, 3}, {1, 0, 4}, {0, 9, 1}}, {1, 0, -1},
                                            {"cat", "dog"}, {{1, 4, true, "the rest is cut"}});
  REQUIRE(cat.size() == 3);
  CHECK(read_sample(cat, 0) == "234");
  CHECK(read_sample(cat, 1) == "abcd");
  CHECK(read_sample(cat, 2) == "9");
  CHECK(cat.file_size(0) == 10);
  CHECK(cat.file_size(1) == 8);
  cat.save(dir / "cat.bin");
  const Catalog back = Catalog::load(dir / "cat.bin");
  REQUIRE(back.size() == 3);
  CHECK(back.classes() == std::vector<std::string>{"cat", "dog"});
  CHECK(back.label(0) == 1);
  CHECK(read_sample(back, 1) == "abcd");
  REQUIRE(back.damage().size() == 1);
  CHECK(back.damage()[0].file == 1);
  CHECK(back.damage()[0].offset == 4);
  CHECK(back.damage()[0].rest_of_file);
  CHECK(back.damage()[0].reason == "the rest is cut");
  CHECK(back.file_size(1) == 8);
}

TEST_CASE("catalog: from_located refuses no samples, a whole file, bad damage, a file twice") {
  TempDir dir;
  const std::vector<std::string> files{"a.arrow"};
  using L = Catalog::Locator;
  CHECK_THROWS_AS(Catalog::from_located(dir.path(), files, {}, {}, {}, {}), prestage::ConfigError);
  CHECK_THROWS_AS(
      Catalog::from_located(dir.path(), files, {L{0, 0, Catalog::kWholeFile}}, {}, {}, {}),
      prestage::ConfigError);
  CHECK_THROWS_AS(
      Catalog::from_located(dir.path(), files, {L{0, 0, 1}}, {}, {}, {{1, 0, false, ""}}),
      prestage::ConfigError);
  CHECK_THROWS_AS(Catalog::from_located(dir.path(), files, {L{1, 0, 1}}, {}, {}, {}),
                  prestage::ConfigError);
  CHECK_THROWS_AS(Catalog::from_located(dir.path(), {"a", "a"}, {L{0, 0, 1}}, {}, {}, {}),
                  prestage::ConfigError);
  CHECK_THROWS_AS(Catalog::from_located(dir.path(), files, {L{0, 0, 1}}, {1, 2}, {}, {}),
                  prestage::ConfigError);
}

TEST_CASE("catalog: a truncated, corrupt or missing catalog file is refused") {
  TempDir dir;
  Catalog::from_paths("/r", {"a.jpg", "b.jpg"}, {1, 2}).save(dir / "cat.bin");
  std::string bytes;
  {
    std::ifstream in(dir / "cat.bin", std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  SUBCASE("truncated") {
    std::ofstream(dir / "cut.bin", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    CHECK_THROWS_AS(Catalog::load(dir / "cut.bin"), prestage::DecodeError);
  }
  SUBCASE("one byte flipped") {
    bytes[bytes.size() / 2] ^= 0x5a;
    std::ofstream(dir / "bad.bin", std::ios::binary) << bytes;
    CHECK_THROWS_AS(Catalog::load(dir / "bad.bin"), prestage::DecodeError);
  }
  SUBCASE("empty") {
    std::ofstream(dir / "empty.bin", std::ios::binary);
    CHECK_THROWS_AS(Catalog::load(dir / "empty.bin"), prestage::DecodeError);
  }
  SUBCASE("missing") { CHECK_THROWS_AS(Catalog::load(dir / "none.bin"), prestage::IoError); }
}

TEST_CASE("catalog: the fingerprint changes with the root and with any path") {
  const auto a = Catalog::from_paths("/r", {"a.jpg", "b.jpg"}).fingerprint();
  CHECK(a == Catalog::from_paths("/r", {"a.jpg", "b.jpg"}).fingerprint());
  CHECK(a != Catalog::from_paths("/s", {"a.jpg", "b.jpg"}).fingerprint());
  CHECK(a != Catalog::from_paths("/r", {"a.jpg", "c.jpg"}).fingerprint());
  CHECK(a != Catalog::from_paths("/r", {"a.jp", "gb.jpg"}).fingerprint());
}

TEST_CASE("catalog: a link that leads out of the root is followed by default (as torchvision)") {
  TempDir dir;
  touch(dir / "outside/secret.jpg", "outside");
  touch(dir / "root/cls/a.jpg", "a");
  fs::create_symlink(dir / "outside/secret.jpg", dir / "root/cls/b.jpg");
  const Catalog cat = Catalog::from_folder(dir / "root");
  REQUIRE(cat.size() == 2);
  CHECK(cat.symlinks() == Catalog::Symlinks::kFollow);
  CHECK(read_sample(cat, 1) == "outside");
}

TEST_CASE("catalog: with Symlinks::kInside a link out of the root is refused, one inside is not") {
  TempDir dir;
  touch(dir / "outside/secret.jpg", "outside");
  touch(dir / "outside/more/c.jpg", "c");
  touch(dir / "root/cls/a.jpg", "a");
  fs::create_symlink("a.jpg", dir / "root/cls/relative.jpg");
  fs::create_symlink(dir / "root/cls/a.jpg", dir / "root/cls/absolute.jpg");  // absolute, inside
  fs::create_directories(dir / "root/other");
  fs::create_symlink("../cls", dir / "root/other/linked");  // a folder link that stays inside
  const auto confined = Catalog::Symlinks::kInside;

  const Catalog inside = Catalog::from_folder(dir / "root", {".jpg"}, confined);
  REQUIRE(inside.size() == 6);
  for (size_t i = 0; i < inside.size(); ++i) CHECK(read_sample(inside, i) == "a");

  SUBCASE("a file link, at build") {
    fs::create_symlink(dir / "outside/secret.jpg", dir / "root/cls/b.jpg");
    const auto e = io_error_of([&] { Catalog::from_folder(dir / "root", {".jpg"}, confined); });
    CHECK(e.error_code() == EXDEV);
    CHECK(e.path() == (dir / "root/cls/b.jpg").string());
  }
  SUBCASE("a folder link, at build, before it is walked") {
    fs::create_symlink(dir / "outside/more", dir / "root/cls/more");
    const auto e = io_error_of([&] { Catalog::from_folder(dir / "root", {".jpg"}, confined); });
    CHECK(e.error_code() == EXDEV);
    CHECK(e.path() == (dir / "root/cls/more").string());
  }
  SUBCASE("a class folder link, at build") {
    fs::create_symlink(dir / "outside/more", dir / "root/zzz");
    CHECK(io_error_of([&] {
            Catalog::from_folder(dir / "root", {".jpg"}, confined);
          }).error_code() == EXDEV);
  }
  SUBCASE("a listed file") {
    fs::create_symlink(dir / "outside/secret.jpg", dir / "root/cls/b.jpg");
    std::ofstream(dir / "list.txt") << "cls/a.jpg\ncls/b.jpg\n";
    CHECK(Catalog::from_list(dir / "list.txt", dir / "root").size() == 2);
    CHECK(io_error_of([&] {
            Catalog::from_list(dir / "list.txt", dir / "root", confined);
          }).error_code() == EXDEV);
  }
  SUBCASE("a link planted after the catalog was built, at every read") {
    const std::vector<std::string> paths{"cls/a.jpg", "cls/b.jpg", "cls/c/x.jpg"};
    const Catalog cat = Catalog::from_paths(dir / "root", paths, {}, {}, confined);
    const Catalog follow = Catalog::from_paths(dir / "root", paths);
    fs::create_symlink(dir / "outside/secret.jpg", dir / "root/cls/b.jpg");
    fs::create_symlink(dir / "outside/more", dir / "root/cls/c");
    touch(dir / "outside/more/x.jpg", "x");
    CHECK(read_sample(follow, 1) == "outside");
    CHECK(read_sample(follow, 2) == "x");
    CHECK(read_sample(cat, 0) == "a");
    for (size_t i : {1, 2}) {
      CAPTURE(i);
      const auto e = io_error_of([&] { read_sample(cat, i); });
      CHECK(e.error_code() == EXDEV);
      CHECK(e.path() == cat.source_path(i).string());
      const std::string path = cat.source_path(i).string();
      const auto file = prestage::detail::source_file(cat, path);
      CHECK(io_error_of([&] { prestage::detail::file_size(file); }).error_code() == EXDEV);
    }
    // A read under a time limit runs on a helper thread, and refuses the same.
    const prestage::detail::IoTimeoutScope limit(std::chrono::milliseconds(5000));
    CHECK(io_error_of([&] { read_sample(cat, 1); }).error_code() == EXDEV);
    CHECK(read_sample(cat, 0) == "a");
  }
}

TEST_CASE("catalog: the symlink policy is saved, and a confined catalog has its own fingerprint") {
  TempDir dir;
  const Catalog follow = Catalog::from_paths("/data/set", {"a/1.jpg", "b/2.jpg"});
  const Catalog inside =
      Catalog::from_paths("/data/set", {"a/1.jpg", "b/2.jpg"}, {}, {}, Catalog::Symlinks::kInside);
  CHECK(follow.fingerprint() != inside.fingerprint());
  inside.save(dir / "inside.bin");
  const Catalog back = Catalog::load(dir / "inside.bin");
  CHECK(back.symlinks() == Catalog::Symlinks::kInside);
  CHECK(back.fingerprint() == inside.fingerprint());
  follow.save(dir / "follow.bin");
  CHECK(Catalog::load(dir / "follow.bin").symlinks() == Catalog::Symlinks::kFollow);
}

TEST_CASE("catalog: catalog files of format versions 3 to 6 still load, as following links") {
  TempDir dir;
  const Catalog cat = Catalog::from_paths("/data/set", {"a/1.jpg", "b/2.jpg"}, {4, 5});
  cat.save(dir / "v7.bin");
  std::string v7;
  {
    std::ifstream in(dir / "v7.bin", std::ios::binary);
    v7.assign(std::istreambuf_iterator<char>(in), {});
  }
  // Each older version is the next without its last fields (before the checksum): version 6
  // without the (empty) codec tables, 5 also without the (empty) dtype, 4 also without the
  // axis, 3 also without the policy byte and the (empty) damage list.
  auto older = [&](uint32_t version, size_t cut) {
    std::string bytes = v7.substr(0, v7.size() - 8 - cut);
    std::memcpy(bytes.data() + 8, &version, sizeof(version));
    uint64_t sum = 0xcbf29ce484222325ULL;
    for (unsigned char c : bytes) {
      sum ^= c;
      sum *= 0x100000001b3ULL;
    }
    bytes.append(reinterpret_cast<const char*>(&sum), sizeof(sum));
    return bytes;
  };
  for (const auto& [version, cut] :
       {std::pair<uint32_t, size_t>{6, 24}, {5, 24 + 8}, {4, 24 + 16}, {3, 24 + 16 + 1 + 8}}) {
    CAPTURE(version);
    std::ofstream(dir / "old.bin", std::ios::binary | std::ios::trunc) << older(version, cut);
    const Catalog back = Catalog::load(dir / "old.bin");
    CHECK(back.size() == 2);
    CHECK(back.label(1) == 5);
    CHECK(back.symlinks() == Catalog::Symlinks::kFollow);
    CHECK(back.damage().empty());
    CHECK(back.axis() == 0);
    CHECK(back.dtype().empty());
    CHECK(back.fingerprint() == cat.fingerprint());
    CHECK_FALSE(back.has_compressed_files());
  }
  std::ofstream(dir / "v99.bin", std::ios::binary) << older(99, 0);
  CHECK_THROWS_AS(Catalog::load(dir / "v99.bin"), prestage::DecodeError);
}

TEST_CASE("catalog: from_arrays records the dtype most samples have, and it is saved") {
  TempDir dir;
  // 4 + 1 samples of "<f4" against 2 + 2 of "<i2": by files a tie, by samples "<f4"; a file of 0
  // samples counts for nothing.
  write_npy(dir / "a.npy", "<i2", "(2, 2)", std::string(8, '\0'));
  write_npy(dir / "b.npy", "<f4", "(4, 2)", std::string(32, '\0'));
  write_npy(dir / "c.npy", "<i2", "(2, 2)", std::string(8, '\0'));
  write_npy(dir / "d.npy", "<f4", "(1, 2)", std::string(8, '\0'));
  write_npy(dir / "e.npy", "<u1", "(0, 2)", "");
  const Catalog cat = Catalog::from_arrays(
      {dir / "a.npy", dir / "b.npy", dir / "c.npy", dir / "d.npy", dir / "e.npy"});
  REQUIRE(cat.size() == 9);
  CHECK(cat.dtype() == "<f4");
  cat.save(dir / "set.catalog");
  CHECK(Catalog::load(dir / "set.catalog").dtype() == "<f4");
  // A tie in samples (4 and 4) goes to the dtype of the earliest file.
  CHECK(Catalog::from_arrays({dir / "c.npy", dir / "a.npy", dir / "b.npy"}).dtype() == "<i2");
  CHECK(Catalog::from_arrays({dir / "b.npy", dir / "c.npy", dir / "a.npy"}).dtype() == "<f4");
  // Catalogs of whole files have none.
  CHECK(Catalog::from_paths(dir.path(), {"a.npy"}).dtype().empty());
}

TEST_CASE("catalog: a file shorter than its catalog says is an IoError that says so") {
  TempDir dir;
  touch(dir / "shard.bin", std::string(100, 'x'));
  const Catalog cat =
      Catalog::from_ranges(dir.path(), {"shard.bin"}, {{0, 0, 40}, {0, 40, 40}, {0, 80, 20}});
  fs::resize_file(dir / "shard.bin", 70);
  CHECK(read_sample(cat, 0).size() == 40);
  const auto e = io_error_of([&] { read_sample(cat, 1); });
  CHECK(e.error_code() == EIO);
  CHECK(e.path() == (dir / "shard.bin").string());
  const std::string what = e.what();
  CHECK(what.find("is 70 bytes, the catalog expected at least 80") != std::string::npos);
  CHECK(what.find("changed since the catalog was built") != std::string::npos);

  touch(dir / "whole.bin", std::string(10, 'y'));
  std::vector<std::byte> out(16);
  const auto exact =
      io_error_of([&] { prestage::detail::read_file_exact((dir / "whole.bin").string(), out); });
  CHECK(exact.error_code() == EIO);
  CHECK(std::string(exact.what()).find("is 10 bytes, its catalog says 16") != std::string::npos);
}

TEST_CASE(
    "catalog: from_shards reads a packed set's index: ranges of its shards, labels, classes") {
  TempDir dir;
  touch(dir.path() / "shard-00000.bin", "helloworld");
  touch(dir.path() / "shard-00001.bin", "!");
  touch(dir.path() / "index.tsv",
        "# prestage pack 1\n# classes\tcat\tdog\n# zstd\tnone\n"
        "shard-00000.bin\t0\t5\t1\t0\tdog/a.txt\n"
        "shard-00000.bin\t5\t5\t0\t0\tcat/b.txt\n"
        "shard-00001.bin\t0\t1\t-1\t0\tc.txt\n");
  const Catalog cat = Catalog::from_shards(dir.path());
  REQUIRE(cat.size() == 3);
  CHECK(cat.num_files() == 2);
  CHECK(cat.classes() == std::vector<std::string>{"cat", "dog"});
  CHECK(read_sample(cat, 0) == "hello");
  CHECK(read_sample(cat, 1) == "world");
  CHECK(read_sample(cat, 2) == "!");
  CHECK(cat.label(0) == 1);
  CHECK(cat.label(2) == -1);
  CHECK(cat.file_size(0) == 10);

  // A range past its shard's end (a truncated shard) is refused when the set is opened.
  touch(dir.path() / "index.tsv", "# prestage pack 1\nshard-00001.bin\t0\t2\t0\t0\tc.txt\n");
  CHECK_THROWS_AS(Catalog::from_shards(dir.path()), prestage::DecodeError);
  touch(dir.path() / "index.tsv", "# prestage pack 1\nshard-00001.bin\t0\n");
  CHECK_THROWS_AS(Catalog::from_shards(dir.path()), prestage::ConfigError);
  CHECK_THROWS_AS(Catalog::from_shards(dir.path() / "none"), prestage::IoError);
}
