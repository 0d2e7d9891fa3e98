// WebDataset shards, for the catalog: shard names (paths, globs, brace ranges), the split of a
// member name into key and extension, and the grouping of a shard's members into samples, with the
// fields a catalog takes from each (an image or other data member's byte range, a label).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "formats/tar.hpp"

namespace prestage::detail {

// Bash's brace expansion of one pattern: `{a,b}` alternatives and `{000..123}` ranges (zero-padded
// to the width of the wider end when either end is, as webdataset's braceexpand does), nested and
// combined, in order. ConfigError for an unbalanced brace or a range of more than 10 million names.
std::vector<std::string> expand_braces(std::string_view pattern);

// Each pattern brace-expanded, then each name with a glob character (`*?[`) matched against the
// file system (sorted; ConfigError naming it if nothing matches); other names are kept as they are.
std::vector<std::filesystem::path> expand_shards(const std::vector<std::string>& patterns);

// WebDataset's split of a member name (webdataset's base_plus_ext): the key runs up to the first
// dot after the last '/', the rest is the extension, lower-cased. None if the base name has no dot
// or starts with one (a hidden file: webdataset and DALI pass it over).
struct KeyExt {
  std::string_view key;
  std::string ext;
};
std::optional<KeyExt> split_key(std::string_view name);

// Whether a member is metadata that webdataset passes over (`__*__` names, skip_meta's
// `__[^/]*__($|/)`) or whose key's base name is `__*__` (`__meta__.json`).
bool is_meta(std::string_view name, std::string_view key);

// A label member: decimal text (`.cls`), optional sign and ASCII blanks around it. None otherwise.
std::optional<int64_t> decimal_label(std::span<const std::byte> text);

// The integer at top-level key `key` of a JSON object. None if the text is not a JSON object, the
// key is absent, or its value is not an integer within int64.
std::optional<int64_t> json_label(std::span<const std::byte> text, std::string_view key);

// What a catalog takes from each sample.
struct WdsFields {
  std::vector<std::string> data;  // extensions, alternatives in order of preference (lower case)
  std::string label_ext;          // "" : no label
  std::string label_key;          // label_ext is "json": the key holding the label
  enum class Missing { kError, kSkip, kEmpty } missing = Missing::kError;
};

// One sample of a shard: the data member's byte range (length 0 where it is missing and
// Missing::kEmpty) and the label (-1 where none).
struct WdsSample {
  uint64_t offset = 0;
  uint64_t length = 0;
  int64_t label = -1;
};

// Something left out of a shard: the byte of the member (or header) where it starts, why (naming
// the member or key), and whether the rest of the shard is lost with it.
struct WdsDamage {
  uint64_t offset = 0;
  std::string reason;
  bool rest_of_file = false;
};

// Scans one shard (scan_tar), groups its members into samples (runs of adjacent members with one
// key), and calls `sample` for each good sample in order, after the whole shard is scanned. A key
// that comes back after another (interleaved keys), an extension twice in one sample, a label that
// does not parse, a missing field with Missing::kError, and the tar's own damage: with `damaged`
// null, a DecodeError naming `path`, the member or key and the byte; else `damaged` is called and
// the scan goes on. Damage in the tar loses the sample being read when it is found (its last
// member's size may be the lie), and a sample found right after it that lacks a field is damage
// too (the part of it before may be what was lost), whatever `fields.missing` says. An IoError
// reading the shard is raised either way, and so is a ConfigError for a shard compressed by
// another codec than `codec` says (bzip2, xz, or gzip/zstd read as kNone: its members have no
// byte range). `codec` gzip or zstd: the shard is read through its decompressed bytes, of which
// there are `decompressed` (measure_compressed), offsets and the size returned are theirs, and a
// stream that turns out corrupt is a DecodeError either way. Returns the shard's size.
uint64_t scan_webdataset(const FileRef& file, const std::string& path, const WdsFields& fields,
                         const std::function<void(const WdsSample&)>& sample,
                         const std::function<void(const WdsDamage&)>& damaged,
                         Catalog::Codec codec = Catalog::Codec::kNone, uint64_t decompressed = 0);

// As scan_webdataset, with the shard's members taken from a DALI index of it (`index`: the text of
// wds2idx's `.idx`, named `index_path` in errors) instead of a scan of its headers: "v1.1 N" or
// "v1.2 N", then one line per sample of "ext offset size" groups (v1.2: "ext offset size name"),
// offsets those of the members' data. The index is checked against the shard before anything is
// taken from it: its members in order, each at a 512-byte boundary within the shard, and the block
// before each a tar header whose checksum holds, of a regular member of that size (v1.2: and that
// name, where the header holds the whole name); a sample's members share its key (v1.2). An index
// that is malformed, or that does not describe the shard, is a ConfigError naming both: it is the
// wrong index, not damage. Fields, labels and missing fields: as scan_webdataset. Returns the
// shard's size.
uint64_t index_webdataset(const FileRef& file, const std::string& path, std::string_view index,
                          const std::string& index_path, const WdsFields& fields,
                          const std::function<void(const WdsSample&)>& sample,
                          const std::function<void(const WdsDamage&)>& damaged);

}  // namespace prestage::detail
