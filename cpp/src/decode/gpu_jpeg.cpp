#include "decode/gpu_jpeg.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>

#include "decode/jpeg.hpp"

namespace prestage::detail {

namespace {

constexpr size_t kRgbBytes = 3;
constexpr int kNppInterSuper = 8;  // NPPI_INTER_SUPER: area averaging, downscaling only
// The batched resize's arguments per image: source and destination descriptors and the boxes.
constexpr size_t kResizeArgBytes =
    2 * sizeof(gpu::NppImageDescriptor) + sizeof(gpu::NppResizeBatchRoi);

// Area averaging where the box shrinks both ways, bilinear otherwise.
int interpolation_for(const CropBox& box, int out_w, int out_h) {
  return box.width > out_w && box.height > out_h ? kNppInterSuper : gpu::kNppInterLinear;
}

// The centre of a gap split as torchvision's CenterCrop does (int(round(gap / 2.0)), half to even).
int centre_offset(int gap) {
  return static_cast<int>(std::nearbyint(static_cast<double>(gap) / 2.0));
}

bool gpu_can_take(int components, int subsampling) {
  if (components != 1 && components != 3) return false;  // CMYK/YCCK, or no colour model nvJPEG has
  return subsampling != gpu::kCss411 && subsampling != gpu::kCss410 &&
         subsampling != gpu::kCss410V && subsampling != gpu::kCssUnknown;
}

}  // namespace

CropBox centre_crop_box(int height, int width, ImageSize size) {
  // Resize makes the binding side exactly the output's; the box is the output mapped back.
  const int64_t out_h = size.height;
  const int64_t out_w = size.width;
  CropBox box;
  if (out_h * width >= out_w * height) {  // height binds: full height, a centred strip of width
    box.height = height;
    box.width =
        static_cast<int>(std::clamp<int64_t>((out_w * height + out_h / 2) / out_h, 1, width));
  } else {
    box.width = width;
    box.height =
        static_cast<int>(std::clamp<int64_t>((out_h * width + out_w / 2) / out_w, 1, height));
  }
  box.top = centre_offset(height - box.height);
  box.left = centre_offset(width - box.width);
  return box;
}

// The CPU path for the samples the GPU does not take.
struct GpuJpegDecoder::Cpu {
  explicit Cpu(uint64_t max_pixels) : jpeg(max_pixels) {}
  JpegDecoder jpeg;
};

// Per-batch bookkeeping, sized for max_batch once.
struct GpuJpegDecoder::Plan {
  std::vector<CropBox> boxes;
  std::vector<int> widths, heights;
  std::vector<size_t> input_offsets, decoded_offsets;
  // Per lane (0: hardware, 1: default): the positions, pointers, lengths and destinations.
  std::vector<size_t> members[2];
  std::vector<const unsigned char*> data[2];
  std::vector<size_t> lengths[2];
  std::vector<gpu::NvjpegImage> images[2];
  std::vector<gpu::NvjpegParams> params;  // the hardware lane's, where it decodes crop boxes
  std::vector<uint8_t> cropped;           // per position: only its box was decoded
  explicit Plan(size_t n)
      : boxes(n), widths(n), heights(n), input_offsets(n), decoded_offsets(n), cropped(n) {
    for (int lane = 0; lane < 2; ++lane) {
      members[lane].reserve(n);
      data[lane].reserve(n);
      lengths[lane].reserve(n);
      images[lane].reserve(n);
    }
    params.reserve(n);
  }
};

GpuJpegDecoder::GpuJpegDecoder(const gpu::Libraries& libraries, const Options& options)
    : lib_(libraries), options_(options) {
  if (!lib_.available()) throw ConfigError("decode_device='cuda': " + lib_.why());
  if (options_.max_batch == 0 || options_.size.empty() || options_.size.height > 1u << 15 ||
      options_.size.width > 1u << 15) {
    throw ConfigError(
        "decode_device='cuda' needs a batch size and an image_size (each side <= 32768)");
  }
  if (!(options_.cpu_share >= 0.0 && options_.cpu_share < 1.0)) {
    throw ConfigError("gpu_cpu_share must be in [0, 1)");
  }
  if (options_.outputs == 0) throw ConfigError("decode_device='cuda' needs at least one output");
  sample_bytes_ = size_t{options_.size.height} * options_.size.width * kRgbBytes;
  cpu_ = std::make_unique<Cpu>(options_.max_pixels);
  plan_ = std::make_unique<Plan>(options_.max_batch);
  try {
    check_cuda(lib_.get_device(&device_), "cudaGetDevice");
    int value = 0;
    npp_.device_id = device_;
    check_cuda(lib_.device_get_attribute(&value, gpu::kAttrMultiProcessorCount, device_),
               "cudaDeviceGetAttribute");
    npp_.multiprocessor_count = value;
    check_cuda(lib_.device_get_attribute(&value, gpu::kAttrMaxThreadsPerMultiProcessor, device_),
               "cudaDeviceGetAttribute");
    npp_.max_threads_per_multiprocessor = value;
    check_cuda(lib_.device_get_attribute(&value, gpu::kAttrMaxThreadsPerBlock, device_),
               "cudaDeviceGetAttribute");
    npp_.max_threads_per_block = value;
    check_cuda(lib_.device_get_attribute(&value, gpu::kAttrMaxSharedMemoryPerBlock, device_),
               "cudaDeviceGetAttribute");
    npp_.shared_mem_per_block = static_cast<size_t>(value);
    check_cuda(lib_.device_get_attribute(&value, gpu::kAttrComputeCapabilityMajor, device_),
               "cudaDeviceGetAttribute");
    npp_.compute_capability_major = value;
    check_cuda(lib_.device_get_attribute(&value, gpu::kAttrComputeCapabilityMinor, device_),
               "cudaDeviceGetAttribute");
    npp_.compute_capability_minor = value;
    check_cuda(lib_.stream_create_with_flags(&stream_, gpu::kStreamNonBlocking),
               "cudaStreamCreateWithFlags");
    npp_.stream = stream_;
    npp_.stream_flags = gpu::kStreamNonBlocking;
    check_cuda(lib_.event_create_with_flags(&staged_, gpu::kEventDisableTiming),
               "cudaEventCreateWithFlags");
    // Timing events (no cudaEventDisableTiming): the share of each batch the CPU takes is sized
    // from the GPU's time on its part (decode/gpu_share.hpp).
    check_cuda(lib_.event_create_with_flags(&began_, gpu::kEventDefault),
               "cudaEventCreateWithFlags");
    check_cuda(lib_.event_create_with_flags(&gpu_done_, gpu::kEventDefault),
               "cudaEventCreateWithFlags");
    ready_.reserve(options_.outputs);
    for (size_t k = 0; k < options_.outputs; ++k) {
      gpu::Event event = nullptr;
      check_cuda(lib_.event_create_with_flags(&event, gpu::kEventDisableTiming),
                 "cudaEventCreateWithFlags");
      ready_.push_back(event);
    }

    // The hardware engine where the library has the calls and the GPU has an engine: creating the
    // handle fails (NVJPEG_STATUS_ARCH_MISMATCH) without one, and some boards report 0 engines.
    if (lib_.nvjpeg_get_hardware_decoder_info != nullptr &&
        lib_.nvjpeg_create_ex(gpu::kBackendHardware, nullptr, nullptr, 0, &hw_handle_) ==
            gpu::kNvjpegSuccess) {
      unsigned engines = 0, cores = 0;
      if (lib_.nvjpeg_get_hardware_decoder_info(hw_handle_, &engines, &cores) !=
              gpu::kNvjpegSuccess ||
          engines == 0) {
        check_nvjpeg(lib_.nvjpeg_destroy(hw_handle_), "nvjpegDestroy");
        hw_handle_ = nullptr;
      }
    } else {
      hw_handle_ = nullptr;
    }
    if (hw_handle_ != nullptr) {
      check_nvjpeg(lib_.nvjpeg_state_create(hw_handle_, &hw_state_), "nvjpegJpegStateCreate");
      if (lib_.nvjpeg_decode_batched_pre_allocate != nullptr) {
        // A hint: CSS 4:4:4 covers every subsampling, so the memory is reused by all. Refused
        // (some library versions check the sizes), the engine allocates at its first batch.
        (void)lib_.nvjpeg_decode_batched_pre_allocate(hw_handle_, hw_state_,
                                                      static_cast<int>(options_.max_batch), 1, 1,
                                                      gpu::kCss444, gpu::kOutputRgbi);
      }
      streams_.reserve(options_.max_batch);
      for (size_t i = 0; i < options_.max_batch; ++i) {
        gpu::NvjpegStream s = nullptr;
        check_nvjpeg(lib_.nvjpeg_stream_create(hw_handle_, &s), "nvjpegJpegStreamCreate");
        streams_.push_back(s);
      }
      if (options_.roi && lib_.roi()) {
        params_.reserve(options_.max_batch);
        for (size_t i = 0; i < options_.max_batch; ++i) {
          gpu::NvjpegParams p = nullptr;
          check_nvjpeg(lib_.nvjpeg_params_create(hw_handle_, &p), "nvjpegDecodeParamsCreate");
          params_.push_back(p);
          check_nvjpeg(lib_.nvjpeg_params_set_output_format(p, gpu::kOutputRgbi),
                       "nvjpegDecodeParamsSetOutputFormat");
        }
      }
    }
    check_nvjpeg(lib_.nvjpeg_create_ex(gpu::kBackendDefault, nullptr, nullptr, 0, &handle_),
                 "nvjpegCreateEx");
    check_nvjpeg(lib_.nvjpeg_state_create(handle_, &state_), "nvjpegJpegStateCreate");

    const size_t batch_bytes = options_.max_batch * sample_bytes_;
    void* p = nullptr;
    outputs_.reserve(options_.outputs);
    for (size_t k = 0; k < options_.outputs; ++k) {
      p = nullptr;
      check_cuda(lib_.device_malloc(&p, batch_bytes), "cudaMalloc");
      outputs_.push_back(static_cast<std::byte*>(p));
    }
    p = nullptr;
    check_cuda(lib_.device_malloc(&p, sample_bytes_), "cudaMalloc");
    flip_ = static_cast<std::byte*>(p);
    p = nullptr;
    check_cuda(lib_.host_alloc(&p, batch_bytes, gpu::kHostAllocPortable), "cudaHostAlloc");
    cpu_output_ = static_cast<std::byte*>(p);
    if (options_.batched_resize && lib_.npp_resize_batch_8u_c3r_advanced != nullptr) {
      const size_t arg_bytes = options_.max_batch * kResizeArgBytes;
      p = nullptr;
      check_cuda(lib_.host_alloc(&p, arg_bytes, gpu::kHostAllocPortable), "cudaHostAlloc");
      resize_args_host_ = static_cast<std::byte*>(p);
      p = nullptr;
      check_cuda(lib_.device_malloc(&p, batch_bytes), "cudaMalloc");
      flips_ = static_cast<std::byte*>(p);
      p = nullptr;
      check_cuda(lib_.device_malloc(&p, arg_bytes), "cudaMalloc");
      resize_args_ = static_cast<std::byte*>(p);  // last: batched_resize() is true once all are
    }
  } catch (...) {
    destroy();
    throw;
  }
}

GpuJpegDecoder::~GpuJpegDecoder() { destroy(); }

void GpuJpegDecoder::destroy() noexcept {
  // Work still queued reads these buffers: it finishes first.
  if (stream_ != nullptr) lib_.stream_synchronize(stream_);
  if (cpu_output_ != nullptr) lib_.free_host(cpu_output_);
  if (input_ != nullptr) lib_.free_host(input_);
  if (resize_args_host_ != nullptr) lib_.free_host(resize_args_host_);
  for (std::byte* device : outputs_) lib_.device_free(device);
  outputs_.clear();
  for (std::byte* device : {flip_, decoded_, flips_, resize_args_}) {
    if (device != nullptr) lib_.device_free(device);
  }
  cpu_output_ = input_ = flip_ = decoded_ = resize_args_host_ = flips_ = resize_args_ = nullptr;
  for (gpu::NvjpegStream s : streams_) lib_.nvjpeg_stream_destroy(s);
  streams_.clear();
  for (gpu::NvjpegParams p : params_) lib_.nvjpeg_params_destroy(p);
  params_.clear();
  if (state_ != nullptr) lib_.nvjpeg_state_destroy(state_);
  if (handle_ != nullptr) lib_.nvjpeg_destroy(handle_);
  if (hw_state_ != nullptr) lib_.nvjpeg_state_destroy(hw_state_);
  if (hw_handle_ != nullptr) lib_.nvjpeg_destroy(hw_handle_);
  state_ = nullptr;
  handle_ = nullptr;
  hw_state_ = nullptr;
  hw_handle_ = nullptr;
  for (gpu::Event event : ready_) lib_.event_destroy(event);
  ready_.clear();
  if (staged_ != nullptr) lib_.event_destroy(staged_);
  if (began_ != nullptr) lib_.event_destroy(began_);
  if (gpu_done_ != nullptr) lib_.event_destroy(gpu_done_);
  if (stream_ != nullptr) lib_.stream_destroy(stream_);
  began_ = gpu_done_ = nullptr;
  staged_ = nullptr;
  stream_ = nullptr;
}

void GpuJpegDecoder::check_cuda(int code, const char* call) const {
  if (code != gpu::kCudaSuccess) {
    throw GpuError(std::string("GPU decode: ") + call + " failed: " + lib_.cuda_error(code));
  }
}

void GpuJpegDecoder::check_nvjpeg(int code, const char* call) const {
  if (code != gpu::kNvjpegSuccess) {
    throw GpuError(std::string("GPU decode: ") + call + " failed: nvjpegStatus " +
                   std::to_string(code));
  }
}

void GpuJpegDecoder::grow(std::byte*& buffer, size_t& capacity, size_t needed,
                          const std::function<int(void*)>& release,
                          const std::function<int(void**, size_t)>& allocate,
                          const char* release_call, const char* allocate_call) {
  if (needed <= capacity) return;
  const size_t grown = std::max(needed + needed / 2, size_t{1} << 20);
  if (buffer != nullptr) {
    check_cuda(release(buffer), release_call);
    buffer = nullptr;
    capacity = 0;
  }
  void* p = nullptr;
  check_cuda(allocate(&p, grown), allocate_call);
  buffer = static_cast<std::byte*>(p);
  capacity = grown;
  ++counters_.buffer_growths;
}

void GpuJpegDecoder::decode(std::span<const Sample> samples, size_t k,
                            std::vector<GpuRoute>& routes, std::vector<std::exception_ptr>& errors,
                            bool roi) {
  const size_t n = samples.size();
  if (n > options_.max_batch || k >= outputs_.size()) {
    throw std::logic_error("GpuJpegDecoder::decode: batch too large or no such output");
  }
  routes.assign(n, GpuRoute::kGpu);
  errors.assign(n, nullptr);
  // The previous batch's work reads the staging buffers.
  wait();
  timed_ = false;
  check_cuda(lib_.event_record(began_, stream_), "cudaEventRecord");
  try {
    queue(samples, outputs_[k], routes, errors, roi && roi_available());
  } catch (...) {
    // Work queued before the failure still reads the staging buffers: it ends before they are
    // reused or freed (staged_ was not recorded for it).
    lib_.stream_synchronize(stream_);
    throw;
  }
  check_cuda(lib_.event_record(ready_[k], stream_), "cudaEventRecord");
  check_cuda(lib_.event_record(staged_, stream_), "cudaEventRecord");
  ++counters_.batches;
}

void GpuJpegDecoder::queue(std::span<const Sample> samples, std::byte* output,
                           std::vector<GpuRoute>& routes, std::vector<std::exception_ptr>& errors,
                           bool roi) {
  const size_t n = samples.size();
  Plan& plan = *plan_;

  // 1. Headers: which samples the GPU takes, their boxes and the staging they need.
  const size_t cpu_count =
      std::min(n, static_cast<size_t>(std::llround(options_.cpu_share * static_cast<double>(n))));
  size_t input_bytes = 0, decoded_bytes = 0;
  for (size_t i = 0; i < n; ++i) {
    if (i >= n - cpu_count) {
      routes[i] = GpuRoute::kCpuShare;
      continue;
    }
    const Sample& s = samples[i];
    int components = 0, subsampling = 0;
    int widths[gpu::kNvjpegMaxComponent] = {}, heights[gpu::kNvjpegMaxComponent] = {};
    const int status =
        lib_.nvjpeg_get_image_info(handle_, reinterpret_cast<const unsigned char*>(s.jpeg.data()),
                                   s.jpeg.size(), &components, &subsampling, widths, heights);
    const uint64_t pixels = uint64_t(std::max(widths[0], 0)) * uint64_t(std::max(heights[0], 0));
    if (status != gpu::kNvjpegSuccess || !gpu_can_take(components, subsampling) || widths[0] <= 0 ||
        heights[0] <= 0 || pixels > options_.max_pixels) {
      routes[i] = GpuRoute::kCpuUnsupported;  // the CPU path decodes it or says why not
      continue;
    }
    plan.widths[i] = widths[0];
    plan.heights[i] = heights[0];
    plan.boxes[i] =
        options_.transform == Transform::kRandomResizedCrop
            ? random_resized_crop(options_.seed, s.epoch, s.index, heights[0], widths[0])
            : centre_crop_box(heights[0], widths[0], options_.size);
    plan.input_offsets[i] = input_bytes;
    plan.decoded_offsets[i] = decoded_bytes;
    input_bytes += (s.jpeg.size() + 255) & ~size_t{255};
    decoded_bytes += (pixels * kRgbBytes + 255) & ~size_t{255};
  }
  grow(
      input_, input_capacity_, input_bytes, [&](void* p) { return lib_.free_host(p); },
      [&](void** p, size_t n) { return lib_.host_alloc(p, n, gpu::kHostAllocPortable); },
      "cudaFreeHost", "cudaHostAlloc");
  grow(
      decoded_, decoded_capacity_, decoded_bytes, [&](void* p) { return lib_.device_free(p); },
      [&](void** p, size_t n) { return lib_.device_malloc(p, n); }, "cudaFree", "cudaMalloc");

  // 2. The GPU's samples into pinned staging, each to its lane.
  for (int lane = 0; lane < 2; ++lane) {
    plan.members[lane].clear();
    plan.data[lane].clear();
    plan.lengths[lane].clear();
    plan.images[lane].clear();
  }
  plan.params.clear();
  for (size_t i = 0; i < n; ++i) {
    plan.cropped[i] = 0;
    if (routes[i] != GpuRoute::kGpu) continue;
    const Sample& s = samples[i];
    auto* staged = reinterpret_cast<unsigned char*>(input_ + plan.input_offsets[i]);
    std::memcpy(staged, s.jpeg.data(), s.jpeg.size());
    int lane = 1;
    if (hw_handle_ != nullptr) {
      const CropBox& box = plan.boxes[i];
      int unsupported = 1;
      // With crop boxes, the engine is asked about this image with its box (DALI's check): one it
      // declines is decoded whole on the default backend.
      const bool taken =
          lib_.nvjpeg_stream_parse(hw_handle_, staged, s.jpeg.size(), 0, 0, streams_[i]) ==
              gpu::kNvjpegSuccess &&
          (roi ? lib_.nvjpeg_params_set_roi(params_[i], box.left, box.top, box.width, box.height) ==
                         gpu::kNvjpegSuccess &&
                     lib_.nvjpeg_decode_batched_supported_ex(hw_handle_, streams_[i], params_[i],
                                                             &unsupported) == gpu::kNvjpegSuccess
               : lib_.nvjpeg_decode_batched_supported(hw_handle_, streams_[i], &unsupported) ==
                     gpu::kNvjpegSuccess) &&
          unsupported == 0;
      if (taken) {
        lane = 0;
        routes[i] = GpuRoute::kHardware;
        if (roi) {
          plan.cropped[i] = 1;
          plan.params.push_back(params_[i]);
        }
      }
    }
    gpu::NvjpegImage image{};
    image.channel[0] = reinterpret_cast<unsigned char*>(decoded_ + plan.decoded_offsets[i]);
    // A cropped image is its box, rows of box.width pixels (in the whole image's staging place).
    image.pitch[0] =
        static_cast<size_t>(plan.cropped[i] ? plan.boxes[i].width : plan.widths[i]) * kRgbBytes;
    plan.members[lane].push_back(i);
    plan.data[lane].push_back(staged);
    plan.lengths[lane].push_back(s.jpeg.size());
    plan.images[lane].push_back(image);
  }

  // 3. Each lane in one batched call; a lane that fails goes to the CPU.
  for (int lane = 0; lane < 2; ++lane) {
    if (plan.members[lane].empty()) continue;
    gpu::NvjpegHandle handle = lane == 0 ? hw_handle_ : handle_;
    gpu::NvjpegState state = lane == 0 ? hw_state_ : state_;
    const int count = static_cast<int>(plan.members[lane].size());
    bool ok = lib_.nvjpeg_decode_batched_initialize(handle, state, count, 1, gpu::kOutputRgbi) ==
              gpu::kNvjpegSuccess;
    if (lane == 0 && roi) {
      ok = ok && lib_.nvjpeg_decode_batched_ex(handle, state, plan.data[lane].data(),
                                               plan.lengths[lane].data(), plan.images[lane].data(),
                                               plan.params.data(), stream_) == gpu::kNvjpegSuccess;
    } else {
      ok = ok && lib_.nvjpeg_decode_batched(handle, state, plan.data[lane].data(),
                                            plan.lengths[lane].data(), plan.images[lane].data(),
                                            stream_) == gpu::kNvjpegSuccess;
    }
    if (!ok) {
      for (size_t i : plan.members[lane]) routes[i] = GpuRoute::kCpuGpuFailed;
    }
  }

  // 4. Crop + resize (+ mirror) each decoded image into its place in the batch.
  if (batched_resize()) {
    resize_batched(routes, output);
  } else {
    resize_each(routes, output);
  }

  check_cuda(lib_.event_record(gpu_done_, stream_), "cudaEventRecord");
  timed_ = true;

  // 5. The CPU's samples, decoded as the CPU path does, then copied into their places.
  for (size_t i = 0; i < n; ++i) {
    switch (routes[i]) {
      case GpuRoute::kHardware:
        ++counters_.hardware;
        counters_.roi += plan.cropped[i];
        continue;
      case GpuRoute::kGpu:
        ++counters_.gpu;
        continue;
      case GpuRoute::kCpuShare:
        ++counters_.cpu_share;
        break;
      case GpuRoute::kCpuUnsupported:
        ++counters_.cpu_unsupported;
        break;
      case GpuRoute::kCpuGpuFailed:
        ++counters_.cpu_gpu_failed;
        break;
    }
    try {
      decode_cpu_place(samples[i], i);
    } catch (...) {
      errors[i] = std::current_exception();
      continue;
    }
    check_cuda(lib_.memcpy_async(output + i * sample_bytes_, cpu_output_ + i * sample_bytes_,
                                 sample_bytes_, gpu::kMemcpyHostToDevice, stream_),
               "cudaMemcpyAsync");
  }
}

namespace {

// Where image i's box is read from: the whole decoded image and the box in it, or the decoded box
// itself (region decode).
struct ResizeSource {
  gpu::NppSize size;
  gpu::NppRect window;
};

// Every image of the device batch: its width, height and bytes per row.
struct Output {
  int width, height, step;
};

Output output_of(ImageSize size) {
  const int width = static_cast<int>(size.width);
  return {width, static_cast<int>(size.height), width * static_cast<int>(kRgbBytes)};
}

ResizeSource resize_source(const CropBox& box, int width, int height, bool cropped) {
  if (cropped) return {{box.width, box.height}, {0, 0, box.width, box.height}};
  return {{width, height}, {box.left, box.top, box.width, box.height}};
}

}  // namespace

void GpuJpegDecoder::resize_each(std::span<const GpuRoute> routes, std::byte* output) {
  const Plan& plan = *plan_;
  const Output out = output_of(options_.size);
  for (size_t i = 0; i < routes.size(); ++i) {
    if (routes[i] != GpuRoute::kHardware && routes[i] != GpuRoute::kGpu) continue;
    const CropBox& box = plan.boxes[i];
    std::byte* dst = output + i * sample_bytes_;
    uint8_t* resized = reinterpret_cast<uint8_t*>(box.flip ? flip_ : dst);
    const ResizeSource from =
        resize_source(box, plan.widths[i], plan.heights[i], plan.cropped[i] != 0);
    const int status = lib_.npp_resize_8u_c3r(
        reinterpret_cast<const uint8_t*>(decoded_ + plan.decoded_offsets[i]),
        from.size.width * static_cast<int>(kRgbBytes), from.size, from.window, resized, out.step,
        gpu::NppSize{out.width, out.height}, gpu::NppRect{0, 0, out.width, out.height},
        interpolation_for(box, out.width, out.height), npp_);
    ++counters_.resize_calls;
    if (status < 0) {
      throw GpuError("GPU decode: nppiResize_8u_C3R_Ctx failed: NppStatus " +
                     std::to_string(status));
    }
    if (box.flip) mirror(resized, dst);
  }
}

void GpuJpegDecoder::resize_batched(std::span<const GpuRoute> routes, std::byte* output) {
  const Plan& plan = *plan_;
  const size_t max = options_.max_batch;
  const Output out = output_of(options_.size);
  // Three arrays of max_batch each, in the pinned buffer and alike on the device; the images of
  // one interpolation are contiguous in each (area averaging first, then bilinear).
  auto* sources = reinterpret_cast<gpu::NppImageDescriptor*>(resize_args_host_);
  auto* destinations = sources + max;
  auto* rois = reinterpret_cast<gpu::NppResizeBatchRoi*>(destinations + max);
  size_t count[2] = {0, 0};
  for (int pass = 0; pass < 2; ++pass) {
    const int interpolation = pass == 0 ? kNppInterSuper : gpu::kNppInterLinear;
    for (size_t i = 0; i < routes.size(); ++i) {
      if (routes[i] != GpuRoute::kHardware && routes[i] != GpuRoute::kGpu) continue;
      const CropBox& box = plan.boxes[i];
      if (interpolation_for(box, out.width, out.height) != interpolation) continue;
      const ResizeSource from =
          resize_source(box, plan.widths[i], plan.heights[i], plan.cropped[i] != 0);
      const size_t at = count[0] + count[1];
      sources[at] = {decoded_ + plan.decoded_offsets[i],
                     from.size.width * static_cast<int>(kRgbBytes), from.size};
      destinations[at] = {(box.flip ? flips_ : output) + i * sample_bytes_, out.step,
                          gpu::NppSize{out.width, out.height}};
      rois[at] = {from.window, gpu::NppRect{0, 0, out.width, out.height}};
      ++count[pass];
    }
  }
  if (count[0] + count[1] == 0) return;
  check_cuda(lib_.memcpy_async(resize_args_, resize_args_host_, max * kResizeArgBytes,
                               gpu::kMemcpyHostToDevice, stream_),
             "cudaMemcpyAsync");
  auto* device_sources = reinterpret_cast<gpu::NppImageDescriptor*>(resize_args_);
  auto* device_destinations = device_sources + max;
  auto* device_rois = reinterpret_cast<gpu::NppResizeBatchRoi*>(device_destinations + max);
  size_t first = 0;
  for (int pass = 0; pass < 2; ++pass) {
    if (count[pass] == 0) continue;
    const int status = lib_.npp_resize_batch_8u_c3r_advanced(
        out.width, out.height, device_sources + first, device_destinations + first,
        device_rois + first, static_cast<unsigned>(count[pass]),
        pass == 0 ? kNppInterSuper : gpu::kNppInterLinear, npp_);
    ++counters_.resize_calls;
    if (status < 0) {
      throw GpuError("GPU decode: nppiResizeBatch_8u_C3R_Advanced_Ctx failed: NppStatus " +
                     std::to_string(status));
    }
    first += count[pass];
  }
  for (size_t i = 0; i < routes.size(); ++i) {
    if ((routes[i] == GpuRoute::kHardware || routes[i] == GpuRoute::kGpu) && plan.boxes[i].flip) {
      mirror(reinterpret_cast<uint8_t*>(flips_ + i * sample_bytes_), output + i * sample_bytes_);
    }
  }
}

void GpuJpegDecoder::mirror(const uint8_t* resized, std::byte* dst) {
  const Output out = output_of(options_.size);
  const int status =
      lib_.npp_mirror_8u_c3r(resized, out.step, reinterpret_cast<uint8_t*>(dst), out.step,
                             gpu::NppSize{out.width, out.height}, gpu::kNppVerticalAxis, npp_);
  if (status < 0) {
    throw GpuError("GPU decode: nppiMirror_8u_C3R_Ctx failed: NppStatus " + std::to_string(status));
  }
}

void GpuJpegDecoder::wait() { check_cuda(lib_.event_synchronize(staged_), "cudaEventSynchronize"); }

std::optional<double> GpuJpegDecoder::gpu_seconds() const {
  if (!timed_) return std::nullopt;
  float ms = 0;
  // Not ready: the work still runs. Any other code: no measurement, which is no reason to fail a
  // batch whose work was queued.
  if (lib_.event_elapsed_time(&ms, began_, gpu_done_) != gpu::kCudaSuccess) return std::nullopt;
  return static_cast<double>(ms) * 1e-3;
}

void GpuJpegDecoder::decode_cpu_place(const Sample& s, size_t i) {
  static const std::string kNoPath;
  const std::string& path = s.path != nullptr ? *s.path : kNoPath;
  std::span<std::byte> out(cpu_output_ + i * sample_bytes_, sample_bytes_);
  if (options_.transform == Transform::kRandomResizedCrop) {
    cpu_->jpeg.decode_random_crop(s.jpeg, options_.size, options_.seed, s.epoch, s.index, out,
                                  path);
  } else {
    cpu_->jpeg.decode_resized(s.jpeg, options_.size, out, path);
  }
}

void GpuJpegDecoder::upload(size_t k, std::span<const size_t> positions) {
  if (k >= outputs_.size()) throw std::logic_error("GpuJpegDecoder::upload: no such output");
  for (const size_t i : positions) {
    if (i >= options_.max_batch) throw std::logic_error("GpuJpegDecoder::upload: no such place");
    check_cuda(lib_.memcpy_async(outputs_[k] + i * sample_bytes_, cpu_output_ + i * sample_bytes_,
                                 sample_bytes_, gpu::kMemcpyHostToDevice, stream_),
               "cudaMemcpyAsync");
  }
  check_cuda(lib_.event_record(ready_[k], stream_), "cudaEventRecord");
  check_cuda(lib_.event_record(staged_, stream_), "cudaEventRecord");
}

void GpuJpegDecoder::decode_on_cpu(const Sample& sample, size_t k, size_t i) {
  if (i >= options_.max_batch || k >= outputs_.size()) {
    throw std::logic_error("GpuJpegDecoder::decode_on_cpu: no such place or output");
  }
  // Place i of the pinned CPU output is free: decode() queued no copy from it for this batch (its
  // sample failed), and the copies of earlier batches ended before decode() began (staged_).
  decode_cpu_place(sample, i);
  check_cuda(lib_.memcpy_async(outputs_[k] + i * sample_bytes_, cpu_output_ + i * sample_bytes_,
                               sample_bytes_, gpu::kMemcpyHostToDevice, stream_),
             "cudaMemcpyAsync");
  check_cuda(lib_.event_record(ready_[k], stream_), "cudaEventRecord");
  check_cuda(lib_.event_record(staged_, stream_), "cudaEventRecord");
}

}  // namespace prestage::detail
