#include "decode/zstd.hpp"

#include <zstd.h>

#include <algorithm>

#include "prestage/error.hpp"

namespace prestage::detail {

struct ZstdDecoder::Impl {
  ZSTD_DCtx* context = nullptr;
  std::byte discard[1 << 14];

  [[noreturn]] static void fail(const std::string& path, const std::string& why) {
    throw DecodeError(path, "zstd: " + why);
  }

  void reset(const std::string& path) {
    const size_t rc = ZSTD_DCtx_reset(context, ZSTD_reset_session_only);
    if (ZSTD_isError(rc)) fail(path, ZSTD_getErrorName(rc));
  }

  // One step of streaming decompression; returns ZSTD_decompressStream's hint (0: a frame ended).
  size_t step(ZSTD_inBuffer& in, ZSTD_outBuffer& out, const std::string& path) {
    const size_t rc = ZSTD_decompressStream(context, &out, &in);
    if (ZSTD_isError(rc)) fail(path, std::string("corrupt frame: ") + ZSTD_getErrorName(rc));
    return rc;
  }
};

ZstdDecoder::ZstdDecoder() : impl_(std::make_unique<Impl>()) {
  impl_->context = ZSTD_createDCtx();
  if (impl_->context == nullptr) throw Error("cannot create a zstd decompression context");
}

ZstdDecoder::~ZstdDecoder() {
  if (impl_) ZSTD_freeDCtx(impl_->context);  // returns 0 or an error for null; nothing to report
}

std::span<const std::byte> ZstdDecoder::decompress(std::span<const std::byte> in,
                                                   std::vector<std::byte>& out, uint64_t max_bytes,
                                                   const std::string& path) {
  if (!is_zstd_frame(in)) Impl::fail(path, "not a zstd frame");
  impl_->reset(path);
  // The frame header's content size, when it states one, sizes the output at once.
  const unsigned long long stated = ZSTD_getFrameContentSize(in.data(), in.size());
  if (stated == ZSTD_CONTENTSIZE_ERROR) Impl::fail(path, "corrupt frame header");
  uint64_t capacity = 1 << 16;
  if (stated != ZSTD_CONTENTSIZE_UNKNOWN) {
    if (stated > max_bytes) {
      Impl::fail(path, "frame claims " + std::to_string(stated) +
                           " bytes, over max_sample_bytes (" + std::to_string(max_bytes) + ")");
    }
    capacity = std::max<uint64_t>(stated, 1);
  }
  capacity = std::min<uint64_t>(capacity, std::max<uint64_t>(max_bytes, 1));
  if (out.size() < capacity) out.resize(capacity);
  ZSTD_inBuffer src{in.data(), in.size(), 0};
  ZSTD_outBuffer dst{out.data(), out.size(), 0};
  size_t hint = 1;
  while (true) {
    if (dst.pos == dst.size) {
      if (dst.size >= max_bytes) {
        // Full at the limit: the frame is over it if it has anything left to give.
        std::byte probe[1];
        ZSTD_outBuffer extra{probe, 1, 0};
        hint = impl_->step(src, extra, path);
        if (extra.pos != 0) {
          Impl::fail(path, "output exceeds max_sample_bytes (" + std::to_string(max_bytes) + ")");
        }
        if (src.pos == src.size && hint == 0) break;
        if (src.pos == src.size) Impl::fail(path, "truncated frame");
        continue;
      }
      const uint64_t grown = std::min<uint64_t>(max_bytes, uint64_t{dst.size} * 2);
      out.resize(grown);
      dst.dst = out.data();
      dst.size = out.size();
    }
    const size_t before_in = src.pos, before_out = dst.pos;
    hint = impl_->step(src, dst, path);
    if (src.pos == src.size && hint == 0) break;
    if (src.pos == src.size && dst.pos < dst.size && before_in == src.pos &&
        before_out == dst.pos) {
      Impl::fail(path, "truncated frame");
    }
  }
  return std::span<const std::byte>(out.data(), dst.pos);
}

size_t ZstdDecoder::decompress_prefix(std::span<const std::byte> in, std::span<std::byte> out,
                                      const std::string& path) {
  if (!is_zstd_frame(in)) Impl::fail(path, "not a zstd frame");
  impl_->reset(path);
  ZSTD_inBuffer src{in.data(), in.size(), 0};
  ZSTD_outBuffer dst{out.data(), out.size(), 0};
  while (dst.pos < dst.size) {
    const size_t before_in = src.pos, before_out = dst.pos;
    const size_t hint = impl_->step(src, dst, path);
    if (src.pos == src.size && hint == 0) break;  // the whole input is shorter than `out`
    if (before_in == src.pos && before_out == dst.pos) break;  // no progress: input exhausted
  }
  return dst.pos;
}

void ZstdDecoder::decompress_into(std::span<const std::byte> in, uint64_t skip,
                                  std::span<std::byte> out, const std::string& path) {
  if (!is_zstd_frame(in)) Impl::fail(path, "not a zstd frame");
  impl_->reset(path);
  ZSTD_inBuffer src{in.data(), in.size(), 0};
  size_t hint = 1;
  // Each phase decompresses into one target: the skipped bytes, the output, then a probe byte that
  // must stay empty.
  auto run = [&](std::byte* target, size_t size, bool must_fill) {
    ZSTD_outBuffer dst{target, size, 0};
    while (dst.pos < dst.size) {
      if (src.pos == src.size && hint == 0) break;  // the last frame has ended
      const size_t before_in = src.pos, before_out = dst.pos;
      hint = impl_->step(src, dst, path);
      if (src.pos == src.size && hint == 0) break;
      if (before_in == src.pos && before_out == dst.pos) {
        if (src.pos == src.size) break;
        Impl::fail(path, "decompression made no progress");
      }
    }
    if (must_fill && dst.pos < dst.size) {
      Impl::fail(path, hint == 0 ? "frame holds less data than its array header describes"
                                 : "truncated frame");
    }
    return dst.pos;
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
  if (!(src.pos == src.size && hint == 0)) Impl::fail(path, "truncated frame");
}

}  // namespace prestage::detail
