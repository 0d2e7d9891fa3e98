// WebDataset tar shards: scan_tar over a file (ustar, GNU and pax headers, damage and the resync
// after it), then Catalog::from_webdataset raising at damage and skipping it, with a .cls and a
// JSON label.
//
// Input: one flag byte, then the shard. Flag bit 0 set: every block with the ustar magic gets a
// correct header checksum before the file is read, so that mutations of sizes, names and types get
// past the checksum; clear: the bytes are read as they are. Flag bit 1 set: the bytes up to the
// first NUL are a DALI index of the shard (wds2idx's .idx text), read by from_webdataset in place
// of a scan, and the shard follows the NUL.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "formats/tar.hpp"
#include "fuzz_util.hpp"
#include "prestage/catalog.hpp"
#include "prestage/error.hpp"

namespace {

using prestage::Catalog;
using prestage::fuzz::harness_check;

void fix_checksums(std::vector<std::byte>& bytes) {
  for (size_t at = 0; at + 512 <= bytes.size(); at += 512) {
    std::byte* h = bytes.data() + at;
    if (std::memcmp(h + 257, "ustar", 5) != 0) continue;
    std::memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (size_t i = 0; i < 512; ++i) sum += std::to_integer<unsigned>(h[i]);
    char field[8];
    std::snprintf(field, sizeof(field), "%06o", sum & 0777777);
    std::memcpy(h + 148, field, 7);
  }
}

void check_catalog(const Catalog& catalog, uint64_t size) {
  for (size_t i = 0; i < catalog.size(); ++i) {
    const auto loc = catalog.locator(i);
    harness_check(loc.file == 0 && loc.offset <= size && loc.length <= size - loc.offset,
                  "from_webdataset: a sample lies outside its shard");
  }
  for (const auto& d : catalog.damage()) {
    harness_check(d.offset <= size, "from_webdataset: damage past the end of the shard");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const std::string file = (prestage::fuzz::scratch_dir() / "fuzz.tar").string();
  static const std::string index_file = (prestage::fuzz::scratch_dir() / "fuzz.idx").string();
  const uint8_t* shard = data + 1;
  std::vector<std::filesystem::path> indexes;
  if (data[0] & 2) {
    const auto* nul = static_cast<const uint8_t*>(std::memchr(shard, 0, size - 1));
    if (nul == nullptr) return 0;
    prestage::fuzz::write_file(index_file,
                               std::vector<std::byte>(reinterpret_cast<const std::byte*>(shard),
                                                      reinterpret_cast<const std::byte*>(nul)));
    indexes.push_back(index_file);
    shard = nul + 1;
  }
  std::vector<std::byte> bytes(reinterpret_cast<const std::byte*>(shard),
                               reinterpret_cast<const std::byte*>(data + size));
  if (data[0] & 1) fix_checksums(bytes);
  prestage::fuzz::write_file(file, bytes);

  try {
    prestage::detail::ForwardReader in{prestage::detail::FileRef(file)};
    uint64_t next = 0;
    prestage::detail::scan_tar(
        in,
        [&](const prestage::detail::TarMember& m) {
          harness_check(m.header >= next && m.header < m.offset && m.offset <= bytes.size() &&
                            m.size <= bytes.size() - m.offset,
                        "scan_tar: a member out of order or outside the file");
          next = m.offset + m.size;
        },
        [&](const prestage::detail::TarDamage& d) {
          harness_check(d.offset < bytes.size() && (d.rest_of_file || d.resumed > d.offset),
                        "scan_tar: damage outside the file, or a scan that goes back");
        });
  } catch (const prestage::Error&) {
  }

  const std::vector<std::string> shards{file};
  for (const char* label : {"cls", "json:label"}) {
    for (const auto missing : {Catalog::Missing::kError, Catalog::Missing::kEmpty}) {
      try {
        check_catalog(Catalog::from_webdataset(shards, "jpg;bin", label, missing,
                                               prestage::OnError::kRaise, indexes),
                      bytes.size());
      } catch (const prestage::Error&) {
      }
      try {
        check_catalog(Catalog::from_webdataset(shards, "jpg;bin", label, missing,
                                               prestage::OnError::kSkip, indexes),
                      bytes.size());
      } catch (const prestage::Error&) {
      }
    }
  }
  return 0;
}
