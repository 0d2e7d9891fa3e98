// Stage 3: what the array codecs (npy, npz, HDF5) share: the description of one decoded array, and
// the byte source a sample is read from (a file range, read lazily, or bytes already in memory).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "util/file_io.hpp"

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

// Random access to one sample's bytes. Not thread-safe; one per call site.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual uint64_t size() const = 0;
  // Reads out.size() bytes at `offset`; the range must lie inside size() (DecodeError otherwise).
  virtual void read(uint64_t offset, std::span<std::byte> out) const = 0;
  // All the bytes when they are already in memory, else an empty span.
  virtual std::span<const std::byte> memory() const { return {}; }
  virtual const std::string& path() const = 0;
};

class MemorySource final : public ByteSource {
 public:
  MemorySource(std::span<const std::byte> bytes, const std::string& path)
      : bytes_(bytes), path_(path) {}
  uint64_t size() const override { return bytes_.size(); }
  void read(uint64_t offset, std::span<std::byte> out) const override;
  std::span<const std::byte> memory() const override { return bytes_; }
  const std::string& path() const override { return path_; }

 private:
  std::span<const std::byte> bytes_;
  const std::string& path_;
};

// `length` bytes at `offset` of the file `file` (Catalog::kWholeFile: all of it), opened at the
// first look (size() or read()) and held open for every read after it: a sample's headers and
// data cost one open. Errors name `path` (the catalog's source path, whichever copy is read).
class FileSource final : public ByteSource {
 public:
  FileSource(const FileRef& file, uint64_t offset, uint64_t length, const std::string& path)
      : file_(file), offset_(offset), length_(length), path_(path) {}
  uint64_t size() const override;
  void read(uint64_t offset, std::span<std::byte> out) const override;
  const std::string& path() const override { return path_; }

 private:
  const OpenFile& open() const;
  FileRef file_;
  uint64_t offset_;
  mutable uint64_t length_;
  const std::string& path_;
  mutable std::optional<OpenFile> open_;
};

// The bytes of `source` from `offset` to the end (or `length` of them) as one span: `source`'s own
// memory when it has some, else read into `buffer` (grown, never shrunk).
std::span<const std::byte> read_span(const ByteSource& source, uint64_t offset, uint64_t length,
                                     std::vector<std::byte>& buffer);

// The first bytes of `source` (up to buffer's 8), which tell its format (.npy, zip, zstd), read
// into `buffer`.
std::span<const std::byte> read_magic(const ByteSource& source, std::array<std::byte, 8>& buffer);

// Writes slice `index` along `axis` of the array `whole` (laid out as whole.fortran says) whose
// data start at byte `data_offset` of `source` into `out` (C order, slice_info's bytes). The
// slice's contiguous runs are read one by one when they are large (or the slice is one run), else
// the span the slice covers is read at once into `window` (up to kMaxSliceWindow) and gathered.
inline constexpr uint64_t kMaxSliceWindow = uint64_t{64} << 20;
void read_slice(const ByteSource& source, uint64_t data_offset, const ArrayInfo& whole,
                uint32_t axis, uint64_t index, std::span<std::byte> out,
                std::vector<std::byte>& window);

}  // namespace prestage::detail
