// Where a sample's bytes come from: one chain of tiers (tiers/tier.hpp), tried in the order one
// table gives for each purpose, by one loop (Tiers::open) that counts each read it serves, once, in
// its ledger (tiers/ledger.hpp: the per-tier figures and the I/O trace). The table (tiers.cpp):
//  - stage 3's decode (serve(), read()): memory (the bytes stage 2 read ahead for its batch), the
//    stage directory (a copy it may serve), the peers (the sample's home copy, for every format: a
//    sample stage 2 did not read ahead, an array's header, a slice's file), the stage directory
//    again for a compressed file (its copy, awaited or made now), the source (the PFS);
//  - decode=locate's look (locate()): the stage directory, the source;
//  - stage 2's read-ahead (fetch_sample()): the peers, the source, whichever the router
//    (tiers/router.hpp) expects to finish the read first;
//  - stage 2's copies (fetch_file(), copy_file()): another node's home copy through the peers, or
//    the source, chosen as for the read-ahead.
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
#include "tiers/memory_tier.hpp"
#include "tiers/peer_tier.hpp"
#include "tiers/router.hpp"
#include "tiers/source_model.hpp"
#include "tiers/source_tier.hpp"
#include "tiers/stage_directory.hpp"
#include "tiers/stage_tier.hpp"
#include "tiers/tier.hpp"
#include "util/byte_source.hpp"
#include "util/file_io.hpp"
#include "util/io_trace.hpp"

namespace prestage::detail {

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
  // compressed file nobody is copying (StageTier::wait_for_copy); set before the first read.
  // Without it, stage 3 makes no copy of its own for serve().
  void set_stage_bound(uint64_t bound) noexcept { stage_tier_.set_bound(bound); }

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
  // A home copy fetched through the peer tier, or a compressed sample's bytes decompressed from
  // the source, land in `*keep` (a caller that keeps them past the call: the ByteSource `use` saw
  // stays valid while it is not changed), else in scratch.fetched.
  Tier serve(uint64_t id, Tier from, std::optional<std::span<const std::byte>> held,
             TierScratch& scratch, TierTally* tally, Access access, Use use,
             std::vector<std::byte>* keep = nullptr);

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
  uint64_t misses_staged() const noexcept { return stage_tier_.misses_staged(); }

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
  const std::string& source_path(uint64_t file, std::string& out) const {
    return detail::source_path(catalog_, file, out);
  }

  // The one way to a sample's or a file's bytes, which every read method above is: `want` read
  // through the tiers of its purpose's chain (tiers.cpp's table) from tier `from` on, the first
  // that serves it delivering its bytes as `to` says; the read counted once, in the ledger, with
  // `tally` (the batch's figures; null: none). Returns the tier that served. The source serves
  // every read no nearer tier did, or throws.
  Tier open(const Want& want, Delivery& to, TierTally* tally, Tier from = Tier::kMemory);

 private:
  void fetch(uint64_t file, std::vector<std::byte>& buffer, int64_t& mtime_ns, TierTally* tally,
             const StageDirectory::Sink* write);
  SourceModel* model() const noexcept { return router_ != nullptr ? router_->model() : nullptr; }

  const Catalog& catalog_;
  StageDirectory* stage_;
  std::unique_ptr<Router> router_;  // with the peer tier
  uint64_t max_read_bytes_;
  Ledger ledger_;
  // The tiers, nearest first (tiers/tier.hpp), and the chain of each purpose (tiers.cpp).
  MemoryTier memory_tier_;
  StageTier stage_tier_;
  PeerTier peer_tier_;
  AwaitedCopyTier awaited_copy_tier_;
  SourceTier source_tier_;
};

}  // namespace prestage::detail
