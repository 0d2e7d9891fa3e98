// Stage 3 HDF5 rows: type and shape description, row reads, labels, and refusal of unsupported
// types. The fixtures are written with the HDF5 C API (the library's own writer is the oracle).
#include "formats/hdf5.hpp"

#include <doctest/doctest.h>
#include <hdf5.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "prestage/error.hpp"
#include "test_util.hpp"
#include "util/file_io.hpp"

namespace {

using prestage::DecodeError;
using namespace prestage::detail;

template <typename T>
void write_dataset(const std::string& file, const char* name, hid_t file_type, hid_t memory_type,
                   const std::vector<hsize_t>& dims, const std::vector<T>& values,
                   bool create = false) {
  const hid_t f = create ? H5Fcreate(file.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT)
                         : H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  REQUIRE(f >= 0);
  const hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  const hid_t d = H5Dcreate2(f, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  REQUIRE(d >= 0);
  REQUIRE(H5Dwrite(d, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) >= 0);
  H5Dclose(d);
  H5Sclose(space);
  H5Fclose(f);
}

}  // namespace

TEST_CASE("hdf5: rows of a dataset are read as the library wrote them, big-endian included") {
  prestage::test::TempDir dir;
  const std::string file = (dir / "a.h5").string();
  std::vector<int32_t> values(5 * 2 * 3);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<int32_t>(i * 1000 - 7);
  write_dataset(file, "x", H5T_STD_I32BE, H5T_NATIVE_INT32, {5, 2, 3}, values, true);
  write_dataset(file, "labels", H5T_STD_I64LE, H5T_NATIVE_INT64, {5},
                std::vector<int64_t>{4, 3, 2, 1, 0});
  const Hdf5Dataset d = hdf5::describe(file, "x", 0, 1 << 20, file);
  CHECK(d.rows == 5);
  CHECK(d.row.dtype == "<i4");
  CHECK(d.row.ndim == 2);
  CHECK(d.row.bytes == 24);
  std::vector<int32_t> row(6);
  hdf5::read_row(file, "x", 0, 3, d.row, std::as_writable_bytes(std::span(row)), file);
  for (size_t i = 0; i < 6; ++i) CHECK(row[i] == values[18 + i]);
  CHECK(hdf5::read_labels(file, "labels", file) == std::vector<int64_t>{4, 3, 2, 1, 0});
  CHECK_THROWS_AS(
      hdf5::read_row(file, "x", 0, 5, d.row, std::as_writable_bytes(std::span(row)), file),
      DecodeError);
  hdf5::close_all();
}

TEST_CASE("hdf5: a file's bytes in memory are read as the file itself, and garbage is refused") {
  prestage::test::TempDir dir;
  const std::string file = (dir / "a.h5").string();
  std::vector<float> values(6 * 4 * 3);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f - 3;
  write_dataset(file, "x", H5T_IEEE_F32BE, H5T_NATIVE_FLOAT, {6, 4, 3}, values, true);
  std::vector<std::byte> image;
  read_file(FileRef(file), image);
  for (const int64_t axis : {0, 1, -1}) {
    const Hdf5Dataset on_disk = hdf5::describe(file, "x", axis, 1 << 20, file);
    const Hdf5Dataset in_memory = hdf5::describe(image, "x", axis, 1 << 20, file);
    CHECK(in_memory.rows == on_disk.rows);
    CHECK(in_memory.axis == on_disk.axis);
    CHECK(in_memory.row.same_layout(on_disk.row));
    std::vector<float> want(on_disk.row.bytes / sizeof(float)), got(want.size());
    for (uint64_t r = 0; r < on_disk.rows; ++r) {
      hdf5::read_row(file, "x", axis, r, on_disk.row, std::as_writable_bytes(std::span(want)),
                     file);
      hdf5::read_row(image, "x", axis, r, in_memory.row, std::as_writable_bytes(std::span(got)),
                     file);
      CHECK(got == want);
    }
  }
  std::vector<std::byte> garbage(image.size(), std::byte{0x5a});
  CHECK_THROWS_AS(hdf5::describe(garbage, "x", 0, 1 << 20, file), DecodeError);
  CHECK_THROWS_AS(hdf5::describe(image, "absent", 0, 1 << 20, file), DecodeError);
  hdf5::close_all();
}

TEST_CASE("hdf5: concurrent readers are serialised and all get their rows") {
  prestage::test::TempDir dir;
  const std::string file = (dir / "b.h5").string();
  std::vector<float> values(64 * 100);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  write_dataset(file, "x", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {64, 100}, values, true);
  const Hdf5Dataset d = hdf5::describe(file, "x", 0, 1 << 20, file);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<float> row(100);
      for (uint64_t r = static_cast<uint64_t>(t); r < 64; r += 4) {
        hdf5::read_row(file, "x", 0, r, d.row, std::as_writable_bytes(std::span(row)), file);
        ok[static_cast<size_t>(t)] +=
            row[0] == static_cast<float>(r * 100) && row[99] == static_cast<float>(r * 100 + 99);
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(ok == std::vector<int>{16, 16, 16, 16});
  hdf5::close_all();
}

TEST_CASE(
    "hdf5: strings, scalars, missing datasets and non-HDF5 files are DecodeErrors naming the "
    "file") {
  prestage::test::TempDir dir;
  const std::string file = (dir / "c.h5").string();
  const hid_t string_type = H5Tcopy(H5T_C_S1);
  H5Tset_size(string_type, 4);
  write_dataset(file, "names", string_type, string_type, {2},
                std::vector<char>{'a', 0, 0, 0, 'b', 0, 0, 0}, true);
  H5Tclose(string_type);
  write_dataset(file, "floats", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {3},
                std::vector<double>{1, 2, 3});
  for (const char* name : {"names", "missing"}) {
    CAPTURE(name);
    try {
      hdf5::describe(file, name, 0, 1 << 20, "shown/name.h5");
      FAIL("no exception");
    } catch (const DecodeError& e) {
      CHECK(e.path() == "shown/name.h5");
    }
  }
  CHECK_THROWS_AS(hdf5::read_labels(file, "floats", file), DecodeError);
  const std::string text = (dir / "text.h5").string();
  prestage::test::write_file(text, {'n', 'o', 't', ' ', 'h', 'd', 'f', '5'});
  CHECK_THROWS_AS(hdf5::describe(text, "x", 0, 1 << 20, text), DecodeError);
  hdf5::close_all();
}

TEST_CASE("hdf5: slices along another axis are the library's own hyperslabs") {
  prestage::test::TempDir dir;
  const std::string file = (dir / "axis.h5").string();
  // (4, 3, 5): element (i, j, k) holds 100 i + 10 j + k.
  std::vector<int16_t> values(4 * 3 * 5);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 5; ++k)
        values[static_cast<size_t>((i * 3 + j) * 5 + k)] =
            static_cast<int16_t>(100 * i + 10 * j + k);
  write_dataset(file, "x", H5T_STD_I16BE, H5T_NATIVE_INT16, {4, 3, 5}, values, true);
  for (const int64_t axis : {1, -1}) {
    const Hdf5Dataset d = hdf5::describe(file, "x", axis, 1 << 20, file);
    const uint32_t a = axis == 1 ? 1 : 2;
    CHECK(d.axis == a);
    CHECK(d.rows == (a == 1 ? 3u : 5u));
    CHECK(d.row.ndim == 2);
    for (uint64_t r = 0; r < d.rows; ++r) {
      std::vector<int16_t> got(d.row.bytes / 2), want;
      hdf5::read_row(file, "x", axis, r, d.row, std::as_writable_bytes(std::span(got)), file);
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 3; ++j)
          for (int k = 0; k < 5; ++k)
            if (static_cast<uint64_t>(a == 1 ? j : k) == r)
              want.push_back(static_cast<int16_t>(100 * i + 10 * j + k));
      CHECK(got == want);
    }
  }
  CHECK_THROWS_AS(hdf5::describe(file, "x", 3, 1 << 20, file), DecodeError);
  CHECK_THROWS_AS(hdf5::describe(file, "x", -4, 1 << 20, file), DecodeError);
  hdf5::close_all();
}
