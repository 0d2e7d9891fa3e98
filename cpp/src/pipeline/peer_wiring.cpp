#include "pipeline/peer_wiring.hpp"

#include <unistd.h>

#include <chrono>
#include <memory>

namespace prestage::detail {

PeerWiring wire_peers(Shared& shared) {
  const LoaderOptions& o = shared.options;
  PeerOptions peer_options;
  peer_options.timeout = std::chrono::milliseconds(o.peer_timeout_ms);
  peer_options.comm = o.peer_comm;
  peer_options.comm_fortran = o.peer_comm_fortran;
  const uint64_t home_budget = shared.cache ? shared.cache->capacity() : 0;
  shared.peers = std::make_unique<Peers>(shared.catalog, shared.plan, shared.stage_dir.get(),
                                         home_budget, peer_options);
  if (!shared.peers->on()) return {};
  const bool fewest = o.pfs_reads == PfsReads::kFewest;
  shared.tiers->set_peers(shared.peers.get(), fewest);
  Peers* peers = shared.peers.get();
  if (shared.cache) {
    shared.cache->set_on_declined([peers](uint64_t f) { peers->not_coming(f); });
    const Tiers* tiers = shared.tiers.get();
    using Layout = StageCache::HomeLayout;
    using Links = SourceModel::Links;
    shared.cache->set_home_first([peers](uint64_t f) { return peers->home_here(f); },
                                 [tiers, fewest] {
                                   // Fewest PFS reads: a home copy kept saves one.
                                   if (fewest) return Layout::kHomeFirst;
                                   const Links links = tiers->links();
                                   return links == Links::kFaster    ? Layout::kHomeFirst
                                          : links == Links::kUnknown ? Layout::kUndecided
                                                                     : Layout::kOwnFirst;
                                 });
  }
  return {::getpid(), true};
}

}  // namespace prestage::detail
