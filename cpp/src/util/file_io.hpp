// POSIX file access shared by stage 2 (copies) and stage 3 (reads). Every failure is an IoError with
// the path and errno.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "prestage/catalog.hpp"

namespace prestage::detail {

// A read (of the functions below) that takes longer than this fails with an IoError (ETIMEDOUT)
// instead of hanging on a stalled file system: with a limit, each read runs on a helper thread, which
// is left behind if the read never returns. 0 (the default): no limit, reads run on the caller's
// thread. Per thread: each loader sets its own limit on the threads that read for it, so loaders in
// one process keep their own limits.
void set_io_timeout(std::chrono::milliseconds timeout);
std::chrono::milliseconds io_timeout();

// A flag that, once set, makes this thread's reads under a limit give up within about 20 ms (an
// IoError, ECANCELED) instead of waiting out the limit: a loader that stops does not wait for a
// stalled read. Null: none. Per thread, as the limit.
void set_io_cancel(const std::atomic<bool>* cancel);
const std::atomic<bool>* io_cancel();

// Sets this thread's limit (and cancel flag) for a scope, and restores the ones it had.
class IoTimeoutScope {
 public:
  explicit IoTimeoutScope(std::chrono::milliseconds timeout, const std::atomic<bool>* cancel = nullptr)
      : previous_(io_timeout()), previous_cancel_(io_cancel()) {
    set_io_timeout(timeout);
    set_io_cancel(cancel);
  }
  ~IoTimeoutScope() {
    set_io_timeout(previous_);
    set_io_cancel(previous_cancel_);
  }
  IoTimeoutScope(const IoTimeoutScope&) = delete;
  IoTimeoutScope& operator=(const IoTimeoutScope&) = delete;

 private:
  std::chrono::milliseconds previous_;
  const std::atomic<bool>* previous_cancel_;
};

// Reads a whole regular file into `buffer` (resized to fit; its capacity is reused across calls).
// Returns the number of bytes read.
// With `mtime_ns`, also gives the file's modification time (ns since the epoch) from the same open.
size_t read_file(const std::string& path, std::vector<std::byte>& buffer, int64_t* mtime_ns = nullptr);

// Reads out.size() bytes at `offset` of a regular file into `out`. A file too short for the range is
// an IoError.
void read_range(const std::string& path, uint64_t offset, std::span<std::byte> out);

// The size of a regular file (one stat).
size_t file_size(const std::string& path);

// Reads a regular file of exactly out.size() bytes into `out`; a file of any other size is an IoError
// (it changed since its size was taken).
void read_file_exact(const std::string& path, std::span<std::byte> out);

// A sample's bytes, located by `loc` in the file at `path` (the whole file, or a range of it), into
// `buffer` (resized to fit).
void read_located(const std::string& path, const Catalog::Locator& loc, std::vector<std::byte>& buffer);

// The same for a sample whose size is already known: exactly out.size() bytes into `out`.
void read_located(const std::string& path, const Catalog::Locator& loc, std::span<std::byte> out);

// Writes `bytes` to `tmp_path`, then renames it to `path`: a reader sees the whole file or none.
// On failure the temporary file is removed.
void write_file_atomically(const std::string& path, const std::string& tmp_path,
                           std::span<const std::byte> bytes);

}  // namespace prestage::detail
