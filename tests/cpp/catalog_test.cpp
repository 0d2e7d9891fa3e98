#include <doctest/doctest.h>

#include <fstream>

#include "prestage/catalog.hpp"
#include "prestage/error.hpp"
#include "test_util.hpp"

using prestage::Catalog;
using prestage::test::TempDir;

namespace {
void touch(const std::filesystem::path& p) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p) << "x";
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

TEST_CASE("catalog: from_folder refuses a missing root and a root without class folders") {
  TempDir dir;
  CHECK_THROWS_AS(Catalog::from_folder(dir / "missing"), prestage::IoError);
  touch(dir / "flat.jpg");
  CHECK_THROWS_AS(Catalog::from_folder(dir.path()), prestage::ConfigError);
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
