// Files compressed whole (a WebDataset `.tar.gz` or `.tar.zst`, an MDS shard written with
// compression): their codec told by their first bytes, and their decompressed bytes read forward
// in pieces, so that a catalog scan and stage 2's copy hold a bounded window of them, never the
// whole file. Such a file cannot be read by byte range: its samples are byte ranges of its
// decompressed bytes, which stage 2 writes to the stage directory (tiers/tiers.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "prestage/catalog.hpp"
#include "util/file_io.hpp"

namespace prestage::detail {

// The codec of a stream, from its magic bytes (gzip 1f 8b, zstd 28 b5 2f fd); kNone otherwise.
Catalog::Codec codec_of(std::span<const std::byte> head);
const char* codec_name(Catalog::Codec codec);  // "gzip", "zstd", "none"

// The decompressed bytes of one file, read forward: the file is read in pieces of kChunk bytes
// (one OpenFile: one open for the whole pass) and decompressed as they are asked for. gzip: one
// member or several back to back (pigz, `cat a.gz b.gz`); zstd: one frame or several. Not
// thread-safe.
class Decompressor {
 public:
  static constexpr size_t kChunk = size_t{1} << 20;
  // IoError if the file cannot be opened.
  Decompressor(const FileRef& file, Catalog::Codec codec, const std::string& path);
  ~Decompressor();
  Decompressor(const Decompressor&) = delete;
  Decompressor& operator=(const Decompressor&) = delete;
  // Up to out.size() decompressed bytes into `out`; fewer only at the end of the stream (0: the
  // end). A stream that is corrupt, truncated, or followed by bytes that are not another member
  // or frame is a DecodeError naming the path, the codec and the compressed byte; a read that
  // fails an IoError.
  size_t read(std::span<std::byte> out);
  uint64_t stored_size() const noexcept;  // the file's bytes, when it was opened
  uint64_t produced() const noexcept;     // decompressed bytes read so far

  struct State;

 private:
  std::unique_ptr<State> state_;
};

// One pass over a compressed file: its bytes, its decompressed bytes and their CRC-32C. Errors as
// Decompressor::read().
struct Decompressed {
  uint64_t stored = 0;
  uint64_t size = 0;
  uint32_t crc = 0;
};
Decompressed measure_compressed(const FileRef& file, Catalog::Codec codec, const std::string& path);

// The codec of file `file` from its first bytes (kNone for a file too short to tell). IoError if
// it cannot be read.
Catalog::Codec codec_of_file(const FileRef& file);

}  // namespace prestage::detail
