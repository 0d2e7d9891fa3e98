#include "formats/compressed.hpp"

#include <algorithm>
#include <cstring>
#include <optional>

#include "prestage/error.hpp"
#include "util/crc32c.hpp"
#include "util/inflate.hpp"
#include "util/zstd_stream.hpp"

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
  std::optional<Inflater> gzip_stream;
  std::optional<ZstdStream> zstd;

  State(const FileRef& f, Catalog::Codec c, const std::string& p)
      : path(p), codec(c), file(f), size(file.size()) {}

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
        if (!gzip_stream) gzip_stream.emplace(Inflater::Wrapping::kGzip);
        if (!gzip_stream->restart()) throw Error("cannot start zlib's inflate");
        between = false;
      }
      gzip_stream->feed(std::span<const std::byte>(in.data() + in_pos, in_end - in_pos));
      const char* error = nullptr;
      const Inflater::Status status = gzip_stream->inflate(out, done, &error);
      in_pos = in_end - gzip_stream->input_left();
      if (status == Inflater::Status::kEnded) {
        between = true;
      } else if (status == Inflater::Status::kCorrupt) {
        fail(error);
      }  // else out of room (the loop ends) or of input (refilled above)
    }
    return done;
  }

  size_t zstd_read(std::span<std::byte> out) {
    if (!zstd) zstd.emplace();
    size_t done = 0;
    while (done < out.size()) {
      if (!refill()) {
        if (!between) fail("truncated: the file ends inside a zstd frame");
        ended = true;
        break;
      }
      const char* error = nullptr;
      const size_t hint =
          zstd->step(std::span<const std::byte>(in.data(), in_end), in_pos, out, done, &error);
      if (error != nullptr) fail(std::string("corrupt frame: ") + error);
      between = hint == 0;  // a frame ended exactly here
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
