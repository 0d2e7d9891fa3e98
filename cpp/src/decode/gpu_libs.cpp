#include "decode/gpu_libs.hpp"

#include <dlfcn.h>

#include <string>
#include <utility>

#include "util/cuda_open.hpp"

namespace prestage::detail::gpu {

namespace {

enum Which { kCudart = 0, kNvjpeg = 1, kNpp = 2 };
constexpr const char* kLibrary[] = {"cudart", "nvjpeg", "nppig"};
constexpr const char* kVariable[] = {"PRESTAGE_CUDART", "PRESTAGE_NVJPEG", "PRESTAGE_NPP"};

template <typename Function>
void bind(void* library, const char* name, Function& out, std::string& missing) {
  out = reinterpret_cast<Function>(::dlsym(library, name));
  if (out == nullptr && missing.empty()) missing = name;
}

template <typename Function>
void bind_optional(void* library, const char* name, Function& out) {
  out = reinterpret_cast<Function>(::dlsym(library, name));
}

}  // namespace

Libraries::Libraries(const std::string& cudart, const std::string& nvjpeg, const std::string& npp) {
  const std::string* specs[] = {&cudart, &nvjpeg, &npp};
  for (int which = 0; which < 3; ++which) {
    CudaLibrary library = open_cuda_library(kLibrary[which], *specs[which], kVariable[which]);
    if (library.handle == nullptr) {
      why_ = "no GPU decoding: " + library.why;
      return;
    }
    handles_[which] = library.handle;
    opened_[which] = std::move(library.name);
  }
  bind_all();
}

void Libraries::bind_all() {
  std::string missing;
  void* rt = handles_[kCudart];
  bind(rt, "cudaGetDeviceCount", get_device_count, missing);
  bind(rt, "cudaGetDevice", get_device, missing);
  bind(rt, "cudaSetDevice", set_device, missing);
  bind(rt, "cudaDeviceGetAttribute", device_get_attribute, missing);
  bind(rt, "cudaMalloc", device_malloc, missing);
  bind(rt, "cudaFree", device_free, missing);
  bind(rt, "cudaHostAlloc", host_alloc, missing);
  bind(rt, "cudaFreeHost", free_host, missing);
  bind(rt, "cudaMemcpyAsync", memcpy_async, missing);
  bind(rt, "cudaStreamCreateWithFlags", stream_create_with_flags, missing);
  bind(rt, "cudaStreamDestroy", stream_destroy, missing);
  bind(rt, "cudaStreamSynchronize", stream_synchronize, missing);
  bind(rt, "cudaEventCreateWithFlags", event_create_with_flags, missing);
  bind(rt, "cudaEventRecord", event_record, missing);
  bind(rt, "cudaEventSynchronize", event_synchronize, missing);
  bind(rt, "cudaEventElapsedTime", event_elapsed_time, missing);
  bind(rt, "cudaEventDestroy", event_destroy, missing);
  bind(rt, "cudaGetErrorString", get_error_string, missing);
  if (!missing.empty()) {
    why_ = opened_[kCudart] + " has no " + missing;
    return;
  }
  void* jpeg = handles_[kNvjpeg];
  bind(jpeg, "nvjpegCreateEx", nvjpeg_create_ex, missing);
  bind(jpeg, "nvjpegDestroy", nvjpeg_destroy, missing);
  bind(jpeg, "nvjpegJpegStateCreate", nvjpeg_state_create, missing);
  bind(jpeg, "nvjpegJpegStateDestroy", nvjpeg_state_destroy, missing);
  bind(jpeg, "nvjpegJpegStreamCreate", nvjpeg_stream_create, missing);
  bind(jpeg, "nvjpegJpegStreamDestroy", nvjpeg_stream_destroy, missing);
  bind(jpeg, "nvjpegGetImageInfo", nvjpeg_get_image_info, missing);
  bind(jpeg, "nvjpegJpegStreamParse", nvjpeg_stream_parse, missing);
  bind(jpeg, "nvjpegDecodeBatchedSupported", nvjpeg_decode_batched_supported, missing);
  bind(jpeg, "nvjpegDecodeBatchedInitialize", nvjpeg_decode_batched_initialize, missing);
  bind(jpeg, "nvjpegDecodeBatched", nvjpeg_decode_batched, missing);
  // Newer than the rest (nvJPEG 11.4 and 11.9): without them the hardware engine is not used.
  bind_optional(jpeg, "nvjpegGetHardwareDecoderInfo", nvjpeg_get_hardware_decoder_info);
  bind_optional(jpeg, "nvjpegDecodeBatchedPreAllocate", nvjpeg_decode_batched_pre_allocate);
  bind_optional(jpeg, "nvjpegDecodeParamsCreate", nvjpeg_params_create);
  bind_optional(jpeg, "nvjpegDecodeParamsDestroy", nvjpeg_params_destroy);
  bind_optional(jpeg, "nvjpegDecodeParamsSetOutputFormat", nvjpeg_params_set_output_format);
  bind_optional(jpeg, "nvjpegDecodeParamsSetROI", nvjpeg_params_set_roi);
  bind_optional(jpeg, "nvjpegDecodeBatchedSupportedEx", nvjpeg_decode_batched_supported_ex);
  bind_optional(jpeg, "nvjpegDecodeBatchedEx", nvjpeg_decode_batched_ex);
  if (!missing.empty()) {
    why_ = opened_[kNvjpeg] + " has no " + missing;
    return;
  }
  void* npp = handles_[kNpp];
  bind(npp, "nppiResize_8u_C3R_Ctx", npp_resize_8u_c3r, missing);
  bind(npp, "nppiMirror_8u_C3R_Ctx", npp_mirror_8u_c3r, missing);
  bind_optional(npp, "nppiResizeBatch_8u_C3R_Advanced_Ctx", npp_resize_batch_8u_c3r_advanced);
  if (!missing.empty()) {
    why_ = opened_[kNpp] + " has no " + missing;
    return;
  }
  int devices = 0;
  if (const int code = get_device_count(&devices); code != kCudaSuccess || devices < 1) {
    why_ = code != kCudaSuccess ? "cudaGetDeviceCount failed: " + cuda_error(code)
                                : std::string("no CUDA device");
    return;
  }
  available_ = true;
  why_ = "GPU decoding with " + opened_[kNvjpeg] + " and " + opened_[kNpp] + " (" +
         opened_[kCudart] + ")";
}

Libraries::~Libraries() {
  for (void* handle : handles_) {
    if (handle != nullptr) ::dlclose(handle);
  }
}

const Libraries& Libraries::instance() {
  // Leaked on purpose: decoders may be destroyed by static destructors at exit.
  static const Libraries* const libraries = [] {
    auto env = [](const char* name) {
      const char* value = std::getenv(name);
      return std::string(value != nullptr ? value : "");
    };
    return new Libraries(env("PRESTAGE_CUDART"), env("PRESTAGE_NVJPEG"), env("PRESTAGE_NPP"));
  }();
  return *libraries;
}

std::string Libraries::cuda_error(int code) const {
  const char* text = get_error_string != nullptr ? get_error_string(code) : nullptr;
  return std::to_string(code) + (text != nullptr ? std::string(" (") + text + ")" : std::string());
}

}  // namespace prestage::detail::gpu
