// Catalog: the immutable, indexed list of samples 0..N-1 of a data set.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace prestage {

// A catalog is cheap to copy (its contents are shared and never change). Each sample is a path relative
// to the data set's root plus an integer label. A path can never name a file outside the root: absolute
// paths and ".." components are refused when the catalog is built or loaded.
class Catalog {
 public:
  // One class per sub-folder of `root`, as torchvision's ImageFolder: label = index of the class folder
  // in sorted order; files are taken in sorted order within each class. Only files whose extension (case
  // insensitive) is in `extensions` are taken; an empty list takes every regular file.
  static Catalog from_folder(const std::filesystem::path& root,
                             const std::vector<std::string>& extensions = {".jpg", ".jpeg"});

  // A text file of `relative/path[,label]` lines (label defaults to -1); blank lines and lines starting
  // with '#' are ignored.
  static Catalog from_list(const std::filesystem::path& list_file, const std::filesystem::path& root);

  // Builds a catalog from explicit paths (relative to `root`) and labels (same length, or empty for -1).
  static Catalog from_paths(const std::filesystem::path& root, const std::vector<std::string>& paths,
                            const std::vector<int64_t>& labels = {},
                            const std::vector<std::string>& classes = {});

  // Saves to / loads from one binary file, so a job does not walk the file system at every start.
  void save(const std::filesystem::path& file) const;
  static Catalog load(const std::filesystem::path& file);

  size_t size() const noexcept;
  const std::filesystem::path& root() const noexcept;
  std::string_view path(size_t i) const;             // relative to root()
  std::filesystem::path source_path(size_t i) const;  // root() / path(i)
  int64_t label(size_t i) const;
  const std::vector<std::string>& classes() const noexcept;  // class names (from_folder), else empty

  // A 64-bit digest of the root and every path: names the catalog's area of a shared stage directory.
  uint64_t fingerprint() const noexcept;

  struct Data;

 private:
  explicit Catalog(std::shared_ptr<const Data> data);
  std::shared_ptr<const Data> data_;
};

}  // namespace prestage
