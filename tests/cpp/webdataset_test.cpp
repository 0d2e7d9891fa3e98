// The catalog's WebDataset reader: shard patterns, keys, labels, the tar header scan (ustar prefix,
// GNU long names, base-256 sizes, pax) and its damage. Python's tests check it against webdataset,
// tarfile and GNU tar; these pin the parts those writers never produce.
#include "formats/webdataset.hpp"

#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "prestage/catalog.hpp"
#include "prestage/error.hpp"
#include "test_util.hpp"

namespace {

using prestage::Catalog;
using prestage::ConfigError;
using prestage::DecodeError;
using prestage::OnError;
using prestage::test::TempDir;
using namespace prestage::detail;

std::span<const std::byte> text(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

// One tar header block, its checksum right.
struct Header {
  std::string name;
  uint64_t size = 0;
  char type = '0';
  std::string prefix;
  bool base256 = false;

  std::string block() const {
    std::string h(512, '\0');
    std::memcpy(h.data(), name.data(), std::min<size_t>(name.size(), 100));
    std::memcpy(h.data() + 100, "0000644", 7);
    if (base256) {
      h[124] = static_cast<char>(0x80);
      for (int i = 0; i < 8; ++i) h[135 - i] = static_cast<char>(size >> (8 * i) & 0xff);
    } else {
      char buf[13];
      std::snprintf(buf, sizeof(buf), "%011llo", static_cast<unsigned long long>(size));
      std::memcpy(h.data() + 124, buf, 11);
    }
    std::memcpy(h.data() + 136, "00000000000", 11);
    h[156] = type;
    std::memcpy(h.data() + 257, "ustar", 6);  // with its NUL: POSIX ustar
    std::memcpy(h.data() + 263, "00", 2);
    std::memcpy(h.data() + 345, prefix.data(), std::min<size_t>(prefix.size(), 155));
    std::memset(h.data() + 148, ' ', 8);
    unsigned sum = 0;
    for (unsigned char c : h) sum += c;
    char buf[8];
    std::snprintf(buf, sizeof(buf), "%06o", sum);
    std::memcpy(h.data() + 148, buf, 7);
    return h;
  }
};

std::string padded(const std::string& data) {
  return data + std::string((512 - data.size() % 512) % 512, '\0');
}

std::string member(const Header& h, const std::string& data) { return h.block() + padded(data); }

std::string file(const std::string& name, const std::string& data, char type = '0') {
  return member(Header{name, data.size(), type}, data);
}

void write(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::vector<TarMember> members(const std::filesystem::path& path, std::vector<TarDamage>* damage) {
  ForwardReader in(path.string());
  std::vector<TarMember> out;
  scan_tar(
      in, [&](const TarMember& m) { out.push_back(m); },
      [&](const TarDamage& d) {
        REQUIRE(damage != nullptr);
        damage->push_back(d);
      });
  return out;
}

}  // namespace

TEST_CASE("webdataset: brace patterns expand as braceexpand does") {
  CHECK(expand_braces("train-{000..002}.tar") ==
        std::vector<std::string>{"train-000.tar", "train-001.tar", "train-002.tar"});
  CHECK(expand_braces("{a,b}-{1..2}") == std::vector<std::string>{"a-1", "a-2", "b-1", "b-2"});
  CHECK(expand_braces("x{3..1}") == std::vector<std::string>{"x3", "x2", "x1"});
  CHECK(expand_braces("{a,{b,c}}") == std::vector<std::string>{"a", "b", "c"});
  CHECK(expand_braces("plain.tar") == std::vector<std::string>{"plain.tar"});
  CHECK(expand_braces("lit{x}.tar") == std::vector<std::string>{"lit{x}.tar"});
  CHECK_THROWS_AS(expand_braces("train-{000..002.tar"), ConfigError);
  CHECK_THROWS_AS(expand_braces("{0..99999999999}"), ConfigError);
}

TEST_CASE("webdataset: the key runs to the first dot after the last slash") {
  const auto k = split_key("dir/a.b/n0001.seg.PNG");
  REQUIRE(k);
  CHECK(k->key == "dir/a.b/n0001");
  CHECK(k->ext == "seg.png");
  CHECK_FALSE(split_key("dir/.hidden"));
  CHECK_FALSE(split_key("noext"));
  CHECK(is_meta("__index__", "__index__"));
  CHECK(is_meta("__meta__/x.json", "__meta__/x"));
  CHECK(is_meta("__meta__.json", "__meta__"));
  CHECK_FALSE(is_meta("a/b.jpg", "a/b"));
}

TEST_CASE("webdataset: labels are decimal text or an integer of a JSON object") {
  CHECK(decimal_label(text(" 17\n")) == 17);
  CHECK(decimal_label(text("-3")) == -3);
  CHECK_FALSE(decimal_label(text("1.5")));
  CHECK_FALSE(decimal_label(text("")));
  CHECK_FALSE(decimal_label(text("99999999999999999999")));
  CHECK(json_label(text(R"({"a": {"label": 3}, "s": "x\"}", "label": 7})"), "label") == 7);
  CHECK(json_label(text(R"({"label": 1, "label": 2})"), "label") == 2);
  CHECK_FALSE(json_label(text(R"({"label": 7.5})"), "label"));
  CHECK_FALSE(json_label(text(R"({"label": true})"), "label"));
  CHECK_FALSE(json_label(text(R"([{"label": 1}])"), "label"));
  CHECK_FALSE(json_label(text(R"({"label": 1)"), "label"));
  CHECK_FALSE(json_label(text(std::string(100000, '[')), "label"));
}

TEST_CASE("webdataset: ustar prefixes, GNU long names and base-256 sizes") {
  TempDir dir;
  const std::string long_name = std::string(150, 'd') + "/sample.jpg";
  Header prefixed{"k1.jpg", 3, '0', "some/folder"};
  Header big{"k2.bin", 5, '0', "", true};
  const std::string tar = member(prefixed, "abc") + file("././@LongLink", long_name + '\0', 'L') +
                          file(long_name.substr(0, 99), "hello") + member(big, "12345") +
                          file("adir/", "", '5') + file("k3.lnk", "", '2') +
                          std::string(1024, '\0');
  write(dir.path() / "a.tar", tar);
  const auto found = members(dir.path() / "a.tar", nullptr);
  REQUIRE(found.size() == 3);
  CHECK(found[0].name == "some/folder/k1.jpg");
  CHECK(found[0].offset == 512);
  CHECK(found[0].size == 3);
  CHECK(found[1].name == long_name);
  CHECK(found[1].header == 1024);
  CHECK(found[1].size == 5);
  CHECK(found[2].name == "k2.bin");
  CHECK(tar.substr(found[2].offset, found[2].size) == "12345");
}

TEST_CASE("webdataset: a bad header is passed over to the next good one") {
  TempDir dir;
  std::string bad = file("k2.jpg", "XX");
  bad[0] = 'j';  // the checksum no longer holds
  const std::string tar = file("k1.jpg", "A") + bad + file("k3.jpg", "C");
  write(dir.path() / "a.tar", tar);
  std::vector<TarDamage> damage;
  const auto found = members(dir.path() / "a.tar", &damage);
  REQUIRE(found.size() == 2);
  CHECK(found[1].name == "k3.jpg");
  REQUIRE(damage.size() == 1);
  CHECK(damage[0].offset == 1024);
  CHECK_FALSE(damage[0].rest_of_file);
  CHECK(damage[0].resumed == 2048);
}

TEST_CASE("webdataset: a member past the end loses the rest of the shard") {
  TempDir dir;
  const std::string tar = file("k1.jpg", "A") + Header{"k2.jpg", 4096}.block() + "short";
  write(dir.path() / "a.tar", tar);
  std::vector<TarDamage> damage;
  CHECK(members(dir.path() / "a.tar", &damage).size() == 1);
  REQUIRE(damage.size() == 1);
  CHECK(damage[0].rest_of_file);
  CHECK(damage[0].name == "k2.jpg");
}

TEST_CASE("webdataset: interleaved keys are an error, or each of their runs is left out") {
  TempDir dir;
  const std::string tar = file("a.jpg", "1") + file("a.cls", "0") + file("b.jpg", "2") +
                          file("b.cls", "1") + file("a.txt", "late") + file("c.jpg", "3") +
                          file("c.cls", "2");
  write(dir.path() / "s.tar", tar);
  const std::vector<std::string> shards{(dir.path() / "s.tar").string()};
  CHECK_THROWS_AS(Catalog::from_webdataset(shards), DecodeError);
  const auto catalog =
      Catalog::from_webdataset(shards, "jpg", "cls", Catalog::Missing::kError, OnError::kSkip);
  REQUIRE(catalog.size() == 2);
  CHECK(catalog.label(0) == 1);
  CHECK(catalog.label(1) == 2);
  CHECK(catalog.damage().size() == 2);
}

TEST_CASE("webdataset: a missing field is an error, skipped, or empty") {
  TempDir dir;
  const std::string tar = file("a.jpg", "1") + file("a.cls", "0") + file("b.cls", "1") +
                          file("c.jpeg", "33") + std::string(1024, '\0');
  write(dir.path() / "s.tar", tar);
  const std::vector<std::string> shards{(dir.path() / "s.tar").string()};
  CHECK_THROWS_AS(Catalog::from_webdataset(shards), DecodeError);
  const auto skipped = Catalog::from_webdataset(shards, "jpg;jpeg", "cls", Catalog::Missing::kSkip);
  CHECK(skipped.size() == 1);
  const auto empty = Catalog::from_webdataset(shards, "jpg;jpeg", "cls", Catalog::Missing::kEmpty);
  REQUIRE(empty.size() == 3);
  CHECK(empty.locator(1).length == 0);
  CHECK(empty.label(2) == -1);
  CHECK(empty.locator(2).length == 2);
  CHECK(tar.substr(empty.locator(2).offset, 2) == "33");
  const auto with_errors =
      Catalog::from_webdataset(shards, "jpg;jpeg", "cls", Catalog::Missing::kError, OnError::kSkip);
  CHECK(with_errors.size() == 1);
  CHECK(with_errors.damage().size() == 2);
}

TEST_CASE(
    "webdataset: a corrupt gzip shard is damage, bzip2 refused; a member named like a magic is "
    "not") {
  TempDir dir;
  // gzip is read through its decompressed bytes: a stream that does not decompress is damage of
  // the whole shard (and a set of no other shard holds no sample).
  write(dir.path() / "z.tar", std::string("\x1f\x8b\x08\x00", 4) + std::string(600, 'x'));
  CHECK_THROWS_AS(Catalog::from_webdataset({(dir.path() / "z.tar").string()}), DecodeError);
  CHECK_THROWS_AS(Catalog::from_webdataset({(dir.path() / "z.tar").string()}, "jpg;jpeg", "cls",
                                           Catalog::Missing::kError, OnError::kSkip),
                  ConfigError);
  write(dir.path() / "j.tar", std::string("BZh91AY&SY", 10) + std::string(600, 'x'));
  CHECK_THROWS_AS(Catalog::from_webdataset({(dir.path() / "j.tar").string()}), ConfigError);
  write(dir.path() / "b.tar", file("BZh91.jpg", "1") + file("BZh91.cls", "4"));
  const auto catalog = Catalog::from_webdataset({(dir.path() / "b.tar").string()});
  REQUIRE(catalog.size() == 1);
  CHECK(catalog.label(0) == 4);
}

TEST_CASE("webdataset: a DALI index gives a scan's samples, damage and missing fields") {
  TempDir dir;
  // Members at 512-byte headers with one block of data each: member k's data at 512 * (2k + 1).
  const std::string shard = file("a.jpg", "AAAA") + file("a.cls", "1") + file("b.jpg", "BB") +
                            file("b.cls", "x") + file("c.cls", "3") + file("d.jpg", "D") +
                            file("d.cls", "4") + std::string(1024, '\0');
  write(dir / "s.tar", shard);
  write(dir / "s.idx",
        "v1.2 4\njpg 512 4 a.jpg cls 1536 1 a.cls\njpg 2560 2 b.jpg cls 3584 1 b.cls\n"
        "cls 4608 1 c.cls\njpg 5632 1 d.jpg cls 6656 1 d.cls\n");
  const std::vector<std::string> shards{(dir / "s.tar").string()};
  const std::vector<std::filesystem::path> index{dir / "s.idx"};
  for (const auto missing :
       {Catalog::Missing::kError, Catalog::Missing::kSkip, Catalog::Missing::kEmpty}) {
    CAPTURE(static_cast<int>(missing));
    const auto scanned = Catalog::from_webdataset(shards, "jpg", "cls", missing, OnError::kSkip);
    const auto indexed =
        Catalog::from_webdataset(shards, "jpg", "cls", missing, OnError::kSkip, index);
    REQUIRE(indexed.size() == scanned.size());
    for (size_t i = 0; i < scanned.size(); ++i) {
      CHECK(indexed.locator(i).offset == scanned.locator(i).offset);
      CHECK(indexed.locator(i).length == scanned.locator(i).length);
      CHECK(indexed.label(i) == scanned.label(i));
    }
    REQUIRE(indexed.damage().size() == scanned.damage().size());
    for (size_t i = 0; i < scanned.damage().size(); ++i) {
      CHECK(indexed.damage()[i].offset == scanned.damage()[i].offset);
    }
    CHECK_THROWS_AS(Catalog::from_webdataset(shards, "jpg", "cls", missing, OnError::kRaise, index),
                    DecodeError);
  }
  // v1.1 (no names) reads the same; an index of another layout is refused, whatever on_error says.
  write(dir / "v11.idx",
        "v1.1 4\njpg 512 4 cls 1536 1\njpg 2560 2 cls 3584 1\ncls 4608 1\njpg 5632 1 cls 6656 1\n");
  CHECK(Catalog::from_webdataset(shards, "jpg", "cls", Catalog::Missing::kSkip, OnError::kSkip,
                                 {dir / "v11.idx"})
            .size() == 2);
  write(dir / "bad.idx", "v1.2 1\njpg 1024 4 a.jpg\n");
  CHECK_THROWS_AS(Catalog::from_webdataset(shards, "jpg", "", Catalog::Missing::kSkip,
                                           OnError::kSkip, {dir / "bad.idx"}),
                  ConfigError);
}
