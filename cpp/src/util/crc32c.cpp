#include "util/crc32c.hpp"

#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace prestage::detail {
namespace {

// Slicing-by-8 tables for the reflected Castagnoli polynomial.
struct Tables {
  uint32_t t[8][256];
  Tables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
    }
  }
};

uint32_t crc32c_tables(const uint8_t* p, size_t n, uint32_t crc) {
  static const Tables tables;
  const auto& t = tables.t;
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    word ^= crc;
    crc = t[7][word & 0xFF] ^ t[6][(word >> 8) & 0xFF] ^ t[5][(word >> 16) & 0xFF] ^
          t[4][(word >> 24) & 0xFF] ^ t[3][(word >> 32) & 0xFF] ^ t[2][(word >> 40) & 0xFF] ^
          t[1][(word >> 48) & 0xFF] ^ t[0][word >> 56];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xFF];
  return crc;
}

#if defined(__x86_64__)
// The CRC instruction takes 3 cycles and can start one a cycle: three streams over three adjacent
// blocks run at once, and their CRCs are joined by "shifting" the first ones over the bytes after
// them (the linear operator of appending kBlock zero bytes, as tables: Mark Adler's crc32c.c).
constexpr size_t kBlock = 4096;  // a power of two (ZerosOperator)

// The operator of appending `bytes` zero bytes to a message, applied to a CRC (in the ~crc state
// the instruction works in), as four byte tables.
struct ZerosOperator {
  uint32_t t[4][256];
  // `bytes` must be a power of two.
  explicit ZerosOperator(size_t bytes) {
    // GF(2) 32x32 matrices, each row the image of one bit: one zero bit, then squared to two and
    // four, then on by squaring until `bytes` is used up.
    uint32_t odd[32], even[32];
    odd[0] = 0x82F63B78u;
    for (int k = 1; k < 32; ++k) odd[k] = 1u << (k - 1);
    square(even, odd);
    square(odd, even);
    const uint32_t* op = nullptr;
    size_t len = bytes;
    while (true) {
      square(even, odd);  // 8, 32, 128, ... zero bits
      len >>= 1;
      if (len == 0) {
        op = even;
        break;
      }
      square(odd, even);  // 16, 64, 256, ... zero bits
      len >>= 1;
      if (len == 0) {
        op = odd;
        break;
      }
    }
    for (uint32_t n = 0; n < 256; ++n) {
      t[0][n] = times(op, n);
      t[1][n] = times(op, n << 8);
      t[2][n] = times(op, n << 16);
      t[3][n] = times(op, n << 24);
    }
  }
  uint32_t apply(uint32_t crc) const {
    return t[0][crc & 0xFF] ^ t[1][(crc >> 8) & 0xFF] ^ t[2][(crc >> 16) & 0xFF] ^ t[3][crc >> 24];
  }

 private:
  static uint32_t times(const uint32_t* mat, uint32_t vec) {
    uint32_t sum = 0;
    for (int k = 0; vec != 0; vec >>= 1, ++k) {
      if (vec & 1) sum ^= mat[k];
    }
    return sum;
  }
  static void square(uint32_t* out, const uint32_t* mat) {
    for (int k = 0; k < 32; ++k) out[k] = times(mat, mat[k]);
  }
};

__attribute__((target("sse4.2"))) uint64_t crc32c_words(uint64_t c, const uint8_t* p, size_t n) {
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
  }
  return c;
}

__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const uint8_t* p, size_t n, uint32_t crc) {
  static const ZerosOperator shift(kBlock);
  uint64_t c = crc;
  while (n >= 3 * kBlock) {
    uint64_t c1 = 0, c2 = 0;
    const uint8_t* q = p;
    for (size_t i = 0; i < kBlock; i += 8, q += 8) {
      uint64_t w0, w1, w2;
      std::memcpy(&w0, q, 8);
      std::memcpy(&w1, q + kBlock, 8);
      std::memcpy(&w2, q + 2 * kBlock, 8);
      c = _mm_crc32_u64(c, w0);
      c1 = _mm_crc32_u64(c1, w1);
      c2 = _mm_crc32_u64(c2, w2);
    }
    c = shift.apply(static_cast<uint32_t>(c)) ^ c1;
    c = shift.apply(static_cast<uint32_t>(c)) ^ c2;
    p += 3 * kBlock;
    n -= 3 * kBlock;
  }
  c = crc32c_words(c, p, n);
  p += n & ~size_t{7};
  n &= 7;
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n-- > 0) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}
#endif

}  // namespace

uint32_t crc32c(std::span<const std::byte> bytes, uint32_t crc) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  crc = ~crc;
#if defined(__x86_64__)
  static const bool hardware = __builtin_cpu_supports("sse4.2");
  crc = hardware ? crc32c_sse42(p, bytes.size(), crc) : crc32c_tables(p, bytes.size(), crc);
#else
  crc = crc32c_tables(p, bytes.size(), crc);
#endif
  return ~crc;
}

}  // namespace prestage::detail
