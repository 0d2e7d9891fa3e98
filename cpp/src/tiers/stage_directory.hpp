// Stage 2's view of the stage directory (node-local SSD): where each file's copy lives, an index that
// vouches for every copy, and an in-memory state per file. Ids here are the catalog's file ids (for
// a folder of images, one file per sample).
#pragma once

#include <atomic>
#include <exception>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "prestage/catalog.hpp"

namespace prestage::detail {

// Layout: <stage_dir>/prestage-<catalog fingerprint>/ holding index.log and 256 shard directories
// <id % 256, 2 hex digits>/<id, hex>. Names come from file ids alone, so no write can land outside
// the directory whatever the catalog's paths.
//
// A copy is written to "<name>.part" under an exclusive flock, renamed to its name, then vouched for
// by a record appended to index.log (its size, the source's modification time and a CRC-32C). So:
// a copy without a record (a process killed between the rename and the append) or with a size that
// differs is never used; a ".part" file whose lock nobody holds was left by a dead process; two
// processes sharing the directory (ranks on one node) never copy one file twice: the second finds
// the first's lock or its finished copy. Copies found at start-up are checked against their records
// and against the catalog (size, modification time) at once, and their bytes against the CRC on the
// first use in this run (verify()).
class StageDirectory {
 public:
  enum State : uint8_t { kAbsent = 0, kInFlight = 1, kStaged = 2 };

  // Creates the directories, reads the index and takes stock of the copies there. Throws IoError.
  StageDirectory(const std::filesystem::path& dir, const Catalog& catalog);
  ~StageDirectory();
  StageDirectory(const StageDirectory&) = delete;
  StageDirectory& operator=(const StageDirectory&) = delete;

  const std::filesystem::path& path() const noexcept { return area_; }
  uint64_t found_at_start() const noexcept { return found_at_start_; }

  bool is_staged(uint64_t id) const noexcept {
    return state_[id].load(std::memory_order_acquire) == kStaged;
  }
  bool is_absent(uint64_t id) const noexcept {
    return state_[id].load(std::memory_order_acquire) == kAbsent;
  }
  uint64_t staged_size(uint64_t id) const noexcept { return sizes_[id].load(std::memory_order_relaxed); }
  std::string staged_path(uint64_t id) const;
  // A copy from before this run whose bytes have not been checked against its CRC yet.
  bool unverified(uint64_t id) const noexcept {
    return unverified_[id].load(std::memory_order_acquire) != 0;
  }

  // True if the caller now owns the copy of `id` (it was absent); then it must stage() or abandon().
  bool try_claim(uint64_t id) noexcept;
  // Gives back a claim (in flight -> absent); a file in any other state, a staged copy included, is
  // left as it is.
  void abandon(uint64_t id) noexcept;
  // Removes a copy (eviction). The caller guarantees no reader still needs it.
  void evict(uint64_t id) noexcept;

  enum class Outcome {
    kStaged,   // copied from the source
    kAdopted,  // another process had copied it: nothing read from the source
    kBusy,     // another process is copying it right now: the claim is given back
    kChanged,  // the source no longer matches the catalog (size): not staged, claim given back
  };
  // Reads the file's bytes into `buffer` (resized to fit) and its source's modification time into
  // `mtime_ns`; throws on failure. Stage 2 passes the tiers below the stage directory.
  using Fetch = std::function<void(std::vector<std::byte>& buffer, int64_t& mtime_ns)>;

  // Stages claimed file `id`, reading it with `fetch` into `buffer` while it holds the file's lock
  // (so that processes sharing the directory read the source once). Throws SourceError when `fetch`
  // fails (the claim is given back) and IoError when the stage directory fails (full, read-only,
  // vanished: the claim is given back).
  Outcome stage(uint64_t id, const Fetch& fetch, std::vector<std::byte>& buffer);
  // The same, reading the source file at `source_path`.
  Outcome stage(uint64_t id, const std::string& source_path, std::vector<std::byte>& buffer);

  // Checks an unverified copy's bytes against its record; a copy that fails is evicted. False if the
  // copy is gone.
  bool verify(uint64_t id, std::vector<std::byte>& buffer);

  // The source side of stage() failed (reading the PFS), not the stage directory.
  struct SourceError {
    std::exception_ptr error;
  };

  struct Record;  // one entry of index.log

 private:
  bool adopt(uint64_t id);  // a copy another process finished, with its record
  void append_record(const Record& record);
  bool open_index(const std::string& index);
  void compact_index(const std::string& index, const std::vector<Record>& latest);

  Catalog catalog_;
  std::filesystem::path area_;
  uint64_t size_;
  int index_fd_ = -1;
  std::unique_ptr<std::atomic<uint8_t>[]> state_;
  std::unique_ptr<std::atomic<uint8_t>[]> unverified_;
  std::unique_ptr<std::atomic<uint64_t>[]> sizes_;
  std::unique_ptr<std::atomic<uint32_t>[]> crcs_;
  uint64_t found_at_start_ = 0;
};

}  // namespace prestage::detail
