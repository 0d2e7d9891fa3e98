// The catalog file: Catalog::load, then every accessor of what it loaded, and a save/load round
// trip that must give the same catalog. Input: a catalog file as Catalog::save writes it.
//
// A catalog file ends with an FNV-1a checksum of everything before it, which mutation would almost
// never get right: each input is loaded as it is, then again with its last 8 bytes replaced by the
// right checksum, so that mutations reach the parser behind the check.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_util.hpp"
#include "prestage/catalog.hpp"
#include "prestage/error.hpp"

namespace {

using prestage::Catalog;
using prestage::fuzz::harness_check;

constexpr size_t kChecksumBytes = 8;
constexpr size_t kMaxChecked = 4096;  // samples and files whose accessors are called

// The catalog file's checksum (catalog.cpp): FNV-1a, 64 bits.
uint64_t fnv1a(std::span<const std::byte> bytes) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (std::byte b : bytes) {
    hash ^= std::to_integer<uint8_t>(b);
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

void exercise(const Catalog& catalog) {
  const size_t samples = catalog.size();
  const size_t files = catalog.num_files();
  for (size_t i = 0; i < samples && i < kMaxChecked; ++i) {
    const Catalog::Locator loc = catalog.locator(i);
    harness_check(loc.file < files, "a loaded locator names a file past the list");
    const std::string_view path = catalog.path(i);
    harness_check(!path.empty() && path.front() != '/', "a loaded path is empty or absolute");
    static_cast<void>(catalog.label(i));
    static_cast<void>(catalog.source_path(i));
  }
  for (size_t f = 0; f < files && f < kMaxChecked; ++f) {
    static_cast<void>(catalog.file_path(f));
    static_cast<void>(catalog.file_source_path(f));
    static_cast<void>(catalog.file_size(f));
    static_cast<void>(catalog.file_mtime(f));
  }
  static_cast<void>(catalog.fingerprint());
  static_cast<void>(catalog.kind());
  static_cast<void>(catalog.field());
  static_cast<void>(catalog.classes());
  static_cast<void>(catalog.symlinks());
  for (const auto& d : catalog.damage()) {
    harness_check(d.file < files, "a loaded damage entry names a file past the list");
  }
}

void load(const std::filesystem::path& file, std::span<const std::byte> bytes) {
  static const std::filesystem::path resaved = prestage::fuzz::scratch_dir() / "resaved.cat";
  prestage::fuzz::write_file(file, bytes);
  std::optional<Catalog> loaded;
  try {
    loaded.emplace(Catalog::load(file));
  } catch (const prestage::Error&) {
    return;
  }
  const Catalog& catalog = *loaded;
  exercise(catalog);
  // What was loaded saves and loads back to the same catalog.
  try {
    catalog.save(resaved);
    const Catalog again = Catalog::load(resaved);
    harness_check(again.fingerprint() == catalog.fingerprint() && again.size() == catalog.size() &&
                      again.num_files() == catalog.num_files() && again.kind() == catalog.kind() &&
                      again.field() == catalog.field() && again.classes() == catalog.classes() &&
                      again.symlinks() == catalog.symlinks() &&
                      again.damage().size() == catalog.damage().size(),
                  "save/load round trip changed the catalog");
    for (size_t i = 0; i < catalog.damage().size(); ++i) {
      const auto &a = catalog.damage()[i], &b = again.damage()[i];
      harness_check(a.file == b.file && a.offset == b.offset && a.rest_of_file == b.rest_of_file &&
                        a.reason == b.reason,
                    "save/load round trip changed a damage entry");
    }
    for (size_t i = 0; i < catalog.size() && i < kMaxChecked; ++i) {
      const auto a = catalog.locator(i), b = again.locator(i);
      harness_check(a.file == b.file && a.offset == b.offset && a.length == b.length &&
                        catalog.label(i) == again.label(i),
                    "save/load round trip changed a sample");
    }
  } catch (const prestage::Error&) {
    harness_check(false, "a loaded catalog could not be saved and loaded again");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::filesystem::path file = prestage::fuzz::scratch_dir() / "fuzz.cat";
  std::vector<std::byte> bytes(reinterpret_cast<const std::byte*>(data),
                               reinterpret_cast<const std::byte*>(data + size));
  load(file, bytes);
  if (bytes.size() >= kChecksumBytes) {
    const size_t body = bytes.size() - kChecksumBytes;
    const uint64_t sum = fnv1a(std::span(bytes).first(body));
    uint64_t stored;
    std::memcpy(&stored, bytes.data() + body, sizeof(stored));
    if (stored != sum) {
      std::memcpy(bytes.data() + body, &sum, sizeof(sum));
      load(file, bytes);
    }
  }
  return 0;
}
