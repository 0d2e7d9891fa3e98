// A small JSON reader for the catalog's metadata files (MosaicML MDS's index.json, WebDataset's
// .json labels): the whole text into a tree of values. Strict RFC 8259 syntax, nesting bounded
// (kMaxDepth); numbers are kept as their text, so an integer is read exactly.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace prestage::detail {

struct JsonValue {
  enum class Type : uint8_t { kNull, kBool, kNumber, kString, kArray, kObject };
  Type type = Type::kNull;
  bool boolean = false;
  std::string text;  // kString: the string (escapes decoded); kNumber: the number as written
  std::vector<JsonValue> items;   // kArray: the items; kObject: the members' values, in order
  std::vector<std::string> keys;  // kObject: the members' keys, beside `items`

  // kObject: the value of `key` (the last one, as Python's json), or null if absent or not an
  // object.
  const JsonValue* find(std::string_view key) const;
  // kNumber written as an integer within int64; else none.
  std::optional<int64_t> integer() const;
  bool is(Type t) const noexcept { return type == t; }
};

inline constexpr int kJsonMaxDepth = 256;

// The value of the whole `text`; none if it is not JSON (or nests deeper than kJsonMaxDepth).
std::optional<JsonValue> parse_json(std::string_view text);

}  // namespace prestage::detail
