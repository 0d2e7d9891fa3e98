// Loader: the three-stage pipeline (plan -> stage -> decode) behind one object.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "prestage/batch.hpp"
#include "prestage/catalog.hpp"
#include "prestage/options.hpp"
#include "prestage/stats.hpp"

namespace prestage {

// Thread safety. stats(), position() and close() may be called from any thread at any time, also
// while another thread waits in next() or next_for(). stats() then gives figures consistent with
// one another (batches and samples delivered; the consumer's stall, the wait under way included).
// close() wakes such a waiter, which throws ConfigError ("the loader is closed") as next() does on
// a closed loader; it returns once every thread of the loader is joined, and a close() that finds
// another under way waits for it. next() and next_for() may be called from several threads: the
// calls are served one at a time, each with the next batch in plan order. start_epoch() throws
// ConfigError while another thread is in next(). The accessors (catalog(), options(), ...) read
// what the constructor set. The loader must outlive every call made from another thread, except
// a close() under way: the destructor's own close() waits for that one.
class Loader {
 public:
  // Validates the options (ConfigError) and allocates the batch ring; threads start with the first
  // start_epoch(), in the calling process. From then on, the loader belongs to that process (with
  // the peer tier on, from construction: its MPI transport runs there): in a process forked from
  // it, start_epoch(), next() and next_for() throw Error at once, and close() leaves the parent's
  // threads and state alone. In a process forked from one where a loader has started its threads,
  // no loader runs (their pool, oneTBB, is copied there without its threads): the constructor, and
  // start_epoch() of a loader copied into it, throw Error.
  Loader(Catalog catalog, LoaderOptions options);
  ~Loader();  // stops and joins every thread
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  const Catalog& catalog() const noexcept;
  const LoaderOptions& options() const noexcept;
  uint64_t batches_per_epoch() const noexcept;
  // Batches of `epoch`: batches_per_epoch(), or fewer for the epoch options().resume resumes.
  uint64_t batches_in_epoch(uint64_t epoch) const noexcept;
  // decode=jpeg: the (height, width) of every image of a batch: options().image_size. Empty when
  // that is empty (images are not resized: each keeps its own size, Batch::sample_shape) and for
  // the other decode modes.
  ImageSize image_size() const noexcept;

  // The consumer's position: the epoch and index of the batch next() returns next. A batch is
  // counted once next() has returned it or thrown its sample's error; a next() that throws anything
  // else (a closed loader, every buffer held) leaves the position as it was.
  struct Position {
    uint64_t epoch = 0;
    uint64_t batch = 0;
  };
  Position position() const noexcept;

  // Positions the loader at batch `first_batch` of `epoch` (resume). The pipeline runs on across
  // epoch boundaries (the plan of epoch e + 1 is known), so starting epoch e + 1 right after epoch
  // e ends loses nothing that was staged or decoded ahead. So does a start at a later position that
  // the pipeline has already planned (epoch e + 1 after leaving epoch e a few batches before its
  // end): the batches in between are dropped, undelivered. Any other position restarts the
  // pipeline.
  void start_epoch(uint64_t epoch, uint64_t first_batch = 0);

  // The next batch of the current epoch, or nullopt at its end. Blocks until it is ready. If the
  // batch holds a sample that failed, throws that sample's error (IoError or DecodeError naming its
  // path); the loader stays usable and next() goes on with the following batch. With on_error=skip
  // a failed sample is replaced instead (see OnError); its error is thrown only if none is found.
  // Throws ConfigError on a closed loader, also when close() comes while it waits.
  std::optional<Batch> next();

  enum class Wait { kBatch, kEndOfEpoch, kTimeout };
  // As next(), but waits at most `timeout`; sets `out` only for kBatch.
  Wait next_for(std::chrono::milliseconds timeout, std::optional<Batch>& out);

  Stats stats() const;

  // The self-tuning's decisions (as in Stats::tuning.log) made since the last call, oldest first:
  // for a log of one line per change. Any thread.
  std::vector<std::string> take_tuning_log();

  // Where stage 2 puts the copy of sample `sample`'s file in the stage directory, whether it is
  // there or not; empty without a usable stage directory. With decode=locate, the consumer opens it
  // for a sample its batch says is staged (kLocatedStaged), and reads the source
  // (Catalog::source_path) if it is gone by then (evicted later) or the batch says kLocatedSource:
  // the sample's bytes are the file's range Catalog::locator(sample) either way.
  std::string staged_path(uint64_t sample) const;

  // Stops the pipeline and joins its threads. Idempotent; batches already lent stay valid, and
  // stats() keeps the figures.
  void close();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace prestage
