#include "tiers/stage_directory.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <system_error>
#include <thread>

#include "prestage/error.hpp"
#include "util/crc32c.hpp"
#include "util/file_io.hpp"

namespace prestage::detail {

namespace fs = std::filesystem;

namespace {

constexpr int kShards = 256;
constexpr uint32_t kRecordMagic = 0x58444950;  // "PIDX"
constexpr uint32_t kRecordVersion = 1;
constexpr off_t kCompactAbove = 64 << 10;  // index bytes under which compaction is not worth it

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

[[noreturn]] void fail(const std::string& path, int err, const std::string& action) {
  throw IoError(path, err, "cannot " + action + " '" + path + "': " + std::strerror(err));
}

// True if `fd` is still the file `name` in `dir`: a file unlinked or replaced since it was opened
// is not.
bool still_in(int fd, int dir, const char* name) {
  struct stat by_fd, by_name;
  return ::fstat(fd, &by_fd) == 0 && ::fstatat(dir, name, &by_name, AT_SYMLINK_NOFOLLOW) == 0 &&
         by_fd.st_dev == by_name.st_dev && by_fd.st_ino == by_name.st_ino;
}

// Removes file `name` of `dir` that nobody holds a lock on (so no live process is writing it),
// under the lock.
void remove_unlocked(int dir, const char* name, const std::string& shown,
                     const StageAccess& access) {
  const int fd = open_in(dir, name, O_RDONLY, shown, access);
  if (fd < 0) return;
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && still_in(fd, dir, name)) ::unlinkat(dir, name, 0);
  ::close(fd);  // releases the lock, if taken
}

}  // namespace

struct StageDirectory::Record {
  uint32_t magic = kRecordMagic;
  uint32_t version = kRecordVersion;
  uint64_t id = 0;
  uint64_t size = 0;
  int64_t source_mtime = 0;
  uint32_t crc = 0;         // of the copy's bytes
  uint32_t record_crc = 0;  // of the fields above
  uint32_t own_crc() const {
    return crc32c({reinterpret_cast<const std::byte*>(this), offsetof(Record, record_crc)});
  }
};
static_assert(sizeof(StageDirectory::Record) == 40, "index records are 40 bytes on disk");

namespace {
// Calls `found` with every valid record of `bytes`, in order, and returns the bytes consumed: all
// but a last partial record (one being appended, read whole next time). A torn record (a process
// killed mid-append) is skipped by looking for the next valid one byte by byte, so that the records
// appended after it still count; a record's own CRC makes a false match practically impossible.
template <typename Found>
size_t for_each_record(std::span<const std::byte> bytes, Found found) {
  using Record = StageDirectory::Record;
  size_t at = 0;
  while (at + sizeof(Record) <= bytes.size()) {
    Record r;
    std::memcpy(&r, bytes.data() + at, sizeof(Record));
    if (r.magic == kRecordMagic && r.version == kRecordVersion && r.record_crc == r.own_crc()) {
      found(r);
      at += sizeof(Record);
    } else {
      ++at;
    }
  }
  return at;
}
// What any write to a file changes: its inode, size, modification and change times (the change
// time cannot be set back by a user), mixed into one nonzero word.
uint64_t identity(const struct stat& st) noexcept {
  uint64_t h = 0x9e3779b97f4a7c15ULL;
  for (const uint64_t v :
       {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
        static_cast<uint64_t>(st.st_size), static_cast<uint64_t>(st.st_mtim.tv_sec),
        static_cast<uint64_t>(st.st_mtim.tv_nsec), static_cast<uint64_t>(st.st_ctim.tv_sec),
        static_cast<uint64_t>(st.st_ctim.tv_nsec)}) {
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 31;
  }
  return h != 0 ? h : 1;
}
}  // namespace

StageDirectory::StageDirectory(const fs::path& dir, const Catalog& catalog, uint64_t block,
                               const StageAccess& access)
    : catalog_(catalog),
      area_(area_of(dir, catalog)),
      access_(access),
      size_(catalog.num_files()),
      block_(std::max<uint64_t>(block, 1)),
      count_own_files_(block != 1),
      state_(new std::atomic<uint8_t>[size_]()),
      unverified_(new std::atomic<uint8_t>[size_]()),
      sizes_(new std::atomic<uint64_t>[size_]()),
      crcs_(new std::atomic<uint32_t>[size_]()),
      taken_(new std::atomic<uint8_t>[size_]()),
      reserved_(new std::atomic<uint64_t>[size_]()),
      checked_(new std::atomic<uint64_t>[size_]()),
      indexed_size_(size_, kNoRecord),
      indexed_crc_(size_, 0) {
  {
    // The parent may be shared (/tmp); the area in it is checked once, and every name in the area
    // is resolved from its descriptor from here on.
    const UniqueFd parent = open_parent_dir(dir.string(), access_);
    area_fd_ = open_private_dir(parent.get(), area_.filename().string(), area_.string(), access_);
  }
  if (block == 0) {
    struct statvfs fs;
    block_ = ::fstatvfs(area_fd_.get(), &fs) == 0 && fs.f_frsize > 0 ? fs.f_frsize : 4096;
  }

  // Start-ups take turns on start.lock, which a process holds from before it looks at the index's
  // lock until it holds the index shared: with flock, turning an exclusive lock into a shared one
  // lets go of it first, and a process starting in that gap would take itself for the directory's
  // only one and make the node's table anew under the first. A process that starts alone keeps it
  // for its whole start-up (checking copies, resetting the table, compacting the index); one that
  // joins others lets go of it as soon as it holds the index. Without it (a directory where no file
  // can be created), start-ups go on as they are.
  struct StartLock {
    int fd;
    void release() {
      if (fd >= 0) ::close(fd);  // releases the lock
      fd = -1;
    }
    ~StartLock() { release(); }
  } start{open_in(area_fd_.get(), "start.lock", O_RDWR | O_CREAT, shown("start.lock"), access_)};
  while (start.fd >= 0 && ::flock(start.fd, LOCK_EX) != 0) {
    if (errno != EINTR) start.release();
  }

  // A start-up that fails (a link or another user's folder found in the area, an I/O error) lets go
  // of the index and its lock: a later start-up of this process would otherwise wait on them.
  struct IndexGuard {
    int& fd;
    bool kept = false;
    ~IndexGuard() {
      if (!kept && fd >= 0) ::close(fd);
      if (!kept) fd = -1;
    }
  } index_guard{index_fd_};

  // The index: the last valid record of each file vouches for its copy.
  const std::string index = shown("index.log");
  const bool alone = open_index(index);
  if (!alone) start.release();
  std::vector<int64_t> mtimes(size_);  // of each file's latest record
  auto read_index = [&] {
    std::lock_guard lock(index_mutex_);
    follow_index([&](const Record& r) { mtimes[r.id] = r.source_mtime; });
  };
  read_index();
  auto vouched = [&](uint64_t id, const struct stat& st) {
    const uint64_t size = indexed_size_[id];
    return size != kNoRecord && size == static_cast<uint64_t>(st.st_size) &&
           (catalog.file_size(id) == Catalog::kUnknownSize || catalog.file_size(id) == size) &&
           (catalog.file_mtime(id) == Catalog::kUnknownMtime ||
            catalog.file_mtime(id) == mtimes[id]);
  };

  for (int shard = 0; shard < kShards; ++shard) {
    const std::string shard_name = hex(shard, 2);
    UniqueFd shard_fd;
    try {
      shard_fd = open_private_dir(area_fd_.get(), shard_name, shown(shard_name), access_);
    } catch (const UnsafePath&) {
      throw;
    } catch (const IoError&) {
      if (read_only_) continue;  // none there: no copies
      throw;
    }
    DIR* listing = ::fdopendir(::dup(shard_fd.get()));
    if (listing == nullptr) fail(shown(shard_name), errno, "list stage directory");
    struct Lister {
      DIR* dir;
      ~Lister() { ::closedir(dir); }
    } lister{listing};
    errno = 0;
    for (const dirent* entry; (entry = ::readdir(listing)) != nullptr; errno = 0) {
      const std::string name = entry->d_name;
      if (name == "." || name == "..") continue;
      const size_t dot = name.find('.');
      uint64_t id = 0;
      if (!parse_hex(std::string_view(name).substr(0, dot), id) || id >= size_ ||
          static_cast<int>(id % kShards) != shard) {
        continue;  // not ours
      }
      const std::string rel = shard_name + "/" + name;
      if (dot != std::string::npos) {
        // "<id>.part": a copy being written, or left by a process that died.
        if (name.substr(dot) == ".part" && !read_only_) {
          remove_unlocked(shard_fd.get(), name.c_str(), shown(rel), access_);
        }
        continue;
      }
      struct stat st;
      // Removed by another process meanwhile, or not a file: not a copy.
      if (::fstatat(shard_fd.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
      if (S_ISLNK(st.st_mode)) {
        throw UnsafePath(
            shown(rel), ELOOP,
            "refusing the stage directory: '" + shown(rel) +
                "' is a symbolic link where a copy belongs, never followed; remove it");
      }
      if (!S_ISREG(st.st_mode)) continue;
      bool ok = vouched(id, st);
      if (!ok) {
        // Another process may have published this copy after the index was read: its writer appends
        // the record before it lets go of the lock, so look again while holding the lock.
        const int fd = open_in(shard_fd.get(), name.c_str(), O_RDONLY, shown(rel), access_);
        if (fd < 0) continue;
        struct Closer {
          int fd;
          ~Closer() { ::close(fd); }
        } closer{fd};
        if (::flock(fd, LOCK_EX | LOCK_NB) != 0) continue;  // being written: not ours to judge
        read_index();
        ok = ::fstat(fd, &st) == 0 && vouched(id, st);
        // Partial, stale (its source changed) or never vouched for: never served.
        if (!ok && !read_only_ && still_in(fd, shard_fd.get(), name.c_str())) {
          ::unlinkat(shard_fd.get(), name.c_str(), 0);
        }
      }
      if (ok) {
        state_[id].store(kStaged, std::memory_order_relaxed);
        unverified_[id].store(1, std::memory_order_relaxed);
        sizes_[id].store(indexed_size_[id], std::memory_order_relaxed);
        crcs_[id].store(indexed_crc_[id], std::memory_order_relaxed);
        ++found_at_start_;
      }
    }
    if (errno != 0) fail(shown(shard_name), errno, "list stage directory");
  }
  table_ = read_only_ ? std::make_unique<NodeTable>(size_)
                      : std::make_unique<NodeTable>(area_fd_.get(), "node.table",
                                                    shown("node.table"), size_, alone, access_);
  if (read_only_) {
    // Nobody can have copied or be copying here: the copies found are on disk, for this process.
    for (uint64_t id = 0; id < size_; ++id) {
      if (state_[id].load(std::memory_order_relaxed) == kStaged) table_->published(id);
    }
    ::flock(index_fd_, LOCK_SH);  // as any process's, for as long as it uses the directory
  } else if (alone) {
    // The node's state starts from what is on disk: whoever held files before has gone.
    for (uint64_t id = 0; id < size_; ++id) {
      if (state_[id].load(std::memory_order_relaxed) != kStaged) continue;
      table_->published(id);
      table_->add(charge(sizes_[id].load(std::memory_order_relaxed)));
    }
    if (count_own_files_) table_->add(charge(table_->file_bytes()));
    ::unlinkat(area_fd_.get(), "index.log.compact", 0);  // left by a process that died compacting
    // Every copy staged, evicted and staged again left a record: rewrite the index with the live
    // ones once it is mostly dead, so that it stays as bounded as the copies.
    if (index_read_ > kCompactAbove &&
        static_cast<uint64_t>(index_read_) > 2 * sizeof(Record) * found_at_start_) {
      compact_index(index, mtimes);
    }
    count_index();                // as compacted
    ::flock(index_fd_, LOCK_SH);  // others may join now (once the start lock is let go)
    start.release();
  }
  index_guard.kept = true;
  std::lock_guard lock(index_mutex_);
  started_ = true;
}

void StageDirectory::take_over_published() noexcept {
  std::lock_guard lock(index_mutex_);
  try {
    follow_index([](const Record&) {});
  } catch (const IoError&) {
    // An index that cannot be read now: nothing is taken over here, and stage 2, which reads it
    // too, meets the error and handles it.
  }
}

void StageDirectory::follow_index(const std::function<void(const Record&)>& found) {
  struct stat st;
  if (::fstat(index_fd_, &st) != 0) fail((area_ / "index.log").string(), errno, "stat");
  if (st.st_size <= index_read_) return;  // nothing appended since
  index_tail_.resize(static_cast<size_t>(st.st_size - index_read_));
  size_t got = 0;
  while (got < index_tail_.size()) {
    const ssize_t n = ::pread(index_fd_, index_tail_.data() + got, index_tail_.size() - got,
                              index_read_ + static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail((area_ / "index.log").string(), errno, "read");
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  index_bytes_read_ += got;
  index_read_ += static_cast<off_t>(
      for_each_record(std::span<const std::byte>(index_tail_.data(), got), [&](const Record& r) {
        if (r.id >= size_) return;
        indexed_size_[r.id] = r.size;
        indexed_crc_[r.id] = r.crc;
        // A neighbour published this copy after this process started: it is whole (records are
        // appended after the rename) and of this run, so it is served as this process's own copies
        // are. A file this process has claimed meanwhile is left to stage(), which takes it over.
        if (started_ && state_[r.id].load(std::memory_order_acquire) == kAbsent) {
          sizes_[r.id].store(r.size, std::memory_order_relaxed);
          crcs_[r.id].store(r.crc, std::memory_order_relaxed);
          unverified_[r.id].store(0, std::memory_order_relaxed);
          uint8_t expected = kAbsent;
          if (state_[r.id].compare_exchange_strong(expected, kStaged, std::memory_order_acq_rel)) {
            taken_[r.id].store(1, std::memory_order_relaxed);
            taken_over_.fetch_add(1, std::memory_order_relaxed);
          }
        }
        found(r);
      }));
  if (index_tail_.capacity() > (1u << 20)) index_tail_ = {};  // the start-up's whole read
}

bool StageDirectory::open_index(const std::string& index) {
  // Each process holds a shared lock on the index for as long as it uses the directory; one that
  // finds nobody else there holds it exclusively until its start-up is done (and may compact).
  while (true) {
    index_fd_ = open_in(area_fd_.get(), "index.log", O_RDWR | O_CREAT | O_APPEND, index, access_);
    if (index_fd_ < 0 && (errno == EROFS || errno == EACCES || errno == EPERM)) {
      // A directory this process cannot write: its copies, if the index vouches for them, are
      // still served (read_only()).
      index_fd_ = open_in(area_fd_.get(), "index.log", O_RDONLY, index, access_);
      read_only_ = index_fd_ >= 0;
    }
    if (index_fd_ < 0) fail(index, errno, "open");
    bool alone = ::flock(index_fd_, LOCK_EX | LOCK_NB) == 0;
    if (!alone) {
      while (::flock(index_fd_, LOCK_SH) != 0) {
        if (errno != EINTR) fail(index, errno, "lock");
      }
    }
    if (still_at(index_fd_, "index.log")) return alone;
    ::close(index_fd_);  // replaced by another process's compaction meanwhile: open the new one
  }
}

void StageDirectory::compact_index(const std::string& index, const std::vector<int64_t>& mtimes) {
  std::vector<std::byte> live;
  live.reserve(found_at_start_ * sizeof(Record));
  for (uint64_t id = 0; id < size_; ++id) {
    if (state_[id].load(std::memory_order_relaxed) != kStaged) continue;
    Record r;
    r.id = id;
    r.size = indexed_size_[id];
    r.source_mtime = mtimes[id];
    r.crc = indexed_crc_[id];
    r.record_crc = r.own_crc();
    const auto* bytes = reinterpret_cast<const std::byte*>(&r);
    live.insert(live.end(), bytes, bytes + sizeof(Record));
  }
  {
    // Made anew (O_EXCL: the start-up removed any left by a dead process), then renamed over the
    // index; a full disk, say, leaves the old index serving.
    const int fd = open_in(area_fd_.get(), "index.log.compact", O_WRONLY | O_CREAT | O_EXCL,
                           index + ".compact", access_);
    if (fd < 0) return;
    size_t done = 0;
    while (done < live.size()) {
      const ssize_t n = ::write(fd, live.data() + done, live.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    const bool written = ::close(fd) == 0 && done == live.size();
    if (!written ||
        ::renameat(area_fd_.get(), "index.log.compact", area_fd_.get(), "index.log") != 0) {
      ::unlinkat(area_fd_.get(), "index.log.compact", 0);
      return;
    }
  }
  ::close(index_fd_);  // waiters on the old index wake, see it replaced and open the new one
  open_index(index);
  // Read afresh: a process that joined meanwhile may have appended to the new index already.
  std::lock_guard lock(index_mutex_);
  index_read_ = 0;
  follow_index([](const Record&) {});
}

StageDirectory::~StageDirectory() {
  if (index_fd_ >= 0) ::close(index_fd_);
}

fs::path StageDirectory::area_of(const fs::path& dir, const Catalog& catalog) {
  return dir / ("prestage-" + hex(catalog.fingerprint(), 16));
}

std::string StageDirectory::copy_path(const fs::path& area, uint64_t id) {
  return (area / hex(id % kShards, 2) / hex(id, 0)).string();
}

std::string StageDirectory::staged_path(uint64_t id) const { return copy_path(area_, id); }

std::string StageDirectory::relative(uint64_t id) const {
  return hex(id % kShards, 2) + "/" + hex(id, 0);
}

bool StageDirectory::still_at(int fd, const std::string& relative) const {
  return still_in(fd, area_fd_.get(), relative.c_str());
}

bool StageDirectory::try_claim(uint64_t id) noexcept {
  uint8_t expected = kAbsent;
  return state_[id].compare_exchange_strong(expected, kInFlight, std::memory_order_acq_rel);
}

void StageDirectory::abandon(uint64_t id) noexcept {
  // Only a claim is given back: stage 2's give-up paths pass every file of a task, which also holds
  // copies of an earlier run that were only to be checked; forgetting one would leave it on disk
  // uncounted against the bound, and read from the source again.
  uint8_t expected = kInFlight;
  if (state_[id].compare_exchange_strong(expected, kAbsent, std::memory_order_acq_rel))
    unreserve(id);
}

bool StageDirectory::reserve(uint64_t id, uint64_t bytes, uint64_t bound) noexcept {
  if ((reserved_[id].load(std::memory_order_relaxed) & kClaimedHere) != 0) return true;
  if (!table_->claim(id, bytes, bound)) return false;
  reserved_[id].store(bytes | kClaimedHere, std::memory_order_relaxed);
  return true;
}

void StageDirectory::unreserve(uint64_t id) noexcept {
  const uint64_t reserved = reserved_[id].exchange(0, std::memory_order_relaxed);
  if ((reserved & kClaimedHere) != 0 && table_->unclaim(id)) {
    table_->release(reserved & ~kClaimedHere);
  }
}

bool StageDirectory::hold(uint64_t id) noexcept {
  if (table_->hold(id)) return true;
  // Not on disk: on its way (claimed, here or by a neighbour), absent, or removed by a neighbour
  // since this process saw it staged.
  if (state_[id].load(std::memory_order_acquire) == kStaged) forget(id);
  return false;
}

void StageDirectory::give_back_copy(uint64_t id) noexcept {
  uint8_t expected = kCopying;
  if (state_[id].compare_exchange_strong(expected, kAbsent, std::memory_order_acq_rel)) {
    unreserve(id);
  }
}

void StageDirectory::forget(uint64_t id) noexcept {
  unverified_[id].store(0, std::memory_order_relaxed);
  taken_[id].store(0, std::memory_order_relaxed);
  uint8_t expected = kStaged;
  state_[id].compare_exchange_strong(expected, kAbsent, std::memory_order_acq_rel);
}

bool StageDirectory::evict(uint64_t id) noexcept {
  // A claim with no copy begun is given back. A copy under way is not: its room given to another
  // copy meanwhile would put both on disk, past the bound.
  uint8_t expected = kInFlight;
  if (state_[id].compare_exchange_strong(expected, kAbsent, std::memory_order_acq_rel)) {
    unreserve(id);
    return true;
  }
  // A file absent here is not this process's to remove (a neighbour's copy it has not taken over:
  // its size is not known here).
  if (expected == kCopying || expected == kAbsent || read_only_) return false;
  // Under the file's copy lock (its ".part" file's, as stage() takes it): a neighbour that finds
  // the copy gone from the table waits for the lock before it copies the file anew, so the unlink
  // below never removes that new copy. A file whose lock another process holds is not evicted now.
  // On a disk too full to create the lock file, the eviction goes on without it.
  const std::string part = relative(id) + ".part";
  int fd = -1;
  try {
    fd = open_in(area_fd_.get(), part.c_str(), O_WRONLY | O_CREAT, shown(part), access_);
  } catch (const IoError&) {
    return false;  // not a lock file (a link): nothing is removed through it
  }
  if (fd >= 0 && (::flock(fd, LOCK_EX | LOCK_NB) != 0 || !still_at(fd, part))) {
    ::close(fd);
    return false;
  }
  // Gone from the disk before it is marked absent here. A reader of this process that still finds
  // it staged meanwhile finds no file and reads the source (the tiers' fallback).
  const bool removed = table_->remove(id);
  if (removed) remove_copy(id, NodeTable::Removed::kRemoved);
  if (fd >= 0) {
    ::unlinkat(area_fd_.get(), part.c_str(), 0);
    ::close(fd);  // releases the lock
  }
  // Removed here, or by a neighbour already: absent. (A stale "unverified" mark would make stage 1
  // hand a later claim of this file to stage 2 as a copy to check.) Else a neighbour holds it.
  if (removed || !table_->on_disk(id)) forget(id);
  return removed;
}

void StageDirectory::discard(uint64_t id) noexcept {
  remove_copy(id, table_->remove_held(id));
  forget(id);
}

void StageDirectory::remove_copy(uint64_t id, NodeTable::Removed removed) noexcept {
  if (removed == NodeTable::Removed::kNot) return;
  ::unlinkat(area_fd_.get(), relative(id).c_str(), 0);
  if (removed == NodeTable::Removed::kRemoved) {
    table_->release(charge(sizes_[id].load(std::memory_order_relaxed)));
  }
}

void StageDirectory::count_index() noexcept {
  // Counted a record ahead: the block the next record may need is in the count before it is
  // written. Its growth is added past the bound if need be (a block at most); stage 1's next
  // admission evicts to bring the node back within it.
  struct stat st;
  if (count_own_files_ && ::fstat(index_fd_, &st) == 0) {
    table_->count_index(charge(static_cast<uint64_t>(st.st_size) + sizeof(Record)));
  }
}

uint64_t StageDirectory::own_files_bytes() {
  struct stat st;
  const uint64_t index = ::fstat(index_fd_, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  return charge(index) + charge(table_->file_bytes());
}

void StageDirectory::append_record(const Record& record) {
  // One write of 40 bytes with O_APPEND: whole, and never interleaved with another process's.
  const ssize_t n = ::write(index_fd_, &record, sizeof(record));
  if (n != static_cast<ssize_t>(sizeof(record))) {
    fail((area_ / "index.log").string(), n < 0 ? errno : ENOSPC, "append to");
  }
}

StageDirectory::Found StageDirectory::adopt(uint64_t id, bool wait) {
  struct stat st;
  const std::string name = relative(id);
  if (::fstatat(area_fd_.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return Found::kNone;
  // Another process's copy. Its writer publishes it, then appends its record, then lets go of its
  // lock: waiting for the lock means the record, if any, is there.
  const int fd = open_in(area_fd_.get(), name.c_str(), O_RDONLY, shown(name), access_);
  if (fd < 0) return Found::kNone;
  int locked = 0;
  while ((locked = ::flock(fd, LOCK_SH | (wait ? 0 : LOCK_NB))) != 0 && errno == EINTR) {
  }
  if (locked != 0 && errno == EWOULDBLOCK) {
    ::close(fd);
    return Found::kBusy;
  }
  const bool found_file = ::fstat(fd, &st) == 0;
  ::close(fd);
  if (!found_file) return Found::kNone;
  uint64_t size = kNoRecord;
  uint32_t crc = 0;
  {
    std::lock_guard lock(index_mutex_);
    follow_index([](const Record&) {});
    size = indexed_size_[id];
    crc = indexed_crc_[id];
  }
  if (size == kNoRecord || size != static_cast<uint64_t>(st.st_size)) return Found::kNone;
  // A copy the node no longer counts is being removed (evict() unlinks it under the copy lock,
  // which stage() takes next): not one to take over.
  if (!table_->on_disk(id)) return Found::kNone;
  sizes_[id].store(size, std::memory_order_relaxed);
  crcs_[id].store(crc, std::memory_order_relaxed);
  // Written in this run by a live neighbour (every copy that was there before it started was
  // checked or removed by its start-up), and published whole: served as this process's own are.
  // Left unverified, stage 3 would not serve it and would read the source instead.
  unverified_[id].store(0, std::memory_order_relaxed);
  state_[id].store(kStaged, std::memory_order_release);
  unreserve(id);  // the claim ends: the neighbour's copy counts the bytes
  return Found::kAdopted;
}

StageDirectory::Outcome StageDirectory::stage(uint64_t id, const std::string& source_path,
                                              std::vector<std::byte>& buffer,
                                              std::chrono::milliseconds wait) {
  return stage(
      id,
      [&](std::vector<std::byte>& out, int64_t& mtime_ns) {
        read_file(source_file(catalog_, source_path), out, &mtime_ns);
      },
      buffer, wait);
}

StageDirectory::Outcome StageDirectory::stage(uint64_t id, const Fetch& fetch,
                                              std::vector<std::byte>& buffer,
                                              std::chrono::milliseconds wait) {
  return stage(id, Stream([&](const Sink& write, std::vector<std::byte>& out, int64_t& mtime_ns) {
                 fetch(out, mtime_ns);
                 write(out);
               }),
               buffer, wait);
}

StageDirectory::Outcome StageDirectory::stage(uint64_t id, const Stream& fetch,
                                              std::vector<std::byte>& buffer,
                                              std::chrono::milliseconds wait) {
  using Clock = std::chrono::steady_clock;
  const std::string final_name = relative(id);
  const std::string part_name = final_name + ".part";
  const Clock::time_point deadline =
      wait == kForever ? Clock::time_point::max() : Clock::now() + wait;
  auto pause = std::chrono::microseconds(200);
  pid_t holder = 0;  // the process copying it (0: none found), looked up at the first wait
  bool looked = false;
  // From here on the claim is this call's: an eviction leaves it alone until it is published.
  uint8_t claimed = kInFlight;
  if (!state_[id].compare_exchange_strong(claimed, kCopying, std::memory_order_acq_rel)) {
    return Outcome::kDropped;
  }
  const bool no_wait = wait == kNoWait;
  while (true) {
    int fd = -1;
    try {
      switch (adopt(id, !no_wait)) {
        case Found::kAdopted:
          return Outcome::kAdopted;
        case Found::kBusy:
          give_back_copy(id);
          return Outcome::kBusy;
        case Found::kNone:
          break;
      }
      // The lock file that the ranks sharing the area take turns on: made by whichever comes
      // first (not O_EXCL), in an area no other user can write.
      fd =
          open_in(area_fd_.get(), part_name.c_str(), O_WRONLY | O_CREAT, shown(part_name), access_);
    } catch (...) {
      give_back_copy(id);
      throw;
    }
    if (fd < 0) {
      const int err = errno;
      give_back_copy(id);
      fail(shown(part_name), err, "create");
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && still_at(fd, part_name)) {
      return copy_locked(id, fd, part_name, final_name, fetch, buffer, !no_wait);  // closes fd
    }
    if (no_wait) {
      ::close(fd);
      give_back_copy(id);
      return Outcome::kBusy;
    }
    if (!looked) {
      holder = lock_holder(fd);
      looked = true;
    }
    ::close(fd);
    // Another process is writing it (or has just published or removed it): its copy serves this
    // process too, so wait for it rather than read the source a second time; if that process gives
    // up, the next turn copies the file here. Not for a process that has stalled before.
    const std::atomic<bool>* cancel = io_cancel();
    const auto now = Clock::now();
    if (holder != 0 && stalled(holder)) {
      give_back_copy(id);
      return Outcome::kBusy;
    }
    if (now >= deadline || (cancel != nullptr && cancel->load(std::memory_order_acquire))) {
      if (now >= deadline && holder != 0) mark_stalled(holder);
      give_back_copy(id);
      return Outcome::kBusy;
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, std::chrono::microseconds(5000));
  }
}

pid_t StageDirectory::lock_holder(int fd) {
  struct stat st{};
  if (::fstat(fd, &st) != 0) return 0;
  // Lines like "3: FLOCK  ADVISORY  WRITE 4242 08:01:1311 0 EOF" (device in hex, inode in decimal);
  // "->" lines are waiters.
  char device[64];
  std::snprintf(device, sizeof device, "%02x:%02x:%llu", major(st.st_dev), minor(st.st_dev),
                static_cast<unsigned long long>(st.st_ino));
  std::FILE* locks = std::fopen("/proc/locks", "re");
  if (locks == nullptr) return 0;
  pid_t found = 0;
  char line[256];
  while (found == 0 && std::fgets(line, sizeof line, locks) != nullptr) {
    char kind[16], mode[16], access[16], where[64];
    long pid = 0;
    if (std::strstr(line, "->") != nullptr) continue;
    if (std::sscanf(line, "%*[^:]: %15s %15s %15s %ld %63s", kind, mode, access, &pid, where) ==
            5 &&
        std::strcmp(kind, "FLOCK") == 0 && std::strcmp(where, device) == 0 && pid > 0) {
      found = static_cast<pid_t>(pid);
    }
  }
  std::fclose(locks);
  return found == ::getpid() ? 0 : found;  // this process's own threads never stall it
}

bool StageDirectory::stalled(pid_t holder) {
  std::lock_guard lock(stalled_mutex_);
  return std::find(stalled_.begin(), stalled_.end(), holder) != stalled_.end();
}

void StageDirectory::mark_stalled(pid_t holder) {
  std::lock_guard lock(stalled_mutex_);
  if (std::find(stalled_.begin(), stalled_.end(), holder) == stalled_.end())
    stalled_.push_back(holder);
}

StageDirectory::Outcome StageDirectory::copy_locked(uint64_t id, int fd,
                                                    const std::string& part_name,
                                                    const std::string& final_name,
                                                    const Stream& stream,
                                                    std::vector<std::byte>& buffer, bool wait) {
  const std::string part_path = shown(part_name);
  const std::string final_path = shown(final_name);
  const int area = area_fd_.get();
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }  // also releases the lock
  } closer{fd};
  auto give_up = [&] {
    ::unlinkat(area, part_name.c_str(), 0);
    give_back_copy(id);
  };
  // Finished by another process between our first look and the lock (or being published now).
  const Found found = adopt(id, wait);
  if (found != Found::kNone) {
    ::unlinkat(area, part_name.c_str(), 0);
    if (found == Found::kAdopted) return Outcome::kAdopted;
    give_back_copy(id);
    return Outcome::kBusy;
  }

  int64_t source_mtime = 0;
  Record record;
  record.id = id;
  // The bytes are written as they come; a failure to write them is the stage directory's
  // (`sink_failed` tells it from the source's).
  bool sink_failed = false;
  const Sink write = [&](std::span<const std::byte> bytes) {
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        sink_failed = true;
        fail(part_path, errno, "write");
      }
      done += static_cast<size_t>(n);
    }
    record.crc = crc32c(bytes, record.crc);
    record.size += bytes.size();
  };
  try {
    if (::ftruncate(fd, 0) != 0) {
      sink_failed = true;
      fail(part_path, errno, "truncate");
    }
    stream(write, buffer, source_mtime);
  } catch (...) {
    if (sink_failed) {
      ::unlinkat(area, part_name.c_str(), 0);
      give_back_copy(id);
      throw;  // the stage directory's IoError
    }
    give_up();
    throw SourceError{std::current_exception()};
  }
  const uint64_t expected_size = catalog_.file_size(id);
  const int64_t expected_mtime = catalog_.file_mtime(id);
  if ((expected_size != Catalog::kUnknownSize && expected_size != record.size) ||
      (expected_mtime != Catalog::kUnknownMtime && expected_mtime != source_mtime)) {
    give_up();
    return Outcome::kChanged;
  }
  record.source_mtime = source_mtime;
  record.record_crc = record.own_crc();
  try {
    if (::renameat(area, part_name.c_str(), area, final_name.c_str()) != 0) {
      fail(final_path, errno, "rename");
    }
    append_record(record);  // still holding the lock: a scan in another process leaves it alone
    count_index();          // its 40 bytes may have taken a new block
  } catch (...) {
    ::unlinkat(area, part_name.c_str(), 0);
    ::unlinkat(area, final_name.c_str(), 0);
    give_back_copy(id);
    throw;
  }
  // The copy takes the bytes reserved for its claim, made exact (with no claim, no bound: its
  // bytes are added); it is on disk for the node from now on.
  const uint64_t reserved = reserved_[id].exchange(0, std::memory_order_relaxed);
  const uint64_t charged = charge(record.size);
  const uint64_t counted = reserved & ~kClaimedHere;
  if (counted >= charged) {
    table_->release(counted - charged);
  } else {
    table_->add(charged - counted);
  }
  sizes_[id].store(record.size, std::memory_order_relaxed);
  crcs_[id].store(record.crc, std::memory_order_relaxed);
  unverified_[id].store(0, std::memory_order_relaxed);
  if ((reserved & kClaimedHere) != 0) {
    table_->publish_claimed(id);
  } else {
    table_->published(id);
  }
  state_[id].store(kStaged, std::memory_order_release);
  return Outcome::kStaged;
}

bool StageDirectory::read_copy(uint64_t id, std::vector<std::byte>& buffer) {
  const std::string name = relative(id);
  int fd = -1;
  try {
    fd = open_in(area_fd_.get(), name.c_str(), O_RDONLY, shown(name), access_);
  } catch (const IoError&) {
    return false;
  }
  if (fd < 0) return false;
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st{};
  if (::fstat(fd, &st) != 0) return false;
  buffer.resize(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < buffer.size()) {
    const ssize_t n =
        ::pread(fd, buffer.data() + done, buffer.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  buffer.resize(done);
  return true;
}

bool StageDirectory::verify(uint64_t id, std::vector<std::byte>& buffer) {
  if (!is_staged(id)) return false;
  if (!read_copy(id, buffer)) {
    discard(id);
    return false;
  }
  if (buffer.size() != staged_size(id) ||
      crc32c(buffer) != crcs_[id].load(std::memory_order_relaxed)) {
    reject(id);  // corrupted on the SSD: never served
    return false;
  }
  unverified_[id].store(0, std::memory_order_release);
  return true;
}

void StageDirectory::reject(uint64_t id) noexcept {
  checked_[id].store(0, std::memory_order_relaxed);
  // Counted once per copy: threads that read the same copy at once (samples of one shard) each
  // find it corrupt; the one that takes it off the disk counts it.
  const NodeTable::Removed removed = table_->remove_held(id);
  if (removed != NodeTable::Removed::kNot) corrupt_.fetch_add(1, std::memory_order_relaxed);
  remove_copy(id, removed);
  forget(id);
}

bool StageDirectory::matches(uint64_t id, std::span<const std::byte> bytes) const noexcept {
  return bytes.size() == staged_size(id) &&
         crc32c(bytes) == crcs_[id].load(std::memory_order_relaxed);
}

bool StageDirectory::intact(uint64_t id, std::span<const std::byte> bytes) noexcept {
  if (matches(id, bytes)) return true;
  reject(id);
  return false;
}

bool StageDirectory::read_checked(uint64_t id, uint64_t offset, uint64_t length,
                                  std::vector<std::byte>& out, std::vector<std::byte>& scratch) {
  if (!is_staged(id)) return false;
  const uint64_t size = staged_size(id);
  const bool whole = length == kWholeCopy;
  if (!whole && (offset > size || length > size - offset)) return false;
  // Where a read of the whole copy lands: `out` when the whole is wanted.
  std::vector<std::byte>& copy = whole ? out : scratch;
  copy.clear();
  if (unverified(id)) {
    // By stage 2's own check, which reads it whole and marks it checked for every reader.
    if (!verify(id, copy)) return false;
    if (whole) return true;
    if (copy.size() != size) return false;  // copied anew meanwhile
  } else if (whole) {
    try {
      read_file(FileRef(staged_path(id)), out);
    } catch (const IoError&) {
      return false;
    }
    return intact(id, out);
  } else {
    if (!unchanged(id, copy)) return false;
    if (copy.size() != size || size == 0) {
      // Its identity was known: the range alone is read.
      out.resize(length);
      try {
        read_range(FileRef(staged_path(id)), offset, out);
      } catch (const IoError&) {
        return false;
      }
      return true;
    }
  }
  const auto first = copy.begin() + static_cast<std::ptrdiff_t>(offset);
  out.assign(first, first + static_cast<std::ptrdiff_t>(length));
  return true;
}

void StageDirectory::reject_read(uint64_t id, const struct stat& read) noexcept {
  int fd = -1;
  if (!read_only_) {
    const std::string part = relative(id) + ".part";
    try {
      fd = open_in(area_fd_.get(), part.c_str(), O_WRONLY | O_CREAT, shown(part), access_);
    } catch (const IoError&) {
      return;  // not a lock file (a link): nothing is removed through it
    }
    // Held: a copy of the file is being made or published, so the one read is gone already.
    if (fd >= 0 && (::flock(fd, LOCK_EX | LOCK_NB) != 0 || !still_at(fd, part))) {
      ::close(fd);
      return;
    }
  }
  const std::string name = relative(id);
  struct stat now{};
  if (::fstatat(area_fd_.get(), name.c_str(), &now, AT_SYMLINK_NOFOLLOW) == 0 &&
      identity(now) == identity(read)) {
    reject(id);
  }
  if (fd >= 0) {
    ::unlinkat(area_fd_.get(), (name + ".part").c_str(), 0);
    ::close(fd);  // releases the lock
  }
}

bool StageDirectory::unchanged(uint64_t id, std::vector<std::byte>& buffer) {
  const std::string name = relative(id);
  struct stat before{};
  if (::fstatat(area_fd_.get(), name.c_str(), &before, AT_SYMLINK_NOFOLLOW) != 0) {
    return false;  // gone: the caller reads the source
  }
  const uint64_t seen = identity(before);
  if (checked_[id].load(std::memory_order_relaxed) == seen) return true;
  // Read through one descriptor, so that the bytes checked are those of the file whose identity
  // is kept.
  int fd = -1;
  try {
    fd = open_in(area_fd_.get(), name.c_str(), O_RDONLY, shown(name), access_);
  } catch (const IoError&) {
    return false;  // not a copy (a link): read the source
  }
  if (fd < 0) return false;
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st{};
  if (::fstat(fd, &st) != 0) return false;
  buffer.resize(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < buffer.size()) {
    const ssize_t n =
        ::pread(fd, buffer.data() + done, buffer.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  buffer.resize(done);
  if (!matches(id, buffer)) {
    reject_read(id, st);
    return false;
  }
  // File times tick coarsely (a kernel tick, or a second on some file systems): a write in the
  // tick of the last change leaves them as they are. The identity is trusted only once that tick
  // is surely over; until then each read checks the bytes whole.
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  const auto ns = [](const timespec& t) { return int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec; };
  const int64_t changed = std::max(ns(st.st_mtim), ns(st.st_ctim));
  const bool settled = ns(now) - changed >= settle_.count();
  checked_[id].store(settled ? identity(st) : 0, std::memory_order_relaxed);
  return true;
}

}  // namespace prestage::detail
