// Stage 3 on the GPU: the CUDA runtime, nvJPEG and NPP, opened at run time. prestage has no
// build-time CUDA dependency: the few types and entry points the GPU JPEG decoder uses are declared
// here, by hand, from NVIDIA's published headers (cuda_runtime_api.h, driver_types.h, nvjpeg.h,
// nppdefs.h, nppi_geometry_transforms.h). They are ABI:
// the enum values and the struct layouts below must match those headers exactly.
//
// Which libraries: PRESTAGE_CUDART (as memory/cuda_host.hpp), PRESTAGE_NVJPEG (libnvjpeg) and
// PRESTAGE_NPP (libnppig; it loads its libnppc itself) each name one to open, a path or a soname;
// unset or empty, util/cuda_open.hpp's cuda_search() says where each is looked for.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace prestage::detail::gpu {

// --- CUDA runtime (driver_types.h); cudaError_t is an int-sized enum. ---
using Stream = void*;  // cudaStream_t
using Event = void*;   // cudaEvent_t
inline constexpr int kCudaSuccess = 0;
inline constexpr int kCudaErrorNotReady = 600;         // cudaErrorNotReady
inline constexpr unsigned kEventDefault = 0x00;        // cudaEventDefault: timing on
inline constexpr unsigned kStreamNonBlocking = 0x01;   // cudaStreamNonBlocking
inline constexpr unsigned kEventDisableTiming = 0x02;  // cudaEventDisableTiming
inline constexpr unsigned kHostAllocPortable = 0x01;   // cudaHostAllocPortable
inline constexpr int kMemcpyHostToDevice = 1;          // cudaMemcpyHostToDevice
inline constexpr int kMemcpyDeviceToHost = 2;          // cudaMemcpyDeviceToHost
// cudaDeviceAttr values.
inline constexpr int kAttrMaxThreadsPerBlock = 1;
inline constexpr int kAttrMaxSharedMemoryPerBlock = 8;
inline constexpr int kAttrMultiProcessorCount = 16;
inline constexpr int kAttrMaxThreadsPerMultiProcessor = 39;
inline constexpr int kAttrComputeCapabilityMajor = 75;
inline constexpr int kAttrComputeCapabilityMinor = 76;

// --- nvJPEG (nvjpeg.h) ---
using NvjpegHandle = struct nvjpegHandle*;        // nvjpegHandle_t
using NvjpegState = struct nvjpegJpegState*;      // nvjpegJpegState_t
using NvjpegStream = struct nvjpegJpegStream*;    // nvjpegJpegStream_t
using NvjpegParams = struct nvjpegDecodeParams*;  // nvjpegDecodeParams_t
inline constexpr int kNvjpegSuccess = 0;          // NVJPEG_STATUS_SUCCESS
inline constexpr int kNvjpegArchMismatch = 7;     // NVJPEG_STATUS_ARCH_MISMATCH
inline constexpr int kBackendDefault = 0;         // NVJPEG_BACKEND_DEFAULT
inline constexpr int kBackendHardware = 3;        // NVJPEG_BACKEND_HARDWARE
inline constexpr int kOutputRgbi = 5;             // NVJPEG_OUTPUT_RGBI: interleaved RGB
// nvjpegChromaSubsampling_t
inline constexpr int kCss444 = 0, kCss422 = 1, kCss420 = 2, kCss440 = 3, kCss411 = 4, kCss410 = 5,
                     kCssGray = 6, kCss410V = 7, kCssUnknown = -1;
inline constexpr int kNvjpegMaxComponent = 4;  // NVJPEG_MAX_COMPONENT
struct NvjpegImage {                           // nvjpegImage_t
  unsigned char* channel[kNvjpegMaxComponent];
  size_t pitch[kNvjpegMaxComponent];  // size_t since CUDA 11 (older: unsigned int)
};
static_assert(sizeof(NvjpegImage) == 64);

// --- NPP (nppdefs.h); NppStatus is an int, 0 = NPP_SUCCESS, < 0 errors, > 0 warnings. ---
struct NppSize {
  int width, height;
};  // NppiSize
struct NppRect {
  int x, y, width, height;
};  // NppiRect
struct NppStreamContext {  // NppStreamContext, passed by value
  Stream stream;
  int device_id;
  int multiprocessor_count;
  int max_threads_per_multiprocessor;
  int max_threads_per_block;
  size_t shared_mem_per_block;
  int compute_capability_major;
  int compute_capability_minor;
  unsigned stream_flags;
  int reserved0;
};
static_assert(sizeof(NppStreamContext) == 48);
struct NppImageDescriptor {  // NppiImageDescriptor
  void* data;
  int step;
  NppSize size;
};
static_assert(sizeof(NppImageDescriptor) == 24);
struct NppResizeBatchRoi {  // NppiResizeBatchROI_Advanced
  NppRect source;
  NppRect destination;
};
static_assert(sizeof(NppResizeBatchRoi) == 32);
inline constexpr int kNppInterLinear = 2;   // NPPI_INTER_LINEAR
inline constexpr int kNppVerticalAxis = 1;  // NPP_VERTICAL_AXIS: mirrors left to right

// The three libraries' entry points, bound once; const afterwards, so any thread may call them.
class Libraries {
 public:
  // Opens the libraries the specs name ("" each: its default search). Never throws: available() is
  // false and why() names every place looked at when one is missing or lacks an entry point, or
  // the runtime sees no device.
  Libraries(const std::string& cudart, const std::string& nvjpeg, const std::string& npp);
  ~Libraries();
  Libraries(const Libraries&) = delete;
  Libraries& operator=(const Libraries&) = delete;

  // The process's libraries, as PRESTAGE_CUDART, PRESTAGE_NVJPEG and PRESTAGE_NPP say: opened on
  // first use, once, thread-safe; never destroyed.
  static const Libraries& instance();

  bool available() const noexcept { return available_; }
  // available(): the libraries opened; else why not (one sentence naming where it looked).
  const std::string& why() const noexcept { return why_; }

  // Text for a runtime error code ("<code> (<text>)").
  std::string cuda_error(int code) const;

  // CUDA runtime.
  int (*get_device_count)(int*) = nullptr;
  int (*get_device)(int*) = nullptr;
  int (*set_device)(int) = nullptr;
  int (*device_get_attribute)(int*, int, int) = nullptr;
  int (*device_malloc)(void**, size_t) = nullptr;
  int (*device_free)(void*) = nullptr;
  int (*host_alloc)(void**, size_t, unsigned) = nullptr;
  int (*free_host)(void*) = nullptr;
  int (*memcpy_async)(void*, const void*, size_t, int, Stream) = nullptr;
  int (*stream_create_with_flags)(Stream*, unsigned) = nullptr;
  int (*stream_destroy)(Stream) = nullptr;
  int (*stream_synchronize)(Stream) = nullptr;
  int (*event_create_with_flags)(Event*, unsigned) = nullptr;
  int (*event_record)(Event, Stream) = nullptr;
  int (*event_synchronize)(Event) = nullptr;
  // cudaEventElapsedTime(ms, start, end): kCudaErrorNotReady while `end` has not completed.
  int (*event_elapsed_time)(float*, Event, Event) = nullptr;
  int (*event_destroy)(Event) = nullptr;
  const char* (*get_error_string)(int) = nullptr;

  // nvJPEG (the allocator arguments of nvjpegCreateEx are passed as null: the defaults).
  int (*nvjpeg_create_ex)(int backend, void* dev_allocator, void* pinned_allocator, unsigned flags,
                          NvjpegHandle*) = nullptr;
  int (*nvjpeg_destroy)(NvjpegHandle) = nullptr;
  // Optional (nvJPEG >= 11.9): null where the library lacks it; then no hardware engine is used.
  int (*nvjpeg_get_hardware_decoder_info)(NvjpegHandle, unsigned*, unsigned*) = nullptr;
  int (*nvjpeg_state_create)(NvjpegHandle, NvjpegState*) = nullptr;
  int (*nvjpeg_state_destroy)(NvjpegState) = nullptr;
  int (*nvjpeg_stream_create)(NvjpegHandle, NvjpegStream*) = nullptr;
  int (*nvjpeg_stream_destroy)(NvjpegStream) = nullptr;
  int (*nvjpeg_get_image_info)(NvjpegHandle, const unsigned char*, size_t, int*, int*, int*,
                               int*) = nullptr;
  int (*nvjpeg_stream_parse)(NvjpegHandle, const unsigned char*, size_t, int save_metadata,
                             int save_stream, NvjpegStream) = nullptr;
  int (*nvjpeg_decode_batched_supported)(NvjpegHandle, NvjpegStream, int*) = nullptr;
  // Optional (nvJPEG >= 11.4): null where the library lacks it.
  int (*nvjpeg_decode_batched_pre_allocate)(NvjpegHandle, NvjpegState, int, int, int, int,
                                            int) = nullptr;
  int (*nvjpeg_decode_batched_initialize)(NvjpegHandle, NvjpegState, int batch_size,
                                          int max_cpu_threads, int output_format) = nullptr;
  int (*nvjpeg_decode_batched)(NvjpegHandle, NvjpegState, const unsigned char* const*,
                               const size_t*, NvjpegImage*, Stream) = nullptr;
  // Optional, together (nvJPEG >= 11.6): per-image decode parameters, so that the hardware engine
  // decodes only a region of each image (nvjpegDecodeBatchedEx, checked per image with
  // nvjpegDecodeBatchedSupportedEx). Null where the library lacks any: roi() is false.
  int (*nvjpeg_params_create)(NvjpegHandle, NvjpegParams*) = nullptr;
  int (*nvjpeg_params_destroy)(NvjpegParams) = nullptr;
  int (*nvjpeg_params_set_output_format)(NvjpegParams, int) = nullptr;
  int (*nvjpeg_params_set_roi)(NvjpegParams, int x, int y, int width, int height) = nullptr;
  int (*nvjpeg_decode_batched_supported_ex)(NvjpegHandle, NvjpegStream, NvjpegParams,
                                            int*) = nullptr;
  int (*nvjpeg_decode_batched_ex)(NvjpegHandle, NvjpegState, const unsigned char* const*,
                                  const size_t*, NvjpegImage*, NvjpegParams*, Stream) = nullptr;
  bool roi() const noexcept {
    return nvjpeg_params_create != nullptr && nvjpeg_params_destroy != nullptr &&
           nvjpeg_params_set_output_format != nullptr && nvjpeg_params_set_roi != nullptr &&
           nvjpeg_decode_batched_supported_ex != nullptr && nvjpeg_decode_batched_ex != nullptr;
  }

  // NPP (image geometry, libnppig).
  int (*npp_resize_8u_c3r)(const uint8_t*, int, NppSize, NppRect, uint8_t*, int, NppSize, NppRect,
                           int, NppStreamContext) = nullptr;
  int (*npp_mirror_8u_c3r)(const uint8_t*, int, uint8_t*, int, NppSize, int,
                           NppStreamContext) = nullptr;
  // Optional: null where the library lacks it. nppiResizeBatch_8u_C3R_Advanced_Ctx: `count`
  // images, each with its own source, box and destination; the three arrays in device memory.
  int (*npp_resize_batch_8u_c3r_advanced)(int max_width, int max_height,
                                          NppImageDescriptor* sources,
                                          NppImageDescriptor* destinations, NppResizeBatchRoi* rois,
                                          unsigned count, int interpolation,
                                          NppStreamContext) = nullptr;

 private:
  void bind_all();

  void* handles_[3] = {nullptr, nullptr, nullptr};  // dlopen handles, closed by the destructor
  std::string opened_[3];
  bool available_ = false;
  std::string why_;
};

}  // namespace prestage::detail::gpu
