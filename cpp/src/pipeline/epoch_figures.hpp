// The figures of each epoch (Stats::epochs): what each stage's work on a batch cost, added to its
// epoch's under Shared::epochs_mutex.
#pragma once

#include <cstdint>

#include "staging/stage_cache.hpp"
#include "tiers/tiers.hpp"

namespace prestage::detail {

struct Shared;

// Stage 1's decisions for a batch of `epoch`: hits, misses, evictions, copies found adopted.
void count_admission(Shared& shared, uint64_t epoch, const Admission& costs);
// Stage 2's work on a batch: its reads by tier, the copies it made and those a neighbour made.
void count_staging(Shared& shared, uint64_t epoch, const TierTally& reads, uint64_t copied,
                   uint64_t adopted);
// Stage 3's reads for a batch, by tier.
void count_decoding(Shared& shared, uint64_t epoch, const TierTally& reads);

}  // namespace prestage::detail
