#include "tiers/tiers.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>

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

std::span<const std::byte> CheckedCopy::all(std::vector<std::byte>& buffer) const {
  const std::span<const std::byte> bytes = copy_.all(buffer);
  checked_ = true;
  if (!stage_.intact(file_, bytes)) throw CorruptCopy{};
  return bytes;
}

Tiers::Tiers(const Catalog& catalog, StageDirectory* stage, uint64_t max_read_bytes)
    : catalog_(catalog),
      stage_(stage),
      max_read_bytes_(max_read_bytes),
      stalled_(new std::atomic<uint8_t>[catalog.num_files()]()) {}

Tiers::~Tiers() = default;

void Tiers::set_peers(Peers* peers, bool home_copy_always) {
  router_.reset();
  if (peers != nullptr) router_ = std::make_unique<Router>(catalog_, *peers, home_copy_always);
}

Tier Tiers::fetch_home(const Catalog::Locator& loc, uint64_t sample_bytes,
                       std::vector<std::byte>& buffer, bool& pfs_chosen, Router::Home where) {
  pfs_chosen = false;
  if (router_ == nullptr) return Tier::kSource;
  switch (router_->fetch_home(loc, sample_bytes, buffer, pfs_chosen, where)) {
    case Peers::Fetched::kNone:
      return Tier::kSource;
    case Peers::Fetched::kLocal:
      return Tier::kStage;
    case Peers::Fetched::kPeer:
      break;
  }
  return Tier::kPeer;
}

void Tiers::refuse_if_stalled(uint64_t file, const std::string& path) {
  if (stalled_[file].load(std::memory_order_relaxed) == 0 ||
      stalled_[file].exchange(0, std::memory_order_acq_rel) == 0) {
    return;
  }
  throw IoError(
      path, ETIMEDOUT,
      "'" + path + "': stage 2's read of it ran past io_timeout; not read again for this batch");
}

uint64_t Tiers::sample_size(uint64_t id) const { return catalog_sample_size(catalog_, id); }

void Tiers::check_size(uint64_t id, uint64_t size) const {
  if (size == Catalog::kUnknownSize || size <= max_read_bytes_) return;
  throw DecodeError(catalog_.source_path(id).string(),
                    "sample of " + std::to_string(size) + " bytes exceeds max_sample_bytes (" +
                        std::to_string(max_read_bytes_) + " bytes)");
}

const std::string& Tiers::source_path(uint64_t file, std::string& out) const {
  out.assign(catalog_.root().native());
  if (!out.empty() && out.back() != '/') out += '/';
  out += catalog_.file_path(file);
  return out;
}

std::span<const std::byte> Tiers::read(uint64_t id, std::optional<std::span<const std::byte>> held,
                                       std::vector<std::byte>& buffer, TierScratch& scratch,
                                       TierTally* tally) {
  const uint64_t size = sample_size(id);
  check_size(id, size);
  // A home copy the peer tier fetches lands in `buffer` too, not in the thread's scratch: the
  // caller keeps the bytes while it reads its batch's next samples on this thread.
  struct FetchInto {
    TierScratch& scratch;
    std::vector<std::byte>* before;
    ~FetchInto() { scratch.fetch_into = before; }
  } into{scratch, scratch.fetch_into};
  scratch.fetch_into = &buffer;
  std::span<const std::byte> bytes;
  const Tier tier =
      serve(id, Tier::kMemory, held, scratch, tally, Access::kBytes, [&](const ByteSource& at) {
        bytes = at.all(buffer);
        if (size == Catalog::kUnknownSize) check_size(id, bytes.size());
        return static_cast<uint64_t>(bytes.size());
      });
  const Catalog::Locator loc = catalog_.locator(id);
  if (tier == Tier::kSource && loc.offset == 0 && loc.length == Catalog::kWholeFile) {
    stage_miss(loc.file, bytes, scratch.check);
  }
  return bytes;
}

void Tiers::stage_miss(uint64_t file, std::span<const std::byte> bytes,
                       std::vector<std::byte>& buffer) {
  // Stage 2 copies a file of a known size and time with one open and one read and records the
  // catalog's time; a file without them it stats, which a read of stage 3's does not.
  const int64_t mtime = catalog_.file_mtime(file);
  if (stage_ == nullptr || !copies_here_ || router_ != nullptr || stage_->read_only() ||
      stage_failed_.load(std::memory_order_relaxed) ||
      catalog_.file_codec(file) != Catalog::Codec::kNone || mtime == Catalog::kUnknownMtime ||
      catalog_.file_size(file) != bytes.size()) {
    return;
  }
  bool claimed = false;
  while (!claimed) {
    switch (stage_->state(file)) {
      case StageDirectory::kAbsent: {
        const uint64_t charged = stage_->charge(bytes.size());
        if (stage_bound_ != 0 && !stage_->reserve(file, charged, stage_bound_)) return;  // no room
        if (!stage_->try_claim(file)) {
          if (stage_bound_ != 0) stage_->unreserve(file);
          continue;  // claimed meanwhile (stage 1, for a later batch): look again
        }
        claimed = true;
        break;
      }
      case StageDirectory::kInFlight:
        // Stage 1's claim for a later batch, its copy not begun: made now, on its reservation.
        claimed = true;
        break;
      case StageDirectory::kStaged:
      case StageDirectory::kCopying:
        return;
    }
  }
  try {
    // No wait on a neighbour copying or publishing it (kBusy): the read is done, and the
    // neighbour's copy is coming.
    const StageDirectory::Outcome outcome =
        stage_->stage(file,
                      StageDirectory::Stream([&](const StageDirectory::Sink& write,
                                                 std::vector<std::byte>&, int64_t& mtime_ns) {
                        write(bytes);
                        mtime_ns = mtime;
                      }),
                      buffer, StageDirectory::kNoWait);
    if (outcome == StageDirectory::Outcome::kStaged) {
      misses_staged_.fetch_add(1, std::memory_order_relaxed);
    }
  } catch (const IoError&) {
    // The stage directory failed (full, gone): stage 2 meets it too and stops copying; stage 3
    // makes no copy from then on. The read itself succeeded.
    stage_failed_.store(true, std::memory_order_relaxed);
  }
}

Tier Tiers::locate(uint64_t id, TierTally* tally) {
  const uint64_t file = catalog_.locator(id).file;
  // The consumer reads what it is told to: a staged copy is checked first, as serve() checks one
  // that is read in part.
  std::vector<std::byte> check;
  Tier tier = stage_ != nullptr && stage_->servable(file) && stage_->unchanged(file, check)
                  ? Tier::kStage
                  : Tier::kSource;
  if (tier == Tier::kSource && catalog_.file_codec(file) != Catalog::Codec::kNone &&
      stage_compressed(file, check)) {
    // Its consumer reads its decompressed copy; without one (no room for it within the bound), it
    // decompresses the sample from the source (read_compressed_sample()).
    tier = Tier::kStage;
  }
  const uint64_t size = sample_size(id);
  if (tally != nullptr) {
    count(Purpose::kLocate, tier, id, file, 0, size == Catalog::kUnknownSize ? 0 : size, 0, tally);
  }
  return tier;
}

void Tiers::fetch_file(uint64_t file, std::vector<std::byte>& buffer, int64_t& mtime_ns,
                       TierTally* tally) {
  fetch(file, buffer, mtime_ns, tally, nullptr);
}

void Tiers::copy_file(uint64_t file, const StageDirectory::Sink& write,
                      std::vector<std::byte>& buffer, int64_t& mtime_ns, TierTally* tally) {
  fetch(file, buffer, mtime_ns, tally, &write);
}

void Tiers::fetch(uint64_t file, std::vector<std::byte>& buffer, int64_t& mtime_ns,
                  TierTally* tally, const StageDirectory::Sink* write) {
  std::string path;
  const int64_t start = ledger_.now_ns();
  const uint64_t size = catalog_.file_size(file);
  const int64_t mtime = catalog_.file_mtime(file);
  const bool known = size != Catalog::kUnknownSize && mtime != Catalog::kUnknownMtime;
  // A file whose size the catalog records may come from its home copy on another node (checked
  // against the size and the owner's CRC-32C), recorded with the catalog's modification time as a
  // read of the source is; a catalog without one checks none (a later catalog that records one
  // finds it differs, and copies the file again). Not this node's own home copy: stage 2 is the one
  // making it.
  bool pfs_chosen = false;
  Catalog::Locator whole;
  whole.file = file;
  const Tier tier = size != Catalog::kUnknownSize
                        ? fetch_home(whole, size, buffer, pfs_chosen, Router::Home::kOtherNode)
                        : Tier::kSource;
  if (tier != Tier::kSource) {
    mtime_ns = mtime;
  } else {
    const FileRef source = source_file(catalog_, source_path(file, path));
    TimedRead timed(model(), SourceModel::kPfs, size == Catalog::kUnknownSize ? 0 : size,
                    pfs_chosen);
    if (catalog_.file_codec(file) != Catalog::Codec::kNone) {
      stalled_if_timed_out(file,
                           [&] { decompress_file(catalog_, file, source, path, buffer, write); });
      mtime_ns = mtime;
      timed.end(size != Catalog::kUnknownSize);
      // What was read from the source: the compressed bytes.
      count(Purpose::kCopy, tier, IoTrace::kNoSample, file, 0, catalog_.file_stored_size(file),
            start, tally);
      return;
    } else if (known) {
      // One open and one read, no stat: a file of another size than the catalog's is an IoError
      // (not staged, stage 3 reads it and reports it). The copy is recorded with the catalog's
      // modification time, which the source is not asked for: a rewrite that keeps the size is not
      // seen here, as it is not by a direct read.
      buffer.resize(size);
      stalled_if_timed_out(file, [&] { read_file_exact(source, buffer); });
      mtime_ns = mtime;
    } else {
      stalled_if_timed_out(file, [&] { read_file(source, buffer, &mtime_ns); });
    }
    timed.end(size != Catalog::kUnknownSize);
  }
  count(Purpose::kCopy, tier, IoTrace::kNoSample, file, 0, buffer.size(), start, tally);
  if (write != nullptr) (*write)(buffer);
}

void Tiers::fetch_sample(uint64_t id, std::span<std::byte> out, std::vector<std::byte>& fetched,
                         TierTally* tally) {
  const uint64_t size = sample_size(id);
  if (size != out.size()) {
    throw std::logic_error("tiers: a sample read ahead must have its catalog size as its place");
  }
  check_size(id, size);
  std::string path;
  const Catalog::Locator loc = catalog_.locator(id);
  const int64_t start = ledger_.now_ns();
  bool pfs_chosen = false;  // the model chose the source over a home copy (and queued the read)
  const Tier tier = fetch_home(loc, size, fetched, pfs_chosen);
  if (tier == Tier::kSource && catalog_.file_codec(loc.file) != Catalog::Codec::kNone) {
    if (pfs_chosen && router_ != nullptr) router_->pfs_unqueued(size);
    throw IoError(source_path(loc.file, path), EINVAL,
                  "a sample of a compressed file is not read ahead from the source");
  }
  if (tier == Tier::kSource) {
    // A loader that closes reads nothing more for batches it will not deliver.
    if (router_ != nullptr && router_->peers().closing()) {
      if (pfs_chosen) router_->pfs_unqueued(size);
      throw IoError(source_path(loc.file, path), ECANCELED, "the loader is closing");
    }
    TimedRead timed(model(), SourceModel::kPfs, size, pfs_chosen);
    const FileRef source = source_file(catalog_, source_path(loc.file, path));
    stalled_if_timed_out(loc.file, [&] { read_located(source, loc, out); });
    timed.end(true);
  } else {
    // The peer tier checked the copy against the catalog's size.
    if (fetched.size() != out.size()) {
      throw IoError(source_path(loc.file, path), EIO,
                    "a home copy of another size than the catalog's");
    }
    std::copy(fetched.begin(), fetched.end(), out.begin());
  }
  count(Purpose::kReadAhead, tier, id, loc.file, loc.offset, size, start, tally);
}

bool Tiers::wait_for_copy(uint64_t file, std::vector<std::byte>& buffer, bool claim_absent) {
  if (stage_ == nullptr) return false;
  const std::atomic<bool>* cancel = io_cancel();
  auto pause = std::chrono::microseconds(100);
  while (true) {
    switch (stage_->state(file)) {
      case StageDirectory::kStaged:
        // A copy from an earlier run is checked first (one that fails is removed).
        return !stage_->unverified(file) || stage_->verify(file, buffer);
      case StageDirectory::kAbsent: {
        if (!claim_absent || stage_->read_only() || stage_failed_.load(std::memory_order_relaxed)) {
          return false;
        }
        const uint64_t bytes = stage_->charge(catalog_.file_size(file));
        if (stage_bound_ != 0 && !stage_->reserve(file, bytes, stage_bound_)) return false;
        if (!stage_->try_claim(file)) {
          if (stage_bound_ != 0) stage_->unreserve(file);
          continue;
        }
        [[fallthrough]];
      }
      case StageDirectory::kInFlight:
        try {
          if (copy_now(file, buffer)) return true;
        } catch (const StageFailed&) {
          stage_failed_.store(true, std::memory_order_relaxed);
          return false;
        }
        continue;
      case StageDirectory::kCopying:
        break;
    }
    if (cancel != nullptr && cancel->load(std::memory_order_acquire)) {
      std::string path;
      throw IoError(source_path(file, path), ECANCELED,
                    "the loader is closing while stage 2 copies '" + path + "'");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(2000));
  }
}

bool Tiers::copy_now(uint64_t file, std::vector<std::byte>& buffer) {
  std::string path;
  source_path(file, path);
  const std::string why = "'" + path + "' is compressed and read only from its decompressed " +
                          "copy in the stage directory";
  StageDirectory::Outcome outcome;
  try {
    outcome = stage_->stage(
        file,
        StageDirectory::Stream([&](const StageDirectory::Sink& write, std::vector<std::byte>& out,
                                   int64_t& mtime_ns) { copy_file(file, write, out, mtime_ns); }),
        buffer, StageDirectory::kForever);
  } catch (const StageDirectory::SourceError& e) {
    std::rethrow_exception(e.error);
  } catch (const IoError& e) {
    throw StageFailed{IoError(path, e.error_code(), why + ", which failed: " + e.what())};
  }
  switch (outcome) {
    case StageDirectory::Outcome::kStaged:
    case StageDirectory::Outcome::kAdopted:
      return true;
    case StageDirectory::Outcome::kBusy:
      throw IoError(path, EAGAIN, why + ", and the process making it has stalled");
    case StageDirectory::Outcome::kChanged:
      throw IoError(path, EIO, "'" + path + "' changed since the catalog was built: not staged");
    case StageDirectory::Outcome::kDropped:
      break;
  }
  return false;
}

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

void Tiers::read_compressed(const Catalog::Locator& loc, std::vector<std::byte>& out) {
  std::string path;
  source_path(loc.file, path);
  stalled_if_timed_out(loc.file, [&] { read_compressed_sample(catalog_, loc, path, out); });
}

bool Tiers::stage_compressed(uint64_t file, std::vector<std::byte>& buffer) {
  std::string path;
  source_path(file, path);
  if (stage_ == nullptr) {
    throw ConfigError("'" + path + "' is compressed (" + codec_name(catalog_.file_codec(file)) +
                      "): its samples are read from its decompressed copy in a stage directory, " +
                      "and there is none");
  }
  // Twice at most: an earlier run's copy that fails its check is removed, and made again.
  for (int attempt = 0; attempt < 2; ++attempt) {
    stage_->take_over_published();
    if (wait_for_copy(file, buffer, /*claim_absent=*/true)) return true;
  }
  return false;
}

}  // namespace prestage::detail
