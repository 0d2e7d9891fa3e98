// What the libFuzzer harnesses share: a scratch directory for parsers that read files, and the
// checksum fix-ups that let mutation reach the code behind a CRC.
//
// Contract of every harness: prestage::Error (and its subclasses) is the expected outcome of bad
// input and is caught; anything else (a crash, another exception, a sanitizer report, a hang, an
// allocation over libFuzzer's -malloc_limit_mb) is a finding. A harness aborts (harness_check)
// when a property that holds for every input is broken, so that libFuzzer reports it too.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "formats/tfrecord.hpp"  // masked_crc32c

namespace prestage::fuzz {

// Aborts with `what` when `ok` is false: an invariant that no input may break.
inline void harness_check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz invariant broken: %s\n", what);
    std::abort();
  }
}

// A directory of this process's own under the system temporary directory, created on first use and
// removed at a normal exit (libFuzzer exits normally at the end of -max_total_time / -runs).
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "prestage-fuzz-XXXXXX").string();
    harness_check(::mkdtemp(pattern.data()) != nullptr, "mkdtemp");
    static std::filesystem::path removed_at_exit;
    removed_at_exit = pattern;
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(removed_at_exit, ignored);
    });
    return std::filesystem::path(pattern);
  }();
  return dir;
}

// Replaces the file at `path` with `bytes`. Failing here is a broken harness, not a finding.
inline void write_file(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  harness_check(fd >= 0, "open a scratch file");
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    harness_check(n > 0, "write a scratch file");
    done += static_cast<size_t>(n);
  }
  ::close(fd);
}

inline std::span<const std::byte> as_bytes(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const std::byte*>(data), size};
}

inline void store_u32(std::byte* p, uint32_t v) { std::memcpy(p, &v, sizeof(v)); }

// Rewrites both masked CRCs of every TFRecord record in `bytes` (u64 length, CRC of the length,
// data, CRC of the data), walking the records as the lengths say; a record that runs past the end
// keeps only its length CRC fixed. Mutations then reach the checks behind the CRCs.
inline void fix_tfrecord_crcs(std::span<std::byte> bytes) {
  size_t at = 0;
  while (bytes.size() - at >= 12) {
    uint64_t length;
    std::memcpy(&length, bytes.data() + at, sizeof(length));
    store_u32(bytes.data() + at + 8, detail::masked_crc32c(bytes.subspan(at, 8)));
    const size_t left = bytes.size() - at - 12;
    if (length > left || left - length < 4) return;
    store_u32(bytes.data() + at + 12 + length,
              detail::masked_crc32c(bytes.subspan(at + 12, static_cast<size_t>(length))));
    at += 16 + static_cast<size_t>(length);
  }
}

// `data` framed as one TFRecord record with correct CRCs.
inline std::vector<std::byte> frame_record(std::span<const std::byte> data) {
  std::vector<std::byte> framed(data.size() + detail::kFramingBytes);
  const uint64_t length = data.size();
  std::memcpy(framed.data(), &length, sizeof(length));
  if (!data.empty()) std::memcpy(framed.data() + 12, data.data(), data.size());
  fix_tfrecord_crcs(framed);
  return framed;
}

}  // namespace prestage::fuzz
