#include "tiers/source_tier.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "formats/compressed.hpp"
#include "tiers/peers.hpp"
#include "util/crc32c.hpp"
#include "util/file_io.hpp"

namespace prestage::detail {

namespace {

// The decompressed bytes of compressed file `file` of `catalog`, read from `source` into
// `buffer`: exactly the count the catalog recorded, ending where the stream ends, with the CRC it
// recorded; anything else means the file changed since the catalog was built.
// With `write`, the bytes go there in pieces of `buffer`'s kChunk, and `buffer` holds the last.
void decompress_file(const Catalog& catalog, uint64_t file, const FileRef& source,
                     const std::string& path, std::vector<std::byte>& buffer,
                     const StageDirectory::Sink* write) {
  Decompressor in(source, catalog.file_codec(file), path);
  const uint64_t stored = catalog.file_stored_size(file);
  if (in.stored_size() != stored) {
    throw IoError(path, EIO,
                  "'" + path + "' holds " + std::to_string(in.stored_size()) +
                      " bytes, its catalog recorded " + std::to_string(stored) +
                      ": it changed since the catalog was built");
  }
  const uint64_t size = catalog.file_size(file);
  uint64_t done = 0;
  uint32_t crc = 0;
  if (write != nullptr) {
    buffer.resize(Decompressor::kChunk);
    while (done <= size) {  // one byte past it at most: a stream longer than recorded
      const size_t n = in.read(std::span<std::byte>(
          buffer.data(), static_cast<size_t>(std::min<uint64_t>(buffer.size(), size + 1 - done))));
      if (n == 0) break;
      const std::span<const std::byte> piece(buffer.data(), n);
      crc = crc32c(piece, crc);
      done += n;
      if (done <= size) (*write)(piece);
    }
  } else {
    buffer.resize(size);
    while (done < size) {
      const size_t n = in.read(std::span<std::byte>(buffer.data() + done, size - done));
      if (n == 0) break;
      done += n;
    }
    crc = crc32c(std::span<const std::byte>(buffer.data(), done));
  }
  std::byte more;
  if (done != size || in.read(std::span<std::byte>(&more, 1)) != 0 ||
      crc != catalog.file_crc(file)) {
    throw DecodeError(
        path, std::string("its ") + codec_name(catalog.file_codec(file)) +
                  " stream decompresses to other bytes than when the catalog was " + "built (" +
                  (done != size ? std::to_string(done) + " bytes, not " + std::to_string(size)
                                : std::string("another CRC")) +
                  "): it changed; build the catalog again");
  }
}

}  // namespace

void read_compressed_sample(const Catalog& catalog, const Catalog::Locator& loc,
                            const std::string& path, std::vector<std::byte>& out) {
  const uint64_t size = catalog.file_size(loc.file);
  const uint64_t length = loc.length == Catalog::kWholeFile ? size : loc.length;
  if (loc.offset > size || length > size - loc.offset) {
    throw DecodeError(path, "a sample past the end of its decompressed bytes");
  }
  out.resize(length);
  uint64_t at = 0;
  const StageDirectory::Sink keep = [&](std::span<const std::byte> piece) {
    const uint64_t from = std::max(at, loc.offset);
    const uint64_t to = std::min(at + piece.size(), loc.offset + length);
    if (from < to) {
      std::memcpy(out.data() + (from - loc.offset), piece.data() + (from - at), to - from);
    }
    at += piece.size();
  };
  std::vector<std::byte> chunk;
  decompress_file(catalog, loc.file, source_file(catalog, path), path, chunk, &keep);
}

void SourceTier::refuse_if_stalled(uint64_t file, const std::string& path) {
  if (stalled_[file].load(std::memory_order_relaxed) == 0 ||
      stalled_[file].exchange(0, std::memory_order_acq_rel) == 0) {
    return;
  }
  throw IoError(
      path, ETIMEDOUT,
      "'" + path + "': stage 2's read of it ran past io_timeout; not read again for this batch");
}

void SourceTier::read_compressed(const Catalog::Locator& loc, std::vector<std::byte>& out) {
  std::string path;
  source_path(catalog_, loc.file, path);
  stalled_if_timed_out(loc.file, [&] { read_compressed_sample(catalog_, loc, path, out); });
}

std::optional<Served> SourceTier::serve(Want& want, const DecodeRead& read) {
  if (read.access != Access::kLook) refuse_if_stalled(want.loc.file, want.path);
  if (catalog_.file_codec(want.loc.file) != Catalog::Codec::kNone) {
    // The sample's bytes, decompressed from the whole stream into memory, checked.
    std::vector<std::byte>& buffer = read.landing();
    read_compressed(want.loc, buffer);
    return use_bytes(Tier::kSource, MemorySource(buffer, want.path), read);
  }
  return use_bytes(
      Tier::kSource,
      FileSource::sample(source_file(catalog_, want.path), want.loc, want.size, want.path), read);
}

std::optional<Served> SourceTier::serve(Want& want, const Look&) {
  return Served{Tier::kSource, want.size == Catalog::kUnknownSize ? 0 : want.size};
}

std::optional<Served> SourceTier::serve(Want& want, const Prefetch& read) {
  const uint64_t size = want.size;
  if (catalog_.file_codec(want.loc.file) != Catalog::Codec::kNone) {
    if (want.pfs_chosen && router_ != nullptr) router_->pfs_unqueued(want.loc, size);
    throw IoError(want.path, EINVAL,
                  "a sample of a compressed file is not read ahead from the source");
  }
  // A loader that closes reads nothing more for batches it will not deliver.
  if (router_ != nullptr && router_->peers().closing()) {
    if (want.pfs_chosen) router_->pfs_unqueued(want.loc, size);
    throw IoError(want.path, ECANCELED, "the loader is closing");
  }
  TimedRead timed(model(), SourceModel::kPfs, size, want.pfs_chosen);
  const FileRef source = source_file(catalog_, want.path);
  stalled_if_timed_out(want.loc.file, [&] { read_located(source, want.loc, read.out); });
  timed.end(true);
  return Served{Tier::kSource, size};
}

std::optional<Served> SourceTier::serve(Want& want, const FileCopy& copy) {
  const uint64_t file = want.loc.file;
  const uint64_t size = want.size;
  const int64_t mtime = catalog_.file_mtime(file);
  std::vector<std::byte>& buffer = copy.buffer;
  const FileRef source = source_file(catalog_, want.path);
  // Timed by the bytes it reads from the source (a compressed file's stored bytes), as the router
  // queued it.
  TimedRead timed(model(), SourceModel::kPfs,
                  size == Catalog::kUnknownSize ? 0 : source_bytes(catalog_, want.loc, size),
                  want.pfs_chosen);
  if (catalog_.file_codec(file) != Catalog::Codec::kNone) {
    stalled_if_timed_out(
        file, [&] { decompress_file(catalog_, file, source, want.path, buffer, copy.write); });
    copy.mtime_ns = mtime;
    want.written = copy.write != nullptr;
    timed.end(size != Catalog::kUnknownSize);
    // What was read from the source: the compressed bytes.
    return Served{Tier::kSource, catalog_.file_stored_size(file)};
  }
  if (size != Catalog::kUnknownSize && mtime != Catalog::kUnknownMtime) {
    // One open and one read, no stat: a file of another size than the catalog's is an IoError
    // (not staged, stage 3 reads it and reports it). The copy is recorded with the catalog's
    // modification time, which the source is not asked for: a rewrite that keeps the size is not
    // seen here, as it is not by a direct read.
    buffer.resize(size);
    stalled_if_timed_out(file, [&] { read_file_exact(source, buffer); });
    copy.mtime_ns = mtime;
  } else {
    stalled_if_timed_out(file, [&] { read_file(source, buffer, &copy.mtime_ns); });
  }
  timed.end(size != Catalog::kUnknownSize);
  return Served{Tier::kSource, buffer.size()};
}

}  // namespace prestage::detail
