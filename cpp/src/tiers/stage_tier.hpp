// The stage directory as a tier: the node's copies (tiers/stage_directory.hpp), served only as this
// unit decides: a copy left by an earlier run once stage 2 has checked it against its record, a
// whole copy read whole by its CRC-32C (CheckedCopy), a copy read in part by
// StageDirectory::unchanged(); a copy that fails is removed and counted, and the next tier serves.
// It also makes the copies stage 3 needs of its own: a compressed file's decompressed copy (read
// only from there), and a miss read whole from the source, published as its file's copy.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "prestage/catalog.hpp"
#include "prestage/error.hpp"
#include "tiers/stage_directory.hpp"
#include "tiers/tier.hpp"
#include "util/byte_source.hpp"

namespace prestage::detail {

// A whole staged copy as a use that reads its bytes whole (Access::kBytes) sees it: all() checks
// them against the copy's record once read; a copy that fails is removed and counted
// (StageDirectory::intact()), and CorruptCopy thrown: the read goes to the next tier.
class CheckedCopy final : public ByteSource {
 public:
  CheckedCopy(const FileSource& copy, StageDirectory& stage, uint64_t file)
      : copy_(copy), stage_(stage), file_(file) {}
  uint64_t size() const override { return copy_.size(); }
  void read(uint64_t offset, std::span<std::byte> out) const override { copy_.read(offset, out); }
  std::span<const std::byte> all(std::vector<std::byte>& buffer) const override;
  const FileRef* file() const override { return copy_.file(); }
  const std::string& path() const override { return copy_.path(); }
  bool checked() const noexcept { return checked_; }

 private:
  const FileSource& copy_;
  StageDirectory& stage_;
  uint64_t file_;
  mutable bool checked_ = false;
};

// Thread-safe. Serves kDecode (a copy it may serve) and kLocate (a copy it may serve, or a
// compressed file's copy made now). The catalog and the stage directory (null: none) must outlive
// it.
class StageTier final : public TierReader {
 public:
  // How a copy of a whole file is made through the chain's kCopy (Tiers::open of a FileCopy that
  // writes as it reads).
  using Copy = std::function<void(uint64_t file, const StageDirectory::Sink& write,
                                  std::vector<std::byte>& buffer, int64_t& mtime_ns)>;
  StageTier(const Catalog& catalog, StageDirectory* stage, Copy copy)
      : catalog_(catalog), stage_(stage), copy_(std::move(copy)) {}

  using TierReader::serve;
  std::optional<Served> serve(Want& want, const DecodeRead& read) override;
  std::optional<Served> serve(Want& want, const Look& look) override;

  // The node's bound on the stage directory's copies (0: none), within which stage 3 makes copies
  // of its own; set before the first read. Without it, stage 3 makes none for a decode.
  void set_bound(uint64_t bound) noexcept {
    bound_ = bound;
    copies_here_ = true;
  }

  // A decode of a sample of a compressed file that the stage directory did not serve: its copy,
  // once a copy under way (or one made here, see wait_for_copy) may be served; nullopt when none
  // is coming (the source decompresses the sample).
  std::optional<Served> serve_awaited(const Want& want, const DecodeRead& read);

  // The publication of a miss of a SampleBytes read: `bytes`, the whole of file `file`, read from
  // the source (see Tiers::misses_staged()). `peers_on`: the peer tier is on (its owner makes the
  // copy).
  void stage_miss(uint64_t file, std::span<const std::byte> bytes, std::vector<std::byte>& buffer,
                  bool peers_on);
  uint64_t misses_staged() const noexcept { return misses_staged_.load(std::memory_order_relaxed); }

  // A file compressed whole (Catalog::file_codec) is never read by byte range: its samples are
  // served from its decompressed copy in the stage directory, or, when there is none, by the
  // source from its whole stream decompressed (SourceTier). For a sample of one that the stage
  // directory cannot serve, decode=locate calls this (its consumer reads the copy). True once the
  // file's copy is staged and may be served: a copy stage 2 (or a neighbour) is making is waited
  // for, a copy nobody is making is made here, on a reservation within the node's bound as stage
  // 2's copies are (set_bound). False when none can be made (no room within the bound, a stage
  // directory that is read-only or failed): the consumer then decompresses the sample from the
  // source (read_compressed_sample()). Throws what the copy met, naming the shard: the source's
  // DecodeError (a corrupt stream, bytes that differ from the catalog's) or IoError (it changed,
  // it cannot be read), ECANCELED when this thread's io_cancel() is set; ConfigError without a
  // stage directory.
  bool stage_compressed(uint64_t file, std::vector<std::byte>& buffer);
  // Stage 3, for a sample of a compressed file that the stage directory does not hold: true once
  // its copy may be served, false if none is coming (the caller reads the source). A copy under
  // way is waited for; a claim whose copy has not begun (stage 1's, for a later batch) is copied
  // here, on its reservation (stage 2's turn then finds it done): never a wait on stage 2 for work
  // that waits on stage 3; an absent file is claimed and copied here if its bytes fit the bound
  // (set_bound: `claim_absent`), as a miss of an uncompressed file is a read of its range. Throws
  // what such a copy meets from the source, as stage_compressed(); a stage directory that fails is
  // left alone from then on (false). IoError (ECANCELED) when this thread's io_cancel() is set.
  bool wait_for_copy(uint64_t file, std::vector<std::byte>& buffer, bool claim_absent);
  // Copies claimed (or in flight) file `file` to the stage directory now, through the chain's
  // copy; whether it is staged. An IoError of the stage directory's is thrown as StageFailed.
  bool copy_now(uint64_t file, std::vector<std::byte>& buffer);
  struct StageFailed {
    IoError error;
  };

 private:
  std::optional<Served> serve_copy(const Want& want, const DecodeRead& read);

  const Catalog& catalog_;
  StageDirectory* stage_;
  Copy copy_;
  uint64_t bound_ = 0;
  bool copies_here_ = false;
  std::atomic<bool> failed_{false};  // a copy of stage 3's met a stage directory error
  std::atomic<uint64_t> misses_staged_{0};
};

// The second look at the stage directory in a decode's chain, after the peers: a compressed
// file's copy, awaited (StageTier::serve_awaited).
class AwaitedCopyTier final : public TierReader {
 public:
  explicit AwaitedCopyTier(StageTier& stage) : stage_(stage) {}
  using TierReader::serve;
  std::optional<Served> serve(Want& want, const DecodeRead& read) override {
    return stage_.serve_awaited(want, read);
  }

 private:
  StageTier& stage_;
};

}  // namespace prestage::detail
