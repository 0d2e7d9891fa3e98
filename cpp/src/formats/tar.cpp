#include "formats/tar.hpp"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string_view>

#include "formats/compressed.hpp"
#include "prestage/error.hpp"

namespace prestage::detail {

ForwardReader::ForwardReader(const FileRef& file)
    : path_(file.path()), file_(std::in_place, file), size_(file_->size()) {}

ForwardReader::ForwardReader(const FileRef& file, Catalog::Codec codec, uint64_t size)
    : path_(file.path()),
      stream_(std::make_unique<Decompressor>(file, codec, path_)),
      size_(size) {}

ForwardReader::~ForwardReader() = default;

std::span<const std::byte> ForwardReader::bytes(uint64_t offset, uint64_t length) {
  if (offset > size_ || length > size_ - offset) {
    throw IoError(path_, EIO,
                  "'" + path_ + "': a read of " + std::to_string(length) + " bytes at byte " +
                      std::to_string(offset) + " runs past its end (" + std::to_string(size_) +
                      " bytes)");
  }
  if (stream_) return stream_bytes(offset, length);
  if (offset < start_ || offset + length > start_ + window_.size()) {
    start_ = offset;
    window_.resize(std::max(length, std::min(kWindow, size_ - offset)));
    file_->read(offset, window_);
  }
  return std::span<const std::byte>(window_).subspan(offset - start_, length);
}

std::span<const std::byte> ForwardReader::stream_bytes(uint64_t offset, uint64_t length) {
  if (offset < start_) {
    throw DecodeError(path_, "a compressed file is read forward only: byte " +
                                 std::to_string(offset) + " was asked for after byte " +
                                 std::to_string(start_));
  }
  const uint64_t end = start_ + window_.size();
  if (offset + length <= end) {
    return std::span<const std::byte>(window_).subspan(offset - start_, length);
  }
  const auto changed = [&] {
    throw DecodeError(path_, "its decompressed bytes end before byte " + std::to_string(size_) +
                                 ", where they ended when it was first read: it changed");
  };
  if (offset >= end) {
    // Passed over: decompressed into the window, which then starts at `offset`.
    uint64_t skip = offset - end;
    window_.resize(static_cast<size_t>(std::min(skip, kWindow)));
    while (skip > 0) {
      const size_t n = stream_->read(
          std::span<std::byte>(window_.data(), std::min<uint64_t>(skip, window_.size())));
      if (n == 0) changed();
      skip -= n;
    }
    window_.clear();
  } else {
    window_.erase(window_.begin(), window_.begin() + static_cast<ptrdiff_t>(offset - start_));
  }
  start_ = offset;
  const uint64_t want = std::max(length, std::min(kWindow, size_ - offset));
  size_t have = window_.size();
  window_.resize(static_cast<size_t>(want));
  while (have < want) {
    const size_t n = stream_->read(std::span<std::byte>(window_.data() + have, want - have));
    if (n == 0) changed();
    have += n;
  }
  return std::span<const std::byte>(window_).subspan(0, length);
}

namespace {

constexpr uint64_t kBlock = 512;
// A pax header's records or a GNU long name: metadata, never this large in a real archive.
constexpr uint64_t kMaxMeta = uint64_t{1} << 20;

uint64_t round_up(uint64_t n) { return (n + kBlock - 1) / kBlock * kBlock; }

std::string_view field(std::span<const std::byte> h, size_t at, size_t len) {
  std::string_view s(reinterpret_cast<const char*>(h.data()) + at, len);
  return s.substr(0, s.find('\0'));
}

// A numeric header field: octal text (cut at a NUL, spaces around it), or GNU's base-256 (first
// byte 0x80, then big-endian). Empty if it does not parse or is negative.
std::optional<uint64_t> number(std::span<const std::byte> h, size_t at, size_t len) {
  const auto first = std::to_integer<uint8_t>(h[at]);
  if (first == 0x80) {
    uint64_t v = 0;
    for (size_t i = 1; i < len; ++i) {
      if (v >> 55 != 0) return std::nullopt;
      v = v << 8 | std::to_integer<uint8_t>(h[at + i]);
    }
    if (v >> 63 != 0) return std::nullopt;
    return v;
  }
  if (first & 0x80) return std::nullopt;  // 0xff: negative base-256
  std::string_view s = field(h, at, len);
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '7' || v >> 60 != 0) return std::nullopt;
    v = v * 8 + static_cast<uint64_t>(c - '0');
  }
  return v;
}

bool all_zero(std::span<const std::byte> h) {
  return std::all_of(h.begin(), h.end(), [](std::byte b) { return b == std::byte{0}; });
}

// The header's checksum, with its own field counted as spaces; old writers summed signed bytes.
bool checksum_ok(std::span<const std::byte> h) {
  const auto stored = number(h, 148, 8);
  if (!stored) return false;
  int64_t unsigned_sum = 0, signed_sum = 0;
  for (size_t i = 0; i < kBlock; ++i) {
    const auto b = std::to_integer<uint8_t>(h[i]);
    const bool in_field = i >= 148 && i < 156;
    unsigned_sum += in_field ? ' ' : b;
    signed_sum += in_field ? ' ' : static_cast<int8_t>(b);
  }
  return static_cast<int64_t>(*stored) == unsigned_sum ||
         static_cast<int64_t>(*stored) == signed_sum;
}

// A header whose checksum fails but that still looks like one: ustar magic and a printable name.
bool looks_like_header(std::span<const std::byte> h) {
  const std::string_view name = field(h, 0, 100);
  return field(h, 257, 5) == "ustar" && !name.empty() &&
         std::all_of(name.begin(), name.end(), [](char c) {
           const auto u = static_cast<unsigned char>(c);
           return u >= 0x20 && u != 0x7f;
         });
}

struct Pax {
  std::optional<std::string> path;
  std::optional<uint64_t> size;
  bool sparse = false;
};

// Pax records, "LEN KEY=VALUE\n" with LEN counting the whole record, into `pax`; a NUL where a
// record would start ends them (as Python's tarfile). Returns why they are malformed, or "".
std::string parse_pax(std::span<const std::byte> data, Pax& pax) {
  const std::string_view s(reinterpret_cast<const char*>(data.data()), data.size());
  size_t p = 0;
  while (p < s.size() && s[p] != '\0') {
    size_t q = p;
    uint64_t len = 0;
    while (q < s.size() && s[q] >= '0' && s[q] <= '9' && len < kMaxMeta) {
      len = len * 10 + static_cast<uint64_t>(s[q++] - '0');
    }
    if (q == p || q >= s.size() || s[q] != ' ')
      return "a pax record does not start with its length";
    if (len > s.size() - p || len < q - p + 3) {
      return "a pax record's length (" + std::to_string(len) + ") runs past its header's data";
    }
    const std::string_view record = s.substr(q + 1, len - (q + 1 - p));
    if (record.back() != '\n') return "a pax record does not end where its length says";
    const size_t eq = record.find('=');
    if (eq == std::string_view::npos || eq == 0) return "a pax record has no keyword";
    const std::string_view key = record.substr(0, eq);
    const std::string_view value = record.substr(eq + 1, record.size() - eq - 2);
    if (key == "path") {
      pax.path = std::string(value);
    } else if (key == "size") {
      uint64_t v = 0;
      for (char c : value) {
        if (c < '0' || c > '9' || v > (~uint64_t{0} >> 1) / 10) {
          return "a pax size '" + std::string(value) + "' is not a number";
        }
        v = v * 10 + static_cast<uint64_t>(c - '0');
      }
      if (value.empty()) return "a pax size is empty";
      pax.size = v;
    } else if (key.starts_with("GNU.sparse.")) {
      pax.sparse = true;
    }
    p += len;
  }
  return "";
}

}  // namespace

bool tar_header_ok(std::span<const std::byte> block) {
  return block.size() == kBlock && !all_zero(block) && checksum_ok(block);
}

std::optional<TarHeader> read_tar_header(std::span<const std::byte> block) {
  if (!tar_header_ok(block)) return std::nullopt;
  TarHeader out;
  out.type = static_cast<char>(block[156]);
  out.size = number(block, 124, 12);
  out.name = std::string(field(block, 0, 100));
  if (field(block, 257, 6) == "ustar" && block[262] == std::byte{0}) {
    const std::string_view prefix = field(block, 345, 155);
    if (!prefix.empty()) out.name = std::string(prefix) + "/" + out.name;
  }
  return out;
}

void scan_tar(ForwardReader& in, const std::function<void(const TarMember&)>& member,
              const std::function<void(const TarDamage&)>& damaged) {
  const uint64_t size = in.size();
  Pax global;
  // What the headers before a member say of it.
  Pax pax;
  std::optional<std::string> long_name;
  std::optional<uint64_t> first_header;
  // Its pax or long name was malformed (at `lost_at`, why): the member is lost with it, and the
  // damage is told when its header names it.
  std::optional<uint64_t> lost_at;
  std::string lost_why;
  auto clear = [&] {
    pax = Pax{};
    long_name.reset();
    first_header.reset();
    lost_at.reset();
  };
  uint64_t pos = 0;
  // Whether `pos` was reached by a header's own size (a good header's, or the start), not by
  // the size of a member's data, which may lie.
  bool vouched = true;
  // Damage at `at`: the scan goes on at the next block that is a good header, if any. Returns
  // whether it does.
  auto resync = [&](uint64_t at, std::string name, std::string reason, bool suspect) {
    clear();
    for (uint64_t b = at + kBlock; b + kBlock <= size; b += kBlock) {
      const auto h = in.bytes(b, kBlock);
      if (!all_zero(h) && checksum_ok(h)) {
        damaged(TarDamage{at, std::move(name), std::move(reason), false, b, suspect});
        pos = b;
        vouched = true;
        return true;
      }
    }
    damaged(TarDamage{at, std::move(name), std::move(reason), true, 0, suspect});
    return false;
  };
  auto end_damage = [&](uint64_t at, std::string name, std::string reason, bool suspect) {
    damaged(TarDamage{at, std::move(name), std::move(reason), true, 0, suspect});
  };
  while (pos < size) {
    if (size - pos < kBlock) {
      end_damage(
          pos, "",
          "truncated header (the file ends " + std::to_string(size - pos) + " bytes into it)",
          !vouched);
      return;
    }
    const auto h = in.bytes(pos, kBlock);
    if (all_zero(h)) {  // the end-of-archive marker
      if (lost_at) end_damage(*lost_at, "", lost_why + " (and no member follows it)", false);
      return;
    }
    if (!checksum_ok(h)) {
      const bool like = looks_like_header(h);
      if (!resync(pos, like ? std::string(field(h, 0, 100)) : std::string(), "bad header checksum",
                  !vouched && !like)) {
        return;
      }
      continue;
    }
    vouched = true;
    const char type = static_cast<char>(h[156]);
    std::string name(field(h, 0, 100));
    if (field(h, 257, 6) == "ustar" && h[262] == std::byte{0}) {  // POSIX ustar: a name prefix
      const std::string_view prefix = field(h, 345, 155);
      if (!prefix.empty()) name = std::string(prefix) + "/" + name;
    }
    const auto header_size = number(h, 124, 12);
    if (!header_size) {
      if (!resync(pos, name, "bad size field in the header", false)) return;
      continue;
    }
    const uint64_t data = pos + kBlock;
    // The size that decides where the next header is.
    uint64_t data_size = *header_size;
    const bool meta = type == 'x' || type == 'g' || type == 'L' || type == 'K';
    if (!meta) {
      const auto& said = pax.size ? pax.size : global.size;
      if (said) {
        if (*header_size != 0 && *header_size != *said) {
          if (!resync(pos, name,
                      "its pax size (" + std::to_string(*said) + ") disagrees with its header's (" +
                          std::to_string(*header_size) + ")",
                      false)) {
            return;
          }
          continue;
        }
        data_size = *said;
      }
      if (pax.path) {
        name = *pax.path;
      } else if (long_name) {
        name = *long_name;
      } else if (global.path) {
        name = *global.path;
      }
    }
    const bool has_data = !(type >= '1' && type <= '6');
    if (has_data && data_size > size - data) {
      end_damage(pos, name,
                 "member of " + std::to_string(data_size) +
                     " bytes runs past the end of the file (" + std::to_string(size) +
                     " bytes): truncated?",
                 false);
      return;
    }
    const uint64_t next = has_data ? data + round_up(data_size) : data;
    if (meta) {
      if (!first_header) first_header = pos;
      if (type != 'K' && data_size > kMaxMeta) {
        if (!resync(pos, name, "a metadata header of " + std::to_string(data_size) + " bytes",
                    false)) {
          return;
        }
        continue;
      }
      const auto bytes = in.bytes(data, type == 'K' ? 0 : data_size);
      if (type == 'x' || type == 'g') {
        Pax& into = type == 'x' ? pax : global;
        const std::string why = parse_pax(bytes, into);
        if (!why.empty() && !lost_at) {
          lost_at = pos;
          lost_why = why;
        }
      } else if (type == 'L') {
        const std::string_view s(reinterpret_cast<const char*>(bytes.data()), bytes.size());
        long_name = std::string(s.substr(0, s.find('\0')));
      }
      pos = next;
      continue;
    }
    if (lost_at) {
      damaged(TarDamage{*lost_at, name, lost_why, false, next, false});
    } else if (type == 'S' || type == 'M' || pax.sparse) {
      damaged(TarDamage{pos, name,
                        type == 'M' ? "a multi-volume member (its data is not all in this file)"
                                    : "a sparse member (its data is not one byte range)",
                        false, next, false});
    } else if ((type == '0' || type == '\0' || type == '7') &&
               !(type == '\0' && name.ends_with('/'))) {
      member(TarMember{name, first_header.value_or(pos), data, data_size});
    }
    clear();
    if (next != data) vouched = false;
    pos = next;
  }
  if (lost_at) end_damage(*lost_at, "", lost_why + " (and no member follows it)", false);
}

}  // namespace prestage::detail
