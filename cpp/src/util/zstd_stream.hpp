// zstd, the library, for every unit that reads or writes its frames (stage 3's zstd samples, the
// shards compressed whole, `prestage pack`): a decompression context used step by step, a frame
// header's stated size, and one-shot compression. The only file that includes zstd.h is
// zstd_stream.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace prestage::detail {

// One per thread, created once (zstd.h: "use one context per thread"). Not thread-safe.
class ZstdStream {
 public:
  ZstdStream();  // Error if zstd cannot make a context
  ~ZstdStream();
  ZstdStream(const ZstdStream&) = delete;
  ZstdStream& operator=(const ZstdStream&) = delete;

  // Forgets any frame under way: the next step() starts a new one. Returns zstd's name for a
  // failure, or null.
  const char* reset() noexcept;
  // Decompresses from in[in_pos..] into out[out_pos..], advancing both positions by what was
  // consumed and produced. Returns zstd's hint: 0 when a frame ended exactly here. On a corrupt
  // frame sets `*error` to zstd's name for the fault (left alone otherwise) and returns 0.
  size_t step(std::span<const std::byte> in, size_t& in_pos, std::span<std::byte> out,
              size_t& out_pos, const char** error) noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The decompressed size a frame's header states, kZstdSizeUnknown when it states none,
// kZstdSizeCorrupt for a header that is not one.
inline constexpr uint64_t kZstdSizeUnknown = ~uint64_t{0};
inline constexpr uint64_t kZstdSizeCorrupt = ~uint64_t{0} - 1;
uint64_t zstd_stated_size(std::span<const std::byte> frame) noexcept;

// One zstd frame holding `in`, its size in the frame header, at compression `level`. A level
// outside zstd's range is a ConfigError naming the range; zstd's failure an Error.
std::string zstd_compress(std::span<const std::byte> in, int level);

}  // namespace prestage::detail
