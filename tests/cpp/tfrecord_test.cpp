// Stage 3 TFRecord: CRC32C, record framing and the tf.train.Example reader; the catalog's index
// of damaged files.
#include "formats/tfrecord.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "prestage/catalog.hpp"
#include "prestage/error.hpp"
#include "test_util.hpp"

namespace {

using prestage::Catalog;
using prestage::DecodeError;
using prestage::OnError;
using prestage::test::TempDir;
using namespace prestage::detail;

std::vector<std::byte> bytes(const std::string& s) {
  std::vector<std::byte> out(s.size());
  if (!s.empty()) std::memcpy(out.data(), s.data(), s.size());
  return out;
}

std::string varint(uint64_t v) {
  std::string out;
  do {
    out += static_cast<char>((v & 0x7F) | (v > 0x7F ? 0x80 : 0));
    v >>= 7;
  } while (v);
  return out;
}

std::string field(int number, const std::string& payload) {
  return varint(static_cast<uint64_t>(number) << 3 | 2) + varint(payload.size()) + payload;
}

// Example { features { feature { key: k value { <list> } } } }
std::string example(const std::string& key, int kind, const std::string& list) {
  return field(1, field(1, field(1, key) + field(2, field(kind, list))));
}

std::vector<std::byte> frame(const std::vector<std::byte>& data) {
  std::vector<std::byte> out(16 + data.size());
  const uint64_t n = data.size();
  std::memcpy(out.data(), &n, 8);
  const uint32_t length_crc = masked_crc32c(std::span(out.data(), 8));
  std::memcpy(out.data() + 8, &length_crc, 4);
  std::memcpy(out.data() + 12, data.data(), data.size());
  const uint32_t data_crc = masked_crc32c(data);
  std::memcpy(out.data() + 12 + n, &data_crc, 4);
  return out;
}

}  // namespace

TEST_CASE("tfrecord: CRC-32C matches the standard check values") {
  CHECK(crc32c(bytes("123456789")) == 0xE3069283u);  // RFC 3720's check value
  CHECK(crc32c(bytes("")) == 0u);
  CHECK(crc32c(std::vector<std::byte>(32, std::byte{0})) == 0x8A9136AAu);  // RFC 3720, B.4
  const auto long_input = bytes(std::string(1000, 'a') + "tail");
  CHECK(crc32c(std::span(long_input).subspan(500), crc32c(std::span(long_input).first(500))) ==
        crc32c(long_input));
}

TEST_CASE("tfrecord: a framed record gives back its data, and any change is refused") {
  const auto data = bytes("some record bytes");
  const auto framed = frame(data);
  const auto got = unframe_record(framed, "r.tfrecord");
  CHECK(std::string(reinterpret_cast<const char*>(got.data()), got.size()) == "some record bytes");
  for (const size_t at : {size_t{0}, size_t{9}, size_t{14}, framed.size() - 1}) {
    CAPTURE(at);
    auto bad = framed;
    bad[at] ^= std::byte{1};
    CHECK_THROWS_AS(unframe_record(bad, "r.tfrecord"), DecodeError);
  }
  CHECK_THROWS_AS(unframe_record(std::span(framed).first(framed.size() - 1), "r.tfrecord"),
                  DecodeError);
}

TEST_CASE("tfrecord: Example features are found by name, int64 packed or not") {
  const auto jpeg = bytes(example("image/encoded", 1, field(1, "JPEGDATA")));
  std::span<const std::byte> value;
  REQUIRE(example_bytes(jpeg, "image/encoded", value, "r"));
  CHECK(value.size() == 8);
  CHECK_FALSE(example_bytes(jpeg, "other", value, "r"));
  int64_t label = 0;
  CHECK_THROWS_AS(example_int64(jpeg, "image/encoded", label, "r"), DecodeError);  // a bytes_list

  const auto packed = bytes(example("label", 3, field(1, varint(42) + varint(7))));
  REQUIRE(example_int64(packed, "label", label, "r"));
  CHECK(label == 42);
  const auto unpacked = bytes(example("label", 3, varint(1 << 3) + varint(~uint64_t{0})));  // -1
  REQUIRE(example_int64(unpacked, "label", label, "r"));
  CHECK(label == -1);
}

TEST_CASE("tfrecord: malformed Examples are DecodeErrors, never crashes") {
  const std::string good = example("image", 1, field(1, "abc"));
  std::span<const std::byte> value;
  for (size_t cut = 1; cut < good.size(); ++cut) {
    const auto truncated = bytes(good.substr(0, cut));
    try {
      example_bytes(truncated, "image", value, "r");
    } catch (const DecodeError&) {
    }
  }
  CHECK_THROWS_AS(example_bytes(bytes(std::string("\x0b\x00", 2)), "image", value, "r"),
                  DecodeError);  // group
  CHECK_THROWS_AS(example_bytes(bytes(field(1, std::string("\x0a\xff", 2))), "image", value, "r"),
                  DecodeError);
}

TEST_CASE("tfrecord: every single-byte change of an Example is parsed or refused, never a crash") {
  const std::string good =
      example("image", 1, field(1, "abc")) + example("label", 3, field(1, varint(3)));
  int parsed = 0, refused = 0;
  for (size_t at = 0; at < good.size(); ++at) {
    for (const char mask : {'\x01', '\x80', '\xff'}) {
      std::string bad = good;
      bad[at] = static_cast<char>(bad[at] ^ mask);
      const auto b = bytes(bad);
      std::span<const std::byte> value;
      int64_t label = 0;
      try {
        parsed += example_bytes(b, "image", value, "r");
        parsed += example_int64(b, "label", label, "r");
      } catch (const DecodeError&) {
        ++refused;
      }
    }
  }
  // Some changes only alter values (still parsed), others break the structure (refused).
  CHECK(parsed > 0);
  CHECK(refused > 0);
}

namespace {

std::string fixed32(float v) {
  std::string out(4, '\0');
  std::memcpy(out.data(), &v, 4);
  return out;
}

// example_values of feature "x", as values of T; `dtype` receives their type string.
template <typename T>
std::vector<T> values_of(const std::string& message, std::string& dtype,
                         uint64_t max_bytes = 1 << 20) {
  const auto example = bytes(message);  // a bytes_list's value points into it
  std::vector<std::byte> buffer;
  std::span<const std::byte> values;
  std::string_view type;
  REQUIRE(example_values(example, "x", max_bytes, buffer, values, type, "r"));
  dtype = type;
  REQUIRE(values.size() % sizeof(T) == 0);
  std::vector<T> out(values.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), values.data(), values.size());
  return out;
}

}  // namespace

TEST_CASE("tfrecord: float_list values are read packed, unpacked and mixed, in order") {
  const std::vector<float> want{1.5f, -2.0f, 3.25f, 0.0f, 1e30f};
  std::string packed, unpacked;
  for (const float v : want) {
    packed += fixed32(v);
    unpacked += varint(1 << 3 | 5) + fixed32(v);
  }
  std::string dtype;
  CHECK(values_of<float>(example("x", 2, field(1, packed)), dtype) == want);
  CHECK(dtype == "<f4");
  CHECK(values_of<float>(example("x", 2, unpacked), dtype) == want);
  // Protobuf parsers accept a packed run and single values in one list.
  const std::string mixed = field(1, fixed32(1.5f) + fixed32(-2.0f)) + varint(1 << 3 | 5) +
                            fixed32(3.25f) + field(1, fixed32(0.0f) + fixed32(1e30f));
  CHECK(values_of<float>(example("x", 2, mixed), dtype) == want);
  CHECK(values_of<float>(example("x", 2, ""), dtype).empty());  // an empty list
}

TEST_CASE("tfrecord: int64_list values are read packed and unpacked, negatives included") {
  const std::vector<int64_t> want{0, 1, -1, 300, INT64_MIN, INT64_MAX};
  std::string packed, unpacked;
  for (const int64_t v : want) {
    packed += varint(static_cast<uint64_t>(v));
    unpacked += varint(1 << 3) + varint(static_cast<uint64_t>(v));
  }
  std::string dtype;
  CHECK(values_of<int64_t>(example("x", 3, field(1, packed)), dtype) == want);
  CHECK(dtype == "<i8");
  CHECK(values_of<int64_t>(example("x", 3, unpacked), dtype) == want);
  // A bytes_list is its first value, untouched.
  CHECK(values_of<char>(example("x", 1, field(1, "raw!") + field(1, "more")), dtype) ==
        std::vector<char>{'r', 'a', 'w', '!'});
  CHECK(dtype == "|u1");
}

TEST_CASE("tfrecord: malformed or oversized float and int64 lists are DecodeErrors") {
  std::vector<std::byte> buffer;
  std::span<const std::byte> values;
  std::string_view dtype;
  auto read = [&](const std::string& message, uint64_t max_bytes = 1 << 20) {
    return example_values(bytes(message), "x", max_bytes, buffer, values, dtype, "r");
  };
  CHECK_FALSE(read(example("y", 2, field(1, fixed32(1)))));  // another feature
  // A packed float run whose length is not a multiple of 4; a cut single value.
  CHECK_THROWS_AS(read(example("x", 2, field(1, fixed32(1) + "ab"))), DecodeError);
  CHECK_THROWS_AS(read(example("x", 2, varint(1 << 3 | 5) + "ab")), DecodeError);
  // A packed varint run that ends inside a varint; a varint of more than 10 bytes.
  CHECK_THROWS_AS(read(example("x", 3, field(1, varint(5) + "\x80"))), DecodeError);
  CHECK_THROWS_AS(read(example("x", 3, field(1, std::string(11, '\xff') + '\x01'))), DecodeError);
  // An empty Feature (no list at all) is refused, as the other accessors do.
  CHECK_THROWS_AS(read(field(1, field(1, field(1, "x") + field(2, "")))), DecodeError);
  // More values than max_bytes allows: refused before the buffer grows.
  std::string many;
  for (int i = 0; i < 100; ++i) many += varint(static_cast<uint64_t>(i));
  buffer.clear();
  CHECK_THROWS_AS(read(example("x", 3, field(1, many)), 799), DecodeError);
  CHECK(buffer.empty());
  CHECK(read(example("x", 3, field(1, many)), 800));
  CHECK(values.size() == 800);
  // Every cut of a good list is parsed or refused, never read past.
  const std::string good = example("x", 2, field(1, fixed32(1) + fixed32(2))) +
                           example("y", 3, field(1, varint(1) + varint(2)));
  for (size_t cut = 0; cut < good.size(); ++cut) {
    try {
      read(good.substr(0, cut));
    } catch (const DecodeError&) {
    }
  }
  CHECK(example_has_data(bytes(good), "x", "r"));
  CHECK_FALSE(example_has_data(bytes(good), "z", "r"));
  CHECK_THROWS_AS(example_has_data(bytes(example("x", 3, field(1, "\x80"))), "x", "r"),
                  DecodeError);
}

namespace {

// A TFRecord file of `count` Examples {"image": "record <i>", "label": i}; returns each record's
// offset (and, last, the file's size).
std::vector<uint64_t> write_shard(const std::filesystem::path& path, int count, int first_label) {
  std::vector<uint64_t> offsets{0};
  std::ofstream out(path, std::ios::binary);
  for (int i = 0; i < count; ++i) {
    const int label = first_label + i;
    const std::string data = "record " + std::to_string(label);
    const auto framed = frame(
        bytes(example("image", 1, field(1, data)) + example("label", 3, field(1, varint(label)))));
    out.write(reinterpret_cast<const char*>(framed.data()),
              static_cast<std::streamsize>(framed.size()));
    offsets.push_back(offsets.back() + framed.size());
  }
  return offsets;
}

void flip_byte(const std::filesystem::path& path, uint64_t at) {
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  f.seekg(static_cast<std::streamoff>(at));
  const char c = static_cast<char>(f.get() ^ 0x20);
  f.seekp(static_cast<std::streamoff>(at));
  f.put(c);
}

std::vector<int64_t> labels_of(const Catalog& cat) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < cat.size(); ++i) out.push_back(cat.label(i));
  return out;
}

}  // namespace

TEST_CASE("tfrecord: a bad data CRC loses only its record; the catalog skips it and lists it") {
  TempDir dir;
  const auto a = write_shard(dir / "a.tfrecord", 5, 0);
  write_shard(dir / "b.tfrecord", 3, 10);
  flip_byte(dir / "a.tfrecord", a[2] + 20);  // inside record 2's data; its length is intact
  const std::vector<std::filesystem::path> files{dir / "a.tfrecord", dir / "b.tfrecord"};
  CHECK_THROWS_AS(Catalog::from_tfrecord(files, "image", "label"), DecodeError);
  const Catalog cat = Catalog::from_tfrecord(files, "image", "label", OnError::kSkip);
  CHECK(labels_of(cat) == std::vector<int64_t>{0, 1, 3, 4, 10, 11, 12});
  CHECK(cat.locator(2).offset == a[3]);
  REQUIRE(cat.damage().size() == 1);
  CHECK(cat.damage()[0].file == 0);
  CHECK(cat.damage()[0].offset == a[2]);
  CHECK_FALSE(cat.damage()[0].rest_of_file);
  CHECK(cat.file_size(1) != Catalog::kUnknownSize);
}

TEST_CASE("tfrecord: a bad length CRC or a truncation loses the rest of the file, not the set") {
  TempDir dir;
  const auto a = write_shard(dir / "a.tfrecord", 5, 0);
  const auto b = write_shard(dir / "b.tfrecord", 4, 10);
  write_shard(dir / "c.tfrecord", 2, 20);
  flip_byte(dir / "a.tfrecord", a[3] + 1);                     // record 3's length
  std::filesystem::resize_file(dir / "b.tfrecord", b[4] - 7);  // record 3 cut short
  const std::vector<std::filesystem::path> files{dir / "a.tfrecord", dir / "b.tfrecord",
                                                 dir / "c.tfrecord"};
  CHECK_THROWS_AS(Catalog::from_tfrecord(files, "image", "label"), DecodeError);
  const Catalog cat = Catalog::from_tfrecord(files, "image", "label", OnError::kSkip);
  CHECK(labels_of(cat) == std::vector<int64_t>{0, 1, 2, 10, 11, 12, 20, 21});
  REQUIRE(cat.damage().size() == 2);
  CHECK(cat.damage()[0].file == 0);
  CHECK(cat.damage()[0].offset == a[3]);
  CHECK(cat.damage()[0].rest_of_file);
  CHECK(cat.damage()[1].file == 1);
  CHECK(cat.damage()[1].offset == b[3]);
  CHECK(cat.damage()[1].rest_of_file);
}

TEST_CASE("tfrecord: a record without the data feature is damage too; none usable is an error") {
  TempDir dir;
  std::ofstream out(dir / "a.tfrecord", std::ios::binary);
  for (const char* key : {"image", "other", "image"}) {
    const auto framed = frame(bytes(example(key, 1, field(1, "x"))));
    out.write(reinterpret_cast<const char*>(framed.data()),
              static_cast<std::streamsize>(framed.size()));
  }
  out.close();
  const Catalog cat = Catalog::from_tfrecord({dir / "a.tfrecord"}, "image", "", OnError::kSkip);
  CHECK(cat.size() == 2);
  REQUIRE(cat.damage().size() == 1);
  CHECK_FALSE(cat.damage()[0].rest_of_file);
  CHECK_THROWS_AS(Catalog::from_tfrecord({dir / "a.tfrecord"}, "missing", "", OnError::kSkip),
                  prestage::ConfigError);
}

TEST_CASE("tfrecord: the damage list and the records around it survive save and load") {
  TempDir dir;
  const auto a = write_shard(dir / "a.tfrecord", 4, 0);
  flip_byte(dir / "a.tfrecord", a[1] + 20);
  const Catalog cat =
      Catalog::from_tfrecord({dir / "a.tfrecord"}, "image", "label", OnError::kSkip);
  cat.save(dir / "cat.bin");
  const Catalog back = Catalog::load(dir / "cat.bin");
  CHECK(labels_of(back) == std::vector<int64_t>{0, 2, 3});
  REQUIRE(back.damage().size() == 1);
  CHECK(back.damage()[0].file == 0);
  CHECK(back.damage()[0].offset == a[1]);
  CHECK(back.damage()[0].reason == cat.damage()[0].reason);
  CHECK(back.fingerprint() == cat.fingerprint());
}
