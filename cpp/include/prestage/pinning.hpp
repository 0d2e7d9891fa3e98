// Pinning: how the batch buffers are held in physical memory, which decides whether a
// host-to-device copy from them can be asynchronous.
#pragma once

#include <string_view>

namespace prestage {

enum class Pinning {
  kNone,   // pageable: RLIMIT_MEMLOCK refused mlock and no CUDA registration
  kMlock,  // page-locked with mlock: never swapped, but the CUDA driver copies through a staging
           // buffer
  kCuda,   // registered with the CUDA driver (cudaHostRegister): device copies are asynchronous DMA
};

// "none", "mlock" or "cuda": the names Python's stats()["pinned"] uses. Thread-safe.
constexpr std::string_view to_string(Pinning p) noexcept {
  switch (p) {
    case Pinning::kMlock:
      return "mlock";
    case Pinning::kCuda:
      return "cuda";
    case Pinning::kNone:
      break;
  }
  return "none";
}

}  // namespace prestage
