#include "util/file_io.hpp"

#include <fcntl.h>
#include <linux/openat2.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>

#include "prestage/error.hpp"

namespace prestage::detail {

namespace {

[[noreturn]] void fail(const std::string& path, int err, const char* action) {
  throw IoError(path, err,
                std::string("cannot ") + action + " '" + path + "': " + std::strerror(err));
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

size_t regular_file_size(const std::string& path, int fd, int64_t* mtime_ns = nullptr) {
  struct stat st;
  if (::fstat(fd, &st) != 0) fail(path, errno, "stat");
  if (!S_ISREG(st.st_mode))
    fail(path, S_ISDIR(st.st_mode) ? EISDIR : EINVAL, "read a non-regular file");
  if (mtime_ns != nullptr) {
    *mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  }
  return static_cast<size_t>(st.st_size);
}

// The file's or directory's real path, from the open file itself (race-free): "/proc/self/fd/N".
std::optional<std::string> real_path(int fd) {
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  std::string target(256, '\0');
  while (true) {
    const ssize_t n = ::readlink(link.c_str(), target.data(), target.size());
    if (n < 0) return std::nullopt;
    if (static_cast<size_t>(n) < target.size()) {
      target.resize(static_cast<size_t>(n));
      return target;
    }
    target.resize(target.size() * 2);
  }
}

bool is_beneath(const std::string& real, const std::string& real_root) {
  if (real_root == "/") return real.starts_with('/');
  return real.starts_with(real_root) &&
         (real.size() == real_root.size() || real[real_root.size()] == '/');
}

// Opens `file`'s path below its root with `flags` (O_RDONLY or O_PATH), never outside the root.
Fd open_confined(const FileRef& file, int flags) {
  const std::string& path = file.path();
  const std::string& root = *file.root();
  if (!path.starts_with(root)) {
    throw Error("internal: '" + path + "' is not under its catalog's root '" + root + "'");
  }
  size_t start = root.size();
  while (start < path.size() && path[start] == '/') ++start;
  const std::string relative = path.substr(start);
  Fd root_fd(::open(root.empty() ? "." : root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (root_fd.get() < 0) fail(path, errno, "open the root of");

  static std::atomic<bool> have_openat2{true};
  if (have_openat2.load(std::memory_order_relaxed)) {
    struct open_how how{};
    how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
    long fd = -1;
    // EAGAIN: a rename raced the lookup (the kernel's guard against escapes through ".."); a few
    // tries, then the check below.
    for (int tries = 0; tries < 8; ++tries) {
      fd = ::syscall(SYS_openat2, root_fd.get(), relative.c_str(), &how, sizeof(how));
      if (fd >= 0) return Fd(static_cast<int>(fd));
      if (errno != EINTR && errno != EAGAIN) break;
    }
    // EXDEV: the path leads out of the root, or goes through an absolute link (refused by
    // RESOLVE_BENEATH even when it points inside): decided below, on the file itself. ENOSYS: no
    // openat2 here (kernel < 5.6). EPERM: maybe a seccomp filter; the open below tells.
    if (errno == ENOSYS) {
      have_openat2.store(false, std::memory_order_relaxed);
    } else if (errno != EXDEV && errno != EPERM && errno != EAGAIN && errno != EINTR) {
      fail(path, errno, "open");
    }
  }
  // Open without resolving restrictions, but only as a handle (O_PATH: no side effect, no wait on a
  // FIFO), compare the real path of what was found with the root's, and only then open it for
  // reading through the handle, which names that same file whatever happens to the links since.
  Fd found(::openat(root_fd.get(), relative.c_str(), O_PATH | O_CLOEXEC));
  if (found.get() < 0) fail(path, errno, "open");
  const auto real = real_path(found.get());
  const auto real_root = real_path(root_fd.get());
  if (!real || !real_root || !is_beneath(*real, *real_root)) {
    throw IoError(path, EXDEV,
                  "'" + path + "' leads out of the catalog's root '" + root + "'" +
                      (real ? " (to '" + *real + "')" : std::string()) +
                      ": refused, the catalog confines its files to the root (symlinks=inside)");
  }
  if ((flags & O_PATH) != 0) return found;
  const std::string reopen = "/proc/self/fd/" + std::to_string(found.get());
  Fd fd(::open(reopen.c_str(), flags | O_CLOEXEC));
  if (fd.get() < 0) fail(path, errno, "open");
  return fd;
}

Fd open_for_reading(const FileRef& file) {
  if (file.root() != nullptr) return open_confined(file, O_RDONLY);
  Fd fd(::open(file.path().c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) fail(file.path(), errno, "open");
  return fd;
}

// The file ended `done` bytes into a read of `size` that began at `offset`.
[[noreturn]] void fail_shrank(const std::string& path, uint64_t offset, uint64_t done,
                              uint64_t size) {
  throw IoError(path, EIO,
                "'" + path + "' ended at byte " + std::to_string(offset + done) + " while " +
                    std::to_string(offset + size) +
                    " bytes were being read: it became shorter while being read");
}

void read_all(const std::string& path, int fd, std::byte* out, size_t size) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, out + done, size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(path, errno, "read");
    }
    if (n == 0) fail_shrank(path, 0, done, size);
    done += static_cast<size_t>(n);
  }
}

size_t read_file_now(const FileRef& file, std::vector<std::byte>& buffer, int64_t* mtime_ns) {
  Fd fd = open_for_reading(file);
  const size_t size = regular_file_size(file.path(), fd.get(), mtime_ns);
  buffer.resize(size);
  read_all(file.path(), fd.get(), buffer.data(), size);
  return size;
}

// Reads out.size() bytes at `offset` of the open file `fd` of `size` bytes (as the catalog or an
// earlier look saw it).
void pread_range(const std::string& path, int fd, size_t size, uint64_t offset,
                 std::span<std::byte> out) {
  const size_t length = out.size();
  if (offset > size || length > size - offset) {
    throw IoError(path, EIO,
                  "'" + path + "' is " + std::to_string(size) +
                      " bytes, the catalog expected at least " + std::to_string(offset + length) +
                      " (a sample of " + std::to_string(length) + " bytes at byte " +
                      std::to_string(offset) + "): the file is " +
                      std::to_string(offset + length - size) +
                      " bytes shorter than that, it changed since the catalog was built");
  }
  size_t done = 0;
  while (done < length) {
    const ssize_t n =
        ::pread(fd, out.data() + done, length - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(path, errno, "read");
    }
    if (n == 0) fail_shrank(path, offset, done, length);
    done += static_cast<size_t>(n);
  }
}

// The range is read without looking at the file's size first (a stat is a metadata operation on a
// parallel file system): a file that ends inside it is found by the read, and only then is the file
// looked at, for the message.
void read_range_now(const FileRef& file, uint64_t offset, std::span<std::byte> out) {
  Fd fd = open_for_reading(file);
  const std::string& path = file.path();
  const size_t length = out.size();
  if (length == 0) {  // nothing to read to find the end with: its offset is checked on the size
    pread_range(path, fd.get(), regular_file_size(path, fd.get()), offset, out);
    return;
  }
  size_t done = 0;
  while (done < length) {
    const ssize_t n =
        ::pread(fd.get(), out.data() + done, length - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(path, errno, "read");
    }
    if (n == 0) {
      // Ended early: too short for the range (pread_range says so, with the file's size).
      const size_t size = regular_file_size(path, fd.get());
      if (offset > size || length > size - offset) pread_range(path, fd.get(), size, offset, out);
      fail_shrank(path, offset, done, length);
    }
    done += static_cast<size_t>(n);
  }
}

FileStat file_stat_now(const FileRef& file) {
  struct stat st;
  if (file.root() != nullptr) {
    Fd fd = open_confined(file, O_PATH);
    if (::fstat(fd.get(), &st) != 0) fail(file.path(), errno, "stat");
  } else if (::stat(file.path().c_str(), &st) != 0) {
    fail(file.path(), errno, "stat");
  }
  if (!S_ISREG(st.st_mode)) {
    fail(file.path(), S_ISDIR(st.st_mode) ? EISDIR : EINVAL, "read a non-regular file");
  }
  return {static_cast<uint64_t>(st.st_size),
          static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec};
}

// `path` (open as `fd`) was expected to be `expected` bytes, the size its catalog recorded, and is
// not: it changed since the catalog was built.
[[noreturn]] void fail_changed_size(const std::string& path, int fd, size_t expected, bool longer) {
  struct stat st;  // only for the message: an error path
  const bool known = ::fstat(fd, &st) == 0;
  if (known && !S_ISREG(st.st_mode)) fail(path, EINVAL, "read a non-regular file");
  const std::string actual = known    ? std::to_string(st.st_size)
                             : longer ? "more than " + std::to_string(expected)
                                      : "fewer than " + std::to_string(expected);
  throw IoError(path, EIO,
                "'" + path + "' is " + actual + " bytes, its catalog says " +
                    std::to_string(expected) + ": the file is " + (longer ? "longer" : "shorter") +
                    ", it changed since the catalog was built");
}

// Reads the whole of `fd`, a regular file expected to be exactly out.size() bytes, into `out`, with
// one read call when it is that size: one read of out.size() + 1 bytes (the extra byte into a
// spare), whose short count is the end of the file. Both a shorter and a longer file are found.
//
// Deciding on one read rests on this: a read of a regular file that returns fewer bytes than asked
// has met the end of the file. POSIX promises that only at the end or on a signal, but Linux's
// regular-file reads (local file systems, NFS, FUSE, Lustre, GPFS) return short only at the end of
// the file (or when a signal arrives after some bytes were read). So a short read that brings the
// count to exactly out.size() is taken as the end: the file is not longer. A short read below
// out.size() is not taken as the end (it may be a signal's): reads go on until the end of the file
// (a read of 0 bytes: the file is shorter) or until out.size() + 1 bytes (longer).
void read_expecting(const std::string& path, int fd, std::span<std::byte> out) {
  const size_t size = out.size();
  std::byte spare{};
  size_t done = 0;
  while (true) {
    iovec parts[2];
    int count = 0;
    if (done < size) parts[count++] = {out.data() + done, size - done};
    parts[count++] = {&spare, 1};
    const size_t asked = size + 1 - done;
    const ssize_t n = ::readv(fd, parts, count);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(path, errno, "read");
    }
    done += static_cast<size_t>(n);
    if (done > size) fail_changed_size(path, fd, size, true);
    if (done == size && static_cast<size_t>(n) < asked) return;  // short: the end of the file
    if (n == 0) fail_changed_size(path, fd, size, false);
  }
}

// Linux's default read-ahead window (VM_READAHEAD_PAGES).
constexpr size_t kReadAheadWindow = size_t{128} << 10;

void read_file_exact_now(const FileRef& file, std::span<std::byte> out, bool direct) {
  Fd fd = open_for_reading(file);
  if (out.size() > kReadAheadWindow) {
    // Direct (set_direct_reads): the file in requests of the mount's largest size, sent at once.
    // A file system without O_DIRECT refuses it here (EINVAL) or at the read: read as below.
    if (direct && ::fcntl(fd.get(), F_SETFL, O_DIRECT) == 0) {
      try {
        read_expecting(file.path(), fd.get(), out);
        return;
      } catch (const IoError& e) {
        if (e.error_code() != EINVAL) throw;
      }
      if (::fcntl(fd.get(), F_SETFL, 0) != 0) fail(file.path(), errno, "read");
      if (::lseek(fd.get(), 0, SEEK_SET) != 0) fail(file.path(), errno, "read");
    }
    // The whole file is read at once: a larger read-ahead window makes the kernel fetch it in
    // fewer, larger requests (a FUSE file system gets one request per window: 128 KiB by default,
    // twice that when sequential). Advice only: it costs no operation of the file system, and is
    // ignored where it is not understood.
    ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
  }
  read_expecting(file.path(), fd.get(), out);
}

// A FileRef's strings, owned: what a read on a helper thread keeps (its caller may give up on it).
struct OwnedFileRef {
  explicit OwnedFileRef(const FileRef& file)
      : path(file.path()),
        root(file.root() ? *file.root() : std::string()),
        confined(file.root() != nullptr) {}
  FileRef ref() const { return confined ? FileRef(path, root) : FileRef(path); }
  std::string path;
  std::string root;
  bool confined;
};

thread_local int64_t io_timeout_ms = 0;        // this thread's limit
thread_local bool direct_whole_reads = false;  // set_direct_reads()
thread_local const std::atomic<bool>* io_cancel_flag = nullptr;

// Threads that run reads under a deadline. A thread stuck in a read that never returns is left
// there; the others serve on, and new ones are started while none is idle (up to a bound). Idle
// threads leave after a while. Never destroyed: stuck threads may outlive everything else.
class DeadlineThreads {
 public:
  static DeadlineThreads& instance() {
    static auto* threads = new DeadlineThreads();
    return *threads;
  }

  template <typename Result>
  Result run(const std::string& path, std::chrono::milliseconds timeout,
             std::function<Result()> work) {
    struct State {
      std::mutex mutex;
      std::condition_variable done_cv;
      bool done = false;
      std::optional<Result> value;
      std::exception_ptr error;
    };
    auto state = std::make_shared<State>();
    // The work touches only what it owns (and `state`, kept alive by this capture), so a caller
    // that gave up is never written to.
    submit([state, work = std::move(work)] {
      try {
        state->value.emplace(work());
      } catch (...) {
        state->error = std::current_exception();
      }
      std::lock_guard lock(state->mutex);
      state->done = true;
      state->done_cv.notify_all();
    });
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    const std::atomic<bool>* cancel = io_cancel_flag;
    std::unique_lock lock(state->mutex);
    while (!state->done) {
      // With a cancel flag, look at it every 20 ms.
      const auto until = cancel == nullptr
                             ? deadline
                             : std::min(deadline, std::chrono::steady_clock::now() + kCancelPoll);
      if (state->done_cv.wait_until(lock, until, [&] { return state->done; })) break;
      if (std::chrono::steady_clock::now() >= deadline) {
        throw IoError(path, ETIMEDOUT,
                      "reading '" + path + "' took more than " + std::to_string(timeout.count()) +
                          " ms (io_timeout)");
      }
      if (cancel->load(std::memory_order_acquire)) {
        throw IoError(path, ECANCELED,
                      "reading '" + path + "' was given up: the loader is stopping");
      }
    }
    // The error is taken out of the shared state, so that the exception is freed on this thread,
    // which reads it, never on the helper's when it drops the state (the exception's reference
    // count lives in the uninstrumented C++ runtime, where ThreadSanitizer cannot see it order the
    // two: it reported a race there).
    if (state->error) std::rethrow_exception(std::exchange(state->error, nullptr));
    return std::move(*state->value);
  }

 private:
  static constexpr size_t kMaxThreads = 256;
  static constexpr std::chrono::milliseconds kCancelPoll{20};

  void submit(std::function<void()> task) {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(task));
    // One idle thread per queued task: an idle thread that has not yet woken for an earlier task
    // must not be counted twice (the second task would wait behind a read that may never return).
    if (queue_.size() > idle_ && threads_ < kMaxThreads) {
      ++threads_;
      std::thread([this] {
        pthread_setname_np(pthread_self(), "prestage-io");  // told apart in top -H, /proc
        serve();
      }).detach();
    }
    wake_.notify_one();
  }

  void serve() {
    // Told apart from the loaders' own threads (a stuck read's helper outlives its loader).
    pthread_setname_np(pthread_self(), "prestage-io");  // at most 15 characters
    std::unique_lock lock(mutex_);
    while (true) {
      ++idle_;
      const bool got =
          wake_.wait_for(lock, std::chrono::seconds(2), [&] { return !queue_.empty(); });
      --idle_;
      if (!got) {
        --threads_;
        return;
      }
      auto task = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      task();
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> queue_;
  size_t idle_ = 0;
  size_t threads_ = 0;
};

}  // namespace

void with_file_name(const FileRef& file, const std::function<void(const std::string&)>& use) {
  if (file.root() == nullptr) {
    use(file.path());
    return;
  }
  const Fd found = open_confined(file, O_PATH);
  use("/proc/self/fd/" + std::to_string(found.get()));
}

void set_io_timeout(std::chrono::milliseconds timeout) { io_timeout_ms = timeout.count(); }

void set_direct_reads(bool on) { direct_whole_reads = on; }

bool direct_reads() { return direct_whole_reads; }

namespace {

// A mount point as /proc/self/mountinfo writes it: space, tab, newline and backslash as \ooo.
std::string unescape_mount(const std::string& field) {
  std::string out;
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size()) {
      const std::string digits = field.substr(i + 1, 3);
      if (digits.find_first_not_of("01234567") == std::string::npos) {
        out += static_cast<char>(std::stoi(digits, nullptr, 8));
        i += 3;
        continue;
      }
    }
    out += field[i];
  }
  return out;
}

// Whether the innermost mount holding `target` (absolute, normalised) is FUSE's.
bool mount_is_fuse(const std::string& target) {
  std::ifstream in("/proc/self/mountinfo");
  std::string line, type;
  size_t longest = 0;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string id, parent, device, root, mount;
    const size_t dash = line.find(" - ");
    if (!(fields >> id >> parent >> device >> root >> mount) || dash == std::string::npos) continue;
    mount = unescape_mount(mount);
    // The innermost mount holding the path; of two on one point, the later (it hides the other).
    if (!is_beneath(target, mount) || mount.size() < longest) continue;
    longest = mount.size();
    std::istringstream rest(line.substr(dash + 3));
    rest >> type;
  }
  return type == "fuse" || type == "fuseblk" || type.starts_with("fuse.");
}

// The paths source_is_fuse() has answered for, each with its answer: whole-file reads beneath them
// are direct (or not) on every thread.
class DirectRoots {
 public:
  static DirectRoots& instance() {
    static auto* roots = new DirectRoots();  // never destroyed: reads may run until exit
    return *roots;
  }

  void set(const std::string& root, bool direct) {
    std::lock_guard lock(mutex_);
    roots_.insert_or_assign(root, direct);
    any_ = true;
  }

  // Whether `path` (as given to a read) lies beneath a root found on FUSE, the innermost root
  // holding it deciding. Called only for a file larger than the read-ahead window, whose read
  // costs far more than this.
  bool direct_beneath(const std::string& path) const {
    if (!any_.load(std::memory_order_relaxed)) return false;
    std::error_code error;
    const std::string target = std::filesystem::absolute(path, error).lexically_normal().string();
    if (error) return false;
    std::lock_guard lock(mutex_);
    size_t longest = 0;
    bool direct = false;
    for (const auto& [root, on] : roots_) {
      if (root.size() >= longest && is_beneath(target, root)) {
        longest = root.size();
        direct = on;
      }
    }
    return direct;
  }

 private:
  mutable std::mutex mutex_;
  std::map<std::string, bool> roots_;  // absolute, normalised: a few, one per catalog root
  std::atomic<bool> any_{false};
};

}  // namespace

bool source_is_fuse(const std::string& path) {
  // From the mount table, not statfs: a stalled file system must not hang the loader's start.
  if (path.empty()) return false;
  std::error_code error;
  std::string target = std::filesystem::absolute(path, error).lexically_normal().string();
  if (error) return false;
  // lexically_normal keeps a trailing separator ("/a/b/" for "/a/b/."): is_beneath wants none.
  if (target.size() > 1 && target.back() == '/') target.pop_back();
  const bool fuse = mount_is_fuse(target);
  DirectRoots::instance().set(target, fuse);
  return fuse;
}

std::chrono::milliseconds io_timeout() { return std::chrono::milliseconds(io_timeout_ms); }

void set_io_cancel(const std::atomic<bool>* cancel) { io_cancel_flag = cancel; }

const std::atomic<bool>* io_cancel() { return io_cancel_flag; }

size_t read_file(const FileRef& file, std::vector<std::byte>& buffer, int64_t* mtime_ns) {
  const auto timeout = io_timeout();
  if (timeout.count() == 0) return read_file_now(file, buffer, mtime_ns);
  struct Read {
    std::vector<std::byte> bytes;
    int64_t mtime = 0;
  };
  Read read =
      DeadlineThreads::instance().run<Read>(file.path(), timeout, [owned = OwnedFileRef(file)] {
        Read r;
        read_file_now(owned.ref(), r.bytes, &r.mtime);
        return r;
      });
  buffer = std::move(read.bytes);
  if (mtime_ns != nullptr) *mtime_ns = read.mtime;
  return buffer.size();
}

void read_range(const FileRef& file, uint64_t offset, std::span<std::byte> out) {
  const auto timeout = io_timeout();
  if (timeout.count() == 0) return read_range_now(file, offset, out);
  const size_t length = out.size();
  auto bytes = DeadlineThreads::instance().run<std::vector<std::byte>>(
      file.path(), timeout, [owned = OwnedFileRef(file), offset, length] {
        std::vector<std::byte> b(length);
        read_range_now(owned.ref(), offset, b);
        return b;
      });
  if (length != 0) std::memcpy(out.data(), bytes.data(), length);
}

FileStat file_stat(const FileRef& file) {
  const auto timeout = io_timeout();
  if (timeout.count() == 0) return file_stat_now(file);
  return DeadlineThreads::instance().run<FileStat>(
      file.path(), timeout, [owned = OwnedFileRef(file)] { return file_stat_now(owned.ref()); });
}

size_t file_size(const FileRef& file) { return static_cast<size_t>(file_stat(file).size); }

// Shared with the reads on helper threads (io_timeout), which may outlive the OpenFile.
struct OpenFile::State {
  std::string path;
  Fd fd;
  size_t size = 0;
  State(std::string p, Fd f) : path(std::move(p)), fd(std::move(f)) {
    size = regular_file_size(path, fd.get());
  }
};

OpenFile::OpenFile(const FileRef& file) {
  const auto open = [](const FileRef& f) {
    return std::make_shared<State>(f.path(), open_for_reading(f));
  };
  const auto timeout = io_timeout();
  if (timeout.count() == 0) {
    state_ = open(file);
    return;
  }
  state_ = DeadlineThreads::instance().run<std::shared_ptr<State>>(
      file.path(), timeout, [owned = OwnedFileRef(file), open] { return open(owned.ref()); });
}

OpenFile::~OpenFile() = default;
OpenFile::OpenFile(OpenFile&&) noexcept = default;
OpenFile& OpenFile::operator=(OpenFile&&) noexcept = default;

uint64_t OpenFile::size() const noexcept { return state_->size; }

void OpenFile::read(uint64_t offset, std::span<std::byte> out) const {
  const auto timeout = io_timeout();
  if (timeout.count() == 0) {
    pread_range(state_->path, state_->fd.get(), state_->size, offset, out);
    return;
  }
  const size_t length = out.size();
  auto bytes = DeadlineThreads::instance().run<std::vector<std::byte>>(
      state_->path, timeout, [state = state_, offset, length] {
        std::vector<std::byte> b(length);
        pread_range(state->path, state->fd.get(), state->size, offset, b);
        return b;
      });
  if (length != 0) std::memcpy(out.data(), bytes.data(), length);
}

void read_file_exact(const FileRef& file, std::span<std::byte> out) {
  const auto timeout = io_timeout();
  const bool direct = out.size() > kReadAheadWindow &&
                      (direct_reads() || DirectRoots::instance().direct_beneath(file.path()));
  if (timeout.count() == 0) return read_file_exact_now(file, out, direct);
  const size_t length = out.size();
  auto bytes = DeadlineThreads::instance().run<std::vector<std::byte>>(
      file.path(), timeout, [owned = OwnedFileRef(file), length, direct] {
        std::vector<std::byte> b(length);
        read_file_exact_now(owned.ref(), b, direct);
        return b;
      });
  if (length != 0) std::memcpy(out.data(), bytes.data(), length);
}

void read_located(const FileRef& file, const Catalog::Locator& loc,
                  std::vector<std::byte>& buffer) {
  if (loc.length == Catalog::kWholeFile) {
    read_file(file, buffer);
  } else {
    buffer.resize(loc.length);
    read_range(file, loc.offset, buffer);
  }
}

void read_located(const FileRef& file, const Catalog::Locator& loc, std::span<std::byte> out) {
  if (loc.length == Catalog::kWholeFile) {
    read_file_exact(file, out);
  } else {
    read_range(file, loc.offset, out);
  }
}

void write_file_atomically(const std::string& path, const std::string& tmp_path,
                           std::span<const std::byte> bytes) {
  Fd fd(::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) fail(tmp_path, errno, "create");
  auto fail_and_remove = [&](int err, const char* action) {
    ::close(fd.release());
    ::unlink(tmp_path.c_str());
    fail(tmp_path, err, action);
  };
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_and_remove(errno, "write");
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd.release()) != 0) {
    const int err = errno;
    ::unlink(tmp_path.c_str());
    fail(tmp_path, err, "close");
  }
  if (::rename(tmp_path.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_path.c_str());
    fail(path, err, "rename");
  }
}

}  // namespace prestage::detail
