// TFRecord framing: unframe_record, scan_tfrecord over a file, and Catalog::from_tfrecord (the
// index a TFRecord catalog is built from: every record's framing, its "image" bytes feature and its
// "label" int64 feature), raising at damage and skipping it.
//
// Input: one flag byte, then the file. Flag bit 0 set: every record's two CRCs are rewritten to be
// correct before the file is read (fuzz::fix_tfrecord_crcs), so that mutations of the lengths and
// the payload get past the CRC checks; clear: the bytes are read as they are.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "formats/tfrecord.hpp"
#include "fuzz_util.hpp"
#include "prestage/catalog.hpp"
#include "prestage/error.hpp"

namespace {

using prestage::fuzz::harness_check;

constexpr uint64_t kMaxRecord = uint64_t{1} << 20;  // scan_tfrecord's max_record here

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const std::string file = (prestage::fuzz::scratch_dir() / "fuzz.tfrecord").string();
  std::vector<std::byte> bytes(reinterpret_cast<const std::byte*>(data + 1),
                               reinterpret_cast<const std::byte*>(data + size));
  if (data[0] & 1) prestage::fuzz::fix_tfrecord_crcs(bytes);

  try {
    const auto record = prestage::detail::unframe_record(bytes, file);
    harness_check(record.size() + prestage::detail::kFramingBytes == bytes.size(),
                  "unframe_record: data and framing do not add up to the record");
  } catch (const prestage::Error&) {
  }

  prestage::fuzz::write_file(file, bytes);
  try {
    uint64_t next = 0;
    prestage::detail::scan_tfrecord(
        file, file, kMaxRecord,
        [&](uint64_t offset, uint64_t framed, std::span<const std::byte> record) {
          harness_check(offset == next &&
                            framed == record.size() + prestage::detail::kFramingBytes &&
                            framed <= bytes.size() - offset,
                        "scan_tfrecord: records do not tile the file");
          next = offset + framed;
          try {
            std::span<const std::byte> value;
            int64_t label = 0;
            prestage::detail::example_bytes(record, "image", value, file);
            prestage::detail::example_int64(record, "label", label, file);
          } catch (const prestage::Error&) {
          }
        });
    harness_check(next == bytes.size(),
                  "scan_tfrecord: accepted a file with bytes after its records");
  } catch (const prestage::Error&) {
  }

  try {
    const auto catalog = prestage::Catalog::from_tfrecord({file}, "image", "label");
    uint64_t next = 0;
    for (size_t i = 0; i < catalog.size(); ++i) {
      const auto loc = catalog.locator(i);
      harness_check(loc.offset == next && loc.length <= bytes.size() - loc.offset,
                    "from_tfrecord: locators do not tile the file");
      next = loc.offset + loc.length;
    }
  } catch (const prestage::Error&) {
  }

  // Skipping damage: the good records and the damage entries are in file order, never overlap and
  // stay within the file; nothing is indexed after damage that loses the rest of the file.
  try {
    const auto catalog =
        prestage::Catalog::from_tfrecord({file}, "image", "label", prestage::OnError::kSkip);
    uint64_t next = 0;
    size_t d = 0;
    const auto& damage = catalog.damage();
    for (size_t i = 0; i < catalog.size(); ++i) {
      const auto loc = catalog.locator(i);
      while (d < damage.size() && damage[d].offset < loc.offset) {
        harness_check(!damage[d].rest_of_file && damage[d].offset >= next,
                      "from_tfrecord: a record indexed after the rest of the file was lost");
        next = damage[d].offset;
        ++d;
      }
      harness_check(loc.offset >= next && loc.length <= bytes.size() - loc.offset,
                    "from_tfrecord (skip): locators overlap or leave the file");
      next = loc.offset + loc.length;
    }
    for (; d < damage.size(); ++d) {
      harness_check(damage[d].offset >= next && damage[d].offset < bytes.size(),
                    "from_tfrecord (skip): damage out of order or past the file");
      next = damage[d].offset;
    }
  } catch (const prestage::Error&) {
  }
  return 0;
}
