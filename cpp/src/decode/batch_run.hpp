// One batch's decode, the part the two backends share (the CPU's, BatchDecoder::Run in
// batch_decoder.cpp, and the GPU's, GpuBatches in gpu_batches.cpp): the batch and its scratch, the
// samples' steps run in parallel with a sample that fails replaced by the skip policy's
// candidates, the first error of the batch, and the reader threads' codec contexts.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include "decode/batch_decoder.hpp"
#include "decode/skip_policy.hpp"

namespace prestage::detail {

// The message of `error` (an unknown one: "unknown error").
inline std::string message(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

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
  std::exception_ptr get() const { return error_; }

 private:
  std::mutex mutex_;
  size_t sample_ = SIZE_MAX;
  std::exception_ptr error_;
};

// What stage 3 keeps per reader thread, created once: the codec contexts and buffers that only
// grow.
struct BatchDecoder::Reader {
  std::unique_ptr<SampleDecoder> decoder;
  std::vector<std::byte> buffer;  // a sample's bytes as read
  std::vector<uint8_t> image;     // an RGB image before its conversion to the batch's layout/type
  TierScratch paths;

  SampleDecoder& codec(const Codec& c) {
    if (!decoder) decoder = std::make_unique<SampleDecoder>(c);
    return *decoder;
  }
};

// The shared part of one batch's run, with the batch's scratch and slot; a backend's run derives
// from it and adds its steps.
class BatchRun {
 public:
  BatchRun(BatchDecoder& d, const BatchSamples& b, BatchScratch& s, Slot& slot,
           const std::atomic<bool>& stopping)
      : d_(d), b_(b), s_(s), slot_(slot), stopping_(stopping) {}

 protected:
  using Clock = std::chrono::steady_clock;

  // Runs `step(i)` for every sample in parallel; a sample that fails is handed to `replace`.
  // Isolated: while this thread waits for the batch's other samples it takes no other batch's
  // decode, which could otherwise sit on top of this one on its stack: a later batch whose read
  // stalls would hold up this one (and every batch after it) for as long as that read lasts.
  template <typename Step, typename Replace>
  void each(const Step& step, const Replace& replace) {
    tbb::this_task_arena::isolate([&] {
      tbb::parallel_for(size_t{0}, b_.count, [&](size_t i) {
        const Gate::Pass pass(d_.gate_);
        const auto start = Clock::now();
        try {
          step(i);
        } catch (...) {
          replace_or_fail(i, std::current_exception(), replace);
        }
        d_.busy_ns_.fetch_add(
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count(),
            std::memory_order_relaxed);
      });
    });
  }

  // on_error=skip: tries `attempt(i, id)` on the skip policy's candidates and makes the first that
  // succeeds sample i of the batch. Otherwise, or if none does, the batch carries `error`.
  template <typename Attempt>
  void replace_or_fail(size_t i, const std::exception_ptr& error, const Attempt& attempt) {
    if (d_.options_.on_error != OnError::kSkip || !skippable(error)) {
      first_error_.record(i, error);
      return;
    }
    const SkipCandidates candidates(*b_.plan, d_.batch_size_, b_.index, i, kSkipCandidates);
    for (uint64_t k = 0; k < candidates.size(); ++k) {
      if (stopping_.load(std::memory_order_acquire)) break;
      const uint64_t candidate = candidates[k];
      try {
        attempt(i, candidate);
      } catch (...) {
        if (skippable(std::current_exception())) continue;
        first_error_.record(i, std::current_exception());
        return;
      }
      std::lock_guard lock(s_.skip_mutex);
      // A sample may be replaced twice (the first replacement failing when filled): the plan's
      // sample is listed once.
      if (std::none_of(slot_.skipped.begin(), slot_.skipped.end(),
                       [&](const Slot::Skip& skip) { return skip.position == i; })) {
        slot_.skipped.push_back({i, b_.ids[i], message(error)});
      }
      slot_.indices[i] = static_cast<int64_t>(candidate);
      slot_.labels[i] = d_.tiers_.catalog().label(candidate);
      return;
    }
    first_error_.record(i, error);
  }

  // Stage 2's bytes for sample i, if it is still the plan's sample (not a replacement).
  std::optional<std::span<const std::byte>> held(size_t i, uint64_t id) const {
    if (b_.read_ahead == nullptr || b_.ids[i] != id) return std::nullopt;
    return b_.read_ahead->at(i);
  }

  using Reader = BatchDecoder::Reader;
  // The calling thread's codec contexts and buffers.
  Reader& reader() { return d_.readers_->local(); }

  // The loader's decode options and seed, codec, tiers and output size (kJpeg with an image_size;
  // empty: each image keeps its own).
  const LoaderDecodeOptions& options() const { return d_.options_; }
  uint64_t seed() const { return d_.seed_; }
  const Codec& codec() const { return d_.codec_; }
  Tiers& tiers() const { return d_.tiers_; }
  ImageSize image_size() const { return d_.image_size_; }
  // Counts `bytes` a sample is decoded from (BatchDecoder::bytes_read(): not a count of reads).
  void count_read(uint64_t bytes) { d_.bytes_read_.fetch_add(bytes, std::memory_order_relaxed); }

  BatchDecoder& d_;
  const BatchSamples& b_;
  BatchScratch& s_;
  Slot& slot_;
  const std::atomic<bool>& stopping_;
  FirstError first_error_;
};

}  // namespace prestage::detail
