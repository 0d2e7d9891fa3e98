// CRC-32C, the staged copies' checksum: the hardware path (three interleaved streams joined by a
// shift operator) against a bit-at-a-time reference, at every length around its block boundaries.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "util/crc32c.hpp"

using prestage::detail::crc32c;

namespace {

uint32_t reference(const std::vector<std::byte>& bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (const std::byte b : bytes) {
    crc ^= static_cast<uint8_t>(b);
    for (int k = 0; k < 8; ++k) crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
  }
  return ~crc;
}

}  // namespace

TEST_CASE("crc32c: the check value of the Castagnoli CRC") {
  const char* text = "123456789";
  std::vector<std::byte> bytes;
  for (const char* p = text; *p != '\0'; ++p) bytes.push_back(static_cast<std::byte>(*p));
  CHECK(crc32c(bytes) == 0xE3069283u);
  CHECK(crc32c({}) == 0u);
}

TEST_CASE("crc32c: equal to a bitwise reference at every length around the block boundaries") {
  std::mt19937_64 rng(7);
  std::vector<std::byte> data(3 * 4096 * 3 + 64);
  for (auto& b : data) b = static_cast<std::byte>(rng());
  std::vector<size_t> lengths;
  for (size_t n = 0; n < 40; ++n) lengths.push_back(n);
  for (const size_t edge : {3 * 4096, 2 * 3 * 4096, 3 * 3 * 4096}) {
    for (size_t n = edge - 9; n <= edge + 9; ++n) lengths.push_back(n);
  }
  lengths.push_back(100'000 % data.size());
  for (const size_t n : lengths) {
    const std::vector<std::byte> part(data.begin(), data.begin() + static_cast<std::ptrdiff_t>(n));
    CHECK_MESSAGE(crc32c(part) == reference(part), "length " << n);
    // Continued from an earlier CRC, as a stream is checked in pieces.
    const size_t half = n / 2;
    const uint32_t first = crc32c(std::span<const std::byte>(part.data(), half));
    CHECK(crc32c(std::span<const std::byte>(part.data() + half, n - half), first) ==
          reference(part));
  }
}
