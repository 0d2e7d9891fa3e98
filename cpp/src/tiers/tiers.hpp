// Where a sample's bytes come from: one chain of tiers (tiers/tier.hpp), tried in the order one
// table gives for each purpose, by one loop (Tiers::open) that counts each read it serves, once, in
// its ledger (tiers/ledger.hpp: the per-tier figures and the I/O trace). Each purpose has its
// request type (tiers/tier.hpp), and open() is the one read method. The table (tiers.cpp):
//  - stage 3's decode (DecodeRead, SampleBytes): memory (the bytes stage 2 read ahead for its
//    batch), the stage directory (a copy it may serve), the peers (the sample's home copy, for
//    every format: a sample stage 2 did not read ahead, an array's header, a slice's file), the
//    stage directory again for a compressed file (its copy, awaited or made now), the source (the
//    PFS);
//  - decode=locate's look (Look): the stage directory, the source;
//  - stage 2's read-ahead (Prefetch): the peers, the source, whichever the router
//    (tiers/router.hpp) expects to finish the read first;
//  - stage 2's copies (FileCopy): another node's home copy through the peers, or the source, chosen
//    as for the read-ahead.
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
#include <variant>
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
  // `max_read_bytes` is refused (DecodeError) by a SampleBytes or Prefetch read before anything is
  // allocated for it.
  Tiers(const Catalog& catalog, StageDirectory* stage, uint64_t max_read_bytes);
  ~Tiers();  // waits for a probe under way (the peer tier ends its wait when it stops)
  Tiers(const Tiers&) = delete;
  Tiers& operator=(const Tiers&) = delete;

  // The node's bound on the stage directory's copies (0: none), within which stage 3 copies a
  // compressed file nobody is copying (StageTier::wait_for_copy); set before the first read.
  // Without it, stage 3 makes no copy of its own for a DecodeRead.
  void set_stage_bound(uint64_t bound) noexcept { stage_tier_.set_bound(bound); }

  // Every read from then on adds a record to `trace` (null: none); set before the first read.
  void set_trace(IoTrace* trace) noexcept { ledger_.set_trace(trace); }
  // Where every read this unit serves is counted (tiers/ledger.hpp).
  const Ledger& ledger() const noexcept { return ledger_; }
  Ledger& ledger() noexcept { return ledger_; }

  const Catalog& catalog() const noexcept { return catalog_; }
  StageDirectory* stage_directory() const noexcept { return stage_; }
  // The peer tier, tried by a Prefetch before the source (null: none), through a Router
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

  // A read through the chain: one request of its purpose (tiers/tier.hpp), each holding what is
  // read and where its bytes go.
  using Request = std::variant<DecodeRead, SampleBytes, Look, Prefetch, FileCopy>;
  // What a read returns: the tier that served it, and a SampleBytes read's bytes (empty for the
  // others), valid while its buffer (or its held bytes) is not changed.
  struct Opened {
    Tier tier;
    std::span<const std::byte> bytes;
  };

  // The one way to a sample's or a file's bytes: `request` read through the tiers of its
  // purpose's chain (tiers.cpp's table), the first that serves it delivering its bytes as the
  // request says; the read counted once, in the ledger, with `tally` (the batch's figures). The
  // source serves every read no nearer tier did, or throws. By request:
  //  - DecodeRead (stage 3): the first tier from `from` on that has the sample's bytes: `held`, the
  //    stage directory's copy (not one left by an earlier run that stage 2 has not yet checked
  //    against its record), its home copy through the peer tier (with the tier on, a `tally` and
  //    an `access` that reads: into memory, as a Prefetch reads it: a peer sends the sample's byte
  //    range, a slice's whole file; served by kPeer, or by kStage for a home copy of this node that
  //    a neighbour had not yet published), the source. `use` returns the bytes it took; an IoError
  //    it throws while the stage directory serves means the copy vanished (the directory was
  //    cleaned or lost), and the next tier serves. `access` says what `use` reads, and so how a
  //    staged copy is checked before it is trusted (never a wrong byte): kBytes of a whole copy by
  //    its CRC-32C (use calls bytes.all()), kFile and kBytes of part of a copy by
  //    StageDirectory::unchanged(); a copy that fails is removed and counted, and the source
  //    serves. With a `tally`, the read is counted in the tier that served, there and in served()
  //    (a first look at a sample's size or header passes null, and its read the batch's tally),
  //    and the I/O trace records it: one record per counted read. A `use` that reads a file in
  //    part and returns 0 (a header looked at, whose data a later use reads and counts) is not
  //    counted. Other errors propagate.
  //  - SampleBytes (stage 3): as a DecodeRead of Access::kBytes, counted so (null: a look at the
  //    set, not a read of an epoch's sample). A sample that it took whole from the source (a miss:
  //    stage 2 had not copied its file) is published as its file's copy, from the bytes read, so
  //    that stage 2 never reads the file from the source again: its copy's record (size, CRC-32C,
  //    the catalog's modification time) is the one stage 2's copy would have, and it is written and
  //    published by StageDirectory::stage() as any copy is. Within the node's bound
  //    (set_stage_bound), reserved first, as stage 2's are; no room, nothing is written. A claim of
  //    stage 1's whose copy has not begun is completed on its reservation (stage 2's turn finds it
  //    done); a copy under way is left to its copier. Only for a file of one sample whose size and
  //    modification time the catalog records, uncompressed, with a stage directory that can be
  //    written and the peer tier off. Counted in misses_staged().
  //  - Look (decode=locate): counted in served(), not traced.
  //  - Prefetch (stage 2's read-ahead): the router chooses between a home copy and the source;
  //    counted in fetched().
  //  - FileCopy (stage 2's copies): counted, by the tier that served, in fetched() and in `tally`,
  //    if given (also a read whose bytes then fail to be written or staged).
  Opened open(const Request& request, TierTally* tally);

  // The SampleBytes misses published as their files' copies (see open()).
  uint64_t misses_staged() const noexcept { return stage_tier_.misses_staged(); }

  TierCounts served() const { return ledger_.served(); }    // stage 3's reads, by tier
  TierCounts fetched() const { return ledger_.fetched(); }  // stage 2's reads, by tier

  // The source path of catalog file `file`, built in `out` (valid until its next use).
  const std::string& source_path(uint64_t file, std::string& out) const {
    return detail::source_path(catalog_, file, out);
  }

 private:
  // Each request's part of open(): its Want, what it checks before the chain and does after it.
  Opened handle(const DecodeRead& read, TierTally* tally);
  Opened handle(const SampleBytes& read, TierTally* tally);
  Opened handle(const Look& look, TierTally* tally);
  Opened handle(const Prefetch& read, TierTally* tally);
  Opened handle(const FileCopy& copy, TierTally* tally);
  // The one loop: `want` offered to the tiers of its purpose's chain from `from` on, the read
  // counted once by the tier that served it.
  template <typename R>
  Tier chain_read(Want& want, const R& request, TierTally* tally, Tier from);
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
