#include "staging/stage_cache.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <string>

#include "prestage/error.hpp"

namespace prestage::detail {

StageCache::StageCache(const Catalog& catalog, const PlanOptions& plan, StageDirectory& directory,
                       uint64_t capacity, Eviction eviction, uint64_t window)
    : catalog_(catalog),
      plan_(plan),
      directory_(directory),
      capacity_(capacity),
      eviction_(eviction),
      window_(std::max<uint64_t>(window, 1)),
      per_epoch_(0),
      stride_(0),
      far_epochs_(std::min(kMaxFarEpochs, 8 * plan.world_size)),
      key_(catalog.num_files(), kNever),
      last_batch_(catalog.num_files(), 0),
      charged_(catalog.num_files(), 0),
      pins_(window_),
      far_(far_epochs_) {
  one_sample_per_file_ = catalog.num_files() == catalog.size();
  const uint64_t batches = batches_per_epoch(plan_);
  per_epoch_ = batches * plan_.batch_size;  // positions are batch * batch_size + k: may skip a few
  stride_ = per_epoch_ + 1;
  if (capacity_ != 0) joined_ = directory_.node().join(plan_.rank);
  // The copies already in the directory (an earlier run's) are taken stock of, and the directory
  // brought within the bound, by the first restart() or admit(): from the position the job starts
  // at, which the loader knows only then (a resume, set_epoch()), and with the ranks that have
  // joined the directory by then.
}

StageCache::~StageCache() {
  let_go_all();
  if (joined_) directory_.node().leave(plan_.rank);
}

void StageCache::let_go_all() noexcept {
  for (auto& files : pins_) {
    if (capacity_ != 0) {
      for (const uint64_t file : files) directory_.let_go(file);
    }
    files.clear();
  }
}

std::vector<uint64_t> StageCache::node_ranks() const {
  // The ranks sharing the directory that are of this plan's world; at least this one.
  std::vector<uint64_t> ranks;
  if (capacity_ != 0) {
    for (const uint64_t r : directory_.node().ranks()) {
      if (r < plan_.world_size) ranks.push_back(r);
    }
  }
  if (std::find(ranks.begin(), ranks.end(), plan_.rank) == ranks.end()) ranks.push_back(plan_.rank);
  return ranks;
}

uint64_t StageCache::position(uint64_t epoch, uint64_t batch, uint64_t k) const {
  return epoch * stride_ + batch * plan_.batch_size + k;
}

template <typename Use>
void StageCache::for_each_node_use(uint64_t epoch, const Use& use) {
  // Every rank of the node runs the same batch at about the same time: a position is comparable
  // across their plans, and a file's next use is the earliest of theirs. One plan gives them all.
  const EpochPlan plan(plan_, epoch);
  const std::vector<uint64_t> ranks = node_ranks();
  for (uint64_t b = 0; b < plan.num_batches(); ++b) {
    for (const uint64_t rank : ranks) {
      const uint64_t* ids = plan.batch_of(b, rank);
      for (uint64_t k = 0; k < plan.batch_size(b); ++k) {
        use(catalog_.locator(ids[k]).file, b * plan_.batch_size + k);
      }
    }
  }
}

const std::vector<uint64_t>& StageCache::first_use(uint64_t epoch) {
  EpochUses& slot = uses_[epoch % 3];
  if (slot.epoch != epoch) {
    slot.epoch = epoch;
    slot.first.assign(catalog_.num_files(), kNever);
    for_each_node_use(epoch, [&](uint64_t file, uint64_t position) {
      slot.first[file] = std::min(slot.first[file], position);
    });
  }
  return slot.first;
}

bool StageCache::used_in_far(uint64_t file, uint64_t epoch) {
  FarEpoch& slot = far_[epoch % far_epochs_];
  if (slot.epoch != epoch) {
    slot.epoch = epoch;
    slot.bits.assign((catalog_.num_files() + 63) / 64, 0);
    for_each_node_use(epoch,
                      [&](uint64_t f, uint64_t) { slot.bits[f / 64] |= uint64_t{1} << (f % 64); });
  }
  return (slot.bits[file / 64] >> (file % 64)) & 1;
}

// The first planned use of `file` at or after the given position: exact within the current epoch
// and the next two, "somewhere in" a later epoch up to far_epochs_ beyond them (one bit test per
// epoch), else kNotSoon. Past the first three epochs, files are ordered by the epoch of their next
// use only: enter_epoch() gives them their exact position before that epoch is the current one,
// and among the files of one far epoch the choice of a victim rarely changes what is read later
// (against Belady's rule with every position known: within 0.3% of the bytes in stage_cache_test).
// A file used twice in one epoch (several samples of one container) counts its first use there.
uint64_t StageCache::next_use_from(uint64_t file, uint64_t epoch, uint64_t position_in_epoch) {
  const uint64_t here = first_use(epoch)[file];
  if (here != kNever && here >= position_in_epoch) return epoch * stride_ + here;
  for (uint64_t e = epoch + 1; e <= epoch + 2; ++e) {
    const uint64_t there = first_use(e)[file];
    if (there != kNever) return e * stride_ + there;
  }
  for (uint64_t e = epoch + 3; e <= epoch + 2 + far_epochs_; ++e) {
    if (used_in_far(file, e)) return e * stride_ + per_epoch_;
  }
  return kNotSoon;
}

void StageCache::enter_epoch(uint64_t epoch, uint64_t position_in_epoch) {
  epoch_ = epoch;
  if (eviction_ != Eviction::kClairvoyant) return;
  // Ranks that joined the directory (or left it) since the tables were made: made again, with them.
  std::vector<uint64_t> ranks = node_ranks();
  if (ranks != ranks_seen_) {
    ranks_seen_ = std::move(ranks);
    for (EpochUses& uses : uses_) uses.epoch = kNever;
    for (FarEpoch& far : far_) far.epoch = kNever;
  }
  // Keys that were "somewhere in" an epoch now among the first three, and kNotSoon keys (whose
  // next use may have come within reach), are stale: look them up again. Once per epoch, so a scan
  // of the tracked files costs little per sample.
  rekey_.clear();
  for (const auto& [rank, file] : tracked_) {
    if (stale(key_[file], epoch)) rekey_.push_back(file);
  }
  for (const uint64_t file : rekey_) track(file, next_use_from(file, epoch, position_in_epoch));
}

bool StageCache::stale(uint64_t key, uint64_t epoch) const {
  return key == kNotSoon || (key % stride_ == per_epoch_ && key / stride_ <= epoch + 2);
}

void StageCache::unpin_oldest(uint64_t epoch, uint64_t position_in_epoch) {
  std::vector<uint64_t>& oldest = pins_[batch_seq_ % window_];
  for (const uint64_t file : oldest) {
    directory_.let_go(file);
    // Used again since (pinned by a later batch), or no longer tracked: nothing to do.
    if (last_batch_[file] + window_ != batch_seq_ || key_[file] == kNever) continue;
    // Keyed before the last epoch change, which did not see it.
    if (eviction_ == Eviction::kClairvoyant && stale(key_[file], epoch)) {
      key_[file] = next_use_from(file, epoch, position_in_epoch);
    }
    tracked_.insert({rank_of(file, key_[file]), file});
  }
  oldest.clear();
}

uint64_t StageCache::charge_of(uint64_t file) const {
  const uint64_t bytes = directory_.is_staged(file) ? directory_.staged_size(file) : size_of(file);
  return directory_.charge(bytes);
}

uint64_t StageCache::size_of(uint64_t file) const {
  const uint64_t known = catalog_.file_size(file);
  if (known != Catalog::kUnknownSize) return known;
  // A catalog without sizes (from_paths): one stat, on the planning thread.
  struct stat st;
  const std::string path = catalog_.file_source_path(file).string();
  if (::stat(path.c_str(), &st) != 0) return 0;  // stage 2 and 3 will report the error
  return static_cast<uint64_t>(st.st_size);
}

uint64_t StageCache::rank_of(uint64_t file, uint64_t key) const {
  if (!home_first_now_.load(std::memory_order_relaxed)) return key;
  const uint64_t within = std::min(key, kOtherNodes - 1);
  return home_here_(file) ? within : kOtherNodes | within;
}

void StageCache::update_home_first(uint64_t epoch) {
  const HomeLayout layout = layout_ && capacity_ != 0 && eviction_ == Eviction::kClairvoyant
                                ? layout_()
                                : HomeLayout::kOwnFirst;
  // Undecided, in the start epoch files of several samples are admitted exactly as with the tier
  // off: room kept for home copies then declined the node's own uses of another node's row or
  // record file, which were read from the PFS a sample at a time where the job without the tier
  // copies the file once (where the links turn out slower than the PFS). A sample that is its
  // file is read once either way in that epoch, and keeps declining for the home copies' room.
  keep_home_room_ = layout != HomeLayout::kOwnFirst;
  whole_files_only_ = layout == HomeLayout::kUndecided && epoch == start_epoch_;
  const bool now = layout == HomeLayout::kHomeFirst;
  if (now == home_first_now_.load(std::memory_order_relaxed)) return;
  std::vector<uint64_t> files;
  files.reserve(tracked_.size());
  for (const auto& entry : tracked_) files.push_back(entry.second);
  home_first_now_.store(now, std::memory_order_relaxed);
  tracked_.clear();
  for (const uint64_t file : files) tracked_.insert({rank_of(file, key_[file]), file});
}

uint64_t StageCache::home_missing() {
  if (home_missing_ != kNever) return home_missing_;
  if (!home_files_listed_) {
    home_files_listed_ = true;
    for (uint64_t f = 0; f < catalog_.num_files(); ++f) {
      if (home_here_(f)) home_files_.push_back(f);
    }
  }
  home_missing_ = 0;
  for (const uint64_t f : home_files_) {
    if (home_counts(f)) home_missing_ += directory_.charge(size_of(f));
  }
  return home_missing_;
}

void StageCache::track(uint64_t file, uint64_t key) {
  if (key_[file] != kNever) tracked_.erase({rank_of(file, key_[file]), file});
  key_[file] = key;
  if (!pinned(file)) tracked_.insert({rank_of(file, key), file});
}

void StageCache::untrack(uint64_t file) {
  if (key_[file] == kNever) return;
  tracked_.erase({rank_of(file, key_[file]), file});
  key_[file] = kNever;
  charged_[file] = 0;
}

void StageCache::restart(uint64_t epoch, uint64_t batch) {
  started_ = true;
  if (start_epoch_ == kNever) start_epoch_ = epoch;
  batch_seq_ = 0;
  std::fill(last_batch_.begin(), last_batch_.end(), 0);
  let_go_all();
  tracked_.clear();
  std::fill(key_.begin(), key_.end(), kNever);
  std::fill(charged_.begin(), charged_.end(), 0);
  if (capacity_ == 0) return;
  // Every file in the directory (left by an earlier run, staged before the restart, or by a
  // neighbour) is tracked, keyed from the new position; then the directory is brought within its
  // bound (files another process holds stay).
  const uint64_t here = batch * plan_.batch_size;
  epoch_ = epoch;
  for (uint64_t f = 0; f < catalog_.num_files(); ++f) {
    if (directory_.is_absent(f)) continue;
    charged_[f] = charge_of(f);
    track(f, eviction_ == Eviction::kClairvoyant ? next_use_from(f, epoch, here) : 0);
  }
  while (used() > capacity_ && !tracked_.empty()) {
    const auto victim =
        eviction_ == Eviction::kClairvoyant ? *tracked_.rbegin() : *tracked_.begin();
    directory_.evict(victim.second);
    untrack(victim.second);
  }
  publish_usage();
}

void StageCache::publish_usage() {
  const uint64_t now = used();
  used_shown_.store(now, std::memory_order_relaxed);
  if (now > peak_.load(std::memory_order_relaxed)) peak_.store(now, std::memory_order_relaxed);
}

bool StageCache::make_room(uint64_t need, uint64_t incoming_rank, Admission& stats) {
  if (need > capacity_) return false;
  // Victims, best first (files of the last `window` batches, possibly being read, are not tracked).
  std::vector<std::pair<uint64_t, uint64_t>> victims;
  uint64_t freed = 0;
  auto consider = [&](const std::pair<uint64_t, uint64_t>& entry) {
    // Room enough already (a neighbour let go of some since the caller's reservation failed):
    // nothing more is given up.
    if (used() - std::min(used(), freed) + need <= capacity_) return false;
    // Belady with bypass: only a file needed later than the incoming one is worth giving up.
    if (eviction_ == Eviction::kClairvoyant && entry.first <= incoming_rank) return false;
    victims.push_back(entry);
    freed += charged_[entry.second];
    return true;
  };
  if (eviction_ == Eviction::kClairvoyant) {
    for (auto it = tracked_.rbegin(); it != tracked_.rend() && consider(*it); ++it) {
    }
  } else {
    for (auto it = tracked_.begin(); it != tracked_.end() && consider(*it); ++it) {
    }
  }
  if (used() - std::min(used(), freed) + need > capacity_) return false;
  for (const auto& [key, file] : victims) {
    if (directory_.evict(file)) {
      ++stats.evictions;
    } else if (!directory_.is_absent(file)) {
      continue;  // another process holds it, or it is being copied: it stays, and stays a candidate
    }
    untrack(file);
    home_moved(file, false);
  }
  return true;
}

bool StageCache::home_waited_for(uint64_t file) const {
  // Undecided, only the copies never made: a home copy made and gone since is not waited for
  // before the layout is known.
  return home_first_now_.load(std::memory_order_relaxed) || !directory_.node().ever_published(file);
}

bool StageCache::home_counts(uint64_t file) const {
  // Missing for the node: neither on its disk nor claimed by any of its processes (whose claim
  // counts the bytes already).
  const NodeTable& node = directory_.node();
  return directory_.is_absent(file) && !node.on_disk(file) && !node.claimed(file) &&
         home_waited_for(file);
}

void StageCache::home_moved(uint64_t file, bool in) {
  if (home_missing_ == kNever || !home_here_(file)) return;
  // Claimed, it counted if this process's claim is the node's one and no copy is on disk; evicted,
  // if it counts now (no neighbour keeps it).
  const NodeTable& node = directory_.node();
  const bool counted =
      in ? node.claimants(file) == 1 && !node.on_disk(file) && home_waited_for(file)
         : home_counts(file);
  if (!counted) return;
  const uint64_t charge = directory_.charge(size_of(file));
  home_missing_ = in ? home_missing_ - std::min(home_missing_, charge) : home_missing_ + charge;
}

void StageCache::decline(uint64_t file, size_t k, std::vector<size_t>& declined) {
  declined.push_back(k);
  if (on_declined_) on_declined_(file);
}

void StageCache::admit(uint64_t epoch, uint64_t batch, const uint64_t* samples, size_t count,
                       std::vector<uint64_t>& to_stage, std::vector<size_t>& declined,
                       Admission& stats) {
  if (!started_) restart(epoch, batch);
  ++batch_seq_;
  update_home_first(epoch);
  home_missing_ = kNever;
  if (capacity_ != 0) {
    if (epoch != epoch_) enter_epoch(epoch, batch * plan_.batch_size);
    unpin_oldest(epoch, batch * plan_.batch_size);
  }
  // The index's growth is counted past the bound when a copy's record needs a new block: brought
  // back within it first.
  if (capacity_ != 0 && used() > capacity_) make_room(0, 0, stats);
  std::vector<uint64_t>& pinned_now = pins_[batch_seq_ % window_];
  for (size_t k = 0; k < count; ++k) {
    const uint64_t file = catalog_.locator(samples[k]).file;
    const uint64_t here = batch * plan_.batch_size + k;
    // Clairvoyant: keyed by the next use after this one; LRU: by this use.
    const uint64_t key = eviction_ == Eviction::kClairvoyant ? next_use_from(file, epoch, here + 1)
                                                             : position(epoch, batch, k);
    last_batch_[file] = batch_seq_;
    if (!directory_.is_absent(file)) {
      // Held while in the window, so that no process removes it; a copy a neighbour removed since
      // this process saw it is found out here, and is a miss.
      const bool held = capacity_ != 0;
      if (held && !directory_.hold(file) && directory_.is_absent(file)) {
        directory_.let_go(file);
      } else {
        ++stats.hits;
        if (directory_.first_use_of_taken_over(file)) ++stats.adopted;
        // A copy from an earlier run is checked (CRC) by stage 2 before its first use in this one.
        if (directory_.unverified(file)) to_stage.push_back(file);
        if (held) {
          if (key_[file] ==
              kNever) {  // not tracked: a neighbour's copy, or one of before a restart
            charged_[file] = charge_of(file);
          }
          track(file, key);
          pinned_now.push_back(file);
        }
        continue;
      }
    }
    untrack(file);
    ++stats.misses;
    const uint64_t bytes = size_of(file);
    stats.bytes_missed += bytes;
    const uint64_t size = directory_.charge(bytes);  // what it takes of the bound
    // A directory that cannot be written serves its copies and takes no new one.
    if (directory_.read_only()) {
      decline(file, k, declined);
      continue;
    }
    // Room for it in the node's bound, reserved before it is claimed: home first (or undecided),
    // for another node's file, beyond the room of the node's home copies still to come.
    const uint64_t rank = rank_of(file, key);
    const bool keep_room = keep_home_room_ && (!whole_files_only_ || one_sample_per_file_);
    const uint64_t kept_for_home =
        capacity_ != 0 && keep_room && !home_here_(file) ? std::min(home_missing(), capacity_) : 0;
    const uint64_t bound = capacity_ - kept_for_home;
    if (capacity_ != 0 && !directory_.reserve(file, size, bound) &&
        !(make_room(size + kept_for_home, rank, stats) && directory_.reserve(file, size, bound))) {
      decline(file, k, declined);
      continue;
    }
    if (!directory_.try_claim(file)) {
      if (capacity_ != 0) directory_.unreserve(file);
      declined.push_back(k);
      continue;
    }
    to_stage.push_back(file);
    home_moved(file, true);
    if (capacity_ != 0) {
      charged_[file] = size;
      track(file, key);
      directory_.hold(file);  // not on disk yet: held for when it is
      pinned_now.push_back(file);
    }
  }
  publish_usage();
}

}  // namespace prestage::detail
