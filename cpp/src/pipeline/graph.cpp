#include "pipeline/graph.hpp"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>

#include <oneapi/tbb/flow_graph.h>

#include "pipeline/machine.hpp"
#include "prestage/error.hpp"

namespace prestage::detail {

namespace flow = tbb::flow;
using Clock = std::chrono::steady_clock;

namespace {

uint64_t elapsed_ns(Clock::time_point since) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - since).count();
}

struct Work;
using Ticket = Work*;
using StageNode = flow::async_node<Ticket, Ticket>;

// One batch in flight, from the plan source to the hand-off. Recycled: the pool holds as many as can
// be in flight, so nothing is allocated per batch or per sample.
struct Work {
  uint64_t seq = 0;  // position in this pipeline's stream of batches: the sequencers' key
  uint64_t epoch = 0;
  uint64_t index = 0;
  std::shared_ptr<const EpochPlan> plan;  // keeps `ids` alive
  const uint64_t* ids = nullptr;
  size_t count = 0;
  StageTask stage;
  StageNode::gateway_type* gateway = nullptr;
  void* owner = nullptr;  // the Pipeline::Impl
  Slot* slot = nullptr;
  std::vector<uint64_t> files;       // the files stage 2 copies for this batch (claimed by stage 1)
  std::vector<size_t> declined;      // positions of the samples the stage directory declined
  // Of those, the samples stage 2 reads into memory instead, up to kReadAheadBytesPerBatch
  // (machine.hpp) per batch (and none larger): their bytes live until the batch is decoded.
  ReadAhead read_ahead;
  uint64_t read_ahead_counted = 0;  // what it last added to Shared::read_ahead_held (stage 1's)
  TierTally stage_reads;   // stage 2's reads for the batch, by tier (for its epoch's figures)
  TierTally decode_reads;  // stage 3's
  bool staging = false;              // at the stager (guarded by the pipeline's stager_mutex)
  std::atomic<bool> in_use{false};
};

}  // namespace

struct Pipeline::Impl {
  Impl(Shared& s, std::shared_ptr<BatchRing> r, uint64_t first_epoch, uint64_t first_batch);
  ~Impl();

  // Stage 1: the plan's next batch and the stage directory's decisions for it.
  Ticket next_batch(tbb::flow_control& fc);
  void admit(Work& w, Admission& costs);
  void plan_read_ahead(Work& w);
  // Stage 2: the batch's copies and reads ahead, on the stager's threads.
  void stage(Ticket t, StageNode::gateway_type& gateway);
  void expedite(uint64_t seq);
  // Stage 3: the batch decoded into a free buffer.
  Ticket decode(Ticket t);
  // A scratch for one batch's decode, and its return (see free_scratch).
  struct Scratch {
    std::unique_ptr<BatchScratch> bytes;
    uint64_t counted = 0;  // what it last added to Shared::scratch_held
  };
  Scratch take_scratch();
  void give_back(Scratch scratch);
  void hand_off(Ticket t);
  // Adds what a stage's work on batch `w` cost to the figures of its epoch.
  void count_stage(const Work& w);
  void count_decode(const Work& w);
  // Adds the reads `reads` made from the source to `e` (epochs_mutex held).
  static void count_source(EpochStats& e, const TierTally& reads);
  // A node's body failed (a broken invariant, not a sample's error): the pipeline stops delivering
  // and pop() raises `error`. No exception may leave a node: oneTBB would cancel the whole graph and
  // the consumer would wait for ever.
  void fail(std::exception_ptr error);

  Shared& shared;
  std::shared_ptr<BatchRing> ring;
  std::atomic<bool> stopping{false};
  // Batches handed to the stager and not yet back: teardown waits for zero, which also orders the
  // stager threads' last touch of the graph before its destruction (visible to ThreadSanitizer,
  // unlike oneTBB's own wait inside its uninstrumented library).
  std::mutex stager_mutex;
  std::condition_variable stager_cv;
  int at_stager = 0;  // guarded by stager_mutex

  // Stage 1 state, touched only by the source node's body (serial).
  uint64_t next_seq = 0;
  std::atomic<uint64_t> planned{0};  // next_seq, for skip(): every batch before it is in flight
  std::atomic<uint64_t> drop_before{0};  // batches before this seq are dropped undecoded (skip())
  uint64_t epoch;
  uint64_t batch;
  std::shared_ptr<const EpochPlan> plan;
  std::vector<std::unique_ptr<Work>> pool;
  // Stage 3's scratch between the steps of a batch, one per batch being decoded: as many as the
  // ring lends buffers for at once (a batch decodes into one), not one per batch in flight, since
  // each keeps what its largest batch needed (a ragged batch's every sample).
  std::mutex scratch_mutex;
  std::vector<Scratch> free_scratch;  // guarded by scratch_mutex; every one once the graph is idle
  size_t read_ahead_grown = 0;  // the largest read-ahead buffer of a work item (ReadAhead::lay_out)

  std::mutex ready_mutex;
  std::condition_variable ready_cv;
  std::deque<Slot*> ready;
  std::exception_ptr failure;  // see fail()
  bool interrupted = false;    // see Pipeline::interrupt()
  uint64_t delivered = 0;  // batches popped: the seq of the one the consumer waits for (ready_mutex)
  uint64_t to_drop = 0;    // batches pop() passes over, undelivered, before the next (ready_mutex)
  uint64_t waited_seq = UINT64_MAX;  // the batch the consumer has been waiting for, since when
  Clock::time_point waited_since;

  std::optional<flow::graph> graph;
  std::optional<flow::input_node<Ticket>> source;
  // Batches between the source and the consumer: lookahead_max + depth at most. Slots held back
  // make the window lookahead + depth: counted in the limiter as if they held a batch (held_back),
  // or to be held back at the next releases (owed), which then do not decrement it.
  std::optional<flow::limiter_node<Ticket, long long>> window;
  std::mutex window_mutex;
  uint64_t held_back = 0;  // window_mutex
  uint64_t owed = 0;       // window_mutex
  std::optional<StageNode> staging;
  std::optional<flow::sequencer_node<Ticket>> staged_in_order;
  std::optional<flow::limiter_node<Ticket>> buffers;  // free batch buffers
  std::optional<flow::function_node<Ticket, Ticket>> decoding;
  std::optional<flow::sequencer_node<Ticket>> decoded_in_order;
  std::optional<flow::function_node<Ticket, flow::continue_msg>> handoff;
};

Pipeline::Impl::Impl(Shared& s, std::shared_ptr<BatchRing> r, uint64_t first_epoch,
                     uint64_t first_batch)
    : shared(s), ring(std::move(r)), epoch(first_epoch), batch(first_batch) {
  const LoaderOptions& o = shared.options;
  if (shared.cache) shared.cache->restart(first_epoch, first_batch);
  // In flight between the source and the consumer's release: at most window + 1 (the source holds one
  // more when the window is full), so a pool of window + 1 works recycled by sequence number never
  // gives out one that is still in use.
  const size_t window_size = shared.lookahead_max + o.depth;
  for (size_t i = 0; i < window_size + 1; ++i) {
    auto w = std::make_unique<Work>();
    w->files.reserve(o.batch_size);
    pool.push_back(std::move(w));
  }

  shared.arena.execute([&] {
    // Constructed inside the arena, the graph runs its tasks on the arena's `readers` threads.
    graph.emplace();
    flow::graph& g = *graph;

    // Stage 1: the plan, one batch at a time, across epoch boundaries.
    source.emplace(g, [this](tbb::flow_control& fc) -> Ticket {
      try {
        return next_batch(fc);
      } catch (...) {
        fail(std::current_exception());
        fc.stop();
        return nullptr;
      }
    });
    // Back-pressure: a batch enters only when it can be staged and decoded within the window.
    window.emplace(g, window_size);
    // Stage 2 runs on the stager's own threads: a blocking read must not hold a TBB worker.
    staging.emplace(g, flow::unlimited, [this](Ticket t, StageNode::gateway_type& gw) {
      try {
        stage(t, gw);
      } catch (...) {
        fail(std::current_exception());
      }
    });
    // Batches take buffers in plan order, so a later batch can never hold the buffer that an earlier
    // one (which the consumer waits for) needs.
    staged_in_order.emplace(g, [](Ticket t) { return static_cast<size_t>(t->seq); });
    buffers.emplace(g, o.depth);
    // Stage 3: each batch decodes its samples in parallel on the arena's threads. At most as many
    // batches at once as there are threads, the others queued in plan order: a batch's task that
    // no thread can take at once would wait behind later batches (a task scheduler runs the last
    // spawned first), and a later batch stalled in a read would then hold up the one the consumer
    // waits for for as long as the read lasts (with one reader, for ever).
    decoding.emplace(g, shared.readers_max, [this](Ticket t) {
      try {
        return decode(t);
      } catch (...) {
        // With its buffer, the batch carries the error to the consumer; without, nothing can.
        if (t->slot != nullptr) {
          t->slot->error = std::current_exception();
        } else {
          fail(std::current_exception());
        }
        return t;
      }
    });
    decoded_in_order.emplace(g, [](Ticket t) { return static_cast<size_t>(t->seq); });
    // Serial: batches must reach the hand-off queue in the order the sequencer releases them.
    handoff.emplace(g, flow::serial, [this](Ticket t) {
      hand_off(t);
      return flow::continue_msg();
    });

    flow::make_edge(*source, *window);
    flow::make_edge(*window, *staging);
    flow::make_edge(*staging, *staged_in_order);
    flow::make_edge(*staged_in_order, *buffers);
    flow::make_edge(*buffers, *decoding);
    flow::make_edge(*decoding, *decoded_in_order);
    flow::make_edge(*decoded_in_order, *handoff);

    held_back = shared.lookahead_max - shared.lookahead.load(std::memory_order_relaxed);
    if (held_back != 0) window->decrementer().try_put(-static_cast<long long>(held_back));
    // The consumer's release of a buffer, from outside the graph, is what lets the next batch in.
    graph->reserve_wait();
    ring->set_release_hook([this] {
      bool hold = false;
      {
        std::lock_guard lock(window_mutex);
        if (owed != 0) {
          --owed;
          ++held_back;
          hold = true;
        }
      }
      if (!hold) window->decrementer().try_put(1);
      buffers->decrementer().try_put(flow::continue_msg());
    });
    source->activate();
  });
}

Pipeline::Impl::~Impl() {
  stopping.store(true, std::memory_order_release);
  ring->set_release_hook(nullptr);
  shared.stager->cancel(true);  // queued copies complete at once
  shared.stopping_io.store(true, std::memory_order_release);  // and reads under io_timeout give up
  graph->release_wait();
  shared.arena.execute([&] {
    // This thread may run the last decodes: under the loader's limit, as the arena's own threads.
    const IoTimeoutScope timeout(std::chrono::milliseconds(shared.options.io_timeout_ms),
                                 &shared.stopping_io);
    graph->wait_for_all();
  });
  {
    std::unique_lock lock(stager_mutex);
    stager_cv.wait(lock, [&] { return at_stager == 0; });
  }
  shared.stager->cancel(false);
  shared.stopping_io.store(false, std::memory_order_release);
  std::lock_guard lock(ready_mutex);
  for (Slot* slot : ready) ring->release(slot);
  ready.clear();
  // Its buffers go with it.
  for (const auto& w : pool) shared.read_ahead_held.fetch_sub(w->read_ahead_counted);
  for (const Scratch& scratch : free_scratch) shared.scratch_held.fetch_sub(scratch.counted);
}

Ticket Pipeline::Impl::next_batch(tbb::flow_control& fc) {
  if (stopping.load(std::memory_order_acquire)) {
    fc.stop();
    return nullptr;
  }
  const auto start = Clock::now();
  while (!plan || batch == plan->num_batches()) {  // a resumed epoch may have no batch left
    if (plan) {
      ++epoch;
      batch = 0;
    }
    plan = std::make_shared<const EpochPlan>(shared.plan, epoch);
  }
  Work& w = *pool[next_seq % pool.size()];
  if (w.in_use.load(std::memory_order_acquire)) throw std::logic_error("pipeline: work pool exhausted");
  w.in_use.store(true, std::memory_order_relaxed);
  w.seq = next_seq++;
  planned.store(next_seq, std::memory_order_release);
  w.epoch = epoch;
  w.index = batch++;
  w.plan = plan;
  w.ids = plan->batch(w.index);
  w.count = plan->batch_size(w.index);
  w.slot = nullptr;
  w.stage_reads.clear();
  w.decode_reads.clear();
  Admission costs;
  admit(w, costs);
  {
    std::lock_guard lock(shared.epochs_mutex);
    EpochStats& e = shared.epochs[w.epoch];
    e.epoch = w.epoch;
    e.hits += costs.hits;
    e.misses += costs.misses;
    e.evictions += costs.evictions;
    e.copies_adopted += costs.adopted;
    shared.already_staged += costs.hits;
  }
  shared.plan_ns.fetch_add(elapsed_ns(start), std::memory_order_relaxed);
  return &w;
}

void Pipeline::Impl::admit(Work& w, Admission& costs) {
  // Decided here, in plan order, so that the stage directory's contents follow the plan exactly.
  w.files.clear();
  w.declined.clear();
  if (shared.cache) {
    // What processes sharing the directory copied since the last batch: hits, not claims.
    shared.stage_dir->take_over_published();
    shared.cache->admit(w.epoch, w.index, w.ids, w.count, w.files, w.declined, costs);
    if (shared.stager->disabled()) {
      // The stage directory failed: nothing more is copied or checked, so every file not staged
      // (or staged by an earlier run and not yet checked: the tiers do not serve it) is read ahead.
      for (const uint64_t f : w.files) shared.stage_dir->abandon(f);
      w.files.clear();
      w.declined.clear();
      for (size_t k = 0; k < w.count; ++k) {
        const uint64_t file = shared.catalog.locator(w.ids[k]).file;
        if (!shared.stage_dir->is_staged(file) || shared.stage_dir->unverified(file)) {
          w.declined.push_back(k);
        }
      }
    }
    plan_read_ahead(w);
    return;
  }
  costs.misses = w.count;  // no stage directory: every sample is read from the source
  // One was asked for but cannot be used: stage 2 reads the batch ahead into memory instead.
  // Without one (direct reads, the baseline) stage 3 reads everything.
  if (!shared.options.stage_dir.empty()) {
    w.declined.resize(w.count);
    for (size_t k = 0; k < w.count; ++k) w.declined[k] = k;
  }
  plan_read_ahead(w);
}

void Pipeline::Impl::plan_read_ahead(Work& w) {
  w.read_ahead.plan(w.count);
  // Every codec decodes a sample from its bytes in memory: a whole file (JPEG, raw, .npy, .npz) or
  // a byte range (a TFRecord record, a packed sample). Not slices of an array (from_arrays,
  // from_hdf5): the bytes of one are its file's (its header, and HDF5's layout, lie there), shared
  // by many samples, which stage 3 reads from the node's copy, or as a whole home copy through the
  // peer tier, or in part from the source (Tiers::serve). With decode=locate nothing is read here
  // (the consumer reads what it was told where to find).
  const Catalog::Kind kind = shared.codec.kind;
  const bool slices = kind == Catalog::Kind::kArrays || kind == Catalog::Kind::kHdf5;
  if (!slices && shared.codec.mode != DecodeMode::kLocate) {
    uint64_t budget = kReadAheadBytesPerBatch;
    for (const size_t k : w.declined) {
      const uint64_t size = shared.tiers->sample_size(w.ids[k]);
      if (size == Catalog::kUnknownSize || size > budget) continue;
      budget -= size;
      w.read_ahead.add(k, w.ids[k], size);
    }
  }
  const uint64_t held = w.read_ahead.lay_out(read_ahead_grown);
  read_ahead_grown = std::max<size_t>(read_ahead_grown, held);
  shared.read_ahead_held.fetch_add(held - w.read_ahead_counted);  // modulo 2^64
  w.read_ahead_counted = held;
}

void Pipeline::Impl::stage(Ticket t, StageNode::gateway_type& gateway) {
  gateway.reserve_wait();
  {
    std::lock_guard lock(stager_mutex);
    ++at_stager;
    t->staging = true;
  }
  t->gateway = &gateway;
  t->owner = this;
  t->stage.ids = t->files.data();
  t->stage.count = t->files.size();
  t->stage.read_ahead = &t->read_ahead;
  t->stage.context = t;
  t->stage.reads = &t->stage_reads;
  t->stage.done = [](void* context) {
    Ticket done = static_cast<Ticket>(context);
    // `done` may be recycled once it is put: read what is needed first.
    StageNode::gateway_type* gw = done->gateway;
    Impl* owner = static_cast<Impl*>(done->owner);
    owner->count_stage(*done);
    gw->try_put(done);
    gw->release_wait();
    // Notified under the lock: once teardown holds the lock and sees zero, nothing here touches
    // `owner` again.
    std::lock_guard lock(owner->stager_mutex);
    done->staging = false;  // not recycled before the consumer has it: still this batch's
    if (--owner->at_stager == 0) owner->stager_cv.notify_all();
  };
  try {
    shared.stager->submit(&t->stage);
  } catch (...) {
    {
      std::lock_guard lock(stager_mutex);
      t->staging = false;
      if (--at_stager == 0) stager_cv.notify_all();
    }
    gateway.release_wait();
    throw;
  }
}

Ticket Pipeline::Impl::decode(Ticket t) {
  Slot& slot = *ring->acquire();
  t->slot = &slot;
  if (t->seq < drop_before.load(std::memory_order_acquire)) {
    // Dropped (skip()): pop() gives the buffer back without looking at it.
    slot.epoch = t->epoch;
    slot.index = t->index;
    slot.error = nullptr;
    return t;
  }
  // Stage 2 is done with the batch: its bytes read ahead are final.
  const BatchSamples batch{t->epoch, t->index,         t->plan.get(),    t->ids,
                           t->count, &t->read_ahead, &t->decode_reads};
  // Given back however decode() ends.
  struct Lent {
    Impl& impl;
    Scratch scratch;
    ~Lent() { impl.give_back(std::move(scratch)); }
  } lent{*this, take_scratch()};
  shared.decoder->decode(batch, *lent.scratch.bytes, slot, stopping);
  count_decode(*t);
  return t;
}

Pipeline::Impl::Scratch Pipeline::Impl::take_scratch() {
  std::lock_guard lock(scratch_mutex);
  if (free_scratch.empty()) return Scratch{std::make_unique<BatchScratch>()};
  Scratch scratch = std::move(free_scratch.back());
  free_scratch.pop_back();
  return scratch;
}

void Pipeline::Impl::give_back(Scratch scratch) {
  const uint64_t held = scratch.bytes->held_bytes();
  shared.scratch_held.fetch_add(held - scratch.counted);  // modulo 2^64
  scratch.counted = held;
  std::lock_guard lock(scratch_mutex);
  free_scratch.push_back(std::move(scratch));
}

void Pipeline::Impl::count_source(EpochStats& e, const TierTally& reads) {
  const TierCounts counts = reads.counts();
  e.source_reads += counts.reads[static_cast<size_t>(Tier::kSource)];
  e.bytes_from_source += counts.bytes[static_cast<size_t>(Tier::kSource)];
  e.peer_reads += counts.reads[static_cast<size_t>(Tier::kPeer)];
  e.bytes_from_peers += counts.bytes[static_cast<size_t>(Tier::kPeer)];
}

void Pipeline::Impl::count_stage(const Work& w) {
  const uint64_t adopted = w.stage.adopted.load(std::memory_order_relaxed);
  std::lock_guard lock(shared.epochs_mutex);
  EpochStats& e = shared.epochs[w.epoch];
  count_source(e, w.stage_reads);
  e.copies_made += w.stage.copied.load(std::memory_order_relaxed);
  e.copies_adopted += adopted;
  // Stage 1 counted these as misses: a neighbour's copy served instead of the source.
  e.hits += adopted;
  e.misses -= std::min(e.misses, adopted);
}

void Pipeline::Impl::count_decode(const Work& w) {
  // Bytes served from memory were read from the source by stage 2, and counted there.
  const TierCounts counts = w.decode_reads.counts();
  const auto reads = [&](Tier t) { return counts.reads[static_cast<size_t>(t)]; };
  std::lock_guard lock(shared.epochs_mutex);
  EpochStats& e = shared.epochs[w.epoch];
  count_source(e, w.decode_reads);
  e.decoded_from_stage += reads(Tier::kStage);
  e.decoded_from_memory += reads(Tier::kMemory);
  e.decoded_from_peers += reads(Tier::kPeer);
  e.decoded_from_source += reads(Tier::kSource);
}

void Pipeline::Impl::hand_off(Ticket t) {
  Slot* slot = t->slot;
  t->plan.reset();
  t->in_use.store(false, std::memory_order_release);  // the source may now recycle it
  if (slot == nullptr) return;  // its decode failed (fail()): nothing to hand off
  {
    std::lock_guard lock(ready_mutex);
    ready.push_back(slot);
  }
  ready_cv.notify_one();
}

void Pipeline::Impl::fail(std::exception_ptr error) {
  stopping.store(true, std::memory_order_release);
  {
    std::lock_guard lock(ready_mutex);
    if (!failure) failure = std::move(error);
  }
  ready_cv.notify_all();
}

Pipeline::Pipeline(Shared& shared, std::shared_ptr<BatchRing> ring, uint64_t epoch, uint64_t batch)
    : impl_(std::make_unique<Impl>(shared, std::move(ring), epoch, batch)) {}

Pipeline::~Pipeline() = default;

void Pipeline::Impl::expedite(uint64_t seq) {
  // Batches pass stage 2 in order, so while the consumer's next batch is still being staged stage 3
  // has nothing to do: after `stage_patience_ms` it takes the batch and reads the files no copy has
  // started straight from the source (misses): it never waits for more than the copies under way.
  // The batch cannot be recycled meanwhile: the consumer, this caller, has not had it yet.
  Work& w = *pool[seq % pool.size()];
  {
    std::lock_guard lock(stager_mutex);
    if (!w.staging || w.seq != seq) return;
  }
  shared.stager->expedite(&w.stage);
}

bool Pipeline::skip(uint64_t batches) {
  Impl& impl = *impl_;
  std::lock_guard lock(impl.ready_mutex);
  const uint64_t from = impl.delivered + impl.to_drop;
  if (batches > impl.planned.load(std::memory_order_acquire) - from) return false;
  impl.to_drop += batches;
  impl.drop_before.store(from + batches, std::memory_order_release);
  return true;
}

void Pipeline::set_lookahead(uint64_t lookahead) {
  Impl& impl = *impl_;
  uint64_t freed = 0;
  {
    std::lock_guard lock(impl.window_mutex);
    const uint64_t target = impl.shared.lookahead_max - std::min(lookahead, impl.shared.lookahead_max);
    const uint64_t now = impl.held_back + impl.owed;
    if (target >= now) {
      impl.owed += target - now;
    } else {
      uint64_t release = now - target;
      const uint64_t cancelled = std::min(release, impl.owed);
      impl.owed -= cancelled;
      release -= cancelled;
      impl.held_back -= release;
      freed = release;
    }
  }
  // Outside the graph, as the consumer's releases are (the graph's reserve_wait covers it).
  if (freed != 0) impl.window->decrementer().try_put(static_cast<long long>(freed));
}

void Pipeline::interrupt() {
  {
    std::lock_guard lock(impl_->ready_mutex);
    impl_->interrupted = true;
  }
  impl_->ready_cv.notify_all();
}

Slot* Pipeline::pop(std::chrono::milliseconds timeout) {
  Impl& impl = *impl_;
  const auto deadline = Clock::now() + timeout;
  const auto ready = [&] { return !impl.ready.empty() || impl.failure || impl.interrupted; };
  std::unique_lock lock(impl.ready_mutex);
  const std::optional<std::chrono::milliseconds> patience = impl.shared.patience;
  if (!ready() && patience) {
    const uint64_t wanted = impl.delivered;
    if (impl.waited_seq != wanted) {
      impl.waited_seq = wanted;
      impl.waited_since = Clock::now();
    }
    const auto patience_ends = impl.waited_since + *patience;
    if (patience_ends < deadline && !impl.ready_cv.wait_until(lock, patience_ends, ready)) {
      lock.unlock();
      impl.expedite(wanted);
      lock.lock();
    }
  }
  for (;;) {
    if (!impl.ready_cv.wait_until(lock, deadline, ready) || impl.interrupted) return nullptr;
    // Batches decoded after a failure were not decoded (the pipeline stops): none is delivered.
    if (impl.failure) std::rethrow_exception(impl.failure);
    Slot* slot = impl.ready.front();
    impl.ready.pop_front();
    ++impl.delivered;
    if (impl.to_drop == 0) return slot;
    --impl.to_drop;
    // Its release lets a batch into the graph (the ring's hook): not under the lock hand_off takes.
    lock.unlock();
    impl.ring->release(slot);
    lock.lock();
  }
}

}  // namespace prestage::detail
