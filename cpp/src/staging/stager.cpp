#include "staging/stager.hpp"

#include <pthread.h>

#include <algorithm>
#include <chrono>

#include "prestage/error.hpp"
#include "util/file_io.hpp"

namespace prestage::detail {

Stager::Stager(Tiers& tiers, size_t threads, std::chrono::milliseconds io_timeout,
               const std::atomic<bool>* io_cancel, std::chrono::milliseconds neighbour_wait)
    : tiers_(tiers),
      directory_(tiers.stage_directory()),
      neighbour_wait_(neighbour_wait),
      io_timeout_(io_timeout),
      io_cancel_(io_cancel),
      direct_reads_(source_is_fuse(tiers.catalog().root().string())) {
  std::lock_guard lock(mutex_);
  limit_ = threads;
  start_threads(threads);
}

void Stager::start_threads(size_t count) {
  while (threads_.size() < count) {
    threads_.emplace_back([this] {
      pthread_setname_np(pthread_self(), "prestage-stage");  // told apart in top -H, /proc
      set_io_timeout(io_timeout_);
      set_io_cancel(io_cancel_);
      set_direct_reads(direct_reads_);
      run();
    });
  }
}

void Stager::set_threads(size_t threads) {
  {
    std::lock_guard lock(mutex_);
    if (exit_ || threads_.empty() || threads == limit_) return;
    const auto now = std::chrono::steady_clock::now();
    capacity_s_ +=
        std::chrono::duration<double>(now - limit_since_).count() * static_cast<double>(limit_);
    limit_since_ = now;
    limit_ = std::max<size_t>(threads, 1);
    start_threads(limit_);
  }
  wake_.notify_all();
}

size_t Stager::threads() const {
  std::lock_guard lock(mutex_);
  return limit_;
}

Stager::~Stager() { stop(); }

void Stager::stop() {
  cancel(true);
  {
    std::lock_guard lock(mutex_);
    exit_ = true;
  }
  wake_.notify_all();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void Stager::cancel(bool cancelled) { cancelled_.store(cancelled, std::memory_order_release); }

void Stager::submit(StageTask* task) {
  const size_t items = task->items();
  task->next.store(0, std::memory_order_relaxed);
  task->remaining.store(items, std::memory_order_relaxed);
  task->copied.store(0, std::memory_order_relaxed);
  task->adopted.store(0, std::memory_order_relaxed);
  if (task->read_ahead != nullptr) task->read_ahead->unread();
  if (threads_.empty() || items == 0 || cancelled_.load(std::memory_order_acquire)) {
    task->next.store(items, std::memory_order_relaxed);  // nothing left to expedite
    give_up(*task, 0);
    task->done(task->context);
    return;
  }
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(task);
  }
  wake_.notify_all();
}

void Stager::expedite(StageTask* task) {
  size_t from = 0;
  {
    std::lock_guard lock(mutex_);  // as run() hands samples out
    from = task->next.load(std::memory_order_relaxed);
    if (from >= task->items()) return;
    task->next.store(task->items(), std::memory_order_relaxed);
    const auto it = std::find(queue_.begin(), queue_.end(), task);
    if (it != queue_.end()) queue_.erase(it);
  }
  const size_t given_up = task->items() - from;
  give_up(*task, from);
  expedited_.fetch_add(given_up, std::memory_order_relaxed);
  if (task->remaining.fetch_sub(given_up, std::memory_order_acq_rel) == given_up)
    task->done(task->context);
}

void Stager::give_up(const StageTask& task, size_t from) {
  if (directory_ == nullptr) return;
  const bool cancelled = cancelled_.load(std::memory_order_acquire);
  std::vector<std::byte> buffer;
  for (size_t i = from; i < task.count; ++i) {
    const uint64_t id = task.ids[i];
    directory_->abandon(id);  // a claim of stage 1's goes back; a copy to check stays
    // Stage 3 reads such a copy next: it is checked now (a local read, no wait on the source), so
    // that no unchecked copy is served. A cancelled batch is not read: its next use checks it.
    if (!cancelled && directory_->is_staged(id) && directory_->unverified(id) &&
        !directory_->verify(id, buffer)) {
      failures_.fetch_add(1, std::memory_order_relaxed);
    }
  }
}

void Stager::run() {
  std::vector<std::byte> buffer;  // one per thread, reused for every copy
  std::unique_lock lock(mutex_);
  while (true) {
    wake_.wait(lock, [&] { return exit_ || (!queue_.empty() && working_ < limit_); });
    if (queue_.empty()) return;  // exit_ and nothing left
    StageTask* task = queue_.front();
    const size_t i = task->next.fetch_add(1, std::memory_order_relaxed);
    if (i + 1 >= task->items()) queue_.pop_front();  // this was its last item to hand out
    if (i >= task->items()) continue;
    ++working_;
    lock.unlock();
    if (cancelled_.load(std::memory_order_acquire)) {
      if (i < task->count) directory_->abandon(task->ids[i]);  // claimed by stage 1: give it back
    } else {
      deal_with(*task, i, buffer);
    }
    if (task->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) task->done(task->context);
    lock.lock();
    if (working_-- == limit_) wake_.notify_one();  // a thread held back by the limit may go on
  }
}

void Stager::deal_with(StageTask& task, size_t i, std::vector<std::byte>& buffer) {
  items_.fetch_add(1, std::memory_order_relaxed);
  const auto start = std::chrono::steady_clock::now();
  if (i < task.count) {
    stage_one(task, task.ids[i], buffer);
  } else {
    read_one(task, i - task.count, buffer);
  }
  busy_ns_.fetch_add(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count(),
      std::memory_order_relaxed);
}

void Stager::read_one(StageTask& task, size_t j, std::vector<std::byte>& buffer) {
  ReadAhead& ahead = *task.read_ahead;
  const std::span<std::byte> out = ahead.fill(j);
  try {
    tiers_.open(Prefetch{ahead.id(j), out, buffer}, task.reads);
  } catch (const Error&) {
    return;  // stage 3 reads it again and reports the error at the sample's batch
  }
  ahead.read(j);  // counted by the tiers, in their ledger
}

void Stager::stage_one(StageTask& task, uint64_t id, std::vector<std::byte>& buffer) {
  if (directory_->is_staged(id)) {
    // A copy from an earlier run, used for the first time in this one: check its bytes first.
    if (directory_->unverified(id) && !directory_->verify(id, buffer)) {
      failures_.fetch_add(1, std::memory_order_relaxed);
    }
  } else if (disabled_.load(std::memory_order_acquire)) {
    directory_->abandon(id);
  } else {
    try {
      // Written as it is read: a compressed file is decompressed a piece at a time.
      const StageDirectory::Stream fetch = [&](const StageDirectory::Sink& write,
                                               std::vector<std::byte>& out, int64_t& mtime_ns) {
        tiers_.open(FileCopy{id, out, mtime_ns, &write}, task.reads);
      };
      switch (directory_->stage(id, fetch, buffer, neighbour_wait_)) {
        case StageDirectory::Outcome::kStaged:
          staged_files_.fetch_add(1, std::memory_order_relaxed);
          bytes_.fetch_add(directory_->staged_size(id), std::memory_order_relaxed);
          task.copied.fetch_add(1, std::memory_order_relaxed);
          break;
        case StageDirectory::Outcome::kAdopted:
          adopted_.fetch_add(1, std::memory_order_relaxed);
          task.adopted.fetch_add(1, std::memory_order_relaxed);
          break;
        case StageDirectory::Outcome::kBusy:
        case StageDirectory::Outcome::kChanged:
          failures_.fetch_add(1, std::memory_order_relaxed);
          break;
        case StageDirectory::Outcome::kDropped:  // evicted before its copy began: not wanted now
          break;
      }
    } catch (const StageDirectory::SourceError&) {
      // Stage 3 reads the source again and reports the error at the sample's batch. A read given up
      // because the pipeline stops (io_timeout's cancel) is no failure of the file.
      if (!cancelled_.load(std::memory_order_acquire))
        failures_.fetch_add(1, std::memory_order_relaxed);
    } catch (const IoError& e) {
      // Full, read-only or vanished stage directory: keep going on direct reads.
      failures_.fetch_add(1, std::memory_order_relaxed);
      disable(e.what());
    }
  }
}

void Stager::disable(const std::string& why) {
  std::lock_guard lock(mutex_);
  if (!disabled_.exchange(true)) disabled_reason_ = why;
}

void Stager::add_to(Stats& stats) const {
  stats.stage.busy_s = busy_ns_.load() * 1e-9;
  double capacity_s = 0;
  {
    std::lock_guard lock(mutex_);
    capacity_s =
        capacity_s_ +
        std::chrono::duration<double>(std::chrono::steady_clock::now() - limit_since_).count() *
            static_cast<double>(limit_);
  }
  stats.stage.idle_s = std::max(0.0, capacity_s - stats.stage.busy_s);
  stats.stage.items = items_.load();
  stats.stage.bytes = bytes_.load();
  stats.staged_files = staged_files_.load();
  // Stage 2's own takeovers (a claim that found a neighbour's copy) and stage 1's (the copies
  // neighbours published before a batch: StageDirectory::take_over_published()).
  stats.adopted_files = adopted_.load() + (directory_ != nullptr ? directory_->taken_over() : 0);
  stats.stage_failures = failures_.load();
  stats.stage_expedited = expedited_.load();
  // Its reads into memory, as the ledger of the tiers it reads through counts them (Prefetch
  // requests, which stage 2 alone makes).
  const TierCounts ahead = tiers_.ledger().totals(Purpose::kReadAhead);
  stats.read_ahead = ahead.all_reads();
  stats.read_ahead_bytes = ahead.all_bytes();
  stats.stage_dir_disabled = disabled_.load();
  if (stats.stage_dir_disabled) {
    std::lock_guard lock(mutex_);
    stats.stage_dir_error = disabled_reason_;
  }
}

}  // namespace prestage::detail
