// The peer tier: a sample not on this node is fetched from the stage directory of the node that
// owns it, over MPI (tiers/transport.hpp), instead of being read again from the source (the PFS).
//
// Ownership is computed, never negotiated, since every rank knows every rank's plan:
//  - the owner of a file is the rank that first uses (a sample of) it in the job's start epoch e0:
//    lowest batch index, then lowest rank, then position in the rank's batch (padding duplicates
//    keep the first). Its node is the owner node.
//  - each node's stage directory is run as with the tier off (staging/stage_cache.hpp: the node's
//    own next uses decide what it keeps), so the tier never costs a node a local hit, while the
//    links are slower than the source or not yet learned; while they are faster, the node's home
//    copies rank ahead of every other file (StageCache::set_home_first). The owner node's copy,
//    made for its own first use in e0, is the file's home copy while the node keeps it. Other nodes
//    ask the owner for the files it owns in order of first use in e0 while they fit its home budget
//    (its cache_bytes; none: all): the first file that does not fit and every later one are "beyond
//    budget", read from the source (and counted). A home copy its node never admitted (no room for
//    it under the node's own uses: not_coming()) or has evicted is answered "absent" at once, and
//    the asker reads the source.
//  - later, a rank reads a sample from its node's stage directory if there, else (a home copy of
//    another node) from that copy's owner rank over MPI, else from the source: stage 2 copies it
//    to the node's stage directory (a FileCopy, Tiers::open) where the node's own policy admits it,
//    so a fetched sample the node uses again is read locally next time; it reads it ahead into
//    memory (a Prefetch) or stage 3 reads it (a DecodeRead) where not. Where a home copy exists,
//    the read goes to it or to the source, whichever the source model (tiers/source_model.hpp,
//    applied by the peer tier, tiers/peer_tier.hpp, for every reader) expects to finish it first.
//  - a request names the sample's byte range (or the whole file: stage 2's copies, and samples
//    that are whole files or slices of one), and the owner sends only those bytes. It checks its
//    copy against its stage index before it sends any of it: a copy left by an earlier run whole
//    (StageDirectory::verify), a whole file by its bytes (intact), a range by the copy's identity,
//    its bytes checked whole when that is new to this process (unchanged: about once per copy);
//    a copy that fails is removed there and answered "absent", as is a range not within the
//    copy. A reply carries the CRC-32C of the bytes sent and the file's size as the owner's stage
//    index records it; a mismatch with the range, the catalog's size or the CRC (counted
//    corrupt), no answer within peer_timeout, or a stopped peer means a read of the source
//    (counted), never a wait beyond it.
//  - a peer that said goodbye (its loader closed) or did not answer within peer_timeout (stalled,
//    dead) is marked down: every later fetch of its files reads the source at once. So a dead peer
//    costs each rank at most one peer_timeout (for the fetches under way when it stopped).
//  - a rank whose loader finds every link slower than the source expects few requests (the other
//    nodes' links are alike: they read the source too, and only probe it) and says so to its
//    transport (set_quiet), which may then poll for them less often. The time a request waited to
//    be picked up is the owner's doing, not the link's: it is part of the `held` time fetch()
//    reports, which the source model leaves out.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "prestage/catalog.hpp"
#include "prestage/plan.hpp"
#include "prestage/stats.hpp"
#include "tiers/ledger.hpp"
#include "tiers/stage_directory.hpp"
#include "tiers/transport.hpp"

namespace prestage::detail {

// Per file: who owns it and whether its owner node keeps a home copy. A pure function of the plan.
struct Ownership {
  static constexpr uint64_t kNoOwner = ~uint64_t{0};  // not used in e0 (drop_last)
  std::vector<uint64_t> owner;                        // per file: its owner rank
  std::vector<uint8_t> home;  // per file: 1 if within its owner node's home budget

  // `file_of[s]`: sample s's file; `file_size[f]`: its bytes; `node_of[r]`: rank r's node (any id);
  // `budget_of[r]`: the home budget of rank r's node (0: none), as rank r sees it (the lowest rank
  // of a node speaks for it). `plan`'s rank is ignored.
  static Ownership compute(const std::vector<uint64_t>& file_of,
                           const std::vector<uint64_t>& file_size, PlanOptions plan, uint64_t epoch,
                           const std::vector<uint64_t>& node_of,
                           const std::vector<uint64_t>& budget_of);
};

struct PeerOptions {
  std::chrono::milliseconds timeout{1000};
  const void* comm = nullptr;  // see TransportConfig
  int64_t comm_fortran = -1;
  TransportStart start = nullptr;  // the transport's start (tests: a double); null: plugin()'s
};

// The peer tier's own counters: of what is not a read of a sample's bytes that this rank used. Its
// reads (a home copy fetched from another node and served to a reader of this rank) are counted
// once, where every read is: in the ledger of the tiers that read through it, as served by
// Tier::kPeer (tiers/ledger.hpp; add_to() gives them as peer_reads and peer_bytes).
struct PeerCounts {
  uint64_t probes = 0, probe_bytes = 0;  // answers with bytes fetched only to measure a link
  uint64_t fallbacks = 0;                // fetches that ended in a read of the source
  uint64_t corrupt = 0;                  // of those, replies whose sizes or CRC did not match
  uint64_t beyond_budget = 0;            // uses of samples beyond their owner node's home budget
  // Answers this rank sent with bytes (the ranges asked), to reads and probes alike. Over a job,
  // the served answers are the askers' reads (the ledgers' kPeer reads) + probes + corrupt, and
  // those that reached an asker no longer waiting (past its timeout, or its loader closed), which
  // it drops uncounted, or whose bytes the asker fetched and did not use (a decode whose codec
  // refused the sample's header: no read, as from any tier).
  uint64_t served = 0, served_bytes = 0;
  uint64_t down = 0;    // peers marked down: no answer within the timeout (stalled, dead)
  uint64_t closed = 0;  // peers that said goodbye (closed their loader: skipped from then on too)
};

// Thread-safe. Starting it is collective: every rank of the job constructs its loader's Peers
// together (also a rank whose stage directory failed: `stage` null, it then serves nothing). The
// catalog and the stage directory must outlive it.
class Peers {
 public:
  Peers(const Catalog& catalog, const PlanOptions& plan, StageDirectory* stage,
        uint64_t home_budget, const PeerOptions& options);
  ~Peers();  // stops the transport (in the process that started it; a forked one leaves it be)
  Peers(const Peers&) = delete;
  Peers& operator=(const Peers&) = delete;

  bool on() const noexcept { return transport_ != nullptr; }
  const std::string& why_off() const noexcept { return why_off_; }

  // Fixes e0, the epoch ownership is computed from: the first epoch the loader starts. Later calls
  // are ignored. Must be called before the first batch is planned.
  void start_epoch(uint64_t epoch);
  // Whether this node is to keep the home copy of `file` (its owner node, within the home budget).
  bool home_here(uint64_t file) const;
  // This process declined to copy `file` (stage 1: no room under the node's bound, or a directory
  // it cannot write): a home copy of this node not staged now is not coming, so that neither a
  // peer's request nor this node's own reads wait for it. Any thread.
  void not_coming(uint64_t file) noexcept;
  // Its home copy was on this node and is gone (evicted, found corrupt): none is coming. `stage`
  // non-null.
  bool gone_from_node(uint64_t file) const;
  // Stage 2: sample `loc`'s bytes (its byte range; a locator of the whole file, as a slice's is,
  // the whole file) from its home copy into `out`: kPeer from its owner node, kLocal
  // from this node's stage directory (a home copy of this node that a neighbour, or this rank for
  // an earlier batch, was still making when this batch was planned: waited for up to the timeout
  // rather than read from the source a second time), or kNone (the caller reads the source) for a
  // file with no home copy, a failed fetch (counted) or a forked process.
  // `held` (if given) gets the time of the fetch that was not the link's: spent waiting for a home
  // copy still being made (by the owner, or by a neighbour on this node), or, from a peer, the
  // expected time the owner took to pick the request up (Transport::request): what the source
  // model leaves out.
  // kProbe: a read made only to measure the source (tiers/source_model.hpp), not counted in
  // counts() (a peer that does not answer is still marked down).
  enum class Fetched { kNone, kPeer, kLocal };
  enum class Count { kRead, kProbe };
  Fetched fetch(const Catalog::Locator& loc, std::vector<std::byte>& out,
                std::chrono::microseconds* held = nullptr, Count count = Count::kRead);
  // Where fetch() would look for sample `loc`'s home copy, without fetching or counting: kPeer (its
  // owner rank in `owner`), kLocal (this node's stage directory), or kNone (no home copy, or the
  // tier cannot fetch now). A peer marked down is still named (see down()).
  Fetched home(const Catalog::Locator& loc, uint64_t& owner) const;
  // A sample to learn the links from before any read asks another node for one: the first sample
  // of the start epoch's first batch of the lowest rank on another node, whose home copy that node
  // makes first. False if there is none (its file beyond budget, one node) or the tier cannot
  // fetch now. `owner` gets the rank that owns it.
  bool early_probe(uint64_t& sample, uint64_t& owner) const;
  // Rank `rank` is marked down: fetch() reads its files from the source at once.
  bool down(uint64_t rank) const { return down_[rank].load(std::memory_order_acquire) != 0; }
  // The ranks of the job (0 while the tier is off), and rank `rank`'s node (named by its lowest
  // rank).
  size_t ranks() const noexcept { return node_of_.size(); }
  uint64_t node_of(uint64_t rank) const { return node_of_[rank]; }

  PeerCounts counts() const;
  // The tier's figures in `stats` (peer_tier, peer_tier_why, peer_* and beyond_budget, peers_down,
  // peers_closed): counts(), and its reads, peer_reads and peer_bytes, from `ledger` (that of the
  // tiers reading through this one): every purpose's reads that Tier::kPeer served.
  void add_to(Stats& stats, const Ledger& ledger) const;
  // The loader closes: fetches from now on fail at once and closing() says so, so that a batch that
  // will never be delivered costs no read of the source. This rank still answers others.
  void close() noexcept { closing_.store(true, std::memory_order_release); }
  bool closing() const noexcept { return closing_.load(std::memory_order_acquire); }
  // Stops answering (the loader has closed): other ranks read the source from now on.
  void stop();
  // This rank expects few requests (Transport::set_quiet); off at start. Any thread; nothing with
  // the tier off or in a forked process.
  void set_quiet(bool quiet);

  // The transport plugin, opened once per process: its start function, or null with the reason.
  static TransportStart plugin(std::string& why);

 private:
  PeerAnswer serve(const PeerRange& range, std::vector<std::byte>& bytes, PeerCheck& check);
  // fetch() of a home copy of this node's: waited for while it is coming, then read by the stage
  // directory's checked read (StageDirectory::read_checked), as every holder of a copy's bytes is.
  Fetched local(const Catalog::Locator& loc, std::vector<std::byte>& out,
                std::chrono::microseconds& waited);
  // PRESTAGE_PEER_LINK="LATENCY_MS,MBS" (benchmarks and tests): each fetch from a peer takes at
  // least the latency plus its bytes at MBS megabytes per second, the fetches of this process
  // sharing one emulated link (each waits for the bytes queued before its own).
  void emulate_link(uint64_t bytes);

  const Catalog& catalog_;
  PlanOptions plan_;
  StageDirectory* stage_;
  PeerOptions options_;
  pid_t pid_;
  std::string why_off_;
  std::unique_ptr<Transport> transport_;
  std::once_flag computed_;
  std::atomic<bool> ready_{false};  // own_ is computed
  std::atomic<bool> closing_{false};
  Ownership own_;
  // early_probe()'s sample and its owner (kNoOwner: none), set with own_.
  uint64_t early_sample_ = 0, early_owner_ = Ownership::kNoOwner;
  std::vector<uint64_t> node_of_;                     // per rank
  std::unique_ptr<std::atomic<uint8_t>[]> down_;      // per rank: marked down
  std::unique_ptr<std::atomic<uint8_t>[]> gone_;      // per rank: said goodbye (also down)
  std::unique_ptr<std::atomic<uint8_t>[]> declined_;  // per file: see not_coming()
  // Not staged here, and none is coming: declined by this process, or gone from the node.
  bool not_here(uint64_t file) const;
  double link_latency_s_ = 0, link_bytes_per_s_ = 0;  // PRESTAGE_PEER_LINK; 0: not emulated
  std::mutex link_mutex_;
  std::chrono::steady_clock::time_point link_free_;  // guarded by link_mutex_
  std::atomic<uint64_t> probes_{0}, probe_bytes_{0}, fallbacks_{0}, corrupt_{0}, beyond_{0},
      served_{0}, served_bytes_{0}, down_count_{0}, closed_count_{0};
};

}  // namespace prestage::detail
