#include "tiers/node_table.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "prestage/error.hpp"

namespace prestage::detail {

namespace {
// "NODTABE2": the words hold claimants since version 2. A process of another version sharing the
// directory finds a table it cannot use (IoError), never one it misreads.
constexpr uint64_t kMagic = 0x3245424154444f4eull;
constexpr size_t kHeaderBytes = 4096;

[[noreturn]] void fail(const std::string& path, int err, const std::string& action) {
  throw IoError(path, err, "cannot " + action + " '" + path + "': " + std::strerror(err));
}
}  // namespace

struct NodeTable::Header {
  uint64_t magic;
  uint64_t files;
  std::atomic<uint64_t> used;
  std::atomic<uint64_t> ranks[kMaxRanks];  // rank + 1, or 0 for a free place
  std::atomic<uint64_t> index_counted;     // the index's bytes on disk, as counted in `used`
};
static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "the table is shared between processes: its atomics must not hide a lock");

NodeTable::NodeTable(int dir, const char* file, const std::string& shown, uint64_t files,
                     bool reset, const StageAccess& access) {
  static_assert(sizeof(Header) <= kHeaderBytes, "the header fits its page");
  const std::string& name = shown;
  if (files > (SIZE_MAX - kHeaderBytes) / sizeof(uint32_t)) fail(name, EFBIG, "size");
  bytes_ = kHeaderBytes + files * sizeof(uint32_t);
  // Shared by the ranks of the job, made by whichever comes first: not O_EXCL, and never a link.
  const int fd = open_in(dir, file, O_RDWR | O_CREAT, shown, access);
  if (fd < 0) fail(name, errno, "open");
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  if (reset) {
    // Made anew, zeroed, with its blocks allocated now: a write to a mapped page that finds the
    // disk full would kill the process (SIGBUS) instead of failing here.
    if (::ftruncate(fd, 0) != 0) fail(name, errno, "truncate");
    const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes_));
    if (err != 0) fail(name, err, "allocate");
  } else {
    struct stat st;
    if (::fstat(fd, &st) != 0) fail(name, errno, "stat");
    if (static_cast<uint64_t>(st.st_size) != bytes_)
      fail(name, EINVAL, "use (a table of another size)");
  }
  map_ = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    fail(name, errno, "map");
  }
  header_ = static_cast<Header*>(map_);
  words_ = reinterpret_cast<std::atomic<uint32_t>*>(static_cast<char*>(map_) + kHeaderBytes);
  if (reset) {
    header_->files = files;
    header_->magic = kMagic;  // last: a table is whole once it has its magic
  } else if (header_->magic != kMagic || header_->files != files) {
    ::munmap(map_, bytes_);
    map_ = nullptr;
    fail(name, EINVAL, "use (not a table of this directory)");
  }
}

NodeTable::NodeTable(uint64_t files) {
  if (files > (SIZE_MAX - kHeaderBytes) / sizeof(uint32_t)) fail("node table", EFBIG, "size");
  bytes_ = kHeaderBytes + files * sizeof(uint32_t);
  map_ = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    fail("node table", errno, "map");
  }
  header_ = static_cast<Header*>(map_);
  words_ = reinterpret_cast<std::atomic<uint32_t>*>(static_cast<char*>(map_) + kHeaderBytes);
  header_->files = files;
  header_->magic = kMagic;
}

NodeTable::~NodeTable() {
  if (map_ != nullptr) ::munmap(map_, bytes_);
}

uint64_t NodeTable::used() const noexcept { return header_->used.load(std::memory_order_relaxed); }

void NodeTable::add(uint64_t bytes) noexcept {
  header_->used.fetch_add(bytes, std::memory_order_relaxed);
}

bool NodeTable::reserve(uint64_t bytes, uint64_t bound) noexcept {
  uint64_t used = header_->used.load(std::memory_order_relaxed);
  do {
    if (bytes > bound || used > bound - bytes) return false;
  } while (!header_->used.compare_exchange_weak(used, used + bytes, std::memory_order_acq_rel));
  return true;
}

bool NodeTable::claim(uint64_t id, uint64_t bytes, uint64_t bound) noexcept {
  uint32_t w = word(id).load(std::memory_order_acquire);
  while (true) {
    if ((w & (kOnDisk | kClaimants)) != 0) {             // counted already: shared
      if ((w & kClaimants) == kClaimants) return false;  // cannot be: a claim per process
      if (word(id).compare_exchange_weak(w, w + kClaimant, std::memory_order_acq_rel)) return true;
      continue;
    }
    // The first claimant: its bytes are counted before the claim is seen, so that the node's count
    // never misses a claimed copy; a neighbour that claims first meanwhile makes this one shared.
    if (!reserve(bytes, bound)) return false;
    if (word(id).compare_exchange_strong(w, w + kClaimant, std::memory_order_acq_rel)) return true;
    release(bytes);
  }
}

bool NodeTable::unclaim(uint64_t id) noexcept {
  uint32_t w = word(id).load(std::memory_order_acquire);
  while ((w & kClaimants) != 0) {
    if (word(id).compare_exchange_weak(w, w - kClaimant, std::memory_order_acq_rel)) {
      return (w & kClaimants) == kClaimant && (w & kOnDisk) == 0;
    }
  }
  return false;  // no claim to give up (the word is shared memory: never below zero)
}

void NodeTable::publish_claimed(uint64_t id) noexcept {
  uint32_t w = word(id).load(std::memory_order_acquire);
  while (true) {
    const uint32_t claims = (w & kClaimants) != 0 ? kClaimant : 0;
    if (word(id).compare_exchange_weak(w, (w | kOnDisk | kPublished) - claims,
                                       std::memory_order_acq_rel)) {
      return;
    }
  }
}

void NodeTable::release(uint64_t bytes) noexcept {
  // Never below zero: a table reset under a process that still runs (it cannot be: the reset needs
  // the directory alone) would otherwise wrap.
  uint64_t used = header_->used.load(std::memory_order_relaxed);
  while (!header_->used.compare_exchange_weak(used, used - std::min(used, bytes),
                                              std::memory_order_acq_rel)) {
  }
}

void NodeTable::count_index(uint64_t allocated) noexcept {
  uint64_t counted = header_->index_counted.load(std::memory_order_relaxed);
  while (allocated > counted) {
    if (header_->index_counted.compare_exchange_weak(counted, allocated,
                                                     std::memory_order_acq_rel)) {
      add(allocated - counted);
      return;
    }
  }
}

void NodeTable::let_go(uint64_t id) noexcept {
  uint32_t w = word(id).load(std::memory_order_relaxed);
  // Never below zero holders: a hold cannot be let go twice, but the word is shared memory.
  while ((w & kHolders) != 0 &&
         !word(id).compare_exchange_weak(w, w - 1, std::memory_order_acq_rel)) {
  }
}

bool NodeTable::join(uint64_t rank) noexcept {
  for (auto& place : header_->ranks) {
    uint64_t expected = 0;
    if (place.compare_exchange_strong(expected, rank + 1, std::memory_order_acq_rel)) return true;
  }
  return false;
}

void NodeTable::leave(uint64_t rank) noexcept {
  for (auto& place : header_->ranks) {
    uint64_t expected = rank + 1;
    if (place.compare_exchange_strong(expected, 0, std::memory_order_acq_rel)) return;
  }
}

std::vector<uint64_t> NodeTable::ranks() const {
  std::vector<uint64_t> out;
  for (const auto& place : header_->ranks) {
    const uint64_t r = place.load(std::memory_order_acquire);
    if (r != 0) out.push_back(r - 1);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace prestage::detail
