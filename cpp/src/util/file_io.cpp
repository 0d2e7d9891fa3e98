#include "util/file_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "prestage/error.hpp"

namespace prestage::detail {

namespace {

[[noreturn]] void fail(const std::string& path, int err, const char* action) {
  throw IoError(path, err, std::string("cannot ") + action + " '" + path + "': " + std::strerror(err));
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
  if (!S_ISREG(st.st_mode)) fail(path, S_ISDIR(st.st_mode) ? EISDIR : EINVAL, "read a non-regular file");
  if (mtime_ns != nullptr) {
    *mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  }
  return static_cast<size_t>(st.st_size);
}

Fd open_for_reading(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) fail(path, errno, "open");
  return fd;
}

void read_all(const std::string& path, int fd, std::byte* out, size_t size) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, out + done, size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(path, errno, "read");
    }
    if (n == 0) fail(path, EIO, "read (the file shrank while being read)");
    done += static_cast<size_t>(n);
  }
}


size_t read_file_now(const std::string& path, std::vector<std::byte>& buffer, int64_t* mtime_ns) {
  Fd fd = open_for_reading(path);
  const size_t size = regular_file_size(path, fd.get(), mtime_ns);
  buffer.resize(size);
  read_all(path, fd.get(), buffer.data(), size);
  return size;
}

void read_range_now(const std::string& path, uint64_t offset, std::span<std::byte> out) {
  Fd fd = open_for_reading(path);
  const size_t size = regular_file_size(path, fd.get());
  const size_t length = out.size();
  if (offset > size || length > size - offset) fail(path, EIO, "read (the file ends before the sample)");
  size_t done = 0;
  while (done < length) {
    const ssize_t n = ::pread(fd.get(), out.data() + done, length - done,
                              static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(path, errno, "read");
    }
    if (n == 0) fail(path, EIO, "read (the file shrank while being read)");
    done += static_cast<size_t>(n);
  }
}

size_t file_size_now(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) fail(path, errno, "stat");
  if (!S_ISREG(st.st_mode)) fail(path, S_ISDIR(st.st_mode) ? EISDIR : EINVAL, "read a non-regular file");
  return static_cast<size_t>(st.st_size);
}

void read_file_exact_now(const std::string& path, std::span<std::byte> out) {
  Fd fd = open_for_reading(path);
  if (regular_file_size(path, fd.get()) != out.size()) fail(path, EIO, "read (the file changed size)");
  read_all(path, fd.get(), out.data(), out.size());
}

thread_local int64_t io_timeout_ms = 0;  // this thread's limit
thread_local const std::atomic<bool>* io_cancel_flag = nullptr;

// Threads that run reads under a deadline. A thread stuck in a read that never returns is left there;
// the others serve on, and new ones are started while none is idle (up to a bound). Idle threads
// leave after a while. Never destroyed: stuck threads may outlive everything else.
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
    // The work touches only what it owns (and `state`, kept alive by this capture), so a caller that
    // gave up is never written to.
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
        throw IoError(path, ETIMEDOUT, "reading '" + path + "' took more than " +
                                           std::to_string(timeout.count()) + " ms (io_timeout)");
      }
      if (cancel->load(std::memory_order_acquire)) {
        throw IoError(path, ECANCELED, "reading '" + path + "' was given up: the loader is stopping");
      }
    }
    if (state->error) std::rethrow_exception(state->error);
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
      std::thread([this] { serve(); }).detach();
    }
    wake_.notify_one();
  }

  void serve() {
    std::unique_lock lock(mutex_);
    while (true) {
      ++idle_;
      const bool got = wake_.wait_for(lock, std::chrono::seconds(2), [&] { return !queue_.empty(); });
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

void set_io_timeout(std::chrono::milliseconds timeout) { io_timeout_ms = timeout.count(); }

std::chrono::milliseconds io_timeout() { return std::chrono::milliseconds(io_timeout_ms); }

void set_io_cancel(const std::atomic<bool>* cancel) { io_cancel_flag = cancel; }

const std::atomic<bool>* io_cancel() { return io_cancel_flag; }

size_t read_file(const std::string& path, std::vector<std::byte>& buffer, int64_t* mtime_ns) {
  const auto timeout = io_timeout();
  if (timeout.count() == 0) return read_file_now(path, buffer, mtime_ns);
  struct Read {
    std::vector<std::byte> bytes;
    int64_t mtime = 0;
  };
  Read read = DeadlineThreads::instance().run<Read>(path, timeout, [path] {
    Read r;
    read_file_now(path, r.bytes, &r.mtime);
    return r;
  });
  buffer = std::move(read.bytes);
  if (mtime_ns != nullptr) *mtime_ns = read.mtime;
  return buffer.size();
}

void read_range(const std::string& path, uint64_t offset, std::span<std::byte> out) {
  const auto timeout = io_timeout();
  if (timeout.count() == 0) return read_range_now(path, offset, out);
  const size_t length = out.size();
  auto bytes = DeadlineThreads::instance().run<std::vector<std::byte>>(path, timeout, [=] {
    std::vector<std::byte> b(length);
    read_range_now(path, offset, b);
    return b;
  });
  std::memcpy(out.data(), bytes.data(), length);
}

size_t file_size(const std::string& path) {
  const auto timeout = io_timeout();
  if (timeout.count() == 0) return file_size_now(path);
  return DeadlineThreads::instance().run<size_t>(path, timeout, [path] { return file_size_now(path); });
}

void read_file_exact(const std::string& path, std::span<std::byte> out) {
  const auto timeout = io_timeout();
  if (timeout.count() == 0) return read_file_exact_now(path, out);
  const size_t length = out.size();
  auto bytes = DeadlineThreads::instance().run<std::vector<std::byte>>(path, timeout, [=] {
    std::vector<std::byte> b(length);
    read_file_exact_now(path, b);
    return b;
  });
  std::memcpy(out.data(), bytes.data(), length);
}

void read_located(const std::string& path, const Catalog::Locator& loc, std::vector<std::byte>& buffer) {
  if (loc.length == Catalog::kWholeFile) {
    read_file(path, buffer);
  } else {
    buffer.resize(loc.length);
    read_range(path, loc.offset, buffer);
  }
}

void read_located(const std::string& path, const Catalog::Locator& loc, std::span<std::byte> out) {
  if (loc.length == Catalog::kWholeFile) {
    read_file_exact(path, out);
  } else {
    read_range(path, loc.offset, out);
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
