#include "formats/npz.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "formats/npy.hpp"
#include "formats/zstd_frame.hpp"
#include "prestage/error.hpp"
#include "util/inflate.hpp"

namespace prestage::detail {
namespace {

constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr uint32_t kCentralHeader = 0x02014b50;
constexpr uint32_t kEndOfDirectory = 0x06054b50;
constexpr uint32_t kZip64Locator = 0x07064b50;
constexpr uint32_t kZip64End = 0x06064b50;
constexpr uint64_t kEndBytes = 22;
constexpr uint64_t kMaxComment = 65535;
constexpr uint64_t kMaxDirectoryBytes = 64 << 20;
constexpr size_t kHeaderRead = 1 << 16;

uint16_t u16(const std::byte* p) {
  return static_cast<uint16_t>(std::to_integer<uint16_t>(p[0]) | std::to_integer<uint16_t>(p[1])
                                                                     << 8);
}
uint32_t u32(const std::byte* p) { return uint32_t{u16(p)} | uint32_t{u16(p + 2)} << 16; }
uint64_t u64(const std::byte* p) { return uint64_t{u32(p)} | uint64_t{u32(p + 4)} << 32; }

// A byte range of another source: a stored member inside its archive.
class RangeSource final : public ByteSource {
 public:
  RangeSource(const ByteSource& base, uint64_t offset, uint64_t length)
      : base_(base), offset_(offset), length_(length) {}
  uint64_t size() const override { return length_; }
  void read(uint64_t offset, std::span<std::byte> out) const override {
    if (offset > length_ || out.size() > length_ - offset) {
      throw DecodeError(path(), "truncated zip member");
    }
    base_.read(offset_ + offset, out);
  }
  std::span<const std::byte> memory() const override {
    const auto all = base_.memory();
    return all.empty() ? all : all.subspan(offset_, length_);
  }
  const std::string& path() const override { return base_.path(); }

 private:
  const ByteSource& base_;
  uint64_t offset_;
  uint64_t length_;
};

}  // namespace

bool is_zip(std::span<const std::byte> bytes) {
  return bytes.size() >= 4 && u32(bytes.data()) == kLocalHeader;
}

struct NpzDecoder::Impl {
  Inflater inflater{Inflater::Wrapping::kRaw};
  std::vector<std::byte> scratch;   // compressed data, directory, prefixes
  std::vector<std::byte> header;    // an inflated .npy header
  std::vector<std::byte> unpacked;  // a Fortran-order member, inflated

  [[noreturn]] static void fail(const ByteSource& source, const std::string& why) {
    throw DecodeError(source.path(), "npz: " + why);
  }

  // A new deflate stream to inflate from `in`.
  void start(const ByteSource& source, std::span<const std::byte> in) {
    if (!inflater.restart()) fail(source, "cannot start inflating");
    inflater.feed(in);
  }

  // Inflates into [out, out + size). Returns the bytes written; stops early only at the end of the
  // deflate stream (`*ended`) or of the input.
  size_t inflate_to(const ByteSource& source, std::byte* out, size_t size, bool* ended) {
    size_t written = 0;
    const char* error = nullptr;
    const Inflater::Status status = inflater.inflate(std::span(out, size), written, &error);
    if (status == Inflater::Status::kCorrupt) {
      fail(source, std::string("corrupt deflate data: ") + error);
    }
    *ended = status == Inflater::Status::kEnded;
    return written;
  }

  struct Entry {
    uint64_t compressed = 0, uncompressed = 0, offset = 0;
    uint32_t crc = 0;
    uint16_t method = 0, flags = 0;
  };

  // The central directory's entry for `want` (or the only entry, if `want` is empty).
  Entry find(const ByteSource& source, const std::string& want) {
    const uint64_t size = source.size();
    if (size < kEndBytes) fail(source, "too short for a zip archive");
    const uint64_t tail_len = std::min(size, kEndBytes + kMaxComment);
    const auto tail = read_span(source, size - tail_len, tail_len, scratch);
    int64_t eocd = -1;
    for (int64_t i = static_cast<int64_t>(tail_len - kEndBytes); i >= 0; --i) {
      if (u32(tail.data() + i) == kEndOfDirectory) {
        eocd = i;
        break;
      }
    }
    if (eocd < 0)
      fail(source, "no end-of-central-directory record (not a zip archive, or truncated)");
    const std::byte* e = tail.data() + eocd;
    uint64_t entries = u16(e + 10);
    uint64_t dir_size = u32(e + 12);
    uint64_t dir_offset = u32(e + 16);
    const uint64_t eocd_at = size - tail_len + static_cast<uint64_t>(eocd);
    if (entries == 0xFFFF || dir_size == 0xFFFFFFFF || dir_offset == 0xFFFFFFFF) {
      if (eocd_at < 20) fail(source, "zip64 locator missing");
      std::byte locator[20];
      source.read(eocd_at - 20, locator);
      if (u32(locator) != kZip64Locator) fail(source, "zip64 locator missing");
      const uint64_t end64 = u64(locator + 8);
      std::byte record[56];
      if (end64 > size || size - end64 < sizeof(record)) fail(source, "zip64 record out of range");
      source.read(end64, record);
      if (u32(record) != kZip64End) fail(source, "bad zip64 end record");
      entries = u64(record + 32);
      dir_size = u64(record + 40);
      dir_offset = u64(record + 48);
    }
    if (dir_offset > size || dir_size > size - dir_offset || dir_size > kMaxDirectoryBytes) {
      fail(source, "central directory out of range");
    }
    if (entries == 0) fail(source, "the archive is empty");
    const auto dir = read_span(source, dir_offset, dir_size, scratch);
    const std::string wanted = want.empty() ? std::string() : want + ".npy";
    std::string names;
    Entry found;
    bool have = false;
    uint64_t pos = 0;
    for (uint64_t k = 0; k < entries; ++k) {
      if (dir_size - pos < 46 || u32(dir.data() + pos) != kCentralHeader) {
        fail(source, "corrupt central directory");
      }
      const std::byte* c = dir.data() + pos;
      Entry entry;
      entry.flags = u16(c + 8);
      entry.method = u16(c + 10);
      entry.crc = u32(c + 16);
      entry.compressed = u32(c + 20);
      entry.uncompressed = u32(c + 24);
      const uint64_t name_len = u16(c + 28), extra_len = u16(c + 30), comment_len = u16(c + 32);
      entry.offset = u32(c + 42);
      if (dir_size - pos - 46 < name_len + extra_len + comment_len)
        fail(source, "corrupt central directory");
      const std::string name(reinterpret_cast<const char*>(c + 46), name_len);
      // Zip64 extra field: the 64-bit values of the fields that hold 0xFFFFFFFF, in this order.
      const std::byte* x = c + 46 + name_len;
      for (uint64_t q = 0; q + 4 <= extra_len;) {
        const uint16_t id = u16(x + q), len = u16(x + q + 2);
        if (q + 4 + len > extra_len) break;
        if (id == 0x0001) {
          const std::byte* f = x + q + 4;
          uint64_t left = len;
          auto take = [&](uint64_t& field) {
            if (field != 0xFFFFFFFF) return;
            if (left < 8) fail(source, "short zip64 extra field");
            field = u64(f);
            f += 8;
            left -= 8;
          };
          take(entry.uncompressed);
          take(entry.compressed);
          take(entry.offset);
        }
        q += 4 + len;
      }
      pos += 46 + name_len + extra_len + comment_len;
      if (!names.empty()) names += ", ";
      names += name;
      if (wanted.empty() ? entries == 1 : name == wanted) {
        found = entry;
        have = true;
      }
    }
    if (!have) {
      if (want.empty()) {
        fail(source, "the archive holds " + std::to_string(entries) + " arrays (" + names +
                         "); choose one with array_name");
      }
      fail(source, "no member '" + wanted + "' (members: " + names + ")");
    }
    return found;
  }
};

NpzDecoder::NpzDecoder() : impl_(std::make_unique<Impl>()) {}

NpzDecoder::~NpzDecoder() = default;

NpzMember NpzDecoder::probe(const ByteSource& archive, const std::string& name, ArrayInfo& info,
                            uint64_t max_bytes) {
  Impl& m = *impl_;
  const Impl::Entry entry = m.find(archive, name);
  if (entry.flags & 1) Impl::fail(archive, "encrypted members are not supported");
  if (entry.method != 0 && entry.method != 8) {
    Impl::fail(archive, "compression method " + std::to_string(entry.method) +
                            " is not supported (stored or deflated only)");
  }
  std::byte local[30];
  if (entry.offset > archive.size() || archive.size() - entry.offset < sizeof(local)) {
    Impl::fail(archive, "member header out of range");
  }
  archive.read(entry.offset, local);
  if (u32(local) != kLocalHeader) Impl::fail(archive, "bad local file header");
  NpzMember member;
  member.data_start = entry.offset + 30 + u16(local + 26) + u16(local + 28);
  member.compressed = entry.compressed;
  member.uncompressed = entry.uncompressed;
  member.crc = entry.crc;
  member.deflated = entry.method == 8;
  if (member.data_start > archive.size() ||
      member.compressed > archive.size() - member.data_start) {
    Impl::fail(archive, "member data runs past the end of the archive");
  }
  if (!member.deflated) {
    if (member.compressed != member.uncompressed)
      Impl::fail(archive, "stored member sizes disagree");
    const RangeSource data(archive, member.data_start, member.compressed);
    member.npy_offset = probe_npy(data, info, max_bytes, m.scratch);
    return member;
  }
  // Inflate just enough of the member to read its .npy header.
  uint64_t want = kHeaderRead;
  while (true) {
    const uint64_t take = std::min(want, member.compressed);
    const auto in = read_span(archive, member.data_start, take, m.scratch);
    m.start(archive, in);
    const size_t header_bytes = static_cast<size_t>(std::min<uint64_t>(want, member.uncompressed));
    if (m.header.size() < header_bytes) m.header.resize(header_bytes);
    bool ended = false;
    const size_t got = m.inflate_to(archive, m.header.data(), header_bytes, &ended);
    uint64_t needed = 0;
    const uint64_t offset =
        parse_npy_header(std::span(m.header.data(), got), info, max_bytes, archive.path(), &needed);
    if (offset != 0) {
      if (member.uncompressed < offset || member.uncompressed - offset != info.bytes) {
        Impl::fail(archive,
                   ".npy header describes " + std::to_string(info.bytes) +
                       " bytes of data, the member holds " +
                       std::to_string(member.uncompressed - std::min(offset, member.uncompressed)));
      }
      member.npy_offset = offset;
      return member;
    }
    if (ended || take == member.compressed || needed > member.uncompressed) {
      Impl::fail(archive, "truncated .npy header");
    }
    want = std::max(want * 2, needed * 2);
  }
}

void NpzDecoder::decode(const ByteSource& archive, const NpzMember& member, const ArrayInfo& info,
                        std::span<std::byte> out) {
  Impl& m = *impl_;
  if (out.size() != info.bytes)
    throw std::logic_error("NpzDecoder::decode: output of the wrong size");
  if (!member.deflated) {
    const RangeSource data(archive, member.data_start, member.compressed);
    const auto header = read_span(data, 0, member.npy_offset, m.header);
    uint32_t crc = zlib_crc32(0, header);
    if (!info.fortran || info.ndim <= 1) {
      data.read(member.npy_offset, out);
      crc = zlib_crc32(crc, out);
    } else {
      const auto bytes = read_span(data, member.npy_offset, info.bytes, m.unpacked);
      crc = zlib_crc32(crc, bytes);
      fortran_to_c(bytes.data(), out.data(), info);
    }
    if (crc != member.crc) Impl::fail(archive, "CRC mismatch in member data");
    return;
  }
  const auto in = read_span(archive, member.data_start, member.compressed, m.scratch);
  m.start(archive, in);
  bool ended = false;
  if (m.header.size() < member.npy_offset) m.header.resize(member.npy_offset);
  size_t got = m.inflate_to(archive, m.header.data(), member.npy_offset, &ended);
  uint32_t crc = zlib_crc32(0, std::span(m.header.data(), got));
  const bool transpose = info.fortran && info.ndim > 1;
  std::byte* target = out.data();
  if (transpose) {
    if (m.unpacked.size() < info.bytes) m.unpacked.resize(info.bytes);
    target = m.unpacked.data();
  }
  uint64_t written = 0;
  if (!ended) {
    written = m.inflate_to(archive, target, static_cast<size_t>(info.bytes), &ended);
  }
  if (got != member.npy_offset || written != info.bytes)
    Impl::fail(archive, "truncated deflate data");
  // The stream must end exactly here.
  std::byte probe[1];
  if (!ended && m.inflate_to(archive, probe, 1, &ended) != 0) {
    Impl::fail(archive, "member holds more data than its header describes");
  }
  if (!ended) Impl::fail(archive, "truncated deflate data");
  crc = zlib_crc32(crc, std::span<const std::byte>(target, info.bytes));
  if (crc != member.crc) Impl::fail(archive, "CRC mismatch in member data");
  if (transpose) fortran_to_c(target, out.data(), info);
}

ArrayFile probe_array_file(const ByteSource& file, const std::string& name, ArrayInfo& info,
                           uint64_t max_bytes, NpzDecoder& npz, std::vector<std::byte>& scratch) {
  std::array<std::byte, 8> magic;
  const std::span<const std::byte> head = read_magic(file, magic);
  ArrayFile found;
  if (is_npy(head)) {
    found.data_offset = probe_npy(file, info, max_bytes, scratch);
  } else if (is_zip(head)) {
    found.member = npz.probe(file, name, info, max_bytes);
    if (!found.member->deflated) {
      found.data_offset = found.member->data_start + found.member->npy_offset;
    }
  } else {
    throw DecodeError(file.path(), is_zstd_frame(head)
                                       ? "a zstd frame: an array is sliced from a .npy file or an "
                                         ".npz archive as NumPy wrote it"
                                       : "neither a .npy file nor a .npz archive");
  }
  return found;
}

}  // namespace prestage::detail
