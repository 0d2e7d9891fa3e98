#include "pipeline/assemble.hpp"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <stdexcept>

#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/info.h>

#include "formats/tfrecord.hpp"
#include "prestage/error.hpp"

namespace prestage::detail {

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

size_t checked_mul(size_t a, size_t b, const char* what) {
  if (a != 0 && b > SIZE_MAX / a) throw ConfigError(std::string(what) + " is too large");
  return a * b;
}

// LoaderOptions::kFitFreeSpace: no bound (0) if the data set fits in 90% of the stage directory's
// room (its file system's free space and what the directory takes already: copies and its own
// files), else that 90%. The directory counts what the disk charges (`dir` was made with the file
// system's block): each copy in whole blocks, copies being written, and its index as it grows.
uint64_t fit_free_space(StageDirectory& dir, const Catalog& catalog) {
  struct statvfs fs;
  // Cannot tell: a full disk is handled anyway.
  if (::statvfs(dir.path().c_str(), &fs) != 0) return 0;
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

void threads_started() { g_threads_started_in.store(::getpid(), std::memory_order_release); }

// oneTBB starts at most (cores - 1) worker threads unless told otherwise; stage 3 needs `readers`
// workers of its own whatever the core count.
void allow_workers(size_t workers) {
  static std::mutex mutex;
  static size_t allowed = 0;
  // Deliberately never destroyed: the limit must outlive every loader, up to process exit.
  static tbb::global_control* control = nullptr;
  std::lock_guard lock(mutex);
  const size_t want = std::max(workers + 1, static_cast<size_t>(tbb::info::default_concurrency()));
  if (want <= allowed) return;
  // While several controls live the smallest wins: the old one goes once the new one is in place.
  auto* raised = new tbb::global_control(tbb::global_control::max_allowed_parallelism, want);
  delete control;
  control = raised;
  allowed = want;
}

std::array<bool, kKnobs> pinned_knobs(const LoaderTuningOptions& options) {
  constexpr uint64_t kAuto = LoaderTuningOptions::kAuto;
  return {options.readers != kAuto, options.prefetchers != kAuto, options.lookahead != kAuto};
}

Sizing size_loader(LoaderOptions& options, const std::array<bool, kKnobs>& pinned,
                   const Catalog& catalog) {
  Sizing s;
  std::string cpus_why, ranks_why, memory_why;
  s.usable_cpus = usable_cpus(cpus_why);
  s.local_ranks = local_ranks(ranks_why);
  size_to_machine(options, s.usable_cpus, s.local_ranks, s.why);
  if (!s.why.empty()) s.why += ": " + cpus_why + "; " + ranks_why;
  if (catalog.size() == 0) throw ConfigError("the catalog is empty");
  s.memory_budget = options.memory_budget != 0
                        ? options.memory_budget
                        : usable_memory(memory_why) / 4 / std::max<uint64_t>(1, s.local_ranks);
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
      mean_file == 0
          ? 0
          : static_cast<uint64_t>(static_cast<double>(mean_file) * static_cast<double>(files) /
                                  static_cast<double>(catalog.size()));
  std::string fit_why;
  fit_to_memory(options, pinned, s.memory_budget, mean_file, mean_sample, fit_why);
  if (!fit_why.empty()) s.why += "; " + fit_why;
  s.limits = tune_limits(options, pinned, s.usable_cpus, s.local_ranks, s.memory_budget, mean_file,
                         mean_sample);
  return s;
}

// A catalog of compressed files is read only from their decompressed copies: the largest of
// them, as the directory charges it.
uint64_t largest_compressed(const Catalog& catalog, const StageDirectory* dir) {
  uint64_t largest = 0;
  for (uint64_t f = 0; f < catalog.num_files(); ++f) {
    if (catalog.file_codec(f) == Catalog::Codec::kNone) continue;
    const uint64_t size = catalog.file_size(f);
    largest = std::max(largest, dir != nullptr ? dir->charge(size) : size);
  }
  return largest;
}

std::string open_stage(Shared& shared) {
  const LoaderOptions& o = shared.options;
  const bool compressed = shared.catalog.has_compressed_files();
  const std::string why_stage =
      "the catalog holds shards compressed whole (.tar.gz, .tar.zst, MDS with compression), "
      "which cannot be read by byte range: stage 2 writes them decompressed to the stage "
      "directory, and every sample is read from there";
  if (o.stage_dir.empty()) {
    if (compressed) {
      throw ConfigError("a stage directory is needed (stage_dir=, node-local storage): " +
                        why_stage);
    }
    return {};
  }
  const StageAccess access = StageAccess::of(o.stage_group);  // ConfigError: no such group
  try {
    // With the default bound, the directory counts what the disk charges (0: its block); a bound
    // given is one on the copies' bytes.
    shared.stage_dir = std::make_unique<StageDirectory>(
        o.stage_dir, shared.catalog, o.cache_bytes == LoaderOptions::kFitFreeSpace ? 0 : 1, access);
    // Files of the batches in flight (planned, not yet decoded) are never evicted: the window of
    // the pipeline, plus the batch the source holds when the window is full, plus the current one.
    // With processes sharing the directory, the bound is on the bytes of all their copies.
    // A directory that cannot be written only serves the copies in it: nothing to bound.
    const uint64_t bound = shared.stage_dir->read_only() ? 0
                           : o.cache_bytes == LoaderOptions::kFitFreeSpace
                               ? fit_free_space(*shared.stage_dir, shared.catalog)
                               : o.cache_bytes;
    // A bounded directory evicts in plan order around the batches in flight, a window fixed
    // here: the self-tuning leaves lookahead as it is then.
    const uint64_t largest = largest_compressed(shared.catalog, shared.stage_dir.get());
    if (compressed && bound != 0 && largest > bound) {
      throw ConfigError("cache_bytes (" + std::to_string(bound) + ") is smaller than the largest " +
                        "decompressed shard (" + std::to_string(largest) + " bytes): " + why_stage +
                        ", one whole shard at least");
    }
    if (bound != 0) shared.lookahead_max = o.lookahead;
    shared.cache =
        std::make_unique<StageCache>(shared.catalog, shared.plan, *shared.stage_dir, bound,
                                     o.eviction, shared.lookahead_max + o.depth + 2);
  } catch (const UnsafePath&) {
    // Another user's area (or one others can write): never used, and not quietly replaced by
    // reads of the source either: the job asked for staging, and its user must choose.
    throw;
  } catch (const IoError& e) {
    // A stage directory that cannot be used is not fatal: stage 2 reads ahead into memory. But
    // for a catalog of compressed shards, which are read from nowhere else.
    if (compressed) {
      throw IoError(
          o.stage_dir, e.error_code(),
          "the stage directory cannot be used (" + std::string(e.what()) + "): " + why_stage);
    }
    return e.what();
  }
  return {};
}

void make_tiers(Shared& shared) {
  const LoaderOptions& o = shared.options;
  // A TFRecord record is read with its framing.
  const uint64_t framing = shared.catalog.kind() == Catalog::Kind::kTfrecord ? kFramingBytes : 0;
  const uint64_t max_read =
      o.max_sample_bytes > UINT64_MAX - kFramingBytes ? UINT64_MAX : o.max_sample_bytes + framing;
  shared.tiers = std::make_unique<Tiers>(shared.catalog, shared.stage_dir.get(), max_read);
  // A compressed file's sample missed by stage 2 is copied by stage 3 within the bound.
  if (shared.cache) shared.tiers->set_stage_bound(shared.cache->capacity());
  if (!o.trace.empty()) {
    shared.trace = std::make_unique<IoTrace>(o.trace, shared.catalog.root().string(),
                                             shared.catalog.num_files());
    shared.tiers->set_trace(shared.trace.get());
  }
}

size_t make_decoder(Shared& shared) {
  const LoaderOptions& o = shared.options;
  size_t slot_bytes = 0;
  if (decodes_images(o.decode)) {
    // Without an image_size each image keeps its own size: stage 3 reads it from the image's
    // header, and the batch buffers grow to the batches' sizes as they do for arrays.
    const ImageSize size = o.image_size;
    shared.image_size = size;
    if (!size.empty()) {
      if (static_cast<uint64_t>(size.height) * size.width > o.max_pixels) {
        throw ConfigError("image_size exceeds max_pixels");
      }
      checked_mul(checked_mul(size.height, size.width, "image_size"), 12, "image_size");
      shared.image_bytes = image_sample_bytes(size.height, size.width, o.dtype);
      // decode_device=cuda: the images are born on the device; the host buffers hold none.
      slot_bytes = o.decode_device == DecodeDevice::kCuda
                       ? 0
                       : checked_mul(shared.image_bytes, o.batch_size, "batch_size x image size");
    }
    if (o.dtype == OutputType::kFloat32) shared.normalizer = std::make_unique<Normalizer>(o);
  }
  // The decoder takes its part of the options, the plan's (batch size, seed) and the readers.
  shared.decoder = std::make_unique<BatchDecoder>(o, o, o.readers, shared.codec, shared.image_size,
                                                  shared.normalizer.get(), *shared.tiers);
  return slot_bytes;
}

std::unique_ptr<Stager> make_stager(Shared& shared, std::chrono::milliseconds timeout) {
  const LoaderOptions& o = shared.options;
  // Threads wherever a stage directory was asked for: an unusable one still reads ahead.
  // A file that a neighbour sharing the stage directory is copying is waited for as long as
  // stage 3 would wait for its batch (stage_patience), else as long as a read may take. With
  // the peer tier on (stage 3 always waits), a neighbour's copy may wait up to peer_timeout on
  // a peer before it reads the source; a neighbour that holds a copy's lock for twice that has
  // stalled (stopped, hung), and the copy is given up (stage 3 reads the sample itself) rather
  // than waited for without end.
  const bool peers_on = shared.peers && shared.peers->on();
  const std::chrono::milliseconds neighbour_wait =
      shared.patience        ? *shared.patience
      : peers_on             ? std::chrono::milliseconds(2 * o.peer_timeout_ms)
      : o.io_timeout_ms != 0 ? timeout
                             : StageDirectory::kForever;
  return std::make_unique<Stager>(*shared.tiers, o.stage_dir.empty() ? 0 : o.prefetchers, timeout,
                                  &shared.stopping_io, neighbour_wait);
}

}  // namespace prestage::detail
