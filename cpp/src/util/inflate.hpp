// zlib, the library, for every unit that reads deflate data (the members of .npz archives, gzip
// streams compressed whole): an inflater used step by step, and zlib's CRC-32. The only file that
// includes zlib.h is inflate.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

namespace prestage::detail {

// One per thread, created once (its zlib state is made at the first restart() and reused). Not
// thread-safe.
class Inflater {
 public:
  enum class Wrapping : uint8_t {
    kRaw,   // bare deflate data, as a zip member holds it
    kGzip,  // one gzip member: header, deflate data, CRC-32 and size
  };
  enum class Status : uint8_t {
    kFull,     // `out` is full
    kEnded,    // the stream ended (the input may hold more after it)
    kStarved,  // the input given is used up before either
    kCorrupt,  // the data is not what the wrapping says (see `error`)
  };

  explicit Inflater(Wrapping wrapping);
  ~Inflater();
  Inflater(const Inflater&) = delete;
  Inflater& operator=(const Inflater&) = delete;

  // Starts a new stream, with no input. False if zlib cannot (out of memory).
  bool restart() noexcept;
  // The input from here on (replacing what was left), of any size; it must outlive its use.
  void feed(std::span<const std::byte> in) noexcept;
  // What is left of the input fed.
  size_t input_left() const noexcept;
  // Inflates into out[out_pos..], advancing out_pos by what was written, until one of Status.
  // For kCorrupt, `*error` is zlib's message.
  Status inflate(std::span<std::byte> out, size_t& out_pos, const char** error) noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// zlib's CRC-32 (zip and gzip's checksum) of `bytes`, continuing from `crc` (0 to start).
uint32_t zlib_crc32(uint32_t crc, std::span<const std::byte> bytes) noexcept;

}  // namespace prestage::detail
