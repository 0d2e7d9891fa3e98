#include "staging/stage_directory.hpp"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <system_error>

#include "prestage/error.hpp"
#include "staging/file_io.hpp"

namespace prestage::detail {

namespace fs = std::filesystem;

namespace {

constexpr int kShards = 256;

std::string hex(uint64_t v, int width) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%0*llx", width, static_cast<unsigned long long>(v));
  return buf;
}

bool parse_hex(std::string_view s, uint64_t& out) {
  if (s.empty() || s.size() > 16) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out, 16);
  return ec == std::errc() && end == s.data() + s.size();
}

bool process_alive(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

}  // namespace

StageDirectory::StageDirectory(const fs::path& dir, const Catalog& catalog)
    : area_(dir / ("prestage-" + hex(catalog.fingerprint(), 16))),
      size_(catalog.num_files()),
      state_(new std::atomic<uint8_t>[catalog.num_files()]()),
      sizes_(new std::atomic<uint64_t>[catalog.num_files()]()) {
  std::error_code ec;
  for (int shard = 0; shard < kShards; ++shard) {
    const fs::path shard_dir = area_ / hex(shard, 2);
    fs::create_directories(shard_dir, ec);
    if (ec) {
      throw IoError(shard_dir.string(), ec.value(),
                    "cannot create stage directory '" + shard_dir.string() + "': " + ec.message());
    }
    for (fs::directory_iterator it(shard_dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      const size_t dot = name.find('.');
      uint64_t id = 0;
      if (dot == std::string::npos) {
        std::error_code size_ec;
        const uint64_t size = it->file_size(size_ec);
        if (parse_hex(name, id) && id < size_ && static_cast<int>(id % kShards) == shard && !size_ec) {
          state_[id].store(kStaged, std::memory_order_relaxed);
          sizes_[id].store(size, std::memory_order_relaxed);
          ++found_at_start_;
        }
        continue;
      }
      // "<id>.tmp.<pid>.<n>": a copy in progress, or left by a process that was killed.
      const size_t pid_at = name.find(".tmp.");
      uint64_t pid = 0;
      if (pid_at != std::string::npos) {
        const size_t pid_end = name.find('.', pid_at + 5);
        std::string_view pid_text = std::string_view(name).substr(pid_at + 5, pid_end - pid_at - 5);
        auto [p, e] = std::from_chars(pid_text.data(), pid_text.data() + pid_text.size(), pid);
        if (e == std::errc() && !process_alive(static_cast<pid_t>(pid))) {
          std::error_code ignored;
          fs::remove(it->path(), ignored);
        }
      }
    }
    if (ec) {
      throw IoError(shard_dir.string(), ec.value(),
                    "cannot list stage directory '" + shard_dir.string() + "': " + ec.message());
    }
  }
}

std::string StageDirectory::staged_path(uint64_t id) const {
  return (area_ / hex(id % kShards, 2) / hex(id, 0)).string();
}

bool StageDirectory::try_claim(uint64_t id) noexcept {
  uint8_t expected = kAbsent;
  return state_[id].compare_exchange_strong(expected, kInFlight, std::memory_order_acq_rel);
}

void StageDirectory::publish(uint64_t id, std::span<const std::byte> bytes) {
  const std::string final_path = staged_path(id);
  const std::string tmp_path = final_path + ".tmp." + std::to_string(::getpid()) + "." +
                               std::to_string(tmp_counter_.fetch_add(1, std::memory_order_relaxed));
  try {
    write_file_atomically(final_path, tmp_path, bytes);
  } catch (...) {
    abandon(id);
    throw;
  }
  sizes_[id].store(bytes.size(), std::memory_order_relaxed);
  state_[id].store(kStaged, std::memory_order_release);
}

void StageDirectory::evict(uint64_t id) noexcept {
  state_[id].store(kAbsent, std::memory_order_release);
  ::unlink(staged_path(id).c_str());
}

void StageDirectory::abandon(uint64_t id) noexcept {
  state_[id].store(kAbsent, std::memory_order_release);
}

}  // namespace prestage::detail
