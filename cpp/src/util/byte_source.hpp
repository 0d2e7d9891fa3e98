// The one currency for "the bytes of a sample": random access to them (Arrow's RandomAccessFile is
// the model: a size, and a read of any range), whether the tiers hold them in memory (read ahead,
// fetched from a peer) or in a file (a staged copy, the source). The codecs' probes and fills read
// through it, so that they need not know which tier served the sample: the tiers (tiers/tiers.hpp)
// hand each use of a sample one of these, and nothing else.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "util/file_io.hpp"

namespace prestage::detail {

// Random access to one sample's bytes. Not thread-safe; one per call site.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual uint64_t size() const = 0;
  // Reads out.size() bytes at `offset`; the range must lie inside size() (DecodeError otherwise).
  virtual void read(uint64_t offset, std::span<std::byte> out) const = 0;
  // All the bytes when they are already in memory, else an empty span.
  virtual std::span<const std::byte> memory() const { return {}; }
  // All the bytes as one span: their memory, or read into `buffer` (resized to fit), in the fewest
  // operations the file allows (FileSource::all()).
  virtual std::span<const std::byte> all(std::vector<std::byte>& buffer) const;
  // The file the bytes lie in, for a library that opens it by name (HDF5); null for bytes in
  // memory.
  virtual const FileRef* file() const { return nullptr; }
  virtual const std::string& path() const = 0;
};

class MemorySource final : public ByteSource {
 public:
  MemorySource(std::span<const std::byte> bytes, const std::string& path)
      : bytes_(bytes), path_(path) {}
  uint64_t size() const override { return bytes_.size(); }
  void read(uint64_t offset, std::span<std::byte> out) const override;
  std::span<const std::byte> memory() const override { return bytes_; }
  const std::string& path() const override { return path_; }

 private:
  std::span<const std::byte> bytes_;
  const std::string& path_;
};

// `length` bytes at `offset` of the file `file` (Catalog::kWholeFile: all of it), opened at the
// first look (size() or read()) and held open for every read after it: a sample's headers and
// data cost one open. Errors name `path` (the catalog's source path, whichever copy is read).
class FileSource final : public ByteSource {
 public:
  FileSource(const FileRef& file, uint64_t offset, uint64_t length, const std::string& path)
      : file_(file), offset_(offset), length_(length), path_(path) {}
  // Catalog sample `loc` in `file`: its byte range, or the whole file, whose size the catalog
  // records as `size` (Catalog::kUnknownSize: none). That size is all()'s alone: size() and read()
  // see the file as it is when opened, as a codec must.
  static FileSource sample(const FileRef& file, const Catalog::Locator& loc, uint64_t size,
                           const std::string& path);
  uint64_t size() const override;
  void read(uint64_t offset, std::span<std::byte> out) const override;
  // A range: one open and one read, no stat (read_range). A whole file of a recorded size: one
  // open and one read, no stat, and a file of another size is an IoError (read_file_exact). A whole
  // file of unknown size: as many bytes as it holds (read_file). Opened already: read from there.
  std::span<const std::byte> all(std::vector<std::byte>& buffer) const override;
  const FileRef* file() const override { return &file_; }
  const std::string& path() const override { return path_; }

 private:
  const OpenFile& open() const;
  FileRef file_;
  uint64_t offset_;
  mutable uint64_t length_;
  const std::string& path_;
  uint64_t recorded_ = ~uint64_t{0};  // a whole file's recorded size (sample()), for all()
  mutable std::optional<OpenFile> open_;
};

// The bytes of `source` from `offset` to the end (or `length` of them) as one span: `source`'s own
// memory when it has some, else read into `buffer` (grown, never shrunk).
std::span<const std::byte> read_span(const ByteSource& source, uint64_t offset, uint64_t length,
                                     std::vector<std::byte>& buffer);

// The first bytes of `source` (up to buffer's 8), which tell its format (.npy, zip, zstd), read
// into `buffer`.
std::span<const std::byte> read_magic(const ByteSource& source, std::array<std::byte, 8>& buffer);

}  // namespace prestage::detail
