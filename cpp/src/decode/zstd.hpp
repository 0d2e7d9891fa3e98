// Stage 3, zstd frames: a sample stored as a zstd frame (.zst) of any format is decompressed before
// its codec runs, through util/zstd_stream.hpp (the only file that includes zstd.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "formats/zstd_frame.hpp"  // is_zstd_frame

namespace prestage::detail {

// One per reader thread, created once (zstd.h: "use one context per thread"). Not thread-safe.
// Every error is a DecodeError naming `path`: corrupt or truncated frames, output over the limit.
class ZstdDecoder {
 public:
  ZstdDecoder();
  ~ZstdDecoder();
  ZstdDecoder(const ZstdDecoder&) = delete;
  ZstdDecoder& operator=(const ZstdDecoder&) = delete;

  // Decompresses all of `in` (one or more frames) into `out` (grown as needed, never shrunk) and
  // returns the decompressed bytes. More than `max_bytes` of output is refused before it is
  // allocated when the frame header states its size, and as soon as it is reached otherwise.
  std::span<const std::byte> decompress(std::span<const std::byte> in, std::vector<std::byte>& out,
                                        uint64_t max_bytes, const std::string& path);

  // Decompresses the beginning of `in` into `out` until `out` is full or the input ends; returns
  // the bytes written. For reading a header without decompressing the rest.
  size_t decompress_prefix(std::span<const std::byte> in, std::span<std::byte> out,
                           const std::string& path);

  // Decompresses `in`, discards the first `skip` bytes of output, writes the next out.size() bytes
  // into `out`, and checks that the output ends exactly there.
  void decompress_into(std::span<const std::byte> in, uint64_t skip, std::span<std::byte> out,
                       const std::string& path);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace prestage::detail
