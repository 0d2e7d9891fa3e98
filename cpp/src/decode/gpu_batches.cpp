#include "decode/gpu_batches.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

#include "decode/batch_run.hpp"
#include "prestage/error.hpp"

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

}  // namespace

struct GpuBatches::SlotDecoder {
  SlotDecoder(const gpu::Libraries& libraries, const GpuJpegDecoder::Options& options)
      : decoder(libraries, options) {}
  GpuJpegDecoder decoder;
  std::optional<GpuShareSample> pending;    // the last batch's times, its GPU time still unknown
  GpuCrop pending_crop = GpuCrop::kResize;  // the way that batch applied its crop boxes
  // That batch is a fair trial of its crop way: not the first this decoder took that way (nvJPEG's
  // first-use allocations and set-up) and no staging buffer grew in it (allocation time, not
  // decoding). On an H200 the first batches' times per image varied 3x between runs, and
  // gpu_crop="auto" chose either way.
  bool pending_trial = false;
  uint64_t batches_by_way[2] = {0, 0};  // resize, roi
};

// One batch on the GPU backend.
class GpuRun : public BatchRun {
 public:
  GpuRun(GpuBatches& g, BatchDecoder& d, const BatchSamples& b, BatchScratch& s, Slot& slot,
         const std::atomic<bool>& stopping)
      : BatchRun(d, b, s, slot, stopping), g_(g) {}

  // decode_device=cuda: every sample's JPEG read (in parallel, on the arena), then the batch
  // queued on the slot's GPU decoder, but for the CPU's share (gpu_cpu_share: its last samples),
  // which the readers decode meanwhile, in parallel, into the decoder's pinned places; those are
  // then copied into the device batch on the decoder's stream. A sample that cannot be read, or
  // that the CPU path cannot decode (the share, and the files the GPU sends it), is replaced or
  // fails as on the CPU path; replacements are decoded by the CPU path into their place.
  void operator()() {
    s_.tiers.assign(b_.count, Tier::kMemory);
    s_.probes.resize(b_.count);
    const size_t n = b_.count;
    const ImageSize size = image_size();
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
    s_.kept.assign(n, std::nullopt);
    each([&](size_t i) { read_jpeg(i, b_.ids[i]); },
         [&](size_t i, uint64_t id) { read_jpeg(i, id); });
    if ((slot_.error = first_error_.get())) return;

    const auto gpu_sample = [&](size_t i) {
      return GpuJpegDecoder::Sample{*s_.kept[i], b_.epoch, static_cast<uint64_t>(slot_.indices[i]),
                                    &s_.paths[i]};
    };
    // The CPU's share (the batch's last samples, as GpuJpegDecoder would take them), sized so
    // that both parts finish together (GpuShare), is decoded by the readers while one of them
    // submits the GPU's part and the GPU works on it.
    const size_t cpu_count = g_.share_->cpu_count(n);
    const size_t gpu_count = n - cpu_count;
    s_.gpu_samples.clear();
    for (size_t i = 0; i < gpu_count; ++i) s_.gpu_samples.push_back(gpu_sample(i));
    try {
      // The current device is the thread's: the arena's threads start on device 0.
      const auto on_device = [&] {
        if (const int code = g_.libraries_->set_device(g_.device_); code != gpu::kCudaSuccess) {
          throw GpuError("GPU decode: cudaSetDevice failed: " + g_.libraries_->cuda_error(code));
        }
      };
      on_device();
      GpuBatches::SlotDecoder& slot_gpu = g_.slot(slot_);
      GpuJpegDecoder& gpu = slot_gpu.decoder;
      // The slot's previous batch is done: its copies out of the CPU's places (which the share
      // is about to write), and its GPU time if that was not known when it ended.
      gpu.wait();
      g_.measure(slot_gpu);
      const GpuJpegDecoder::Counters before = gpu.counters();
      const GpuCrop crop = g_.crop_->next();
      std::exception_ptr gpu_failure;
      s_.share_errors.assign(n, nullptr);
      // The share's wall time: its first start to its last end, on whichever readers took it.
      std::atomic<int64_t> first_start{INT64_MAX}, last_end{INT64_MIN};
      const auto now_ns = [] {
        return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
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
            ImageDecoder& jpeg = r.codec(codec()).image;
            try {
              if (options().transform == Transform::kRandomResizedCrop) {
                jpeg.decode_random_crop(*s_.kept[i], size, seed(), b_.epoch, id, place,
                                        s_.paths[i]);
              } else {
                jpeg.decode_resized(*s_.kept[i], size, place, s_.paths[i]);
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
      slot_gpu.pending_trial = slot_gpu.batches_by_way[crop == GpuCrop::kRoi ? 1 : 0]++ > 0 &&
                               gpu.counters().buffer_growths == before.buffer_growths;
      slot_gpu.pending = GpuShareSample{
          gpu_count, 0, cpu_count,
          cpu_count > 0 ? static_cast<double>(last_end.load() - first_start.load()) * 1e-9 : 0};
      g_.measure(slot_gpu);  // now if the GPU is done, else at the slot's next batch
      // Counted together, once the batch's share is decoded too.
      g_.count(before, gpu.counters(), cpu_count);
      for (size_t i = 0; i < n; ++i) {
        if (s_.gpu_errors[i] == nullptr) continue;
        replace_or_fail(i, s_.gpu_errors[i], [&](size_t j, uint64_t id) {
          read_jpeg(j, id);
          const GpuJpegDecoder::Sample replacement{*s_.kept[j], b_.epoch, id, &s_.paths[j]};
          gpu.decode_on_cpu(replacement, 0, j);
          g_.replacements_.fetch_add(1, std::memory_order_relaxed);
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
    const auto bytes =
        tiers().open(SampleBytes{id, held(i, id), s_.bytes[i], r.paths}, b_.tally).bytes;
    count_read(bytes.size());
    s_.paths[i] = r.paths.source;  // the sample's source path, as the read left it
    s_.kept[i] = r.codec(codec()).image_payload(bytes, s_.paths[i], s_.unpacked[i]);
  }

  GpuBatches& g_;
};

GpuBatches::GpuBatches(const LoaderDecodeOptions& options, const LoaderPlanOptions& plan,
                       uint64_t readers, ImageSize image_size) {
  const gpu::Libraries& libraries = gpu::Libraries::instance();
  if (!libraries.available()) {
    throw ConfigError("decode_device='cuda' is not available: " + libraries.why());
  }
  if (const int code = libraries.get_device(&device_); code != gpu::kCudaSuccess) {
    throw ConfigError("decode_device='cuda': cudaGetDevice failed: " + libraries.cuda_error(code));
  }
  options_.max_batch = plan.batch_size;
  options_.size = image_size;
  options_.transform = options.transform;
  options_.seed = plan.seed;
  options_.max_pixels = options.max_pixels;
  options_.cpu_share = 0.0;  // the CPU's share is decoded on the readers (GpuRun)
  options_.outputs = 1;      // one decoder per ring slot: its device batch is the slot's
  share_ = std::make_unique<GpuShare>(options.gpu_cpu_share, readers);
  options_.roi = options.gpu_crop != GpuCrop::kResize;
  options_.batched_resize = gpu_resize_batched();
  crop_ = std::make_unique<GpuCropChoice>(options.gpu_crop, libraries.roi());
  libraries_ = &libraries;
}

GpuBatches::~GpuBatches() = default;

void GpuBatches::decode(BatchDecoder& decoder, const BatchSamples& batch, BatchScratch& scratch,
                        Slot& slot, const std::atomic<bool>& stopping) {
  GpuRun run(*this, decoder, batch, scratch, slot, stopping);
  run();
}

GpuBatches::SlotDecoder& GpuBatches::slot(Slot& slot) {
  if (!slot.gpu) {
    auto made = std::make_shared<SlotDecoder>(*libraries_, options_);
    if (!made->decoder.roi_available()) crop_->roi_unavailable();
    slot.gpu = std::move(made);
    decoders_.fetch_add(1, std::memory_order_relaxed);
  }
  return *static_cast<SlotDecoder*>(slot.gpu.get());
}

void GpuBatches::measure(SlotDecoder& gpu) {
  if (!gpu.pending) return;
  const std::optional<double> seconds = gpu.decoder.gpu_seconds();
  if (!seconds) return;
  gpu.pending->gpu_s = *seconds;
  share_->observe(*gpu.pending);
  if (gpu.pending_trial) crop_->observe(gpu.pending_crop, gpu.pending->gpu_images, *seconds);
  gpu.pending.reset();
}

void GpuBatches::count(const GpuJpegDecoder::Counters& before,
                       const GpuJpegDecoder::Counters& after, uint64_t cpu_share) {
  // The CPU's share is the readers' (GpuRun): the decoders' own is off (options_.cpu_share 0).
  cpu_share_.fetch_add(cpu_share, std::memory_order_relaxed);
  const auto add = [](std::atomic<uint64_t>& to, uint64_t a, uint64_t b) {
    to.fetch_add(b - a, std::memory_order_relaxed);
  };
  add(batches_, before.batches, after.batches);
  add(hardware_, before.hardware, after.hardware);
  add(gpu_, before.gpu, after.gpu);
  add(cpu_unsupported_, before.cpu_unsupported, after.cpu_unsupported);
  add(cpu_failed_, before.cpu_gpu_failed, after.cpu_gpu_failed);
  add(growths_, before.buffer_growths, after.buffer_growths);
  add(roi_, before.roi, after.roi);
}

Stats::GpuDecode GpuBatches::stats() const {
  Stats::GpuDecode g;
  const auto get = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  g.on = true;
  g.why = libraries_->why();
  g.batches = get(batches_);
  g.hardware = get(hardware_);
  g.gpu = get(gpu_);
  g.cpu_share = get(cpu_share_);
  g.cpu_unsupported = get(cpu_unsupported_);
  g.cpu_gpu_failed = get(cpu_failed_);
  g.cpu_replacements = get(replacements_);
  g.buffer_growths = get(growths_);
  g.decoders = get(decoders_);
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
  g.roi = get(roi_);
  return g;
}

}  // namespace prestage::detail
