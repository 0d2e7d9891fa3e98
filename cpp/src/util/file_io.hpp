// POSIX file access shared by stage 2 (copies) and stage 3 (reads). Every failure is an IoError
// with the path and errno.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "prestage/catalog.hpp"

namespace prestage::detail {

// A file to open for reading: a path, opened as it is (symbolic links followed), or a catalog's
// source file confined to the catalog's root. Confined, the part of `path` below `root` is resolved
// beneath `root`: a symbolic link (or anything else) that leads out of the root is an IoError
// (EXDEV) naming `path`, checked on the file actually opened (openat2's RESOLVE_BENEATH; where the
// kernel lacks openat2, or for an absolute link, the opened file's real path is compared with the
// root's), so a link changed after the catalog was built cannot get past it. Confining costs one
// extra path lookup (of the root) per open. Views its strings: they must outlive the call that
// takes it.
class FileRef {
 public:
  FileRef(const std::string& path) : path_(path) {}  // NOLINT: any path converts, opened as it is
  // `path` must start with `root` (as root / relative does).
  FileRef(const std::string& path, const std::string& root) : path_(path), root_(&root) {}
  const std::string& path() const noexcept { return path_; }
  const std::string* root() const noexcept { return root_; }  // null: not confined

 private:
  const std::string& path_;
  const std::string* root_ = nullptr;
};

// For a library that opens files by name (HDF5): calls `use` with a name that opens `file` as
// FileRef says. Confined, the name is /proc/self/fd/N of the file the confined open found (held
// open for the call), so the library opens that very file; otherwise it is the path.
void with_file_name(const FileRef& file, const std::function<void(const std::string&)>& use);

// A read (of the functions below) that takes longer than this fails with an IoError (ETIMEDOUT)
// instead of hanging on a stalled file system: with a limit, each read runs on a helper thread,
// which is left behind if the read never returns. The helpers are the process's, shared by its
// loaders and named "prestage-io"; an idle one leaves after 2 s. 0 (the default): no limit, reads
// run on the caller's thread. Per thread: each loader sets its own limit on the threads that read
// for it, so loaders in one process keep their own limits.
void set_io_timeout(std::chrono::milliseconds timeout);
std::chrono::milliseconds io_timeout();

// A flag that, once set, makes this thread's reads under a limit give up within about 20 ms (an
// IoError, ECANCELED) instead of waiting out the limit: a loader that stops does not wait for a
// stalled read. Null: none. Per thread, as the limit.
void set_io_cancel(const std::atomic<bool>* cancel);
const std::atomic<bool>* io_cancel();

// Whether this thread's read_file_exact() reads a file larger than the kernel's read-ahead window
// (128 KiB) with O_DIRECT: for a file system that serves reads through FUSE, where a read through
// the page cache is cut into one request per read-ahead window (256 KiB at most, even when the
// access is advised sequential), sent one after the other as the read reaches them, and a direct
// read into requests of the mount's largest size (1 MiB by default), sent at once: a 2.6 MB file
// costs 3 requests instead of 11, and one latency instead of several. Off by default; stage 2 turns
// it on for its threads where the source is FUSE (source_is_fuse()), whose copies are read once
// and never from the page cache again. A file system that refuses O_DIRECT is read as without it.
// Per thread, as the limit.
void set_direct_reads(bool on);
bool direct_reads();

// Whether `path` lies on a FUSE file system, from the process's mount table (the innermost mount
// holding the path as written, absolute; links are not followed): nothing is asked of the file
// system itself. False where it cannot be told. The answer is also kept for the whole-file reads:
// on every thread of the process (stage 3's too, not only stage 2's), read_file_exact() reads a
// large file beneath a path found on FUSE with O_DIRECT, as set_direct_reads() makes it on one
// thread, and a file beneath a path found elsewhere as before; of several such paths holding a
// file, the innermost, of two answers for one path, the last. A file beneath none of them (a stage
// directory's copy) is read as before. Thread-safe.
bool source_is_fuse(const std::string& path);

// Sets this thread's limit (and cancel flag) for a scope, and restores the ones it had.
class IoTimeoutScope {
 public:
  explicit IoTimeoutScope(std::chrono::milliseconds timeout,
                          const std::atomic<bool>* cancel = nullptr)
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

// Short reads, for every read below: a read that finds fewer bytes than it expects is an IoError
// (EIO, the errno of a read that finds the data gone) whose message gives both sizes and says that
// the file changed: a range past the end of the file (read_range, OpenFile::read, read_located of a
// range), a file of another size than expected (read_file_exact), a file that became shorter while
// it was read (all of them).

// Reads a whole regular file into `buffer` (resized to fit; its capacity is reused across calls):
// as many bytes as the file holds when it is opened, whatever size was expected of it. Returns the
// number of bytes read.
// With `mtime_ns`, also gives the file's modification time (ns since the epoch) from the same open.
size_t read_file(const FileRef& file, std::vector<std::byte>& buffer, int64_t* mtime_ns = nullptr);

// Reads out.size() bytes at `offset` of a regular file into `out`: one open and one read, no stat.
// A file too short for the range is an IoError.
void read_range(const FileRef& file, uint64_t offset, std::span<std::byte> out);

// A regular file held open for several reads (a sample's headers, then its data): one open and
// one stat in all, where the functions below cost one of each per read, and a parallel file system
// counts both as metadata operations. Reads see the file that was opened, whatever happens to its
// name since, and obey the io_timeout of the thread that makes them, as the functions below do.
// Not thread-safe; the file is closed when the OpenFile is destroyed (or, after a read that timed
// out, when that read returns).
class OpenFile {
 public:
  explicit OpenFile(
      const FileRef& file);  // IoError if it cannot be opened or is not a regular file
  ~OpenFile();
  OpenFile(OpenFile&&) noexcept;
  OpenFile& operator=(OpenFile&&) noexcept;
  uint64_t size() const noexcept;  // when it was opened
  // Reads out.size() bytes at `offset`; a range past size() or a file that became shorter is an
  // IoError (EIO), as read_range says.
  void read(uint64_t offset, std::span<std::byte> out) const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

// The size of a regular file (one stat; confined, one open).
size_t file_size(const FileRef& file);

// The size and modification time (ns since the epoch) of a regular file.
struct FileStat {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
};
FileStat file_stat(const FileRef& file);

// Reads a regular file of exactly out.size() bytes (the size its catalog recorded) into `out`; a
// file of any other size, shorter or longer, is an IoError (EIO) naming both sizes: it changed
// since the catalog was built. One open and, for a file of that size, one read (of out.size() + 1
// bytes: the file_io.cpp says why that is enough), no stat: the fewest operations a parallel file
// system can serve a file with.
void read_file_exact(const FileRef& file, std::span<std::byte> out);

// A sample's bytes, located by `loc` in `file` (the whole file, or a range of it), into `buffer`
// (resized to fit).
void read_located(const FileRef& file, const Catalog::Locator& loc, std::vector<std::byte>& buffer);

// The same for a sample whose size is already known: exactly out.size() bytes into `out`.
void read_located(const FileRef& file, const Catalog::Locator& loc, std::span<std::byte> out);

// Writes `bytes` to `tmp_path`, then renames it to `path`: a reader sees the whole file or none.
// On failure the temporary file is removed.
void write_file_atomically(const std::string& path, const std::string& tmp_path,
                           std::span<const std::byte> bytes);

}  // namespace prestage::detail
