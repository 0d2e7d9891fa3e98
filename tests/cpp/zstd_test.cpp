// Stage 3 zstd frames: whole and partial decompression, limits, and corrupt or truncated frames.
#include "decode/zstd.hpp"

#include <doctest/doctest.h>
#include <zstd.h>

#include <cstring>
#include <string>
#include <vector>

#include "prestage/error.hpp"

namespace {

using prestage::DecodeError;
using prestage::detail::ZstdDecoder;

std::vector<std::byte> data(size_t n) {
  std::vector<std::byte> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = std::byte(static_cast<uint8_t>(i * 7 + i / 300));
  return out;
}

std::vector<std::byte> compress(const std::vector<std::byte>& in, bool stated_size = true) {
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, stated_size ? 1 : 0);
  std::vector<std::byte> out(ZSTD_compressBound(in.size()));
  const size_t n = ZSTD_compress2(c, out.data(), out.size(), in.data(), in.size());
  ZSTD_freeCCtx(c);
  REQUIRE(!ZSTD_isError(n));
  out.resize(n);
  return out;
}

}  // namespace

TEST_CASE("zstd: frames with and without a stated size decompress to the original") {
  ZstdDecoder decoder;
  const auto original = data(300000);
  for (const bool stated : {true, false}) {
    std::vector<std::byte> out;
    const auto got = decoder.decompress(compress(original, stated), out, 1 << 30, "a.zst");
    CHECK(std::vector<std::byte>(got.begin(), got.end()) == original);
  }
}

TEST_CASE("zstd: decompress_into skips a prefix and checks the frame ends there") {
  ZstdDecoder decoder;
  const auto original = data(100000);
  const auto frame = compress(original);
  std::vector<std::byte> out(original.size() - 1000);
  decoder.decompress_into(frame, 1000, out, "a.zst");
  CHECK(std::memcmp(out.data(), original.data() + 1000, out.size()) == 0);
  std::vector<std::byte> short_out(out.size() - 1);
  CHECK_THROWS_AS(decoder.decompress_into(frame, 1000, short_out, "a.zst"), DecodeError);
  std::vector<std::byte> long_out(out.size() + 1);
  CHECK_THROWS_AS(decoder.decompress_into(frame, 1000, long_out, "a.zst"), DecodeError);
  std::vector<std::byte> prefix(64);
  CHECK(decoder.decompress_prefix(frame, prefix, "a.zst") == 64);
  CHECK(std::memcmp(prefix.data(), original.data(), 64) == 0);
}

TEST_CASE("zstd: output over the limit is refused") {
  ZstdDecoder decoder;
  std::vector<std::byte> out;
  for (const bool stated : {true, false}) {
    CHECK_THROWS_AS(decoder.decompress(compress(data(100000), stated), out, 99999, "a.zst"),
                    DecodeError);
  }
}

TEST_CASE("zstd: corrupt, truncated and foreign data are DecodeErrors, and the context recovers") {
  ZstdDecoder decoder;
  const auto original = data(200000);
  auto frame = compress(original);
  std::vector<std::byte> out;
  auto truncated = frame;
  truncated.resize(frame.size() / 2);
  CHECK_THROWS_AS(decoder.decompress(truncated, out, 1 << 30, "a.zst"), DecodeError);
  auto corrupt = frame;
  for (size_t i = corrupt.size() / 3; i < corrupt.size() / 2; ++i) corrupt[i] = std::byte{0};
  CHECK_THROWS_AS(decoder.decompress(corrupt, out, 1 << 30, "a.zst"), DecodeError);
  CHECK_THROWS_AS(decoder.decompress(data(100), out, 1 << 30, "a.zst"), DecodeError);
  std::vector<std::byte> exact(original.size());
  CHECK_THROWS_AS(decoder.decompress_into(truncated, 0, exact, "a.zst"), DecodeError);
  const auto got = decoder.decompress(frame, out, 1 << 30, "a.zst");
  CHECK(std::vector<std::byte>(got.begin(), got.end()) == original);
}
