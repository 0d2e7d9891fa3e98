// The index of a packed set (`prestage pack`): Catalog::from_shards on an index.tsv, then every
// accessor of what it built. Input: an index.tsv as pack writes it. A shard file beside it, of a
// few bytes, lets the range checks against a shard's recorded size run.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "fuzz_util.hpp"
#include "prestage/catalog.hpp"
#include "prestage/error.hpp"

using prestage::Catalog;
using prestage::fuzz::harness_check;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::filesystem::path dir = [] {
    const auto d = prestage::fuzz::scratch_dir() / "packed";
    std::filesystem::create_directories(d);
    const std::vector<std::byte> shard(64, std::byte{7});
    prestage::fuzz::write_file(d / "shard-00000.bin", shard);
    return d;
  }();
  prestage::fuzz::write_file(dir / "index.tsv", prestage::fuzz::as_bytes(data, size));
  std::optional<Catalog> built;
  try {
    built.emplace(Catalog::from_shards(dir));
  } catch (const prestage::Error&) {
    return 0;
  }
  const Catalog& catalog = *built;
  for (size_t i = 0; i < catalog.size() && i < 4096; ++i) {
    const Catalog::Locator loc = catalog.locator(i);
    harness_check(loc.file < catalog.num_files(), "a locator names a file past the list");
    const uint64_t file_size = catalog.file_size(loc.file);
    harness_check(file_size == Catalog::kUnknownSize || loc.offset + loc.length <= file_size,
                  "a sample lies past the end of its shard");
    static_cast<void>(catalog.label(i));
    static_cast<void>(catalog.source_path(i));
  }
  static_cast<void>(catalog.classes());
  static_cast<void>(catalog.fingerprint());
  return 0;
}
