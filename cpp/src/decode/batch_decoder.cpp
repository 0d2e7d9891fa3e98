#include "decode/batch_decoder.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <optional>
#include <string>

#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include "decode/skip_policy.hpp"
#include "prestage/error.hpp"
#include "util/file_io.hpp"

namespace prestage::detail {

namespace {

// PRESTAGE_GPU_RESIZE: "each" (unset or empty: the default), one NPP resize per image; "batch",
// one per interpolation and batch (GpuJpegDecoder::Options::batched_resize), an experiment whose
// effect has not been measured on a GPU yet.
bool gpu_resize_batched() {
  const char* value = std::getenv("PRESTAGE_GPU_RESIZE");
  const std::string text = value != nullptr ? value : "";
  if (text.empty() || text == "each") return false;
  if (text == "batch") return true;
  throw ConfigError("PRESTAGE_GPU_RESIZE must be 'each' or 'batch', got '" + text + "'");
}

using Clock = std::chrono::steady_clock;

std::string message(const std::exception_ptr& error) {
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

}  // namespace

// What stage 3 keeps per reader thread, created once: the codec contexts and buffers that only grow.
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

struct BatchDecoder::GpuSlot {
  GpuSlot(const gpu::Libraries& libraries, const GpuJpegDecoder::Options& options)
      : decoder(libraries, options) {}
  GpuJpegDecoder decoder;
  std::optional<GpuShareSample> pending;  // the last batch's times, its GPU time still unknown
  GpuCrop pending_crop = GpuCrop::kResize;  // the way that batch applied its crop boxes
  // That batch is a fair trial of its crop way: not the first this decoder took that way (nvJPEG's
  // first-use allocations and set-up) and no staging buffer grew in it (allocation time, not
  // decoding). On an H200 the first batches' times per image varied 3x between runs, and
  // gpu_crop="auto" chose either way.
  bool pending_trial = false;
  uint64_t batches_by_way[2] = {0, 0};  // resize, roi
};

namespace {

void trim_each(std::vector<std::vector<std::byte>>& buffers) noexcept {
  for (std::vector<std::byte>& b : buffers) {
    if (b.capacity() > 2 * b.size()) std::vector<std::byte>().swap(b);
  }
}

size_t capacity_of(const std::vector<std::vector<std::byte>>& buffers) noexcept {
  size_t total = 0;
  for (const std::vector<std::byte>& b : buffers) total += b.capacity();
  return total;
}

}  // namespace

void BatchScratch::trim() noexcept {
  gpu_errors.clear();
  share_errors.clear();
  trim_each(bytes);
  trim_each(unpacked);
}

size_t BatchScratch::held_bytes() const noexcept { return capacity_of(bytes) + capacity_of(unpacked); }

// One batch's decode: the three steps, each sample's size and fill by codec, and replacement.
class BatchDecoder::Run {
 public:
  Run(BatchDecoder& d, const BatchSamples& b, BatchScratch& s, Slot& slot,
      const std::atomic<bool>& stopping)
      : d_(d), b_(b), s_(s), slot_(slot), stopping_(stopping) {}

  void operator()() {
    s_.tiers.assign(b_.count, Tier::kMemory);
    s_.probes.resize(b_.count);
    if (d_.gpu_ != nullptr) {
      gpu_run();
      return;
    }
    if (keeps_bytes()) {
      // Only grown: the buffers keep their capacity for the next batches.
      if (s_.bytes.size() < b_.count) s_.bytes.resize(b_.count);
      if (s_.unpacked.size() < b_.count) s_.unpacked.resize(b_.count);
      s_.jpegs.resize(b_.count);
    }
    if (d_.codec_.arrays()) {
      if (s_.bytes.size() < b_.count) s_.bytes.resize(b_.count);
      s_.in_memory.assign(b_.count, 0);
      s_.memory.resize(b_.count);
    }
    each([&](size_t i) { size(i, b_.ids[i]); },
         [&](size_t i, uint64_t id) { size(i, id); });
    if ((slot_.error = first_error_.get())) return;
    if (!lay_out()) return;
    each([&](size_t i) { fill(i, static_cast<uint64_t>(slot_.indices[i])); },
         [&](size_t i, uint64_t id) {
           // The batch is laid out: a replacement must fit the failed sample's place, which a
           // candidate refused must not change for the next one.
           const ArrayInfo place = s_.probes[i].info;
           try {
             size(i, id);
             if (!s_.probes[i].info.same_layout(place)) {
               throw DecodeError(d_.tiers_.catalog().source_path(id).string(),
                                 "its type or shape differs from the failed sample's");
             }
           } catch (...) {
             s_.probes[i].info = place;
             throw;
           }
           fill(i, id);
         });
    slot_.error = first_error_.get();
  }

 private:
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
    const SkipCandidates candidates(*b_.plan, d_.options_.batch_size, b_.index, i,
                                    kSkipCandidates);
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

  Reader& reader() { return d_.readers_->local(); }

  // JPEGs that keep their own size: step 1 reads each one to learn it.
  bool unresized() const {
    return d_.codec_.mode == DecodeMode::kJpeg && d_.image_size_.empty();
  }

  // Raw files: step 1 reads each one, so that a file that cannot be read, or no longer has its
  // catalog's size, fails before the batch is laid out (and is replaced by any good file, whatever
  // its size), with one open and one read and no stat; step 3 copies the bytes into place.
  bool raw_files() const { return d_.codec_.mode == DecodeMode::kRaw && !d_.codec_.arrays(); }

  // Step 1 keeps each sample's bytes for step 3.
  bool keeps_bytes() const { return unresized() || raw_files(); }

  // Without an image_size: reads sample i (catalog sample `id`) once, keeps its bytes and its JPEG
  // for step 3, and returns the image's size from its header (max_pixels checked there, before the
  // batch is laid out).
  ImageSize read_image(size_t i, uint64_t id) {
    Reader& r = reader();
    const auto bytes = d_.tiers_.read(id, held(i, id), s_.bytes[i], r.paths, b_.tally);
    d_.bytes_read_.fetch_add(bytes.size(), std::memory_order_relaxed);
    const std::string& path = r.paths.source;  // the sample's source path, as read() left it
    SampleDecoder& decoder = r.codec(d_.codec_);
    s_.jpegs[i] = decoder.image_payload(bytes, path, s_.unpacked[i]);
    const ImageHeader header = decoder.image.header(s_.jpegs[i], path);
    return {static_cast<uint32_t>(header.height), static_cast<uint32_t>(header.width)};
  }

  // The (height, width) of an image laid out as `info`.
  ImageSize image_size_of(const ArrayInfo& info) const {
    const size_t h = d_.options_.layout == Layout::kNCHW ? 1 : 0;
    return {static_cast<uint32_t>(info.shape[h]), static_cast<uint32_t>(info.shape[h + 1])};
  }

  // Step 1: sample i's size, type and shape (from catalog sample `id`), and the tier they came from.
  void size(size_t i, uint64_t id) {
    ArrayInfo& info = s_.probes[i].info;
    const Codec& codec = d_.codec_;
    if (codec.mode == DecodeMode::kJpeg) {
      // Every image decodes to the loader's size (nothing to read yet), or keeps its own.
      const LoaderOptions& o = d_.options_;
      const ImageSize size = unresized() ? read_image(i, id) : d_.image_size_;
      info.dtype = o.dtype == OutputType::kFloat32 ? "<f4" : "|u1";
      info.ndim = 3;
      info.shape = {};
      if (o.layout == Layout::kNCHW) {
        info.shape[0] = 3, info.shape[1] = size.height, info.shape[2] = size.width;
      } else {
        info.shape[0] = size.height, info.shape[1] = size.width, info.shape[2] = 3;
      }
      info.bytes = image_sample_bytes(size.height, size.width, o.dtype);
      s_.tiers[i] = Tier::kMemory;
      return;
    }
    Reader& r = reader();
    if (!codec.arrays()) {
      // Raw files: the file's (or byte range's) bytes as one array (Codec::raw_array).
      const auto bytes = d_.tiers_.read(id, held(i, id), s_.bytes[i], r.paths, b_.tally);
      s_.jpegs[i] = bytes;
      s_.tiers[i] = Tier::kMemory;
      const uint64_t n = bytes.size();
      d_.tiers_.check_size(id, n);
      codec.raw_array(n, "|u1", info, r.paths.source);
      return;
    }
    // Bytes in memory (stage 2's, or a home copy the peer tier sent into s_.bytes[i]) are kept
    // for step 3 and counted here; a copy on disk is opened again by step 3, which counts it.
    s_.in_memory[i] = 0;
    r.paths.fetch_into = &s_.bytes[i];
    const Catalog::Locator loc = d_.tiers_.catalog().locator(id);
    try {
      s_.tiers[i] = d_.tiers_.serve(id, Tier::kMemory, held(i, id), r.paths, b_.tally, Access::kFile,
                                    [&](const ByteSource& at) -> uint64_t {
                                      r.codec(codec).probe(at, loc, s_.probes[i]);
                                      if (at.file() != nullptr) return 0;
                                      s_.in_memory[i] = 1;
                                      s_.memory[i] = at.memory();
                                      return at.size();
                                    });
    } catch (...) {
      r.paths.fetch_into = nullptr;
      throw;
    }
    r.paths.fetch_into = nullptr;
  }

  // Step 3: sample i's data into its place (from catalog sample `id`).
  void fill(size_t i, uint64_t id) {
    const std::span<std::byte> out(slot_.data.data() + slot_.offsets[i],
                                   slot_.offsets[i + 1] - slot_.offsets[i]);
    Reader& r = reader();
    const Codec& codec = d_.codec_;
    if (codec.mode == DecodeMode::kJpeg) {
      fill_image(i, id, r, out);
      return;
    }
    if (!codec.arrays()) {
      // Step 1 read it (and counted the read).
      const std::span<const std::byte> bytes = s_.jpegs[i];
      if (bytes.size() != out.size()) {
        throw DecodeError(d_.tiers_.catalog().source_path(id).string(),
                          "its size differs from the failed sample's");
      }
      std::copy(bytes.begin(), bytes.end(), out.begin());
    } else if (s_.in_memory[i] != 0) {
      // Step 1 took its bytes from memory (and counted the read).
      const Catalog::Locator loc = d_.tiers_.catalog().locator(id);
      const std::string& path = d_.tiers_.source_path(loc.file, r.paths.source);
      r.codec(codec).fill(MemorySource(s_.memory[i], path), loc, s_.probes[i], out);
    } else {
      const Catalog::Locator loc = d_.tiers_.catalog().locator(id);
      d_.tiers_.serve(id, s_.tiers[i], std::nullopt, r.paths, b_.tally, Access::kFile,
                      [&](const ByteSource& at) -> uint64_t {
        r.codec(codec).fill(at, loc, s_.probes[i], out);
        return out.size();
      });
    }
    // Decoded bytes: what a compressed sample took on disk is not tracked per read.
    d_.bytes_read_.fetch_add(out.size(), std::memory_order_relaxed);
  }

  void fill_image(size_t i, uint64_t id, Reader& r, std::span<std::byte> place) {
    const LoaderOptions& o = d_.options_;
    const ImageSize size = image_size_of(s_.probes[i].info);
    // NHWC uint8 is what the codec writes: straight into the batch buffer. Anything else goes
    // through the reader's RGB image and is converted into place.
    const bool direct = o.layout != Layout::kNCHW && o.dtype == OutputType::kUint8;
    const size_t rgb_bytes = size_t{size.height} * size.width * 3;
    if (!direct && r.image.size() < rgb_bytes) r.image.resize(rgb_bytes);
    const std::span<std::byte> rgb(
        direct ? place.data() : reinterpret_cast<std::byte*>(r.image.data()), rgb_bytes);
    SampleDecoder& decoder = r.codec(d_.codec_);
    if (unresized()) {
      // Step 1 read the sample and found its JPEG.
      const std::string& path =
          d_.tiers_.source_path(d_.tiers_.catalog().locator(id).file, r.paths.source);
      decoder.image.decode_exact(s_.jpegs[i], size, rgb, path);
    } else {
      fill_resized(i, id, r, decoder, size, rgb);
    }
    if (!direct) {
      convert_image(r.image.data(), static_cast<int>(size.height), static_cast<int>(size.width),
                    o.layout, o.dtype, d_.normalizer_, place.data());
    }
  }

  // With an image_size: reads sample i (catalog sample `id`) and decodes it to `size` into `rgb`.
  void fill_resized(size_t i, uint64_t id, Reader& r, SampleDecoder& decoder, ImageSize size,
                    std::span<std::byte> rgb) {
    const LoaderOptions& o = d_.options_;
    const auto bytes = d_.tiers_.read(id, held(i, id), r.buffer, r.paths, b_.tally);
    d_.bytes_read_.fetch_add(bytes.size(), std::memory_order_relaxed);
    const std::string& path = r.paths.source;  // the sample's source path, as read() left it
    const auto jpeg = decoder.image_payload(bytes, path);
    if (o.transform == Transform::kRandomResizedCrop) {
      decoder.image.decode_random_crop(jpeg, size, o.seed, b_.epoch, id, rgb, path);
    } else {
      decoder.image.decode_resized(jpeg, size, rgb, path);
    }
  }

  // decode_device=cuda: every sample's JPEG read (in parallel, on the arena), then the batch
  // queued on the slot's GPU decoder, but for the CPU's share (gpu_cpu_share: its last samples),
  // which the readers decode meanwhile, in parallel, into the decoder's pinned places; those are
  // then copied into the device batch on the decoder's stream. A sample that cannot be read, or
  // that the CPU path cannot decode (the share, and the files the GPU sends it), is replaced or
  // fails as on the CPU path; replacements are decoded by the CPU path into their place.
  void gpu_run() {
    const size_t n = b_.count;
    const ImageSize size = d_.image_size_;
    const uint64_t image_bytes = uint64_t{size.height} * size.width * 3;
    slot_.device_data = nullptr;
    slot_.device_ready = nullptr;
    slot_.device_stream = nullptr;
    slot_.dtype = "|u1";
    slot_.ragged = false;
    slot_.shape = {n, size.height, size.width, 3};
    slot_.offsets.resize(n + 1);
    slot_.dims.clear();
    slot_.dim_offsets.resize(n + 1);
    for (size_t i = 0; i <= n; ++i) {
      slot_.offsets[i] = i * image_bytes;
      slot_.dim_offsets[i] = 3 * i;
      if (i < n) slot_.dims.insert(slot_.dims.end(), {size.height, size.width, 3});
    }
    slot_.data_bytes = 0;  // the images are on the device
    if (s_.bytes.size() < n) s_.bytes.resize(n);
    if (s_.unpacked.size() < n) s_.unpacked.resize(n);
    if (s_.paths.size() < n) s_.paths.resize(n);
    s_.jpegs.resize(n);
    each([&](size_t i) { read_jpeg(i, b_.ids[i]); },
         [&](size_t i, uint64_t id) { read_jpeg(i, id); });
    if ((slot_.error = first_error_.get())) return;

    const auto gpu_sample = [&](size_t i) {
      return GpuJpegDecoder::Sample{s_.jpegs[i], b_.epoch,
                                    static_cast<uint64_t>(slot_.indices[i]), &s_.paths[i]};
    };
    // The CPU's share (the batch's last samples, as GpuJpegDecoder would take them), sized so
    // that both parts finish together (GpuShare), is decoded by the readers while one of them
    // submits the GPU's part and the GPU works on it.
    const size_t cpu_count = d_.share_->cpu_count(n);
    const size_t gpu_count = n - cpu_count;
    s_.gpu_samples.clear();
    for (size_t i = 0; i < gpu_count; ++i) s_.gpu_samples.push_back(gpu_sample(i));
    try {
      // The current device is the thread's: the arena's threads start on device 0.
      const auto on_device = [&] {
        if (const int code = d_.gpu_->set_device(d_.gpu_device_); code != gpu::kCudaSuccess) {
          throw GpuError("GPU decode: cudaSetDevice failed: " + d_.gpu_->cuda_error(code));
        }
      };
      on_device();
      GpuSlot& slot_gpu = d_.gpu_slot(slot_);
      GpuJpegDecoder& gpu = slot_gpu.decoder;
      // The slot's previous batch is done: its copies out of the CPU's places (which the share
      // is about to write), and its GPU time if that was not known when it ended.
      gpu.wait();
      d_.measure(slot_gpu);
      const GpuJpegDecoder::Counters before = gpu.counters();
      const GpuCrop crop = d_.crop_->next();
      std::exception_ptr gpu_failure;
      s_.share_errors.assign(n, nullptr);
      // The share's wall time: its first start to its last end, on whichever readers took it.
      std::atomic<int64_t> first_start{INT64_MAX}, last_end{INT64_MIN};
      const auto now_ns = [] {
        return std::chrono::duration_cast<std::chrono::nanoseconds>(
                   Clock::now().time_since_epoch())
            .count();
      };
      each(
          [&](size_t i) {
            if (i == 0) {
              try {
                on_device();
                gpu.decode(s_.gpu_samples, 0, s_.routes, s_.gpu_errors, crop == GpuCrop::kRoi);
              } catch (...) {
                gpu_failure = std::current_exception();
              }
            }
            if (i < gpu_count) return;
            const int64_t started = now_ns();
            int64_t seen = first_start.load(std::memory_order_relaxed);
            while (started < seen && !first_start.compare_exchange_weak(seen, started)) {
            }
            const std::span<std::byte> place = gpu.cpu_place(i);
            Reader& r = reader();
            const uint64_t id = static_cast<uint64_t>(slot_.indices[i]);
            ImageDecoder& jpeg = r.codec(d_.codec_).image;
            try {
              if (d_.options_.transform == Transform::kRandomResizedCrop) {
                jpeg.decode_random_crop(s_.jpegs[i], size, d_.options_.seed, b_.epoch, id, place,
                                        s_.paths[i]);
              } else {
                jpeg.decode_resized(s_.jpegs[i], size, place, s_.paths[i]);
              }
            } catch (...) {
              s_.share_errors[i] = std::current_exception();  // replaced below, as the GPU's
            }
            const int64_t ended = now_ns();
            seen = last_end.load(std::memory_order_relaxed);
            while (ended > seen && !last_end.compare_exchange_weak(seen, ended)) {
            }
          },
          [](size_t, uint64_t) {});
      if (gpu_failure) std::rethrow_exception(gpu_failure);
      s_.gpu_errors.resize(n);
      for (size_t i = gpu_count; i < n; ++i) s_.gpu_errors[i] = s_.share_errors[i];
      if (cpu_count > 0) {
        // A failed sample's place is filled by its replacement (decode_on_cpu), or stays undefined.
        s_.cpu_positions.clear();
        for (size_t i = gpu_count; i < n; ++i) {
          if (s_.gpu_errors[i] == nullptr) s_.cpu_positions.push_back(i);
        }
        gpu.upload(0, s_.cpu_positions);
      }
      slot_gpu.pending_crop = crop;
      slot_gpu.pending_trial =
          slot_gpu.batches_by_way[crop == GpuCrop::kRoi ? 1 : 0]++ > 0 &&
          gpu.counters().buffer_growths == before.buffer_growths;
      slot_gpu.pending = GpuShareSample{
          gpu_count, 0, cpu_count,
          cpu_count > 0 ? static_cast<double>(last_end.load() - first_start.load()) * 1e-9 : 0};
      d_.measure(slot_gpu);  // now if the GPU is done, else at the slot's next batch
      // Counted together, once the batch's share is decoded too.
      d_.count_gpu(before, gpu.counters(), cpu_count);
      for (size_t i = 0; i < n; ++i) {
        if (s_.gpu_errors[i] == nullptr) continue;
        replace_or_fail(i, s_.gpu_errors[i], [&](size_t j, uint64_t id) {
          read_jpeg(j, id);
          const GpuJpegDecoder::Sample replacement{s_.jpegs[j], b_.epoch, id, &s_.paths[j]};
          gpu.decode_on_cpu(replacement, 0, j);
          d_.gpu_replacements_.fetch_add(1, std::memory_order_relaxed);
        });
      }
      slot_.device_data = gpu.output(0);
      slot_.device_ready = gpu.ready(0);
      slot_.device_stream = gpu.stream();
    } catch (...) {
      // A CUDA, nvJPEG or NPP failure: the whole batch is lost; the consumer gets the error.
      first_error_.record(0, std::current_exception());
    }
    slot_.error = first_error_.get();
  }

  // decode_device=cuda: reads sample i (catalog sample `id`) and keeps its JPEG and its path.
  void read_jpeg(size_t i, uint64_t id) {
    Reader& r = reader();
    const auto bytes = d_.tiers_.read(id, held(i, id), s_.bytes[i], r.paths, b_.tally);
    d_.bytes_read_.fetch_add(bytes.size(), std::memory_order_relaxed);
    s_.paths[i] = r.paths.source;  // the sample's source path, as read() left it
    s_.jpegs[i] = r.codec(d_.codec_).image_payload(bytes, s_.paths[i], s_.unpacked[i]);
  }

  // Step 2: the batch's type (the one most of its samples have; samples of another type fail or
  // are replaced), its layout (one array when the shapes agree, else ragged) and its buffer.
  bool lay_out() {
    const size_t n = b_.count;
    const std::string* expected = d_.codec_.mode == DecodeMode::kJpeg ? nullptr
                                                                       : d_.data_set_dtype(stopping_);
    const std::string& dtype = expected != nullptr ? *expected : batch_dtype();
    const std::string whose = expected != nullptr ? "the data set's " : "the batch's ";
    for (size_t i = 0; i < n; ++i) {
      if (s_.probes[i].info.dtype == dtype) continue;
      const ArrayInfo odd = s_.probes[i].info;
      replace_or_fail(
          i,
          std::make_exception_ptr(DecodeError(
              d_.tiers_.catalog().source_path(slot_.indices[i]).string(),
              "its dtype " + odd.dtype + " differs from " + whose + dtype)),
          [&](size_t j, uint64_t id) {
            size(j, id);
            if (s_.probes[j].info.dtype != dtype) {
              throw DecodeError(d_.tiers_.catalog().source_path(id).string(),
                                "its dtype " + s_.probes[j].info.dtype + " differs from " + whose +
                                    dtype);
            }
          });
    }
    if ((slot_.error = first_error_.get())) return false;

    const ArrayInfo& first = s_.probes[0].info;
    slot_.dtype = dtype;
    slot_.ragged = false;
    slot_.offsets.assign(n + 1, 0);
    slot_.dim_offsets.assign(n + 1, 0);
    slot_.dims.clear();
    uint64_t total = 0;
    for (size_t i = 0; i < n; ++i) {
      const ArrayInfo& info = s_.probes[i].info;
      if (info.bytes > SIZE_MAX - total) {
        slot_.error = std::make_exception_ptr(DecodeError(
            d_.tiers_.catalog().source_path(slot_.indices[i]).string(),
            "the batch would take more than the address space (" + std::to_string(total) +
                " bytes before this sample's " + std::to_string(info.bytes) + ")"));
        return false;
      }
      if (!info.same_layout(first)) slot_.ragged = true;
      total += info.bytes;
      slot_.offsets[i + 1] = total;
      for (const uint64_t dim : info.dims()) slot_.dims.push_back(dim);
      slot_.dim_offsets[i + 1] = slot_.dims.size();
    }
    slot_.shape = {n, 0, 0, 0};
    if (d_.codec_.mode == DecodeMode::kJpeg) {
      for (size_t k = 0; k < 3; ++k) slot_.shape[k + 1] = first.shape[k];
    }
    try {
      slot_.data.reserve(static_cast<size_t>(total));
    } catch (const std::bad_alloc&) {
      // No exception may leave a graph node: the batch carries it to the consumer.
      slot_.error = std::current_exception();
      return false;
    }
    slot_.data_bytes = static_cast<size_t>(total);
    return true;
  }

  // Without the data set's dtype: the dtype most samples of the batch have; of equal counts, the
  // earliest sample's.
  const std::string& batch_dtype() const {
    const std::string* best = &s_.probes[0].info.dtype;
    size_t best_count = 0;
    for (size_t i = 0; i < b_.count; ++i) {
      const std::string& dtype = s_.probes[i].info.dtype;
      if (i > 0 && dtype == *best) continue;
      size_t count = 0;
      for (size_t j = 0; j < b_.count; ++j) count += s_.probes[j].info.dtype == dtype;
      if (count > best_count) best = &dtype, best_count = count;
      if (best_count * 2 > b_.count) break;
    }
    return *best;
  }

  BatchDecoder& d_;
  const BatchSamples& b_;
  BatchScratch& s_;
  Slot& slot_;
  const std::atomic<bool>& stopping_;
  FirstError first_error_;
};

BatchDecoder::BatchDecoder(const LoaderOptions& options, const Codec& codec, ImageSize image_size,
                           const Normalizer* normalizer, Tiers& tiers)
    : options_(options),
      codec_(codec),
      image_size_(image_size),
      normalizer_(normalizer),
      tiers_(tiers),
      readers_(std::make_unique<tbb::enumerable_thread_specific<Reader>>()) {
  if (options.decode_device != DecodeDevice::kCuda) return;
  const gpu::Libraries& libraries = gpu::Libraries::instance();
  if (!libraries.available()) {
    throw ConfigError("decode_device='cuda' is not available: " + libraries.why());
  }
  if (const int code = libraries.get_device(&gpu_device_); code != gpu::kCudaSuccess) {
    throw ConfigError("decode_device='cuda': cudaGetDevice failed: " + libraries.cuda_error(code));
  }
  gpu_options_.max_batch = options.batch_size;
  gpu_options_.size = image_size;
  gpu_options_.transform = options.transform;
  gpu_options_.seed = options.seed;
  gpu_options_.max_pixels = options.max_pixels;
  gpu_options_.cpu_share = 0.0;  // the CPU's share is decoded on the readers (Run::gpu_run)
  gpu_options_.outputs = 1;  // one decoder per ring slot: its device batch is the slot's
  share_ = std::make_unique<GpuShare>(options.gpu_cpu_share, options.readers);
  gpu_options_.roi = options.gpu_crop != GpuCrop::kResize;
  gpu_options_.batched_resize = gpu_resize_batched();
  crop_ = std::make_unique<GpuCropChoice>(options.gpu_crop, libraries.roi());
  gpu_ = &libraries;
}

BatchDecoder::GpuSlot& BatchDecoder::gpu_slot(Slot& slot) {
  if (!slot.gpu) {
    auto made = std::make_shared<GpuSlot>(*gpu_, gpu_options_);
    if (!made->decoder.roi_available()) crop_->roi_unavailable();
    slot.gpu = std::move(made);
    gpu_decoders_.fetch_add(1, std::memory_order_relaxed);
  }
  return *static_cast<GpuSlot*>(slot.gpu.get());
}

void BatchDecoder::measure(GpuSlot& gpu) {
  if (!gpu.pending) return;
  const std::optional<double> seconds = gpu.decoder.gpu_seconds();
  if (!seconds) return;
  gpu.pending->gpu_s = *seconds;
  share_->observe(*gpu.pending);
  if (gpu.pending_trial) crop_->observe(gpu.pending_crop, gpu.pending->gpu_images, *seconds);
  gpu.pending.reset();
}

void BatchDecoder::count_gpu(const GpuJpegDecoder::Counters& before,
                             const GpuJpegDecoder::Counters& after, uint64_t cpu_share) {
  gpu_cpu_share_.fetch_add(cpu_share, std::memory_order_relaxed);
  const auto add = [](std::atomic<uint64_t>& to, uint64_t a, uint64_t b) {
    to.fetch_add(b - a, std::memory_order_relaxed);
  };
  add(gpu_batches_, before.batches, after.batches);
  add(gpu_hardware_, before.hardware, after.hardware);
  add(gpu_gpu_, before.gpu, after.gpu);
  add(gpu_cpu_share_, before.cpu_share, after.cpu_share);
  add(gpu_cpu_unsupported_, before.cpu_unsupported, after.cpu_unsupported);
  add(gpu_cpu_failed_, before.cpu_gpu_failed, after.cpu_gpu_failed);
  add(gpu_growths_, before.buffer_growths, after.buffer_growths);
  add(gpu_roi_, before.roi, after.roi);
}

Stats::GpuDecode BatchDecoder::gpu_stats() const {
  Stats::GpuDecode g;
  if (gpu_ == nullptr) return g;
  const auto get = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  g.on = true;
  g.why = gpu_->why();
  g.batches = get(gpu_batches_);
  g.hardware = get(gpu_hardware_);
  g.gpu = get(gpu_gpu_);
  g.cpu_share = get(gpu_cpu_share_);
  g.cpu_unsupported = get(gpu_cpu_unsupported_);
  g.cpu_gpu_failed = get(gpu_cpu_failed_);
  g.cpu_replacements = get(gpu_replacements_);
  g.buffer_growths = get(gpu_growths_);
  g.decoders = get(gpu_decoders_);
  const GpuShare::Report share = share_->report();
  g.share = share.share;
  g.share_auto = share.automatic;
  g.share_why = share.why;
  g.share_moves = share.moves;
  g.gpu_ms_per_image = share.gpu_ms_per_image;
  g.cpu_ms_per_image = share.cpu_ms_per_image;
  const GpuCropChoice::Report crop = crop_->report();
  g.crop = crop.crop == GpuCrop::kRoi ? "roi" : crop.crop == GpuCrop::kResize ? "resize" : "trying";
  g.crop_why = crop.why;
  g.roi = get(gpu_roi_);
  return g;
}

BatchDecoder::~BatchDecoder() = default;

void BatchDecoder::clear_thread_state() { readers_->clear(); }

const std::string* BatchDecoder::data_set_dtype(const std::atomic<bool>& stopping) {
  std::lock_guard lock(data_set_mutex_);
  if (data_set_probed_) return data_set_dtype_ ? &*data_set_dtype_ : nullptr;
  if (!codec_.arrays() || (codec_.mode == DecodeMode::kRaw && !codec_.raw_dtype.empty())) {
    // Declared or fixed: every sample has it or fails on its own (Codec::raw_array).
    data_set_probed_ = true;
    return nullptr;
  }
  const Catalog& catalog = tiers_.catalog();
  if (!catalog.dtype().empty() &&
      ((catalog.kind() == Catalog::Kind::kArrays && codec_.mode == DecodeMode::kNpy) ||
       (catalog.kind() == Catalog::Kind::kHdf5 && codec_.mode == DecodeMode::kHdf5) ||
       (catalog.kind() == Catalog::Kind::kTfrecord && codec_.mode == DecodeMode::kRaw))) {
    // Recorded by the catalog from every file's header (a sample has its array's dtype): no sample
    // is read for it.
    data_set_probed_ = true;
    data_set_dtype_ = catalog.dtype();
    return &*data_set_dtype_;
  }
  const uint64_t n = catalog.size();
  const uint64_t k = std::min(kDataSetProbes, n);
  SampleDecoder decoder(codec_);  // its own: the readers' are their threads'
  TierScratch paths;
  ArrayProbe probe;
  std::vector<std::string> found;  // in the order of the probes' ids
  for (uint64_t j = 0; j < k; ++j) {
    const uint64_t id = j * n / k;
    try {
      tiers_.serve(id, Tier::kStage, std::nullopt, paths, nullptr, Access::kFile,
                   [&](const ByteSource& at) -> uint64_t {
        decoder.probe(at, catalog.locator(id), probe);
        return 0;
      });
      found.push_back(probe.info.dtype);
    } catch (const Error&) {
      // Unreadable or undecodable: its batch reports it; the others decide.
    }
  }
  if (stopping.load(std::memory_order_acquire)) return nullptr;  // cancelled reads decide nothing
  data_set_probed_ = true;
  size_t best_count = 0;
  for (const std::string& dtype : found) {
    const auto count = static_cast<size_t>(std::count(found.begin(), found.end(), dtype));
    if (count > best_count) best_count = count, data_set_dtype_ = dtype;
  }
  return data_set_dtype_ ? &*data_set_dtype_ : nullptr;
}

void BatchDecoder::decode(const BatchSamples& batch, BatchScratch& scratch, Slot& slot,
                          const std::atomic<bool>& stopping) {
  slot.epoch = batch.epoch;
  slot.index = batch.index;
  slot.error = nullptr;
  slot.skipped.clear();
  slot.indices.assign(batch.ids, batch.ids + batch.count);
  slot.labels.resize(batch.count);
  for (size_t i = 0; i < batch.count; ++i) slot.labels[i] = tiers_.catalog().label(batch.ids[i]);
  if (stopping.load(std::memory_order_acquire)) return;  // nobody will look at it
  if (codec_.mode == DecodeMode::kLocate) {
    locate(batch, slot);
    return;
  }
  Run(*this, batch, scratch, slot, stopping)();
  scratch.trim();
  // Recorded in thread order: listed in batch order.
  std::sort(slot.skipped.begin(), slot.skipped.end(),
            [](const Slot::Skip& a, const Slot::Skip& b) { return a.position < b.position; });
  decoded_.fetch_add(batch.count, std::memory_order_relaxed);
}

void BatchDecoder::locate(const BatchSamples& batch, Slot& slot) {
  const size_t n = batch.count;
  slot.dtype = "|u1";
  slot.ragged = false;
  slot.shape = {n, 0, 0, 0};
  slot.offsets.resize(n + 1);
  for (size_t i = 0; i <= n; ++i) slot.offsets[i] = i;
  slot.dims.clear();
  slot.dim_offsets.assign(n + 1, 0);
  try {
    slot.data.reserve(n);
  } catch (const std::bad_alloc&) {
    slot.error = std::current_exception();
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    slot.data.data()[i] = static_cast<std::byte>(tiers_.locate(batch.ids[i], batch.tally));
  }
  slot.data_bytes = n;
  decoded_.fetch_add(n, std::memory_order_relaxed);
}

}  // namespace prestage::detail
