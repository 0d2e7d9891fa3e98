// The ledger of reads: every read of a sample's or a file's bytes is one ReadEvent, recorded here
// and nowhere else (Tiers counts each read it serves with Ledger::record). Its consumers:
//  - the run's totals, by purpose and by the tier that served (Tiers::served() and fetched(), the
//    Stager's read-ahead figures, the peer tier's peer_reads and peer_bytes: Peers::add_to);
//  - the figures of the read's batch, and so of its epoch (ReadEvent::batch: a TierTally the
//    pipeline adds to the epoch's figures once the batch's stage is done);
//  - the I/O trace (util/io_trace.hpp), one record per read but decode=locate's looks;
//  - an observer, for tests that see each event.
// Counters of other things stay with their units, each saying how it differs from a read: a peer's
// probes, fallbacks and answers served to other ranks (tiers/peers.hpp), the source model's
// observations (tiers/source_model.hpp), the bytes of the copies stage 2 wrote
// (staging/stager.hpp), the bytes stage 3 decoded its samples from (decode/batch_decoder.hpp).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "util/io_trace.hpp"

namespace prestage::detail {

// Where a read's bytes came from, in the order the tiers are tried.
enum class Tier : uint8_t { kMemory = 0, kStage = 1, kPeer = 2, kSource = 3 };
inline constexpr size_t kTierCount = 4;
// By number, as the trace records them and Python names them (prestage.trace.TIERS).
inline constexpr std::array<const char*, kTierCount> kTierNames{"memory", "stage", "peer",
                                                                "source"};

// Why a read is made, which says where it is counted.
enum class Purpose : uint8_t {
  kDecode,     // stage 3, and a first look at a sample: served(), a trace record of kind kRead
  kLocate,     // decode=locate's look at where a sample is: served(), no trace record (no read)
  kReadAhead,  // stage 2's read of a sample into memory: fetched(), kReadAhead
  kCopy,       // stage 2's read of a whole file to stage: fetched(), kCopy
};
inline constexpr size_t kPurposeCount = 4;

struct TierCounts {
  std::array<uint64_t, kTierCount> reads{};
  std::array<uint64_t, kTierCount> bytes{};

  TierCounts& operator+=(const TierCounts& other) noexcept;
  uint64_t all_reads() const noexcept;  // summed over the tiers
  uint64_t all_bytes() const noexcept;
};

// Reads and their bytes by the tier that served them, added to from any thread at once: one
// purpose's over the run (the ledger's) or one batch's (for the figures of its epoch).
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

// One read. `sample`: IoTrace::kNoSample for a whole file (a copy); `start_ns`: the trace's clock
// when the read began (0 without a trace); `batch`: the figures of the batch it was made for
// (null: none, as for a look at the set or a copy stage 3 makes for itself).
struct ReadEvent {
  Tier tier;
  Purpose purpose;
  uint64_t sample;
  uint64_t file;
  uint64_t offset;
  uint64_t bytes;
  int64_t start_ns;
  TierTally* batch;
};

// Thread-safe: record() and the totals may be called from any thread at once (relaxed atomics: a
// total read while reads go on may lag them). The trace and the observer are set before the first
// read and must outlive the reads.
class Ledger {
 public:
  // Sees every event after it is counted (tests).
  class Observer {
   public:
    virtual ~Observer() = default;
    virtual void on_read(const ReadEvent& event) = 0;
  };

  void set_trace(IoTrace* trace) noexcept { trace_ = trace; }
  IoTrace* trace() const noexcept { return trace_; }
  void set_observer(Observer* observer) noexcept { observer_ = observer; }
  // The trace's clock now, for an event's start_ns (0 without a trace).
  int64_t now_ns() const noexcept { return trace_ != nullptr ? trace_->now_ns() : 0; }

  // The one way a read is counted.
  void record(const ReadEvent& event) noexcept;

  // The run's reads of one purpose, by tier.
  TierCounts totals(Purpose purpose) const noexcept {
    return totals_[static_cast<size_t>(purpose)].counts();
  }
  TierCounts served() const noexcept;   // stage 3's: kDecode and kLocate
  TierCounts fetched() const noexcept;  // stage 2's: kReadAhead and kCopy
  TierCounts all() const noexcept;      // every purpose's: served() and fetched() together

 private:
  std::array<TierTally, kPurposeCount> totals_;
  IoTrace* trace_ = nullptr;
  Observer* observer_ = nullptr;
};

}  // namespace prestage::detail
