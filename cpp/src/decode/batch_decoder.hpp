// Stage 3 for one batch: every sample read through the tiers and decoded straight into its place in
// a batch buffer, by one path for every codec: size each sample (an image's output size, an array's
// header, a raw sample's length), lay the batch out, fill each place. A sample that fails is
// replaced by the skip policy's candidates (on_error=skip) or its error travels with the batch.
// Two backends: the CPU's (BatchDecoder::Run, batch_decoder.cpp) and, with decode_device=cuda, the
// GPU's (GpuBatches, gpu_batches.*), both on the shared part of a batch's run (batch_run.hpp).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <oneapi/tbb/enumerable_thread_specific.h>

#include "decode/gpu_jpeg.hpp"
#include "decode/registry.hpp"
#include "decode/transform.hpp"
#include "memory/batch_ring.hpp"
#include "prestage/options.hpp"
#include "prestage/plan.hpp"
#include "prestage/stats.hpp"
#include "tiers/read_ahead.hpp"
#include "tiers/tiers.hpp"
#include "util/gate.hpp"

namespace prestage::detail {

class GpuBatches;

// One batch of the plan, as stage 3 receives it.
struct BatchSamples {
  uint64_t epoch = 0;
  uint64_t index = 0;  // in its epoch
  const EpochPlan* plan = nullptr;
  const uint64_t* ids = nullptr;  // catalog sample indices
  size_t count = 0;
  // The bytes stage 2 read ahead for the plan's samples, by position (null: none).
  const ReadAhead* read_ahead = nullptr;
  // Where the batch's reads are counted, by tier, besides the tiers' own counters; null: nowhere.
  TierTally* tally = nullptr;
};

// What a batch keeps between its steps; recycled with the batch, so that once warm nothing is
// allocated per batch or per sample.
struct BatchScratch {
  std::vector<Tier> tiers;         // per sample: the tier its size was taken from
  std::vector<ArrayProbe> probes;  // per sample: its size, type and shape (arrays: its header)
  // Per sample, the buffers its bytes are read into (`bytes`) and a zstd frame's JPEG is
  // decompressed into (`unpacked`). Kept for the next batches, but trimmed after each (trim()).
  std::vector<std::vector<std::byte>> bytes;
  std::vector<std::vector<std::byte>> unpacked;
  // Per sample, the bytes step 1 took and keeps for step 3, so that no sample is read twice: an
  // image's JPEG where step 1 reads images (no image_size, or decode_device=cuda), in `bytes`, in
  // stage 2's read-ahead or in `unpacked`; a raw file's bytes; an array's bytes where they were in
  // memory (stage 2's read-ahead, or a home copy fetched through the peer tier into `bytes`). None
  // where step 3 reads the sample itself (an array on disk).
  std::vector<std::optional<std::span<const std::byte>>> kept;
  std::mutex skip_mutex;  // guards the slot's `skipped` while the batch decodes
  // decode_device=cuda: per sample, its source path (for the CPU path's errors), and what the GPU
  // decoder takes and gives back.
  std::vector<std::string> paths;
  std::vector<GpuJpegDecoder::Sample> gpu_samples;
  std::vector<GpuRoute> routes;
  std::vector<std::exception_ptr> gpu_errors;
  std::vector<std::exception_ptr> share_errors;  // the CPU's share: its failures, by position
  std::vector<size_t> cpu_positions;             // the CPU's share of the batch

  // After a batch, on its decoding thread: drops the batch's errors (the batch carries its own to
  // the consumer, who must be the one to let go of them last: a scratch is reused by the next batch
  // at once), and lets go of each per-sample buffer that holds more than twice the bytes it took
  // last, so that a scratch keeps about what its recent batches needed. Kept as they were, each
  // position's buffer would grow to the largest sample it ever saw there, the sum creeping up
  // epoch after epoch towards batch_size times the set's largest sample.
  void trim() noexcept;
  // The bytes its per-sample buffers hold now (stats()'s memory figures).
  size_t held_bytes() const noexcept;
};

class BatchDecoder {
 public:
  // `image_size`: kJpeg, every image's output size; empty: each image keeps its own. `normalizer`:
  // kJpeg with float32 output. All arguments must outlive the decoder. decode_device=cuda: throws
  // ConfigError if the GPU libraries are not available (naming what is missing and where it
  // looked); each slot's GpuJpegDecoder is made at its first batch, on the CUDA device current on
  // the calling thread now. `plan`: the batch size (on_error=skip's candidates) and the seed of
  // the random crops; `readers`: stage 3's threads at the start (decode_device=cuda: the CPU's
  // share follows them).
  BatchDecoder(const LoaderDecodeOptions& options, const LoaderPlanOptions& plan, uint64_t readers,
               const Codec& codec, ImageSize image_size, const Normalizer* normalizer,
               Tiers& tiers);
  ~BatchDecoder();

  // Decodes `batch` into `slot` on the calling thread's task arena (in parallel), setting the
  // slot's layout, data, labels, indices, skipped samples and error. `stopping` set: replacements
  // are not sought (nobody will look at the batch). Never throws for a sample's failure.
  void decode(const BatchSamples& batch, BatchScratch& scratch, Slot& slot,
              const std::atomic<bool>& stopping);

  // At most `limit` samples decoded at once (the self-tuning's readers; Gate::kOpen: as many as
  // the arena has threads). Any thread, at any time.
  void set_concurrency(uint64_t limit) { gate_.set_limit(limit); }
  // decode_device=cuda: the self-tuning moved the readers from `from` to `to`; the CPU's share of
  // each batch follows at once (GpuShare::readers_changed). Any thread.
  void readers_changed(uint64_t from, uint64_t to);

  // Drops the per-thread codec contexts (the threads that made them are about to go).
  void clear_thread_state();

  // Arrays: the dtype every sample must have, the data set's, taken once, before the first batch is
  // laid out: the one most of kDataSetProbes samples spread evenly over the catalog (ids j * N / k)
  // have, ties going to the lowest id. Not the first sample's (of the batch or of the catalog): one
  // odd file there would make every good file fail; the majority of a few is wrong only if most
  // of them are odd, and the catalog's spread, not the plan's order, makes it the same on every
  // rank and in every epoch. None is probed where the dtype is declared (decode="raw" with a
  // raw_dtype) or fixed (raw whole files: bytes): every sample has it or fails on its own. A probe
  // that fails is left out; none readable: null, and each batch takes the dtype most of its own
  // samples have. Costs the probes' header reads, once per loader; none where the catalog has
  // recorded the data set's dtype (Catalog::dtype(): from_arrays, from_hdf5, from_tfrecord), which
  // is taken instead. Any thread; `stopping` set while it probes: nothing is kept, the next call
  // probes again.
  const std::string* data_set_dtype(const std::atomic<bool>& stopping);
  static constexpr uint64_t kDataSetProbes = 5;

  // Counters, read from any thread.
  uint64_t busy_ns() const noexcept { return busy_ns_.load(std::memory_order_relaxed); }
  uint64_t decoded() const noexcept { return decoded_.load(std::memory_order_relaxed); }
  // The bytes its samples were decoded from (Stats::decode.bytes): an image's bytes as read, an
  // array's data as placed in its batch (decompressed, its header left out), a raw file's bytes
  // once placed. A figure of the decoder's work, not a count of reads: the reads are the tiers'
  // ledger's (Tiers::served()), which counts an array's header read in memory, a sample of a batch
  // that failed before its data was placed, and decode=locate's looks, and this does not.
  uint64_t bytes_read() const noexcept { return bytes_read_.load(std::memory_order_relaxed); }
  // decode_device=cuda: the GPU decoders' counters, summed (on is false otherwise).
  Stats::GpuDecode gpu_stats() const;

 private:
  friend class BatchRun;
  struct Reader;  // batch_run.hpp
  class Run;      // the CPU backend's run of one batch

  // decode=locate: one byte per sample, the tier that holds its bytes now (a Look, Tiers::open).
  void locate(const BatchSamples& batch, Slot& slot);
  const LoaderDecodeOptions& options_;
  const uint64_t batch_size_;
  const uint64_t seed_;
  const Codec& codec_;
  ImageSize image_size_;
  const Normalizer* normalizer_;
  Tiers& tiers_;
  std::unique_ptr<tbb::enumerable_thread_specific<Reader>> readers_;
  std::mutex data_set_mutex_;
  bool data_set_probed_ = false;               // guarded by data_set_mutex_
  std::optional<std::string> data_set_dtype_;  // set once probed, then read without the lock
  std::atomic<uint64_t> busy_ns_{0}, decoded_{0}, bytes_read_{0};
  std::unique_ptr<GpuBatches> gpu_;  // decode_device=cuda: the GPU backend; else null
  Gate gate_;
};

}  // namespace prestage::detail
