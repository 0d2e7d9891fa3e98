// CRC-32C (Castagnoli): TFRecord's record checksums and the stage index's checksums of staged
// copies. SSE4.2 where the CPU has it, slicing-by-8 tables otherwise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace prestage::detail {

// CRC-32C of `bytes`, continuing from `crc` (0 to start).
uint32_t crc32c(std::span<const std::byte> bytes, uint32_t crc = 0);

}  // namespace prestage::detail
