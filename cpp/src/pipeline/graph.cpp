#include "pipeline/graph.hpp"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>

#include <oneapi/tbb/flow_graph.h>

#include "pipeline/admission.hpp"
#include "pipeline/epoch_figures.hpp"
#include "pipeline/hand_off.hpp"
#include "pipeline/machine.hpp"
#include "pipeline/scratch_pool.hpp"
#include "pipeline/window.hpp"
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

// One batch in flight, from the plan source to the hand-off. Recycled: the pool holds as many as
// can be in flight, so nothing is allocated per batch or per sample.
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
  BatchAdmission admitted;  // stage 1's decisions: the files stage 2 copies, the samples it reads
  TierTally stage_reads;    // stage 2's reads for the batch, by tier (for its epoch's figures)
  TierTally decode_reads;   // stage 3's
  bool staging = false;     // at the stager (guarded by the pipeline's stager_mutex)
  std::atomic<bool> in_use{false};
};

}  // namespace

struct Pipeline::Impl {
  Impl(Shared& s, std::shared_ptr<BatchRing> r, uint64_t first_epoch, uint64_t first_batch);
  ~Impl();

  // Stage 1: the plan's next batch and the stage directory's decisions for it.
  Ticket next_batch(tbb::flow_control& fc);
  // Stage 2: the batch's copies and reads ahead, on the stager's threads.
  void stage(Ticket t, StageNode::gateway_type& gateway);
  void expedite(uint64_t seq);
  // Stage 3: the batch decoded into a free buffer.
  Ticket decode(Ticket t);
  void hand_off(Ticket t);
  // A node's body failed (a broken invariant, not a sample's error): the pipeline stops delivering
  // and pop() raises `error`. No exception may leave a node: oneTBB would cancel the whole graph
  // and the consumer would wait for ever.
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
  std::atomic<uint64_t> planned{0};      // next_seq, for skip(): every batch before it is in flight
  std::atomic<uint64_t> drop_before{0};  // batches before this seq are dropped undecoded (skip())
  uint64_t epoch;
  uint64_t batch;
  std::shared_ptr<const EpochPlan> plan;
  std::vector<std::unique_ptr<Work>> pool;
  Admitter admitter;
  ScratchPool scratches;

  HandOff to_consumer;  // decoded batches, to the consumer

  std::optional<flow::graph> graph;
  std::optional<flow::input_node<Ticket>> source;
  // Batches between the source and the consumer: lookahead_max + depth at most, lookahead + depth
  // with the slots `hold` keeps back.
  std::optional<flow::limiter_node<Ticket, long long>> window;
  WindowHold hold;
  std::optional<StageNode> staging;
  std::optional<flow::sequencer_node<Ticket>> staged_in_order;
  std::optional<flow::limiter_node<Ticket>> buffers;  // free batch buffers
  std::optional<flow::function_node<Ticket, Ticket>> decoding;
  std::optional<flow::sequencer_node<Ticket>> decoded_in_order;
  std::optional<flow::function_node<Ticket, flow::continue_msg>> handoff;
};

Pipeline::Impl::Impl(Shared& s, std::shared_ptr<BatchRing> r, uint64_t first_epoch,
                     uint64_t first_batch)
    : shared(s),
      ring(std::move(r)),
      epoch(first_epoch),
      batch(first_batch),
      admitter(s),
      scratches(s.scratch_held),
      to_consumer(*ring),
      hold(s.lookahead_max) {
  const LoaderOptions& o = shared.options;
  if (shared.cache) shared.cache->restart(first_epoch, first_batch);
  // In flight between the source and the consumer's release: at most window + 1 (the source holds
  // one more when the window is full), so a pool of window + 1 works recycled by sequence number
  // never gives out one that is still in use.
  const size_t window_size = shared.lookahead_max + o.depth;
  for (size_t i = 0; i < window_size + 1; ++i) {
    auto w = std::make_unique<Work>();
    w->admitted.files.reserve(o.batch_size);
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
    // Batches take buffers in plan order, so a later batch can never hold the buffer that an
    // earlier one (which the consumer waits for) needs.
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

    const uint64_t held = hold.start(shared.lookahead.load(std::memory_order_relaxed));
    if (held != 0) window->decrementer().try_put(-static_cast<long long>(held));
    // The consumer's release of a buffer, from outside the graph, is what lets the next batch in.
    graph->reserve_wait();
    ring->set_release_hook([this] {
      if (!hold.hold_release()) window->decrementer().try_put(1);
      buffers->decrementer().try_put(flow::continue_msg());
    });
    source->activate();
  });
}

Pipeline::Impl::~Impl() {
  stopping.store(true, std::memory_order_release);
  ring->set_release_hook(nullptr);
  shared.stager->cancel(true);                                // queued copies complete at once
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
  // Its buffers go with it.
  for (const auto& w : pool) admitter.forget(w->admitted);
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
  if (w.in_use.load(std::memory_order_acquire))
    throw std::logic_error("pipeline: work pool exhausted");
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
  admitter.admit(w.epoch, w.index, w.ids, w.count, w.admitted, costs);
  count_admission(shared, w.epoch, costs);
  shared.plan_ns.fetch_add(elapsed_ns(start), std::memory_order_relaxed);
  return &w;
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
  t->stage.ids = t->admitted.files.data();
  t->stage.count = t->admitted.files.size();
  t->stage.read_ahead = &t->admitted.read_ahead;
  t->stage.context = t;
  t->stage.reads = &t->stage_reads;
  t->stage.done = [](void* context) {
    Ticket done = static_cast<Ticket>(context);
    // `done` may be recycled once it is put: read what is needed first.
    StageNode::gateway_type* gw = done->gateway;
    Impl* owner = static_cast<Impl*>(done->owner);
    count_staging(owner->shared, done->epoch, done->stage_reads,
                  done->stage.copied.load(std::memory_order_relaxed),
                  done->stage.adopted.load(std::memory_order_relaxed));
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
  const BatchSamples batch{t->epoch,        t->index, t->plan.get(),
                           t->ids,          t->count, &t->admitted.read_ahead,
                           &t->decode_reads};
  const ScratchPool::Lent scratch = scratches.take();
  shared.decoder->decode(batch, *scratch, slot, stopping);
  count_decoding(shared, t->epoch, t->decode_reads);
  return t;
}

void Pipeline::Impl::hand_off(Ticket t) {
  Slot* slot = t->slot;
  t->plan.reset();
  t->in_use.store(false, std::memory_order_release);  // the source may now recycle it
  if (slot == nullptr) return;  // its decode failed (fail()): nothing to hand off
  to_consumer.push(slot);
}

void Pipeline::Impl::fail(std::exception_ptr error) {
  stopping.store(true, std::memory_order_release);
  to_consumer.fail(std::move(error));
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
  return impl_->to_consumer.skip(batches, impl_->planned, impl_->drop_before);
}

void Pipeline::set_lookahead(uint64_t lookahead) {
  Impl& impl = *impl_;
  const uint64_t freed = impl.hold.set(lookahead);
  // Outside the graph, as the consumer's releases are (the graph's reserve_wait covers it).
  if (freed != 0) impl.window->decrementer().try_put(static_cast<long long>(freed));
}

void Pipeline::interrupt() { impl_->to_consumer.interrupt(); }

Slot* Pipeline::pop(std::chrono::milliseconds timeout) {
  Impl& impl = *impl_;
  return impl.to_consumer.pop(timeout, impl.shared.patience,
                              [&impl](uint64_t seq) { impl.expedite(seq); });
}

}  // namespace prestage::detail
