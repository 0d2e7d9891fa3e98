#include "staging/file_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
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

}  // namespace

size_t read_file(const std::string& path, std::vector<std::byte>& buffer, int64_t* mtime_ns) {
  Fd fd = open_for_reading(path);
  const size_t size = regular_file_size(path, fd.get(), mtime_ns);
  buffer.resize(size);
  read_all(path, fd.get(), buffer.data(), size);
  return size;
}

void read_range(const std::string& path, uint64_t offset, std::span<std::byte> out) {
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

size_t file_size(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) fail(path, errno, "stat");
  if (!S_ISREG(st.st_mode)) fail(path, S_ISDIR(st.st_mode) ? EISDIR : EINVAL, "read a non-regular file");
  return static_cast<size_t>(st.st_size);
}

void read_file_exact(const std::string& path, std::span<std::byte> out) {
  Fd fd = open_for_reading(path);
  if (regular_file_size(path, fd.get()) != out.size()) fail(path, EIO, "read (the file changed size)");
  read_all(path, fd.get(), out.data(), out.size());
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
