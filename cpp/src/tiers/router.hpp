// Where a read of a sample with a home copy goes, with the peer tier on: to that copy (through the
// peer tier: from its owner node, or from this node's stage directory) or to the source (the PFS),
// whichever the source model (tiers/source_model.hpp) expects to finish it first; and what keeps
// the model's estimates current: each read timed and learned from, probes of the sources it has
// not read lately (on a thread of their own, so that no read waits on one), and the transport's
// quiet state where every link is slower than the source. The tiers (tiers/tiers.hpp) ask it for
// every read below the stage directory; it reads nothing of the source itself.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "prestage/catalog.hpp"
#include "tiers/peers.hpp"
#include "tiers/source_model.hpp"

namespace prestage::detail {

// A sample's size from the catalog (its byte range, or its whole file's recorded size), or
// Catalog::kUnknownSize.
inline uint64_t catalog_sample_size(const Catalog& catalog, uint64_t id) {
  const Catalog::Locator loc = catalog.locator(id);
  return loc.length != Catalog::kWholeFile ? loc.length : catalog.file_size(loc.file);
}

// What a read of `bytes` of `loc` (the catalog's size of what is wanted: a sample's, or a whole
// file's) moves from the source: those bytes, but for a file compressed whole
// (Catalog::file_codec), which is read only as its whole stream, its stored bytes
// (Catalog::file_stored_size). A read of the PFS is queued in the source model, and learned from,
// by these bytes: by the decompressed ones, a compressed file would seem to come off the PFS
// faster than it does.
inline uint64_t source_bytes(const Catalog& catalog, const Catalog::Locator& loc, uint64_t bytes) {
  return catalog.file_codec(loc.file) != Catalog::Codec::kNone ? catalog.file_stored_size(loc.file)
                                                               : bytes;
}

// A read of a source the model tracks: queued there (by the model's choice, or by begin()), and on
// its end, however it ends, dequeued and (if it delivered) learned from. A null model: nothing.
class TimedRead {
 public:
  TimedRead(SourceModel* model, size_t source, uint64_t bytes, bool queued)
      : model_(model), source_(source), bytes_(bytes), start_(std::chrono::steady_clock::now()) {
    if (model_ != nullptr && !queued) model_->begin(source_, bytes_);
  }
  ~TimedRead() { end(false); }
  TimedRead(const TimedRead&) = delete;
  TimedRead& operator=(const TimedRead&) = delete;

  // `waited`: of the read's time, the wait for a copy still being made (not the source's doing).
  void end(bool ok, std::chrono::microseconds waited = std::chrono::microseconds{0}) {
    if (model_ == nullptr) return;
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start_ - waited;
    model_->done(source_, bytes_, took.count(), ok);
    model_ = nullptr;
  }

 private:
  SourceModel* model_;
  size_t source_;
  uint64_t bytes_;
  std::chrono::steady_clock::time_point start_;
};

// Thread-safe: every method may be called from any thread at once. The catalog and the peer tier
// must outlive it.
class Router {
 public:
  // With `home_copy_always` (LoaderOptions::pfs_reads kFewest), every read of a sample with a home
  // copy goes to that copy: no model, no probe (model() null), the source read only where no copy
  // is. Otherwise, with the peer tier on, the model chooses.
  Router(const Catalog& catalog, Peers& peers, bool home_copy_always);
  ~Router();  // waits for a probe under way (the peer tier ends its wait when it stops)
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  Peers& peers() const noexcept { return peers_; }
  SourceModel* model() const noexcept { return model_.get(); }
  // Waits for the probe under way, if any, and starts none from then on: the model's figures are
  // whole. Called once the peer tier has stopped (which ends its wait on a peer).
  void stop_probes();
  // How the other nodes' links compare with the PFS for a read of the set's mean sample, as the
  // model sees them now (SourceModel::links_against_pfs); kUnknown without a model. While it is
  // kSlower the peer tier's transport is quiet (Peers::set_quiet): the other nodes, whose links are
  // alike, read the source and only probe this one. The view is looked at where it can turn: after
  // each probe of a link is learned from, and while quiet after each read of a link.
  SourceModel::Links links() const;
  // Whether the node's stage directory keeps its home copies first (StageCache::set_home_first):
  // always with home_copy_always; with the model, from when every link is expected to read the
  // set's mean sample in at most 1/kHomeFirstBy of the PFS's time until one is no longer expected
  // faster than the PFS. A node gives up some of its own hits for its home copies only where the
  // other nodes then read those copies instead of the PFS: while the links are faster at all
  // (links() kFaster), every read of another node's home copy goes to that copy, not to whichever
  // source the model expects to finish first; the margin keeps a node whose view of the links
  // differs a little from the others' (each learns its own) from keeping home copies the others
  // would not read. Links faster by less leave the layout own first, as with the tier off, so the
  // tier never reads the PFS more than the same job without it. Called by stage 1 (one thread).
  static constexpr double kHomeFirstBy = 2.0;
  bool home_first() const;

  // Sample `loc`'s bytes (`sample_bytes` of them, 0: unknown; the PFS's read of them moves
  // source_bytes()) from its home copy through the peer
  // tier into `buffer`, or from wherever the model expects the read to finish first: kPeer, kLocal
  // (this node's home copy, published late), or kNone (none fetched: the caller reads the source;
  // `pfs_chosen` says the model chose it over a home copy and queued the read, which the caller
  // times with TimedRead(model(), kPfs, ..., true) or ends with pfs_unqueued()).
  // kOtherNode: only a home copy on another node is asked for (stage 2's copies: this node's own
  // home copy is the one being made), and nothing is counted for a file without one.
  enum class Home : uint8_t { kAny, kOtherNode };
  Peers::Fetched fetch_home(const Catalog::Locator& loc, uint64_t sample_bytes,
                            std::vector<std::byte>& buffer, bool& pfs_chosen,
                            Home where = Home::kAny);
  // The model's queued read of the source (fetch_home's pfs_chosen) of `bytes` of `loc` (as given
  // to fetch_home) ended unlearned from.
  void pfs_unqueued(const Catalog::Locator& loc, uint64_t bytes);

 private:
  // While the model knows no link, probes one with a sample another node stages first
  // (Peers::early_probe), a few times at most: so that the node's stage directory knows its layout
  // (StageCache::set_home_first) before the first reads of other nodes' copies are planned.
  void probe_links_early();
  // Sets the transport quiet where links() is kSlower, and not quiet elsewhere, if that changed.
  void update_quiet();
  class Prober;

  const Catalog& catalog_;
  Peers& peers_;
  std::unique_ptr<SourceModel> model_;  // with the peer tier on, but for home_copy_always
  std::mutex quiet_mutex_;              // a look at links() and the quiet it sets, one at a time
  std::atomic<bool> quiet_{false};      // as last set (written under quiet_mutex_)
  mutable std::atomic<bool> home_first_{false};  // see home_first()
  std::unique_ptr<Prober> prober_;               // with model_; declared after it: stopped first
  uint64_t mean_sample_bytes_ = 0;               // of the samples whose size the catalog records
  std::atomic<int> early_probes_{0};             // left to probe_links_early()
};

}  // namespace prestage::detail
