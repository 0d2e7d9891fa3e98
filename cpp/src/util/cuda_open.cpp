#include "util/cuda_open.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <system_error>

namespace prestage::detail {

namespace {

// The directory of each library in NVIDIA's per-component wheels (CUDA 12: nvidia/<dir>/lib).
std::string wheel_dir(const std::string& library) {
  return library == "cudart" ? "cuda_runtime" : library == "nppig" ? "npp" : library;
}

std::string this_directory() {
  Dl_info info;
  if (::dladdr(reinterpret_cast<void*>(&open_cuda_library), &info) != 0 &&
      info.dli_fname != nullptr) {
    return std::filesystem::path(info.dli_fname).parent_path().string();
  }
  return {};
}

}  // namespace

std::vector<std::string> cuda_search(const std::string& library, const std::string& package_dir,
                                     const std::string& cuda_home) {
  const std::string base = "lib" + library + ".so";
  // The unversioned name exists only with a toolkit's development files; a driver-only machine or
  // PyTorch's wheels have versioned ones.
  std::vector<std::string> names = {base, base + ".13", base + ".12", base + ".11"};
  // The CUDA 11 runtime's file is libcudart.so.11.0.
  const bool runtime = library == "cudart";
  if (!package_dir.empty()) {
    const std::filesystem::path site = std::filesystem::path(package_dir).parent_path();
    const std::filesystem::path component = site / "nvidia" / wheel_dir(library) / "lib";
    names.push_back((site / "nvidia" / "cu13" / "lib" / (base + ".13")).string());
    names.push_back((component / (base + ".12")).string());
    if (runtime) names.push_back((component / (base + ".11.0")).string());
    if (library == "nvjpeg") {
      // torchvision's wheel carries its own copy under a hashed name (libnvjpeg.<hash>.so.12).
      std::error_code error;
      std::vector<std::string> found;
      for (const auto& entry :
           std::filesystem::directory_iterator(site / "torchvision.libs", error)) {
        const std::string name = entry.path().filename().string();
        if (name.rfind("libnvjpeg", 0) == 0 && name.find(".so") != std::string::npos) {
          found.push_back(entry.path().string());
        }
      }
      std::sort(found.begin(), found.end());
      names.insert(names.end(), found.begin(), found.end());
    }
  }
  std::vector<std::string> dirs;
  if (!cuda_home.empty()) dirs.push_back(cuda_home + "/lib64");
  dirs.emplace_back("/usr/local/cuda/lib64");
  for (const std::string& dir : dirs) {
    for (const char* version : {".13", ".12"}) names.push_back(dir + "/" + base + version);
    if (runtime) names.push_back(dir + "/" + base + ".11.0");
  }
  return names;
}

CudaLibrary open_first_of(const std::string& library, const std::vector<std::string>& candidates,
                          const std::string& variable) {
  CudaLibrary out;
  for (const std::string& name : candidates) {
    out.handle = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (out.handle != nullptr) {
      out.name = name;
      return out;
    }
  }
  out.why = "no lib" + library + " found (tried";
  for (size_t i = 0; i < candidates.size(); ++i) out.why += (i == 0 ? " " : ", ") + candidates[i];
  out.why += "; a bare name is searched on LD_LIBRARY_PATH and the ld.so cache); " + variable +
             "=/path/to/lib" + library + ".so.N names one";
  return out;
}

CudaLibrary open_cuda_library(const std::string& library, const std::string& spec,
                              const std::string& variable) {
  if (spec == "none") {
    return {nullptr, {}, "lib" + library + " turned off (" + variable + "=none)"};
  }
  if (spec.empty()) {
    const char* cuda_home = std::getenv("CUDA_HOME");
    const std::string home = cuda_home != nullptr ? cuda_home : "";
    return open_first_of(library, cuda_search(library, this_directory(), home), variable);
  }
  CudaLibrary out;
  out.handle = ::dlopen(spec.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (out.handle != nullptr) {
    out.name = spec;
    return out;
  }
  const char* error = ::dlerror();
  out.why = variable + "=" + spec + " cannot be opened: " + (error ? error : "unknown error");
  return out;
}

}  // namespace prestage::detail
