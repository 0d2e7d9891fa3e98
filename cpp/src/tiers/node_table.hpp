// What the processes sharing one stage directory (the ranks of one node) keep together: the bytes
// that the node's copies take, per file whether its copy is on disk, how many processes have
// claimed a copy of it still to come, and how many hold it (have it in a batch they have planned
// and not yet decoded), and which ranks share the directory. It lives in a file of the directory,
// mapped into each process's memory; every field is a lock-free atomic word, so any thread of any
// process may use it at any time.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "util/private_dir.hpp"

namespace prestage::detail {

class NodeTable {
 public:
  // The most ranks that can share one directory (processes beyond them share it without their
  // plans counting in the node's eviction order).
  static constexpr size_t kMaxRanks = 64;

  // Maps file `name` of the checked directory `dir` (`shown`: its path, for messages) for `files`
  // files, opened as private_dir.hpp's open_in() does (never through a link, `access`'s mode).
  // `reset`: the caller is the directory's only process (it holds the index's lock alone): the
  // table is made anew, empty. Otherwise it must be one made for as many files. Throws IoError (a
  // full disk, a table of another layout; UnsafePath for a link).
  NodeTable(int dir, const char* name, const std::string& shown, uint64_t files, bool reset,
            const StageAccess& access);
  // A table of this process's alone, in memory, made anew (a directory it cannot write).
  explicit NodeTable(uint64_t files);
  ~NodeTable();
  NodeTable(const NodeTable&) = delete;
  NodeTable& operator=(const NodeTable&) = delete;

  // The bytes of the node's copies and of the copies under way. Each process holds them to the
  // bound it was given (processes sharing a directory are meant to be given the same one).
  uint64_t used() const noexcept;
  // Adds `bytes` to the bytes used if that keeps them within `bound`; false (nothing added) if not.
  bool reserve(uint64_t bytes, uint64_t bound) noexcept;
  void add(uint64_t bytes) noexcept;

  // Claims of a copy still to come. The node counts the bytes of file `id` once while its copy is
  // on disk or claimed by any of its processes, whichever of them copies it: two ranks that both
  // need a file that neither has copied yet (one reads ahead into the next epoch) reserve it once.
  // One more claimant of `id`: the first (no copy on disk, no other claimant) reserves `bytes` of
  // `bound`, and fails (nothing changed) if they do not fit; the others share them.
  bool claim(uint64_t id, uint64_t bytes, uint64_t bound) noexcept;
  // A claimant gives its claim up (or takes over a copy on disk): true if it was the last and no
  // copy is on disk; the caller then releases the bytes the claim reserved.
  bool unclaim(uint64_t id) noexcept;
  // A claimant has published the copy: on disk from now on, with the claim's bytes.
  void publish_claimed(uint64_t id) noexcept;
  bool claimed(uint64_t id) const noexcept {
    return (word(id).load(std::memory_order_acquire) & kClaimants) != 0;
  }
  uint32_t claimants(uint64_t id) const noexcept {
    return (word(id).load(std::memory_order_acquire) & kClaimants) / kClaimant;
  }
  void release(uint64_t bytes) noexcept;
  // The index file (index.log, append-only) takes `allocated` bytes on disk now: the bytes used
  // grow by what it has grown since it was last counted (the first call counts it whole). Any
  // process.
  void count_index(uint64_t allocated) noexcept;
  // The bytes of the table's own file.
  size_t file_bytes() const noexcept { return bytes_; }

  // File `id`'s copy is on disk now.
  void published(uint64_t id) noexcept {
    word(id).fetch_or(kOnDisk | kPublished, std::memory_order_acq_rel);
  }
  // A copy of `id` was on the node's disk at some time (it may be gone since).
  bool ever_published(uint64_t id) const noexcept {
    return (word(id).load(std::memory_order_acquire) & kPublished) != 0;
  }
  bool on_disk(uint64_t id) const noexcept {
    return (word(id).load(std::memory_order_acquire) & kOnDisk) != 0;
  }
  // One more holder of `id`: while held, its copy is not removed. True if the copy is on disk.
  bool hold(uint64_t id) noexcept {
    return (word(id).fetch_add(1, std::memory_order_acq_rel) & kOnDisk) != 0;
  }
  void let_go(uint64_t id) noexcept;
  // Marks the copy of `id` gone if it is on disk and nobody holds or claims it; true if this call
  // did (the caller then removes the file and releases its bytes). So two processes never both
  // remove it.
  bool remove(uint64_t id) noexcept {
    uint32_t w = word(id).load(std::memory_order_acquire);
    while ((w & ~kPublished) == kOnDisk) {
      if (word(id).compare_exchange_weak(w, w & ~kOnDisk, std::memory_order_acq_rel)) return true;
    }
    return false;
  }
  // Marks it gone whoever holds it (a copy found corrupt).
  enum class Removed : uint8_t {
    kNot,      // it was not on disk
    kRemoved,  // the caller removes the file and releases its bytes
    kClaimed,  // the caller removes the file; its bytes stay, the claimants' (see unclaim())
  };
  Removed remove_held(uint64_t id) noexcept {
    const uint32_t w = word(id).fetch_and(~kOnDisk, std::memory_order_acq_rel);
    if ((w & kOnDisk) == 0) return Removed::kNot;
    return (w & kClaimants) != 0 ? Removed::kClaimed : Removed::kRemoved;
  }

  // Rank `rank` shares the directory from now on (until leave()); false if kMaxRanks already do.
  bool join(uint64_t rank) noexcept;
  void leave(uint64_t rank) noexcept;
  std::vector<uint64_t> ranks() const;  // the ranks sharing it now, ascending, each once

 private:
  // A file's word: on disk (1 bit), ever published (1), claimants (10: each process claims a file
  // once at most), holders (20: a process holds a file once per batch of its window).
  static constexpr uint32_t kOnDisk = 0x80000000u;
  static constexpr uint32_t kPublished = 0x40000000u;  // sticky: see ever_published()
  static constexpr uint32_t kClaimant = 0x00100000u;
  static constexpr uint32_t kClaimants = 0x3ff00000u;
  static constexpr uint32_t kHolders = 0x000fffffu;
  struct Header;
  std::atomic<uint32_t>& word(uint64_t id) const noexcept { return words_[id]; }

  size_t bytes_ = 0;
  void* map_ = nullptr;
  Header* header_ = nullptr;
  std::atomic<uint32_t>* words_ = nullptr;
};

}  // namespace prestage::detail
