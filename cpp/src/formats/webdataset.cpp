#include "formats/webdataset.hpp"

#include <glob.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>
#include <unordered_map>
#include <utility>

#include "formats/compressed.hpp"
#include "formats/json.hpp"
#include "prestage/error.hpp"

namespace prestage::detail {

namespace {

constexpr size_t kMaxNames = 10'000'000;
// A label member is read whole while the shard is scanned: text or a small JSON object.
constexpr uint64_t kMaxLabelBytes = uint64_t{16} << 20;

// The '}' that closes the '{' at `open`, or npos.
size_t closing_brace(std::string_view s, size_t open) {
  int depth = 0;
  for (size_t i = open; i < s.size(); ++i) {
    if (s[i] == '{') ++depth;
    if (s[i] == '}' && --depth == 0) return i;
  }
  return std::string_view::npos;
}

// The parts of `inner` between its top-level commas.
std::vector<std::string_view> top_level_parts(std::string_view inner) {
  std::vector<std::string_view> parts;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < inner.size(); ++i) {
    if (inner[i] == '{') ++depth;
    if (inner[i] == '}') --depth;
    if (inner[i] == ',' && depth == 0) {
      parts.push_back(inner.substr(start, i - start));
      start = i + 1;
    }
  }
  parts.push_back(inner.substr(start));
  return parts;
}

bool all_digits(std::string_view s) {
  if (!s.empty() && s.front() == '-') s.remove_prefix(1);
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
}

// `{a..b}` of integers: the names, zero-padded as braceexpand pads them. Empty if not a range.
std::vector<std::string> integer_range(std::string_view inner, std::string_view pattern) {
  const size_t dots = inner.find("..");
  if (dots == std::string_view::npos) return {};
  const std::string_view a = inner.substr(0, dots), b = inner.substr(dots + 2);
  if (!all_digits(a) || !all_digits(b) || a.size() > 18 || b.size() > 18) return {};
  int64_t from = 0, to = 0;
  std::from_chars(a.data(), a.data() + a.size(), from);
  std::from_chars(b.data(), b.data() + b.size(), to);
  const auto padded = [](std::string_view s) {
    if (!s.empty() && s.front() == '-') s.remove_prefix(1);
    return s.size() > 1 && s.front() == '0';
  };
  const size_t width = padded(a) || padded(b) ? std::max(a.size(), b.size()) : 0;
  const uint64_t count = static_cast<uint64_t>(from <= to ? to - from : from - to) + 1;
  if (count > kMaxNames) {
    throw ConfigError("shard pattern '" + std::string(pattern) + "': the range {" +
                      std::string(inner) + "} names more than " + std::to_string(kMaxNames) +
                      " shards");
  }
  std::vector<std::string> out;
  out.reserve(count);
  for (int64_t v = from;; v += from <= to ? 1 : -1) {
    std::string digits = std::to_string(v < 0 ? -v : v);
    if (digits.size() + (v < 0) < width) digits.insert(0, width - digits.size() - (v < 0), '0');
    out.push_back(v < 0 ? "-" + digits : digits);
    if (v == to) break;
  }
  return out;
}

void expand_into(std::string_view s, std::string_view pattern, std::vector<std::string>& out) {
  const size_t open = s.find('{');
  if (open == std::string_view::npos) {
    out.emplace_back(s);
    return;
  }
  const size_t close = closing_brace(s, open);
  if (close == std::string_view::npos) {
    throw ConfigError("shard pattern '" + std::string(pattern) + "': a '{' is never closed");
  }
  const std::string_view head = s.substr(0, open), inner = s.substr(open + 1, close - open - 1);
  std::vector<std::string> alternatives;
  const auto parts = top_level_parts(inner);
  if (parts.size() > 1) {
    for (auto part : parts) expand_into(part, pattern, alternatives);
  } else {
    alternatives = integer_range(inner, pattern);
    if (alternatives.empty()) alternatives.push_back("{" + std::string(inner) + "}");  // literal
  }
  std::vector<std::string> tails;
  expand_into(s.substr(close + 1), pattern, tails);
  if (alternatives.size() * tails.size() + out.size() > kMaxNames) {
    throw ConfigError("shard pattern '" + std::string(pattern) + "' names more than " +
                      std::to_string(kMaxNames) + " shards");
  }
  for (const auto& a : alternatives) {
    for (const auto& t : tails) out.push_back(std::string(head) + a + t);
  }
}

bool is_blank(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

std::optional<int64_t> parse_int(std::string_view s) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

std::string_view as_text(std::span<const std::byte> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

}  // namespace

std::vector<std::string> expand_braces(std::string_view pattern) {
  std::vector<std::string> out;
  expand_into(pattern, pattern, out);
  return out;
}

std::vector<std::filesystem::path> expand_shards(const std::vector<std::string>& patterns) {
  std::vector<std::filesystem::path> out;
  for (const auto& pattern : patterns) {
    for (const auto& name : expand_braces(pattern)) {
      if (name.find_first_of("*?[") == std::string::npos) {
        out.emplace_back(name);
        continue;
      }
      glob_t found{};
      const int rc = ::glob(name.c_str(), 0, nullptr, &found);
      if (rc == 0) {
        for (size_t i = 0; i < found.gl_pathc; ++i) out.emplace_back(found.gl_pathv[i]);
      }
      ::globfree(&found);
      if (rc == GLOB_NOMATCH) throw ConfigError("no shard matches '" + name + "'");
      if (rc != 0) throw IoError(name, EIO, "cannot match shard pattern '" + name + "'");
    }
  }
  if (out.empty()) throw ConfigError("no shards given");
  return out;
}

std::optional<KeyExt> split_key(std::string_view name) {
  const size_t slash = name.rfind('/');
  const size_t base = slash == std::string_view::npos ? 0 : slash + 1;
  const size_t dot = name.find('.', base);
  if (dot == std::string_view::npos || dot == base) return std::nullopt;
  std::string ext(name.substr(dot + 1));
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return KeyExt{name.substr(0, dot), std::move(ext)};
}

bool is_meta(std::string_view name, std::string_view key) {
  const auto dunder = [](std::string_view s) {
    return s.size() >= 4 && s.starts_with("__") && s.ends_with("__");
  };
  if (name.find('/') == std::string_view::npos && dunder(name)) return true;
  // skip_meta, matched from the start: "__", no '/', "__", then the end or a '/'.
  if (name.starts_with("__")) {
    const size_t slash = name.find('/');
    const std::string_view head = name.substr(0, slash);
    if (dunder(head)) return true;
  }
  const size_t slash = key.rfind('/');
  return dunder(key.substr(slash == std::string_view::npos ? 0 : slash + 1));
}

std::optional<int64_t> decimal_label(std::span<const std::byte> bytes) {
  std::string_view s = as_text(bytes);
  while (!s.empty() && is_blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_blank(s.back())) s.remove_suffix(1);
  return parse_int(s);
}

std::optional<int64_t> json_label(std::span<const std::byte> bytes, std::string_view key) {
  const auto json = parse_json(as_text(bytes));
  const JsonValue* value = json ? json->find(key) : nullptr;
  return value ? value->integer() : std::nullopt;
}

namespace {

// The members of one key, as the scan finds them.
struct Run {
  std::string key;
  uint64_t start = 0;  // its first member's first header
  std::vector<std::string> exts;
  std::vector<std::optional<std::pair<uint64_t, uint64_t>>> data;  // per alternative
  std::optional<int64_t> label;
  std::string problem;  // a duplicate extension or a bad label: the sample is damage
  bool lost = false;    // tar damage while it was read
  bool after_damage = false;
};

std::string list(const std::vector<std::string>& exts, const char* sep) {
  std::string out;
  for (const auto& e : exts) out += (out.empty() ? "" : sep) + e;
  return out.empty() ? "none" : out;
}

// The codec of a compressed stream, by its magic bytes; null for anything else.
const char* compression(std::span<const std::byte> head) {
  const std::string_view s(reinterpret_cast<const char*>(head.data()), head.size());
  if (s.starts_with("\x1f\x8b")) return "gzip";
  if (s.starts_with("\x28\xb5\x2f\xfd")) return "zstd";
  if (s.starts_with("BZh")) return "bzip2";
  if (s.starts_with(std::string_view("\xfd"
                                     "7zXZ\0",
                                     6)))
    return "xz";
  return nullptr;
}

}  // namespace

uint64_t scan_webdataset(const FileRef& file, const std::string& path, const WdsFields& fields,
                         const std::function<void(const WdsSample&)>& sample,
                         const std::function<void(const WdsDamage&)>& damaged, Catalog::Codec codec,
                         uint64_t decompressed) {
  const auto damage = [&](uint64_t offset, const std::string& reason, bool rest_of_file) {
    if (!damaged)
      throw DecodeError(path, "WebDataset shard: " + reason + " at byte " + std::to_string(offset));
    damaged(WdsDamage{offset, reason, rest_of_file});
  };
  std::optional<ForwardReader> reader;
  if (codec == Catalog::Codec::kNone) {
    reader.emplace(file);
  } else {
    reader.emplace(file, codec, decompressed);
  }
  ForwardReader& in = *reader;
  const auto head = in.bytes(0, std::min<uint64_t>(in.size(), 512));
  const char* other = tar_header_ok(head) ? nullptr : compression(head);
  if (other) {
    throw ConfigError("'" + path + "' is a tar compressed with " + other +
                      ": prestage reads gzip (.tar.gz) and zstd (.tar.zst) shards, decompressed "
                      "while staging; decompress it, or recompress it with gzip or zstd");
  }
  std::vector<Run> runs;
  std::unordered_map<std::string, size_t>
      key_runs;       // runs of each key (more than one: interleaved)
  bool open = false;  // the last run may still grow
  bool after_damage = false;
  std::optional<std::string> dropping;
  scan_tar(
      in,
      [&](const TarMember& m) {
        const auto split = split_key(m.name);
        if (!split || is_meta(m.name, split->key)) return;
        if (dropping) {  // the rest of a sample lost to damage
          if (split->key == *dropping) return;
          dropping.reset();
        }
        if (!open || runs.back().key != split->key) {
          Run run;
          run.key = std::string(split->key);
          run.start = m.header;
          run.data.resize(fields.data.size());
          run.after_damage = std::exchange(after_damage, false);
          if (++key_runs[run.key] > 1 && !damaged) {
            damage(m.header,
                   "key '" + run.key + "' comes back after other keys (member '" + m.name +
                       "'): its members are not adjacent (interleaved keys)",
                   false);
          }
          runs.push_back(std::move(run));
          open = true;
        }
        Run& run = runs.back();
        const std::string& ext = split->ext;
        if (std::find(run.exts.begin(), run.exts.end(), ext) != run.exts.end()) {
          if (run.problem.empty()) {
            run.problem = "sample '" + run.key + "' has two members of extension '" + ext + "' ('" +
                          m.name + "' is the second)";
          }
          return;
        }
        run.exts.push_back(ext);
        for (size_t a = 0; a < fields.data.size(); ++a) {
          if (ext == fields.data[a]) run.data[a] = std::make_pair(m.offset, m.size);
        }
        if (!fields.label_ext.empty() && ext == fields.label_ext && run.problem.empty()) {
          if (m.size > kMaxLabelBytes) {
            run.problem =
                "label member '" + m.name + "' holds " + std::to_string(m.size) + " bytes";
            return;
          }
          const auto text = in.bytes(m.offset, m.size);
          run.label =
              fields.label_key.empty() ? decimal_label(text) : json_label(text, fields.label_key);
          if (!run.label) {
            run.problem = fields.label_key.empty()
                              ? "label member '" + m.name + "' is not a decimal integer"
                              : "label member '" + m.name +
                                    "' is not a JSON object with an integer '" + fields.label_key +
                                    "'";
          }
        }
      },
      [&](const TarDamage& d) {
        std::string reason = d.name.empty() ? d.reason : "member '" + d.name + "': " + d.reason;
        // The sample being read is lost if the damage may be its doing (its last member's size
        // may lie) or may have taken some of its members.
        const auto split = split_key(d.name);
        if (open && (d.previous_suspect || !split || split->key == runs.back().key)) {
          runs.back().lost = true;
          dropping = runs.back().key;
          reason += " (sample '" + runs.back().key + "' is lost with it)";
        }
        if (!d.rest_of_file) {
          reason += "; the scan went on at byte " + std::to_string(d.resumed);
        }
        open = false;
        after_damage = true;
        damage(d.offset, reason, d.rest_of_file);
      });
  for (const Run& run : runs) {
    if (run.lost) continue;
    if (key_runs[run.key] > 1) {
      damage(run.start,
             "key '" + run.key + "' is in " + std::to_string(key_runs[run.key]) +
                 " runs of members that are not adjacent (interleaved keys): each left out",
             false);
      continue;
    }
    if (!run.problem.empty()) {
      damage(run.start, run.problem, false);
      continue;
    }
    WdsSample out;
    const auto data =
        std::find_if(run.data.begin(), run.data.end(), [](const auto& d) { return d.has_value(); });
    bool missing_data = !fields.data.empty() && data == run.data.end();
    const bool missing_label = !fields.label_ext.empty() && !run.label;
    if (missing_data || missing_label) {
      const std::string what = missing_data ? "no member of extension " + list(fields.data, " or ")
                                            : "no label member '" + fields.label_ext + "'";
      const std::string reason =
          "sample '" + run.key + "' has " + what + " (it has: " + list(run.exts, ", ") + ")";
      if (run.after_damage) {
        damage(run.start, reason + "; it follows damage, which may have taken the rest", false);
        continue;
      }
      if (fields.missing == WdsFields::Missing::kError) {
        damage(run.start, reason, false);
        continue;
      }
      if (fields.missing == WdsFields::Missing::kSkip) continue;
    }
    if (data != run.data.end()) {
      out.offset = (*data)->first;
      out.length = (*data)->second;
    } else {
      out.offset = run.start;
      out.length = 0;
    }
    out.label = run.label.value_or(-1);
    sample(out);
  }
  return in.size();
}

namespace {

// The whitespace-separated words of `line`.
std::vector<std::string_view> words(std::string_view line) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && is_blank(line[i])) ++i;
    const size_t start = i;
    while (i < line.size() && !is_blank(line[i])) ++i;
    if (i > start) out.push_back(line.substr(start, i - start));
  }
  return out;
}

}  // namespace

uint64_t index_webdataset(const FileRef& file, const std::string& path, std::string_view index,
                          const std::string& index_path, const WdsFields& fields,
                          const std::function<void(const WdsSample&)>& sample,
                          const std::function<void(const WdsDamage&)>& damaged) {
  size_t line_no = 0;
  const auto wrong = [&](const std::string& why) -> ConfigError {
    return ConfigError("WebDataset index '" + index_path + "' line " + std::to_string(line_no) +
                       " does not describe shard '" + path + "': " + why);
  };
  const auto next_line = [&]() -> std::optional<std::string_view> {
    if (index.empty()) return std::nullopt;
    const size_t end = index.find('\n');
    std::string_view line = index.substr(0, end);
    index.remove_prefix(end == std::string_view::npos ? index.size() : end + 1);
    ++line_no;
    return line;
  };
  const auto head = next_line();
  const auto first = head ? words(*head) : std::vector<std::string_view>{};
  const bool v12 = first.size() == 2 && first[0] == "v1.2";
  if (first.size() != 2 || (first[0] != "v1.1" && !v12)) {
    throw ConfigError("'" + index_path +
                      "' is not a DALI WebDataset index (a first line \"v1.1 N\" or \"v1.2 N\", "
                      "as wds2idx writes)");
  }
  const auto count = parse_int(first[1]);
  if (!count || *count < 0) throw wrong("the sample count '" + std::string(first[1]) + "'");
  const size_t group = v12 ? 4 : 3;
  ForwardReader in(file);
  const uint64_t size = in.size();
  uint64_t end_of_last = 0;
  int64_t samples = 0;
  std::vector<WdsSample> out;
  std::vector<WdsDamage> damage;
  while (const auto line = next_line()) {
    const auto w = words(*line);
    if (w.empty()) continue;
    if (++samples > *count) {
      throw wrong("more samples than its count (" + std::to_string(*count) + ")");
    }
    if (w.size() % group != 0) {
      throw wrong("a line of " + std::to_string(w.size()) + " words, not groups of " +
                  std::to_string(group));
    }
    std::string key;
    std::vector<std::string> exts;
    std::optional<std::pair<uint64_t, uint64_t>> data;
    size_t data_rank = fields.data.size();
    std::optional<int64_t> label;
    std::string problem;
    for (size_t g = 0; g < w.size(); g += group) {
      std::string ext(w[g]);
      std::transform(ext.begin(), ext.end(), ext.begin(),
                     [](unsigned char c) { return std::tolower(c); });
      const auto offset = parse_int(w[g + 1]);
      const auto length = parse_int(w[g + 2]);
      if (!offset || !length || *offset < 512 || *length < 0) {
        throw wrong("member '" + ext + "' has offset '" + std::string(w[g + 1]) + "' and size '" +
                    std::string(w[g + 2]) + "'");
      }
      const auto at = static_cast<uint64_t>(*offset);
      const auto n = static_cast<uint64_t>(*length);
      if (at % 512 != 0 || at < end_of_last + 512 || n > size || at > size - n) {
        throw wrong("member '" + ext + "' at byte " + std::to_string(at) + " of " +
                    std::to_string(n) + " bytes: not after the previous member at a block " +
                    "boundary within the shard's " + std::to_string(size) + " bytes");
      }
      end_of_last = at + n;
      const auto header = read_tar_header(in.bytes(at - 512, 512));
      const std::string name = v12 ? std::string(w[g + 3]) : std::string();
      if (!header || (header->type != '0' && header->type != '\0') ||
          (header->size && *header->size != n && *header->size != 0) ||
          (v12 && header->name.size() < 100 && header->name != name)) {
        throw wrong("member '" + (v12 ? name : ext) + "' at byte " + std::to_string(at) +
                    ": the block before it is not the tar header of a regular member of " +
                    std::to_string(n) + " bytes" + (v12 ? " named so" : ""));
      }
      if (v12) {
        const auto split = split_key(name);
        if (!split || split->ext != ext) {
          throw wrong("member '" + name + "' has no extension '" + ext + "'");
        }
        if (key.empty()) key = std::string(split->key);
        if (split->key != key) throw wrong("member '" + name + "' is not of key '" + key + "'");
      }
      if (std::find(exts.begin(), exts.end(), ext) != exts.end()) {
        if (problem.empty()) problem = "a sample has two members of extension '" + ext + "'";
        continue;
      }
      exts.push_back(ext);
      for (size_t a = 0; a < data_rank; ++a) {
        if (ext == fields.data[a]) {
          data = std::make_pair(at, n);
          data_rank = a;
          break;
        }
      }
      if (!fields.label_ext.empty() && ext == fields.label_ext && problem.empty()) {
        if (n > kMaxLabelBytes) {
          problem = "label member '" + ext + "' holds " + std::to_string(n) + " bytes";
          continue;
        }
        const auto text = in.bytes(at, n);
        label = fields.label_key.empty() ? decimal_label(text) : json_label(text, fields.label_key);
        if (!label) problem = "label member '" + ext + "' does not parse";
      }
    }
    const uint64_t start = static_cast<uint64_t>(*parse_int(w[1])) - 512;
    const std::string who =
        "sample " + (key.empty() ? "at line " + std::to_string(line_no) : "'" + key + "'");
    const bool missing_data = !fields.data.empty() && !data;
    const bool missing_label = !fields.label_ext.empty() && !label && problem.empty();
    if (problem.empty() && (missing_data || missing_label)) {
      if (fields.missing == WdsFields::Missing::kSkip) continue;
      if (fields.missing == WdsFields::Missing::kError) {
        problem = missing_data ? "no member of extension " + list(fields.data, " or ")
                               : "no label member '" + fields.label_ext + "'";
        problem += " (it has: " + list(exts, ", ") + ")";
      }
    }
    if (!problem.empty()) {
      const std::string reason = who + ": " + problem;
      if (!damaged) {
        throw DecodeError(path,
                          "WebDataset shard: " + reason + " at byte " + std::to_string(start));
      }
      damage.push_back(WdsDamage{start, reason, false});
      continue;
    }
    WdsSample s;
    s.offset = data ? data->first : start;
    s.length = data ? data->second : 0;
    s.label = label.value_or(-1);
    out.push_back(s);
  }
  if (samples != *count) {
    throw wrong("it lists " + std::to_string(samples) + " samples, its count says " +
                std::to_string(*count));
  }
  for (const auto& d : damage) damaged(d);
  for (const auto& s : out) sample(s);
  return size;
}

}  // namespace prestage::detail
