#include "decode/zstd.hpp"

#include <algorithm>

#include "prestage/error.hpp"
#include "util/zstd_stream.hpp"

namespace prestage::detail {

struct ZstdDecoder::Impl {
  ZstdStream stream;
  std::byte discard[1 << 14];

  [[noreturn]] static void fail(const std::string& path, const std::string& why) {
    throw DecodeError(path, "zstd: " + why);
  }

  void reset(const std::string& path) {
    if (const char* error = stream.reset()) fail(path, error);
  }

  // One step of streaming decompression; returns zstd's hint (0: a frame ended).
  size_t step(std::span<const std::byte> in, size_t& in_pos, std::span<std::byte> out,
              size_t& out_pos, const std::string& path) {
    const char* error = nullptr;
    const size_t hint = stream.step(in, in_pos, out, out_pos, &error);
    if (error != nullptr) fail(path, std::string("corrupt frame: ") + error);
    return hint;
  }
};

ZstdDecoder::ZstdDecoder() : impl_(std::make_unique<Impl>()) {}

ZstdDecoder::~ZstdDecoder() = default;

std::span<const std::byte> ZstdDecoder::decompress(std::span<const std::byte> in,
                                                   std::vector<std::byte>& out, uint64_t max_bytes,
                                                   const std::string& path) {
  if (!is_zstd_frame(in)) Impl::fail(path, "not a zstd frame");
  impl_->reset(path);
  // The frame header's content size, when it states one, sizes the output at once.
  const uint64_t stated = zstd_stated_size(in);
  if (stated == kZstdSizeCorrupt) Impl::fail(path, "corrupt frame header");
  uint64_t capacity = 1 << 16;
  if (stated != kZstdSizeUnknown) {
    if (stated > max_bytes) {
      Impl::fail(path, "frame claims " + std::to_string(stated) +
                           " bytes, over max_sample_bytes (" + std::to_string(max_bytes) + ")");
    }
    capacity = std::max<uint64_t>(stated, 1);
  }
  capacity = std::min<uint64_t>(capacity, std::max<uint64_t>(max_bytes, 1));
  if (out.size() < capacity) out.resize(capacity);
  size_t in_pos = 0, out_pos = 0;
  size_t hint = 1;
  while (true) {
    if (out_pos == out.size()) {
      if (out.size() >= max_bytes) {
        // Full at the limit: the frame is over it if it has anything left to give.
        std::byte probe[1];
        size_t extra = 0;
        hint = impl_->step(in, in_pos, probe, extra, path);
        if (extra != 0) {
          Impl::fail(path, "output exceeds max_sample_bytes (" + std::to_string(max_bytes) + ")");
        }
        if (in_pos == in.size() && hint == 0) break;
        if (in_pos == in.size()) Impl::fail(path, "truncated frame");
        continue;
      }
      out.resize(std::min<uint64_t>(max_bytes, uint64_t{out.size()} * 2));
    }
    const size_t before_in = in_pos, before_out = out_pos;
    hint = impl_->step(in, in_pos, out, out_pos, path);
    if (in_pos == in.size() && hint == 0) break;
    if (in_pos == in.size() && out_pos < out.size() && before_in == in_pos &&
        before_out == out_pos) {
      Impl::fail(path, "truncated frame");
    }
  }
  return std::span<const std::byte>(out.data(), out_pos);
}

size_t ZstdDecoder::decompress_prefix(std::span<const std::byte> in, std::span<std::byte> out,
                                      const std::string& path) {
  if (!is_zstd_frame(in)) Impl::fail(path, "not a zstd frame");
  impl_->reset(path);
  size_t in_pos = 0, out_pos = 0;
  while (out_pos < out.size()) {
    const size_t before_in = in_pos, before_out = out_pos;
    const size_t hint = impl_->step(in, in_pos, out, out_pos, path);
    if (in_pos == in.size() && hint == 0) break;  // the whole input is shorter than `out`
    if (before_in == in_pos && before_out == out_pos) break;  // no progress: input exhausted
  }
  return out_pos;
}

void ZstdDecoder::decompress_into(std::span<const std::byte> in, uint64_t skip,
                                  std::span<std::byte> out, const std::string& path) {
  if (!is_zstd_frame(in)) Impl::fail(path, "not a zstd frame");
  impl_->reset(path);
  size_t in_pos = 0;
  size_t hint = 1;
  // Each phase decompresses into one target: the skipped bytes, the output, then a probe byte that
  // must stay empty.
  auto run = [&](std::byte* target, size_t size, bool must_fill) {
    const std::span<std::byte> dst(target, size);
    size_t out_pos = 0;
    while (out_pos < size) {
      if (in_pos == in.size() && hint == 0) break;  // the last frame has ended
      const size_t before_in = in_pos, before_out = out_pos;
      hint = impl_->step(in, in_pos, dst, out_pos, path);
      if (in_pos == in.size() && hint == 0) break;
      if (before_in == in_pos && before_out == out_pos) {
        if (in_pos == in.size()) break;
        Impl::fail(path, "decompression made no progress");
      }
    }
    if (must_fill && out_pos < size) {
      Impl::fail(path, hint == 0 ? "frame holds less data than its array header describes"
                                 : "truncated frame");
    }
    return out_pos;
  };
  while (skip > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(skip, sizeof(impl_->discard)));
    run(impl_->discard, chunk, true);
    skip -= chunk;
  }
  run(out.data(), out.size(), true);
  std::byte probe[1];
  if (run(probe, 1, false) != 0)
    Impl::fail(path, "frame holds more data than its array header describes");
  if (!(in_pos == in.size() && hint == 0)) Impl::fail(path, "truncated frame");
}

}  // namespace prestage::detail
