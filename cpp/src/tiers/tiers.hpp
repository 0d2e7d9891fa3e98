// Where a sample's bytes come from, through one interface that counts each read it serves, once,
// in its ledger (tiers/ledger.hpp: the per-tier figures and the I/O trace). Each caller tries its
// tiers nearest first:
//  - stage 3 (serve(), read(), locate()): the bytes stage 2 read ahead into memory for its
//    batch, the node's stage directory (a copy left by an earlier run only once stage 2 has
//    checked it), the sample's home copy through the peer tier as fetch_sample() reads it (for
//    every format: a sample stage 2 did not read ahead, an array's header, a slice's file), the
//    source (the PFS);
//  - stage 2's read-ahead (fetch_sample()): the sample's home copy through the peer tier
//    (tiers/peers.hpp: from the owner node over MPI, or from this node's stage directory), or the
//    source: whichever the router (tiers/router.hpp) expects to finish the read first;
//  - stage 2's copies (fetch_file()): a home copy on another node through the peer tier, or the
//    source, chosen as for the read-ahead.
// Stages 2 and 3 read samples through this unit alone (but for stage 2's check of an earlier run's
// copies, StageDirectory::verify), so that a new tier changes it and nothing in stages 1 and 3.
#pragma once

#include <array>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "prestage/catalog.hpp"
#include "prestage/error.hpp"
#include "tiers/ledger.hpp"
#include "tiers/router.hpp"
#include "tiers/source_model.hpp"
#include "tiers/stage_directory.hpp"
#include "util/byte_source.hpp"
#include "util/file_io.hpp"
#include "util/io_trace.hpp"

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

// What a use of a sample (Tiers::serve) does with it, which says how a staged copy is checked.
enum class Access : uint8_t {
  kLook,   // reads nothing of its bytes (a size from the catalog or the file's length)
  kBytes,  // reads them whole, with ByteSource::all() (which checks a whole staged copy)
  kFile,   // reads parts of the file itself (a codec's header and data)
};

// Thrown by CheckedCopy::all() for a copy that failed: serve() reads the next tier.
struct CorruptCopy {};

// Per-thread strings for the paths a lookup builds, so that no read allocates once warm.
struct TierScratch {
  std::string staged;
  std::string source;
  std::vector<std::byte> check;  // a staged copy's bytes, read to check it whole
  // Where serve() puts the bytes of a home copy it fetched through the peer tier: `*fetch_into`
  // when set (a caller that keeps them past the call), else `fetched`.
  std::vector<std::byte> fetched;
  std::vector<std::byte>* fetch_into = nullptr;
};

// The bytes of `loc`, a sample of a file compressed whole (Catalog::file_codec), decompressed from
// the source file at `path` into `out`: the whole stream is read and checked against the catalog's
// size and CRC-32C (a DecodeError naming the file if they differ; an IoError if its size changed or
// it cannot be read), only the sample's bytes kept. For a consumer with no staged copy to read.
void read_compressed_sample(const Catalog& catalog, const Catalog::Locator& loc,
                            const std::string& path, std::vector<std::byte>& out);

// Thread-safe: every method may be called from any thread at once. The catalog and the stage
// directory must outlive it.
class Tiers {
 public:
  // `stage`: null without a usable stage directory. A sample whose bytes where it is stored exceed
  // `max_read_bytes` is refused (DecodeError) by read() and fetch_sample() before anything is
  // allocated for it.
  Tiers(const Catalog& catalog, StageDirectory* stage, uint64_t max_read_bytes);
  ~Tiers();  // waits for a probe under way (the peer tier ends its wait when it stops)
  Tiers(const Tiers&) = delete;
  Tiers& operator=(const Tiers&) = delete;

  // The node's bound on the stage directory's copies (0: none), within which stage 3 copies a
  // compressed file nobody is copying (wait_for_copy); set before the first read. Without it,
  // stage 3 makes no copy of its own for serve().
  void set_stage_bound(uint64_t bound) noexcept {
    stage_bound_ = bound;
    copies_here_ = true;
  }

  // Every read from then on adds a record to `trace` (null: none); set before the first read.
  void set_trace(IoTrace* trace) noexcept { ledger_.set_trace(trace); }
  // Where every read this unit serves is counted (tiers/ledger.hpp).
  const Ledger& ledger() const noexcept { return ledger_; }
  Ledger& ledger() noexcept { return ledger_; }

  const Catalog& catalog() const noexcept { return catalog_; }
  StageDirectory* stage_directory() const noexcept { return stage_; }
  // The peer tier, tried by fetch_sample() before the source (null: none), through a Router
  // (tiers/router.hpp) that chooses between a home copy and the source for every read below the
  // stage directory. Set before any read; it must outlive the reads.
  void set_peers(Peers* peers, bool home_copy_always = false);
  // The router's (null: the peer tier is off).
  void stop_probes() {
    if (router_ != nullptr) router_->stop_probes();
  }
  const SourceModel* source_model() const noexcept { return model(); }
  SourceModel::Links links() const {
    return router_ != nullptr ? router_->links() : SourceModel::Links::kUnknown;
  }
  bool home_first() const { return router_ != nullptr && router_->home_first(); }

  // A sample's size from the catalog (its byte range, or its whole file's recorded size), or
  // Catalog::kUnknownSize.
  uint64_t sample_size(uint64_t id) const;
  // Throws DecodeError naming the sample if `size` (known) exceeds the size limit.
  void check_size(uint64_t id, uint64_t size) const;

  // Stage 3. Calls `use(bytes)` with sample `id`'s bytes (a ByteSource: the sample's byte range,
  // or its whole file for a sample of the whole file or a slice of it) from the first tier from
  // `from` on that has it: `held`
  // (the bytes stage 2 read ahead for it, or null), the stage directory's copy (not one left by an
  // earlier run that stage 2 has not yet checked against its record), its home copy through the
  // peer tier (with the tier on, a `tally` and an `access` that reads: into memory, as
  // fetch_sample() reads it: a peer sends the sample's byte range, a slice's whole file; served by
  // kPeer, or by kStage for a home copy of this node that a neighbour had not yet published), the
  // source. `use` returns the bytes it took; an IoError it throws while the stage directory serves
  // means the copy vanished (the directory was cleaned or lost), and the next tier serves. `access`
  // says what `use` reads, and so how a staged copy is checked before it is trusted (never a wrong
  // byte): kBytes of a whole copy by its CRC-32C (use calls bytes.all()), kFile and kBytes of part
  // of a copy by StageDirectory::unchanged(); a copy that fails is removed and counted, and the
  // source serves. With a `tally`, the read is counted in the tier that served, there and in
  // served() (a first look at a sample's size or header passes null, and its read the batch's
  // tally), and the I/O trace records it: one record per counted read. A `use` that reads a file in
  // part and returns 0 (a header looked at, whose data a later use reads and counts) is not
  // counted. Returns that tier. Other errors propagate.
  template <typename Use>
  Tier serve(uint64_t id, Tier from, std::optional<std::span<const std::byte>> held,
             TierScratch& scratch, TierTally* tally, Access access, const Use& use);

  // Stage 3: sample `id`'s bytes, from `held` or read (or fetched from a peer) into `buffer`
  // (resized to fit; the bytes stay valid while it is not changed), counted
  // as serve() says (null: a look at the set, not a read of an epoch's sample). Refuses a sample
  // over the size limit. The sample's source path is left in scratch.source.
  std::span<const std::byte> read(uint64_t id, std::optional<std::span<const std::byte>> held,
                                  std::vector<std::byte>& buffer, TierScratch& scratch,
                                  TierTally* tally);
  // A sample that read() took whole from the source (a miss: stage 2 had not copied its file) is
  // published as its file's copy, from the bytes read, so that stage 2 never reads the file from
  // the source again: its copy's record (size, CRC-32C, the catalog's modification time) is the
  // one stage 2's copy would have, and it is written and published by StageDirectory::stage() as
  // any copy is. Within the node's bound (set_stage_bound), reserved first, as stage 2's are; no
  // room, nothing is written. A claim of stage 1's whose copy has not begun is completed on its
  // reservation (stage 2's turn finds it done); a copy under way is left to its copier. Only for
  // a file of one sample whose size and modification time the catalog records, uncompressed, with
  // a stage directory that can be written and the peer tier off. Counted in misses_staged().
  uint64_t misses_staged() const noexcept { return misses_staged_.load(std::memory_order_relaxed); }

  // decode=locate: the tier that would serve sample `id` now, without reading it: the stage
  // directory for a copy it may serve (as serve() decides), else the source. Counted as serve()
  // counts a read of the sample's size (0 when unknown).
  Tier locate(uint64_t id, TierTally* tally);

  // Stage 2, for its copies: the whole of catalog file `file`, from the tiers below the stage
  // directory, into `buffer` (resized to fit); `mtime_ns` gets the source's modification time.
  // A compressed file is decompressed as it is read from the source (its decompressed bytes are
  // checked against the catalog's size and CRC: a DecodeError naming the file if they differ, an
  // IoError if the file's size changed); a home copy on another node holds them already.
  // With the peer tier on, a file the catalog records the size of comes from its home copy on
  // another node (checked against the size and the owner's CRC-32C) or from the source, whichever
  // the source model expects to finish first, as fetch_sample() chooses (the copy is then recorded
  // with the catalog's modification time, kUnknownMtime if none). Counted, by the tier that
  // served, in fetched() and in `tally`, if given (also a read whose bytes are then not staged).
  void fetch_file(uint64_t file, std::vector<std::byte>& buffer, int64_t& mtime_ns,
                  TierTally* tally = nullptr);
  // The same for a copy written as it is read (StageDirectory::Stream): the bytes go to `write`;
  // a compressed file read from the source in pieces of Decompressor::kChunk (`buffer` holds one),
  // its size and CRC checked once the last is written (a DecodeError then: the copy is given up),
  // any other file whole, as fetch_file() reads it into `buffer`.
  void copy_file(uint64_t file, const StageDirectory::Sink& write, std::vector<std::byte>& buffer,
                 int64_t& mtime_ns, TierTally* tally = nullptr);
  // A file compressed whole (Catalog::file_codec) is never read by byte range: its samples are
  // served from its decompressed copy in the stage directory, or, when there is none, by
  // serve() from its whole stream decompressed (read_compressed). For a sample of one that the
  // stage directory cannot serve, locate() calls this (its consumer reads the copy). True once the
  // file's copy is staged and may be served: a copy stage 2 (or a neighbour) is making is waited
  // for, a copy nobody is making is made here, on a reservation within the node's bound as stage
  // 2's copies are (set_stage_bound). False when none can be made (no room within the bound, a
  // stage directory that is read-only or failed): the consumer then decompresses the sample from
  // the source (read_compressed_sample()). Throws what the copy met, naming the shard: the
  // source's DecodeError (a corrupt stream, bytes that differ from the catalog's) or IoError (it
  // changed, it cannot be read), ECANCELED when this thread's io_cancel() is set; ConfigError
  // without a stage directory.
  bool stage_compressed(uint64_t file, std::vector<std::byte>& buffer);

  // Stage 3, for a sample of a compressed file that the stage directory does not hold: true once
  // its copy may be served, false if none is coming (the caller reads the source). A copy under
  // way is waited for; a claim whose copy has not begun (stage 1's, for a later batch) is copied
  // here, on its reservation (stage 2's turn then finds it done): never a wait on stage 2 for work
  // that waits on stage 3; an absent file is claimed and copied here if its bytes fit the bound
  // (set_stage_bound: `claim_absent`), as a miss of an uncompressed file is a read of its range.
  // Throws what such a copy meets from the source, as stage_compressed(); a stage directory that
  // fails is left alone from then on (false). IoError (ECANCELED) when this thread's io_cancel()
  // is set.
  bool wait_for_copy(uint64_t file, std::vector<std::byte>& buffer, bool claim_absent = false);
  // Copies claimed (or in flight) file `file` to the stage directory now; whether it is staged.
  // An IoError of the stage directory's is thrown as StageFailed.
  bool copy_now(uint64_t file, std::vector<std::byte>& buffer);
  struct StageFailed {
    IoError error;
  };
  // The bytes of `loc`, a sample of a compressed file, decompressed from the source into `out`:
  // the whole stream is read (its size and CRC checked against the catalog's: never a wrong
  // byte), only the sample's bytes kept. Errors as fetch_file's.
  void read_compressed(const Catalog::Locator& loc, std::vector<std::byte>& out);

  // Stage 2, for its read-ahead: sample `id`'s bytes from the tiers below the stage directory (a
  // peer's home copy, then the source) into `out`, which must be exactly the size the catalog
  // records for it (a sample of unknown size is never read ahead: std::logic_error); a home copy
  // the peer tier sends lands in `fetched` first (the caller's, reused). A sample of a compressed
  // file is not read from the source (an IoError: stage 3 reads it from the file's copy).
  void fetch_sample(uint64_t id, std::span<std::byte> out, std::vector<std::byte>& fetched,
                    TierTally* tally = nullptr);

  TierCounts served() const { return ledger_.served(); }    // stage 3's reads, by tier
  TierCounts fetched() const { return ledger_.fetched(); }  // stage 2's reads, by tier

  // The source path of catalog file `file`, built in `out` (valid until its next use).
  const std::string& source_path(uint64_t file, std::string& out) const;

 private:
  // A stalled source: stage 2's read of a file that ran past io_timeout marks it, and the next
  // read of it from the source (stage 3's, of the same batch) fails at once with the same error
  // instead of waiting out the limit a second time.
  template <typename Read>
  void stalled_if_timed_out(uint64_t file, const Read& read) {
    try {
      read();
    } catch (const IoError& e) {
      if (e.error_code() == ETIMEDOUT) stalled_[file].store(1, std::memory_order_relaxed);
      throw;
    }
  }
  void refuse_if_stalled(uint64_t file, const std::string& path);
  // read()'s publication of a miss (see misses_staged()): `bytes`, the whole of file `file`.
  void stage_miss(uint64_t file, std::span<const std::byte> bytes, std::vector<std::byte>& buffer);
  void fetch(uint64_t file, std::vector<std::byte>& buffer, int64_t& mtime_ns, TierTally* tally,
             const StageDirectory::Sink* write);
  // The one place a read is counted: one event in the ledger (tiers/ledger.hpp), whose consumers
  // are the run's figures for its purpose (served() or fetched()), the batch's `tally` (null:
  // none), and the I/O trace. `sample`: IoTrace::kNoSample for a whole file; `start_ns`: the
  // trace's clock when the read began.
  void count(Purpose purpose, Tier tier, uint64_t sample, uint64_t file, uint64_t offset,
             uint64_t bytes, int64_t start_ns, TierTally* tally) noexcept {
    ledger_.record({tier, purpose, sample, file, offset, bytes, start_ns, tally});
  }
  // The router's fetch_home() (tiers/router.hpp) as the tier that served: kPeer, kStage (this
  // node's home copy, published late) or kSource (none fetched; with the peer tier off, always).
  Tier fetch_home(const Catalog::Locator& loc, uint64_t sample_bytes,
                  std::vector<std::byte>& buffer, bool& pfs_chosen,
                  Router::Home where = Router::Home::kAny);
  SourceModel* model() const noexcept { return router_ != nullptr ? router_->model() : nullptr; }

  const Catalog& catalog_;
  StageDirectory* stage_;
  std::unique_ptr<Router> router_;  // with the peer tier
  uint64_t max_read_bytes_;
  Ledger ledger_;
  uint64_t stage_bound_ = 0;
  bool copies_here_ = false;
  std::atomic<bool> stage_failed_{false};  // a copy of stage 3's met a stage directory error
  std::atomic<uint64_t> misses_staged_{0};
  std::unique_ptr<std::atomic<uint8_t>[]> stalled_;  // per file: see stalled_if_timed_out()
};

template <typename Use>
Tier Tiers::serve(uint64_t id, Tier from, std::optional<std::span<const std::byte>> held,
                  TierScratch& scratch, TierTally* tally, Access access, const Use& use) {
  const Catalog::Locator loc = catalog_.locator(id);
  const std::string& path = source_path(loc.file, scratch.source);
  const uint64_t size = sample_size(id);
  const auto run = [&](Tier tier, const ByteSource& bytes) {
    const int64_t start = tally != nullptr ? ledger_.now_ns() : 0;
    const uint64_t n = use(bytes);
    if (tally != nullptr && (n != 0 || bytes.file() == nullptr || access != Access::kFile)) {
      count(Purpose::kDecode, tier, id, loc.file, loc.offset, n, start, tally);
    }
    return tier;
  };
  if (from == Tier::kMemory && held) return run(Tier::kMemory, MemorySource(*held, path));
  // A copy left by an earlier run is served only once stage 2 has checked it against its record.
  const auto from_stage = [&]() -> std::optional<Tier> {
    if (stage_ == nullptr || !stage_->servable(loc.file)) return std::nullopt;
    const bool whole = access == Access::kBytes && loc.length == Catalog::kWholeFile;
    if (whole || access == Access::kLook || stage_->unchanged(loc.file, scratch.check)) {
      scratch.staged = stage_->staged_path(loc.file);
      const FileSource copy = FileSource::sample(FileRef(scratch.staged), loc, size, path);
      try {
        if (!whole) return run(Tier::kStage, copy);
        const CheckedCopy checked(copy, *stage_, loc.file);
        const Tier tier = run(Tier::kStage, checked);
        if (!checked.checked()) throw std::logic_error("tiers: a staged copy was read unchecked");
        return tier;
      } catch (const IoError&) {
        // The copy vanished: the source has the same bytes.
      } catch (const CorruptCopy&) {
        // Removed and counted by CheckedCopy: the source has the right bytes.
      }
    }
    return std::nullopt;
  };
  if (from <= Tier::kStage) {
    if (const auto tier = from_stage()) return *tier;
  }
  // A home copy through the peer tier, for a counted read of an epoch's sample (a look at the set
  // reads where the bytes are now: it would wait on a home copy its owner makes only when its plan
  // reaches it), that reads its bytes (they go to memory: a look at a size needs none of them), of
  // a known size within the size limit (a slice's is its file's: a larger file is read in part
  // from the source, as before).
  if (from <= Tier::kPeer && router_ != nullptr && tally != nullptr && access != Access::kLook &&
      size != Catalog::kUnknownSize && size <= max_read_bytes_) {
    std::vector<std::byte>& buffer =
        scratch.fetch_into != nullptr ? *scratch.fetch_into : scratch.fetched;
    bool pfs_chosen = false;
    const Tier tier = fetch_home(loc, size, buffer, pfs_chosen);
    // Stage 3's reads of the source are not timed: the model's choice of it is not learned from.
    if (pfs_chosen) router_->pfs_unqueued(size);
    if (tier != Tier::kSource) return run(tier, MemorySource(buffer, path));
  }
  if (catalog_.file_codec(loc.file) != Catalog::Codec::kNone) {
    // Never a byte range of the compressed source: a copy under way is waited for; without one
    // (stage 1 declined it for want of room, or its copy failed), the sample's bytes are
    // decompressed from the source into memory, the whole stream checked.
    while (wait_for_copy(loc.file, scratch.check, copies_here_)) {
      if (const auto tier = from_stage()) return *tier;
    }
    std::vector<std::byte>& buffer =
        scratch.fetch_into != nullptr ? *scratch.fetch_into : scratch.fetched;
    if (access != Access::kLook) refuse_if_stalled(loc.file, path);
    read_compressed(loc, buffer);
    return run(Tier::kSource, MemorySource(buffer, path));
  }
  if (access != Access::kLook) refuse_if_stalled(loc.file, path);
  return run(Tier::kSource, FileSource::sample(source_file(catalog_, path), loc, size, path));
}

}  // namespace prestage::detail
