#include "formats/tfrecord.hpp"

#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

#include "prestage/error.hpp"
#include "util/crc32c.hpp"

namespace prestage::detail {
namespace {

uint64_t load_u64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;  // little-endian (the catalog format requires a little-endian host too)
}
uint32_t load_u32(const std::byte* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Protocol buffer wire format, enough for tf.train.Example.
class Wire {
 public:
  Wire(std::span<const std::byte> bytes, const std::string& path) : p_(bytes), path_(path) {}
  bool done() const { return pos_ == p_.size(); }

  // Reads a field key; returns false at the end.
  bool next(uint32_t& field, uint32_t& type) {
    if (done()) return false;
    const uint64_t key = varint();
    field = static_cast<uint32_t>(key >> 3);
    type = static_cast<uint32_t>(key & 7);
    if (field == 0) fail("field number 0");
    return true;
  }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= p_.size()) fail("truncated varint");
      const auto b = std::to_integer<uint8_t>(p_[pos_++]);
      v |= uint64_t{b & 0x7Fu} << shift;
      if ((b & 0x80) == 0) return v;
    }
    fail("varint too long");
  }
  std::span<const std::byte> bytes() {
    const uint64_t n = varint();
    if (n > p_.size() - pos_) fail("length-delimited field runs past the message");
    auto out = p_.subspan(pos_, n);
    pos_ += n;
    return out;
  }
  void skip(uint32_t type) {
    switch (type) {
      case 0:
        varint();
        return;
      case 1:
        advance(8);
        return;
      case 2:
        bytes();
        return;
      case 5:
        advance(4);
        return;
      default:
        fail("unsupported wire type " + std::to_string(type));
    }
  }
  uint32_t fixed32() {
    const size_t at = pos_;
    advance(4);
    return load_u32(p_.data() + at);
  }
  [[noreturn]] void fail(const std::string& why) const {
    throw DecodeError(path_, "malformed tf.train.Example: " + why);
  }

 private:
  void advance(size_t n) {
    if (n > p_.size() - pos_) fail("truncated fixed-size field");
    pos_ += n;
  }
  std::span<const std::byte> p_;
  const std::string& path_;
  size_t pos_ = 0;
};

// Finds the Feature message of `name`; returns false if absent.
bool find_feature(std::span<const std::byte> example, std::string_view name,
                  std::span<const std::byte>& feature, const std::string& path) {
  bool found = false;
  Wire ex(example, path);
  uint32_t field, type;
  while (ex.next(field, type)) {
    if (field != 1 || type != 2) {
      ex.skip(type);
      continue;
    }
    Wire features(ex.bytes(), path);
    while (features.next(field, type)) {
      if (field != 1 || type != 2) {
        features.skip(type);
        continue;
      }
      Wire entry(features.bytes(), path);
      std::string_view key;
      std::span<const std::byte> value;
      bool has_value = false;
      while (entry.next(field, type)) {
        if (field == 1 && type == 2) {
          const auto k = entry.bytes();
          key = std::string_view(reinterpret_cast<const char*>(k.data()), k.size());
        } else if (field == 2 && type == 2) {
          value = entry.bytes();
          has_value = true;
        } else {
          entry.skip(type);
        }
      }
      if (key == name) {
        feature = has_value ? value : std::span<const std::byte>();
        found = true;
      }
    }
  }
  return found;
}

enum ListKind : uint32_t { kEmpty = 0, kBytesList = 1, kFloatList = 2, kInt64List = 3 };
const char* const kListNames[] = {"empty", "bytes_list", "float_list", "int64_list"};

// The kind of `feature` and its list message (the last one, as protobuf's oneof); kEmpty if none.
ListKind feature_kind(std::span<const std::byte> feature, std::span<const std::byte>& list,
                      const std::string& path) {
  Wire f(feature, path);
  uint32_t field, type;
  ListKind kind = kEmpty;
  while (f.next(field, type)) {
    if (field >= 1 && field <= 3 && type == 2) {
      kind = static_cast<ListKind>(field);
      list = f.bytes();
    } else {
      f.skip(type);
    }
  }
  return kind;
}

// The list message of `feature` if it is of kind `want`.
std::span<const std::byte> feature_list(std::span<const std::byte> feature, ListKind want,
                                        std::string_view name, const std::string& path) {
  std::span<const std::byte> list;
  const ListKind kind = feature_kind(feature, list, path);
  if (kind != want) {
    throw DecodeError(path, "feature '" + std::string(name) + "' is a " + kListNames[kind] +
                                ", expected a " + kListNames[want]);
  }
  return list;
}

// The first value of a bytes_list message.
std::span<const std::byte> first_bytes(std::span<const std::byte> list, std::string_view name,
                                       const std::string& path) {
  Wire w(list, path);
  uint32_t field, type;
  while (w.next(field, type)) {
    if (field == 1 && type == 2) return w.bytes();
    w.skip(type);
  }
  throw DecodeError(path, "feature '" + std::string(name) + "' holds no bytes value");
}

// Calls `value(bits)` for each value of a float_list (fixed32) or int64_list (varint) message, in
// order, whether packed (one length-delimited field) or not (one field per value), or both mixed
// as protobuf parsers must accept.
template <typename Value>
void each_value(std::span<const std::byte> list, ListKind kind, const std::string& path,
                const Value& value) {
  const uint32_t scalar = kind == kFloatList ? 5 : 0;  // wire type of one unpacked value
  Wire w(list, path);
  uint32_t field, type;
  while (w.next(field, type)) {
    if (field == 1 && type == scalar) {
      value(kind == kFloatList ? w.fixed32() : w.varint());
    } else if (field == 1 && type == 2) {
      Wire packed(w.bytes(), path);
      while (!packed.done()) value(kind == kFloatList ? packed.fixed32() : packed.varint());
    } else {
      w.skip(type);
    }
  }
}

// The data feature `name` of `example` (its kind and list); false if absent, DecodeError if empty.
bool find_data(std::span<const std::byte> example, std::string_view name, ListKind& kind,
               std::span<const std::byte>& list, const std::string& path) {
  std::span<const std::byte> feature;
  if (!find_feature(example, name, feature, path)) return false;
  kind = feature_kind(feature, list, path);
  if (kind == kEmpty) throw DecodeError(path, "feature '" + std::string(name) + "' is empty");
  return true;
}

}  // namespace

uint32_t masked_crc32c(std::span<const std::byte> bytes) {
  const uint32_t crc = crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::span<const std::byte> unframe_record(std::span<const std::byte> framed,
                                          const std::string& path) {
  if (framed.size() < kFramingBytes) throw DecodeError(path, "TFRecord: truncated record");
  const uint64_t length = load_u64(framed.data());
  if (load_u32(framed.data() + 8) != masked_crc32c(framed.first(8))) {
    throw DecodeError(path, "TFRecord: bad CRC of the record length");
  }
  if (length != framed.size() - kFramingBytes) {
    throw DecodeError(
        path, "TFRecord: record length " + std::to_string(length) + " does not match its " +
                  std::to_string(framed.size() - kFramingBytes) + " bytes (truncated or changed)");
  }
  const auto data = framed.subspan(12, length);
  if (load_u32(framed.data() + 12 + length) != masked_crc32c(data)) {
    throw DecodeError(path, "TFRecord: bad CRC of the record data");
  }
  return data;
}

void scan_tfrecord(
    const std::string& file, const std::string& path, uint64_t max_record,
    const std::function<void(uint64_t, uint64_t, std::span<const std::byte>)>& record,
    const TfrecordDamage& damaged) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    const int err = errno;
    throw IoError(path, err, "cannot open TFRecord file '" + path + "': " + std::strerror(err));
  }
  // The file's size bounds every record's length before anything is allocated for it.
  in.seekg(0, std::ios::end);
  const std::streamoff end = in.tellg();
  in.seekg(0, std::ios::beg);
  if (end < 0 || !in) throw IoError(path, EIO, "cannot read TFRecord file '" + path + "'");
  const auto file_size = static_cast<uint64_t>(end);
  // Returns whether the scan goes on after the damaged record.
  auto damage = [&](uint64_t offset, const std::string& why, bool rest_of_file) {
    if (!damaged) {
      throw DecodeError(path, "TFRecord: " + why + " at byte " + std::to_string(offset));
    }
    damaged(offset, why, rest_of_file);
    return !rest_of_file;
  };
  std::vector<std::byte> framed;
  uint64_t offset = 0;
  while (true) {
    std::byte head[12];
    in.read(reinterpret_cast<char*>(head), sizeof(head));
    const auto got = static_cast<size_t>(in.gcount());
    if (got == 0 && in.eof()) break;
    if (in.bad()) break;
    if (got != sizeof(head)) {
      damage(offset,
             "truncated record header (the file ends " + std::to_string(got) + " bytes into it)",
             true);
      break;
    }
    const uint64_t length = load_u64(head);
    if (load_u32(head + 8) != masked_crc32c(std::span<const std::byte>(head, 8))) {
      damage(offset, "bad CRC of the record length", true);
      break;
    }
    if (offset + sizeof(head) > file_size || length > file_size - offset - sizeof(head) ||
        file_size - offset - sizeof(head) - length < 4) {
      damage(offset,
             "truncated record (its length says " + std::to_string(length) +
                 " bytes, the file ends " + std::to_string(file_size - offset) +
                 " bytes after its start)",
             true);
      break;
    }
    const uint64_t framed_length = length + kFramingBytes;
    if (length > max_record) {
      if (!damage(offset, "record of " + std::to_string(length) + " bytes exceeds max_sample_bytes",
                  false)) {
        break;
      }
      in.seekg(static_cast<std::streamoff>(length + 4), std::ios::cur);
      offset += framed_length;
      continue;
    }
    framed.resize(framed_length);
    std::memcpy(framed.data(), head, sizeof(head));
    in.read(reinterpret_cast<char*>(framed.data() + sizeof(head)),
            static_cast<std::streamsize>(length + 4));
    if (static_cast<uint64_t>(in.gcount()) != length + 4) {
      if (in.bad()) break;
      damage(offset, "truncated record (the file became shorter while it was read)", true);
      break;
    }
    const auto data = std::span<const std::byte>(framed).subspan(12, length);
    if (load_u32(framed.data() + 12 + length) != masked_crc32c(data)) {
      if (!damage(offset, "bad CRC of the record data", false)) break;
    } else {
      record(offset, framed_length, data);
    }
    offset += framed_length;
  }
  if (in.bad()) throw IoError(path, EIO, "cannot read TFRecord file '" + path + "'");
}

bool example_bytes(std::span<const std::byte> example, std::string_view name,
                   std::span<const std::byte>& value, const std::string& path) {
  std::span<const std::byte> feature;
  if (!find_feature(example, name, feature, path)) return false;
  value = first_bytes(feature_list(feature, kBytesList, name, path), name, path);
  return true;
}

bool example_int64(std::span<const std::byte> example, std::string_view name, int64_t& value,
                   const std::string& path) {
  std::span<const std::byte> feature;
  if (!find_feature(example, name, feature, path)) return false;
  Wire list(feature_list(feature, kInt64List, name, path), path);
  uint32_t field, type;
  while (list.next(field, type)) {
    if (field == 1 && type == 0) {  // unpacked
      value = static_cast<int64_t>(list.varint());
      return true;
    }
    if (field == 1 && type == 2) {  // packed
      Wire packed(list.bytes(), path);
      if (packed.done()) continue;
      value = static_cast<int64_t>(packed.varint());
      return true;
    }
    list.skip(type);
  }
  throw DecodeError(path, "feature '" + std::string(name) + "' holds no int64 value");
}

bool example_values(std::span<const std::byte> example, std::string_view name, uint64_t max_bytes,
                    std::vector<std::byte>& buffer, std::span<const std::byte>& values,
                    std::string_view& dtype, const std::string& path) {
  ListKind kind;
  std::span<const std::byte> list;
  if (!find_data(example, name, kind, list, path)) return false;
  if (kind == kBytesList) {
    values = first_bytes(list, name, path);
    dtype = "|u1";
    return true;
  }
  // Counted first, so that the buffer is sized once and bounded before it grows.
  uint64_t count = 0;
  each_value(list, kind, path, [&](uint64_t) { ++count; });
  const size_t item = kind == kFloatList ? 4 : 8;
  if (count > max_bytes / item) {
    throw DecodeError(path, "feature '" + std::string(name) + "' holds " + std::to_string(count) +
                                " values, more than max_sample_bytes (" +
                                std::to_string(max_bytes) + " bytes)");
  }
  const auto bytes = static_cast<size_t>(count * item);
  if (buffer.size() < bytes) buffer.resize(bytes);
  std::byte* out = buffer.data();
  // Little-endian on a little-endian host (as the catalog format requires): stored as they are.
  each_value(list, kind, path, [&](uint64_t bits) {
    if (item == 4) {
      const auto v = static_cast<uint32_t>(bits);
      std::memcpy(out, &v, 4);
    } else {
      std::memcpy(out, &bits, 8);
    }
    out += item;
  });
  values = std::span<const std::byte>(buffer.data(), bytes);
  dtype = kind == kFloatList ? "<f4" : "<i8";
  return true;
}

bool example_has_data(std::span<const std::byte> example, std::string_view name,
                      const std::string& path, std::string_view* dtype) {
  ListKind kind;
  std::span<const std::byte> list;
  if (!find_data(example, name, kind, list, path)) return false;
  if (kind == kBytesList) {
    first_bytes(list, name, path);
  } else {
    each_value(list, kind, path, [](uint64_t) {});
  }
  if (dtype != nullptr) *dtype = kind == kBytesList ? "|u1" : kind == kFloatList ? "<f4" : "<i8";
  return true;
}

}  // namespace prestage::detail
