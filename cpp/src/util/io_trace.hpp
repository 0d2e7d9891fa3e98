// The optional I/O trace: one fixed-size record per read of a sample's or a file's bytes (which
// sample, which tier served it, which file, where, how many bytes, when it started and ended, on
// which thread), for the spatial and temporal access-pattern figures of `prestage trace` (as
// Darshan draws them for HPC jobs).
//
// Cheap enough to leave on: a read appends its record to one of kSlots buffers chosen by its thread
// (a lock nobody else holds in the common case), and a full buffer is written out with one write()
// of kBatch records. Records are in no particular order in the file; readers sort them by start.
//
// File layout (little-endian): the 8-byte magic "PSTGTRC1", a uint64 count of header bytes that
// follow (a JSON object: format, root, files), then Record after Record.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace prestage::detail {

enum class TraceKind : uint8_t {
  kRead = 0,       // stage 3 (or a first look at a sample): a sample's bytes, from any tier
  kCopy = 1,       // stage 2: a whole file from the source, to be staged
  kReadAhead = 2,  // stage 2: a sample's bytes from the source, into memory
  kTune = 3,  // no read: the self-tuning changed a value (sample: which, offset: from, size: to)
};
// The kinds of read by number (prestage.trace.KINDS); kTune follows them.
inline constexpr const char* kTraceKindNames[] = {"read", "copy", "read-ahead"};

struct TraceRecord {
  uint64_t sample;   // kNoSample for a whole-file copy
  uint64_t file;     // the catalog's file index
  uint64_t offset;   // first byte read in the file
  uint64_t size;     // bytes read
  int64_t start_ns;  // since the trace was opened (steady clock)
  int64_t end_ns;
  uint32_t thread;  // a small number per thread of the process, in order of its first record
  uint8_t tier;     // Tier (tiers/ledger.hpp), by number; kTierNames names them
  uint8_t kind;     // TraceKind
  uint16_t reserved;
};
static_assert(sizeof(TraceRecord) == 56);

class IoTrace {
 public:
  static constexpr uint64_t kNoSample = ~uint64_t{0};

  // Creates (truncates) `path`; IoError if it cannot. The header names the catalog's root and its
  // number of files (records name files by index).
  IoTrace(const std::string& path, const std::string& root, uint64_t files);
  ~IoTrace();  // writes what is buffered; errors are counted, not thrown
  IoTrace(const IoTrace&) = delete;
  IoTrace& operator=(const IoTrace&) = delete;

  int64_t now_ns() const noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                                origin_)
        .count();
  }
  void add(uint64_t sample, uint64_t file, uint64_t offset, uint64_t size, int64_t start_ns,
           uint8_t tier, TraceKind kind) noexcept;
  // A kTune record at the current time: `knob` (KnobId) changed from `from` to `to`.
  void add_tuning(uint8_t knob, uint64_t from, uint64_t to) noexcept {
    add(knob, 0, from, to, now_ns(), 0, TraceKind::kTune);
  }
  // Writes every buffered record (called at close; records may still be added afterwards).
  void flush() noexcept;

  uint64_t records() noexcept;             // added so far
  uint64_t write_errors() const noexcept;  // records lost to failed writes

 private:
  static constexpr size_t kSlots = 16;
  static constexpr size_t kBatch = 4096;
  struct alignas(64) Slot {
    std::mutex mutex;
    std::vector<TraceRecord> records;
    uint64_t added = 0;  // mutex: counted here, not in one atomic that every thread would share
  };
  void write(const std::vector<TraceRecord>& records) noexcept;

  std::chrono::steady_clock::time_point origin_;
  int fd_ = -1;
  std::array<Slot, kSlots> slots_;
  mutable std::mutex write_mutex_;
  uint64_t written_ = 0;  // write_mutex_
  uint64_t lost_ = 0;     // write_mutex_
};

}  // namespace prestage::detail
