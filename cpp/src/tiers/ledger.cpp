#include "tiers/ledger.hpp"

namespace prestage::detail {

TierCounts& TierCounts::operator+=(const TierCounts& other) noexcept {
  for (size_t t = 0; t < kTierCount; ++t) {
    reads[t] += other.reads[t];
    bytes[t] += other.bytes[t];
  }
  return *this;
}

uint64_t TierCounts::all_reads() const noexcept {
  uint64_t n = 0;
  for (const uint64_t r : reads) n += r;
  return n;
}

uint64_t TierCounts::all_bytes() const noexcept {
  uint64_t n = 0;
  for (const uint64_t b : bytes) n += b;
  return n;
}

TierCounts TierTally::counts() const noexcept {
  TierCounts counts;
  for (size_t t = 0; t < kTierCount; ++t) {
    counts.reads[t] = reads_[t].load(std::memory_order_relaxed);
    counts.bytes[t] = bytes_[t].load(std::memory_order_relaxed);
  }
  return counts;
}

void TierTally::clear() noexcept {
  for (size_t t = 0; t < kTierCount; ++t) {
    reads_[t].store(0, std::memory_order_relaxed);
    bytes_[t].store(0, std::memory_order_relaxed);
  }
}

void Ledger::record(const ReadEvent& event) noexcept {
  static constexpr TraceKind kKind[kPurposeCount] = {TraceKind::kRead, TraceKind::kRead,
                                                     TraceKind::kReadAhead, TraceKind::kCopy};
  const auto purpose = static_cast<size_t>(event.purpose);
  // A locate reads nothing: counted, not traced.
  if (trace_ != nullptr && event.purpose != Purpose::kLocate) {
    trace_->add(event.sample, event.file, event.offset, event.bytes, event.start_ns,
                static_cast<uint8_t>(event.tier), kKind[purpose]);
  }
  totals_[purpose].add(event.tier, event.bytes);
  if (event.batch != nullptr) event.batch->add(event.tier, event.bytes);
  if (observer_ != nullptr) observer_->on_read(event);
}

TierCounts Ledger::served() const noexcept {
  TierCounts counts = totals(Purpose::kDecode);
  counts += totals(Purpose::kLocate);
  return counts;
}

TierCounts Ledger::fetched() const noexcept {
  TierCounts counts = totals(Purpose::kReadAhead);
  counts += totals(Purpose::kCopy);
  return counts;
}

TierCounts Ledger::all() const noexcept {
  TierCounts counts = served();
  counts += fetched();
  return counts;
}

}  // namespace prestage::detail
