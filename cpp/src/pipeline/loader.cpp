#include "prestage/loader.hpp"

#include <malloc.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>

#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/info.h>

#include "prestage/error.hpp"
#include "pipeline/graph.hpp"
#include "pipeline/machine.hpp"
#include "pipeline/tuner.hpp"
#include "formats/tfrecord.hpp"
#include "util/file_io.hpp"

namespace prestage {

namespace {

// LoaderOptions::kFitFreeSpace: no bound (0) if the data set fits in 90% of the stage directory's room
// (its file system's free space and what the directory takes already: copies and its own files),
// else that 90%. The directory counts what the disk charges (`dir` was made with the file system's
// block): each copy in whole blocks, copies being written, and its index as it grows.
uint64_t fit_free_space(detail::StageDirectory& dir, const Catalog& catalog) {
  struct statvfs fs;
  if (::statvfs(dir.path().c_str(), &fs) != 0) return 0;  // cannot tell: a full disk is handled anyway
  const uint64_t own = dir.own_files_bytes();
  uint64_t room = static_cast<uint64_t>(fs.f_bavail) * std::max<uint64_t>(fs.f_frsize, 1) + own;
  uint64_t data = own;  // UINT64_MAX: a size unknown
  for (uint64_t f = 0; f < catalog.num_files(); ++f) {
    if (dir.is_staged(f)) room += dir.charge(dir.staged_size(f));
    const uint64_t size = catalog.file_size(f);
    const bool unknown = size == Catalog::kUnknownSize || data == UINT64_MAX;
    data = unknown ? UINT64_MAX : data + dir.charge(size);
  }
  // The index grows by a record per copy made: room for a record per file is kept out of the bound.
  const uint64_t records = dir.charge(catalog.num_files() * 40);
  const uint64_t usable = room / 10 * 9;
  if (data != UINT64_MAX && data + records <= usable) return 0;
  return std::max<uint64_t>(usable, 1);
}

}  // namespace

namespace detail {

Shared::Shared(Catalog catalog_in, const LoaderOptions& options_in, uint64_t readers_max_in,
               uint64_t lookahead_max_in)
    : catalog(std::move(catalog_in)),
      options(options_in),
      readers_max(std::max(readers_max_in, options.readers)),
      lookahead_max(std::max(lookahead_max_in, options.lookahead)),
      lookahead(options.lookahead),
      // No slot is reserved for an outside thread: all slots go to worker threads.
      arena(static_cast<int>(readers_max), 0) {
  plan.num_samples = catalog.size();
  plan.batch_size = options.batch_size;
  plan.seed = options.seed;
  plan.shuffle = options.shuffle;
  plan.drop_last = options.drop_last;
  plan.rank = options.rank;
  plan.world_size = options.world_size;
  plan.resume = options.resume;
}

namespace {

// The process in which a loader first started its threads (0: none yet). oneTBB's worker threads
// are not copied into a process forked from it, but its scheduler's state is: a pipeline started
// there would wait for ever for workers that do not exist (and might find a lock that one of them
// held at the fork). So no loader runs in such a process: it is refused at construction, and at
// the start of a loader copied into it (threads_can_start).
std::atomic<pid_t> g_threads_started_in{0};

// Throws prestage::Error, saying what to do instead, in a process forked from one whose loader
// started its threads.
void threads_can_start() {
  const pid_t parent = g_threads_started_in.load(std::memory_order_acquire);
  if (parent == 0 || parent == ::getpid()) return;
  throw Error("this process (" + std::to_string(::getpid()) + ") was forked from process " +
              std::to_string(parent) +
              " after a loader started its threads there; their pool (oneTBB) is copied into a "
              "forked process without its threads, so no loader can run here: make this loader in "
              "a process started by spawn or forkserver (multiprocessing.get_context(\"spawn\"), a "
              "DataLoader's multiprocessing_context=\"spawn\"), or fork before a loader of the "
              "parent iterates");
}

// oneTBB starts at most (cores - 1) worker threads unless told otherwise; stage 3 needs `readers`
// workers of its own whatever the core count. Only raised, never lowered, for the process's life.
void allow_workers(size_t workers) {
  static std::mutex mutex;
  static size_t allowed = 0;
  // Deliberately never destroyed: the limit must outlive every loader, up to process exit.
  static tbb::global_control* control = nullptr;
  std::lock_guard lock(mutex);
  const size_t want = std::max(workers + 1, static_cast<size_t>(tbb::info::default_concurrency()));
  if (want <= allowed) return;
  // While several controls live the smallest wins, so the old one goes once the new one is in place.
  auto* raised = new tbb::global_control(tbb::global_control::max_allowed_parallelism, want);
  delete control;
  control = raised;
  allowed = want;
}

size_t checked_mul(size_t a, size_t b, const char* what) {
  if (a != 0 && b > SIZE_MAX / a) throw ConfigError(std::string(what) + " is too large");
  return a * b;
}

}  // namespace
}  // namespace detail

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
  // What size_to_machine() chose, for stats().
  std::string threads_why;
  uint64_t usable_cpus = 0;
  uint64_t local_ranks = 0;
  uint64_t memory_budget = 0;  // the self-tuning's
  detail::TuneLimits tune_limits;
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
  std::deque<std::string> tuning_log;  // the latest Stats::kMaxTuningListed decisions
  std::vector<std::string> tuning_unread;  // decisions take_tuning_log() has not returned yet
  TuneWindow tune_now() const;  // needs `state` held
  void tune();                  // after a batch is delivered; needs `state` held
  void start_tuner(const std::array<bool, detail::kKnobs>& pinned);
};

Loader::Impl::Impl(Catalog catalog_in, LoaderOptions options_in)
    : catalog(std::move(catalog_in)), options(std::move(options_in)) {
  options.validate();
  detail::threads_can_start();
  // Values the user gave are never tuned.
  const std::array<bool, detail::kKnobs> pinned{options.readers != LoaderOptions::kAuto,
                                                options.prefetchers != LoaderOptions::kAuto,
                                                options.lookahead != LoaderOptions::kAuto};
  std::string cpus_why, ranks_why, memory_why;
  usable_cpus = detail::usable_cpus(cpus_why);
  local_ranks = detail::local_ranks(ranks_why);
  detail::size_to_machine(options, usable_cpus, local_ranks, threads_why);
  if (!threads_why.empty()) threads_why += ": " + cpus_why + "; " + ranks_why;
  if (catalog.size() == 0) throw ConfigError("the catalog is empty");
  memory_budget = options.memory_budget != 0
                      ? options.memory_budget
                      : detail::usable_memory(memory_why) / 4 / std::max<uint64_t>(1, local_ranks);
  // Mean sizes from up to 1024 files spread over the catalog.
  uint64_t probed = 0, probed_bytes = 0;
  const uint64_t files = catalog.num_files();
  for (uint64_t k = 0; k < std::min<uint64_t>(files, 1024); ++k) {
    const uint64_t size = catalog.file_size(k * files / std::min<uint64_t>(files, 1024));
    if (size == Catalog::kUnknownSize) continue;
    ++probed;
    probed_bytes += size;
  }
  const uint64_t mean_file = probed == 0 ? 0 : probed_bytes / probed;
  const uint64_t mean_sample =
      mean_file == 0 ? 0 : static_cast<uint64_t>(static_cast<double>(mean_file) *
                                                  static_cast<double>(files) /
                                                  static_cast<double>(catalog.size()));
  std::string fit_why;
  detail::fit_to_memory(options, pinned, memory_budget, mean_file, mean_sample, fit_why);
  if (!fit_why.empty()) threads_why += "; " + fit_why;
  tune_limits = detail::tune_limits(options, pinned, usable_cpus, local_ranks, memory_budget,
                                    mean_file, mean_sample);
  shared = std::make_unique<detail::Shared>(catalog, options, tune_limits.readers,
                                            tune_limits.lookahead);
  const LoaderOptions& o = shared->options;
  batches_per_epoch = prestage::batches_per_epoch(shared->plan);
  resumed_batches = prestage::batches_in_epoch(shared->plan, o.resume.epoch);
  if (batches_per_epoch == 0) {
    throw ConfigError("no batch per epoch: " + std::to_string(shared->catalog.size()) +
                      " samples are fewer than batch_size x world_size and drop_last is set");
  }

  shared->codec = detail::Codec::choose(shared->catalog, o);

  if (!o.stage_dir.empty()) {
    const detail::StageAccess access =
        detail::StageAccess::of(o.stage_group);  // ConfigError: no such group
    try {
      // With the default bound, the directory counts what the disk charges (0: its block); a bound
      // given is one on the copies' bytes.
      shared->stage_dir = std::make_unique<detail::StageDirectory>(
          o.stage_dir, shared->catalog, o.cache_bytes == LoaderOptions::kFitFreeSpace ? 0 : 1,
          access);
      // Files of the batches in flight (planned, not yet decoded) are never evicted: the window of
      // the pipeline, plus the batch the source holds when the window is full, plus the current one.
      // With processes sharing the directory, the bound is on the bytes of all their copies.
      // A directory that cannot be written only serves the copies in it: nothing to bound.
      const uint64_t bound = shared->stage_dir->read_only() ? 0
                             : o.cache_bytes == LoaderOptions::kFitFreeSpace
                                 ? fit_free_space(*shared->stage_dir, shared->catalog)
                                 : o.cache_bytes;
      // A bounded directory evicts in plan order around the batches in flight, a window fixed
      // here: the self-tuning leaves lookahead as it is then.
      if (bound != 0) shared->lookahead_max = o.lookahead;
      shared->cache = std::make_unique<detail::StageCache>(shared->catalog, shared->plan,
                                                           *shared->stage_dir, bound, o.eviction,
                                                           shared->lookahead_max + o.depth + 2);
    } catch (const detail::UnsafePath&) {
      // Another user's area (or one others can write): never used, and not quietly replaced by
      // reads of the source either: the job asked for staging, and its user must choose.
      throw;
    } catch (const IoError& e) {
      // A stage directory that cannot be used is not fatal: stage 2 reads ahead into memory.
      stage_dir_error = e.what();
    }
  }
  // A TFRecord record is read with its framing.
  const uint64_t max_read = o.max_sample_bytes > UINT64_MAX - detail::kFramingBytes
                                ? UINT64_MAX
                                : o.max_sample_bytes + (shared->catalog.kind() == Catalog::Kind::kTfrecord
                                                            ? detail::kFramingBytes
                                                            : 0);
  shared->tiers = std::make_unique<detail::Tiers>(shared->catalog, shared->stage_dir.get(), max_read);
  if (!o.trace.empty()) {
    shared->trace = std::make_unique<detail::IoTrace>(o.trace, shared->catalog.root().string(),
                                                      shared->catalog.num_files());
    shared->tiers->set_trace(shared->trace.get());
  }
  if (o.peers) {
    // Collective: every rank of the job gets here (the tier may still turn out off, on all).
    detail::PeerOptions peer_options;
    peer_options.timeout = std::chrono::milliseconds(o.peer_timeout_ms);
    peer_options.comm = o.peer_comm;
    peer_options.comm_fortran = o.peer_comm_fortran;
    const uint64_t home_budget = shared->cache ? shared->cache->capacity() : 0;
    shared->peers = std::make_unique<detail::Peers>(shared->catalog, shared->plan,
                                                    shared->stage_dir.get(), home_budget, peer_options);
    if (shared->peers->on()) {
      peer_home = ::getpid();
      const bool fewest = o.pfs_reads == PfsReads::kFewest;
      shared->tiers->set_peers(shared->peers.get(), fewest);
      detail::Peers* peers = shared->peers.get();
      if (shared->cache) {
        shared->cache->set_on_declined([peers](uint64_t f) { peers->not_coming(f); });
        const detail::Tiers* tiers = shared->tiers.get();
        using Layout = detail::StageCache::HomeLayout;
        using Links = detail::SourceModel::Links;
        shared->cache->set_home_first([peers](uint64_t f) { return peers->home_here(f); },
                                      [tiers] {
                                        // Fewest PFS reads: a home copy kept saves one.
                                        if (tiers->home_first()) return Layout::kHomeFirst;
                                        return tiers->links() == Links::kUnknown
                                                   ? Layout::kUndecided
                                                   : Layout::kOwnFirst;
                                      });
      }
      // A home copy is made by stage 2 in the start epoch: stage 3 waits for it rather than reading
      // the source itself, so that the source is read once. Set in the one copy, before any thread
      // starts: options() reports the patience the pipeline uses.
      options.stage_patience_ms = LoaderOptions::kWaitForStaging;
    }
  }
  if (o.decode == DecodeMode::kJpeg) {
    // Without an image_size each image keeps its own size: stage 3 reads it from the image's header,
    // and the batch buffers grow to the batches' sizes as they do for arrays.
    const ImageSize size = o.image_size;
    shared->image_size = size;
    image_size = size;
    if (!size.empty()) {
      if (static_cast<uint64_t>(size.height) * size.width > o.max_pixels) {
        throw ConfigError("image_size exceeds max_pixels");
      }
      detail::checked_mul(detail::checked_mul(size.height, size.width, "image_size"), 12,
                          "image_size");
      shared->image_bytes = detail::image_sample_bytes(size.height, size.width, o.dtype);
      // decode_device=cuda: the images are born on the device; the host buffers hold none.
      slot_bytes = o.decode_device == DecodeDevice::kCuda
                       ? 0
                       : detail::checked_mul(shared->image_bytes, o.batch_size,
                                             "batch_size x image size");
    }
    if (o.dtype == OutputType::kFloat32) shared->normalizer = std::make_unique<detail::Normalizer>(o);
  }

  shared->decoder = std::make_unique<detail::BatchDecoder>(shared->options, shared->codec,
                                                          shared->image_size,
                                                          shared->normalizer.get(), *shared->tiers);
  ring = std::make_shared<detail::BatchRing>(o.depth, o.batch_size, slot_bytes, o.decode);
  shared->set_readers(o.readers);
  if (o.autotune) start_tuner(pinned);
}

void Loader::Impl::start_tuner(const std::array<bool, detail::kKnobs>& pinned) {
  const LoaderOptions& o = shared->options;
  // Stage 2 has threads wherever a stage directory was asked for (see restart()).
  const bool staged = !o.stage_dir.empty();
  const std::array<detail::Knob, detail::kKnobs> knobs{
      detail::Knob{o.readers, shared->readers_max, pinned[0]},
      detail::Knob{staged ? o.prefetchers : 0, staged ? tune_limits.prefetchers : 0, pinned[1]},
      detail::Knob{o.lookahead, shared->lookahead_max, pinned[2]}};
  if (std::none_of(knobs.begin(), knobs.end(), [](const detail::Knob& k) { return k.tunable(); })) {
    return;
  }
  tuner.emplace(knobs);
}

Loader::Impl::TuneWindow Loader::Impl::tune_now() const {
  TuneWindow w;
  w.start = Clock::now();
  w.batches = batches;
  w.stall_ns = stall_ns;
  w.decode_ns = shared->decoder->busy_ns();
  w.stage_ns = shared->stager ? shared->stager->busy_ns() : 0;
  rusage usage{};
  if (::getrusage(RUSAGE_SELF, &usage) == 0) {
    w.cpu_s = static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
              static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
  }
  return w;
}

void Loader::Impl::tune() {
  if (!tuner) return;
  if (tune_from.start == Clock::time_point{}) {
    tune_from = tune_now();  // the first batch: the pipeline has filled
    return;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - tune_from.start).count();
  if (!tuner->due(seconds, batches - tune_from.batches)) return;
  const TuneWindow now = tune_now();
  detail::TunerWindow w;
  w.seconds = std::chrono::duration<double>(now.start - tune_from.start).count();
  w.batches = now.batches - tune_from.batches;
  w.consumer_wait_s = static_cast<double>(now.stall_ns - tune_from.stall_ns) * 1e-9;
  w.decode_busy_s = static_cast<double>(now.decode_ns - tune_from.decode_ns) * 1e-9;
  w.stage_busy_s = static_cast<double>(now.stage_ns - tune_from.stage_ns) * 1e-9;
  w.cpu_s = now.cpu_s - tune_from.cpu_s;
  w.cpus = usable_cpus;
  tune_from = now;
  const std::optional<detail::TuneChange> change = tuner->observe(w);
  if (!change) return;
  switch (change->knob) {
    case detail::KnobId::kDecode:
      shared->set_readers(change->to);
      // decode_device=cuda: the CPU's share of each batch follows, not a few batches later.
      shared->decoder->readers_changed(change->from, change->to);
      break;
    case detail::KnobId::kReads:
      if (shared->stager) shared->stager->set_threads(change->to);
      break;
    case detail::KnobId::kLookahead:
      shared->lookahead.store(change->to, std::memory_order_relaxed);
      if (pipeline) pipeline->set_lookahead(change->to);
      break;
  }
  if (shared->trace) {
    shared->trace->add_tuning(static_cast<uint8_t>(change->knob), change->from, change->to);
  }
  char at[32];
  std::snprintf(at, sizeof(at), "%.1f s: ",
                std::chrono::duration<double>(now.start - started).count());
  std::string line = at + std::string(detail::knob_name(change->knob)) + " " +
                     std::to_string(change->from) + " -> " + std::to_string(change->to) + " (" +
                     change->why + ")";
  tuning_log.push_back(line);
  if (tuning_log.size() > Stats::kMaxTuningListed) tuning_log.pop_front();
  if (tuning_unread.size() < Stats::kMaxTuningListed) tuning_unread.push_back(std::move(line));
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
      detail::g_threads_started_in.store(::getpid(), std::memory_order_release);
      owner.store(::getpid(), std::memory_order_release);
      started = Clock::now();
      detail::allow_workers(shared->readers_max);
      const std::chrono::milliseconds timeout(shared->options.io_timeout_ms);
      shared->scheduler = tbb::task_scheduler_handle(tbb::attach{});
      shared->arena.initialize();
      shared->arena_io_timeout.emplace(shared->arena, timeout, &shared->stopping_io);
      // Threads wherever a stage directory was asked for: an unusable one still reads ahead.
      // A file that a neighbour sharing the stage directory is copying is waited for as long as
      // stage 3 would wait for its batch (stage_patience), else as long as a read may take. With
      // the peer tier on (stage 3 always waits), a neighbour's copy may wait up to peer_timeout on
      // a peer before it reads the source; a neighbour that holds a copy's lock for twice that has
      // stalled (stopped, hung), and the copy is given up (stage 3 reads the sample itself) rather
      // than waited for without end.
      const LoaderOptions& o = shared->options;
      const bool peers_on = shared->peers && shared->peers->on();
      const std::chrono::milliseconds neighbour_wait =
          o.stage_patience_ms != LoaderOptions::kWaitForStaging
              ? std::chrono::milliseconds(o.stage_patience_ms)
          : peers_on ? std::chrono::milliseconds(2 * o.peer_timeout_ms)
          : o.io_timeout_ms != 0 ? timeout
                                 : detail::StageDirectory::kForever;
      shared->stager = std::make_unique<detail::Stager>(
          *shared->tiers, o.stage_dir.empty() ? 0 : o.prefetchers, timeout, &shared->stopping_io,
          neighbour_wait);
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
    slot = waited.pop(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
  } catch (...) {
    failure = std::current_exception();
  }
  lock.lock();
  stall_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - *waiting_since)
                  .count();
  waiting_since.reset();
  locks->no_waiter.notify_all();
  if (failure) std::rethrow_exception(failure);
  if (slot == nullptr) {
    check_open();  // close() woke the wait
    return Wait::kTimeout;
  }
  if (slot->epoch != epoch || slot->index != batch) {
    throw std::logic_error("pipeline delivered batch " + std::to_string(slot->index) + " of epoch " +
                           std::to_string(slot->epoch) + " out of order");
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

Stats Loader::Impl::stats() const {
  Stats s;
  const auto lock = lock_state();
  if (!shared) return s;
  const auto now = Clock::now();
  if (owner.load(std::memory_order_relaxed) != 0) {
    s.wall_s = std::chrono::duration<double>(now - started).count();
  }
  s.batches = batches;
  s.samples = samples;
  // A wait under way counts as it goes.
  const uint64_t waiting_ns =
      waiting_since
          ? std::chrono::duration_cast<std::chrono::nanoseconds>(now - *waiting_since).count()
          : 0;
  s.consumer_stall_s = static_cast<double>(stall_ns + waiting_ns) * 1e-9;
  s.plan.busy_s = shared->plan_ns.load() * 1e-9;
  s.plan.idle_s = std::max(0.0, s.wall_s - s.plan.busy_s);
  if (shared->stager) shared->stager->add_to(s);
  const detail::BatchDecoder& decoder = *shared->decoder;
  s.decode.busy_s = decoder.busy_ns() * 1e-9;
  s.decode.idle_s = std::max(0.0, s.wall_s * static_cast<double>(shared->options.readers) -
                                      s.decode.busy_s);
  s.decode.items = decoder.decoded();
  s.decode.bytes = decoder.bytes_read();
  s.gpu_decode = decoder.gpu_stats();
  // Stage 3's reads by tier: bytes read ahead by stage 2 came from the source too.
  const detail::TierCounts served = shared->tiers->served();
  const auto tier = [](detail::Tier t) { return static_cast<size_t>(t); };
  s.hits = served.reads[tier(detail::Tier::kStage)];
  s.misses_read_ahead = served.reads[tier(detail::Tier::kMemory)];
  s.misses = s.misses_read_ahead + served.reads[tier(detail::Tier::kPeer)] +
             served.reads[tier(detail::Tier::kSource)];
  s.missed_bytes = served.bytes[tier(detail::Tier::kMemory)] + served.bytes[tier(detail::Tier::kPeer)] +
                   served.bytes[tier(detail::Tier::kSource)];
  s.bytes_from_stage = served.bytes[tier(detail::Tier::kStage)];
  if (!stage_dir_error.empty()) {
    s.stage_dir_disabled = true;
    s.stage_dir_error = stage_dir_error;
  }
  s.skipped = skipped;
  s.skipped_samples = skipped_samples;
  s.threads_why = threads_why;
  s.usable_cpus = usable_cpus;
  s.local_ranks = local_ranks;
  s.tuning.on = tuner.has_value();
  s.tuning.memory_budget = memory_budget;
  s.memory.batch_buffers = ring ? ring->held_bytes() : 0;
  s.memory.read_ahead = shared->read_ahead_held.load(std::memory_order_relaxed);
  s.memory.decode_scratch = shared->scratch_held.load(std::memory_order_relaxed);
  s.tuning.readers = tuner ? tuner->knob(detail::KnobId::kDecode).value : shared->options.readers;
  s.tuning.reads_in_flight = shared->stager ? shared->stager->threads() : 0;
  s.tuning.lookahead = shared->lookahead.load(std::memory_order_relaxed);
  if (tuner) {
    s.tuning.steps_kept = tuner->steps_kept();
    s.tuning.steps_undone = tuner->steps_undone();
    s.tuning.settled_s = tuner->settled_at_s();
  }
  s.tuning.log.assign(tuning_log.begin(), tuning_log.end());
  detail::PinnedBuffer::Status pinning = ring->status();  // both read together
  s.pinned = pinning.pinning;
  s.pinned_why = std::move(pinning.why);
  if (shared->stage_dir) {
    s.adopted_files += shared->stage_dir->taken_over();
    s.stage_corrupt = shared->stage_dir->corrupt();
  }
  if (shared->peers) {
    s.peer_tier = shared->peers->on();
    s.peer_tier_why = shared->peers->why_off();
    const detail::PeerCounts p = shared->peers->counts();
    s.peer_reads = p.reads;
    s.peer_bytes = p.bytes;
    s.peer_probes = p.probes;
    s.peer_probe_bytes = p.probe_bytes;
    s.peer_fallbacks = p.fallbacks;
    s.peer_corrupt = p.corrupt;
    s.beyond_budget = p.beyond_budget;
    s.peer_served = p.served;
    s.peer_served_bytes = p.served_bytes;
    s.peers_down = p.down;
    s.peers_closed = p.closed;
    if (const detail::SourceModel* model = shared->tiers->source_model(); model != nullptr) {
      s.peer_reads_to_pfs = model->moved_to_pfs();
      for (const detail::SourceModel::Row& r : model->rows()) {
        s.sources.push_back({r.name, r.reads, r.bytes, r.samples, r.latency_s * 1e3,
                             std::isinf(r.bytes_per_s) ? 0.0 : r.bytes_per_s / 1e6, r.down,
                             r.probes});
      }
    }
  } else {
    s.peer_tier_why = "not asked for (peers=False)";
  }
  if (shared->cache) {
    s.peer_home_first = shared->cache->home_first_now();
    s.cache_bytes = shared->cache->capacity();
    s.stage_bytes = shared->cache->used_bytes();
    s.stage_bytes_peak = shared->cache->peak_bytes();
  }
  {
    std::lock_guard lock(shared->epochs_mutex);
    for (const auto& [e, costs] : shared->epochs) {
      s.epochs.push_back(costs);
      s.source_reads += costs.source_reads;
      s.source_bytes += costs.bytes_from_source;
    }
    s.already_staged = shared->already_staged;
  }
  return s;
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
  shared->stager->stop();  // its figures stay for stats()
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
