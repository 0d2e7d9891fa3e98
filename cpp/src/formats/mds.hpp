// MosaicML Streaming's MDS sets, for the catalog: index.json (version 2) and each shard's offset
// table (u32 n, u32 offsets[n+1], absolute), then each sample's column sizes (a u32 per
// variable-size column, in column order, then the columns in that order), so that one column of a
// sample is a byte range of its shard (of its decompressed bytes, for a shard written with
// compression: read by range only once stage 2 has decompressed it).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "prestage/catalog.hpp"

namespace prestage::detail {

struct MdsShard {
  std::string file;   // relative to the set's folder
  uint64_t size = 0;  // of its bytes as read (decompressed, for a compressed one)
  // A shard read from its compressed file (index.json's zip_data, no raw_data beside it): the
  // codec, the file's bytes and the CRC-32C of its decompressed bytes.
  Catalog::Codec codec = Catalog::Codec::kNone;
  uint64_t stored = 0;
  uint32_t crc = 0;
};

// One sample: its shard (index into the shards), the data column's byte range (the values of an
// `ndarray` column, the pixels of a `pil` one), the label (-1 without a label column).
struct MdsSample {
  size_t shard = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  int64_t label = -1;
};

struct MdsDamage {
  size_t shard = 0;
  uint64_t offset = 0;
  std::string reason;
  bool rest_of_file = false;
};

// Reads `dir`/index.json and each shard's offset table and sample headers, and calls `sample` for
// each good sample in order. `data_column`: the column to read (any encoding); `label_column`: an
// integer column (int, int8..int64, uint8..uint64, str_int) or "". A shard written with
// compression is read from its raw_data where that is beside it, else from its zip_data through
// a streaming decompression ("zstd", "gz"; two passes, as a compressed WebDataset shard), its
// offsets those of its decompressed bytes; a stream that fails its checks is damage of the whole
// shard. ConfigError for an index that is not an MDS version 2 index, a column it lacks (naming
// those it has), a label column of another encoding, a compression other than zstd and gz;
// IoError for a file that cannot be read. Damage (a shard whose sample count disagrees with the
// index, an offset out of order or past the end of its shard, a sample whose column sizes do not
// add up to its length, a label that does not parse): with `damaged` null a DecodeError naming
// the shard and the sample, else `damaged` is called and the scan goes on. Returns the shards.
std::vector<MdsShard> scan_mds(const std::filesystem::path& dir, const std::string& data_column,
                               const std::string& label_column,
                               const std::function<void(const MdsSample&)>& sample,
                               const std::function<void(const MdsDamage&)>& damaged);

}  // namespace prestage::detail
