// NVIDIA's libraries opened at run time, by one search for every user: memory/cuda_host (the CUDA
// runtime, to page-lock the batch buffers) and decode/gpu_libs (the runtime, nvJPEG and NPP, to
// decode on the GPU). prestage links and ships nothing of CUDA: it finds what the site brings (a
// toolkit, a driver-only install, PyTorch's nvidia-* wheels).
#pragma once

#include <string>
#include <vector>

namespace prestage::detail {

struct CudaLibrary {
  void* handle = nullptr;  // dlopen's handle (RTLD_NOW | RTLD_LOCAL); the caller closes it
  std::string name;        // what opened: a path or a soname
  std::string why;         // no handle: why not, one sentence naming what was tried
};

// Opens `library` ("cudart", "nvjpeg" or "nppig") as `spec`, the value of its environment variable
// named `variable` (PRESTAGE_CUDART, ...), says: "" the default search (cuda_search() from this
// code's own directory and CUDA_HOME), "none" not at all, else the one path or soname given.
CudaLibrary open_cuda_library(const std::string& library, const std::string& spec,
                              const std::string& variable);
// Opens the first of `candidates` (paths or sonames) that opens.
CudaLibrary open_first_of(const std::string& library, const std::vector<std::string>& candidates,
                          const std::string& variable);

// Where `library` is looked for by the default search, in order: lib<name>.so, .so.13, .so.12 and
// .so.11 where the dynamic loader looks (LD_LIBRARY_PATH, the ld.so cache; a library the process
// loaded already, as PyTorch does, is found by its soname); the NVIDIA wheels beside this package
// (`package_dir`/../nvidia/cu13/lib, nvidia/<component>/lib: PyTorch's dependencies,
// nvidia-nvjpeg-cu12, nvidia-npp-cu12); the copy torchvision's wheel carries (`package_dir`/
// ../torchvision.libs/libnvjpeg*.so*, hashed names, nvjpeg only); then `cuda_home`/lib64 and
// /usr/local/cuda/lib64. `package_dir`: the directory of the object holding this code ("": none
// of those paths), `cuda_home`: CUDA_HOME ("": unset).
std::vector<std::string> cuda_search(const std::string& library, const std::string& package_dir,
                                     const std::string& cuda_home);

}  // namespace prestage::detail
