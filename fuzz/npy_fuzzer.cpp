// The .npy codec: parse_npy_header on every prefix length that matters, probe_npy and decode_npy
// (C and Fortran order) on the whole input, and read_slice of the first and last slices along the
// first and last axes. Input: a .npy file.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "formats/array.hpp"
#include "formats/npy.hpp"
#include "fuzz_util.hpp"
#include "prestage/error.hpp"

namespace {

using prestage::detail::ArrayInfo;
using prestage::fuzz::harness_check;

constexpr uint64_t kMaxBytes = uint64_t{1} << 24;  // the harness's max_sample_bytes

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "fuzz.npy";
  static std::vector<std::byte> scratch;
  static std::vector<std::byte> out;
  const auto bytes = prestage::fuzz::as_bytes(data, size);

  // The header parser alone, fed the prefix it asks for (as a zstd-compressed .npy is read).
  try {
    size_t have = std::min<size_t>(size, 16);
    for (int round = 0; round < 4; ++round) {
      ArrayInfo info;
      uint64_t needed = 0;
      const uint64_t offset =
          prestage::detail::parse_npy_header(bytes.first(have), info, kMaxBytes, path, &needed);
      if (offset != 0) {
        harness_check(offset <= have, "parse_npy_header: data offset past the prefix it was given");
        harness_check(info.bytes <= kMaxBytes, "parse_npy_header: array over max_bytes");
        break;
      }
      harness_check(needed > have, "parse_npy_header: asks for no more bytes than it had");
      if (needed > size) break;
      have = static_cast<size_t>(needed);
    }
  } catch (const prestage::Error&) {
  }

  try {
    const prestage::detail::MemorySource source(bytes, path);
    ArrayInfo info;
    const uint64_t offset = prestage::detail::probe_npy(source, info, kMaxBytes, scratch);
    harness_check(offset <= size && size - offset == info.bytes,
                  "probe_npy: accepted data of the wrong length");
    out.resize(static_cast<size_t>(info.bytes));
    prestage::detail::decode_npy(source, info, offset, out, scratch);
    for (const int64_t axis : {int64_t{0}, int64_t{-1}}) {
      const auto resolved = prestage::detail::resolve_axis(axis, info.ndim);
      if (!resolved || info.shape[*resolved] == 0) continue;
      const ArrayInfo slice = prestage::detail::slice_info(info, *resolved, kMaxBytes, path);
      harness_check(slice.bytes * info.shape[*resolved] == info.bytes,
                    "slice_info: slices do not add up");
      out.resize(static_cast<size_t>(slice.bytes));
      for (const uint64_t index : {uint64_t{0}, info.shape[*resolved] - 1}) {
        prestage::detail::read_slice(source, offset, info, *resolved, index, out, scratch);
      }
    }
  } catch (const prestage::Error&) {
  }
  return 0;
}
