#include "tiers/stage_tier.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <exception>
#include <stdexcept>
#include <thread>

#include "formats/compressed.hpp"
#include "util/file_io.hpp"

namespace prestage::detail {

std::span<const std::byte> CheckedCopy::all(std::vector<std::byte>& buffer) const {
  const std::span<const std::byte> bytes = copy_.all(buffer);
  checked_ = true;
  if (!stage_.intact(file_, bytes)) throw CorruptCopy{};
  return bytes;
}

std::optional<Served> StageTier::serve(Want& want, const DecodeRead& read) {
  return serve_copy(want, read);
}

std::optional<Served> StageTier::serve(Want& want, const Look&) {
  // The consumer reads what it is told to: a staged copy is checked first, as a decode checks one
  // that is read in part.
  const uint64_t file = want.loc.file;
  const Served here{Tier::kStage, want.size == Catalog::kUnknownSize ? 0 : want.size};
  std::vector<std::byte> check;
  if (stage_ != nullptr && stage_->servable(file) && stage_->unchanged(file, check)) return here;
  // Its consumer reads its decompressed copy; without one (no room for it within the bound), it
  // decompresses the sample from the source (read_compressed_sample()).
  if (catalog_.file_codec(file) != Catalog::Codec::kNone && stage_compressed(file, check)) {
    return here;
  }
  return std::nullopt;
}

std::optional<Served> StageTier::serve_copy(const Want& want, const DecodeRead& read) {
  const uint64_t file = want.loc.file;
  // A copy left by an earlier run is served only once stage 2 has checked it against its record.
  if (stage_ == nullptr || !stage_->servable(file)) return std::nullopt;
  TierScratch& scratch = read.scratch;
  const bool whole = read.access == Access::kBytes && want.loc.length == Catalog::kWholeFile;
  if (!whole && read.access != Access::kLook && !stage_->unchanged(file, scratch.check)) {
    return std::nullopt;
  }
  scratch.staged = stage_->staged_path(file);
  const FileSource copy =
      FileSource::sample(FileRef(scratch.staged), want.loc, want.size, want.path);
  try {
    if (!whole) return use_bytes(Tier::kStage, copy, read);
    const CheckedCopy checked(copy, *stage_, file);
    const Served served = use_bytes(Tier::kStage, checked, read);
    if (!checked.checked()) throw std::logic_error("tiers: a staged copy was read unchecked");
    return served;
  } catch (const IoError&) {
    // The copy vanished: the source has the same bytes.
  } catch (const CorruptCopy&) {
    // Removed and counted by CheckedCopy: the source has the right bytes.
  }
  return std::nullopt;
}

std::optional<Served> StageTier::serve_awaited(const Want& want, const DecodeRead& read) {
  // Never a byte range of a compressed source: a copy under way is waited for; without one (stage
  // 1 declined it for want of room, or its copy failed), the source decompresses the sample.
  if (catalog_.file_codec(want.loc.file) == Catalog::Codec::kNone) return std::nullopt;
  while (wait_for_copy(want.loc.file, read.scratch.check, copies_here_)) {
    if (auto served = serve_copy(want, read)) return served;
  }
  return std::nullopt;
}

void StageTier::stage_miss(uint64_t file, std::span<const std::byte> bytes,
                           std::vector<std::byte>& buffer, bool peers_on) {
  // Stage 2 copies a file of a known size and time with one open and one read and records the
  // catalog's time; a file without them it stats, which a read of stage 3's does not.
  const int64_t mtime = catalog_.file_mtime(file);
  if (stage_ == nullptr || !copies_here_ || peers_on || stage_->read_only() ||
      failed_.load(std::memory_order_relaxed) ||
      catalog_.file_codec(file) != Catalog::Codec::kNone || mtime == Catalog::kUnknownMtime ||
      catalog_.file_size(file) != bytes.size()) {
    return;
  }
  bool claimed = false;
  while (!claimed) {
    switch (stage_->state(file)) {
      case StageDirectory::kAbsent: {
        const uint64_t charged = stage_->charge(bytes.size());
        if (bound_ != 0 && !stage_->reserve(file, charged, bound_)) return;  // no room
        if (!stage_->try_claim(file)) {
          if (bound_ != 0) stage_->unreserve(file);
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
    failed_.store(true, std::memory_order_relaxed);
  }
}

bool StageTier::wait_for_copy(uint64_t file, std::vector<std::byte>& buffer, bool claim_absent) {
  if (stage_ == nullptr) return false;
  const std::atomic<bool>* cancel = io_cancel();
  auto pause = std::chrono::microseconds(100);
  while (true) {
    switch (stage_->state(file)) {
      case StageDirectory::kStaged:
        // A copy from an earlier run is checked first (one that fails is removed).
        return !stage_->unverified(file) || stage_->verify(file, buffer);
      case StageDirectory::kAbsent: {
        if (!claim_absent || stage_->read_only() || failed_.load(std::memory_order_relaxed)) {
          return false;
        }
        const uint64_t bytes = stage_->charge(catalog_.file_size(file));
        if (bound_ != 0 && !stage_->reserve(file, bytes, bound_)) return false;
        if (!stage_->try_claim(file)) {
          if (bound_ != 0) stage_->unreserve(file);
          continue;
        }
        [[fallthrough]];
      }
      case StageDirectory::kInFlight:
        try {
          if (copy_now(file, buffer)) return true;
        } catch (const StageFailed&) {
          failed_.store(true, std::memory_order_relaxed);
          return false;
        }
        continue;
      case StageDirectory::kCopying:
        break;
    }
    if (cancel != nullptr && cancel->load(std::memory_order_acquire)) {
      std::string path;
      throw IoError(source_path(catalog_, file, path), ECANCELED,
                    "the loader is closing while stage 2 copies '" + path + "'");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(2000));
  }
}

bool StageTier::copy_now(uint64_t file, std::vector<std::byte>& buffer) {
  std::string path;
  source_path(catalog_, file, path);
  const std::string why = "'" + path + "' is compressed and read only from its decompressed " +
                          "copy in the stage directory";
  StageDirectory::Outcome outcome;
  try {
    outcome = stage_->stage(
        file,
        StageDirectory::Stream([&](const StageDirectory::Sink& write, std::vector<std::byte>& out,
                                   int64_t& mtime_ns) { copy_(file, write, out, mtime_ns); }),
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

bool StageTier::stage_compressed(uint64_t file, std::vector<std::byte>& buffer) {
  std::string path;
  source_path(catalog_, file, path);
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
