// The stage directory's admission and eviction policy. Stage 1 calls it for each batch, in plan
// order, before the batch goes to stage 2: for every file of the batch it decides "already staged"
// (a hit), "copy it" (the file is claimed for the stager) or "read it from the source" (a miss that
// is not staged, because it would displace files needed sooner).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "prestage/catalog.hpp"
#include "prestage/options.hpp"
#include "prestage/plan.hpp"
#include "prestage/stats.hpp"
#include "tiers/stage_directory.hpp"

namespace prestage::detail {

// Stage 1's decisions for the batches it admits.
struct Admission {
  uint64_t hits = 0;          // samples whose file is staged or on its way
  uint64_t misses = 0;        // samples whose file is not: claimed for a copy, or declined
  uint64_t evictions = 0;     // files evicted to make room
  uint64_t bytes_missed = 0;  // the sizes of the missed files
  uint64_t adopted = 0;       // hits on copies a neighbour made, each file's first
};

class StageCache {
 public:
  // capacity 0: no bound (every absent file is staged, nothing is evicted). `window`: a bound on
  // the batches planned and not yet decoded; files of the current batch and the `window - 1` before
  // it are never evicted, which covers every file stage 2 may be writing or stage 3 reading.
  //
  // With a bound, it is the node's: the bytes counted are those of every process sharing the
  // directory (NodeTable), the files of every process's window are held (never removed), and the
  // clairvoyant order is that of the next use by any rank sharing the directory.
  StageCache(const Catalog& catalog, const PlanOptions& plan, StageDirectory& directory,
             uint64_t capacity, Eviction eviction, uint64_t window);
  ~StageCache();  // lets go of the files it holds
  StageCache(const StageCache&) = delete;
  StageCache& operator=(const StageCache&) = delete;

  // Plans from batch `batch` of `epoch` on (the start, a resume, a restart): the copies in the
  // directory (left by an earlier run, made before, or by a neighbour) are kept in the order of
  // their next use from there, by the ranks sharing the directory, while they fit the bound; the
  // others are evicted. The first admit() does it for its position if nothing has yet.
  void restart(uint64_t epoch, uint64_t batch);
  // Lets go of the files of the batches planned so far (a loader that closes): other processes may
  // evict them from now on.
  void let_go_all() noexcept;

  // Decides for the files of one batch (the plan's next one). Appends the files to copy to
  // `to_stage` (each claimed in the directory; the stager publishes or abandons it), the positions
  // in the batch of the samples whose files are neither staged nor to be copied to `declined`, and
  // adds to `admission`.
  void admit(uint64_t epoch, uint64_t batch, const uint64_t* samples, size_t count,
             std::vector<uint64_t>& to_stage, std::vector<size_t>& declined, Admission& admission);

  // Called with each file this process declines to copy (no room under the bound for it, or a
  // directory it cannot write): with the peer tier on, a home copy of this node that is then not
  // coming (Peers::not_coming). The policy is the same with the tier on and off: the node's own
  // next uses decide what it keeps, and a copy stage 2 fetched from a peer stays when they keep it.
  // Set before the first admit().
  void set_on_declined(std::function<void(uint64_t file)> on_declined) {
    on_declined_ = std::move(on_declined);
  }

  // The layout of the node's stage directory with the peer tier on (the tier's hybrid).
  // `home_here(file)` says whether this node keeps `file`'s home copy (the copy the other nodes
  // ask it for); `layout()` which layout holds now:
  //  - kOwnFirst (the other nodes' links slower than the source): run exactly as with the tier off.
  //  - kHomeFirst (the links faster): home copies rank ahead of every other file. A home copy kept
  //    serves the other nodes' reads at the link's speed, where a copy of another node's file saves
  //    this node only the link's time over its own SSD's. So a home copy is never evicted for
  //    another node's file, and another node's file enters only room beyond that of the node's
  //    home copies not on the node (not made yet, or gone), or the room of such files used later;
  //    within each kind, Belady's order as without it.
  //  - kUndecided (the links not yet learned): ranked as with the tier off, but the room of the
  //    home copies not made yet is kept for them, so that no read ahead into the next epoch takes
  //    it before the layout is known (a home copy made and gone since is not waited for); in the
  //    start epoch (the first restart()'s), only where every sample is a file of its own: files of
  //    several samples (rows, records) are admitted there as with the tier off (declined, their
  //    samples were each read from the PFS where the job without the tier copies a file once).
  // Asked at each admit(); a change ranks the files tracked again. Clairvoyant eviction and a bound
  // only (LRU keeps its order). Set before the first admit().
  enum class HomeLayout : uint8_t { kOwnFirst, kHomeFirst, kUndecided };
  void set_home_first(std::function<bool(uint64_t file)> home_here,
                      std::function<HomeLayout()> layout) {
    home_here_ = std::move(home_here);
    layout_ = std::move(layout);
  }
  // Whether home copies ranked first at the last admit(). Read from any thread (stats()).
  bool home_first_now() const noexcept { return home_first_now_.load(std::memory_order_relaxed); }

  uint64_t capacity() const noexcept { return capacity_; }  // 0: no bound
  // The node's bytes (of every process sharing the directory), as of the last batch admitted.
  // Read from any thread (stats()).
  uint64_t used_bytes() const noexcept { return used_shown_.load(std::memory_order_relaxed); }
  uint64_t peak_bytes() const noexcept { return peak_.load(std::memory_order_relaxed); }

 private:
  static constexpr uint64_t kNever = ~uint64_t{0};
  // The key of a file not used within the epochs looked at: past every planned use. Not kNever,
  // which marks a file as not tracked.
  static constexpr uint64_t kNotSoon = kNever - 1;
  // Epochs looked at past the two after the current one: 8 * world_size, at most 64. A rank uses a
  // given file in an epoch with probability 1 / world_size, so on a rank of up to 8 a file's next
  // use is within them with probability about 1 - e^-8; past them, files are equally "not soon".
  static constexpr uint64_t kMaxFarEpochs = 64;

  // Keys are positions `epoch * stride_ + i`, i in [0, per_epoch_): the i-th sample of the epoch
  // on this rank. i = per_epoch_ stands for "somewhere in the epoch" (a use more than two epochs
  // ahead).
  uint64_t position(uint64_t epoch, uint64_t batch, uint64_t k) const;
  // Calls use(file, position in the epoch) for each sample of the ranks sharing the directory.
  template <typename Use>
  void for_each_node_use(uint64_t epoch, const Use& use);
  const std::vector<uint64_t>& first_use(uint64_t epoch);  // per file, in-epoch position or kNever
  bool used_in_far(uint64_t file, uint64_t epoch);         // epochs past the first three
  uint64_t next_use_from(uint64_t file, uint64_t epoch, uint64_t position_in_epoch);
  // On entering `epoch`: files keyed "somewhere in" one of its first three epochs get their exact
  // position, files keyed kNotSoon are looked up again.
  void enter_epoch(uint64_t epoch, uint64_t position_in_epoch);
  // A clairvoyant key that enter_epoch() would look up again in `epoch`.
  bool stale(uint64_t key, uint64_t epoch) const;
  bool pinned(uint64_t file) const {
    return last_batch_[file] != 0 && last_batch_[file] + window_ > batch_seq_;
  }
  // Files of the batch that has just left the window become candidates for eviction.
  void unpin_oldest(uint64_t epoch, uint64_t position_in_epoch);
  uint64_t size_of(uint64_t file) const;
  uint64_t charge_of(uint64_t file) const;  // what its copy takes of the bound (staged or to be)
  uint64_t used() const noexcept { return directory_.node().used(); }
  std::vector<uint64_t> node_ranks() const;  // whose plans order the eviction
  void track(uint64_t file, uint64_t key);
  void untrack(uint64_t file);
  // Frees room for `need` bytes by evicting files ranked below `incoming_rank` (rank_of); false
  // (and nothing evicted) if that is not possible.
  bool make_room(uint64_t need, uint64_t incoming_rank, Admission& stats);
  // Position `k` of the batch is declined: its file is not copied (see set_on_declined()).
  void decline(uint64_t file, size_t k, std::vector<size_t>& declined);

  const Catalog& catalog_;
  PlanOptions plan_;
  StageDirectory& directory_;
  uint64_t capacity_;
  Eviction eviction_;
  uint64_t window_;
  uint64_t per_epoch_;  // positions per epoch on this rank
  uint64_t stride_;     // per_epoch_ + 1: see position()
  uint64_t far_epochs_;
  uint64_t epoch_ = kNever;        // of the last admit() or restart()
  uint64_t start_epoch_ = kNever;  // of the first restart(): the peer tier's start epoch
  bool started_ = false;           // restart() has run

  uint64_t batch_seq_ = 0;            // batches planned since restart()
  std::vector<uint64_t> key_;         // per file: its key (in `tracked_` unless pinned), or kNever
  std::vector<uint64_t> last_batch_;  // per file: batch_seq_ + 1 of its last planned use, 0 if none
  std::vector<uint64_t> charged_;     // per file: its bytes, while tracked
  // (rank_of(file, key), file) for staged or claimed files, but for those of the last `window`
  // batches (pinned: never evicted), which enter it when their batch leaves the window. So an
  // eviction never walks past the files in flight, which Belady's order puts first (used now, next
  // used late).
  std::set<std::pair<uint64_t, uint64_t>> tracked_;
  std::vector<std::vector<uint64_t>> pins_;    // the files of batch s in pins_[s % window]
  bool joined_ = false;                        // this rank is listed in the node's table
  std::function<void(uint64_t)> on_declined_;  // see set_on_declined()
  std::function<bool(uint64_t)> home_here_;    // see set_home_first()
  std::function<HomeLayout()> layout_;
  bool keep_home_room_ = false;       // kHomeFirst or kUndecided at the last admit()
  bool whole_files_only_ = false;     // kUndecided in the start epoch: one sample per file only
  bool one_sample_per_file_ = false;  // the catalog's samples are each a file of its own
  std::atomic<bool> home_first_now_{false};  // written by admit() alone
  // Home first, a file that is not this node's home copy ranks after every one that is: its rank
  // in tracked_ carries this bit (positions fit below it; kNotSoon is the last of its kind).
  static constexpr uint64_t kOtherNodes = uint64_t{1} << 63;
  // A file's rank in tracked_: its key, home first with kOtherNodes for another node's file.
  uint64_t rank_of(uint64_t file, uint64_t key) const;
  // Asks layout() at an admit() in `epoch`; on a change of ranking, ranks the files tracked again.
  void update_home_first(uint64_t epoch);
  // Home first: the bytes of the node's home copies not in the directory (neither staged nor on
  // their way); undecided, of those never made. Looked up once per admit() that needs it (kNever:
  // not yet), then followed by home_moved().
  bool home_counts(uint64_t file) const;
  bool home_waited_for(uint64_t file) const;  // home first, or undecided and never made
  uint64_t home_missing();
  // A file this admit() claimed (`in`) or evicted: home_missing() follows it, if looked up.
  void home_moved(uint64_t file, bool in);
  std::vector<uint64_t> home_files_;  // this node's home copies (the first time home first is on)
  bool home_files_listed_ = false;
  uint64_t home_missing_ = kNever;
  std::atomic<uint64_t> used_shown_{0};
  std::atomic<uint64_t> peak_{0};
  void publish_usage();

  // First use of each file in an epoch, for the three epochs from the current one.
  struct EpochUses {
    uint64_t epoch = kNever;
    std::vector<uint64_t> first;
  };
  EpochUses uses_[3];
  // For the `far_epochs_` epochs after those, only whether this rank uses each file: one bit per
  // file and epoch, built the first time a look-up reaches the epoch.
  struct FarEpoch {
    uint64_t epoch = kNever;
    std::vector<uint64_t> bits;
  };
  std::vector<FarEpoch> far_;
  std::vector<uint64_t> rekey_;       // scratch for enter_epoch()
  std::vector<uint64_t> ranks_seen_;  // node_ranks() when enter_epoch() last looked
};

}  // namespace prestage::detail
