// The pipeline: one oneTBB flow graph that connects stage 1 (plan), stage 2 (stage) and stage 3
// (decode) and hands decoded batches to the consumer in plan order.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>
#include <oneapi/tbb/task_scheduler_observer.h>

#include "decode/batch_decoder.hpp"
#include "decode/registry.hpp"
#include "decode/transform.hpp"
#include "memory/batch_ring.hpp"
#include "prestage/catalog.hpp"
#include "prestage/options.hpp"
#include "prestage/plan.hpp"
#include "staging/stage_cache.hpp"
#include "staging/stager.hpp"
#include "tiers/peers.hpp"
#include "tiers/stage_directory.hpp"
#include "tiers/tiers.hpp"
#include "util/file_io.hpp"
#include "util/gate.hpp"

namespace prestage::detail {

// Gives every thread that joins the loader's arena the loader's io_timeout, and takes it back when
// the thread leaves: oneTBB's workers serve any arena of the process, and each loader keeps its
// own.
class ArenaIoTimeout : public tbb::task_scheduler_observer {
 public:
  ArenaIoTimeout(tbb::task_arena& arena, std::chrono::milliseconds timeout,
                 const std::atomic<bool>* cancel)
      : tbb::task_scheduler_observer(arena), timeout_(timeout), cancel_(cancel) {
    observe(true);
  }
  ~ArenaIoTimeout() override { observe(false); }
  void on_scheduler_entry(bool) override {
    set_io_timeout(timeout_);
    set_io_cancel(cancel_);
  }
  void on_scheduler_exit(bool) override {
    set_io_timeout(std::chrono::milliseconds(0));
    set_io_cancel(nullptr);
  }

 private:
  std::chrono::milliseconds timeout_;
  const std::atomic<bool>* cancel_;
};

// Everything the successive pipelines of one Loader share.
struct Shared {
  // `options`: the loader's own, which Loader::options() returns; it must outlive this and stay
  // as it is once threads start (the stages read it unlocked). `readers_max`, `lookahead_max`: the
  // most the self-tuning may raise readers and lookahead to (the options' values when it is off):
  // the arena's threads and the pipeline's window are sized for them.
  Shared(Catalog catalog_in, const LoaderOptions& options, uint64_t readers_max,
         uint64_t lookahead_max);

  Catalog catalog;
  // One copy per loader: what the stages use is what the caller is told is in effect.
  const LoaderOptions& options;
  PlanOptions plan;
  ImageSize image_size;    // of every decoded image (kJpeg); empty: each keeps its own
  size_t image_bytes = 0;  // of every decoded image in the batch buffer (any layout and type), or 0
  Codec codec;             // what stage 3 decodes, chosen once
  std::unique_ptr<Normalizer> normalizer;     // kJpeg, float32 output
  std::unique_ptr<StageDirectory> stage_dir;  // null: direct reads
  std::unique_ptr<StageCache> cache;          // with stage_dir: what to stage, what to evict
  std::unique_ptr<IoTrace> trace;             // options.trace: a record per read (before tiers)
  std::unique_ptr<Peers> peers;               // the peer tier (LoaderOptions::peers), on or off
  std::unique_ptr<Tiers> tiers;               // every read of a sample's bytes
  std::unique_ptr<Stager> stager;
  std::unique_ptr<BatchDecoder> decoder;  // stage 3
  std::mutex epochs_mutex;
  std::map<uint64_t, EpochStats> epochs;  // guarded by epochs_mutex
  uint64_t already_staged = 0;            // stage 1's hits, all epochs (epochs_mutex)
  tbb::task_scheduler_handle scheduler;   // lets close() join oneTBB's worker threads
  uint64_t readers_max;
  uint64_t lookahead_max;
  // Stage 3 decodes at most `readers` samples at once (as many as the arena has threads from
  // readers_max up). Needs `decoder`.
  void set_readers(uint64_t readers) {
    decoder->set_concurrency(readers >= readers_max ? Gate::kOpen : readers);
  }
  // How long the consumer's next batch waits for stage 2's copies before stage 3 takes it
  // (options.stage_patience); none: it waits for them (kWaitForStaging, or the peer tier on).
  // Set once, before any thread starts.
  std::optional<std::chrono::milliseconds> patience;
  std::atomic<uint64_t> lookahead;  // batches stage 2 may work ahead now (the self-tuning's)
  tbb::task_arena arena;            // `readers_max` threads: stage 3 runs here
  std::optional<ArenaIoTimeout> arena_io_timeout;  // while the arena runs
  // Set while a pipeline stops: reads under io_timeout give up at once (stage 2's and stage 3's).
  std::atomic<bool> stopping_io{false};
  std::atomic<uint64_t> plan_ns{0};  // stage 1's busy time
  // The bytes the running pipeline's read-ahead buffers and decode scratches hold (Stats::Memory).
  std::atomic<uint64_t> read_ahead_held{0};
  std::atomic<uint64_t> scratch_held{0};
};

// One run of the graph from a position (epoch, batch) onwards, across epoch boundaries, until it is
// destroyed. Destruction stops it: queued work completes without doing anything, threads are idle.
class Pipeline {
 public:
  Pipeline(Shared& shared, std::shared_ptr<BatchRing> ring, uint64_t epoch, uint64_t batch);
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // The next decoded batch in plan order, or nullptr if none came within `timeout`. Rethrows an
  // error that stopped the pipeline itself (a broken invariant inside a node), at every call.
  Slot* pop(std::chrono::milliseconds timeout);
  // Makes the pop() calls under way and every later one return nullptr at once (the loader
  // closes). Any thread; the pipeline may be destroyed once those calls have returned.
  void interrupt();
  // Drops the next `batches` batches, undelivered, if stage 1 has planned them all already (the
  // consumer left an epoch near its end for the one the pipeline runs into): those not decoded yet
  // are not decoded, and pop() passes over the rest. False, dropping nothing, if it has not: a
  // restart then costs less than running through them. One thread at a time (the consumer's), with
  // no pop() under way.
  bool skip(uint64_t batches);
  // Lets stage 2 work `lookahead` batches ahead (1 to Shared::lookahead_max) from now on: a window
  // made smaller takes effect as batches are released. One thread at a time (the consumer's).
  void set_lookahead(uint64_t lookahead);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace prestage::detail
