#include "prestage/catalog.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <iterator>
#include <system_error>
#include <tuple>
#include <utility>

#include "formats/array.hpp"
#include "formats/compressed.hpp"
#include "formats/hdf5.hpp"
#include "formats/mds.hpp"
#include "formats/npz.hpp"
#include "formats/tfrecord.hpp"
#include "formats/webdataset.hpp"
#include "prestage/error.hpp"
#include "util/file_io.hpp"

namespace prestage {

namespace fs = std::filesystem;

struct Catalog::Data {
  fs::path root;
  std::string blob;               // the files' relative paths, back to back
  std::vector<uint64_t> offsets;  // num_files + 1 offsets into blob
  // One per sample; empty when sample i is all of file i (a folder or a file list), the common
  // case, which then costs nothing per sample.
  std::vector<Locator> locators;
  std::vector<int64_t> labels;
  std::vector<std::string> classes;
  std::vector<uint64_t> file_sizes;  // one per file, or empty: unknown
  std::vector<int64_t> file_mtimes;  // ns since the epoch, one per file, or empty: unknown
  Kind kind = Kind::kFiles;
  std::string field;  // kTfrecord: the data feature; kHdf5: the dataset; kArrays: the member
  int64_t axis = 0;   // kHdf5, kArrays: the axis of the slices
  std::string dtype;  // kHdf5, kArrays: the data set's (most of its samples'), or "" if not known
  Symlinks symlinks = Symlinks::kFollow;
  std::vector<Damage> damage;  // kTfrecord built with OnError::kSkip: records left out
  // Per file, or all three empty when no file is compressed: its Codec, its bytes at the source,
  // the CRC-32C of its decompressed bytes (file_sizes holds their count).
  std::vector<uint8_t> codecs;
  std::vector<uint64_t> stored_sizes;
  std::vector<uint32_t> crcs;
  uint64_t fingerprint = 0;
};

namespace {

static_assert(std::endian::native == std::endian::little,
              "the catalog file format is little-endian");

constexpr char kMagic[8] = {'P', 'S', 'T', 'G', 'C', 'A', 'T', '\0'};
// Version 4 added the symlink policy and the TFRecord damage list; version 3 files load as
// Symlinks::kFollow with no damage (what they were built with). Version 5 added the slices' axis
// (older files: 0, the only axis they had). Version 6 added the data set's dtype (older files: not
// known, the loader probes it). Version 7 added the files' codecs (older files: none compressed).
constexpr uint32_t kFormatVersion = 7;
constexpr uint32_t kOldestFormatVersion = 3;

uint64_t fnv1a(std::string_view bytes, uint64_t hash = 0xcbf29ce484222325ULL) {
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

// A relative path that stays under its root: not absolute, no "..", no empty or NUL-holding name.
void check_relative(std::string_view path) {
  auto refuse = [&](const char* why) {
    throw ConfigError("catalog path '" + std::string(path) + "' " + why);
  };
  if (path.empty()) refuse("is empty");
  if (path.front() == '/') refuse("is absolute; paths must be relative to the root");
  if (path.find('\0') != std::string_view::npos) refuse("holds a NUL byte");
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    std::string_view part = path.substr(start, end - start);
    if (part == "..") refuse("escapes the root ('..')");
    start = end + 1;
  }
  if (path.back() == '/') refuse("names a directory");
}

std::shared_ptr<Catalog::Data> make_data(const fs::path& root,
                                         const std::vector<std::string>& paths,
                                         const std::vector<int64_t>& labels,
                                         const std::vector<std::string>& classes,
                                         const std::vector<Catalog::Locator>& locators = {},
                                         const std::vector<uint64_t>& file_sizes = {}) {
  const size_t samples = locators.empty() ? paths.size() : locators.size();
  if (!labels.empty() && labels.size() != samples) {
    throw ConfigError("catalog: " + std::to_string(labels.size()) + " labels for " +
                      std::to_string(samples) + " samples");
  }
  for (const auto& loc : locators) {
    if (loc.file >= paths.size())
      throw ConfigError("catalog: a locator names a file past the list");
    if (loc.length != Catalog::kWholeFile && loc.offset > ~uint64_t{0} - loc.length) {
      throw ConfigError("catalog: a locator's byte range overflows");
    }
  }
  auto data = std::make_shared<Catalog::Data>();
  data->root = root;
  data->classes = classes;
  size_t total = 0;
  for (const auto& p : paths) total += p.size();
  data->blob.reserve(total);
  data->offsets.reserve(paths.size() + 1);
  data->offsets.push_back(0);
  uint64_t hash = fnv1a(root.string());
  for (const auto& p : paths) {
    check_relative(p);
    data->blob += p;
    data->offsets.push_back(data->blob.size());
    hash = fnv1a(std::string_view("\n", 1), fnv1a(p, hash));
  }
  data->fingerprint = hash;
  if (!file_sizes.empty() && file_sizes.size() != paths.size()) {
    throw ConfigError("catalog: file size table does not match the files");
  }
  data->file_sizes = file_sizes;
  data->locators = locators;
  data->labels = labels.empty() ? std::vector<int64_t>(samples, -1) : labels;
  return data;
}

// Sets the policy; a confined catalog gets a fingerprint of its own (a catalog that followed links
// out of the root may have staged what they led to), a following one keeps the one it always had.
void set_symlinks(Catalog::Data& data, Catalog::Symlinks symlinks) {
  if (symlinks != Catalog::Symlinks::kFollow && symlinks != Catalog::Symlinks::kInside) {
    throw ConfigError("catalog: unknown symlink policy " +
                      std::to_string(static_cast<int>(symlinks)));
  }
  data.symlinks = symlinks;
  if (symlinks == Catalog::Symlinks::kInside) {
    data.fingerprint = fnv1a(std::string_view("\0symlinks=inside", 17), data.fingerprint);
  }
}

// Records which files are compressed (all three tables empty: none). A catalog with compressed
// files gets a fingerprint of its own: its copies hold decompressed bytes.
void set_codecs(Catalog::Data& data, std::vector<uint8_t> codecs, std::vector<uint64_t> stored,
                std::vector<uint32_t> crcs) {
  const size_t files = data.offsets.size() - 1;
  const bool none = codecs.empty() && stored.empty() && crcs.empty();
  if (!none && (codecs.size() != files || stored.size() != files || crcs.size() != files)) {
    throw ConfigError("catalog: the codec tables do not match the files");
  }
  if (!none && data.file_sizes.size() != files) {
    throw ConfigError("catalog: compressed files without their decompressed sizes");
  }
  bool any = false;
  for (const uint8_t c : codecs) {
    if (c > static_cast<uint8_t>(Catalog::Codec::kZstd)) {
      throw ConfigError("catalog: unknown codec");
    }
    any = any || c != 0;
  }
  if (!any) return;
  data.codecs = std::move(codecs);
  data.stored_sizes = std::move(stored);
  data.crcs = std::move(crcs);
  data.fingerprint = fnv1a(std::string_view("\0decompressed", 13), data.fingerprint);
}

// Whether `real` (a canonical path) is `real_root` or below it.
bool is_beneath(const fs::path& real, const fs::path& real_root) {
  const fs::path rel = real.lexically_relative(real_root);
  return !rel.empty() && *rel.begin() != "..";
}

// Symlinks::kInside, while a tree is walked: refuses `entry`, a link, if it leads out of the root.
// A dangling link is left to the walk (it is neither a folder nor a regular file).
void check_link_inside(const fs::path& entry, const fs::path& root, const fs::path& real_root) {
  std::error_code ec;
  const fs::path real = fs::canonical(entry, ec);
  if (ec || is_beneath(real, real_root)) return;
  throw IoError(entry.string(), EXDEV,
                "'" + entry.string() + "' is a symbolic link that leads out of the root '" +
                    root.string() + "' (to '" + real.string() +
                    "'): refused, the catalog confines its files to the root (symlinks=inside)");
}

bool has_extension(const fs::path& file, const std::vector<std::string>& extensions) {
  if (extensions.empty()) return true;
  std::string ext = file.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  for (const auto& want : extensions) {
    std::string w = want;
    std::transform(w.begin(), w.end(), w.begin(), [](unsigned char c) { return std::tolower(c); });
    if (ext == w) return true;
  }
  return false;
}

[[noreturn]] void throw_fs_error(const fs::path& path, const std::error_code& ec,
                                 const char* what) {
  throw IoError(path.string(), ec.value(),
                std::string(what) + " '" + path.string() + "': " + ec.message());
}

// Binary writer/reader for the catalog file.
class Writer {
 public:
  explicit Writer(std::string& out) : out_(out) {}
  template <typename T>
  void pod(const T& v) {
    out_.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  void bytes(std::string_view s) {
    pod<uint64_t>(s.size());
    out_.append(s);
  }
  template <typename T>
  void array(const std::vector<T>& v) {
    pod<uint64_t>(v.size());
    out_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }

 private:
  std::string& out_;
};

class Reader {
 public:
  Reader(std::string_view in, std::string path) : in_(in), path_(std::move(path)) {}
  template <typename T>
  T pod() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string bytes() {
    const uint64_t n = pod<uint64_t>();
    need(n);
    std::string s(in_.substr(pos_, n));
    pos_ += n;
    return s;
  }
  template <typename T>
  std::vector<T> array() {
    const uint64_t n = pod<uint64_t>();
    if (n > (in_.size() - pos_) / sizeof(T)) fail("array length exceeds the file");
    std::vector<T> v(n);
    if (n != 0) std::memcpy(v.data(), in_.data() + pos_, n * sizeof(T));
    pos_ += n * sizeof(T);
    return v;
  }
  size_t remaining() const { return in_.size() - pos_; }
  [[noreturn]] void fail(const std::string& why) const {
    throw DecodeError(path_, "not a valid catalog file: " + why);
  }

 private:
  void need(uint64_t n) const {
    if (n > in_.size() - pos_) fail("truncated");
  }
  std::string_view in_;
  std::string path_;
  size_t pos_ = 0;
};

// Size and modification time of each file, for a stage directory to plan its space and to notice a
// source that changed. One stat per file, when the catalog is built (and saved) only. A file that
// cannot be looked at is left unknown (it may appear later), but one that leads out of a confined
// catalog's root is refused now.
void record_file_stats(Catalog::Data& data) {
  const size_t files = data.offsets.size() - 1;
  data.file_sizes.assign(files, Catalog::kUnknownSize);
  data.file_mtimes.assign(files, Catalog::kUnknownMtime);
  const bool confined = data.symlinks == Catalog::Symlinks::kInside;
  std::string path;
  for (size_t f = 0; f < files; ++f) {
    path = (data.root / std::string_view(data.blob).substr(data.offsets[f],
                                                           data.offsets[f + 1] - data.offsets[f]))
               .string();
    try {
      const detail::FileStat st = detail::file_stat(
          confined ? detail::FileRef(path, data.root.native()) : detail::FileRef(path));
      data.file_sizes[f] = st.size;
      data.file_mtimes[f] = st.mtime_ns;
    } catch (const IoError& e) {
      if (confined && e.error_code() == EXDEV) throw;
    }
  }
}

}  // namespace

Catalog::Catalog(std::shared_ptr<const Data> data) : data_(std::move(data)) {}

Catalog Catalog::from_paths(const fs::path& root, const std::vector<std::string>& paths,
                            const std::vector<int64_t>& labels,
                            const std::vector<std::string>& classes, Symlinks symlinks) {
  auto data = make_data(root, paths, labels, classes);
  set_symlinks(*data, symlinks);
  return Catalog(data);
}

Catalog Catalog::from_ranges(const fs::path& root, const std::vector<std::string>& files,
                             const std::vector<Locator>& locators,
                             const std::vector<int64_t>& labels,
                             const std::vector<std::string>& classes, Symlinks symlinks) {
  auto data = locators.empty() ? make_data(root, {}, labels, classes)
                               : make_data(root, files, labels, classes, locators);
  set_symlinks(*data, symlinks);
  return Catalog(data);
}

Catalog Catalog::from_folder(const fs::path& root, const std::vector<std::string>& extensions,
                             Symlinks symlinks) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    throw IoError(root.string(), ec ? ec.value() : ENOTDIR,
                  "data set root '" + root.string() + "' is not a directory");
  }
  const bool confined = symlinks == Symlinks::kInside;
  fs::path real_root;
  if (confined) {
    real_root = fs::canonical(root, ec);
    if (ec) throw_fs_error(root, ec, "cannot resolve");
  }
  std::vector<std::string> classes;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_directory(ec)) continue;
    if (confined && it->is_symlink(ec)) check_link_inside(it->path(), root, real_root);
    classes.push_back(it->path().filename().string());
  }
  if (ec) throw_fs_error(root, ec, "cannot list");
  std::sort(classes.begin(), classes.end());
  // A flat folder (no sub-folder at all) is a set without classes: its files are the samples, with
  // label -1 ("none", as a line of from_list without one), and classes() is empty.
  const bool flat = classes.empty();

  std::vector<std::string> paths;
  std::vector<int64_t> labels;
  for (size_t label = 0; label < (flat ? 1 : classes.size()); ++label) {
    // Sorted by (folder, file name), the order of torchvision's sorted(os.walk(...)).
    struct Found {
      std::string dir, name;
      bool operator<(const Found& o) const { return std::tie(dir, name) < std::tie(o.dir, o.name); }
    };
    std::vector<Found> files;
    const fs::path class_dir = flat ? root : root / classes[label];
    auto options = fs::directory_options::follow_directory_symlink;
    for (fs::recursive_directory_iterator it(class_dir, options, ec), end; !ec && it != end;
         it.increment(ec)) {
      // Checked before the walk descends into a linked folder.
      if (confined && it->is_symlink(ec)) check_link_inside(it->path(), root, real_root);
      if (!it->is_regular_file(ec) || !has_extension(it->path(), extensions)) continue;
      const fs::path rel = it->path().lexically_relative(root);
      files.push_back({rel.parent_path().string(), rel.filename().string()});
    }
    if (ec) throw_fs_error(class_dir, ec, "cannot list");
    std::sort(files.begin(), files.end());
    for (auto& f : files) {
      paths.push_back(f.dir.empty() ? f.name : f.dir + "/" + f.name);
      labels.push_back(flat ? int64_t{-1} : static_cast<int64_t>(label));
    }
  }
  if (flat && paths.empty()) {
    throw ConfigError("no class folders and no files of the extensions asked for under '" +
                      root.string() +
                      "': expected files, or one sub-folder per class as "
                      "torchvision's ImageFolder");
  }
  auto data = make_data(root, paths, labels, classes);
  set_symlinks(*data, symlinks);
  record_file_stats(*data);
  return Catalog(data);
}

Catalog Catalog::from_list(const fs::path& list_file, const fs::path& root, Symlinks symlinks) {
  std::ifstream in(list_file);
  if (!in) {
    const int err = errno;
    throw IoError(list_file.string(), err,
                  "cannot open file list '" + list_file.string() + "': " + std::strerror(err));
  }
  std::vector<std::string> paths;
  std::vector<int64_t> labels;
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.front() == '#') continue;
    int64_t label = -1;
    const size_t comma = line.rfind(',');
    if (comma != std::string::npos) {
      const std::string field = line.substr(comma + 1);
      size_t used = 0;
      try {
        label = std::stoll(field, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != field.size()) {
        throw ConfigError(list_file.string() + ":" + std::to_string(line_no) + ": label '" + field +
                          "' is not an integer");
      }
      line.resize(comma);
    }
    paths.push_back(line);
    labels.push_back(label);
  }
  if (in.bad()) {
    throw IoError(list_file.string(), EIO, "cannot read file list '" + list_file.string() + "'");
  }
  auto data = make_data(root, paths, labels, {});
  set_symlinks(*data, symlinks);
  record_file_stats(*data);
  return Catalog(data);
}

Catalog Catalog::from_shards(const fs::path& dir) {
  const fs::path index = dir / "index.tsv";
  std::ifstream in(index);
  if (!in) {
    const int err = errno;
    throw IoError(index.string(), err,
                  "cannot open the index of packed set '" + dir.string() +
                      "': " + std::strerror(err) + " (made by `prestage pack SRC OUT`)");
  }
  std::vector<std::string> files, classes;
  std::vector<Locator> locators;
  std::vector<int64_t> labels;
  std::string line, shard;
  size_t line_no = 0;
  bool header = false;
  const auto bad = [&](const std::string& why) {
    throw ConfigError(index.string() + ":" + std::to_string(line_no) + ": " + why);
  };
  const auto number = [&](std::string_view field, const char* what) {
    uint64_t v = 0;
    const auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), v);
    if (ec != std::errc() || end != field.data() + field.size() || field.empty()) {
      bad(std::string(what) + " '" + std::string(field) + "' is not a non-negative integer");
    }
    return v;
  };
  while (std::getline(in, line)) {
    ++line_no;
    std::vector<std::string_view> fields;
    for (size_t start = 0;;) {
      const size_t tab = line.find('\t', start);
      fields.emplace_back(std::string_view(line).substr(start, tab - start));
      if (tab == std::string::npos) break;
      start = tab + 1;
    }
    if (line_no == 1) {
      if (line != "# prestage pack 1")
        bad("not a prestage pack index (expected '# prestage pack 1')");
      header = true;
      continue;
    }
    if (line.empty()) continue;
    if (line.front() == '#') {
      if (fields[0] == "# classes") classes.assign(fields.begin() + 1, fields.end());
      continue;
    }
    if (fields.size() != 6)
      bad("expected 6 tab-separated fields, found " + std::to_string(fields.size()));
    if (files.empty() || fields[0] != files.back()) files.emplace_back(fields[0]);
    Locator loc;
    loc.file = files.size() - 1;
    loc.offset = number(fields[1], "offset");
    loc.length = number(fields[2], "length");
    if (loc.offset + loc.length < loc.offset) bad("the range overflows");
    int64_t label = -1;
    const std::string_view l = fields[3];
    const auto [end, ec] = std::from_chars(l.data(), l.data() + l.size(), label);
    if (ec != std::errc() || end != l.data() + l.size())
      bad("label '" + std::string(l) + "' is not an integer");
    locators.push_back(loc);
    labels.push_back(label);
  }
  if (in.bad()) throw IoError(index.string(), EIO, "cannot read '" + index.string() + "'");
  if (!header) {
    line_no = 1;
    bad("empty index: not a prestage pack index");
  }
  // A shard named twice apart (not in one run of lines) would be two files of one name.
  {
    std::vector<std::string> sorted = files;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
      line_no = 0;
      bad("a shard's samples are not on consecutive lines");
    }
  }
  auto data = locators.empty() ? make_data(dir, {}, labels, classes)
                               : make_data(dir, files, labels, classes, locators);
  record_file_stats(*data);
  for (size_t i = 0; i < data->locators.size(); ++i) {
    const Locator& loc = data->locators[i];
    const uint64_t size = data->file_sizes[loc.file];
    if (size != kUnknownSize && loc.offset + loc.length > size) {
      throw DecodeError(std::string(data->root / files[loc.file]),
                        "sample " + std::to_string(i) + " (bytes " + std::to_string(loc.offset) +
                            "+" + std::to_string(loc.length) + ") lies past the end of shard '" +
                            files[loc.file] + "' (" + std::to_string(size) + " bytes): truncated?");
    }
  }
  return Catalog(data);
}

void Catalog::save(const fs::path& file) const {
  std::string out;
  Writer w(out);
  out.append(kMagic, sizeof(kMagic));
  w.pod(kFormatVersion);
  w.bytes(data_->root.string());
  w.pod<uint64_t>(data_->classes.size());
  for (const auto& c : data_->classes) w.bytes(c);
  w.bytes(data_->blob);
  w.array(data_->offsets);
  w.array(data_->locators);
  w.array(data_->labels);
  w.array(data_->file_sizes);
  w.array(data_->file_mtimes);
  w.pod(static_cast<uint8_t>(data_->kind));
  w.bytes(data_->field);
  w.pod(static_cast<uint8_t>(data_->symlinks));
  w.pod<uint64_t>(data_->damage.size());
  for (const auto& d : data_->damage) {
    w.pod(d.file);
    w.pod(d.offset);
    w.pod(static_cast<uint8_t>(d.rest_of_file));
    w.bytes(d.reason);
  }
  w.pod(data_->axis);
  w.bytes(data_->dtype);
  w.array(data_->codecs);
  w.array(data_->stored_sizes);
  w.array(data_->crcs);
  w.pod(fnv1a(out));  // checksum of everything before it

  // Written to a temporary name, then renamed: a reader never sees half a catalog. The name is this
  // call's own, so that processes saving the same catalog at once (the ranks of a node, each into
  // the stage directory) never rename or remove each other's: the last rename wins, whole.
  static std::atomic<uint64_t> saves{0};
  const fs::path tmp = file.string() + ".tmp." + std::to_string(::getpid()) + "." +
                       std::to_string(saves.fetch_add(1, std::memory_order_relaxed));
  {
    std::ofstream os(tmp, std::ios::binary | std::ios::trunc);
    os.write(out.data(), static_cast<std::streamsize>(out.size()));
    os.flush();
    if (!os) {
      const int err = errno;
      std::error_code ignored;
      fs::remove(tmp, ignored);
      throw IoError(file.string(), err, "cannot write catalog '" + file.string() + "'");
    }
  }
  std::error_code ec;
  fs::rename(tmp, file, ec);
  if (ec) throw_fs_error(file, ec, "cannot write catalog");
}

Catalog Catalog::load(const fs::path& file) {
  std::ifstream is(file, std::ios::binary);
  if (!is) {
    const int err = errno;
    throw IoError(file.string(), err,
                  "cannot open catalog '" + file.string() + "': " + std::strerror(err));
  }
  std::string in((std::istreambuf_iterator<char>(is)), std::istreambuf_iterator<char>());
  Reader r(in, file.string());
  if (in.size() < sizeof(kMagic) + sizeof(uint64_t) ||
      std::memcmp(in.data(), kMagic, sizeof(kMagic)) != 0) {
    r.fail("bad magic");
  }
  uint64_t stored_sum;
  std::memcpy(&stored_sum, in.data() + in.size() - sizeof(uint64_t), sizeof(uint64_t));
  if (fnv1a(std::string_view(in).substr(0, in.size() - sizeof(uint64_t))) != stored_sum) {
    r.fail("checksum mismatch");
  }
  Reader body(
      std::string_view(in).substr(sizeof(kMagic), in.size() - sizeof(kMagic) - sizeof(uint64_t)),
      file.string());
  const uint32_t version = body.pod<uint32_t>();
  if (version < kOldestFormatVersion || version > kFormatVersion) {
    body.fail("unsupported format version " + std::to_string(version) + " (this build reads " +
              std::to_string(kOldestFormatVersion) + " to " + std::to_string(kFormatVersion) + ")");
  }
  const fs::path root = body.bytes();
  const uint64_t num_classes = body.pod<uint64_t>();
  if (num_classes > body.remaining() / sizeof(uint64_t)) body.fail("class count exceeds the file");
  std::vector<std::string> classes;
  classes.reserve(num_classes);
  for (uint64_t i = 0; i < num_classes; ++i) classes.push_back(body.bytes());
  const std::string blob = body.bytes();
  const auto offsets = body.array<uint64_t>();
  const auto locators = body.array<Locator>();
  const auto labels = body.array<int64_t>();
  const auto file_sizes = body.array<uint64_t>();
  const auto file_mtimes = body.array<int64_t>();
  const auto kind = body.pod<uint8_t>();
  const std::string field = body.bytes();
  if (kind > static_cast<uint8_t>(Kind::kArrays)) body.fail("unknown catalog kind");
  auto symlinks = Symlinks::kFollow;
  std::vector<Damage> damage;
  if (version >= 4) {
    const auto policy = body.pod<uint8_t>();
    if (policy > static_cast<uint8_t>(Symlinks::kInside)) body.fail("unknown symlink policy");
    symlinks = static_cast<Symlinks>(policy);
    const uint64_t count = body.pod<uint64_t>();
    // Each entry takes at least 25 bytes: a count beyond that is a lie, not an allocation.
    if (count > body.remaining() / 25) body.fail("damage count exceeds the file");
    damage.reserve(count);
    for (uint64_t i = 0; i < count; ++i) {
      Damage d;
      d.file = body.pod<uint64_t>();
      d.offset = body.pod<uint64_t>();
      const auto rest = body.pod<uint8_t>();
      if (rest > 1) body.fail("bad damage entry");
      d.rest_of_file = rest != 0;
      d.reason = body.bytes();
      damage.push_back(std::move(d));
    }
  }
  const int64_t axis = version >= 5 ? body.pod<int64_t>() : 0;
  const std::string dtype = version >= 6 ? body.bytes() : std::string();
  std::vector<uint8_t> codecs;
  std::vector<uint64_t> stored_sizes;
  std::vector<uint32_t> crcs;
  if (version >= 7) {
    codecs = body.array<uint8_t>();
    stored_sizes = body.array<uint64_t>();
    crcs = body.array<uint32_t>();
  }
  if (body.remaining() != 0) body.fail("bytes after the last field");
  const size_t samples = locators.empty() ? offsets.size() - 1 : locators.size();
  if (offsets.empty() || offsets.front() != 0 || offsets.back() != blob.size() ||
      labels.size() != samples || !std::is_sorted(offsets.begin(), offsets.end())) {
    body.fail("inconsistent path table");
  }
  std::vector<std::string> paths;
  paths.reserve(labels.size());
  for (size_t i = 0; i + 1 < offsets.size(); ++i) {
    paths.emplace_back(blob.substr(offsets[i], offsets[i + 1] - offsets[i]));
  }
  try {
    auto data = make_data(root, paths, labels, classes, locators, file_sizes);  // re-checks paths
    if (!file_mtimes.empty() && file_mtimes.size() != data->file_sizes.size()) {
      body.fail("file time table does not match the files");
    }
    data->file_mtimes = file_mtimes;
    data->kind = static_cast<Kind>(kind);
    data->field = field;
    data->axis = axis;
    data->dtype = dtype;
    for (const auto& d : damage) {
      if (d.file >= paths.size()) body.fail("a damage entry names a file past the list");
    }
    data->damage = std::move(damage);
    set_symlinks(*data, symlinks);
    set_codecs(*data, std::move(codecs), std::move(stored_sizes), std::move(crcs));
    return Catalog(data);
  } catch (const ConfigError& e) {
    body.fail(e.what());
  }
}

size_t Catalog::size() const noexcept { return data_->labels.size(); }
const fs::path& Catalog::root() const noexcept { return data_->root; }

Catalog::Locator Catalog::locator(size_t i) const {
  if (i >= size()) throw ConfigError("catalog index " + std::to_string(i) + " out of range");
  return data_->locators.empty() ? Locator{i, 0, kWholeFile} : data_->locators[i];
}

size_t Catalog::num_files() const noexcept { return data_->offsets.size() - 1; }

std::string_view Catalog::file_path(size_t f) const {
  if (f >= num_files()) throw ConfigError("catalog file " + std::to_string(f) + " out of range");
  return std::string_view(data_->blob)
      .substr(data_->offsets[f], data_->offsets[f + 1] - data_->offsets[f]);
}

fs::path Catalog::file_source_path(size_t f) const { return data_->root / fs::path(file_path(f)); }

int64_t Catalog::file_mtime(size_t f) const {
  if (f >= num_files()) throw ConfigError("catalog file " + std::to_string(f) + " out of range");
  return data_->file_mtimes.empty() ? kUnknownMtime : data_->file_mtimes[f];
}

uint64_t Catalog::file_size(size_t f) const {
  if (f >= num_files()) throw ConfigError("catalog file " + std::to_string(f) + " out of range");
  return data_->file_sizes.empty() ? kUnknownSize : data_->file_sizes[f];
}

std::string_view Catalog::path(size_t i) const { return file_path(locator(i).file); }

fs::path Catalog::source_path(size_t i) const { return data_->root / fs::path(path(i)); }

int64_t Catalog::label(size_t i) const {
  if (i >= size()) throw ConfigError("catalog index " + std::to_string(i) + " out of range");
  return data_->labels[i];
}

const std::vector<std::string>& Catalog::classes() const noexcept { return data_->classes; }
Catalog::Kind Catalog::kind() const noexcept { return data_->kind; }
const std::string& Catalog::field() const noexcept { return data_->field; }
const std::string& Catalog::dtype() const noexcept { return data_->dtype; }
int64_t Catalog::axis() const noexcept { return data_->axis; }
Catalog::Symlinks Catalog::symlinks() const noexcept { return data_->symlinks; }
const std::vector<Catalog::Damage>& Catalog::damage() const noexcept { return data_->damage; }

Catalog::Codec Catalog::file_codec(size_t f) const {
  if (f >= num_files()) throw ConfigError("catalog file " + std::to_string(f) + " out of range");
  return data_->codecs.empty() ? Codec::kNone : static_cast<Codec>(data_->codecs[f]);
}

uint64_t Catalog::file_stored_size(size_t f) const {
  if (file_codec(f) == Codec::kNone) return file_size(f);
  return data_->stored_sizes[f];
}

uint32_t Catalog::file_crc(size_t f) const {
  return file_codec(f) == Codec::kNone ? 0 : data_->crcs[f];
}

bool Catalog::has_compressed_files() const noexcept { return !data_->codecs.empty(); }

namespace {

// The files' deepest common folder, and each file's path relative to it.
std::pair<fs::path, std::vector<std::string>> common_root(const std::vector<fs::path>& files) {
  if (files.empty()) throw ConfigError("no files given");
  std::vector<fs::path> absolute;
  absolute.reserve(files.size());
  for (const auto& f : files) absolute.push_back(fs::absolute(f).lexically_normal());
  fs::path root = absolute.front().parent_path();
  for (const auto& f : absolute) {
    while (!root.empty() && f.lexically_relative(root).native().starts_with("..")) {
      root = root.parent_path();
    }
  }
  std::vector<std::string> relative;
  relative.reserve(files.size());
  for (const auto& f : absolute) relative.push_back(f.lexically_relative(root).string());
  return {root, relative};
}

}  // namespace

namespace {

// A catalog asked for slices along an axis that a file's array does not have.
[[noreturn]] void no_axis(const char* from, const std::string& path, uint32_t ndim, int64_t axis) {
  throw ConfigError(std::string(from) + ": '" + path + "' holds an array of " +
                    std::to_string(ndim) + " dimensions: it has no axis " + std::to_string(axis));
}

// Labels beside the data must give one per sample of their file.
void check_label_count(const std::string& path, const std::string& name, uint64_t labels,
                       uint64_t samples, uint32_t axis) {
  if (labels == samples) return;
  throw DecodeError(path, "labels '" + name + "' has " + std::to_string(labels) + " entries, for " +
                              std::to_string(samples) + " samples (along axis " +
                              std::to_string(axis) + ")");
}

// The integers of a 1-D integer (or bool) array as int64; `info` describes `bytes`.
std::vector<int64_t> integers(std::span<const std::byte> bytes, const detail::ArrayInfo& info,
                              const std::string& path, const std::string& name) {
  const char kind = info.dtype[1];
  const size_t size = info.item_size;
  if (info.ndim != 1 || (kind != 'i' && kind != 'u' && kind != 'b') ||
      (size != 1 && size != 2 && size != 4 && size != 8)) {
    throw DecodeError(path, "labels '" + name + "' must be a 1-D integer array, not " +
                                std::to_string(info.ndim) + "-D of dtype " + info.dtype);
  }
  const bool swap = size > 1 && info.dtype[0] == '>';
  std::vector<int64_t> out(info.shape[0]);
  for (size_t i = 0; i < out.size(); ++i) {
    uint64_t v = 0;
    for (size_t b = 0; b < size; ++b) {
      const auto byte = std::to_integer<uint64_t>(bytes[i * size + (swap ? size - 1 - b : b)]);
      v |= byte << (8 * b);
    }
    if (kind == 'i' && size < 8 && (v >> (8 * size - 1)) != 0) v |= ~uint64_t{0} << (8 * size);
    if (kind == 'u' && size == 8 && v > uint64_t{INT64_MAX}) {
      throw DecodeError(
          path, "labels '" + name + "' holds " + std::to_string(v) + ", past the int64 labels");
    }
    out[i] = static_cast<int64_t>(v);
  }
  return out;
}

// Each slice becomes a catalog entry (and a label): a header claiming far more slices than its
// file stores is refused before anything is allocated for them.
void check_slice_count(const std::string& path, uint64_t slices, uint64_t slice_bytes,
                       uint64_t file_bytes) {
  constexpr uint64_t kMaxRatio = 1024;  // compression shrinks data, but not a thousandfold
  const uint64_t most =
      (file_bytes * kMaxRatio + (uint64_t{1} << 20)) / std::max<uint64_t>(slice_bytes, 1);
  if (slices > most) {
    throw DecodeError(path, "its array claims " + std::to_string(slices) + " slices of " +
                                std::to_string(slice_bytes) + " bytes in a file of " +
                                std::to_string(file_bytes) + " bytes");
  }
}

// The samples of each dtype, in the order the dtypes are first seen (a data set has one or a few).
class DtypeCount {
 public:
  void add(std::string_view dtype, uint64_t samples) {
    auto it = std::find_if(totals_.begin(), totals_.end(),
                           [&](const auto& t) { return t.first == dtype; });
    if (it == totals_.end()) {
      totals_.emplace_back(dtype, samples);
    } else {
      it->second += samples;
    }
  }
  // The dtype most samples have; a tie goes to the one seen first ("" if none was counted).
  std::string most() const {
    std::string best;
    uint64_t best_count = 0;
    for (const auto& t : totals_) {
      if (t.second > best_count) best_count = t.second, best = t.first;
    }
    return best;
  }

 private:
  std::vector<std::pair<std::string, uint64_t>> totals_;
};

}  // namespace

Catalog Catalog::from_hdf5(const std::vector<fs::path>& files, const std::string& dataset,
                           const std::string& labels_dataset, int64_t axis) {
  if (dataset.empty()) throw ConfigError("from_hdf5: the dataset name is empty");
  auto [root, relative] = common_root(files);
  std::vector<Locator> locators;
  std::vector<int64_t> labels;
  DtypeCount dtypes;
  for (size_t f = 0; f < files.size(); ++f) {
    const std::string path = (root / relative[f]).string();
    const uint32_t rank = detail::hdf5::describe(path, dataset, 0, ~uint64_t{0}, path).row.ndim + 1;
    if (!detail::resolve_axis(axis, rank)) no_axis("from_hdf5", path, rank, axis);
    const auto info = detail::hdf5::describe(path, dataset, axis, ~uint64_t{0}, path);
    for (uint64_t row = 0; row < info.rows; ++row) locators.push_back(Locator{f, row, kWholeFile});
    dtypes.add(info.row.dtype, info.rows);
    if (!labels_dataset.empty()) {
      const auto file_labels = detail::hdf5::read_labels(path, labels_dataset, path);
      check_label_count(path, labels_dataset, file_labels.size(), info.rows, info.axis);
      labels.insert(labels.end(), file_labels.begin(), file_labels.end());
    }
  }
  if (locators.empty()) throw ConfigError("from_hdf5: the datasets have no rows");
  auto data = make_data(root, relative, labels, {}, locators);
  data->kind = Kind::kHdf5;
  data->field = dataset;
  data->axis = axis;
  data->dtype = dtypes.most();
  record_file_stats(*data);
  return Catalog(data);
}

Catalog Catalog::from_arrays(const std::vector<fs::path>& files, int64_t axis,
                             const std::string& member, const std::string& labels_member) {
  auto [root, relative] = common_root(files);
  std::vector<Locator> locators;
  std::vector<int64_t> labels;
  detail::NpzDecoder npz;
  std::vector<std::byte> scratch, label_bytes;
  DtypeCount dtypes;
  for (size_t f = 0; f < files.size(); ++f) {
    const std::string path = (root / relative[f]).string();
    const detail::FileRef file(path);
    const detail::FileSource source(file, 0, kWholeFile, path);  // one open for all its reads
    const uint64_t size = source.size();
    detail::ArrayInfo whole;
    const auto array = detail::probe_array_file(source, member, whole, ~uint64_t{0}, npz, scratch);
    if (!array.member && !(member.empty() && labels_member.empty())) {
      throw ConfigError("from_arrays: '" + path + "' is a .npy file, which holds one array: it " +
                        "has no member '" + (member.empty() ? labels_member : member) + "'");
    }
    const auto resolved = detail::resolve_axis(axis, whole.ndim);
    if (!resolved) no_axis("from_arrays", path, whole.ndim, axis);
    const uint64_t samples = whole.shape[*resolved];
    check_slice_count(path, samples, detail::slice_info(whole, *resolved, ~uint64_t{0}, path).bytes,
                      size);
    for (uint64_t i = 0; i < samples; ++i) locators.push_back(Locator{f, i, kWholeFile});
    dtypes.add(whole.dtype, samples);
    if (!labels_member.empty()) {
      detail::ArrayInfo info;
      const auto where = npz.probe(source, labels_member, info, uint64_t{1} << 32);
      label_bytes.resize(info.bytes);
      npz.decode(source, where, info, label_bytes);
      const auto file_labels = integers(label_bytes, info, path, labels_member);
      check_label_count(path, labels_member, file_labels.size(), samples, *resolved);
      labels.insert(labels.end(), file_labels.begin(), file_labels.end());
    }
  }
  if (locators.empty())
    throw ConfigError("from_arrays: the arrays have no samples along axis " + std::to_string(axis));
  auto data = make_data(root, relative, labels, {}, locators);
  data->kind = Kind::kArrays;
  data->field = member;
  data->axis = axis;
  data->dtype = dtypes.most();
  record_file_stats(*data);
  return Catalog(data);
}

Catalog Catalog::from_tfrecord(const std::vector<fs::path>& files, const std::string& data_feature,
                               const std::string& label_feature, OnError on_error) {
  if (data_feature.empty()) throw ConfigError("from_tfrecord: the data feature name is empty");
  auto [root, relative] = common_root(files);
  const bool skip = on_error == OnError::kSkip;
  std::vector<Locator> locators;
  std::vector<int64_t> labels;
  std::vector<uint64_t> sizes;
  std::vector<Damage> damage;
  DtypeCount dtypes;  // of the records' data feature
  for (size_t f = 0; f < files.size(); ++f) {
    const std::string path = (root / relative[f]).string();
    uint64_t size = 0;
    auto damaged = [&](uint64_t offset, const std::string& reason, bool rest_of_file) {
      damage.push_back(Damage{f, offset, rest_of_file, reason});
    };
    auto index = [&](uint64_t offset, uint64_t framed, std::span<const std::byte> record) {
      std::string_view dtype;
      if (!detail::example_has_data(record, data_feature, path, &dtype)) {
        throw DecodeError(path, "the record at byte " + std::to_string(offset) +
                                    " has no feature '" + data_feature + "'");
      }
      int64_t label = -1;
      if (!label_feature.empty() && !detail::example_int64(record, label_feature, label, path)) {
        throw DecodeError(path, "the record at byte " + std::to_string(offset) +
                                    " has no feature '" + label_feature + "'");
      }
      locators.push_back(Locator{f, offset, framed});
      labels.push_back(label);
      dtypes.add(dtype, 1);
    };
    detail::scan_tfrecord(
        path, path, ~uint64_t{0} >> 8,
        [&](uint64_t offset, uint64_t framed, std::span<const std::byte> record) {
          // Each record's framing ends where the next begins, whatever its Example holds: the
          // file's size as indexed (a stage directory checks its copies against it).
          size = offset + framed;
          if (!skip) return index(offset, framed, record);
          try {
            index(offset, framed, record);
          } catch (const DecodeError& e) {
            damaged(offset, e.reason(), false);
          }
        },
        skip ? detail::TfrecordDamage(damaged) : detail::TfrecordDamage());
    sizes.push_back(damage.empty() || damage.back().file != f ? size : kUnknownSize);
  }
  if (locators.empty()) {
    std::string first;
    if (!damage.empty()) {
      first = " (first damage: '" + (root / relative[damage[0].file]).string() + "' at byte " +
              std::to_string(damage[0].offset) + ": " + damage[0].reason + ")";
    }
    throw ConfigError("from_tfrecord: the files hold no usable record" + first);
  }
  auto data = make_data(root, relative, labels, {}, locators, sizes);
  data->kind = Kind::kTfrecord;
  data->field = data_feature;
  data->dtype = dtypes.most();
  data->damage = std::move(damage);
  return Catalog(data);
}
namespace {

// A shard named twice would be two files of one name (two copies of it staged, its samples twice).
void refuse_duplicates(const char* from, const fs::path& root,
                       const std::vector<std::string>& files) {
  std::vector<std::string> sorted = files;
  std::sort(sorted.begin(), sorted.end());
  const auto twice = std::adjacent_find(sorted.begin(), sorted.end());
  if (twice != sorted.end()) {
    throw ConfigError(std::string(from) + ": shard '" + (root / *twice).string() +
                      "' is named twice");
  }
}

}  // namespace

Catalog Catalog::from_webdataset(const std::vector<std::string>& shards, const std::string& data,
                                 const std::string& label, Missing missing, OnError on_error,
                                 const std::vector<fs::path>& indexes) {
  detail::WdsFields fields;
  for (size_t start = 0; start <= data.size();) {
    size_t end = data.find(';', start);
    if (end == std::string::npos) end = data.size();
    std::string ext = data.substr(start, end - start);
    std::transform(ext.begin(), ext.end(), ext.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    if (!ext.empty() && ext.front() == '.') ext.erase(0, 1);
    if (!ext.empty()) fields.data.push_back(ext);
    start = end + 1;
  }
  if (fields.data.empty()) {
    throw ConfigError("from_webdataset: no data extension given (e.g. \"jpg;jpeg\")");
  }
  if (label.starts_with("json:")) {
    fields.label_ext = "json";
    fields.label_key = label.substr(5);
    if (fields.label_key.empty())
      throw ConfigError("from_webdataset: label \"json:\" names no key");
  } else {
    fields.label_ext = label;
    std::transform(fields.label_ext.begin(), fields.label_ext.end(), fields.label_ext.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    if (!fields.label_ext.empty() && fields.label_ext.front() == '.') fields.label_ext.erase(0, 1);
  }
  switch (missing) {
    case Missing::kError:
      fields.missing = detail::WdsFields::Missing::kError;
      break;
    case Missing::kSkip:
      fields.missing = detail::WdsFields::Missing::kSkip;
      break;
    case Missing::kEmpty:
      fields.missing = detail::WdsFields::Missing::kEmpty;
      break;
    default:
      throw ConfigError("from_webdataset: unknown missing-field policy");
  }
  auto [root, relative] = common_root(detail::expand_shards(shards));
  refuse_duplicates("from_webdataset", root, relative);
  if (!indexes.empty() && indexes.size() != relative.size()) {
    throw ConfigError("from_webdataset: " + std::to_string(indexes.size()) + " indexes for " +
                      std::to_string(relative.size()) + " shards (one per shard, in their order)");
  }
  const bool skip = on_error == OnError::kSkip;
  std::vector<Locator> locators;
  std::vector<int64_t> labels;
  std::vector<uint64_t> sizes;
  std::vector<Damage> damage;
  std::vector<uint8_t> codecs(relative.size(), 0);
  std::vector<uint64_t> stored(relative.size(), 0);
  std::vector<uint32_t> crcs(relative.size(), 0);
  for (size_t f = 0; f < relative.size(); ++f) {
    const std::string path = (root / relative[f]).string();
    const auto on_damage = [&](const detail::WdsDamage& d) {
      damage.push_back(Damage{f, d.offset, d.rest_of_file, d.reason});
    };
    const auto on_sample = [&](const detail::WdsSample& s) {
      locators.push_back(Locator{f, s.offset, s.length});
      labels.push_back(s.label);
    };
    const auto on_damage_or_raise =
        skip ? std::function<void(const detail::WdsDamage&)>(on_damage) : nullptr;
    const Codec codec = detail::codec_of_file(detail::FileRef(path));
    if (codec != Codec::kNone) {
      if (!indexes.empty()) {
        throw ConfigError("from_webdataset: shard '" + path + "' is compressed (" +
                          detail::codec_name(codec) + "): a DALI index gives byte ranges of a " +
                          "plain tar; build the catalog without indexes");
      }
      // Two streaming passes (its size and CRC, then its headers), so that the scan knows where
      // the decompressed bytes end. A stream that fails its own checks vouches for none of them.
      const size_t first_sample = locators.size(), first_damage = damage.size();
      try {
        const auto measured = detail::measure_compressed(path, codec, path);
        codecs[f] = static_cast<uint8_t>(codec);
        stored[f] = measured.stored;
        crcs[f] = measured.crc;
        sizes.push_back(detail::scan_webdataset(path, path, fields, on_sample, on_damage_or_raise,
                                                codec, measured.size));
      } catch (const DecodeError& e) {
        if (!skip) throw;
        locators.resize(first_sample);
        labels.resize(first_sample);
        damage.resize(first_damage);
        damage.push_back(Damage{
            f, 0, true,
            std::string("compressed shard: ") + e.reason() + " (none of its samples is kept)"});
        codecs[f] = 0;
        sizes.resize(f);
        sizes.push_back(kUnknownSize);
      }
      continue;
    }
    if (indexes.empty()) {
      sizes.push_back(detail::scan_webdataset(path, path, fields, on_sample, on_damage_or_raise));
      continue;
    }
    const std::string index_path = indexes[f].string();
    std::ifstream in(indexes[f], std::ios::binary);
    if (!in) {
      const int err = errno;
      throw IoError(index_path, err,
                    "cannot open WebDataset index '" + index_path + "': " + std::strerror(err));
    }
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    sizes.push_back(detail::index_webdataset(path, path, text, index_path, fields, on_sample,
                                             on_damage_or_raise));
  }
  if (locators.empty()) {
    std::string first;
    if (!damage.empty()) {
      first = " (first damage: '" + (root / relative[damage[0].file]).string() + "' at byte " +
              std::to_string(damage[0].offset) + ": " + damage[0].reason + ")";
    }
    throw ConfigError("from_webdataset: the shards hold no sample with the fields asked for" +
                      first);
  }
  auto catalog = make_data(root, relative, labels, {}, locators, sizes);
  catalog->damage = std::move(damage);
  set_codecs(*catalog, std::move(codecs), std::move(stored), std::move(crcs));
  return Catalog(catalog);
}

Catalog Catalog::from_mds(const fs::path& dir, const std::string& data, const std::string& label,
                          OnError on_error) {
  if (data.empty()) throw ConfigError("from_mds: the data column name is empty");
  std::vector<Locator> locators;
  std::vector<int64_t> labels;
  std::vector<Damage> damage;
  const auto on_damage = [&](const detail::MdsDamage& d) {
    damage.push_back(Damage{d.shard, d.offset, d.rest_of_file, d.reason});
  };
  const auto shards = detail::scan_mds(
      dir, data, label,
      [&](const detail::MdsSample& s) {
        locators.push_back(Locator{s.shard, s.offset, s.length});
        labels.push_back(s.label);
      },
      on_error == OnError::kSkip ? std::function<void(const detail::MdsDamage&)>(on_damage)
                                 : nullptr);
  if (locators.empty()) {
    throw ConfigError(
        "from_mds: '" + dir.string() + "' holds no usable sample" +
        (damage.empty() ? std::string() : " (first damage: " + damage[0].reason + ")"));
  }
  std::vector<std::string> files;
  std::vector<uint64_t> sizes, stored;
  std::vector<uint8_t> codecs;
  std::vector<uint32_t> crcs;
  for (const auto& s : shards) {
    files.push_back(s.file);
    sizes.push_back(s.size);
    codecs.push_back(static_cast<uint8_t>(s.codec));
    stored.push_back(s.stored);
    crcs.push_back(s.crc);
  }
  refuse_duplicates("from_mds", dir, files);
  auto catalog = make_data(dir, files, labels, {}, locators, sizes);
  catalog->damage = std::move(damage);
  set_codecs(*catalog, std::move(codecs), std::move(stored), std::move(crcs));
  return Catalog(catalog);
}

Catalog Catalog::from_located(const fs::path& root, const std::vector<std::string>& files,
                              const std::vector<Locator>& locators,
                              const std::vector<int64_t>& labels,
                              const std::vector<std::string>& classes, std::vector<Damage> damage) {
  if (locators.empty()) throw ConfigError("catalog: no sample was located");
  for (size_t i = 0; i < locators.size(); ++i) {
    if (locators[i].length == kWholeFile) {
      throw ConfigError("catalog: located sample " + std::to_string(i) + " has no length");
    }
  }
  for (const auto& d : damage) {
    if (d.file >= files.size()) throw ConfigError("catalog: damage names a file past the list");
  }
  refuse_duplicates("catalog", root, files);
  auto data = make_data(root, files, labels, classes, locators);
  data->damage = std::move(damage);
  record_file_stats(*data);
  return Catalog(data);
}

uint64_t Catalog::fingerprint() const noexcept { return data_->fingerprint; }

}  // namespace prestage
