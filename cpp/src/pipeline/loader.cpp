// Loader::Impl's lifecycle: construction from its parts, the consumer's calls (start_epoch, next),
// the pipeline's restarts and close().
#include "prestage/loader.hpp"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <new>
#include <stdexcept>
#include <string>

#include <oneapi/tbb/global_control.h>

#include "pipeline/loader_impl.hpp"
#include "pipeline/peer_wiring.hpp"
#include "prestage/error.hpp"

namespace prestage {

using Clock = std::chrono::steady_clock;

Loader::Impl::Impl(Catalog catalog_in, LoaderOptions options_in)
    : catalog(std::move(catalog_in)), options(std::move(options_in)) {
  options.validate();
  detail::threads_can_start();
  // The options' last change: the machine sizing fills what the user left to the loader. From here
  // on, `options` is what the caller gave and Loader::options() returns.
  const std::array<bool, detail::kKnobs> pinned = detail::pinned_knobs(options);
  sizing = detail::size_loader(options, pinned, catalog);
  shared = std::make_unique<detail::Shared>(catalog, options, sizing.limits.readers,
                                            sizing.limits.lookahead);
  const LoaderOptions& o = shared->options;
  batches_per_epoch = prestage::batches_per_epoch(shared->plan);
  resumed_batches = prestage::batches_in_epoch(shared->plan, o.resume.epoch);
  if (batches_per_epoch == 0) {
    throw ConfigError("no batch per epoch: " + std::to_string(shared->catalog.size()) +
                      " samples are fewer than batch_size x world_size and drop_last is set");
  }
  shared->codec = detail::Codec::choose(shared->catalog, o);
  stage_dir_error = detail::open_stage(*shared);
  detail::make_tiers(*shared);
  // A file of several samples (a shard, an array or HDF5 file) is copied whole for its other
  // samples in any case: one of its samples read from the source while its copy waits is that file
  // opened and read twice. Stage 3 waits for such copies, whatever stage_patience says.
  bool wait_for_staging =
      o.stage_patience_ms == LoaderOptions::kWaitForStaging ||
      (!o.stage_dir.empty() && shared->catalog.size() > shared->catalog.num_files());
  if (o.peers) {
    const detail::PeerWiring wired = detail::wire_peers(*shared);
    peer_home = wired.home;
    wait_for_staging = wait_for_staging || wired.wait_for_staging;
  }
  if (!wait_for_staging) shared->patience = std::chrono::milliseconds(o.stage_patience_ms);
  slot_bytes = detail::make_decoder(*shared);
  image_size = shared->image_size;
  ring = std::make_shared<detail::BatchRing>(o.depth, o.batch_size, slot_bytes, o.decode);
  shared->set_readers(o.readers);
  if (o.autotune) start_tuner(pinned);
}

void Loader::Impl::check_not_forked() const {
  if (!forked()) return;
  const std::string home_pid = std::to_string(home());
  const bool started = owner.load(std::memory_order_acquire) != 0;
  throw Error(
      "this loader belongs to process " + home_pid + ", where its " +
      (started ? "threads run" : "peer tier runs over MPI") +
      "; this process was forked from it and cannot use it: iterate the loader in process " +
      home_pid + " (a PyTorch DataLoader over it with num_workers=0), or create " +
      "a new loader in this process after fork()");
}

void Loader::Impl::check_open() const {
  if (closed) throw ConfigError("the loader is closed");
}

void Loader::Impl::start(uint64_t e, uint64_t b) {
  check_not_forked();
  std::unique_lock lock(locks->state);
  check_open();
  if (consumer_busy) {
    throw ConfigError("start_epoch() was called while another thread is in next()");
  }
  const Turn turn(*this, lock);
  lock.unlock();
  restart(e, b);
}

void Loader::Impl::restart(uint64_t e, uint64_t b) {
  std::lock_guard control(locks->control);
  std::unique_lock lock(locks->state);
  check_open();
  if (b > batches_in(e)) {
    throw ConfigError("batch " + std::to_string(b) + " is past the end of an epoch of " +
                      std::to_string(batches_in(e)) + " batches");
  }
  const auto wanted = normalized(e, b);
  if (pipeline && pipeline_next != wanted &&
      pipeline->skip(batches_between(pipeline_next, wanted))) {
    // The consumer left an epoch near its end for the one the pipeline runs into: what it did
    // ahead for that epoch is kept, the rest of the old one is dropped.
    pipeline_next = wanted;
  }
  if (!pipeline || pipeline_next != wanted) {
    // No thread waits in the old pipeline: this one has the consumer's turn. It is stopped without
    // the state lock, so that stats() goes on meanwhile.
    std::unique_ptr<detail::Pipeline> old = std::move(pipeline);
    lock.unlock();
    old.reset();
    lock.lock();
    // The first epoch started is the one the peer tier's ownership comes from.
    if (shared->peers) shared->peers->start_epoch(wanted.first);
    if (owner.load(std::memory_order_relaxed) == 0) {
      // Threads start here, lazily, in the process that iterates.
      detail::threads_can_start();
      detail::threads_started();
      owner.store(::getpid(), std::memory_order_release);
      started = Clock::now();
      detail::allow_workers(shared->readers_max);
      const std::chrono::milliseconds timeout(shared->options.io_timeout_ms);
      shared->scheduler = tbb::task_scheduler_handle(tbb::attach{});
      shared->arena.initialize();
      shared->arena_io_timeout.emplace(shared->arena, timeout, &shared->stopping_io);
      shared->stager = detail::make_stager(*shared, timeout);
    }
    if (ring->free_count() != ring->depth()) {
      // Batches of the old run are still lent out: they keep their buffers, this run gets new ones.
      const LoaderOptions& o = shared->options;
      ring = std::make_shared<detail::BatchRing>(o.depth, o.batch_size, slot_bytes, o.decode);
    }
    const std::shared_ptr<detail::BatchRing> run_ring = ring;
    lock.unlock();
    auto started_pipeline =
        std::make_unique<detail::Pipeline>(*shared, run_ring, wanted.first, wanted.second);
    lock.lock();
    pipeline = std::move(started_pipeline);
    pipeline_next = wanted;
  }
  epoch = e;
  batch = b;
}

Loader::Wait Loader::Impl::next_for(std::chrono::milliseconds timeout, std::optional<Batch>& out) {
  check_not_forked();
  const auto deadline = Clock::now() + timeout;
  std::unique_lock lock(locks->state);
  check_open();
  // Another thread's next() may take the whole time.
  if (!locks->turn_free.wait_until(lock, deadline, [&] { return !consumer_busy || closed; })) {
    return Wait::kTimeout;
  }
  check_open();
  const Turn turn(*this, lock);
  if (!pipeline) {
    const uint64_t e = epoch, b = batch;
    lock.unlock();
    restart(e, b);
    lock.lock();
    check_open();
  }
  if (batch >= batches_in(epoch)) return Wait::kEndOfEpoch;
  if (ring->lent() >= ring->depth()) {
    // Waiting would never end: every buffer is held by the caller.
    throw ConfigError("all " + std::to_string(ring->depth()) +
                      " batch buffers (depth) are held by the caller: let go of earlier batches "
                      "(and of arrays or tensors viewing them) or raise depth");
  }
  detail::Pipeline& waited = *pipeline;
  waiting_since = Clock::now();
  lock.unlock();
  detail::Slot* slot = nullptr;
  std::exception_ptr failure;
  try {
    slot =
        waited.pop(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
  } catch (...) {
    failure = std::current_exception();
  }
  lock.lock();
  stall_ns +=
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - *waiting_since).count();
  waiting_since.reset();
  locks->no_waiter.notify_all();
  if (failure) std::rethrow_exception(failure);
  if (slot == nullptr) {
    check_open();  // close() woke the wait
    return Wait::kTimeout;
  }
  if (slot->epoch != epoch || slot->index != batch) {
    throw std::logic_error("pipeline delivered batch " + std::to_string(slot->index) +
                           " of epoch " + std::to_string(slot->epoch) + " out of order");
  }
  ++batch;
  pipeline_next = normalized(epoch, batch);
  ++batches;
  samples += slot->indices.size();
  ring->lend();
  tune();
  std::optional<Batch> lent;
  lent.emplace(ring, slot);
  if (slot->error) {
    const std::exception_ptr error = slot->error;  // the slot is reused once back in the ring
    lock.unlock();
    lent.reset();  // back to the ring, whose release runs the pipeline's hook: not under the lock
    std::rethrow_exception(error);
  }
  // Counted here, in delivery order, so that a batch decoded ahead but never delivered is not.
  for (const detail::Slot::Skip& skip : slot->skipped) {
    ++skipped;
    if (skipped_samples.size() < Stats::kMaxSkippedListed) {
      skipped_samples.push_back({slot->epoch, slot->index, skip.sample,
                                 static_cast<uint64_t>(slot->indices[skip.position]),
                                 catalog.source_path(skip.sample).string(), skip.error});
    }
  }
  out = std::move(lent);
  return Wait::kBatch;
}

Loader::Position Loader::Impl::position() const {
  const auto lock = lock_state();
  return {epoch, batch};
}

void Loader::Impl::close() {
  if (forked()) {
    // A forked child holds a copy of the parent's loader but none of its threads: joining, waiting
    // or taking a lock one of them held would hang, so the copy is left as it is.
    closed = true;
    (void)pipeline.release();
    (void)shared.release();
    (void)locks.release();
    return;
  }
  // A second close() waits here until the first has joined the threads.
  std::lock_guard control(locks->control);
  std::unique_lock lock(locks->state);
  if (closed) return;
  closed = true;
  locks->turn_free.notify_all();  // next() calls waiting for their turn: closed
  std::unique_ptr<detail::Pipeline> stopping = std::move(pipeline);
  if (stopping) {
    stopping->interrupt();
    locks->no_waiter.wait(lock, [&] { return !waiting_since; });
  }
  lock.unlock();  // stats() goes on while the threads stop
  // No fetch from a peer from now on, nor a read of the source instead.
  if (shared->peers) shared->peers->close();
  if (owner.load(std::memory_order_relaxed) == 0) {  // never started: no thread to join
    if (shared->peers) shared->peers->stop();
    shared->tiers->stop_probes();
    if (shared->trace) shared->trace->flush();
    return;
  }
  stopping.reset();
  shared->stager->stop();                    // its figures stay for stats()
  if (shared->peers) shared->peers->stop();  // other ranks read the source from now on
  shared->tiers->stop_probes();
  if (shared->cache) shared->cache->let_go_all();  // its window's files, for the other processes
  shared->decoder->clear_thread_state();
  shared->arena_io_timeout.reset();
  shared->arena.terminate();
  // Joins oneTBB's workers when no other user of oneTBB in the process still needs them; otherwise
  // they stay, idle, for that user.
  (void)tbb::finalize(shared->scheduler, std::nothrow);
  if (shared->trace) shared->trace->flush();  // every read is over: the file is whole
}

Loader::Loader(Catalog catalog, LoaderOptions options)
    : impl_(std::make_unique<Impl>(std::move(catalog), std::move(options))) {}

Loader::~Loader() {
  close();
  impl_.reset();
#if defined(__GLIBC__)
  // The loader's buffers were freed above, but glibc keeps freed heap memory in its arenas (its
  // threads' arenas too) for the process's next allocations: a trainer that closes a loader expects
  // its memory back, as it had it before the loader.
  ::malloc_trim(0);
#endif
}

const Catalog& Loader::catalog() const noexcept { return impl_->catalog; }

std::string Loader::staged_path(uint64_t sample) const {
  const auto& stage = impl_->shared->stage_dir;
  if (!stage || sample >= impl_->catalog.size()) return {};
  return stage->staged_path(impl_->catalog.locator(sample).file);
}
const LoaderOptions& Loader::options() const noexcept { return impl_->options; }
uint64_t Loader::batches_per_epoch() const noexcept { return impl_->batches_per_epoch; }
uint64_t Loader::batches_in_epoch(uint64_t epoch) const noexcept {
  return impl_->batches_in(epoch);
}
ImageSize Loader::image_size() const noexcept { return impl_->image_size; }
Loader::Position Loader::position() const noexcept { return impl_->position(); }
void Loader::start_epoch(uint64_t epoch, uint64_t first_batch) { impl_->start(epoch, first_batch); }

std::optional<Batch> Loader::next() {
  std::optional<Batch> out;
  while (impl_->next_for(std::chrono::hours(1), out) == Wait::kTimeout) {
  }
  return out;
}

Loader::Wait Loader::next_for(std::chrono::milliseconds timeout, std::optional<Batch>& out) {
  return impl_->next_for(timeout, out);
}

Stats Loader::stats() const { return impl_->stats(); }

std::vector<std::string> Loader::take_tuning_log() { return impl_->take_tuning_log(); }
void Loader::close() { impl_->close(); }

}  // namespace prestage
