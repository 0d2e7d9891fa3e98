#include "util/inflate.hpp"

#include <zlib.h>

#include <algorithm>
#include <climits>

namespace prestage::detail {

struct Inflater::Impl {
  z_stream z{};
  bool open = false;
  int window_bits;
  // The input not yet handed to zlib, which counts input in uInt: more than 4 GiB goes in pieces.
  std::span<const std::byte> pending;

  explicit Impl(Wrapping wrapping)
      : window_bits(wrapping == Wrapping::kRaw ? -MAX_WBITS : 15 + 16) {}
  ~Impl() {
    if (open) inflateEnd(&z);
  }

  // Hands zlib the next piece of the input once it has used the last; false if none is left.
  bool give_input() noexcept {
    if (z.avail_in != 0) return true;
    if (pending.empty()) return false;
    const size_t n = std::min<size_t>(pending.size(), UINT_MAX);
    z.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(pending.data()));
    z.avail_in = static_cast<uInt>(n);
    pending = pending.subspan(n);
    return true;
  }
};

Inflater::Inflater(Wrapping wrapping) : impl_(std::make_unique<Impl>(wrapping)) {}

Inflater::~Inflater() = default;

bool Inflater::restart() noexcept {
  Impl& m = *impl_;
  m.pending = {};
  m.z.next_in = nullptr;
  m.z.avail_in = 0;
  if (m.open) return inflateReset(&m.z) == Z_OK;
  m.open = inflateInit2(&m.z, m.window_bits) == Z_OK;
  return m.open;
}

void Inflater::feed(std::span<const std::byte> in) noexcept {
  impl_->pending = in;
  impl_->z.next_in = nullptr;
  impl_->z.avail_in = 0;
}

size_t Inflater::input_left() const noexcept { return impl_->z.avail_in + impl_->pending.size(); }

Inflater::Status Inflater::inflate(std::span<std::byte> out, size_t& out_pos,
                                   const char** error) noexcept {
  Impl& m = *impl_;
  while (out_pos < out.size()) {
    if (!m.give_input()) return Status::kStarved;
    const uInt room = static_cast<uInt>(std::min<size_t>(out.size() - out_pos, UINT_MAX));
    m.z.next_out = reinterpret_cast<Bytef*>(out.data() + out_pos);
    m.z.avail_out = room;
    const int rc = ::inflate(&m.z, Z_NO_FLUSH);
    out_pos += room - m.z.avail_out;
    if (rc == Z_STREAM_END) return Status::kEnded;
    // No progress for want of input: more is given above, or there is none.
    if (rc == Z_BUF_ERROR && m.z.avail_in == 0) continue;
    if (rc != Z_OK) {
      *error = m.z.msg != nullptr ? m.z.msg : "error";
      return Status::kCorrupt;
    }
  }
  return Status::kFull;
}

uint32_t zlib_crc32(uint32_t crc, std::span<const std::byte> bytes) noexcept {
  auto* p = reinterpret_cast<const Bytef*>(bytes.data());
  size_t left = bytes.size();
  while (left > 0) {
    const uInt chunk = static_cast<uInt>(std::min<size_t>(left, UINT_MAX));
    crc = static_cast<uint32_t>(::crc32(crc, p, chunk));
    p += chunk;
    left -= chunk;
  }
  return crc;
}

}  // namespace prestage::detail
