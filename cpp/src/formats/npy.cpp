#include "formats/npy.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string_view>

#include "prestage/error.hpp"

namespace prestage::detail {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicBytes = 6;
// NumPy itself refuses headers over 10,000 bytes unless told otherwise; a data set's file never
// needs more than this.
constexpr uint64_t kMaxHeaderBytes = 1 << 20;
constexpr size_t kFirstRead = 4096;

// A parser for the one Python literal a .npy header holds:
// {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& path) : s_(text), path_(path) {}

  void parse(ArrayInfo& info) {
    bool have_descr = false, have_order = false, have_shape = false;
    expect('{');
    while (true) {
      skip_space();
      if (peek() == '}') break;
      const std::string key = string_literal();
      expect(':');
      skip_space();
      if (key == "descr") {
        if (peek() != '\'' && peek() != '"') fail("structured dtypes are not supported");
        info.dtype = string_literal();
        have_descr = true;
      } else if (key == "fortran_order") {
        info.fortran = boolean();
        have_order = true;
      } else if (key == "shape") {
        shape(info);
        have_shape = true;
      } else {
        fail("unexpected key '" + key + "'");
      }
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      skip_space();
      if (peek() != '}') fail("expected ',' or '}'");
    }
    if (!have_descr || !have_order || !have_shape)
      fail("header lacks descr, fortran_order or shape");
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw DecodeError(path_, "bad .npy header: " + why);
  }
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void skip_space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n')) ++pos_;
  }
  void expect(char c) {
    skip_space();
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  std::string string_literal() {
    skip_space();
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail("expected a string");
    const size_t end = s_.find(quote, pos_ + 1);
    if (end == std::string_view::npos) fail("unterminated string");
    std::string out(s_.substr(pos_ + 1, end - pos_ - 1));
    pos_ = end + 1;
    return out;
  }
  bool boolean() {
    if (s_.substr(pos_, 4) == "True") {
      pos_ += 4;
      return true;
    }
    if (s_.substr(pos_, 5) == "False") {
      pos_ += 5;
      return false;
    }
    fail("fortran_order is not True or False");
  }
  void shape(ArrayInfo& info) {
    expect('(');
    info.ndim = 0;
    while (true) {
      skip_space();
      if (peek() == ')') {
        ++pos_;
        return;
      }
      if (peek() < '0' || peek() > '9') fail("shape holds a non-integer");
      uint64_t value = 0;
      while (peek() >= '0' && peek() <= '9') {
        const uint64_t digit = static_cast<uint64_t>(peek() - '0');
        if (value > (~uint64_t{0} - digit) / 10) fail("shape overflows");
        value = value * 10 + digit;
        ++pos_;
      }
      if (info.ndim == kMaxDims) fail("more than " + std::to_string(kMaxDims) + " dimensions");
      info.shape[info.ndim++] = value;
      skip_space();
      if (peek() == ',') {
        ++pos_;
      } else if (peek() != ')') {
        fail("expected ',' or ')' in shape");
      }
    }
  }

  std::string_view s_;
  const std::string& path_;
  size_t pos_ = 0;
};

}  // namespace

bool is_npy(std::span<const std::byte> bytes) {
  return bytes.size() >= kMagicBytes && std::memcmp(bytes.data(), kMagic, kMagicBytes) == 0;
}

uint64_t parse_npy_header(std::span<const std::byte> prefix, ArrayInfo& info, uint64_t max_bytes,
                          const std::string& path, uint64_t* needed) {
  *needed = 0;
  if (prefix.size() < kMagicBytes + 4) {
    if (prefix.size() >= kMagicBytes && !is_npy(prefix)) {
      throw DecodeError(path, "not a .npy file (bad magic)");
    }
    *needed = kMagicBytes + 4;
    return 0;
  }
  if (!is_npy(prefix)) throw DecodeError(path, "not a .npy file (bad magic)");
  const auto* p = reinterpret_cast<const uint8_t*>(prefix.data());
  const uint8_t major = p[6];
  uint64_t header_len = 0;
  uint64_t start = 0;
  if (major == 1) {
    header_len = uint64_t{p[8]} | uint64_t{p[9]} << 8;
    start = 10;
  } else if (major == 2 || major == 3) {
    if (prefix.size() < 12) {
      *needed = 12;
      return 0;
    }
    header_len =
        uint64_t{p[8]} | uint64_t{p[9]} << 8 | uint64_t{p[10]} << 16 | uint64_t{p[11]} << 24;
    start = 12;
  } else {
    throw DecodeError(path, "unsupported .npy version " + std::to_string(major));
  }
  if (header_len > kMaxHeaderBytes) {
    throw DecodeError(path, ".npy header of " + std::to_string(header_len) + " bytes is too long");
  }
  if (prefix.size() < start + header_len) {
    *needed = start + header_len;
    return 0;
  }
  const std::string_view text(reinterpret_cast<const char*>(p + start), header_len);
  info = ArrayInfo{};
  HeaderParser(text, path).parse(info);
  finish_array_info(info, max_bytes, path);
  return start + header_len;
}

uint64_t probe_npy(const ByteSource& source, ArrayInfo& info, uint64_t max_bytes,
                   std::vector<std::byte>& scratch) {
  uint64_t want = std::min<uint64_t>(kFirstRead, source.size());
  while (true) {
    const auto prefix = read_span(source, 0, want, scratch);
    uint64_t needed = 0;
    const uint64_t data_offset = parse_npy_header(prefix, info, max_bytes, source.path(), &needed);
    if (data_offset != 0) {
      const uint64_t available = source.size() - data_offset;
      if (available != info.bytes) {
        throw DecodeError(source.path(), ".npy header describes " + std::to_string(info.bytes) +
                                             " bytes of data, the file holds " +
                                             std::to_string(available));
      }
      return data_offset;
    }
    if (needed > source.size()) throw DecodeError(source.path(), "truncated .npy header");
    want = needed;
  }
}

void decode_npy(const ByteSource& source, const ArrayInfo& info, uint64_t data_offset,
                std::span<std::byte> out, std::vector<std::byte>& scratch) {
  if (out.size() != info.bytes) throw std::logic_error("decode_npy: output of the wrong size");
  if (!info.fortran || info.ndim <= 1) {
    source.read(data_offset, out);  // a file is read straight into the batch buffer
    return;
  }
  const auto data = read_span(source, data_offset, info.bytes, scratch);
  fortran_to_c(data.data(), out.data(), info);
}

}  // namespace prestage::detail
