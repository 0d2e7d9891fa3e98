// MosaicML MDS sets: Catalog::from_mds over an index.json and one shard, raising at damage and
// skipping it, for each kind of data column (bytes, a `pil` image, an `ndarray` with a header) and
// each kind of label (a fixed-size integer, decimal text).
//
// Input: one flag byte, then a file. Flag bit 0 clear: the file is the shard, beside an index.json
// made here that names every column kind and gives the sample count the shard's first 4 bytes say
// (so that the scan reaches the offset table); set: the file is index.json, beside a small good
// shard (the JSON reader and the index's checks).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "fuzz_util.hpp"
#include "prestage/catalog.hpp"
#include "prestage/error.hpp"

namespace {

using prestage::Catalog;
using prestage::fuzz::harness_check;

std::string index_json(uint32_t samples) {
  const std::string n = std::to_string(samples);
  return R"({"shards": [{"column_encodings": ["ndarray", "jpeg", "int", "pil", "str_int"],)"
         R"( "column_names": ["arr", "image", "label", "pix", "tid"],)"
         R"( "column_sizes": [null, null, 8, null, null], "compression": null, "format": "mds",)"
         R"( "hashes": [], "raw_data": {"basename": "shard.00000.mds", "bytes": 0, "hashes": {}},)"
         R"( "samples": )" +
         n + R"(, "size_limit": 67108864, "version": 2, "zip_data": null}], "version": 2})";
}

// One sample of every column: arr (dtype byte 34 = float32, then ndim 1 << 2 | uint8 shape, 2),
// image, label 7, pix (1x1 "L"), tid "-3".
std::vector<std::byte> good_shard() {
  std::string sample;
  const std::string arr = std::string("\x22\x04\x02", 3) + std::string(8, '\0');
  const std::string image = "\xff\xd8jpeg";
  const std::string pix = std::string("\x01\0\0\0\x01\0\0\0\x01\0\0\0", 12) + "L" + "\x05";
  const std::string tid = "-3";
  for (const std::string* v : {&arr, &image, &pix, &tid}) {
    const uint32_t size = static_cast<uint32_t>(v->size());
    sample.append(reinterpret_cast<const char*>(&size), 4);
  }
  const uint64_t label = 7;
  sample += arr + image + std::string(reinterpret_cast<const char*>(&label), 8) + pix + tid;
  const uint32_t head[3] = {1, 12, static_cast<uint32_t>(12 + sample.size())};
  std::string out(reinterpret_cast<const char*>(head), sizeof(head));
  out += sample;
  std::vector<std::byte> bytes(out.size());
  std::memcpy(bytes.data(), out.data(), out.size());
  return bytes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const std::filesystem::path dir = [] {
    const auto d = prestage::fuzz::scratch_dir() / "mds";
    std::filesystem::create_directories(d);
    return d;
  }();
  const auto file = prestage::fuzz::as_bytes(data + 1, size - 1);
  if (data[0] & 1) {
    prestage::fuzz::write_file(dir / "index.json", file);
    prestage::fuzz::write_file(dir / "shard.00000.mds", good_shard());
  } else {
    uint32_t samples = 0;
    if (file.size() >= 4) std::memcpy(&samples, file.data(), 4);
    const std::string index = index_json(samples);
    prestage::fuzz::write_file(
        dir / "index.json",
        prestage::fuzz::as_bytes(reinterpret_cast<const uint8_t*>(index.data()), index.size()));
    prestage::fuzz::write_file(dir / "shard.00000.mds", file);
  }
  const uint64_t shard_size = std::filesystem::file_size(dir / "shard.00000.mds");
  for (const char* column : {"image", "pix", "arr"}) {
    for (const char* label : {"label", "tid", ""}) {
      for (const auto on_error : {prestage::OnError::kRaise, prestage::OnError::kSkip}) {
        try {
          const auto catalog = Catalog::from_mds(dir, column, label, on_error);
          for (size_t i = 0; i < catalog.size(); ++i) {
            const auto loc = catalog.locator(i);
            harness_check(loc.offset <= shard_size && loc.length <= shard_size - loc.offset,
                          "from_mds: a sample lies outside its shard");
          }
        } catch (const prestage::Error&) {
        }
      }
    }
  }
  return 0;
}
