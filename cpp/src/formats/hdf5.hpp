// HDF5, for the catalog and stage 3: samples are slices of a dataset along one axis (rows: axis
// 0). The only file that includes hdf5.h is hdf5.cpp. Debian's HDF5 is built without thread
// safety, so every HDF5 call of the process goes through one mutex there; open files and datasets
// are cached (at most kMaxOpen), so a row costs one H5Dread under the lock.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "formats/array.hpp"
#include "util/file_io.hpp"

namespace prestage::detail {

struct Hdf5Dataset {
  uint64_t rows = 0;  // slices along the axis asked for
  ArrayInfo row;      // the type and shape of one slice (the other dims of the dataset), C order
  uint32_t axis = 0;  // the axis, resolved (0..rank-1)
};

// Every function is thread-safe (serialised) and throws DecodeError naming `path` (the catalog's
// name of the file; `file` is the copy read, staged or source, opened as FileRef says).
namespace hdf5 {

// Describes `dataset` sliced along `axis` (negative: from the last): slices and one slice's type
// and shape. Only integer and floating-point datasets of rank >= 1 are accepted; a dataset without
// that axis, or one slice over `max_bytes`, is refused.
Hdf5Dataset describe(const FileRef& file, const std::string& dataset, int64_t axis,
                     uint64_t max_bytes, const std::string& path);

// Reads slice `row` along `axis` of `dataset` into `out` (info.bytes bytes), little-endian, as
// `info` (from describe) says.
void read_row(const FileRef& file, const std::string& dataset, int64_t axis, uint64_t row,
              const ArrayInfo& info, std::span<std::byte> out, const std::string& path);

// As above, from the file's bytes in memory (`image`: a whole copy the tiers delivered, checked
// against its record), through HDF5's core driver; each call copies the image.
Hdf5Dataset describe(std::span<const std::byte> image, const std::string& dataset, int64_t axis,
                     uint64_t max_bytes, const std::string& path);
void read_row(std::span<const std::byte> image, const std::string& dataset, int64_t axis,
              uint64_t row, const ArrayInfo& info, std::span<std::byte> out,
              const std::string& path);

// A 1-D integer dataset, converted to int64.
std::vector<int64_t> read_labels(const FileRef& file, const std::string& dataset,
                                 const std::string& path);

// Closes every cached file (tests; files a loader held open).
void close_all();

}  // namespace hdf5
}  // namespace prestage::detail
