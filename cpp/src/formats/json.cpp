#include "formats/json.hpp"

#include <charconv>

namespace prestage::detail {

namespace {

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

  bool document(JsonValue& out) {
    if (!value(out, 0)) return false;
    blanks();
    return p_ == s_.size();
  }

 private:
  void blanks() {
    while (p_ < s_.size() && (s_[p_] == ' ' || s_[p_] == '\t' || s_[p_] == '\n' || s_[p_] == '\r'))
      ++p_;
  }
  bool take(char c) {
    blanks();
    if (p_ < s_.size() && s_[p_] == c) return ++p_, true;
    return false;
  }
  bool word(std::string_view w) {
    if (s_.substr(p_, w.size()) != w) return false;
    p_ += w.size();
    return true;
  }
  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  bool hex4(uint32_t& v) {
    if (s_.size() - p_ < 4) return false;
    v = 0;
    for (int i = 0; i < 4; ++i) {
      const int d = hex(s_[p_++]);
      if (d < 0) return false;
      v = v << 4 | static_cast<uint32_t>(d);
    }
    return true;
  }
  static void utf8(uint32_t cp, std::string& out) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | cp >> 6);
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | cp >> 12);
      out += static_cast<char>(0x80 | (cp >> 6 & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | cp >> 18);
      out += static_cast<char>(0x80 | (cp >> 12 & 0x3F));
      out += static_cast<char>(0x80 | (cp >> 6 & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  bool string(std::string& out) {
    if (!take('"')) return false;
    while (p_ < s_.size()) {
      const char c = s_[p_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return false;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (p_ >= s_.size()) return false;
      const char e = s_[p_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          uint32_t cp = 0;
          if (!hex4(cp)) return false;
          if (cp >= 0xD800 && cp < 0xDC00 && s_.substr(p_, 2) == "\\u") {
            p_ += 2;
            uint32_t low = 0;
            if (!hex4(low) || low < 0xDC00 || low >= 0xE000) return false;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          utf8(cp, out);
          break;
        }
        default:
          return false;
      }
    }
    return false;
  }
  bool number(std::string& out) {
    const size_t start = p_;
    if (p_ < s_.size() && s_[p_] == '-') ++p_;
    const auto digits = [&] {
      const size_t from = p_;
      while (p_ < s_.size() && s_[p_] >= '0' && s_[p_] <= '9') ++p_;
      return p_ > from;
    };
    if (!digits()) return false;
    if (p_ < s_.size() && s_[p_] == '.') {
      ++p_;
      if (!digits()) return false;
    }
    if (p_ < s_.size() && (s_[p_] == 'e' || s_[p_] == 'E')) {
      ++p_;
      if (p_ < s_.size() && (s_[p_] == '+' || s_[p_] == '-')) ++p_;
      if (!digits()) return false;
    }
    out.assign(s_.substr(start, p_ - start));
    return true;
  }
  bool value(JsonValue& v, int depth) {
    if (depth > kJsonMaxDepth) return false;
    blanks();
    if (p_ >= s_.size()) return false;
    const char c = s_[p_];
    if (c == '{') {
      ++p_;
      v.type = JsonValue::Type::kObject;
      if (take('}')) return true;
      do {
        std::string key;
        blanks();
        if (!string(key) || !take(':')) return false;
        JsonValue item;
        if (!value(item, depth + 1)) return false;
        v.keys.push_back(std::move(key));
        v.items.push_back(std::move(item));
      } while (take(','));
      return take('}');
    }
    if (c == '[') {
      ++p_;
      v.type = JsonValue::Type::kArray;
      if (take(']')) return true;
      do {
        JsonValue item;
        if (!value(item, depth + 1)) return false;
        v.items.push_back(std::move(item));
      } while (take(','));
      return take(']');
    }
    if (c == '"') {
      v.type = JsonValue::Type::kString;
      return string(v.text);
    }
    if (word("true")) return v.type = JsonValue::Type::kBool, v.boolean = true, true;
    if (word("false")) return v.type = JsonValue::Type::kBool, true;
    if (word("null")) return v.type = JsonValue::Type::kNull, true;
    v.type = JsonValue::Type::kNumber;
    return number(v.text);
  }

  std::string_view s_;
  size_t p_ = 0;
};

}  // namespace

const JsonValue* JsonValue::find(std::string_view key) const {
  if (type != Type::kObject) return nullptr;
  for (size_t i = keys.size(); i-- > 0;) {
    if (keys[i] == key) return &items[i];
  }
  return nullptr;
}

std::optional<int64_t> JsonValue::integer() const {
  if (type != Type::kNumber) return std::nullopt;
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

std::optional<JsonValue> parse_json(std::string_view text) {
  JsonValue out;
  if (!Parser(text).document(out)) return std::nullopt;
  return out;
}

}  // namespace prestage::detail
