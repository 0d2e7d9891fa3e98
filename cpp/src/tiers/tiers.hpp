// Where a sample's bytes come from, through one interface that keeps the per-tier counters (and
// records each read in the I/O trace). Each caller tries its tiers nearest first:
//  - stage 3 (serve(), read(), locate()): the bytes stage 2 read ahead into memory for its
//    batch, the node's stage directory (a copy left by an earlier run only once stage 2 has
//    checked it), the sample's home copy through the peer tier as fetch_sample() reads it (for
//    every format: a sample stage 2 did not read ahead, an array's header, a slice's file), the
//    source (the PFS);
//  - stage 2's read-ahead (fetch_sample()): the sample's home copy through the peer tier
//    (tiers/peers.hpp: from the owner node over MPI, or from this node's stage directory), or the
//    source: whichever the source model (tiers/source_model.hpp) expects to finish the read first;
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
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "prestage/catalog.hpp"
#include "prestage/error.hpp"
#include "tiers/source_model.hpp"
#include "tiers/stage_directory.hpp"
#include "util/file_io.hpp"
#include "util/io_trace.hpp"

namespace prestage::detail {

class Peers;

// In the order they are tried.
enum class Tier : uint8_t { kMemory = 0, kStage = 1, kPeer = 2, kSource = 3 };
inline constexpr size_t kTierCount = 4;
// By number, as the trace records them and Python names them (prestage.trace.TIERS).
inline constexpr std::array<const char*, kTierCount> kTierNames{"memory", "stage", "peer",
                                                                "source"};

// A sample as the tier that serves it holds it: bytes in memory, or a file to read it from.
struct SampleAt {
  Tier tier = Tier::kSource;
  std::span<const std::byte> bytes;  // kMemory: the whole sample
  const std::string* file = nullptr;  // the file tiers: the copy to read (staged or source)
  const std::string* path = nullptr;  // the sample's source path: what errors name
  const std::string* root = nullptr;  // set: `file` is a source file confined to this root
  Catalog::Locator locator;           // where the sample lies in `file`

  bool in_memory() const noexcept { return file == nullptr; }
  // `file` as it must be opened (the catalog's symlink policy applies to source files only).
  FileRef open() const { return root != nullptr ? FileRef(*file, *root) : FileRef(*file); }

  // A use that reads the sample's bytes (Access::kBytes) passes them here once read: a staged
  // copy read whole is checked against its record; a copy that fails is removed and the read
  // goes to the next tier (StageDirectory::intact()).
  void check(std::span<const std::byte> read) const;

  StageDirectory* stage = nullptr;  // set: `file` is a whole staged copy, to check()
  uint64_t file_id = 0;
  mutable bool checked = false;
};

// What a use of a sample (Tiers::serve) does with it, which says how a staged copy is checked.
enum class Access : uint8_t {
  kLook,   // reads nothing of its bytes (a size from the catalog or the file's length)
  kBytes,  // reads them whole, and passes them to SampleAt::check()
  kFile,   // reads parts of the file itself (a codec's header and data)
};

// Thrown by SampleAt::check() for a copy that failed: serve() reads the next tier.
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

struct TierCounts {
  std::array<uint64_t, kTierCount> reads{};
  std::array<uint64_t, kTierCount> bytes{};
};

// Reads and their bytes by the tier that served them, added to from any thread at once: the whole
// run's (the tiers' own) or one batch's (for the figures of its epoch).
class TierTally {
 public:
  void add(Tier tier, uint64_t bytes) noexcept {
    reads_[static_cast<size_t>(tier)].fetch_add(1, std::memory_order_relaxed);
    bytes_[static_cast<size_t>(tier)].fetch_add(bytes, std::memory_order_relaxed);
  }
  TierCounts counts() const noexcept;
  void clear() noexcept;

 private:
  std::array<std::atomic<uint64_t>, kTierCount> reads_{}, bytes_{};
};

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

  // Every read from then on adds a record to `trace` (null: none); set before the first read.
  void set_trace(IoTrace* trace) noexcept { trace_ = trace; }

  const Catalog& catalog() const noexcept { return catalog_; }
  StageDirectory* stage_directory() const noexcept { return stage_; }
  // The peer tier, tried by fetch_sample() before the source (null: none). Set before any read;
  // it must outlive the reads. With the tier on, the reads of stage 2 are timed and learned from,
  // and each read of a sample with a home copy goes to that copy or to the source, whichever the
  // model expects to finish first (source_model()). The model's probes of a source are made off
  // the reads' path, one at a time, on a thread the first one starts: a read never waits on one.
  // With `home_copy_always` (LoaderOptions::pfs_reads kFewest), every such read goes to the home
  // copy: no model, no probe (source_model() null), the source read only where no copy is.
  void set_peers(Peers* peers, bool home_copy_always = false);
  // Waits for the source model's probe under way, if any, and starts none from then on: its
  // figures are whole. Called once the peer tier has stopped (which ends its wait on a peer).
  void stop_probes();
  // The estimates per source and the reads each served (null: the peer tier is off).
  const SourceModel* source_model() const noexcept { return model_.get(); }
  // How the other nodes' links compare with the PFS for a read of the set's mean sample, as the
  // model sees them now (SourceModel::links_against_pfs); kUnknown with the peer tier off. While it
  // is kSlower the peer tier's transport is quiet (Peers::set_quiet): the other nodes, whose links
  // are alike, read the source and only probe this one. The view is looked at where it can turn:
  // after each probe of a link is learned from, and while quiet after each read of a link.
  SourceModel::Links links() const;

  // A sample's size from the catalog (its byte range, or its whole file's recorded size), or
  // Catalog::kUnknownSize.
  uint64_t sample_size(uint64_t id) const;
  // Throws DecodeError naming the sample if `size` (known) exceeds the size limit.
  void check_size(uint64_t id, uint64_t size) const;

  // Stage 3. Calls `use(at)` with sample `id` as the first tier from `from` on that has it: `held`
  // (the bytes stage 2 read ahead for it, or null), the stage directory's copy (not one left by an
  // earlier run that stage 2 has not yet checked against its record), its home copy through the
  // peer tier (with the tier on, a `tally` and an `access` that reads: into memory, as fetch_sample() reads
  // it: a peer sends the sample's byte range, a slice's whole file; `at.tier` is kPeer, or
  // kStage for a home copy of this node that a neighbour had not yet published), the source.
  // `use` returns the bytes it took; an IoError it throws while the stage directory serves means the
  // copy vanished (the directory was cleaned or lost), and the next tier serves. `access` says what
  // `use` reads, and so how a staged copy is checked before it is trusted (never a wrong byte):
  // kBytes of a whole copy by its CRC-32C (use calls at.check()), kFile and kBytes of part of a copy
  // by StageDirectory::unchanged(); a copy that fails is removed and counted, and the source serves.
  // With a `tally`, the read is counted in the tier that served, there and in served() (a first
  // look at a sample's size or header passes null, and its read the batch's tally), and the I/O
  // trace records it: one record per counted read. A `use` that reads a file in part and returns 0
  // (a header looked at, whose data a later use reads and counts) is not counted. Returns that
  // tier. Other errors propagate.
  template <typename Use>
  Tier serve(uint64_t id, Tier from, std::optional<std::span<const std::byte>> held,
             TierScratch& scratch,
             TierTally* tally, Access access, const Use& use);

  // Stage 3: sample `id`'s bytes, from `held` or read (or fetched from a peer) into `buffer`
  // (resized to fit; the bytes stay valid while it is not changed), counted
  // as serve() says (null: a look at the set, not a read of an epoch's sample). Refuses a sample
  // over the size limit. The sample's source path is left in scratch.source.
  std::span<const std::byte> read(uint64_t id, std::optional<std::span<const std::byte>> held,
                                  std::vector<std::byte>& buffer, TierScratch& scratch,
                                  TierTally* tally);

  // decode=locate: the tier that would serve sample `id` now, without reading it: the stage
  // directory for a copy it may serve (as serve() decides), else the source. Counted as serve()
  // counts a read of the sample's size (0 when unknown).
  Tier locate(uint64_t id, TierTally* tally);

  // Stage 2, for its copies: the whole of catalog file `file`, from the tiers below the stage
  // directory, into `buffer` (resized to fit); `mtime_ns` gets the source's modification time.
  // With the peer tier on, a file the catalog records the size of comes from its home copy on
  // another node (checked against the size and the owner's CRC-32C) or from the source, whichever
  // the source model expects to finish first, as fetch_sample() chooses (the copy is then recorded
  // with the catalog's modification time, kUnknownMtime if none). Counted, by the tier that
  // served, in fetched() and in `tally`, if given (also a read whose bytes are then not staged).
  void fetch_file(uint64_t file, std::vector<std::byte>& buffer, int64_t& mtime_ns,
                  TierTally* tally = nullptr);
  // Stage 2, for its read-ahead: sample `id`'s bytes from the tiers below the stage directory (a
  // peer's home copy, then the source) into `out`, which must be exactly the size the catalog
  // records for it (a sample of unknown size is never read ahead: std::logic_error); a home copy
  // the peer tier sends lands in `fetched` first (the caller's, reused).
  void fetch_sample(uint64_t id, std::span<std::byte> out, std::vector<std::byte>& fetched,
                    TierTally* tally = nullptr);

  TierCounts served() const { return served_.counts(); }    // stage 3's reads, by tier
  TierCounts fetched() const { return fetched_.counts(); }  // stage 2's reads, by tier

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
  // Sample `loc`'s bytes (`sample_bytes` of them, 0: unknown) from its home copy through the peer
  // tier into `buffer`, or from wherever the source model expects the read to finish first:
  // kPeer, kStage (this node's home copy, published late), or kSource (none fetched: the caller
  // reads the source; `pfs_chosen` says the model chose it over a home copy and queued the read).
  // kOtherNode: only a home copy on another node is asked for (stage 2's copies: this node's own
  // home copy is the one being made), and nothing is counted for a file without one.
  enum class Home : uint8_t { kAny, kOtherNode };
  Tier fetch_home(const Catalog::Locator& loc, uint64_t sample_bytes, std::vector<std::byte>& buffer,
                  bool& pfs_chosen, Home where = Home::kAny);
  // The model's queued read of the source (fetch_home's pfs_chosen) ended unlearned from.
  void pfs_unqueued(uint64_t bytes);
  // While the model knows no link, probes one with a sample another node stages first
  // (Peers::early_probe), a few times at most: so that the node's stage directory knows its layout
  // (StageCache::set_home_first) before the first reads of other nodes' copies are planned.
  void probe_links_early();
  // Sets the transport quiet where links() is kSlower, and not quiet elsewhere, if that changed.
  void update_quiet();
  class Prober;

  const Catalog& catalog_;
  StageDirectory* stage_;
  Peers* peers_ = nullptr;
  std::unique_ptr<SourceModel> model_;  // with peers_ on
  std::mutex quiet_mutex_;              // a look at links() and the quiet it sets, one at a time
  std::atomic<bool> quiet_{false};      // as last set (written under quiet_mutex_)
  std::unique_ptr<Prober> prober_;      // with model_; declared after it: stopped first
  uint64_t max_read_bytes_;
  uint64_t mean_sample_bytes_ = 0;    // of the samples whose size the catalog records (set_peers)
  std::atomic<int> early_probes_{0};  // left to probe_links_early() (set_peers)
  TierTally served_, fetched_;
  IoTrace* trace_ = nullptr;
  std::unique_ptr<std::atomic<uint8_t>[]> stalled_;  // per file: see stalled_if_timed_out()
};

template <typename Use>
Tier Tiers::serve(uint64_t id, Tier from, std::optional<std::span<const std::byte>> held,
                  TierScratch& scratch,
                  TierTally* tally, Access access, const Use& use) {
  const Catalog::Locator loc = catalog_.locator(id);
  SampleAt at;
  at.locator = loc;
  at.path = &source_path(loc.file, scratch.source);
  const auto run = [&](Tier tier) {
    const bool counted = tally != nullptr;
    const bool in_memory = at.in_memory();
    const int64_t start = counted && trace_ != nullptr ? trace_->now_ns() : 0;
    const uint64_t n = use(at);
    if (counted && (n != 0 || in_memory || access != Access::kFile)) {
      if (trace_ != nullptr) {
        trace_->add(id, loc.file, loc.offset, n, start, static_cast<uint8_t>(tier), TraceKind::kRead);
      }
      served_.add(tier, n);
      tally->add(tier, n);
    }
    return tier;
  };
  if (from == Tier::kMemory && held) {
    at.tier = Tier::kMemory;
    at.bytes = *held;
    return run(Tier::kMemory);
  }
  // A copy left by an earlier run is served only once stage 2 has checked it against its record.
  if (from <= Tier::kStage && stage_ != nullptr && stage_->is_staged(loc.file) &&
      !stage_->unverified(loc.file)) {
    const bool whole = access == Access::kBytes && loc.length == Catalog::kWholeFile;
    if (whole || access == Access::kLook || stage_->unchanged(loc.file, scratch.check)) {
      scratch.staged = stage_->staged_path(loc.file);
      at.tier = Tier::kStage;
      at.file = &scratch.staged;
      if (whole) {
        at.stage = stage_;
        at.file_id = loc.file;
      }
      try {
        const Tier tier = run(Tier::kStage);
        if (whole && !at.checked) throw std::logic_error("tiers: a staged copy was read unchecked");
        return tier;
      } catch (const IoError&) {
        // The copy vanished: the source has the same bytes.
      } catch (const CorruptCopy&) {
        // Removed and counted by check(): the source has the right bytes.
      }
      at = SampleAt{};
      at.locator = loc;
      at.path = &scratch.source;
    }
  }
  // A home copy through the peer tier, for a counted read of an epoch's sample (a look at the set
  // reads where the bytes are now: it would wait on a home copy its owner makes only when its plan
  // reaches it), that reads its bytes (they go to memory: a look at a size needs none of them), of
  // a known size within the size limit (a slice's is its file's: a larger file is read in part
  // from the source, as before).
  const uint64_t size = sample_size(id);
  if (from <= Tier::kPeer && peers_ != nullptr && tally != nullptr && access != Access::kLook &&
      size != Catalog::kUnknownSize && size <= max_read_bytes_) {
    std::vector<std::byte>& buffer =
        scratch.fetch_into != nullptr ? *scratch.fetch_into : scratch.fetched;
    bool pfs_chosen = false;
    const Tier tier = fetch_home(loc, size, buffer, pfs_chosen);
    // Stage 3's reads of the source are not timed: the model's choice of it is not learned from.
    if (pfs_chosen) pfs_unqueued(size);
    if (tier != Tier::kSource) {
      at.tier = tier;
      at.bytes = buffer;
      return run(tier);
    }
  }
  at.tier = Tier::kSource;
  at.file = at.path;
  if (catalog_.symlinks() == Catalog::Symlinks::kInside) at.root = &catalog_.root().native();
  if (access != Access::kLook) refuse_if_stalled(loc.file, *at.path);
  return run(Tier::kSource);
}

}  // namespace prestage::detail
