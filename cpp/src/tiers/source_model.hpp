// Which source a read goes to: running estimates of each source's latency and bandwidth, learned
// from the reads the tiers do, and a choice per read of the source expected to finish it first,
// counting the reads already queued there (NoPFS's performance model, measured at run time instead
// of configured). The sources: this node's stage directory, each other node's link (its ranks
// share it), the source (the PFS).
//
// A read's cost is modelled as latency + bytes / bandwidth, with the bytes that source must move
// (a peer, this node's copy and the PFS alike move the sample's byte range, but the PFS moves the
// whole stored stream of a file compressed whole: tiers/router.hpp, source_bytes). A source keeps
// `queued_bytes` of reads chosen and not yet done; a new read there is expected to end after them.
//
// A source no other read measures (a peer's link, this node's home copies) is learned by probes:
// reads made only to measure it. SourceModel names a probe beside each choice that is due one, and
// the caller makes it off the read's path (Tiers: on a thread of its own), so that no batch waits
// on a read sent to a source for its estimate's sake (but a loader's first read, made with nothing
// learned of any source: it goes to the nearest, and learns it).
//
// The choice (choose_source) and the estimate's update (observe) are pure functions, tested on
// fixed estimates; SourceModel holds the estimates of a loader and is thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace prestage::detail {

// One source's estimates and queue. Exponentially weighted (weight `alpha` per read) means of a
// read's seconds, bytes, bytes^2 and seconds x bytes: their weighted least-squares line gives the
// latency (intercept) and the bandwidth (1 / slope); reads all of one size (no slope to fit) put
// their whole time on the bandwidth (latency 0).
struct SourceEstimate {
  uint64_t samples = 0;  // reads observed
  double mean_s = 0, mean_b = 0, mean_bb = 0, mean_sb = 0;
  uint64_t queued_bytes = 0;  // chosen, not yet done
  uint32_t queued = 0;
  bool down = false;  // never chosen (a peer marked down)
  bool probe = true;  // learned by probes (a source no other read measures); see choose_source
  uint64_t next_probe = 0;  // the first choice at which it may be probed again
  uint64_t probe_gap =
      0;  // choices between its probes: doubled at each probe, reset once it is best

  double latency_s() const;
  double bytes_per_s() const;  // 0: nothing learned yet
};

struct ModelParams {
  double alpha = 0.125;       // weight of the newest read in the means
  uint64_t min_samples = 2;   // a probed source is chosen until it has this many reads observed
  uint64_t probe_every = 32;  // then, while it is not the best, it is probed after this many
                              // choices, then after twice as many, ...: its estimate stays fresh
                              // at a cost that grows as the log of the reads
};

// Seconds until a read of `bytes` at `e` would end: its latency, then the bytes queued there and
// its own at its bandwidth. Infinite for a source with nothing learned yet.
double expected_finish_s(const SourceEstimate& e, uint64_t bytes);

// The option to read from: options[i] is a source's estimate and bytes[i] what a read there moves.
// In order: a source down is skipped; a probed source with fewer than min_samples reads observed is
// chosen (so that no source is starved of the reads its estimate is learned from); a probed source
// that is not the best and is due (`choice`, the count of choices made, at or past its next_probe)
// is probed, the one observed least first (`probed` says so); else the option expected to finish
// first, ties to the earlier (nearer) one. `best` (if given) gets that last option, whatever is
// returned. Returns options.size() if every option is down.
size_t choose_source(std::span<const SourceEstimate> options, std::span<const uint64_t> bytes,
                     uint64_t choice, const ModelParams& params, bool* probed = nullptr,
                     size_t* best = nullptr);

// `e` after a read of `bytes` that took `seconds` (its own time, waits for a copy that was not
// there yet taken out).
SourceEstimate observe(SourceEstimate e, uint64_t bytes, double seconds, const ModelParams& params);

// A loader's estimates: index kStage, kPfs, then kPeer0 + node (a node named by its lowest rank).
class SourceModel {
 public:
  static constexpr size_t kStage = 0, kPfs = 1, kPeer0 = 2;

  explicit SourceModel(size_t ranks, ModelParams params = {});

  static constexpr size_t kNoProbe = ~size_t{0};
  struct Choice {
    size_t read;               // where to read: queued there
    size_t probe = kNoProbe;   // a source to probe now, off the read's path (not queued)
    uint64_t probe_bytes = 0;  // what the probe moves there
  };
  // Chooses among `sources` (indices as above) for a read moving bytes[i] there, and queues it
  // there: the caller calls done() with the same source and bytes once the read has ended. The
  // read goes to the source expected to finish it first (with nothing learned of any option, to
  // the one choose_source probes: that read learns it). Where choose_source would probe a
  // source instead, and `may_probe`, the probe is named in the choice: the caller reads it there
  // with begin(.., Read::kProbe) and done() (or drops it). Without
  // `may_probe` (a probe is under way) none is named, and one that is due stays due.
  Choice choose(std::span<const size_t> sources, std::span<const uint64_t> bytes,
                bool may_probe = true);
  // A read the tiers do without choosing (stage 2's copies, a probe named by choose()): queued
  // there, done() when it ends. A probe counts in rows()' `probes`.
  enum class Read { kRead, kProbe };
  void begin(size_t source, uint64_t bytes, Read read = Read::kRead);
  // A read ended: dequeued, and learned from if `ok` (`seconds` its own time, of which it is given
  // its share with the reads under way there with it).
  void done(size_t source, uint64_t bytes, double seconds, bool ok);
  void set_down(size_t source);

  // How the other nodes' links compare with the PFS for a read of `bytes`, each expected at its
  // latency plus the bytes at its bandwidth (queues left out: a standing view, not a choice):
  // kUnknown until the PFS and a link have each been learned (min_samples reads), kFaster where
  // every link learned and not down is expected to finish it first, kSlower where none is, else
  // kMixed. The links of a job are alike (and each link is the same both ways), so a node tells
  // from it what the other nodes will ask it for. With `by` > 1 a link counts as faster only where
  // it is expected to take at most 1/by of the PFS's time (kSlower still means none is faster).
  enum class Links : uint8_t { kUnknown, kFaster, kSlower, kMixed };
  Links links_against_pfs(uint64_t bytes, double by = 1.0) const;
  // Whether `source` has been learned: min_samples reads observed, and a bandwidth.
  bool learned(size_t source) const;

  struct Row {
    std::string name;  // "stage", "pfs", "node <lowest rank of the node>"
    // Reads chosen or learned from there, and their bytes: the model's observations (probes, reads
    // that failed, and stage 3's reads it sent to the PFS, dequeued unlearned, included), not the
    // tiers' count of the reads served (their ledger, tiers/ledger.hpp).
    uint64_t reads = 0, bytes = 0;
    uint64_t probes = 0;  // of them, probes
    uint64_t samples = 0;
    double latency_s = 0, bytes_per_s = 0;
    bool down = false;
  };
  std::vector<Row> rows() const;
  uint64_t moved_to_pfs() const;  // reads of a home copy the model sent to the PFS instead

 private:
  ModelParams params_;
  mutable std::mutex mutex_;
  std::vector<SourceEstimate> est_;
  std::vector<uint64_t> reads_, bytes_, probes_;
  uint64_t choices_ = 0, moved_ = 0;
  // All peers' reads together: the estimate a peer not yet learned starts from (the links of a
  // job are alike), so that each new peer costs no probes of its own.
  SourceEstimate pooled_;
};

}  // namespace prestage::detail
