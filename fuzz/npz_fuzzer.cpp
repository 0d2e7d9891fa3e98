// The .npz codec: NpzDecoder::probe (end-of-directory search, zip64 records, central directory,
// local header, the member's .npy header, inflated just enough) and decode (stored and deflated
// members, Fortran order, CRC). Input: a zip archive. Members are looked up both ways the loader
// does: the archive's only member (array_name empty) and member "x".
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "formats/array.hpp"
#include "formats/npz.hpp"
#include "fuzz_util.hpp"
#include "prestage/error.hpp"

namespace {

constexpr uint64_t kMaxBytes = uint64_t{1} << 24;  // the harness's max_sample_bytes

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "fuzz.npz";
  static prestage::detail::NpzDecoder decoder;  // one per thread, reused
  static std::vector<std::byte> out;
  const prestage::detail::MemorySource source(prestage::fuzz::as_bytes(data, size), path);

  for (const char* name : {"", "x"}) {
    try {
      prestage::detail::ArrayInfo info;
      const prestage::detail::NpzMember member = decoder.probe(source, name, info, kMaxBytes);
      prestage::fuzz::harness_check(info.bytes <= kMaxBytes,
                                    "NpzDecoder::probe: array over max_bytes");
      prestage::fuzz::harness_check(
          member.data_start <= size && member.compressed <= size - member.data_start,
          "NpzDecoder::probe: member data outside the archive");
      out.resize(static_cast<size_t>(info.bytes));
      decoder.decode(source, member, info, out);
    } catch (const prestage::Error&) {
    }
  }
  return 0;
}
