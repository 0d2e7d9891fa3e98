// Array formats (npy, npz, HDF5) share this, for the catalog and for stage 3's codecs: the
// description of one array, and reads of one from a byte source (util/byte_source.hpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "util/byte_source.hpp"

namespace prestage::detail {

// NumPy allows 64 dimensions from 2.0 (32 before); no training sample comes close to 32.
inline constexpr size_t kMaxDims = 32;

// One array: element type, shape and memory order. `bytes` is item_size * product(shape), checked
// for overflow and against a limit when the description is made (see finish_array_info).
struct ArrayInfo {
  std::string dtype;     // NumPy array-interface type string: "<f4", "|u1", ">i8", "<c16", ...
  size_t item_size = 0;  // bytes per element
  uint32_t ndim = 0;
  std::array<uint64_t, kMaxDims> shape{};
  bool fortran = false;  // column-major in the source (decoded to C order)
  uint64_t bytes = 0;

  std::span<const uint64_t> dims() const { return std::span<const uint64_t>(shape).first(ndim); }
  bool same_layout(const ArrayInfo& other) const;  // dtype and shape equal
};

// The item size of `dtype`, a simple type string (byte order '<', '>', '|' or '=', kind in
// "biufcmM", item size); 0 if it is not one, with `why` saying what is wrong.
size_t dtype_item_size(std::string_view dtype, std::string& why);

// Checks `dtype` (a simple type string: byte order '<', '>', '|' or '=', kind in "biufcmM", item
// size) and sets item_size; computes bytes, refusing more than `max_bytes`. Throws DecodeError
// naming `path`.
void finish_array_info(ArrayInfo& info, uint64_t max_bytes, const std::string& path);

// Rewrites a column-major array as row-major. `src` and `dst` hold info.bytes bytes and must not
// overlap.
void fortran_to_c(const std::byte* src, std::byte* dst, const ArrayInfo& info);

// Samples that are slices of one array along an axis (Catalog::from_arrays, from_hdf5 with an
// axis). The axis as given (negative: from the last) in 0..ndim-1, or nothing if the array has no
// such axis.
std::optional<uint32_t> resolve_axis(int64_t axis, uint32_t ndim);

// One slice of `whole` along `axis`: its shape without that axis, C order; refused (DecodeError
// naming `path`) over `max_bytes`.
ArrayInfo slice_info(const ArrayInfo& whole, uint32_t axis, uint64_t max_bytes,
                     const std::string& path);

// Writes slice `index` along `axis` of the array `whole` (laid out as whole.fortran says) whose
// data start at byte `data_offset` of `source` into `out` (C order, slice_info's bytes). The
// slice's contiguous runs are read one by one when they are large (or the slice is one run), else
// the span the slice covers is read at once into `window` (up to kMaxSliceWindow) and gathered.
inline constexpr uint64_t kMaxSliceWindow = uint64_t{64} << 20;
void read_slice(const ByteSource& source, uint64_t data_offset, const ArrayInfo& whole,
                uint32_t axis, uint64_t index, std::span<std::byte> out,
                std::vector<std::byte>& window);

}  // namespace prestage::detail
