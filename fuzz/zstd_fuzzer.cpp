// zstd frames: ZstdDecoder::decompress (output bounded by max_bytes), decompress_prefix and
// decompress_into (skip, then exactly out.size() bytes). Input: one or more zstd frames.
//
// Besides "no crash", the three entry points must agree: when decompress succeeds, the prefix is
// the start of its output, decompress_into of any split of it returns the same bytes, and
// decompress_into of a size one byte off fails.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "decode/zstd.hpp"
#include "fuzz_util.hpp"
#include "prestage/error.hpp"

namespace {

using prestage::fuzz::harness_check;

constexpr uint64_t kMaxBytes = uint64_t{1} << 20;  // the harness's max_sample_bytes
constexpr size_t kPrefix = 300;                    // bytes decompress_prefix asks for

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "fuzz.zst";
  static prestage::detail::ZstdDecoder decoder;  // one per thread, reused
  static std::vector<std::byte> whole;
  static std::vector<std::byte> part;
  const auto in = prestage::fuzz::as_bytes(data, size);

  std::vector<std::byte> expected;
  bool complete = false;
  try {
    const auto got = decoder.decompress(in, whole, kMaxBytes, path);
    harness_check(got.size() <= kMaxBytes, "decompress: output over max_bytes");
    expected.assign(got.begin(), got.end());
    complete = true;
  } catch (const prestage::Error&) {
  }

  try {
    std::byte prefix[kPrefix];
    const size_t n = decoder.decompress_prefix(in, prefix, path);
    harness_check(n <= kPrefix, "decompress_prefix: wrote past its output");
    if (complete) {
      harness_check(n == std::min(kPrefix, expected.size()) &&
                        (n == 0 || std::memcmp(prefix, expected.data(), n) == 0),
                    "decompress_prefix disagrees with decompress");
    }
  } catch (const prestage::Error&) {
    // A frame that decompress accepted has a readable start.
    harness_check(!complete, "decompress_prefix failed on a frame that decompress accepted");
  }

  if (complete) {
    const size_t total = expected.size();
    const size_t skip = total / 3;
    part.resize(total - skip);
    try {
      decoder.decompress_into(in, skip, part, path);
      harness_check(
          part.empty() || std::memcmp(part.data(), expected.data() + skip, part.size()) == 0,
          "decompress_into disagrees with decompress");
    } catch (const prestage::Error&) {
      harness_check(false, "decompress_into failed on a frame that decompress accepted");
    }
    // One byte more than the frame holds, or one fewer, is refused.
    bool refused = false;
    part.resize(total - skip + 1);
    try {
      decoder.decompress_into(in, skip, part, path);
    } catch (const prestage::Error&) {
      refused = true;
    }
    harness_check(refused, "decompress_into accepted an output larger than the frame");
    if (total > skip) {
      refused = false;
      part.resize(total - skip - 1);
      try {
        decoder.decompress_into(in, skip, part, path);
      } catch (const prestage::Error&) {
        refused = true;
      }
      harness_check(refused, "decompress_into accepted an output smaller than the frame");
    }
  } else {
    // Whatever the input, a bounded read of it either fails cleanly or fills its output.
    part.resize(size % 512);
    try {
      decoder.decompress_into(in, size % 97, part, path);
    } catch (const prestage::Error&) {
    }
  }
  return 0;
}
