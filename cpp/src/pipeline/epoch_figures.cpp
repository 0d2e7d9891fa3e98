#include "pipeline/epoch_figures.hpp"

#include <algorithm>
#include <mutex>

#include "pipeline/graph.hpp"

namespace prestage::detail {

namespace {

// The reads of a batch that went beyond the node: the source's and the peers'.
void count_beyond(EpochStats& e, const TierTally& reads) {
  const TierCounts counts = reads.counts();
  e.source_reads += counts.reads[static_cast<size_t>(Tier::kSource)];
  e.bytes_from_source += counts.bytes[static_cast<size_t>(Tier::kSource)];
  e.peer_reads += counts.reads[static_cast<size_t>(Tier::kPeer)];
  e.bytes_from_peers += counts.bytes[static_cast<size_t>(Tier::kPeer)];
}

EpochStats& epoch_of(Shared& shared, uint64_t epoch) {
  EpochStats& e = shared.epochs[epoch];
  e.epoch = epoch;
  return e;
}

}  // namespace

void count_admission(Shared& shared, uint64_t epoch, const Admission& costs) {
  std::lock_guard lock(shared.epochs_mutex);
  EpochStats& e = epoch_of(shared, epoch);
  e.hits += costs.hits;
  e.misses += costs.misses;
  e.evictions += costs.evictions;
  e.copies_adopted += costs.adopted;
  shared.already_staged += costs.hits;
}

void count_staging(Shared& shared, uint64_t epoch, const TierTally& reads, uint64_t copied,
                   uint64_t adopted) {
  std::lock_guard lock(shared.epochs_mutex);
  EpochStats& e = epoch_of(shared, epoch);
  count_beyond(e, reads);
  e.copies_made += copied;
  e.copies_adopted += adopted;
  // Stage 1 counted these as misses: a neighbour's copy served instead of the source.
  e.hits += adopted;
  e.misses -= std::min(e.misses, adopted);
}

void count_decoding(Shared& shared, uint64_t epoch, const TierTally& reads) {
  // Bytes served from memory were read from the source by stage 2, and counted there.
  const TierCounts counts = reads.counts();
  const auto of = [&](Tier t) { return counts.reads[static_cast<size_t>(t)]; };
  std::lock_guard lock(shared.epochs_mutex);
  EpochStats& e = epoch_of(shared, epoch);
  count_beyond(e, reads);
  e.decoded_from_stage += of(Tier::kStage);
  e.decoded_from_memory += of(Tier::kMemory);
  e.decoded_from_peers += of(Tier::kPeer);
  e.decoded_from_source += of(Tier::kSource);
}

}  // namespace prestage::detail
