// A portable PRNG: the same seed gives the same numbers on every machine and standard library
// (unlike std::uniform_int_distribution, whose output is implementation-defined).
#pragma once

#include <cstdint>

namespace prestage::detail {

__extension__ typedef unsigned __int128 uint128;  // GCC and Clang; for a 64 x 64 -> 128 multiply

// SplitMix64 (Steele, Lea and Flood, 2014): seeds the generator below.
inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// xoshiro256** 1.0 (Blackman and Vigna, 2018).
class Xoshiro256 {
 public:
  // The stream for (seed, stream): e.g. one stream per epoch.
  Xoshiro256(uint64_t seed, uint64_t stream) {
    uint64_t mix = stream;
    uint64_t sm = seed ^ splitmix64(mix);
    for (auto& word : s_) word = splitmix64(sm);
  }

  // A generator in the given state (not all zero), as the reference code is seeded.
  static Xoshiro256 from_state(uint64_t s0, uint64_t s1, uint64_t s2, uint64_t s3) {
    Xoshiro256 rng(0, 0);
    rng.s_[0] = s0;
    rng.s_[1] = s1;
    rng.s_[2] = s2;
    rng.s_[3] = s3;
    return rng;
  }

  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, range), range > 0, without bias (Lemire, "Fast random integer generation in an
  // interval", 2019).
  uint64_t below(uint64_t range) {
    uint128 m = static_cast<uint128>(next()) * range;
    uint64_t low = static_cast<uint64_t>(m);
    if (low < range) {
      const uint64_t threshold = (0 - range) % range;
      while (low < threshold) {
        m = static_cast<uint128>(next()) * range;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace prestage::detail
