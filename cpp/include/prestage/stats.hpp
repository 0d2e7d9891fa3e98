// Stats: always-on counters per stage, cheap enough to keep in production runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "prestage/pinning.hpp"

namespace prestage {

struct StageStats {
  double busy_s = 0;   // summed over the stage's threads
  double idle_s = 0;   // threads x wall time - busy
  uint64_t items = 0;  // samples dealt with
  uint64_t bytes = 0;  // bytes read (stage 3) or copied (stage 2)
};

// What one epoch's batches cost, counted when stage 1 plans them (so an epoch planned ahead shows
// before it is consumed).
struct EpochStats {
  uint64_t epoch = 0;
  uint64_t hits = 0;       // samples whose file was in the stage directory (or on its way) already
  uint64_t misses = 0;     // samples read from the source: copied by stage 2, or read by stage 3
  uint64_t evictions = 0;  // files removed from the stage directory to make room
  uint64_t bytes_from_source = 0;  // sizes of the missed files
};

// on_error=skip: a sample that failed and was replaced in its batch by another.
struct SkippedSample {
  uint64_t epoch = 0;
  uint64_t batch = 0;        // the batch's index in its epoch
  uint64_t sample = 0;       // the failed sample's catalog index
  uint64_t replacement = 0;  // the catalog index of the sample delivered in its place
  std::string path;          // the failed sample's source path
  std::string error;         // why it failed (the error on_error=raise would have raised)
};

struct Stats {
  double wall_s = 0;  // since the loader started its current run of epochs
  uint64_t batches = 0;
  uint64_t samples = 0;
  double consumer_stall_s = 0;  // time the consumer waited in next(): the number that matters

  StageStats plan;
  StageStats stage;
  StageStats decode;

  // Stage 2.
  uint64_t staged_files = 0;     // files copied to the stage directory in this run
  uint64_t adopted_files = 0;    // copies another process (sharing the directory) made meanwhile
  uint64_t already_staged = 0;   // found staged (this run or an earlier one): not copied again
  uint64_t stage_failures = 0;   // samples stage 2 gave up on (source or stage directory errors)
  uint64_t stage_expedited = 0;  // samples stage 3 read itself because stage 2 had not started them
                                 // when the consumer's next batch was due
  uint64_t read_ahead = 0;        // samples the stage directory declined (a bounded cache keeps
  uint64_t read_ahead_bytes = 0;  // what is needed sooner), read into memory by stage 2 instead
  bool stage_dir_disabled = false;  // the stage directory failed; reads go to the source
  std::string stage_dir_error;

  // Stage 3: where the bytes came from.
  uint64_t hits = 0;    // read from the stage directory
  uint64_t misses = 0;  // read from the source (not staged in time, or no stage directory)
  uint64_t misses_read_ahead = 0;  // of those, read by stage 2 ahead (Stats::read_ahead): the rest
                                   // stage 3 read from the source itself
  uint64_t bytes_from_source = 0;
  uint64_t bytes_from_stage = 0;

  // on_error=skip: samples replaced in the batches delivered so far (a sample that fails in two
  // epochs counts twice), and the first kMaxSkippedListed of them, in delivery order.
  static constexpr size_t kMaxSkippedListed = 1000;
  uint64_t skipped = 0;
  std::vector<SkippedSample> skipped_samples;

  // How the batch buffers are pinned: the least of all buffers (kCuda only if every one is registered),
  // and why it is not better (or, for kCuda, the runtime registered with).
  Pinning pinned = Pinning::kNone;
  std::string pinned_why;

  // Bounded stage directory: the bound in effect (0: none; see LoaderOptions::kFitFreeSpace), bytes
  // held now and at most (files being written included).
  uint64_t cache_bytes = 0;
  uint64_t stage_bytes = 0;
  uint64_t stage_bytes_peak = 0;
  std::vector<EpochStats> epochs;  // in epoch order
};

}  // namespace prestage
