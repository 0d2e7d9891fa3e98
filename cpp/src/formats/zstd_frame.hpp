// Recognising a zstd frame (.zst) by its first bytes, for the formats that report one and for the
// zstd codec (decode/zstd.hpp), which alone includes zstd.h and decompresses it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace prestage::detail {

// Whether `bytes` starts with a zstd frame's magic number (ZSTD_MAGICNUMBER, little-endian).
inline bool is_zstd_frame(std::span<const std::byte> bytes) {
  constexpr uint8_t kMagic[4] = {0x28, 0xB5, 0x2F, 0xFD};
  return bytes.size() >= 4 && std::memcmp(bytes.data(), kMagic, 4) == 0;
}

}  // namespace prestage::detail
