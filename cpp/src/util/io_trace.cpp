#include "util/io_trace.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "prestage/error.hpp"

namespace prestage::detail {

namespace {

constexpr char kMagic[8] = {'P', 'S', 'T', 'G', 'T', 'R', 'C', '1'};

// A small number per thread, in order of first use, so that a timeline has one row per thread.
uint32_t thread_number() noexcept {
  static std::atomic<uint32_t> next{0};
  thread_local const uint32_t mine = next.fetch_add(1, std::memory_order_relaxed);
  return mine;
}

bool write_all(int fd, const void* data, size_t size) noexcept {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

IoTrace::IoTrace(const std::string& path, const std::string& root, uint64_t files)
    : origin_(std::chrono::steady_clock::now()) {
  std::string header_json = "{\"format\": 1, \"root\": \"";
  for (const char c : root) {
    if (c == '"' || c == '\\') {
      header_json += '\\';
      header_json += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
      header_json += escaped;
    } else {
      header_json += c;
    }
  }
  header_json += "\", \"files\": " + std::to_string(files) + "}";
  // Never through a link (one planted under its name in a shared folder), and never another user's
  // file: checked before it is emptied. Its records name the data set's files: the job's user's
  // alone.
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd_ < 0) {
    const int err = errno;
    throw IoError(path, err,
                  "cannot create the I/O trace '" + path + "': " + std::strerror(err) +
                      (err == ELOOP ? " (a symbolic link, never followed)" : ""));
  }
  struct stat st{};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) {
    ::close(fd_);
    throw IoError(path, EPERM,
                  "refusing the I/O trace '" + path + "': not a regular file of this user's (uid " +
                      std::to_string(st.st_uid) + "); name another file");
  }
  if (::ftruncate(fd_, 0) != 0) {
    const int err = errno;
    ::close(fd_);
    throw IoError(path, err, "cannot empty the I/O trace '" + path + "': " + std::strerror(err));
  }
  const uint64_t header_bytes = header_json.size();
  if (!write_all(fd_, kMagic, sizeof(kMagic)) ||
      !write_all(fd_, &header_bytes, sizeof(header_bytes)) ||
      !write_all(fd_, header_json.data(), header_json.size())) {
    const int err = errno;
    ::close(fd_);
    throw IoError(path, err, "cannot write the I/O trace '" + path + "': " + std::strerror(err));
  }
  for (Slot& slot : slots_) slot.records.reserve(kBatch);
}

IoTrace::~IoTrace() {
  flush();
  ::close(fd_);
}

void IoTrace::add(uint64_t sample, uint64_t file, uint64_t offset, uint64_t size, int64_t start_ns,
                  uint8_t tier, TraceKind kind) noexcept {
  const uint32_t thread = thread_number();
  const TraceRecord record{
      sample, file, offset, size, start_ns, now_ns(), thread, tier, static_cast<uint8_t>(kind), 0};
  Slot& slot = slots_[thread % kSlots];
  std::vector<TraceRecord> full;
  {
    std::lock_guard lock(slot.mutex);
    ++slot.added;
    slot.records.push_back(record);
    if (slot.records.size() < kBatch) return;
    full.swap(slot.records);
    slot.records.reserve(kBatch);
  }
  write(full);  // outside the slot's lock: the slot's other threads keep recording
}

void IoTrace::flush() noexcept {
  for (Slot& slot : slots_) {
    std::vector<TraceRecord> records;
    {
      std::lock_guard lock(slot.mutex);
      records.swap(slot.records);
    }
    write(records);
  }
}

void IoTrace::write(const std::vector<TraceRecord>& records) noexcept {
  if (records.empty()) return;
  std::lock_guard lock(write_mutex_);
  if (write_all(fd_, records.data(), records.size() * sizeof(TraceRecord))) {
    written_ += records.size();
  } else {
    lost_ += records.size();
  }
}

uint64_t IoTrace::records() noexcept {
  uint64_t n = 0;
  for (Slot& slot : slots_) {
    std::lock_guard lock(slot.mutex);
    n += slot.added;
  }
  return n;
}

uint64_t IoTrace::write_errors() const noexcept {
  std::lock_guard lock(write_mutex_);
  return lost_;
}

}  // namespace prestage::detail
