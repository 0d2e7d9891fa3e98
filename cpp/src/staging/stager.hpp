// Stage 2: deals with the files of upcoming batches before stage 3 needs them, on `prefetchers`
// threads of its own (blocking reads must not hold a TBB worker): copies them to the stage
// directory through the tiers (from a peer node's copy where the peer tier has one, else from the
// source, the PFS), checks the copies an earlier run left there against their CRC, and reads into
// memory the samples that are not to be staged (StageTask::read_ahead). Its whole-file reads of a
// FUSE source go around the page cache (set_direct_reads): each file is read once, in the fewest
// requests.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "prestage/catalog.hpp"
#include "prestage/stats.hpp"
#include "tiers/read_ahead.hpp"
#include "tiers/stage_directory.hpp"
#include "tiers/tiers.hpp"

namespace prestage::detail {

// The files of one batch for stage 2: claimed in the stage directory by stage 1 (to copy), or
// staged by an earlier run and not yet checked in this one (to verify). It lives in the pipeline's
// per-batch work, which is recycled: the stager allocates nothing per batch.
struct StageTask {
  const uint64_t* ids = nullptr;  // catalog file ids
  size_t count = 0;
  // Samples not staged (the stage directory declined them: no room without evicting files needed
  // sooner; or it cannot be used), of those the pipeline chose (whole files and byte ranges, not
  // array slices, up to a budget per batch): read into memory through Tiers::open (a Prefetch: a
  // peer's home copy, else the source) instead, so that stage 3 does not read them through the
  // PFS's latency itself. A read that fails leaves its item unread: stage 3 reads the sample again
  // and reports the error. Null: none.
  ReadAhead* read_ahead = nullptr;
  void (*done)(void* context) = nullptr;  // called once every file was dealt with
  void* context = nullptr;
  // What dealing with the task cost, for the figures of its batch's epoch: its reads by tier (its
  // copies' and its reads ahead), copies made here, copies another process made (null: not
  // counted).
  TierTally* reads = nullptr;
  std::atomic<uint64_t> copied{0};
  std::atomic<uint64_t> adopted{0};

  std::atomic<size_t> next{0};       // next item (copy, then read-ahead) to hand to a thread
  std::atomic<size_t> remaining{0};  // items not yet dealt with

  size_t items() const noexcept { return count + (read_ahead != nullptr ? read_ahead->size() : 0); }
};

class Stager {
 public:
  // Reads through `tiers` (the tiers below the stage directory), copies into its stage directory.
  // Without one (none, or an unusable one) the threads only read samples ahead into memory, and
  // `threads` may be 0 (every task is done at once). Each thread reads under `io_timeout` (0: no
  // limit), given up when `io_cancel` is set. A file that another process sharing the directory is
  // copying is waited for up to `neighbour_wait` (StageDirectory::stage). `tiers` must outlive the
  // stager.
  Stager(Tiers& tiers, size_t threads,
         std::chrono::milliseconds io_timeout = std::chrono::milliseconds(0),
         const std::atomic<bool>* io_cancel = nullptr,
         std::chrono::milliseconds neighbour_wait = std::chrono::milliseconds(0));
  ~Stager();  // stop()
  // Joins the threads; every submitted task must have completed. The counters stay (add_to).
  void stop();
  Stager(const Stager&) = delete;
  Stager& operator=(const Stager&) = delete;

  // Queues a task; tasks are served in submission order, their files spread over the threads. A
  // file is "dealt with" when it is published, or given up on and its claim returned (a source
  // error: stage 3 will meet it again and report it; a stage directory error: staging is disabled
  // and stage 3 reads the source). task->done runs exactly once, on a stager thread or, if the
  // stager is cancelled or has no directory, on the caller's.
  void submit(StageTask* task);

  // Completes `task` as soon as the copies and reads under way finish: the items no thread has
  // started are given up (claims given back, reads left undone, so stage 3 reads them from the
  // source; copies of an earlier run to check are checked here, on the caller's thread, and kept).
  // No-op for a task already complete or fully handed out.
  void expedite(StageTask* task);

  // While cancelled, queued and new tasks complete at once, without copying (a pipeline that stops
  // drains this way).
  void cancel(bool cancelled);

  // Keeps at most `threads` items under way at once (the self-tuning's reads in flight), starting
  // threads as needed (they are never more than the most ever asked for). Any thread; none after
  // stop(). A stager made with no thread keeps none.
  void set_threads(size_t threads);
  size_t threads() const;
  uint64_t busy_ns() const noexcept { return busy_ns_.load(std::memory_order_relaxed); }

  // busy_s: thread-seconds spent on items; idle_s: the rest of the thread-seconds available (the
  // thread count integrated over time) since the stager started.
  void add_to(Stats& stats) const;

  // The stage directory failed (full, read-only, gone): nothing is copied any more.
  bool disabled() const noexcept { return disabled_.load(std::memory_order_acquire); }

 private:
  void run();
  void start_threads(size_t count);  // mutex_ held
  void stage_one(StageTask& task, uint64_t id, std::vector<std::byte>& buffer);
  void read_one(StageTask& task, size_t j, std::vector<std::byte>& buffer);
  // Item i of `task`: a copy (i < count) or a read into memory.
  void deal_with(StageTask& task, size_t i, std::vector<std::byte>& buffer);
  // Gives up the items [from, items()) of `task`, which no thread will start: claims go back, and
  // unless cancelled, copies of an earlier run are checked on the caller's thread.
  void give_up(const StageTask& task, size_t from);
  void disable(const std::string& why);

  Tiers& tiers_;
  StageDirectory* directory_;
  std::chrono::milliseconds neighbour_wait_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<StageTask*> queue_;
  bool exit_ = false;
  size_t limit_ = 0;    // items under way at most (mutex_)
  size_t working_ = 0;  // items under way (mutex_)
  // Thread-seconds available up to limit_since_ (mutex_).
  std::chrono::steady_clock::time_point limit_since_ = std::chrono::steady_clock::now();
  double capacity_s_ = 0;
  std::chrono::milliseconds io_timeout_;
  const std::atomic<bool>* io_cancel_;
  // The source is a FUSE file system: large files are read with O_DIRECT (set_direct_reads).
  const bool direct_reads_;
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> disabled_{false};
  std::string disabled_reason_;  // guarded by mutex_

  // bytes_: of the copies this stager wrote and published (Outcome::kStaged), their bytes on the
  // SSD (a compressed file's decompressed bytes): a count of copies written, not of reads. Its
  // reads, those of copies not staged in the end too, are the tiers' ledger's (Purpose::kCopy, the
  // bytes as read: a compressed file's stored bytes from the source).
  std::atomic<uint64_t> busy_ns_{0}, items_{0}, bytes_{0};
  std::atomic<uint64_t> staged_files_{0}, adopted_{0}, failures_{0}, expedited_{0};
  std::vector<std::thread> threads_;
};

}  // namespace prestage::detail
