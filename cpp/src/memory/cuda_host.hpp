// Registration of host memory with the CUDA driver (cudaHostRegister), through the CUDA runtime
// library opened at run time: prestage has no build-time CUDA dependency.
//
// Which library: the environment variable PRESTAGE_CUDART, read once, names one to open (a path or
// a soname); PRESTAGE_CUDART=none turns registration off; unset or empty, util/cuda_open.hpp's
// cuda_search() says where to look. A device must be present (cudaGetDeviceCount >= 1). Nothing of
// CUDA is linked or shipped: a wheel finds the runtime the site brings (a toolkit, a driver-only
// install, PyTorch's nvidia-* wheels).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "util/cuda_open.hpp"

namespace prestage::detail {

class CudaHost {
 public:
  // Opens the runtime that `spec` names ("": the default search; "none": none) and counts the
  // devices. Never throws for a missing or failing runtime: available() is then false and why()
  // says why.
  explicit CudaHost(const std::string& spec);
  // Opens the first of `candidates` (paths or sonames) that opens; none: why() names every one.
  explicit CudaHost(const std::vector<std::string>& candidates);
  ~CudaHost();
  CudaHost(const CudaHost&) = delete;
  CudaHost& operator=(const CudaHost&) = delete;

  // The process's runtime, as PRESTAGE_CUDART says: loaded on first use, once, thread-safe; never
  // destroyed (buffers may be unregistered during exit).
  static const CudaHost& instance();

  // A runtime was loaded and it sees at least one device.
  bool available() const noexcept { return available_; }
  // When available(), the library opened; else why registration is not possible (a short sentence).
  const std::string& why() const noexcept { return why_; }

  // The calling thread's current device (cudaGetDevice), or -1 when not available() or on an error.
  int current_device() const noexcept;

  // Registers [data, data + bytes) (cudaHostRegisterPortable) with `device` current in the calling
  // thread (it is made current if another is, and stays so: the caller is one of the loader's
  // decode threads, or the thread that made the ring; -1: the thread's own). Returns "" on success,
  // else why it failed ("cudaHostRegister failed: <code> (<text>)"). Requires available().
  std::string register_memory(void* data, size_t bytes, int device) const;
  // cudaHostUnregister. Returns its cudaError_t: 0 on success. Requires available().
  int unregister_memory(void* data) const noexcept;

  // All members are const after construction: any thread may call them at once.

 private:
  explicit CudaHost(CudaLibrary runtime);  // takes its handle
  void bind_all(const std::string& opened);
  std::string failure(const char* call, int code) const;

  void* library_ = nullptr;  // dlopen handle, closed by the destructor
  bool available_ = false;
  std::string why_;
  // The runtime's entry points (cudaError_t is an int-sized enum).
  int (*get_device_count_)(int*) = nullptr;
  int (*get_device_)(int*) = nullptr;
  int (*set_device_)(int) = nullptr;
  int (*host_register_)(void*, size_t, unsigned) = nullptr;
  int (*host_unregister_)(void*) = nullptr;
  const char* (*get_error_string_)(int) = nullptr;
};

}  // namespace prestage::detail
