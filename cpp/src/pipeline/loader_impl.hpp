// Loader::Impl: the loader's lifecycle (loader.cpp), its figures (loader_stats.cpp) and its
// self-tuning's actuator (loader_tuning.cpp). Its parts are built in assemble.cpp and
// peer_wiring.cpp.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "pipeline/assemble.hpp"
#include "pipeline/graph.hpp"
#include "pipeline/tuner.hpp"
#include "prestage/loader.hpp"

namespace prestage {

using Clock = std::chrono::steady_clock;

class Loader::Impl {
 public:
  Impl(Catalog catalog, LoaderOptions options);
  void start(uint64_t epoch, uint64_t batch);
  Wait next_for(std::chrono::milliseconds timeout, std::optional<Batch>& out);
  Stats stats() const;
  std::vector<std::string> take_tuning_log() {
    const auto lock = lock_state();
    return std::exchange(tuning_unread, {});
  }
  void close();
  Position position() const;

  // Kept apart from `shared`, which a forked child abandons. `options` is the loader's one copy:
  // final once the constructor returns; `shared` refers to it (declared after it: destroyed first).
  Catalog catalog;
  LoaderOptions options;
  detail::Sizing sizing;  // what the machine sizing chose, for stats() and the self-tuning
  std::unique_ptr<detail::Shared> shared;
  uint64_t batches_per_epoch = 0;
  uint64_t resumed_batches = 0;  // of the resumed epoch (options.resume), which may have fewer
  uint64_t batches_in(uint64_t e) const noexcept {
    return !options.resume.consumed.empty() && e == options.resume.epoch ? resumed_batches
                                                                         : batches_per_epoch;
  }
  ImageSize image_size;  // Loader::image_size()

 private:
  // The locks of the calls that may run at once (loader.hpp, "Thread safety"). Apart, so that a
  // forked child can abandon them with the threads of its parent that may hold them.
  struct Locks {
    std::mutex control;  // start() and close(): one at a time; a second close() waits
    std::mutex state;    // the fields marked "state" below
    std::condition_variable turn_free;  // consumer_busy is false
    std::condition_variable no_waiter;  // waiting_since is empty
  };

  // The consumer's turn: next() and start_epoch() run one thread at a time. Taken with the state
  // lock held; given back when it ends, the lock taken again if it was let go meanwhile.
  class Turn {
   public:
    Turn(Impl& impl, std::unique_lock<std::mutex>& lock) : impl_(impl), lock_(lock) {
      impl_.consumer_busy = true;
    }
    ~Turn() {
      if (!lock_.owns_lock()) lock_.lock();
      impl_.consumer_busy = false;
      impl_.locks->turn_free.notify_one();
    }
    Turn(const Turn&) = delete;
    Turn& operator=(const Turn&) = delete;

   private:
    Impl& impl_;
    std::unique_lock<std::mutex>& lock_;
  };

  // Needs the consumer's turn, and neither lock held.
  void restart(uint64_t epoch, uint64_t batch);
  void check_open() const;  // needs `state` held
  // The process the loader belongs to: the one whose threads run the pipeline, or before they
  // start, the one whose peer tier started (0: none yet, any process may start it).
  pid_t home() const noexcept {
    const pid_t o = owner.load(std::memory_order_acquire);
    return o != 0 ? o : peer_home;
  }
  bool forked() const noexcept {
    const pid_t h = home();
    return h != 0 && h != ::getpid();
  }
  void check_not_forked() const;
  // The state lock; none in a forked child, where none of the threads that may hold it exist.
  std::unique_lock<std::mutex> lock_state() const {
    if (forked()) return {};
    return std::unique_lock(locks->state);
  }
  std::pair<uint64_t, uint64_t> normalized(uint64_t epoch, uint64_t batch) const {
    // The epoch after the resumed one is whole: never empty.
    return batch >= batches_in(epoch) ? std::pair{epoch + 1, uint64_t{0}} : std::pair{epoch, batch};
  }
  // Batches of the plan from position `from` up to `to` (both normalized), or UINT64_MAX where `to`
  // comes first or lies beyond the next epoch (further than a pipeline plans ahead).
  uint64_t batches_between(std::pair<uint64_t, uint64_t> from,
                           std::pair<uint64_t, uint64_t> to) const {
    if (to < from || to.first > from.first + 1) return UINT64_MAX;
    if (to.first == from.first) return to.second - from.second;
    return batches_in(from.first) - from.second + to.second;
  }

  std::unique_ptr<Locks> locks = std::make_unique<Locks>();
  size_t slot_bytes = 0;
  std::atomic<pid_t> owner{0};  // the process whose threads run the pipeline
  // The process whose peer tier started (its MPI transport's thread and state live there), set once
  // by the constructor: the loader is bound to it before any thread starts.
  pid_t peer_home = 0;
  std::string stage_dir_error;

  // State: read and written under locks->state. The thread whose turn it is waits in
  // pipeline->pop() without the lock, with waiting_since set; close() takes the pipeline away,
  // wakes that wait and destroys the pipeline only once it has ended.
  std::unique_ptr<detail::Pipeline> pipeline;
  bool consumer_busy = false;  // see Turn
  std::shared_ptr<detail::BatchRing> ring;
  std::pair<uint64_t, uint64_t> pipeline_next{0, 0};  // the batch the pipeline delivers next
  uint64_t epoch = 0;  // the consumer's position: the batch next() returns
  uint64_t batch = 0;
  bool closed = false;
  Clock::time_point started;
  std::optional<Clock::time_point> waiting_since;  // of the wait in pipeline->pop() under way
  uint64_t batches = 0;
  uint64_t samples = 0;
  uint64_t stall_ns = 0;
  uint64_t skipped = 0;
  std::vector<SkippedSample> skipped_samples;  // the first Stats::kMaxSkippedListed

  // Online self-tuning (state): absent when autotune is off or no value is left to it. A window of
  // measurements runs from the figures below to the next batch delivered once Tuner::due().
  struct TuneWindow {
    Clock::time_point start;
    uint64_t batches = 0, stall_ns = 0, decode_ns = 0, stage_ns = 0;
    double cpu_s = 0;
  };
  std::optional<detail::Tuner> tuner;
  TuneWindow tune_from;
  std::deque<std::string> tuning_log;      // the latest Stats::kMaxTuningListed decisions
  std::vector<std::string> tuning_unread;  // decisions take_tuning_log() has not returned yet
  TuneWindow tune_now() const;             // needs `state` held
  void tune();                             // after a batch is delivered; needs `state` held
  void start_tuner(const std::array<bool, detail::kKnobs>& pinned);
};

}  // namespace prestage
