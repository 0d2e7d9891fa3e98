#include "memory/cuda_host.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace prestage::detail {

namespace {

// From the CUDA runtime's ABI (driver_types.h), stable across versions.
constexpr int kCudaSuccess = 0;
constexpr unsigned kCudaHostRegisterPortable =
    0x01;  // pinned for every context, not only the current

template <typename Function>
bool bind(void* library, const char* name, Function& out, std::string& missing) {
  out = reinterpret_cast<Function>(::dlsym(library, name));
  if (out == nullptr && missing.empty()) missing = name;
  return out != nullptr;
}

}  // namespace

CudaHost::CudaHost(const std::string& spec)
    : CudaHost(open_cuda_library("cudart", spec, "PRESTAGE_CUDART")) {}

CudaHost::CudaHost(const std::vector<std::string>& candidates)
    : CudaHost(open_first_of("cudart", candidates, "PRESTAGE_CUDART")) {}

CudaHost::CudaHost(CudaLibrary runtime) {
  if (runtime.handle == nullptr) {
    why_ = "no CUDA registration: " + runtime.why;
    return;
  }
  library_ = runtime.handle;
  bind_all(runtime.name);
}

void CudaHost::bind_all(const std::string& opened) {
  std::string missing;
  bind(library_, "cudaGetDeviceCount", get_device_count_, missing);
  bind(library_, "cudaGetDevice", get_device_, missing);
  bind(library_, "cudaSetDevice", set_device_, missing);
  bind(library_, "cudaHostRegister", host_register_, missing);
  bind(library_, "cudaHostUnregister", host_unregister_, missing);
  bind(library_, "cudaGetErrorString", get_error_string_, missing);
  if (!missing.empty()) {
    why_ = opened + " has no " + missing;
    return;
  }
  int devices = 0;
  if (const int code = get_device_count_(&devices); code != kCudaSuccess) {
    why_ = failure("cudaGetDeviceCount", code);
    return;
  }
  if (devices < 1) {
    why_ = "no CUDA device";
    return;
  }
  available_ = true;
  why_ = "registered with cudaHostRegister (" + opened + ")";
}

CudaHost::~CudaHost() {
  if (library_ != nullptr) ::dlclose(library_);
}

const CudaHost& CudaHost::instance() {
  // Leaked on purpose: a ring's buffers may be unregistered by static destructors at exit.
  static const CudaHost* const host = [] {
    const char* spec = std::getenv("PRESTAGE_CUDART");
    return new CudaHost(spec != nullptr ? spec : "");
  }();
  return *host;
}

int CudaHost::current_device() const noexcept {
  if (!available_) return -1;
  int device = -1;
  return get_device_(&device) == kCudaSuccess ? device : -1;
}

std::string CudaHost::register_memory(void* data, size_t bytes, int device) const {
  if (!available_) return why_;
  // cudaHostRegister creates a context on the thread's current device, which is 0 in a thread that
  // never chose one (a decode thread): on a node with one rank per GPU that would put every rank's
  // context on GPU 0. The device of the thread that made the ring is made current instead.
  if (device >= 0) {
    int current = -1;
    if (const int code = get_device_(&current); code != kCudaSuccess) {
      return failure("cudaGetDevice", code);
    }
    if (current != device) {
      if (const int code = set_device_(device); code != kCudaSuccess) {
        return failure("cudaSetDevice", code);
      }
    }
  }
  if (const int code = host_register_(data, bytes, kCudaHostRegisterPortable);
      code != kCudaSuccess) {
    return failure("cudaHostRegister", code);
  }
  return {};
}

int CudaHost::unregister_memory(void* data) const noexcept {
  if (!available_) return -1;
  return host_unregister_(data);
}

std::string CudaHost::failure(const char* call, int code) const {
  const char* text = get_error_string_ != nullptr ? get_error_string_(code) : nullptr;
  return std::string(call) + " failed: " + std::to_string(code) +
         (text != nullptr ? std::string(" (") + text + ")" : std::string());
}

}  // namespace prestage::detail
