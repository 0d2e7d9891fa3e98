#include "util/zstd_stream.hpp"

#include <zstd.h>

#include "prestage/error.hpp"

namespace prestage::detail {

struct ZstdStream::Impl {
  ZSTD_DCtx* context = nullptr;
};

ZstdStream::ZstdStream() : impl_(std::make_unique<Impl>()) {
  impl_->context = ZSTD_createDCtx();
  if (impl_->context == nullptr) throw Error("cannot create a zstd decompression context");
}

ZstdStream::~ZstdStream() {
  if (impl_) ZSTD_freeDCtx(impl_->context);  // returns 0 or an error for null; nothing to report
}

const char* ZstdStream::reset() noexcept {
  const size_t rc = ZSTD_DCtx_reset(impl_->context, ZSTD_reset_session_only);
  return ZSTD_isError(rc) ? ZSTD_getErrorName(rc) : nullptr;
}

size_t ZstdStream::step(std::span<const std::byte> in, size_t& in_pos, std::span<std::byte> out,
                        size_t& out_pos, const char** error) noexcept {
  ZSTD_inBuffer src{in.data(), in.size(), in_pos};
  ZSTD_outBuffer dst{out.data(), out.size(), out_pos};
  const size_t rc = ZSTD_decompressStream(impl_->context, &dst, &src);
  in_pos = src.pos;
  out_pos = dst.pos;
  if (ZSTD_isError(rc)) {
    *error = ZSTD_getErrorName(rc);
    return 0;
  }
  return rc;
}

uint64_t zstd_stated_size(std::span<const std::byte> frame) noexcept {
  const unsigned long long stated = ZSTD_getFrameContentSize(frame.data(), frame.size());
  if (stated == ZSTD_CONTENTSIZE_ERROR) return kZstdSizeCorrupt;
  if (stated == ZSTD_CONTENTSIZE_UNKNOWN) return kZstdSizeUnknown;
  return stated;
}

std::string zstd_compress(std::span<const std::byte> in, int level) {
  if (level < ZSTD_minCLevel() || level > ZSTD_maxCLevel()) {
    throw ConfigError("zstd level " + std::to_string(level) + " is outside " +
                      std::to_string(ZSTD_minCLevel()) + ".." + std::to_string(ZSTD_maxCLevel()));
  }
  std::string out(ZSTD_compressBound(in.size()), '\0');
  const size_t n = ZSTD_compress(out.data(), out.size(), in.data(), in.size(), level);
  if (ZSTD_isError(n)) throw Error(std::string("zstd: ") + ZSTD_getErrorName(n));
  out.resize(n);
  return out;
}

}  // namespace prestage::detail
