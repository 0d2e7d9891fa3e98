#include "memory/cuda_host.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace prestage::detail {

namespace {

// From the CUDA runtime's ABI (driver_types.h), stable across versions.
constexpr int kCudaSuccess = 0;
constexpr unsigned kCudaHostRegisterPortable = 0x01;  // pinned for every context, not only the current

template <typename Function>
bool bind(void* library, const char* name, Function& out, std::string& missing) {
  out = reinterpret_cast<Function>(::dlsym(library, name));
  if (out == nullptr && missing.empty()) missing = name;
  return out != nullptr;
}

}  // namespace

CudaHost::CudaHost(const std::string& spec) {
  if (spec == "none") {
    why_ = "CUDA registration turned off (PRESTAGE_CUDART=none)";
    return;
  }
  if (spec.empty()) {
    std::string here;
    Dl_info info;
    if (::dladdr(reinterpret_cast<void*>(&CudaHost::instance), &info) != 0 &&
        info.dli_fname != nullptr) {
      here = std::filesystem::path(info.dli_fname).parent_path().string();
    }
    const char* cuda_home = std::getenv("CUDA_HOME");
    open_first(default_search(here, cuda_home != nullptr ? cuda_home : ""));
    return;
  }
  library_ = ::dlopen(spec.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library_ == nullptr) {
    const char* error = ::dlerror();
    why_ = "PRESTAGE_CUDART=" + spec + " cannot be opened: " + (error ? error : "unknown error");
    return;
  }
  bind_all(spec);
}

CudaHost::CudaHost(const std::vector<std::string>& candidates) { open_first(candidates); }

void CudaHost::open_first(const std::vector<std::string>& candidates) {
  for (const std::string& name : candidates) {
    library_ = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library_ != nullptr) {
      bind_all(name);
      return;
    }
  }
  why_ = "no CUDA runtime found (tried";
  for (size_t i = 0; i < candidates.size(); ++i) why_ += (i == 0 ? " " : ", ") + candidates[i];
  why_ += "; a bare name is searched on LD_LIBRARY_PATH and the ld.so cache); "
          "PRESTAGE_CUDART=/path/to/libcudart.so.N names one";
}

std::vector<std::string> CudaHost::default_search(const std::string& package_dir,
                                                  const std::string& cuda_home) {
  // The unversioned name exists only with a toolkit's development files; a driver-only machine (or
  // PyTorch's wheels) has a versioned one.
  std::vector<std::string> names = {"libcudart.so", "libcudart.so.13", "libcudart.so.12",
                                    "libcudart.so.11"};
  if (!package_dir.empty()) {
    // pip's NVIDIA runtime wheels, in the site-packages that holds this package.
    const std::filesystem::path nvidia =
        std::filesystem::path(package_dir).parent_path() / "nvidia";
    names.push_back((nvidia / "cu13" / "lib" / "libcudart.so.13").string());
    names.push_back((nvidia / "cuda_runtime" / "lib" / "libcudart.so.12").string());
    names.push_back((nvidia / "cuda_runtime" / "lib" / "libcudart.so.11.0").string());
  }
  std::vector<std::string> dirs;
  if (!cuda_home.empty()) dirs.push_back(cuda_home + "/lib64");
  dirs.emplace_back("/usr/local/cuda/lib64");
  for (const std::string& dir : dirs) {
    for (const char* so : {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"}) {
      names.push_back(dir + "/" + so);
    }
  }
  return names;
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
  if (const int code = host_register_(data, bytes, kCudaHostRegisterPortable); code != kCudaSuccess) {
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
