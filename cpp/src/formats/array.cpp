#include "formats/array.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "prestage/error.hpp"
#include "util/file_io.hpp"

namespace prestage::detail {

bool ArrayInfo::same_layout(const ArrayInfo& other) const {
  if (dtype != other.dtype || ndim != other.ndim) return false;
  for (uint32_t d = 0; d < ndim; ++d) {
    if (shape[d] != other.shape[d]) return false;
  }
  return true;
}

size_t dtype_item_size(std::string_view t, std::string& why) {
  why.clear();
  if (t.size() < 3 || t.size() > 8) {
    why = "expected a simple type string such as '<f4'";
  } else if (t[0] != '<' && t[0] != '>' && t[0] != '|' && t[0] != '=') {
    why = "unknown byte order";
  } else if (std::string_view("biufcmM").find(t[1]) == std::string_view::npos) {
    why = "only bool, integer, float, complex and datetime types are supported";
  }
  if (!why.empty()) return 0;
  uint64_t size = 0;
  for (size_t i = 2; i < t.size() && size <= 64; ++i) {
    size = t[i] < '0' || t[i] > '9' ? 65 : size * 10 + static_cast<uint64_t>(t[i] - '0');
  }
  if (size == 0 || size > 64) {
    why = "bad item size";
    return 0;
  }
  return static_cast<size_t>(size);
}

void finish_array_info(ArrayInfo& info, uint64_t max_bytes, const std::string& path) {
  std::string why;
  const size_t size = dtype_item_size(info.dtype, why);
  if (size == 0) throw DecodeError(path, "unsupported dtype '" + info.dtype + "': " + why);
  info.item_size = size;
  if (info.ndim > kMaxDims) {
    throw DecodeError(path, "array has " + std::to_string(info.ndim) + " dimensions, more than " +
                                std::to_string(kMaxDims));
  }
  uint64_t bytes = size;
  for (uint32_t d = 0; d < info.ndim; ++d) {
    const uint64_t n = info.shape[d];
    if (n != 0 && bytes > max_bytes / n) {
      throw DecodeError(path, "array header claims more than max_sample_bytes (" +
                                  std::to_string(max_bytes) + " bytes)");
    }
    bytes *= n;
  }
  if (bytes > max_bytes) {
    throw DecodeError(path, "array of " + std::to_string(bytes) +
                                " bytes exceeds max_sample_bytes (" + std::to_string(max_bytes) +
                                ")");
  }
  info.bytes = bytes;
}

void fortran_to_c(const std::byte* src, std::byte* dst, const ArrayInfo& info) {
  if (info.bytes == 0) return;
  const size_t item = info.item_size;
  const uint32_t n = info.ndim;
  if (n <= 1) {
    std::memcpy(dst, src, info.bytes);
    return;
  }
  // Fortran strides, in elements: axis 0 is contiguous.
  std::array<uint64_t, kMaxDims> stride{};
  stride[0] = 1;
  for (uint32_t d = 1; d < n; ++d) stride[d] = stride[d - 1] * info.shape[d - 1];
  // Walk the destination in C order; the last axis is the inner loop.
  std::array<uint64_t, kMaxDims> index{};
  const uint64_t inner = info.shape[n - 1];
  const uint64_t inner_stride = stride[n - 1] * item;
  const uint64_t rows = info.bytes / item / inner;
  uint64_t base = 0;  // source element offset of the current row's first element
  for (uint64_t row = 0; row < rows; ++row) {
    const std::byte* s = src + base * item;
    for (uint64_t k = 0; k < inner; ++k, s += inner_stride, dst += item) std::memcpy(dst, s, item);
    // Odometer over axes n-2 .. 0.
    for (int d = static_cast<int>(n) - 2; d >= 0; --d) {
      if (++index[d] < info.shape[d]) {
        base += stride[d];
        break;
      }
      base -= stride[d] * (index[d] - 1);
      index[d] = 0;
    }
  }
}

std::optional<uint32_t> resolve_axis(int64_t axis, uint32_t ndim) {
  const int64_t n = ndim;
  if (axis < -n || axis >= n) return std::nullopt;
  return static_cast<uint32_t>(axis < 0 ? axis + n : axis);
}

ArrayInfo slice_info(const ArrayInfo& whole, uint32_t axis, uint64_t max_bytes,
                     const std::string& path) {
  ArrayInfo slice;
  slice.dtype = whole.dtype;
  for (uint32_t d = 0; d < whole.ndim; ++d) {
    if (d != axis) slice.shape[slice.ndim++] = whole.shape[d];
  }
  finish_array_info(slice, max_bytes, path);
  return slice;
}

void read_slice(const ByteSource& source, uint64_t data_offset, const ArrayInfo& whole,
                uint32_t axis, uint64_t index, std::span<std::byte> out,
                std::vector<std::byte>& window) {
  if (out.empty()) return;
  const uint32_t n = whole.ndim;
  const uint64_t item = whole.item_size;
  // Byte strides of the array as stored (whole.bytes was overflow-checked, and so are they).
  std::array<uint64_t, kMaxDims> stride{};
  if (whole.fortran) {
    stride[0] = item;
    for (uint32_t d = 1; d < n; ++d) stride[d] = stride[d - 1] * whole.shape[d - 1];
  } else {
    stride[n - 1] = item;
    for (uint32_t d = n - 1; d-- > 0;) stride[d] = stride[d + 1] * whole.shape[d + 1];
  }
  // The slice's dimensions, outermost first, with their strides in the source; the innermost ones
  // that are contiguous there make one run.
  std::array<uint64_t, kMaxDims> dim{}, step{};
  uint32_t m = 0;
  for (uint32_t d = 0; d < n; ++d) {
    if (d != axis) dim[m] = whole.shape[d], step[m] = stride[d], ++m;
  }
  uint64_t run = item;
  while (m > 0 && step[m - 1] == run) run *= dim[--m];
  uint64_t span = run;
  for (uint32_t k = 0; k < m; ++k) span += (dim[k] - 1) * step[k];
  const uint64_t start = data_offset + index * stride[axis];
  const uint64_t runs = out.size() / run;

  constexpr uint64_t kLargeRun = 64 << 10;
  const std::byte* from = nullptr;  // the covered span, in memory
  if (!source.memory().empty() || (runs > 1 && run < kLargeRun && span <= kMaxSliceWindow)) {
    from = read_span(source, start, span, window).data();
  }
  std::array<uint64_t, kMaxDims> at{};
  uint64_t offset = 0;  // of the current run, from `start`
  std::byte* to = out.data();
  for (uint64_t r = 0; r < runs; ++r, to += run) {
    if (from != nullptr) {
      std::memcpy(to, from + offset, run);
    } else {
      source.read(start + offset, std::span(to, run));
    }
    // Odometer over the slice's outer dimensions, the last fastest.
    for (uint32_t k = m; k-- > 0;) {
      if (++at[k] < dim[k]) {
        offset += step[k];
        break;
      }
      offset -= step[k] * (at[k] - 1);
      at[k] = 0;
    }
  }
}

}  // namespace prestage::detail
