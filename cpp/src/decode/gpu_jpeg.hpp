// Stage 3 on the GPU: a batch of JPEGs decoded by nvJPEG into device memory, cropped and resized by
// NPP with the boxes the CPU path draws (decode/transform.hpp; or only the boxes decoded, by the
// hardware engine, then resized whole), flipped, and written as one device batch (NHWC, uint8).
// Images the GPU cannot take (CMYK, 4:1:1/4:1:0, over max_pixels, headers nvJPEG refuses, a lane
// whose batched decode fails) and a fixed share of each batch (Options::cpu_share) go to the CPU
// path (JpegDecoder), whose pixels are copied into the same device batch; a CPU failure is the CPU
// path's own DecodeError, kept per sample. Only gpu_libs.hpp's declarations are used: no CUDA
// header at build time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "decode/gpu_libs.hpp"
#include "decode/transform.hpp"
#include "prestage/error.hpp"
#include "prestage/options.hpp"

namespace prestage::detail {

// A CUDA, nvJPEG or NPP call failed: the call and its code. The batch being decoded is lost; the
// decoder stays usable (or is destroyed cleanly).
class GpuError : public Error {
 public:
  using Error::Error;
};

// Where a sample of a batch was decoded, and if on the CPU, why.
enum class GpuRoute : uint8_t {
  kHardware,        // nvJPEG's hardware engine (A100, H100)
  kGpu,             // nvJPEG's default (CUDA/hybrid) backend
  kCpuShare,        // the CPU's share of the batch (Options::cpu_share)
  kCpuUnsupported,  // the GPU cannot take it (format, size, a header nvJPEG refuses)
  kCpuGpuFailed,    // its lane's batched decode failed on the GPU
};

// The centre crop box that Resize(shorter side) + CenterCrop(size) reads from an image of
// height x width: the largest box of the output's aspect ratio, centred (integer source pixels).
CropBox centre_crop_box(int height, int width, ImageSize size);

// One decoder per GPU batch stream: owns a CUDA stream, events, nvJPEG handles (hardware and
// default backends) and every buffer, created once (staging buffers grow only when a batch's
// compressed bytes or decoded images exceed all before; none is allocated per image). Not
// thread-safe: one thread calls decode() at a time.
class GpuJpegDecoder {
 public:
  struct Options {
    size_t max_batch = 0;
    ImageSize size;  // output size of every image (not empty)
    Transform transform = Transform::kRandomResizedCrop;
    uint64_t seed = 0;
    uint64_t max_pixels = 0;  // larger images go to the CPU path (which refuses them)
    double cpu_share = 0.0;   // in [0, 1): the last round(share * n) go to the CPU
    size_t outputs = 1;       // device batches, each with its event: one per slot of the batch ring
    // Make what decode(..., roi=true) needs (a decode parameter object per batch place), where
    // there is a hardware engine and the library has the calls (gpu::Libraries::roi()).
    bool roi = false;
    // Resize the images of a batch in one NPP call per interpolation
    // (nppiResizeBatch_8u_C3R_Advanced_Ctx) where the library has it, instead of one call per
    // image. Not yet measured on a GPU: the loader sets it only under PRESTAGE_GPU_RESIZE=batch.
    bool batched_resize = false;
  };
  struct Sample {
    std::span<const std::byte> jpeg;  // host memory, valid during decode()
    uint64_t epoch = 0;
    uint64_t index = 0;                 // the sample's catalog index (seeds its crop box)
    const std::string* path = nullptr;  // for the CPU path's errors
  };
  struct Counters {
    uint64_t batches = 0;
    uint64_t hardware = 0;  // images decoded by the hardware engine
    uint64_t gpu = 0;       // by the default backend
    uint64_t cpu_share = 0;
    uint64_t cpu_unsupported = 0;
    uint64_t cpu_gpu_failed = 0;
    uint64_t roi = 0;             // of `hardware`, images of which only the crop box was decoded
    uint64_t buffer_growths = 0;  // times a staging buffer grew (0 after the first batches)
    uint64_t resize_calls = 0;    // NPP resize calls: one per image, or one per batched group
  };

  // Throws ConfigError if `libraries` is not available() (naming where it looked) or the options
  // are out of range; GpuError if a CUDA/nvJPEG call fails while setting up.
  GpuJpegDecoder(const gpu::Libraries& libraries, const Options& options);
  // Waits for the stream, then destroys every object it created, once.
  ~GpuJpegDecoder();
  GpuJpegDecoder(const GpuJpegDecoder&) = delete;
  GpuJpegDecoder& operator=(const GpuJpegDecoder&) = delete;

  // Decodes samples (at most max_batch) into output(k) (k < outputs): sample i at output(k) + i *
  // sample_bytes(). Waits first for the previous batch's work (the staging buffers are reused).
  // Returns when the work is queued on stream(); ready(k) is recorded after it: wait on it
  // (cudaStreamWaitEvent) before reading output(k), which stays valid until the next decode into
  // k; the caller makes sure no work still reads output(k) when it passes k again (the ring's slot
  // discipline). routes[i] says where sample i went; errors[i] holds the CPU path's error for a
  // sample it could not decode (its place in output(k) is then undefined), else null. Throws
  // GpuError if a CUDA or NPP call fails (output(k) is then undefined).
  // `roi` (where roi_available()): the hardware engine decodes only each image's crop box, which
  // NPP then resizes whole (GpuCrop::kRoi); else it decodes whole images and NPP's resize reads
  // the box (kResize). An image the engine cannot take with its box goes to the default backend,
  // decoded whole.
  void decode(std::span<const Sample> samples, size_t k, std::vector<GpuRoute>& routes,
              std::vector<std::exception_ptr>& errors, bool roi = false);
  bool roi_available() const noexcept { return !params_.empty(); }

  // Decodes `sample` by the CPU path into place i of output(k), after the work decode() queued for
  // k, and records ready(k) again: for a sample decode() left undecoded (its replacement under
  // on_error=skip). Throws the CPU path's error (DecodeError) for a sample it cannot decode, then
  // leaving output(k) as it was; GpuError if the copy cannot be queued.
  void decode_on_cpu(const Sample& sample, size_t k, size_t i);

  // For a caller that decodes part of a batch itself (the loader's CPU share, on its readers):
  // place i (i < max_batch) of the pinned host buffer whose places upload() copies into output(k).
  // A place is free for positions decode() was not given in this batch (decode() waits for the
  // previous batch's copies first). Any thread may write distinct places.
  std::span<std::byte> cpu_place(size_t i) noexcept {
    return {cpu_output_ + i * sample_bytes_, sample_bytes_};
  }
  // Queues the copy of cpu_place(i) into place i of output(k) for each i of `positions`, after the
  // work decode() queued for k, and records ready(k) again. Throws GpuError.
  void upload(size_t k, std::span<const size_t> positions);

  // Waits until the work queued for the last batch (its decode, uploads and CPU copies) is done:
  // every cpu_place() is then free, and gpu_seconds() known. decode() waits for it anyway. Throws
  // GpuError.
  void wait();
  // The last decode()'s GPU time: seconds from the start of its submission to the completion of its
  // GPU work (nvJPEG's decode and the crop/resize; not the CPU path's copies queued after), as the
  // stream's timing events measure it. Empty while that work runs, and when the batch failed or
  // the runtime cannot say. Never waits.
  std::optional<double> gpu_seconds() const;

  const std::byte* output(size_t k) const noexcept { return outputs_[k]; }  // device memory
  size_t sample_bytes() const noexcept { return sample_bytes_; }
  gpu::Stream stream() const noexcept { return stream_; }
  gpu::Event ready(size_t k) const noexcept { return ready_[k]; }
  bool hardware() const noexcept { return hw_handle_ != nullptr; }
  // Options::batched_resize was asked for and the library has the batched call.
  bool batched_resize() const noexcept { return resize_args_ != nullptr; }
  const Counters& counters() const noexcept { return counters_; }

 private:
  void queue(std::span<const Sample> samples, std::byte* output, std::vector<GpuRoute>& routes,
             std::vector<std::exception_ptr>& errors, bool roi);
  void check_cuda(int code, const char* call) const;
  void check_nvjpeg(int code, const char* call) const;
  // A buffer of at least `needed` bytes (half as much again, 1 MiB at least), `release`d and
  // `allocate`d anew when it is smaller; counted in buffer_growths.
  void grow(std::byte*& buffer, size_t& capacity, size_t needed,
            const std::function<int(void*)>& release,
            const std::function<int(void**, size_t)>& allocate, const char* release_call,
            const char* allocate_call);
  void destroy() noexcept;
  // Step 4 of queue(): the crop + resize (+ mirror) of each image the GPU decoded.
  void resize_each(std::span<const GpuRoute> routes, std::byte* output);
  void resize_batched(std::span<const GpuRoute> routes, std::byte* output);
  // The left-right mirror of a resized image (device) into its place in the batch.
  void mirror(const uint8_t* resized, std::byte* dst);
  // The CPU path's pixels of `s` into cpu_output_'s place i; throws its error.
  void decode_cpu_place(const Sample& s, size_t i);

  const gpu::Libraries& lib_;
  Options options_;
  size_t sample_bytes_ = 0;
  Counters counters_;
  int device_ = 0;
  gpu::NppStreamContext npp_{};
  gpu::Stream stream_ = nullptr;
  std::vector<gpu::Event> ready_;          // per output: its batch's work is done
  gpu::Event staged_ = nullptr;            // the last batch's work is done with the staging
  gpu::Event began_ = nullptr;             // timing: the last batch's submission began
  gpu::Event gpu_done_ = nullptr;          // timing: its GPU decode and resize are done
  bool timed_ = false;                     // both recorded for the last batch
  gpu::NvjpegHandle hw_handle_ = nullptr;  // null: no hardware engine
  gpu::NvjpegState hw_state_ = nullptr;
  gpu::NvjpegHandle handle_ = nullptr;  // the default backend
  gpu::NvjpegState state_ = nullptr;
  std::vector<gpu::NvjpegStream> streams_;  // max_batch, with hw_handle_ (parsing for the check)
  std::vector<gpu::NvjpegParams> params_;   // max_batch, with hw_handle_, where Options::roi
  std::byte* input_ = nullptr;              // pinned: the batch's compressed bytes
  size_t input_capacity_ = 0;
  std::byte* decoded_ = nullptr;  // device: the batch's full decoded images
  size_t decoded_capacity_ = 0;
  std::vector<std::byte*> outputs_;  // device: max_batch * sample_bytes_ each
  std::byte* flip_ = nullptr;        // device: one image, the resize before its mirror
  std::byte* cpu_output_ = nullptr;  // pinned: max_batch * sample_bytes_, the CPU's share
  // Options::batched_resize: the batched call's arguments (source and destination descriptors,
  // boxes; max_batch each), written in pinned memory and copied to the device per batch; and the
  // resized images that are then mirrored (device, max_batch * sample_bytes_).
  std::byte* resize_args_host_ = nullptr;
  std::byte* resize_args_ = nullptr;
  std::byte* flips_ = nullptr;
  struct Cpu;
  std::unique_ptr<Cpu> cpu_;
  struct Plan;
  std::unique_ptr<Plan> plan_;  // per-batch scratch, sized once
};

}  // namespace prestage::detail
