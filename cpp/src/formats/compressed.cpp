#include "formats/compressed.hpp"

#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>

#include "prestage/error.hpp"
#include "util/crc32c.hpp"

namespace prestage::detail {

Catalog::Codec codec_of(std::span<const std::byte> head) {
  const auto at = [&](size_t i) { return std::to_integer<uint8_t>(head[i]); };
  if (head.size() >= 2 && at(0) == 0x1f && at(1) == 0x8b) return Catalog::Codec::kGzip;
  if (head.size() >= 4 && at(0) == 0x28 && at(1) == 0xb5 && at(2) == 0x2f && at(3) == 0xfd) {
    return Catalog::Codec::kZstd;
  }
  return Catalog::Codec::kNone;
}

const char* codec_name(Catalog::Codec codec) {
  switch (codec) {
    case Catalog::Codec::kGzip:
      return "gzip";
    case Catalog::Codec::kZstd:
      return "zstd";
    default:
      return "none";
  }
}

struct Decompressor::State {
  std::string path;
  Catalog::Codec codec;
  OpenFile file;
  uint64_t size = 0;
  uint64_t read_at = 0;  // the next compressed byte to read from the file
  uint64_t produced = 0;
  std::vector<std::byte> in;
  size_t in_pos = 0, in_end = 0;
  bool ended = false;   // the stream's last member or frame ended with the file
  bool between = true;  // at the start of a member or frame (nothing of it decoded yet)
  z_stream z{};
  bool z_open = false;
  ZSTD_DCtx* zstd = nullptr;

  State(const FileRef& f, Catalog::Codec c, const std::string& p)
      : path(p), codec(c), file(f), size(file.size()) {}
  ~State() {
    if (z_open) inflateEnd(&z);
    if (zstd != nullptr) ZSTD_freeDCtx(zstd);
  }

  uint64_t at() const { return read_at - (in_end - in_pos); }  // the compressed byte reached

  [[noreturn]] void fail(const std::string& why) const {
    throw DecodeError(path, std::string(codec_name(codec)) + " stream: " + why +
                                " (at compressed byte " + std::to_string(at()) + " of " +
                                std::to_string(size) + "; " + std::to_string(produced) +
                                " bytes decompressed before it)");
  }

  // More compressed bytes into `in`; false at the end of the file.
  bool refill() {
    if (in_pos < in_end) return true;
    if (read_at >= size) return false;
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, size - read_at));
    in.resize(kChunk);
    file.read(read_at, std::span<std::byte>(in.data(), n));
    read_at += n;
    in_pos = 0;
    in_end = n;
    return true;
  }

  size_t gzip(std::span<std::byte> out) {
    size_t done = 0;
    while (done < out.size()) {
      if (!refill()) {
        if (!between) fail("truncated: the file ends inside a gzip member");
        ended = true;
        break;
      }
      if (between) {
        // A member starts here: anything but a gzip header after the last one is not a stream
        // this reader vouches for.
        const bool magic = in_end - in_pos < 2 ||
                           (in[in_pos] == std::byte{0x1f} && in[in_pos + 1] == std::byte{0x8b});
        if (!magic) {
          fail("bytes after the last gzip member are not another member");
        }
        if (!z_open) {
          if (inflateInit2(&z, 15 + 16) != Z_OK) throw Error("cannot start zlib's inflate");
          z_open = true;
        } else if (inflateReset(&z) != Z_OK) {
          throw Error("cannot reset zlib's inflate");
        }
        between = false;
      }
      z.next_in = reinterpret_cast<Bytef*>(in.data() + in_pos);
      z.avail_in = static_cast<uInt>(in_end - in_pos);
      z.next_out = reinterpret_cast<Bytef*>(out.data() + done);
      z.avail_out = static_cast<uInt>(std::min<size_t>(out.size() - done, UINT32_MAX));
      const uInt before_out = z.avail_out;
      const int rc = inflate(&z, Z_NO_FLUSH);
      in_pos = in_end - z.avail_in;
      done += before_out - z.avail_out;
      if (rc == Z_STREAM_END) {
        between = true;
      } else if (rc == Z_BUF_ERROR) {
        continue;  // needs more input (refilled above) or more room (the loop ends)
      } else if (rc != Z_OK) {
        fail(z.msg != nullptr ? z.msg : "corrupt data (zlib error " + std::to_string(rc) + ")");
      }
    }
    return done;
  }

  size_t zstd_read(std::span<std::byte> out) {
    if (zstd == nullptr) {
      zstd = ZSTD_createDCtx();
      if (zstd == nullptr) throw Error("cannot create a zstd decompression context");
    }
    size_t done = 0;
    while (done < out.size()) {
      if (!refill()) {
        if (!between) fail("truncated: the file ends inside a zstd frame");
        ended = true;
        break;
      }
      ZSTD_inBuffer zin{in.data() + in_pos, in_end - in_pos, 0};
      ZSTD_outBuffer zout{out.data() + done, out.size() - done, 0};
      const size_t rc = ZSTD_decompressStream(zstd, &zout, &zin);
      if (ZSTD_isError(rc)) fail(std::string("corrupt frame: ") + ZSTD_getErrorName(rc));
      in_pos += zin.pos;
      done += zout.pos;
      between = rc == 0;  // a frame ended exactly here
    }
    return done;
  }
};

Decompressor::Decompressor(const FileRef& file, Catalog::Codec codec, const std::string& path)
    : state_(std::make_unique<State>(file, codec, path)) {
  if (codec != Catalog::Codec::kGzip && codec != Catalog::Codec::kZstd) {
    throw ConfigError("'" + path + "': not a compressed file");
  }
}

Decompressor::~Decompressor() = default;

size_t Decompressor::read(std::span<std::byte> out) {
  State& s = *state_;
  if (s.ended || out.empty()) return 0;
  const size_t n = s.codec == Catalog::Codec::kGzip ? s.gzip(out) : s.zstd_read(out);
  s.produced += n;
  return n;
}

uint64_t Decompressor::stored_size() const noexcept { return state_->size; }
uint64_t Decompressor::produced() const noexcept { return state_->produced; }

Decompressed measure_compressed(const FileRef& file, Catalog::Codec codec,
                                const std::string& path) {
  Decompressor in(file, codec, path);
  std::vector<std::byte> chunk(Decompressor::kChunk);
  Decompressed out;
  out.stored = in.stored_size();
  while (const size_t n = in.read(chunk)) {
    out.crc = crc32c(std::span<const std::byte>(chunk.data(), n), out.crc);
    out.size += n;
  }
  return out;
}

Catalog::Codec codec_of_file(const FileRef& file) {
  const OpenFile open(file);
  std::byte head[4] = {};
  const size_t n = static_cast<size_t>(std::min<uint64_t>(open.size(), sizeof head));
  open.read(0, std::span<std::byte>(head, n));
  return codec_of(std::span<const std::byte>(head, n));
}

}  // namespace prestage::detail
