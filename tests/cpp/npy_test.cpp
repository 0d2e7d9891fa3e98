// Stage 3 .npy codec: headers of every version, C and Fortran order, and refusal of lying headers.
#include "formats/npy.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "formats/array.hpp"
#include "prestage/error.hpp"
#include "test_util.hpp"
#include "util/file_io.hpp"

namespace {

using prestage::DecodeError;
using namespace prestage::detail;

const std::string kPath = "a.npy";

// A .npy file as NumPy writes version 1.0: magic, version, header length, padded dict, data.
std::vector<std::byte> npy(const std::string& dict, const std::vector<uint8_t>& data,
                           int major = 1) {
  std::string header = dict;
  const size_t preamble = major == 1 ? 10 : 12;
  while ((preamble + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string file = std::string("\x93NUMPY", 6) + char(major) + char(0);
  const size_t n = header.size();
  file += char(n & 0xFF);
  file += char((n >> 8) & 0xFF);
  if (major != 1) file += std::string{char((n >> 16) & 0xFF), char(n >> 24)};
  file += header;
  std::vector<std::byte> out(file.size() + data.size());
  std::memcpy(out.data(), file.data(), file.size());
  if (!data.empty()) std::memcpy(out.data() + file.size(), data.data(), data.size());
  return out;
}

std::vector<std::byte> decode(const std::vector<std::byte>& file, ArrayInfo& info) {
  MemorySource source(file, kPath);
  std::vector<std::byte> scratch;
  const uint64_t offset = probe_npy(source, info, 1 << 20, scratch);
  std::vector<std::byte> out(info.bytes);
  decode_npy(source, info, offset, out, scratch);
  return out;
}

}  // namespace

TEST_CASE("npy: a C-order array of any version decodes to its bytes") {
  for (const int major : {1, 2, 3}) {
    CAPTURE(major);
    ArrayInfo info;
    const auto out = decode(npy("{'descr': '<i2', 'fortran_order': False, 'shape': (2, 3), }",
                                {1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0}, major),
                            info);
    CHECK(info.dtype == "<i2");
    CHECK(info.ndim == 2);
    CHECK(info.shape[0] == 2);
    CHECK(info.shape[1] == 3);
    CHECK(std::to_integer<int>(out[10]) == 6);
  }
}

TEST_CASE("npy: a Fortran-order array comes out in C order") {
  ArrayInfo info;
  // Column-major [[1, 2, 3], [4, 5, 6]] is stored 1 4 2 5 3 6.
  const auto out = decode(
      npy("{'descr': '|u1', 'fortran_order': True, 'shape': (2, 3), }", {1, 4, 2, 5, 3, 6}), info);
  for (int i = 0; i < 6; ++i) CHECK(std::to_integer<int>(out[i]) == i + 1);
}

TEST_CASE("npy: a scalar and an empty array have the right sizes") {
  ArrayInfo info;
  CHECK(decode(npy("{'descr': '<f8', 'fortran_order': False, 'shape': (), }",
                   std::vector<uint8_t>(8, 0)),
               info)
            .size() == 8);
  CHECK(info.ndim == 0);
  CHECK(decode(npy("{'shape': (0, 5), 'fortran_order': False, 'descr': '>f4'}", {}), info).empty());
}

TEST_CASE("npy: a header that lies about the data's size is a DecodeError") {
  ArrayInfo info;
  CHECK_THROWS_AS(decode(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (99, 10), }",
                             std::vector<uint8_t>(400, 0)),
                         info),
                  DecodeError);
  // A shape whose byte count overflows 64 bits.
  CHECK_THROWS_AS(
      decode(
          npy("{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", {}),
          info),
      DecodeError);
}

TEST_CASE("npy: malformed headers and other files are DecodeErrors") {
  ArrayInfo info;
  for (const char* dict : {"{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (1,), }",
                           "{'descr': '<i4', 'fortran_order': maybe, 'shape': (1,), }",
                           "{'descr': '<i4', 'shape': (1,), }",
                           "{'descr': 'O', 'fortran_order': False, 'shape': (1,), }",
                           "{'descr': '<i4', 'fortran_order': False, 'shape': (1,"}) {
    CAPTURE(dict);
    CHECK_THROWS_AS(decode(npy(dict, {0, 0, 0, 0}), info), DecodeError);
  }
  std::vector<std::byte> text(20, std::byte{'x'});
  CHECK_THROWS_AS(decode(text, info), DecodeError);
  auto cut = npy("{'descr': '<i4', 'fortran_order': False, 'shape': (1,), }", {0, 0, 0, 0});
  cut.resize(30);
  CHECK_THROWS_AS(decode(cut, info), DecodeError);
}

TEST_CASE("npy: fortran_to_c transposes three dimensions") {
  ArrayInfo info;
  info.dtype = "<u2";
  info.ndim = 3;
  info.shape = {2, 3, 4};
  finish_array_info(info, 1 << 20, kPath);
  std::vector<uint16_t> f(24), c(24);
  // Element (i, j, k) holds 100 i + 10 j + k; Fortran offset i + 2 j + 6 k.
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k)
        f[i + 2 * j + 6 * k] = static_cast<uint16_t>(100 * i + 10 * j + k);
  fortran_to_c(reinterpret_cast<const std::byte*>(f.data()), reinterpret_cast<std::byte*>(c.data()),
               info);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) REQUIRE(c[(i * 3 + j) * 4 + k] == 100 * i + 10 * j + k);
}

TEST_CASE(
    "npy: every single-byte change or truncation decodes or is a DecodeError, never a crash") {
  const auto good = npy("{'descr': '<i2', 'fortran_order': True, 'shape': (2, 3), }",
                        {1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0});
  for (size_t at = 0; at < good.size(); ++at) {
    for (const uint8_t mask : {uint8_t{0x01}, uint8_t{0x10}, uint8_t{0xFF}}) {
      auto bad = good;
      bad[at] ^= std::byte{mask};
      ArrayInfo info;
      try {
        decode(bad, info);
      } catch (const DecodeError&) {
      }
    }
    ArrayInfo info;
    CHECK_THROWS_AS(
        decode(std::vector<std::byte>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(at)),
               info),
        DecodeError);
  }
}

namespace {

// A (2, 3, 4) uint16 array whose element (i, j, k) holds 100 i + 10 j + k, in C or Fortran order,
// and the slice of it along `axis` at `index`, by its element values.
struct Cube {
  ArrayInfo info;
  std::vector<uint16_t> data;
  explicit Cube(bool fortran) : data(24) {
    info.dtype = "<u2";
    info.ndim = 3;
    info.shape = {2, 3, 4};
    info.fortran = fortran;
    finish_array_info(info, 1 << 20, kPath);
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j)
        for (int k = 0; k < 4; ++k)
          data[fortran ? i + 2 * j + 6 * k : (i * 3 + j) * 4 + k] =
              static_cast<uint16_t>(100 * i + 10 * j + k);
  }
  std::vector<uint16_t> expected(uint32_t axis, int index) const {
    std::vector<uint16_t> out;
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j)
        for (int k = 0; k < 4; ++k)
          if ((axis == 0 ? i : axis == 1 ? j : k) == index)
            out.push_back(static_cast<uint16_t>(100 * i + 10 * j + k));
    return out;
  }
};

}  // namespace

TEST_CASE("npy: a slice along any axis of a C or Fortran array is its elements in C order") {
  for (const bool fortran : {false, true}) {
    const Cube cube(fortran);
    // Behind a 16-byte header, from a file and from memory.
    std::vector<std::byte> file(16 + cube.info.bytes);
    std::memcpy(file.data() + 16, cube.data.data(), cube.info.bytes);
    prestage::test::TempDir dir;
    const std::string path = (dir / "cube.bin").string();
    const auto* first = reinterpret_cast<const unsigned char*>(file.data());
    prestage::test::write_file(path, std::vector<unsigned char>(first, first + file.size()));
    for (uint32_t axis = 0; axis < 3; ++axis) {
      const ArrayInfo slice = slice_info(cube.info, axis, 1 << 20, kPath);
      CHECK(slice.ndim == 2);
      for (int index = 0; index < static_cast<int>(cube.info.shape[axis]); ++index) {
        const auto want = cube.expected(axis, index);
        REQUIRE(slice.bytes == want.size() * 2);
        std::vector<uint16_t> got(want.size());
        std::vector<std::byte> window;
        read_slice(MemorySource(file, kPath), 16, cube.info, axis, static_cast<uint64_t>(index),
                   std::as_writable_bytes(std::span(got)), window);
        CHECK(got == want);
        std::fill(got.begin(), got.end(), 0);
        read_slice(FileSource(FileRef(path), 0, file.size(), kPath), 16, cube.info, axis,
                   static_cast<uint64_t>(index), std::as_writable_bytes(std::span(got)), window);
        CHECK(got == want);
      }
    }
  }
}

TEST_CASE("npy: axes resolve from the end, and a slice past the data is a DecodeError") {
  CHECK(resolve_axis(-1, 3) == 2u);
  CHECK(resolve_axis(-3, 3) == 0u);
  CHECK(!resolve_axis(3, 3));
  CHECK(!resolve_axis(-4, 3));
  CHECK(!resolve_axis(0, 0));
  const Cube cube(false);
  std::vector<std::byte> cut(16 + cube.info.bytes - 2);
  std::vector<uint16_t> got(6);
  std::vector<std::byte> window;
  CHECK_THROWS_AS(read_slice(MemorySource(cut, kPath), 16, cube.info, 2, 3,
                             std::as_writable_bytes(std::span(got)), window),
                  DecodeError);
}
