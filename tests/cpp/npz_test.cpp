// Stage 3 .npz codec: stored and deflated members found through the central directory, CRCs
// checked, and damaged archives refused. The archives are written here with zlib, as Python's
// zipfile does.
#include "formats/npz.hpp"

#include <doctest/doctest.h>
#include <zlib.h>

#include <cstring>
#include <string>
#include <vector>

#include "formats/array.hpp"
#include "prestage/error.hpp"

namespace {

using prestage::DecodeError;
using namespace prestage::detail;

std::string npy(const std::string& descr, const std::string& shape, const std::string& data,
                bool fortran = false) {
  std::string header = "{'descr': '" + descr +
                       "', 'fortran_order': " + (fortran ? "True" : "False") +
                       ", 'shape': " + shape + ", }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  return std::string("\x93NUMPY\x01\x00", 8) + char(header.size() & 0xFF) +
         char(header.size() >> 8) + header + data;
}

void put16(std::string& s, uint32_t v) { s += {char(v & 0xFF), char((v >> 8) & 0xFF)}; }
void put32(std::string& s, uint32_t v) {
  put16(s, v & 0xFFFF);
  put16(s, v >> 16);
}

std::string deflate_raw(const std::string& in) {
  z_stream z{};
  REQUIRE(deflateInit2(&z, 6, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY) == Z_OK);
  std::string out(deflateBound(&z, in.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  REQUIRE(deflate(&z, Z_FINISH) == Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

struct Member {
  std::string name, data;
  bool deflated;
};

std::vector<std::byte> zip(const std::vector<Member>& members) {
  std::string file, directory;
  for (const auto& m : members) {
    const uint32_t crc = static_cast<uint32_t>(
        crc32(0, reinterpret_cast<const Bytef*>(m.data.data()), static_cast<uInt>(m.data.size())));
    const std::string stored = m.deflated ? deflate_raw(m.data) : m.data;
    const uint32_t offset = static_cast<uint32_t>(file.size());
    std::string common;
    put16(common, 20);
    put16(common, 0);
    put16(common, m.deflated ? 8 : 0);
    put32(common, 0);  // time, date
    put32(common, crc);
    put32(common, static_cast<uint32_t>(stored.size()));
    put32(common, static_cast<uint32_t>(m.data.size()));
    put16(common, static_cast<uint32_t>(m.name.size()));
    put16(common, 0);
    put32(file, 0x04034b50);
    file += common + m.name + stored;
    put32(directory, 0x02014b50);
    put16(directory, 20);
    directory += common;
    put16(directory, 0);  // comment
    put16(directory, 0);  // disk
    put16(directory, 0);
    put32(directory, 0);
    put32(directory, offset);
    directory += m.name;
  }
  const uint32_t directory_offset = static_cast<uint32_t>(file.size());
  file += directory;
  put32(file, 0x06054b50);
  put32(file, 0);
  put16(file, static_cast<uint32_t>(members.size()));
  put16(file, static_cast<uint32_t>(members.size()));
  put32(file, static_cast<uint32_t>(directory.size()));
  put32(file, directory_offset);
  put16(file, 0);
  std::vector<std::byte> out(file.size());
  std::memcpy(out.data(), file.data(), file.size());
  return out;
}

std::vector<uint8_t> decode(const std::vector<std::byte>& archive, const std::string& name,
                            ArrayInfo& info) {
  const std::string path = "a.npz";
  MemorySource source(archive, path);
  NpzDecoder decoder;
  const NpzMember member = decoder.probe(source, name, info, 1 << 20);
  std::vector<uint8_t> out(info.bytes);
  decoder.decode(source, member, info, std::as_writable_bytes(std::span(out)));
  return out;
}

const std::string kBytes = "abcdefghijkl";

}  // namespace

TEST_CASE("npz: stored and deflated members are found by name and decoded") {
  for (const bool deflated : {false, true}) {
    CAPTURE(deflated);
    const auto archive = zip({{"x.npy", npy("|u1", "(3, 4)", kBytes), deflated},
                              {"y.npy", npy("|u1", "(2, 2)", "wxyz"), deflated}});
    ArrayInfo info;
    const auto x = decode(archive, "x", info);
    CHECK(std::string(x.begin(), x.end()) == kBytes);
    CHECK(info.shape[1] == 4);
    const auto y = decode(archive, "y", info);
    CHECK(std::string(y.begin(), y.end()) == "wxyz");
    CHECK_THROWS_AS(decode(archive, "", info), DecodeError);  // two arrays: a name is needed
    CHECK_THROWS_AS(decode(archive, "z", info), DecodeError);
  }
}

TEST_CASE("npz: a Fortran-order member comes out in C order") {
  const auto archive = zip({{"a.npy", npy("|u1", "(2, 3)", "adbecf", true), true}});
  ArrayInfo info;
  const auto a = decode(archive, "", info);
  CHECK(std::string(a.begin(), a.end()) == "abcdef");
}

TEST_CASE("npz: damaged archives are DecodeErrors") {
  for (const bool deflated : {false, true}) {
    CAPTURE(deflated);
    const auto good = zip({{"x.npy", npy("|u1", "(12,)", kBytes), deflated}});
    ArrayInfo info;
    auto bad_data = good;
    bad_data[30 + 5 + (deflated ? 10 : 129)] ^= std::byte{0x20};  // inside the member's data
    CHECK_THROWS_AS(decode(bad_data, "x", info), DecodeError);
    auto cut = good;
    cut.resize(good.size() - 30);  // the end-of-directory record is gone
    CHECK_THROWS_AS(decode(cut, "x", info), DecodeError);
    const auto liar = zip({{"x.npy", npy("|u1", "(99,)", kBytes), deflated}});
    CHECK_THROWS_AS(decode(liar, "x", info), DecodeError);
  }
  std::vector<std::byte> text(100, std::byte{'z'});
  ArrayInfo info;
  CHECK_THROWS_AS(decode(text, "x", info), DecodeError);
}

TEST_CASE(
    "npz: every single-byte change or truncation decodes or is a DecodeError, never a crash") {
  for (const bool deflated : {false, true}) {
    CAPTURE(deflated);
    const auto good = zip({{"x.npy", npy("<i4", "(3,)", kBytes), deflated}});
    for (size_t at = 0; at < good.size(); ++at) {
      for (const uint8_t mask : {uint8_t{0x01}, uint8_t{0xFF}}) {
        auto bad = good;
        bad[at] ^= std::byte{mask};
        ArrayInfo info;
        try {
          decode(bad, "x", info);
        } catch (const DecodeError&) {
        }
      }
      ArrayInfo info;
      CHECK_THROWS_AS(decode(std::vector<std::byte>(good.begin(),
                                                    good.begin() + static_cast<std::ptrdiff_t>(at)),
                             "x", info),
                      DecodeError);
    }
  }
}
