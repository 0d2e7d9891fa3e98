// The loader over each format: arrays land in the batch buffer with their dtype and shapes,
// whatever the number of reader threads.
#include <doctest/doctest.h>
#include <hdf5.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "prestage/prestage.hpp"
#include "test_util.hpp"

using prestage::Catalog;
using prestage::DecodeMode;
using prestage::Loader;
using prestage::LoaderOptions;
using prestage::test::TempDir;

namespace {

// A .npy file of int16 values base, base + 1, ... of the given shape.
void write_npy(const std::filesystem::path& path, const std::string& shape, size_t count,
               int16_t base) {
  std::string data;
  for (size_t i = 0; i < count; ++i) {
    const int16_t v = static_cast<int16_t>(base + i);
    data.append(reinterpret_cast<const char*>(&v), 2);
  }
  prestage::test::write_npy(path, "<i2", shape, data);
}

// sample catalog index -> its decoded bytes and shape
std::map<int64_t, std::pair<std::vector<std::byte>, std::vector<uint64_t>>> run(Loader& loader,
                                                                                bool* ragged) {
  std::map<int64_t, std::pair<std::vector<std::byte>, std::vector<uint64_t>>> out;
  loader.start_epoch(0);
  while (auto batch = loader.next()) {
    *ragged = *ragged || batch->ragged();
    for (size_t i = 0; i < batch->size(); ++i) {
      const auto data =
          batch->data().subspan(batch->offsets()[i], batch->offsets()[i + 1] - batch->offsets()[i]);
      const auto shape = batch->sample_shape(i);
      out[batch->indices()[i]] = {{data.begin(), data.end()}, {shape.begin(), shape.end()}};
    }
  }
  return out;
}

}  // namespace

TEST_CASE(
    "formats: npy samples of two shapes give ragged batches, the same for 1, 2 and 4 readers") {
  TempDir dir;
  std::vector<std::string> paths;
  for (int i = 0; i < 10; ++i) {
    const bool big = i % 3 == 0;
    paths.push_back("c/" + std::to_string(i) + ".npy");
    write_npy(dir / paths.back(), big ? "(3, 4)" : "(2, 2)", big ? 12 : 4,
              static_cast<int16_t>(i * 100));
  }
  const Catalog cat = Catalog::from_paths(dir.path(), paths);
  std::map<int64_t, std::pair<std::vector<std::byte>, std::vector<uint64_t>>> first;
  for (const uint64_t readers : {1, 2, 4}) {
    CAPTURE(readers);
    LoaderOptions o;
    o.batch_size = 4;
    o.decode = DecodeMode::kNpy;
    o.readers = readers;
    Loader loader(cat, o);
    bool ragged = false;
    const auto got = run(loader, &ragged);
    CHECK(ragged);
    REQUIRE(got.size() == 10);
    for (const auto& [i, sample] : got) {
      const bool big = i % 3 == 0;
      CHECK(sample.second == (big ? std::vector<uint64_t>{3, 4} : std::vector<uint64_t>{2, 2}));
      int16_t v;
      std::memcpy(&v, sample.first.data() + sample.first.size() - 2, 2);
      CHECK(v == i * 100 + (big ? 11 : 3));
    }
    if (first.empty()) first = got;
    CHECK(got == first);
  }
}

TEST_CASE("formats: HDF5 rows across files, in order, with 1, 2 and 4 readers") {
  TempDir dir;
  std::vector<std::filesystem::path> files;
  int64_t value = 0;
  for (int f = 0; f < 3; ++f) {
    files.push_back(dir / ("part" + std::to_string(f) + ".h5"));
    const hid_t file = H5Fcreate(files.back().c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    const hsize_t dims[2] = {static_cast<hsize_t>(f + 2), 5};
    std::vector<int64_t> rows(dims[0] * 5);
    for (auto& r : rows) r = value++;
    const hid_t space = H5Screate_simple(2, dims, nullptr);
    const hid_t d =
        H5Dcreate2(file, "x", H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    REQUIRE(H5Dwrite(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows.data()) >= 0);
    H5Dclose(d);
    H5Sclose(space);
    H5Fclose(file);
  }
  const Catalog cat = Catalog::from_hdf5(files, "x");
  REQUIRE(cat.size() == 9);
  for (const uint64_t readers : {1, 2, 4}) {
    CAPTURE(readers);
    LoaderOptions o;
    o.batch_size = 4;
    o.decode = DecodeMode::kHdf5;
    o.readers = readers;
    Loader loader(cat, o);
    bool ragged = false;
    const auto got = run(loader, &ragged);
    CHECK_FALSE(ragged);
    REQUIRE(got.size() == 9);
    for (const auto& [i, sample] : got) {
      int64_t row[5];
      REQUIRE(sample.first.size() == sizeof(row));
      std::memcpy(row, sample.first.data(), sizeof(row));
      for (int k = 0; k < 5; ++k) CHECK(row[k] == i * 5 + k);
    }
  }
  LoaderOptions jpeg;
  CHECK_THROWS_AS(Loader(cat, jpeg), prestage::ConfigError);  // an HDF5 catalog needs decode=hdf5
}

TEST_CASE("formats: raw samples typed by raw_dtype and raw_shape (-1 inferred), 1, 2, 4 readers") {
  TempDir dir;
  std::vector<std::string> paths;
  for (int i = 0; i < 6; ++i) {
    // Big-endian int16 values i * 10, i * 10 + 1, ...: 2 * (i % 2 + 1) rows of 3.
    std::string data;
    for (int k = 0; k < 6 * (i % 2 + 1); ++k) {
      const int v = i * 10 + k;
      data += static_cast<char>(v >> 8);
      data += static_cast<char>(v & 0xFF);
    }
    paths.push_back(std::to_string(i) + ".bin");
    prestage::test::write_file(dir / paths.back(),
                               std::vector<unsigned char>(data.begin(), data.end()));
  }
  const Catalog cat = Catalog::from_paths(dir.path(), paths);
  for (const uint64_t readers : {1, 2, 4}) {
    CAPTURE(readers);
    LoaderOptions o;
    o.batch_size = 3;
    o.decode = DecodeMode::kRaw;
    o.readers = readers;
    o.raw_dtype = ">i2";
    o.raw_shape = std::vector<int64_t>{-1, 3};
    Loader loader(cat, o);
    loader.start_epoch(0);
    size_t seen = 0;
    while (auto batch = loader.next()) {
      CHECK(batch->dtype() == ">i2");
      for (size_t i = 0; i < batch->size(); ++i, ++seen) {
        const int64_t id = batch->indices()[i];
        const auto shape = batch->sample_shape(i);
        CHECK(std::vector<uint64_t>(shape.begin(), shape.end()) ==
              std::vector<uint64_t>{static_cast<uint64_t>(2 * (id % 2 + 1)), 3});
        const auto* p =
            reinterpret_cast<const unsigned char*>(batch->data().data()) + batch->offsets()[i];
        CHECK(((p[2] << 8) | p[3]) == id * 10 + 1);  // the second value, stored big-endian
      }
    }
    CHECK(seen == 6);
  }
  // Three rows of 3 fit (-1, 3) but not (4, -1) nor (2, 3).
  for (const auto& shape : {std::vector<int64_t>{4, -1}, std::vector<int64_t>{2, 3}}) {
    LoaderOptions o;
    o.batch_size = 6;
    o.decode = DecodeMode::kRaw;
    o.raw_dtype = ">i2";
    o.raw_shape = shape;
    Loader loader(cat, o);
    loader.start_epoch(0);
    CHECK_THROWS_AS(loader.next(), prestage::DecodeError);
  }
  LoaderOptions bad;
  bad.decode = DecodeMode::kRaw;
  bad.raw_dtype = "<x4";
  CHECK_THROWS_AS(bad.validate(), prestage::ConfigError);
  bad.raw_dtype = "<f4";
  bad.raw_shape = std::vector<int64_t>{-1, 2, -1};
  CHECK_THROWS_AS(bad.validate(), prestage::ConfigError);
  bad.raw_shape = std::vector<int64_t>{-2};
  CHECK_THROWS_AS(bad.validate(), prestage::ConfigError);
  bad.raw_dtype.clear();
  bad.raw_shape = std::vector<int64_t>{2};
  CHECK_THROWS_AS(bad.validate(), prestage::ConfigError);  // a shape without a dtype
  bad.raw_shape.reset();
  bad.validate();
}
