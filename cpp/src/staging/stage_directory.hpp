// Stage 2's view of the stage directory (node-local SSD): where each file's copy lives and an
// in-memory index of each file's state. Ids here are the catalog's file ids (for a folder of images,
// one file per sample).
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>

#include "prestage/catalog.hpp"

namespace prestage::detail {

// Layout: <stage_dir>/prestage-<catalog fingerprint>/<id % 256, 2 hex digits>/<id, hex>. Names come
// from file ids alone, so no write can land outside the directory whatever the catalog's paths.
// A copy is written under "<name>.tmp.<pid>.<n>" and renamed: a file under its final name is complete,
// and a temporary file left by a killed process is never served.
class StageDirectory {
 public:
  enum State : uint8_t { kAbsent = 0, kInFlight = 1, kStaged = 2 };

  // Creates the directories and indexes the copies an earlier run left (one listing per shard
  // directory; temporary files of processes that no longer run are removed). Throws IoError.
  StageDirectory(const std::filesystem::path& dir, const Catalog& catalog);

  const std::filesystem::path& path() const noexcept { return area_; }
  uint64_t found_at_start() const noexcept { return found_at_start_; }

  bool is_staged(uint64_t id) const noexcept {
    return state_[id].load(std::memory_order_acquire) == kStaged;
  }
  std::string staged_path(uint64_t id) const;

  bool is_absent(uint64_t id) const noexcept {
    return state_[id].load(std::memory_order_acquire) == kAbsent;
  }
  // Size of the staged copy (valid while staged).
  uint64_t staged_size(uint64_t id) const noexcept {
    return sizes_[id].load(std::memory_order_relaxed);
  }

  // True if the caller now owns the copy of `id` (it was absent); then it must publish() or abandon().
  bool try_claim(uint64_t id) noexcept;
  // Writes `bytes` as the copy of a claimed file and marks it staged. Throws IoError (then the file
  // is absent again).
  void publish(uint64_t id, std::span<const std::byte> bytes);
  void abandon(uint64_t id) noexcept;
  // Removes a staged copy (eviction). The caller guarantees no reader still needs it.
  void evict(uint64_t id) noexcept;

 private:
  std::filesystem::path area_;
  uint64_t size_;
  std::unique_ptr<std::atomic<uint8_t>[]> state_;
  std::unique_ptr<std::atomic<uint64_t>[]> sizes_;
  std::atomic<uint64_t> tmp_counter_{0};
  uint64_t found_at_start_ = 0;
};

}  // namespace prestage::detail
