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
#include <oneapi/tbb/parallel_for.h>

#include "prestage/error.hpp"
#include "util/file_io.hpp"

namespace prestage::detail {

namespace flow = tbb::flow;
using Clock = std::chrono::steady_clock;

namespace {

uint64_t elapsed_ns(Clock::time_point since) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - since).count();
}

// Stage 2 reads the samples the stage directory declines into memory, up to this many bytes per batch
// (and none larger): a batch's held bytes live until its buffer is decoded.
constexpr uint64_t kReadAheadBytes = uint64_t{64} << 20;
constexpr uint32_t kNotHeld = UINT32_MAX;

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
  std::vector<uint64_t> read_ahead;  // the sample ids stage 2 reads into memory instead
  std::vector<uint32_t> held_at;     // per sample: its index in read_ahead, or kNotHeld
  std::vector<std::vector<std::byte>> held;  // their bytes (capacities kept across batches)
  std::vector<uint8_t> held_ok;              // 1 where stage 2 read them
  std::vector<uint8_t> from_stage;  // kRaw and arrays: where each sample is read from
  std::vector<ArrayProbe> probes;    // arrays: each sample's header, between the two phases
  std::mutex skip_mutex;             // guards the slot's `skipped` while the batch decodes
  bool staging = false;              // at the stager (guarded by the pipeline's stager_mutex)
  std::atomic<bool> in_use{false};
};

// The error of the lowest-numbered failed sample of a batch, whatever the thread timing.
class FirstError {
 public:
  void record(size_t sample, std::exception_ptr error) {
    std::lock_guard lock(mutex_);
    if (sample < sample_) {
      sample_ = sample;
      error_ = std::move(error);
    }
  }
  void record(size_t sample) { record(sample, std::current_exception()); }
  std::exception_ptr get() const { return error_; }

 private:
  std::mutex mutex_;
  size_t sample_ = SIZE_MAX;
  std::exception_ptr error_;
};

// A sample's own failure, which on_error=skip may skip: not a bug or an exhausted machine.
bool sample_failure(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const IoError&) {
    return true;
  } catch (const DecodeError&) {
    return true;
  } catch (...) {
    return false;
  }
}

std::string message(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

// This rank's samples of an epoch, its batches laid end to end: how many, and the one at
// `position`.
uint64_t rank_samples(const EpochPlan& plan, uint64_t batch_size) {
  const uint64_t last = plan.num_batches() - 1;
  return last * batch_size + plan.batch_size(last);
}
uint64_t rank_sample(const EpochPlan& plan, uint64_t batch_size, uint64_t position) {
  return plan.batch(position / batch_size)[position % batch_size];
}

}  // namespace

struct Pipeline::Impl {
  Impl(Shared& s, std::shared_ptr<BatchRing> r, uint64_t first_epoch, uint64_t first_batch);
  ~Impl();

  Ticket next_batch(tbb::flow_control& fc);
  void plan_read_ahead(Work& w);
  // Sample i of the batch read from catalog sample `id`: its bytes if stage 2 read them ahead.
  const std::vector<std::byte>* held(const Work& w, size_t i, uint64_t id) const;
  void stage(Ticket t, StageNode::gateway_type& gateway);
  void expedite(uint64_t seq);
  Ticket decode(Ticket t);
  void decode_images(Work& w, Slot& slot);
  void copy_raw(Work& w, Slot& slot);
  // Raw files, sample i of the batch read from catalog sample `id`: its size (and where it is read
  // from, into w.from_stage[i]), then its bytes into `out`.
  uint64_t raw_size(Work& w, size_t i, uint64_t id);
  void read_raw(Work& w, size_t i, uint64_t id, std::span<std::byte> out);
  void decode_arrays(Work& w, Slot& slot);
  // Arrays, sample i of the batch read from catalog sample `id`: its header into w.probes[i] (and
  // where it is read from into w.from_stage[i]), then its data into `out`.
  void probe_array(Work& w, size_t i, uint64_t id, ReaderState& reader);
  void fill_array(Work& w, size_t i, uint64_t id, ReaderState& reader, std::span<std::byte> out);
  void hand_off(Ticket t);
  // Called in a handler of sample i's failure. on_error=skip: tries `attempt(id)` on the samples
  // that follow sample i in this rank's epoch (see OnError) and makes the first that succeeds
  // sample i of the batch. Otherwise, or if none does, the batch carries the failure.
  template <typename Attempt>
  void replace_or_fail(Work& w, Slot& slot, size_t i, FirstError& first_error,
                       const Attempt& attempt);
  // Calls `call` with the reader's decoder, made on the thread's first use.
  template <typename Call>
  void with_decoder(ReaderState& reader, const Call& call) {
    if (!reader.decoder) reader.decoder = std::make_unique<SampleDecoder>(shared.codec);
    call(*reader.decoder);
  }
  // Reads sample i of the batch from catalog sample `id`: from memory if stage 2 read it ahead, from
  // the stage directory if it is staged there, else from the source.
  std::span<const std::byte> read_sample(const Work& w, size_t i, uint64_t id, ReaderState& reader);
  // The source path of catalog file `file`, built in the reader's own string (no allocation once
  // warm); valid until the reader's next call.
  const std::string& source_path(uint64_t file, ReaderState& reader) const;

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
  uint64_t epoch;
  uint64_t batch;
  std::shared_ptr<const EpochPlan> plan;
  std::vector<std::unique_ptr<Work>> pool;

  std::mutex ready_mutex;
  std::condition_variable ready_cv;
  std::deque<Slot*> ready;
  uint64_t delivered = 0;  // batches popped: the seq of the one the consumer waits for (ready_mutex)
  uint64_t waited_seq = UINT64_MAX;  // the batch the consumer has been waiting for, since when
  Clock::time_point waited_since;

  std::optional<flow::graph> graph;
  std::optional<flow::input_node<Ticket>> source;
  std::optional<flow::limiter_node<Ticket>> window;  // batches between the source and the consumer
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
  const size_t window_size = o.lookahead + o.depth;
  for (size_t i = 0; i < window_size + 1; ++i) {
    auto w = std::make_unique<Work>();
    w->from_stage.reserve(o.batch_size);
    w->files.reserve(o.batch_size);
    pool.push_back(std::move(w));
  }

  shared.arena.execute([&] {
    // Constructed inside the arena, the graph runs its tasks on the arena's `readers` threads.
    graph.emplace();
    flow::graph& g = *graph;

    // Stage 1: the plan, one batch at a time, across epoch boundaries.
    source.emplace(g, [this](tbb::flow_control& fc) { return next_batch(fc); });
    // Back-pressure: a batch enters only when it can be staged and decoded within the window.
    window.emplace(g, window_size);
    // Stage 2 runs on the stager's own threads: a blocking read must not hold a TBB worker.
    staging.emplace(g, flow::unlimited,
                    [this](Ticket t, StageNode::gateway_type& gw) { stage(t, gw); });
    // Batches take buffers in plan order, so a later batch can never hold the buffer that an earlier
    // one (which the consumer waits for) needs.
    staged_in_order.emplace(g, [](Ticket t) { return static_cast<size_t>(t->seq); });
    buffers.emplace(g, o.depth);
    // Stage 3: each batch decodes its samples in parallel on the arena's threads.
    decoding.emplace(g, flow::unlimited, [this](Ticket t) { return decode(t); });
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

    // The consumer's release of a buffer, from outside the graph, is what lets the next batch in.
    graph->reserve_wait();
    ring->set_release_hook([this] {
      window->decrementer().try_put(flow::continue_msg());
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
}

Ticket Pipeline::Impl::next_batch(tbb::flow_control& fc) {
  if (stopping.load(std::memory_order_acquire)) {
    fc.stop();
    return nullptr;
  }
  const auto start = Clock::now();
  if (!plan || batch == plan->num_batches()) {
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
  w.epoch = epoch;
  w.index = batch++;
  w.plan = plan;
  w.ids = plan->batch(w.index);
  w.count = plan->batch_size(w.index);
  w.slot = nullptr;
  // Decided here, in plan order, so that the stage directory's contents follow the plan exactly.
  w.files.clear();
  w.declined.clear();
  EpochStats costs;
  if (shared.cache) {
    shared.cache->admit(w.epoch, w.index, w.ids, w.count, w.files, w.declined, costs);
    if (shared.stager->disabled()) {
      // The stage directory failed: nothing more is copied, so every file not staged is read ahead.
      for (const uint64_t f : w.files) shared.stage_dir->abandon(f);
      w.files.clear();
      w.declined.clear();
      for (size_t k = 0; k < w.count; ++k) {
        const uint64_t file = shared.catalog.locator(w.ids[k]).file;
        if (!shared.stage_dir->is_staged(file)) w.declined.push_back(k);
      }
    }
    plan_read_ahead(w);
  } else {
    costs.misses = w.count;  // no stage directory: every sample is read from the source
    for (size_t i = 0; i < w.count; ++i) {
      const Catalog::Locator loc = shared.catalog.locator(w.ids[i]);
      const uint64_t size =
          loc.length != Catalog::kWholeFile ? loc.length : shared.catalog.file_size(loc.file);
      if (size != Catalog::kUnknownSize) costs.bytes_from_source += size;
    }
    if (!shared.options.stage_dir.empty()) {
      // One was asked for but cannot be used: stage 2 reads the batch ahead into memory instead.
      w.declined.resize(w.count);
      for (size_t k = 0; k < w.count; ++k) w.declined[k] = k;
      plan_read_ahead(w);
    } else {
      w.read_ahead.clear();  // direct reads, the baseline: stage 3 reads everything
      w.held_at.clear();
    }
  }
  {
    std::lock_guard lock(shared.epochs_mutex);
    EpochStats& e = shared.epochs[w.epoch];
    e.epoch = w.epoch;
    e.hits += costs.hits;
    e.misses += costs.misses;
    e.evictions += costs.evictions;
    e.bytes_from_source += costs.bytes_from_source;
  }
  shared.counters.plan_ns.fetch_add(elapsed_ns(start), std::memory_order_relaxed);
  return &w;
}

void Pipeline::Impl::plan_read_ahead(Work& w) {
  w.read_ahead.clear();
  w.held_at.assign(w.count, kNotHeld);
  // Arrays are read by their codecs from a path; JPEG and raw files from bytes in memory.
  if (shared.codec.arrays()) return;
  uint64_t budget = kReadAheadBytes;
  for (const size_t k : w.declined) {
    const Catalog::Locator loc = shared.catalog.locator(w.ids[k]);
    const uint64_t size =
        loc.length != Catalog::kWholeFile ? loc.length : shared.catalog.file_size(loc.file);
    if (size == Catalog::kUnknownSize || size > budget) continue;
    budget -= size;
    w.held_at[k] = static_cast<uint32_t>(w.read_ahead.size());
    w.read_ahead.push_back(w.ids[k]);
  }
  if (w.held.size() < w.read_ahead.size()) w.held.resize(w.read_ahead.size());
  w.held_ok.assign(w.read_ahead.size(), 0);
}

const std::vector<std::byte>* Pipeline::Impl::held(const Work& w, size_t i, uint64_t id) const {
  if (w.held_at.empty() || w.ids[i] != id) return nullptr;  // a replacement (on_error=skip)
  const uint32_t j = w.held_at[i];
  return j != kNotHeld && w.held_ok[j] ? &w.held[j] : nullptr;
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
  t->stage.read_ahead = t->read_ahead.data();
  t->stage.read_ahead_count = t->read_ahead.size();
  t->stage.held = t->held.data();
  t->stage.held_ok = t->held_ok.data();
  t->stage.context = t;
  t->stage.done = [](void* context) {
    Ticket done = static_cast<Ticket>(context);
    // `done` may be recycled once it is put: read what is needed first.
    StageNode::gateway_type* gw = done->gateway;
    Impl* owner = static_cast<Impl*>(done->owner);
    gw->try_put(done);
    gw->release_wait();
    // Notified under the lock: once teardown holds the lock and sees zero, nothing here touches
    // `owner` again.
    std::lock_guard lock(owner->stager_mutex);
    done->staging = false;  // not recycled before the consumer has it: still this batch's
    if (--owner->at_stager == 0) owner->stager_cv.notify_all();
  };
  shared.stager->submit(&t->stage);
}

Ticket Pipeline::Impl::decode(Ticket t) {
  Slot& slot = *ring->acquire();
  t->slot = &slot;
  slot.epoch = t->epoch;
  slot.index = t->index;
  slot.error = nullptr;
  slot.skipped.clear();
  slot.indices.assign(t->ids, t->ids + t->count);
  slot.labels.resize(t->count);
  for (size_t i = 0; i < t->count; ++i) slot.labels[i] = shared.catalog.label(t->ids[i]);
  if (stopping.load(std::memory_order_acquire)) return t;  // nobody will look at it
  if (shared.codec.mode == DecodeMode::kJpeg) {
    decode_images(*t, slot);
  } else if (shared.codec.arrays()) {
    decode_arrays(*t, slot);
  } else {
    copy_raw(*t, slot);
  }
  // Recorded in thread order: listed in batch order.
  std::sort(slot.skipped.begin(), slot.skipped.end(),
            [](const Slot::Skip& a, const Slot::Skip& b) { return a.position < b.position; });
  shared.counters.decoded.fetch_add(t->count, std::memory_order_relaxed);
  return t;
}

template <typename Attempt>
void Pipeline::Impl::replace_or_fail(Work& w, Slot& slot, size_t i, FirstError& first_error,
                                     const Attempt& attempt) {
  const std::exception_ptr error = std::current_exception();
  if (shared.options.on_error != OnError::kSkip || !sample_failure(error)) {
    first_error.record(i, error);
    return;
  }
  // Candidates come from the plan alone, tried in a fixed order: the same run skips alike for any
  // thread counts. This rank's own samples: the ones its stager copies.
  const uint64_t batch_size = shared.options.batch_size;
  const uint64_t samples = rank_samples(*w.plan, batch_size);
  const uint64_t position = w.index * batch_size + i;
  const uint64_t tries = std::min(samples - 1, kSkipCandidates);
  for (uint64_t k = 1; k <= tries; ++k) {
    if (stopping.load(std::memory_order_acquire)) break;  // nobody will look at the batch
    const uint64_t candidate = rank_sample(*w.plan, batch_size, (position + k) % samples);
    try {
      attempt(candidate);
    } catch (...) {
      if (sample_failure(std::current_exception())) continue;
      first_error.record(i);
      return;
    }
    std::lock_guard lock(w.skip_mutex);
    // Arrays and raw samples may be replaced twice (the first replacement failing in the second
    // phase): the plan's sample is listed once.
    if (std::none_of(slot.skipped.begin(), slot.skipped.end(),
                     [&](const Slot::Skip& s) { return s.position == i; })) {
      slot.skipped.push_back({i, w.ids[i], message(error)});
    }
    slot.indices[i] = static_cast<int64_t>(candidate);
    slot.labels[i] = shared.catalog.label(candidate);
    return;
  }
  first_error.record(i, error);
}

const std::string& Pipeline::Impl::source_path(uint64_t file, ReaderState& reader) const {
  reader.path.assign(shared.catalog.root().native());
  if (!reader.path.empty() && reader.path.back() != '/') reader.path += '/';
  reader.path += shared.catalog.file_path(file);
  return reader.path;
}

std::span<const std::byte> Pipeline::Impl::read_sample(const Work& w, size_t i, uint64_t id,
                                                       ReaderState& reader) {
  if (const auto* bytes = held(w, i, id)) {
    shared.counters.misses.fetch_add(1, std::memory_order_relaxed);
    shared.counters.misses_read_ahead.fetch_add(1, std::memory_order_relaxed);
    shared.counters.bytes_from_source.fetch_add(bytes->size(), std::memory_order_relaxed);
    return *bytes;
  }
  const Catalog::Locator loc = shared.catalog.locator(id);
  if (shared.stage_dir && shared.stage_dir->is_staged(loc.file)) {
    try {
      read_located(shared.stage_dir->staged_path(loc.file), loc, reader.buffer);
      shared.counters.hits.fetch_add(1, std::memory_order_relaxed);
      shared.counters.bytes_from_stage.fetch_add(reader.buffer.size(), std::memory_order_relaxed);
      return reader.buffer;
    } catch (const IoError&) {
      // The copy vanished (the stage directory was cleaned or lost): read the source instead.
    }
  }
  read_located(source_path(loc.file, reader), loc, reader.buffer);
  shared.counters.misses.fetch_add(1, std::memory_order_relaxed);
  shared.counters.bytes_from_source.fetch_add(reader.buffer.size(), std::memory_order_relaxed);
  return reader.buffer;
}

void Pipeline::Impl::decode_images(Work& w, Slot& slot) {
  const ImageSize size = shared.image_size;
  const size_t image_bytes = shared.image_bytes;
  const LoaderOptions& o = shared.options;
  const bool nchw = o.layout == Layout::kNCHW;
  // NHWC uint8 is what the codec writes: straight into the batch buffer. Anything else goes through
  // the reader's RGB image and is converted into place.
  const bool direct = !nchw && o.dtype == OutputType::kUint8;
  const size_t rgb_bytes = size_t{size.height} * size.width * 3;
  slot.shape = nchw ? std::array<size_t, 4>{w.count, 3, size.height, size.width}
                    : std::array<size_t, 4>{w.count, size.height, size.width, 3};
  slot.dtype = o.dtype == OutputType::kFloat32 ? "<f4" : "|u1";
  slot.ragged = false;
  slot.data_bytes = w.count * image_bytes;
  slot.offsets.resize(w.count + 1);
  slot.dims.resize(w.count * 3);
  slot.dim_offsets.resize(w.count + 1);
  for (size_t i = 0; i <= w.count; ++i) {
    slot.offsets[i] = i * image_bytes;
    slot.dim_offsets[i] = i * 3;
    if (i == w.count) break;
    for (size_t d = 0; d < 3; ++d) slot.dims[i * 3 + d] = slot.shape[d + 1];
  }
  FirstError first_error;
  tbb::parallel_for(size_t{0}, w.count, [&](size_t i) {
    const auto start = Clock::now();
    ReaderState& reader = shared.readers.local();
    std::byte* const place = slot.data.data() + i * image_bytes;
    const auto decode_into_place = [&](uint64_t id) {
      const auto bytes = read_sample(w, i, id, reader);
      shared.counters.bytes_read.fetch_add(bytes.size(), std::memory_order_relaxed);
      if (!direct && reader.image.size() < rgb_bytes) reader.image.resize(rgb_bytes);
      const std::span<std::byte> rgb(
          direct ? place : reinterpret_cast<std::byte*>(reader.image.data()), rgb_bytes);
      const std::string& path = source_path(shared.catalog.locator(id).file, reader);
      with_decoder(reader, [&](SampleDecoder& decoder) {
        const auto jpeg = decoder.image_payload(bytes, path);
        if (o.image_size.empty()) {
          decoder.jpeg.decode_exact(jpeg, size, rgb, path);
        } else if (o.transform == Transform::kRandomResizedCrop) {
          decoder.jpeg.decode_random_crop(jpeg, size, o.seed, w.epoch, id, rgb, path);
        } else {
          decoder.jpeg.decode_resized(jpeg, size, rgb, path);
        }
      });
      if (!direct) {
        convert_image(reader.image.data(), static_cast<int>(size.height),
                      static_cast<int>(size.width), o.layout, o.dtype, *shared.normalizer, place);
      }
    };
    try {
      decode_into_place(w.ids[i]);
    } catch (...) {
      replace_or_fail(w, slot, i, first_error, decode_into_place);
    }
    shared.counters.decode_ns.fetch_add(elapsed_ns(start), std::memory_order_relaxed);
  });
  slot.error = first_error.get();
}

void Pipeline::Impl::decode_arrays(Work& w, Slot& slot) {
  FirstError first_error;
  w.probes.resize(w.count);
  w.from_stage.assign(w.count, 0);
  slot.shape = {w.count, 0, 0, 0};
  slot.data_bytes = 0;
  slot.ragged = false;
  slot.offsets.assign(w.count + 1, 0);
  slot.dim_offsets.assign(w.count + 1, 0);
  slot.dims.clear();
  // Phase 1: every sample's header, so that the batch buffer is sized once.
  tbb::parallel_for(size_t{0}, w.count, [&](size_t i) {
    const auto start = Clock::now();
    ReaderState& reader = shared.readers.local();
    try {
      probe_array(w, i, w.ids[i], reader);
    } catch (...) {
      replace_or_fail(w, slot, i, first_error,
                      [&](uint64_t id) { probe_array(w, i, id, reader); });
    }
    shared.counters.decode_ns.fetch_add(elapsed_ns(start), std::memory_order_relaxed);
  });
  if ((slot.error = first_error.get())) return;

  // The batch's layout: one (N, *shape) array when the shapes agree, else ragged.
  const ArrayInfo& first = w.probes[0].info;
  slot.dtype = first.dtype;
  uint64_t total = 0;
  for (size_t i = 0; i < w.count; ++i) {
    const ArrayInfo& info = w.probes[i].info;
    const char* problem = info.dtype != first.dtype
                              ? "its dtype differs from the batch's first sample's"
                          : info.bytes > SIZE_MAX - total ? "the batch is too large for memory"
                                                          : nullptr;
    if (problem != nullptr) {
      slot.error = std::make_exception_ptr(
          DecodeError(shared.catalog.source_path(slot.indices[i]).string(),
                      std::string(problem) + " (" + info.dtype + " vs " + first.dtype + ")"));
      return;
    }
    if (!info.same_layout(first)) slot.ragged = true;
    total += info.bytes;
    slot.offsets[i + 1] = total;
    for (const uint64_t d : info.dims()) slot.dims.push_back(d);
    slot.dim_offsets[i + 1] = slot.dims.size();
  }
  try {
    slot.data.reserve(static_cast<size_t>(total));
  } catch (const std::bad_alloc&) {
    // No exception may leave a graph node: the batch carries it to the consumer.
    slot.error = std::current_exception();
    return;
  }
  slot.data_bytes = static_cast<size_t>(total);

  // Phase 2: each array straight into its place.
  tbb::parallel_for(size_t{0}, w.count, [&](size_t i) {
    const auto start = Clock::now();
    ReaderState& reader = shared.readers.local();
    std::span<std::byte> out(slot.data.data() + slot.offsets[i],
                             slot.offsets[i + 1] - slot.offsets[i]);
    try {
      fill_array(w, i, static_cast<uint64_t>(slot.indices[i]), reader, out);
    } catch (...) {
      // The batch is laid out: a replacement must fit this sample's place.
      const ArrayInfo place = w.probes[i].info;
      replace_or_fail(w, slot, i, first_error, [&](uint64_t id) {
        probe_array(w, i, id, reader);
        if (!w.probes[i].info.same_layout(place)) {
          throw DecodeError(shared.catalog.source_path(id).string(),
                            "its dtype or shape differs from the failed sample's");
        }
        fill_array(w, i, id, reader, out);
      });
    }
    shared.counters.decode_ns.fetch_add(elapsed_ns(start), std::memory_order_relaxed);
  });
  slot.error = first_error.get();
}

void Pipeline::Impl::probe_array(Work& w, size_t i, uint64_t id, ReaderState& reader) {
  const Catalog::Locator loc = shared.catalog.locator(id);
  const std::string& path = source_path(loc.file, reader);
  w.from_stage[i] = 0;
  if (shared.stage_dir && shared.stage_dir->is_staged(loc.file)) {
    try {
      const std::string staged = shared.stage_dir->staged_path(loc.file);
      with_decoder(reader, [&](SampleDecoder& d) {
        d.probe(SampleLocation{staged, path, loc}, w.probes[i]);
      });
      w.from_stage[i] = 1;
      return;
    } catch (const IoError&) {
      // The copy vanished: read the source instead.
    }
  }
  with_decoder(reader,
               [&](SampleDecoder& d) { d.probe(SampleLocation{path, path, loc}, w.probes[i]); });
}

void Pipeline::Impl::fill_array(Work& w, size_t i, uint64_t id, ReaderState& reader,
                                std::span<std::byte> out) {
  const Catalog::Locator loc = shared.catalog.locator(id);
  const std::string& path = source_path(loc.file, reader);
  auto& counters = shared.counters;
  if (w.from_stage[i]) {
    try {
      const std::string staged = shared.stage_dir->staged_path(loc.file);
      with_decoder(reader, [&](SampleDecoder& d) {
        d.fill(SampleLocation{staged, path, loc}, w.probes[i], out);
      });
      counters.hits.fetch_add(1, std::memory_order_relaxed);
      counters.bytes_from_stage.fetch_add(out.size(), std::memory_order_relaxed);
    } catch (const IoError&) {
      w.from_stage[i] = 0;  // the copy vanished since it was probed: the source has the same bytes
    }
  }
  if (!w.from_stage[i]) {
    with_decoder(reader, [&](SampleDecoder& d) {
      d.fill(SampleLocation{path, path, loc}, w.probes[i], out);
    });
    counters.misses.fetch_add(1, std::memory_order_relaxed);
    counters.bytes_from_source.fetch_add(out.size(), std::memory_order_relaxed);
  }
  // Decoded bytes: what a compressed sample took on disk is not tracked per read.
  counters.bytes_read.fetch_add(out.size(), std::memory_order_relaxed);
}

void Pipeline::Impl::copy_raw(Work& w, Slot& slot) {
  // The batch's size is known only once every sample's size is: take the sizes, lay the samples out
  // back to back, then read each straight into its place.
  FirstError first_error;
  w.from_stage.assign(w.count, 0);
  slot.offsets.assign(w.count + 1, 0);
  tbb::parallel_for(size_t{0}, w.count, [&](size_t i) {
    const auto size_sample = [&](uint64_t id) { slot.offsets[i + 1] = raw_size(w, i, id); };
    try {
      size_sample(w.ids[i]);
    } catch (...) {
      replace_or_fail(w, slot, i, first_error, size_sample);
    }
  });
  if ((slot.error = first_error.get())) return;
  // Each sample is a 1-D uint8 array of its length.
  slot.dtype = "|u1";
  slot.ragged = false;
  slot.dims.resize(w.count);
  slot.dim_offsets.resize(w.count + 1);
  for (size_t i = 0; i <= w.count; ++i) {
    slot.dim_offsets[i] = i;
    if (i == w.count) break;
    slot.dims[i] = slot.offsets[i + 1];
    slot.ragged = slot.ragged || slot.dims[i] != slot.dims[0];
  }
  for (size_t i = 0; i < w.count; ++i) slot.offsets[i + 1] += slot.offsets[i];
  try {
    slot.data.reserve(slot.offsets[w.count]);
  } catch (const std::bad_alloc&) {
    slot.error = std::current_exception();  // carried to the consumer, as any sample's error
    return;
  }
  slot.data_bytes = slot.offsets[w.count];
  slot.shape = {w.count, 0, 0, 0};
  tbb::parallel_for(size_t{0}, w.count, [&](size_t i) {
    const auto start = Clock::now();
    std::span<std::byte> out(slot.data.data() + slot.offsets[i], slot.offsets[i + 1] - slot.offsets[i]);
    try {
      read_raw(w, i, static_cast<uint64_t>(slot.indices[i]), out);
    } catch (...) {
      // The batch is laid out: a replacement must have this sample's size.
      replace_or_fail(w, slot, i, first_error, [&](uint64_t id) {
        if (raw_size(w, i, id) != out.size()) {
          throw DecodeError(shared.catalog.source_path(id).string(),
                            "its size differs from the failed sample's");
        }
        read_raw(w, i, id, out);
      });
    }
    shared.counters.decode_ns.fetch_add(elapsed_ns(start), std::memory_order_relaxed);
  });
  slot.error = first_error.get();
}

uint64_t Pipeline::Impl::raw_size(Work& w, size_t i, uint64_t id) {
  const Catalog::Locator loc = shared.catalog.locator(id);
  w.from_stage[i] = 0;
  if (const auto* bytes = held(w, i, id)) return bytes->size();
  if (shared.stage_dir && shared.stage_dir->is_staged(loc.file)) {
    try {
      const uint64_t size = loc.length != Catalog::kWholeFile
                                ? loc.length
                                : file_size(shared.stage_dir->staged_path(loc.file));
      w.from_stage[i] = 1;
      return size;
    } catch (const IoError&) {
    }
  }
  return loc.length != Catalog::kWholeFile
             ? loc.length
             : file_size(shared.catalog.file_source_path(loc.file).string());
}

void Pipeline::Impl::read_raw(Work& w, size_t i, uint64_t id, std::span<std::byte> out) {
  const Catalog::Locator loc = shared.catalog.locator(id);
  auto& counters = shared.counters;
  if (w.from_stage[i]) {
    try {
      read_located(shared.stage_dir->staged_path(loc.file), loc, out);
      counters.hits.fetch_add(1, std::memory_order_relaxed);
      counters.bytes_from_stage.fetch_add(out.size(), std::memory_order_relaxed);
    } catch (const IoError&) {
      w.from_stage[i] = 0;  // the copy vanished since it was sized: the source has the same bytes
    }
  }
  const auto* bytes = w.from_stage[i] ? nullptr : held(w, i, id);
  if (bytes != nullptr) {
    std::copy(bytes->begin(), bytes->end(), out.begin());  // raw_size gave its size
    counters.misses.fetch_add(1, std::memory_order_relaxed);
    counters.misses_read_ahead.fetch_add(1, std::memory_order_relaxed);
    counters.bytes_from_source.fetch_add(out.size(), std::memory_order_relaxed);
  } else if (!w.from_stage[i]) {
    read_located(shared.catalog.file_source_path(loc.file).string(), loc, out);
    counters.misses.fetch_add(1, std::memory_order_relaxed);
    counters.bytes_from_source.fetch_add(out.size(), std::memory_order_relaxed);
  }
  counters.bytes_read.fetch_add(out.size(), std::memory_order_relaxed);
}

void Pipeline::Impl::hand_off(Ticket t) {
  Slot* slot = t->slot;
  t->plan.reset();
  t->in_use.store(false, std::memory_order_release);  // the source may now recycle it
  {
    std::lock_guard lock(ready_mutex);
    ready.push_back(slot);
  }
  ready_cv.notify_one();
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

Slot* Pipeline::pop(std::chrono::milliseconds timeout) {
  Impl& impl = *impl_;
  const auto deadline = Clock::now() + timeout;
  const auto ready = [&] { return !impl.ready.empty(); };
  std::unique_lock lock(impl.ready_mutex);
  const uint64_t patience_ms = impl.shared.options.stage_patience_ms;
  if (!ready() && patience_ms != LoaderOptions::kWaitForStaging) {
    const uint64_t wanted = impl.delivered;
    if (impl.waited_seq != wanted) {
      impl.waited_seq = wanted;
      impl.waited_since = Clock::now();
    }
    const auto patience_ends = impl.waited_since + std::chrono::milliseconds(patience_ms);
    if (patience_ends < deadline && !impl.ready_cv.wait_until(lock, patience_ends, ready)) {
      lock.unlock();
      impl.expedite(wanted);
      lock.lock();
    }
  }
  if (!impl.ready_cv.wait_until(lock, deadline, ready)) return nullptr;
  Slot* slot = impl.ready.front();
  impl.ready.pop_front();
  ++impl.delivered;
  return slot;
}

}  // namespace prestage::detail
