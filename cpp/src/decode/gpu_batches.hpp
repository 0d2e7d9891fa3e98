// Stage 3's GPU backend (decode_device=cuda): each batch's JPEGs read by the readers, decoded by
// the ring slot's GpuJpegDecoder (nvJPEG, NPP) into the slot's device batch, but for the CPU's
// share (GpuShare), which the readers decode meanwhile; where the crop box is applied
// (GpuCropChoice); the decoders' counters. BatchDecoder holds one where decode_device=cuda and
// hands it each batch; the CPU backend is BatchDecoder's own run (batch_decoder.cpp), and both
// share BatchRun (batch_run.hpp).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "decode/batch_decoder.hpp"
#include "decode/gpu_jpeg.hpp"
#include "decode/gpu_share.hpp"
#include "memory/batch_ring.hpp"
#include "prestage/options.hpp"
#include "prestage/stats.hpp"

namespace prestage::detail {

class GpuBatches {
 public:
  // Throws ConfigError if the GPU libraries are not available (naming what is missing and where it
  // looked). Each ring slot's decoder is made at its first batch, on the CUDA device current on
  // the calling thread now. `plan`: the batch size and the seed of the random crops; `readers`:
  // stage 3's threads at the start (the CPU's share follows them).
  GpuBatches(const LoaderDecodeOptions& options, const LoaderPlanOptions& plan, uint64_t readers,
             ImageSize image_size);
  ~GpuBatches();

  // BatchDecoder::decode's work for one batch on this backend (same contract).
  void decode(BatchDecoder& decoder, const BatchSamples& batch, BatchScratch& scratch, Slot& slot,
              const std::atomic<bool>& stopping);

  // The self-tuning moved the readers from `from` to `to`: the CPU's share follows at once.
  void readers_changed(uint64_t from, uint64_t to) { share_->readers_changed(from, to); }

  // The decoders' counters, summed, and the share's and the crop's choices.
  Stats::GpuDecode stats() const;

 private:
  friend class GpuRun;
  // A ring slot's GPU decoder, and the times of its last batch while the GPU's is not known yet.
  struct SlotDecoder;
  // The slot's, made at its first use (throws GpuError).
  SlotDecoder& slot(Slot& slot);
  // Hands the share the times of the slot's last batch if its GPU time is known now.
  void measure(SlotDecoder& gpu);
  // Adds what one decode() of a GPU decoder counted, and the batch's CPU share.
  void count(const GpuJpegDecoder::Counters& before, const GpuJpegDecoder::Counters& after,
             uint64_t cpu_share);

  const gpu::Libraries* libraries_ = nullptr;
  int device_ = 0;  // the CUDA device the decoders use
  GpuJpegDecoder::Options options_;
  std::unique_ptr<GpuShare> share_;      // the CPU's share of each batch
  std::unique_ptr<GpuCropChoice> crop_;  // where the crop box is applied
  // The decoders' counters, summed; replacements decoded by the CPU path; decoders made.
  std::atomic<uint64_t> batches_{0}, hardware_{0}, gpu_{0}, cpu_share_{0}, cpu_unsupported_{0},
      cpu_failed_{0}, replacements_{0}, growths_{0}, roi_{0}, decoders_{0};
};

}  // namespace prestage::detail
