// Stage 2's view of the stage directory (node-local SSD): where each file's copy lives, an index
// that vouches for every copy, and an in-memory state per file. Ids here are the catalog's file ids
// (for a folder of images, one file per sample).
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "prestage/catalog.hpp"
#include "tiers/node_table.hpp"
#include "util/file_io.hpp"
#include "util/private_dir.hpp"

namespace prestage::detail {

// `path` (the catalog's root() / one of its paths, as Catalog::file_source_path gives) opened as
// the catalog's symlink policy says: Symlinks::kInside confines it to root(), kFollow does not.
// Every read of a catalog's source file (the tiers' and the stage directory's) goes through this;
// a stage directory's copies do not.
inline FileRef source_file(const Catalog& catalog, const std::string& path) {
  if (catalog.symlinks() == Catalog::Symlinks::kInside) {
    return FileRef(path, catalog.root().native());
  }
  return FileRef(path);
}

// Layout: <stage_dir>/prestage-<catalog fingerprint>/ holding index.log and 256 shard directories
// <id % 256, 2 hex digits>/<id, hex>. Names come from file ids alone, so no write can land outside
// the directory whatever the catalog's paths.
//
// A copy is written to "<name>.part" under an exclusive flock, renamed to its name, then vouched
// for by a record appended to index.log (its size, the source's modification time and a CRC-32C).
// So: a copy without a record (a process killed between the rename and the append) or with a size
// that differs is never used; a ".part" file whose lock nobody holds was left by a dead process;
// two processes sharing the directory (ranks on one node) never copy one file twice: the second
// finds the first's finished copy, or waits for the first's lock and then takes its copy. Copies
// found at start-up are checked against their records and against the catalog (size, modification
// time) at once, and their bytes against the CRC on the first use in this run (verify()).
//
// Each process reads index.log once at start-up and from then on only what other processes have
// appended since it last looked (the index is append-only while it is shared): taking over a
// neighbour's copy costs a few system calls, not a read of the whole index.
//
// Processes starting at once take turns on start.lock (see the constructor), so that exactly one of
// them finds itself alone and makes the node's table anew.
//
// The processes' shared state is in node.table beside the index (NodeTable): the bytes of the
// node's copies and copies under way against one bound, and per file whether its copy is on disk
// and who holds it. A process's own view (is_staged(), is_absent()) may lag behind it: a copy
// another process removed is found out when this one holds the file (hold()).
class StageDirectory {
 public:
  // kInFlight: claimed, its copy not begun (the claim can still be given back: abandon(), evict());
  // kCopying: stage() is copying it (its reservation stands until the copy is published or given
  // up).
  enum State : uint8_t { kAbsent = 0, kInFlight = 1, kStaged = 2, kCopying = 3 };

  // Creates the directories, reads the index and takes stock of the copies there. Throws IoError.
  // The area and everything in it are the job's user's (`access`: or also a group's), made with
  // modes that let no one else in whatever the umask (private_dir.hpp), and reached from here on
  // only through a descriptor of the area checked once: a file is opened relative to it, never
  // through a link (O_NOFOLLOW), renamed with renameat. An area another user made or can write,
  // or a link in it, is refused (UnsafePath, an IoError the loader does not fall back from).
  // `block`: what the node's count (NodeTable::used) charges a copy of n bytes: n rounded up to a
  // multiple of `block`. 1: its bytes (a bound given in bytes of copies). 0: the file system's
  // block (statvfs), as the disk charges it; then the directory's own files (index.log,
  // node.table) are counted too, so that a bound of free space is one of the disk's. Any other
  // value stands for the file system's block in tests, and counts the own files too.
  StageDirectory(const std::filesystem::path& dir, const Catalog& catalog, uint64_t block = 1,
                 const StageAccess& access = {});
  ~StageDirectory();
  StageDirectory(const StageDirectory&) = delete;
  StageDirectory& operator=(const StageDirectory&) = delete;

  // The layout's names, the one place they are made (prestage.staging finds copies by them too):
  // the area of `catalog`'s copies under the stage directory `dir`, and the copy of file `id` in an
  // area.
  static std::filesystem::path area_of(const std::filesystem::path& dir, const Catalog& catalog);
  static std::string copy_path(const std::filesystem::path& area, uint64_t id);

  const std::filesystem::path& path() const noexcept { return area_; }
  // What the node's count charges a copy of `bytes` bytes (see the constructor's `block`).
  uint64_t charge(uint64_t bytes) const noexcept {
    return block_ == 1 ? bytes : (bytes + block_ - 1) / block_ * block_;
  }
  uint64_t block() const noexcept { return block_; }
  // A directory this process cannot write (a read-only file system or its permissions): the copies
  // found there are checked and served, nothing is copied, removed or evicted, and the node's table
  // is this process's own.
  bool read_only() const noexcept { return read_only_; }
  // The bytes of the directory's own files on disk (index.log, node.table), in whole blocks.
  uint64_t own_files_bytes();
  uint64_t found_at_start() const noexcept { return found_at_start_; }

  bool is_staged(uint64_t id) const noexcept {
    return state_[id].load(std::memory_order_acquire) == kStaged;
  }
  bool is_absent(uint64_t id) const noexcept {
    return state_[id].load(std::memory_order_acquire) == kAbsent;
  }
  State state(uint64_t id) const noexcept {
    return static_cast<State>(state_[id].load(std::memory_order_acquire));
  }
  uint64_t staged_size(uint64_t id) const noexcept {
    return sizes_[id].load(std::memory_order_relaxed);
  }
  std::string staged_path(uint64_t id) const;
  // The CRC-32C the index records for a staged copy's bytes (what a peer's reply carries).
  uint32_t staged_crc(uint64_t id) const noexcept {
    return crcs_[id].load(std::memory_order_relaxed);
  }
  // A copy from before this run whose bytes have not been checked against its CRC yet.
  bool unverified(uint64_t id) const noexcept {
    return unverified_[id].load(std::memory_order_acquire) != 0;
  }
  // A copy this process may serve: staged, and checked against its record if an earlier run left
  // it (stage 2 checks those: verify()).
  bool servable(uint64_t id) const noexcept { return is_staged(id) && !unverified(id); }

  // Takes over the copies that other processes sharing the directory have published since the last
  // look (the records appended to the index meanwhile): each absent file among them is staged from
  // now on, as if copied here. Stage 1 calls it before each batch, so that a file a neighbour
  // copied is a hit, with no claim and no system call of its own. Any thread.
  void take_over_published() noexcept;
  // True the first time it is called for a file taken over by take_over_published(): the use for
  // which the neighbour's copy saved a read of the source. (stage()'s takeovers are kAdopted.)
  bool first_use_of_taken_over(uint64_t id) noexcept {
    return taken_[id].load(std::memory_order_relaxed) != 0 &&
           taken_[id].exchange(0, std::memory_order_relaxed) != 0;
  }
  // Files taken over by take_over_published() so far.
  uint64_t taken_over() const noexcept { return taken_over_.load(std::memory_order_relaxed); }

  // True if the caller now owns the copy of `id` (it was absent); then it must stage() or
  // abandon().
  bool try_claim(uint64_t id) noexcept;
  // Gives back a claim whose copy has not begun (in flight -> absent) and its reservation; a file
  // in any other state, a staged copy or one being copied included, is left as it is.
  void abandon(uint64_t id) noexcept;
  // Removes a copy (eviction) unless another process holds or claims it (NodeTable::hold, claim)
  // or it is gone already; true if removed. A file absent in this process's view is left alone. A
  // claim whose copy has not begun is given back instead; a copy under way is not evicted (false):
  // its bytes are being written, and stay counted until it is published and can be evicted. The
  // caller guarantees that no thread of this process still needs the file.
  bool evict(uint64_t id) noexcept;

  // The node's shared state: its bound, the bytes used, the ranks sharing the directory.
  NodeTable& node() noexcept { return *table_; }
  // Reserves `bytes` of the node's `bound` for a copy of `id` that this process is about to claim;
  // false if they do not fit. The node counts a copy to come once: a file a neighbour has claimed
  // too (or published since this process last looked) shares its reservation
  // (NodeTable::claim). The copy keeps them once published; abandon() gives them back.
  bool reserve(uint64_t id, uint64_t bytes, uint64_t bound) noexcept;
  void unreserve(uint64_t id) noexcept;
  // This process holds `id` (it is in a batch planned and not yet decoded): no process removes its
  // copy meanwhile. A copy this process saw staged that another has removed since is forgotten
  // here: then false, and the file is absent, to be copied again. Give back with let_go().
  bool hold(uint64_t id) noexcept;
  void let_go(uint64_t id) noexcept { table_->let_go(id); }

  enum class Outcome {
    kStaged,   // copied from the source
    kAdopted,  // another process had copied it: nothing read from the source
    kBusy,  // another process was still copying it when the wait ran out: the claim is given back
    kChanged,  // the source no longer matches the catalog (size): not staged, claim given back
    kDropped,  // the claim was given back (evicted) before the copy began: nothing done
  };
  // Reads the file's bytes into `buffer` (resized to fit) and its source's modification time into
  // `mtime_ns`; throws on failure. Stage 2 passes the tiers below the stage directory.
  using Fetch = std::function<void(std::vector<std::byte>& buffer, int64_t& mtime_ns)>;
  // Appends bytes to the copy being written (an IoError of the stage directory if it cannot).
  using Sink = std::function<void(std::span<const std::byte> bytes)>;
  // Writes the file's bytes, in order and in pieces of any size, to `write`, using `buffer` as it
  // likes, and gives its source's modification time: a copy streamed this way (a file decompressed
  // as it is read) holds a bounded piece of the file in memory, not all of it. Throws on failure.
  using Stream =
      std::function<void(const Sink& write, std::vector<std::byte>& buffer, int64_t& mtime_ns)>;

  // How long stage() waits for another process's copy of a file it also needs; kForever: until
  // that copy is done or given up (a wait also ends when this thread's io_cancel() flag is set).
  // A process whose copy was waited for until the wait ran out has stalled (stopped, hung): the
  // copies it holds from then on are not waited for (kBusy at once), so that it costs this
  // process one wait, not one per file it holds. The holder of a copy's lock is found in
  // /proc/locks (Linux); where it cannot be, every wait runs its course.
  static constexpr std::chrono::milliseconds kForever = std::chrono::milliseconds::max();
  // No wait at all, not even for a copy another process is publishing (whose record it is
  // appending under the copy's lock: a moment, unless that process stalled there): kBusy at once,
  // and no process is marked stalled. For a caller that holds the bytes already and must not wait
  // on another process (stage 3's copies of the misses it read).
  static constexpr std::chrono::milliseconds kNoWait = std::chrono::milliseconds(-1);

  // Stages claimed file `id` (kDropped if the claim has been given back since), reading it with
  // `fetch` into `buffer` while it holds the file's lock (so that processes sharing the directory
  // read the source once). If another process is copying
  // the file, waits up to `wait` for its copy and takes it (kAdopted); copies it itself if that
  // process gave up. Throws SourceError when `fetch` fails (the claim is given back) and IoError
  // when the stage directory fails (full, read-only, vanished: the claim is given back).
  Outcome stage(uint64_t id, const Fetch& fetch, std::vector<std::byte>& buffer,
                std::chrono::milliseconds wait = std::chrono::milliseconds(0));
  // The same, the copy's bytes written as `stream` gives them (its size, CRC-32C and time are
  // checked against the catalog once they are all written; a copy that fails is removed).
  Outcome stage(uint64_t id, const Stream& stream, std::vector<std::byte>& buffer,
                std::chrono::milliseconds wait = std::chrono::milliseconds(0));
  // The same, reading the source file at `source_path`.
  Outcome stage(uint64_t id, const std::string& source_path, std::vector<std::byte>& buffer,
                std::chrono::milliseconds wait = std::chrono::milliseconds(0));

  // Bytes of index.log this process has read so far: each once, as the index grows.
  uint64_t index_bytes_read() {
    std::lock_guard lock(index_mutex_);
    return index_bytes_read_;
  }

  // Checks an unverified copy's bytes against its record; a copy that fails is evicted. False if
  // the copy is gone.
  bool verify(uint64_t id, std::vector<std::byte>& buffer);

  // The checks of every read from a staged copy (never a wrong byte), from any thread:
  //  - intact(): the bytes of a read of the whole copy against its record (size, CRC-32C): no
  //    extra I/O.
  //  - unchanged(): before a read of part of the copy (a sample of a shard, an array's header or
  //    data), the copy's identity (inode, size, modification and change times: any write to the
  //    file changes them) against the one it had when this process last read it whole and checked
  //    it; where it differs or is not known yet, its bytes are checked whole again (a read of the
  //    copy into `buffer`). File times tick coarsely, so an identity is kept only once its copy
  //    has not changed for settle_time(): a copy younger than that is checked whole at each read.
  // A copy that fails is removed (whoever holds it: the next use copies it again) and counted in
  // corrupt(); the caller reads the source instead.
  bool intact(uint64_t id, std::span<const std::byte> bytes) noexcept;
  bool unchanged(uint64_t id, std::vector<std::byte>& buffer);
  // Bytes `offset` to `offset + length` of copy `id` (kWholeCopy: all of it) into `out`, checked as
  // above: a copy left by an earlier run by verify() first, whose bytes are then used; a whole copy
  // by intact(); a part by unchanged() (and from the bytes it read, when it read the copy whole).
  // False when the copy is not staged, the range lies beyond it, or the copy vanished or failed its
  // check (removed and counted). `scratch` holds a copy read whole to check a part of it. For a
  // reader that holds its bytes in memory (a home copy fetched by a peer or a neighbour rank);
  // stage 3 reads a copy through a FileSource with the same checks (tiers/stage_tier.hpp).
  static constexpr uint64_t kWholeCopy = UINT64_MAX;
  bool read_checked(uint64_t id, uint64_t offset, uint64_t length, std::vector<std::byte>& out,
                    std::vector<std::byte>& scratch);
  // unchanged()'s removal of a copy it read through a descriptor whose file was `read` (its fstat)
  // and found corrupt: removed and counted only while that file is still the copy on disk, looked
  // at under the copy's lock (as evict() takes it), so that no new copy is published meanwhile.
  // Samples of one shard read at once each find the old copy corrupt; one that gets there after
  // another has removed it and the copy was made anew leaves the new, whole copy alone.
  void reject_read(uint64_t id, const struct stat& read) noexcept;
  // Copies found corrupt by a read (intact(), unchanged(), verify()) and removed.
  uint64_t corrupt() const noexcept { return corrupt_.load(std::memory_order_relaxed); }

  // Longer than the coarsest file-time tick of the file systems a stage directory lives on (ext4
  // with small inodes: 1 s). Tests shorten it; set before the first read.
  static constexpr std::chrono::milliseconds kSettleTime{2000};
  void set_settle_time(std::chrono::nanoseconds t) noexcept { settle_ = t; }

  // The source side of stage() failed (reading the PFS), not the stage directory.
  struct SourceError {
    std::exception_ptr error;
  };

  struct Record;  // one entry of index.log

 private:
  // A copy another process finished, with its record (kAdopted). Its writer holds the copy's lock
  // until the record is appended: waited for, unless `wait` is false (then kBusy).
  enum class Found : uint8_t { kNone, kAdopted, kBusy };
  Found adopt(uint64_t id, bool wait);
  // Reads the copy of `id` whole into `buffer`; false if it cannot be opened or read.
  bool read_copy(uint64_t id, std::vector<std::byte>& buffer);
  // The process holding the lock on the open file `fd`, or 0 if none is found.
  static pid_t lock_holder(int fd);
  bool stalled(pid_t holder);
  void mark_stalled(pid_t holder);
  // stage()'s copy, once it holds the lock on `fd` (its ".part" file, which it closes).
  Outcome copy_locked(uint64_t id, int fd, const std::string& part_name,
                      const std::string& final_name, const Stream& stream,
                      std::vector<std::byte>& buffer, bool wait);
  // Reads the records appended to the index since the last call (whole ones: a record being
  // appended is read next time) and calls `found` with each valid one; once started, takes over the
  // absent files among them (see take_over_published()). Needs index_mutex_.
  void follow_index(const std::function<void(const Record&)>& found);
  void append_record(const Record& record);
  void count_index() noexcept;  // the index's growth, into the node's count (with count_own_files_)
  void forget(uint64_t id) noexcept;          // staged in this view -> absent (its copy is gone)
  void give_back_copy(uint64_t id) noexcept;  // stage()'s own claim (copying -> absent)
  void discard(uint64_t id) noexcept;  // a corrupt or vanished copy: removed, whoever holds it
  void reject(uint64_t id) noexcept;   // a corrupt copy: discarded and counted (once per copy)
  // `bytes` are those of the copy's record (its size and CRC-32C).
  bool matches(uint64_t id, std::span<const std::byte> bytes) const noexcept;
  // Unlinks the copy the table has just marked gone (`removed`), and gives its bytes back to the
  // node unless claimants keep them.
  void remove_copy(uint64_t id, NodeTable::Removed removed) noexcept;
  bool open_index(const std::string& index);
  void compact_index(const std::string& index, const std::vector<int64_t>& mtimes);

  // A file's copy relative to the area ("<shard>/<id>"), and the full path that messages name.
  std::string relative(uint64_t id) const;
  std::string shown(const std::string& relative) const { return (area_ / relative).string(); }
  // True if `fd` is still the file `relative` names in the area (not unlinked or replaced since).
  bool still_at(int fd, const std::string& relative) const;

  Catalog catalog_;
  std::filesystem::path area_;
  StageAccess access_;
  UniqueFd area_fd_;  // the area, opened and checked once: every name in it is resolved from here
  uint64_t size_;
  uint64_t block_;
  bool count_own_files_;
  bool read_only_ = false;
  int index_fd_ = -1;
  std::unique_ptr<std::atomic<uint8_t>[]> state_;
  std::unique_ptr<std::atomic<uint8_t>[]> unverified_;
  std::unique_ptr<std::atomic<uint64_t>[]> sizes_;
  std::unique_ptr<std::atomic<uint32_t>[]> crcs_;
  std::unique_ptr<std::atomic<uint8_t>[]> taken_;  // see first_use_of_taken_over()
  // Per file, while this process claims it in the node's table: kClaimedHere | the bytes its
  // claim counts (what a last claimant releases).
  std::unique_ptr<std::atomic<uint64_t>[]> reserved_;
  static constexpr uint64_t kClaimedHere = uint64_t{1} << 63;
  // Per file: the identity its copy had when this process last checked its bytes whole (0: none).
  std::unique_ptr<std::atomic<uint64_t>[]> checked_;
  std::atomic<uint64_t> corrupt_{0};
  std::chrono::nanoseconds settle_ = kSettleTime;
  std::unique_ptr<NodeTable> table_;
  std::mutex stalled_mutex_;
  std::vector<pid_t> stalled_;  // processes a wait for a copy ran out on (see kForever)
  std::atomic<uint64_t> taken_over_{0};
  uint64_t found_at_start_ = 0;
  bool started_ = false;  // the start-up is over: records read from now on are new publications

  // The index as far as this process has read it: each file's latest record's size (kNoRecord if
  // none) and CRC.
  static constexpr uint64_t kNoRecord = ~uint64_t{0};
  std::mutex index_mutex_;
  off_t index_read_ = 0;  // where the next read of the index starts
  uint64_t index_bytes_read_ = 0;
  std::vector<uint64_t> indexed_size_;
  std::vector<uint32_t> indexed_crc_;
  std::vector<std::byte> index_tail_;  // scratch for follow_index()
};

}  // namespace prestage::detail
