#include "tiers/peer_tier.hpp"

#include <algorithm>
#include <cerrno>

#include "prestage/error.hpp"
#include "tiers/peers.hpp"

namespace prestage::detail {

Tier PeerTier::fetch_home(const Catalog::Locator& loc, uint64_t bytes,
                          std::vector<std::byte>& buffer, bool& pfs_chosen, Router::Home where) {
  pfs_chosen = false;
  if (router_ == nullptr) return Tier::kSource;
  switch (router_->fetch_home(loc, bytes, buffer, pfs_chosen, where)) {
    case Peers::Fetched::kNone:
      return Tier::kSource;
    case Peers::Fetched::kLocal:
      return Tier::kStage;
    case Peers::Fetched::kPeer:
      break;
  }
  return Tier::kPeer;
}

std::optional<Served> PeerTier::serve(Want& want, const DecodeRead& read) {
  // For a counted read of an epoch's sample (a look at the set reads where the bytes are now: it
  // would wait on a home copy its owner makes only when its plan reaches it), that reads its bytes
  // (they go to memory: a look at a size needs none of them), of a known size within the size
  // limit (a slice's is its file's: a larger file is read in part from the source).
  if (router_ == nullptr || !want.counted || read.access == Access::kLook ||
      want.size == Catalog::kUnknownSize || want.size > max_read_bytes_) {
    return std::nullopt;
  }
  std::vector<std::byte>& buffer = read.landing();
  const Tier tier = fetch_home(want.loc, want.size, buffer, want.pfs_chosen);
  // Stage 3's reads of the source are not timed: the model's choice of it is not learned from.
  if (want.pfs_chosen) router_->pfs_unqueued(want.loc, want.size);
  want.pfs_chosen = false;
  if (tier == Tier::kSource) return std::nullopt;
  return use_bytes(tier, MemorySource(buffer, want.path), read);
}

std::optional<Served> PeerTier::serve(Want& want, const Prefetch& read) {
  const Tier tier = fetch_home(want.loc, want.size, read.fetched, want.pfs_chosen);
  if (tier == Tier::kSource) return std::nullopt;
  // The peer tier checked the copy against the catalog's size.
  if (read.fetched.size() != read.out.size()) {
    throw IoError(want.path, EIO, "a home copy of another size than the catalog's");
  }
  std::copy(read.fetched.begin(), read.fetched.end(), read.out.begin());
  return Served{tier, want.size};
}

std::optional<Served> PeerTier::serve(Want& want, const FileCopy& copy) {
  // A file whose size the catalog records may come from its home copy on another node (checked
  // against the size and the owner's CRC-32C), recorded with the catalog's modification time as a
  // read of the source is; a catalog without one checks none (a later catalog that records one
  // finds it differs, and copies the file again). Not this node's own home copy: stage 2 is the
  // one making it.
  if (want.size == Catalog::kUnknownSize) return std::nullopt;
  const Tier tier =
      fetch_home(want.loc, want.size, copy.buffer, want.pfs_chosen, Router::Home::kOtherNode);
  if (tier == Tier::kSource) return std::nullopt;
  copy.mtime_ns = catalog_.file_mtime(want.loc.file);
  return Served{tier, copy.buffer.size()};
}

}  // namespace prestage::detail
