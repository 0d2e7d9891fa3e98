// The peers as a tier: a sample's or a file's home copy (tiers/peers.hpp: from its owner node over
// the transport, or from this node's stage directory once a neighbour has published it), through
// the router (tiers/router.hpp), which declines it when it expects the source to finish the read
// first (and then queues that read in its model: Want::pfs_chosen, for the source tier).
#pragma once

#include <memory>
#include <optional>

#include "prestage/catalog.hpp"
#include "tiers/router.hpp"
#include "tiers/tier.hpp"

namespace prestage::detail {

// Thread-safe. Serves a decode's counted read of a sample of a known size within the size limit,
// stage 2's read-ahead, and stage 2's copy of a file of a known size (from another node's home
// copy only: this node's is the one stage 2 makes). Declines every read while the peer tier is off.
class PeerTier final : public TierReader {
 public:
  // `router`: the Tiers' (null while the peer tier is off); it must outlive this.
  PeerTier(const Catalog& catalog, const std::unique_ptr<Router>& router, uint64_t max_read_bytes)
      : catalog_(catalog), router_(router), max_read_bytes_(max_read_bytes) {}

  using TierReader::serve;
  std::optional<Served> serve(Want& want, const DecodeRead& read) override;
  std::optional<Served> serve(Want& want, const Prefetch& read) override;
  std::optional<Served> serve(Want& want, const FileCopy& copy) override;

 private:
  // The router's fetch_home() as the tier that served: kPeer, kStage (this node's home copy,
  // published late) or kSource (none fetched; with the peer tier off, always).
  Tier fetch_home(const Catalog::Locator& loc, uint64_t bytes, std::vector<std::byte>& buffer,
                  bool& pfs_chosen, Router::Home where = Router::Home::kAny);

  const Catalog& catalog_;
  const std::unique_ptr<Router>& router_;
  uint64_t max_read_bytes_;
};

}  // namespace prestage::detail
