// The stage directory's index (index.log), read when a StageDirectory is constructed: the input is
// written as the index of a stage area that holds copies of a small catalog's files (plus a stale
// ".part" file and names that are not the catalog's), then StageDirectory takes stock of the area,
// every copy it vouched for is verified against its record, and optionally every absent file is
// staged and the area taken stock of again (records appended after the fuzzed ones), which must
// find every copy just staged.
//
// Input: one flag byte, then index.log. The index is a sequence of 40-byte records whose own CRC
// mutation would almost never get right, so the flags rewrite fields of every whole record:
//   bit 0  record_crc made correct (applied last)
//   bit 1  magic and version made correct
//   bit 2  crc made that of the copy the record names (when it names one of the catalog's files)
//   bit 3  source_mtime made that of the catalog (bit 4's catalog)
//   bit 4  the catalog records file sizes and modification times (from_list), else it does not
//   bit 5  stage the absent files, then construct a second StageDirectory over the area, which
//          must find every copy the first one staged
#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_util.hpp"
#include "prestage/catalog.hpp"
#include "prestage/error.hpp"
#include "tiers/stage_directory.hpp"
#include "util/crc32c.hpp"

namespace {

namespace fs = std::filesystem;
using prestage::Catalog;
using prestage::detail::StageDirectory;
using prestage::fuzz::harness_check;

constexpr size_t kFiles = 8;
constexpr size_t kRecordBytes = 40;  // StageDirectory::Record on disk
constexpr uint32_t kMagic = 0x58444950;
constexpr uint32_t kVersion = 1;

// Catalog file `id`: its bytes, also those of its staged copy.
std::vector<std::byte> file_bytes(size_t id) {
  std::vector<std::byte> bytes(1 + 5 * id);
  for (size_t k = 0; k < bytes.size(); ++k) bytes[k] = std::byte((id * 31 + k * 7) & 0xff);
  return bytes;
}

std::string hex(uint64_t v, int width) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%0*llx", width, static_cast<unsigned long long>(v));
  return buf;
}

bool present(const fs::path& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

struct Setup {
  fs::path stage_dir;
  Catalog unknown_sizes;  // from_paths: no sizes or times
  Catalog known_sizes;    // from_list: the sources' sizes and times

  static Setup make() {
    const fs::path root = prestage::fuzz::scratch_dir() / "data";
    fs::create_directories(root);
    std::vector<std::string> names;
    std::string list;
    for (size_t id = 0; id < kFiles; ++id) {
      names.push_back("f" + std::to_string(id));
      list += names.back() + "\n";
      prestage::fuzz::write_file(root / names.back(), file_bytes(id));
    }
    const fs::path list_file = prestage::fuzz::scratch_dir() / "files.txt";
    prestage::fuzz::write_file(list_file,
                               {reinterpret_cast<const std::byte*>(list.data()), list.size()});
    return Setup{prestage::fuzz::scratch_dir() / "stage", Catalog::from_paths(root, names),
                 Catalog::from_list(list_file, root)};
  }

  fs::path area(const Catalog& catalog) const {
    return stage_dir / ("prestage-" + hex(catalog.fingerprint(), 16));
  }
};

// Puts back what the previous run removed: the copies, a stale part file, names not ours.
void populate(const fs::path& area) {
  for (size_t id = 0; id < kFiles; ++id) {
    const fs::path shard = area / hex(id % 256, 2);
    fs::create_directories(shard);
    const fs::path copy = shard / hex(id, 0);
    if (!present(copy)) prestage::fuzz::write_file(copy, file_bytes(id));
  }
  const std::byte junk[3] = {std::byte{1}, std::byte{2}, std::byte{3}};
  for (const char* name : {"05/5.part", "00/zz", "00/100", "01/3", "02/2.tmp"}) {
    if (!present(area / name)) prestage::fuzz::write_file(area / name, junk);
  }
}

void fix_records(std::vector<std::byte>& index, uint8_t flags, const Catalog& catalog) {
  for (size_t at = 0; at + kRecordBytes <= index.size(); at += kRecordBytes) {
    std::byte* r = index.data() + at;
    if (flags & 2) {
      std::memcpy(r, &kMagic, 4);
      std::memcpy(r + 4, &kVersion, 4);
    }
    uint64_t id;
    std::memcpy(&id, r + 8, 8);
    if ((flags & 4) && id < kFiles) {
      const uint32_t crc = prestage::detail::crc32c(file_bytes(id));
      std::memcpy(r + 32, &crc, 4);
    }
    if ((flags & 8) && id < kFiles) {
      const int64_t mtime = catalog.file_mtime(id);
      std::memcpy(r + 24, &mtime, 8);
    }
    if (flags & 1) {
      const uint32_t own = prestage::detail::crc32c(std::span<const std::byte>(r, 36));
      std::memcpy(r + 36, &own, 4);
    }
  }
}

// Takes stock of the area; with `stage_absent`, stages every file found absent and returns them.
// `must_find`: files staged by the previous StageDirectory, whose records it appended to the index:
// each must be found again (a copy vouched for is not thrown away at the next start).
std::vector<size_t> take_stock(const fs::path& stage_dir, const Catalog& catalog, bool stage_absent,
                               const std::vector<size_t>& must_find = {}) {
  static std::vector<std::byte> buffer;
  StageDirectory dir(stage_dir, catalog);
  for (size_t id : must_find) {
    harness_check(dir.is_staged(id),
                  "a copy staged and recorded by the previous run was not found");
  }
  harness_check(dir.found_at_start() <= kFiles, "found more copies than the catalog has files");
  for (size_t id = 0; id < kFiles; ++id) {
    if (!dir.is_staged(id)) continue;
    struct stat st;
    harness_check(::stat(dir.staged_path(id).c_str(), &st) == 0 &&
                      static_cast<uint64_t>(st.st_size) == dir.staged_size(id),
                  "a vouched-for copy's size differs from its file");
    dir.verify(id, buffer);
  }
  // The node's count of bytes on disk is the copies' (alone, this process made the table).
  const auto check_bytes = [&] {
    uint64_t bytes = 0;
    for (size_t id = 0; id < kFiles; ++id) bytes += dir.is_staged(id) ? dir.staged_size(id) : 0;
    harness_check(dir.node().used() == bytes, "the node's bytes differ from its copies'");
  };
  check_bytes();
  std::vector<size_t> staged;
  if (!stage_absent) return staged;
  for (size_t id = 0; id < kFiles; ++id) {
    if (!dir.try_claim(id)) continue;
    const auto source = catalog.file_source_path(id).string();
    const auto outcome = dir.stage(id, source, buffer);
    harness_check(outcome == StageDirectory::Outcome::kStaged && dir.is_staged(id),
                  "staging an unchanged source failed");
    staged.push_back(id);
  }
  check_bytes();
  return staged;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const Setup setup = Setup::make();
  const uint8_t flags = data[0];
  const Catalog& catalog = (flags & 16) ? setup.known_sizes : setup.unknown_sizes;
  const fs::path area = setup.area(catalog);
  populate(area);
  std::vector<std::byte> index(reinterpret_cast<const std::byte*>(data + 1),
                               reinterpret_cast<const std::byte*>(data + size));
  fix_records(index, flags, catalog);
  prestage::fuzz::write_file(area / "index.log", index);
  try {
    const auto staged = take_stock(setup.stage_dir, catalog, (flags & 32) != 0);
    if (flags & 32) take_stock(setup.stage_dir, catalog, false, staged);
  } catch (const prestage::Error&) {
  }
  return 0;
}
