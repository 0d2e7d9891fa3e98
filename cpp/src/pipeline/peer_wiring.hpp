// The peer tier's wiring (LoaderOptions::peers): the tier made and, where it is on, joined to the
// tiers (which read from it) and to the stage cache (which keeps the node's home copies).
#pragma once

#include <sys/types.h>

#include "pipeline/graph.hpp"

namespace prestage::detail {

// What the tier changes in the loader around it; the options stay as the user gave them.
struct PeerWiring {
  // The process whose peer tier started (its MPI transport's thread lives there); 0: the tier is
  // off.
  pid_t home = 0;
  // Stage 3 waits for stage 2's copies whatever stage_patience says: a home copy is made by stage 2
  // before its sample is read, so that the source is read once.
  bool wait_for_staging = false;
};

// Collective: every rank of the job calls it (the tier may still turn out off, on all). Needs
// `shared.tiers`, and `shared.cache` where there is one.
PeerWiring wire_peers(Shared& shared);

}  // namespace prestage::detail
