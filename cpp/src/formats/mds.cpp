#include "formats/mds.hpp"

#include <algorithm>
#include <cstring>
#include <optional>

#include "formats/compressed.hpp"
#include "formats/json.hpp"
#include "formats/tar.hpp"
#include "prestage/error.hpp"
#include "util/file_io.hpp"

namespace prestage::detail {

namespace {

uint64_t load_le(std::span<const std::byte> b, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= std::to_integer<uint64_t>(b[i]) << (8 * i);
  return v;
}

std::string base_encoding(const std::string& encoding) {
  return encoding.substr(0, encoding.find(':'));
}

// An integer label column: its size in bytes (0: decimal text) and whether it is signed.
std::optional<std::pair<size_t, bool>> label_encoding(const std::string& encoding) {
  static const std::pair<const char*, std::pair<size_t, bool>> kTable[] = {
      {"int", {8, true}},     {"int8", {1, true}},    {"int16", {2, true}},
      {"int32", {4, true}},   {"int64", {8, true}},   {"uint8", {1, false}},
      {"uint16", {2, false}}, {"uint32", {4, false}}, {"uint64", {8, false}},
      {"str_int", {0, true}},
  };
  for (const auto& [name, what] : kTable) {
    if (encoding == name) return what;
  }
  return std::nullopt;
}

// The bytes before an `ndarray` column's values: a dtype byte where the encoding gives none, a
// shape where it gives none (a byte of ndim << 2 | log2 of the shape's item size, then the shape).
// None if the column is too short for them.
std::optional<uint64_t> ndarray_header(const std::string& encoding,
                                       std::span<const std::byte> head) {
  const size_t colons = static_cast<size_t>(std::count(encoding.begin(), encoding.end(), ':'));
  uint64_t n = colons >= 1 ? 0 : 1;  // "ndarray:dtype" gives the dtype
  if (colons >= 2) return n;         // "ndarray:dtype:shape" gives both
  if (head.size() <= n) return std::nullopt;
  const auto byte = std::to_integer<uint64_t>(head[n]);
  return n + 1 + (byte >> 2) * (uint64_t{1} << (byte & 3));
}

const JsonValue& member(const JsonValue& v, const char* key, JsonValue::Type type,
                        const std::string& index) {
  const JsonValue* found = v.find(key);
  if (!found || !found->is(type)) {
    throw ConfigError("'" + index + "': a shard entry lacks '" + key +
                      "' (or it is of another type): " + "not a MosaicML MDS index");
  }
  return *found;
}

}  // namespace

std::vector<MdsShard> scan_mds(const std::filesystem::path& dir, const std::string& data_column,
                               const std::string& label_column,
                               const std::function<void(const MdsSample&)>& sample,
                               const std::function<void(const MdsDamage&)>& damaged) {
  const std::string index_path = (dir / "index.json").string();
  std::vector<std::byte> text;
  read_file(FileRef(index_path), text);
  const auto index = parse_json({reinterpret_cast<const char*>(text.data()), text.size()});
  if (!index || !index->is(JsonValue::Type::kObject)) {
    throw ConfigError("'" + index_path + "' is not JSON: not a MosaicML MDS index");
  }
  const JsonValue* version = index->find("version");
  if (!version || version->integer() != 2) {
    throw ConfigError("'" + index_path + "': version " + (version ? version->text : "missing") +
                      ", expected 2 (MosaicML MDS index version 2)");
  }
  const JsonValue& shards = member(*index, "shards", JsonValue::Type::kArray, index_path);

  std::vector<MdsShard> out;
  for (size_t s = 0; s < shards.items.size(); ++s) {
    const JsonValue& entry = shards.items[s];
    const JsonValue* format = entry.find("format");
    if (!format || format->text != "mds") {
      throw ConfigError("'" + index_path + "': shard " + std::to_string(s) + " is of format '" +
                        (format ? format->text : "") + "', not 'mds'");
    }
    const auto& names = member(entry, "column_names", JsonValue::Type::kArray, index_path).items;
    const auto& encodings =
        member(entry, "column_encodings", JsonValue::Type::kArray, index_path).items;
    const auto& sizes = member(entry, "column_sizes", JsonValue::Type::kArray, index_path).items;
    const auto samples = member(entry, "samples", JsonValue::Type::kNumber, index_path).integer();
    const auto& raw = member(entry, "raw_data", JsonValue::Type::kObject, index_path);
    const std::string basename = member(raw, "basename", JsonValue::Type::kString, index_path).text;
    if (names.size() != encodings.size() || names.size() != sizes.size() || !samples ||
        *samples < 0) {
      throw ConfigError("'" + index_path + "': shard '" + basename + "' has column tables of " +
                        "different lengths or a bad sample count");
    }
    std::vector<std::string> columns, kinds;
    std::vector<std::optional<uint64_t>> fixed;
    for (size_t c = 0; c < names.size(); ++c) {
      const auto size = sizes[c].integer();
      if (!names[c].is(JsonValue::Type::kString) || !encodings[c].is(JsonValue::Type::kString) ||
          !(sizes[c].is(JsonValue::Type::kNull) || (size && *size >= 0))) {
        throw ConfigError("'" + index_path + "': shard '" + basename + "' has a malformed column " +
                          std::to_string(c));
      }
      columns.push_back(names[c].text);
      kinds.push_back(encodings[c].text);
      fixed.push_back(size ? std::optional<uint64_t>(static_cast<uint64_t>(*size)) : std::nullopt);
    }
    const auto column = [&](const std::string& name) {
      const auto at = std::find(columns.begin(), columns.end(), name);
      if (at == columns.end()) {
        std::string have;
        for (size_t c = 0; c < columns.size(); ++c) {
          have += (c ? ", " : "") + columns[c] + " (" + kinds[c] + ")";
        }
        throw ConfigError("MDS set '" + dir.string() + "' has no column '" + name +
                          "' (it has: " + have + ")");
      }
      return static_cast<size_t>(at - columns.begin());
    };
    const size_t data_col = column(data_column);
    const std::string data_kind = base_encoding(kinds[data_col]);
    std::optional<size_t> label_col;
    std::optional<std::pair<size_t, bool>> label_kind;
    if (!label_column.empty()) {
      label_col = column(label_column);
      label_kind = label_encoding(kinds[*label_col]);
      if (!label_kind || (label_kind->first != 0 && fixed[*label_col] != label_kind->first)) {
        throw ConfigError("MDS set '" + dir.string() + "': label column '" + label_column +
                          "' has encoding '" + kinds[*label_col] +
                          "', not an integer one (int, int8..int64, uint8..uint64, str_int)");
      }
    }
    if (basename.empty() || basename.front() == '/' || basename == ".." ||
        basename.starts_with("../") || basename.find("/../") != std::string::npos) {
      throw ConfigError("'" + index_path + "': shard '" + basename +
                        "' lies outside the set's folder");
    }
    const JsonValue* compression = entry.find("compression");
    std::string file = basename;
    Catalog::Codec codec = Catalog::Codec::kNone;
    if (compression && !compression->is(JsonValue::Type::kNull) &&
        !std::filesystem::exists(dir / basename)) {
      const JsonValue* zip = entry.find("zip_data");
      const JsonValue* zip_name = zip ? zip->find("basename") : nullptr;
      const std::string name = zip_name ? zip_name->text : basename;
      const std::string algo = compression->text.substr(0, compression->text.find(':'));
      codec = algo == "zstd" ? Catalog::Codec::kZstd
              : algo == "gz" ? Catalog::Codec::kGzip
                             : Catalog::Codec::kNone;
      if (codec == Catalog::Codec::kNone || !zip_name || zip_name->text.empty()) {
        throw ConfigError("MDS shard '" + name + "' of '" + dir.string() + "' is compressed (" +
                          compression->text + "): prestage decompresses zstd and gz shards " +
                          "while staging; decompress it to '" + basename + "' beside it, or " +
                          "write the set with compression='zstd' or None");
      }
      if (name.front() == '/' || name == ".." || name.starts_with("../") ||
          name.find("/../") != std::string::npos) {
        throw ConfigError("'" + index_path + "': shard '" + name +
                          "' lies outside the set's folder");
      }
      file = name;
    }
    const std::string path = (dir / file).string();

    const size_t shard = out.size();
    const auto damage = [&](uint64_t offset, const std::string& reason, bool rest_of_file) {
      if (!damaged) {
        throw DecodeError(path, "MDS shard '" + file + "': " + reason + " (at byte " +
                                    std::to_string(offset) + ")");
      }
      damaged(MdsDamage{shard, offset, "shard '" + file + "': " + reason, rest_of_file});
    };
    std::optional<ForwardReader> reader;
    MdsShard described{file, 0};
    if (codec == Catalog::Codec::kNone) {
      reader.emplace(FileRef{path});
    } else {
      const Catalog::Codec found = codec_of_file(FileRef{path});
      if (found != codec) {
        throw ConfigError("MDS shard '" + path + "': index.json says it is compressed with " +
                          compression->text + ", its first bytes say " + codec_name(found));
      }
      // A stream that fails its own checks vouches for none of its samples.
      try {
        const auto measured = measure_compressed(FileRef{path}, codec, path);
        described.codec = codec;
        described.stored = measured.stored;
        described.crc = measured.crc;
        described.size = measured.size;
      } catch (const DecodeError& e) {
        out.push_back(described);
        damage(0, "compressed shard: " + e.reason() + " (none of its samples is kept)", true);
        continue;
      }
      reader.emplace(FileRef{path}, codec, described.size);
    }
    ForwardReader& in = *reader;
    const uint64_t size = in.size();
    described.size = size;
    out.push_back(described);
    const bool forward_only = codec != Catalog::Codec::kNone;
    uint64_t read_to = 0;  // a compressed shard: where the last sample ended
    if (size < 4) {
      damage(0, "the file holds " + std::to_string(size) + " bytes, too few for its sample count",
             true);
      continue;
    }
    const uint64_t n = load_le(in.bytes(0, 4), 4);
    if (n != static_cast<uint64_t>(*samples)) {
      damage(0,
             "holds " + std::to_string(n) + " samples, the index says " + std::to_string(*samples),
             true);
      continue;
    }
    const uint64_t table_end = 4 + 4 * (n + 1);
    if (table_end > size) {
      damage(4,
             "its offset table of " + std::to_string(n + 1) + " entries runs past the end of " +
                 "the file (" + std::to_string(size) + " bytes)",
             true);
      continue;
    }
    std::vector<uint64_t> offsets(n + 1);
    {
      const auto table = in.bytes(4, 4 * (n + 1));
      for (uint64_t i = 0; i <= n; ++i) offsets[i] = load_le(table.subspan(4 * i, 4), 4);
    }
    uint64_t variable = 0;
    for (const auto& f : fixed) variable += !f.has_value();
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t begin = offsets[i], end = offsets[i + 1];
      const std::string name = "sample " + std::to_string(i);
      if (begin < table_end || begin > end || end > size || (forward_only && begin < read_to)) {
        damage(4 + 4 * i,
               name + ": its offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                   ") are out of order or past the end of the " + "shard (" + std::to_string(size) +
                   " bytes)",
               false);
        continue;
      }
      if (forward_only) read_to = end;
      if (4 * variable > end - begin) {
        damage(
            begin,
            name + ": " + std::to_string(end - begin) + " bytes, too few for its " + "column sizes",
            false);
        continue;
      }
      std::vector<uint64_t> column_offset(columns.size()), column_size(columns.size());
      {
        const auto head = in.bytes(begin, 4 * variable);
        uint64_t at = begin + 4 * variable, v = 0;
        for (size_t c = 0; c < columns.size(); ++c) {
          const uint64_t bytes = fixed[c] ? *fixed[c] : load_le(head.subspan(4 * v++, 4), 4);
          column_offset[c] = at;
          column_size[c] = bytes;
          at = bytes > end - std::min(at, end) ? end + 1 : at + bytes;
        }
        if (at != end) {
          damage(begin,
                 name + ": its column sizes do not add up to its " + std::to_string(end - begin) +
                     " bytes",
                 false);
          continue;
        }
      }
      MdsSample out_sample{shard, column_offset[data_col], column_size[data_col], -1};
      // Each a look at the sample's bytes: false if it found damage. Taken in the order of their
      // bytes, as a compressed shard is read forward.
      const auto data_header = [&]() -> bool {
        if (data_kind != "pil" && data_kind != "ndarray") return true;
        // The pixels or values, past the column's own header.
        const auto head = in.bytes(out_sample.offset, std::min<uint64_t>(out_sample.length, 16));
        std::optional<uint64_t> skip;
        if (data_kind == "pil") {
          if (head.size() >= 12) skip = 12 + load_le(head.subspan(8, 4), 4);
        } else {
          skip = ndarray_header(kinds[data_col], head);
        }
        if (!skip || *skip > out_sample.length) {
          damage(out_sample.offset,
                 name + ": its " + data_kind + " column '" + data_column +
                     "' is too short for its header",
                 false);
          return false;
        }
        out_sample.offset += *skip;
        out_sample.length -= *skip;
        return true;
      };
      const auto read_label = [&]() -> bool {
        if (!label_col) return true;
        const auto bytes = in.bytes(column_offset[*label_col], column_size[*label_col]);
        if (label_kind->first == 0) {
          const std::string_view t(reinterpret_cast<const char*>(bytes.data()), bytes.size());
          const auto value = parse_json(t);
          const auto v = value ? value->integer() : std::nullopt;
          if (!v) {
            damage(column_offset[*label_col],
                   name + ": label '" + std::string(t.substr(0, 32)) + "' is not an integer",
                   false);
            return false;
          }
          out_sample.label = *v;
        } else {
          const size_t w = label_kind->first;
          uint64_t v = load_le(bytes, w);
          if (label_kind->second && w < 8 && (v >> (8 * w - 1)) != 0) v |= ~uint64_t{0} << (8 * w);
          if (!label_kind->second && w == 8 && v > uint64_t{INT64_MAX}) {
            damage(column_offset[*label_col],
                   name + ": label " + std::to_string(v) + " is past the int64 labels", false);
            return false;
          }
          out_sample.label = static_cast<int64_t>(v);
        }
        return true;
      };
      const bool label_first = label_col && column_offset[*label_col] < out_sample.offset;
      if (label_first ? !(read_label() && data_header()) : !(data_header() && read_label())) {
        continue;
      }
      sample(out_sample);
    }
  }
  if (out.empty()) throw ConfigError("'" + index_path + "' lists no shards");
  return out;
}

}  // namespace prestage::detail
