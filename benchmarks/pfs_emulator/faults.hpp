// Faults: read errors (EIO) and stalls injected into the emulated parallel file system, independent
// of FUSE.
//
// A fault is a rule, one line of text:
//
//   eio-open GLOB         opening a matching file fails with EIO
//   eio-read GLOB         every read request of a matching file fails with EIO (its open succeeds)
//   stall-open GLOB [MS]  opening a matching file blocks for MS milliseconds first
//   stall-read GLOB [MS]  every read request of a matching file blocks for MS milliseconds first
//   clear [GLOB]          removes every rule (or every rule whose glob is exactly GLOB); operations
//                         stalled by a removed rule go on at once
//
// A stall without MS (or with 0) lasts until its rule is cleared or the file system unmounts.
//
// GLOB is a shell pattern (fnmatch(3) without FNM_PATHNAME: `*` also matches `/`) matched against
// the path relative to the served directory, e.g. `class_0/img_003.jpg` or `*_003.jpg`; it may not
// contain white space. A stalled operation that is also an EIO fails once its stall ends. Rules can
// be given at start-up and changed at any time, so a test can make a file fail after it was listed
// or staged.
//
// Thread-safety: every member function may be called from any number of threads at once.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "throttle.hpp"

namespace prestage::pfs {

struct FaultCounters {
  uint64_t eio_open = 0;     // opens failed with EIO
  uint64_t eio_read = 0;     // read requests failed with EIO
  uint64_t stall_open = 0;   // opens stalled
  uint64_t stall_read = 0;   // read requests stalled
  uint64_t stalled_now = 0;  // operations stalled at this moment
};

class Faults {
 public:
  // `stopping` is polled while an operation is stalled: once it returns true (the file system is
  // unmounting) every stall ends with EIO, so that unmounting never waits for a stall.
  explicit Faults(std::function<bool()> stopping);
  Faults(const Faults&) = delete;
  Faults& operator=(const Faults&) = delete;

  // Applies the rules and commands of `text`, one per line (empty lines and lines starting with `#`
  // are skipped), all or none: returns false and says why in `error` if a line is not understood.
  bool apply(std::string_view text, std::string* error);

  // Called by an open (Op::kOpen) or a read request (Op::kRead) of `relative_path` before it is
  // served: stalls while a matching stall rule says so, then returns -EIO if a matching EIO rule
  // exists, else 0. Returns -EIO at once if the file system is unmounting.
  int before(Op op, const char* relative_path);

  // The rules in force, one per line, in the syntax above.
  std::string rules_text() const;
  FaultCounters counters() const;

 private:
  struct Rule {
    uint64_t id;
    bool eio;  // else a stall
    Op op;
    std::string glob;
    std::chrono::milliseconds stall{0};  // 0: until cleared or unmounted
  };

  void stall(const Rule& rule, std::unique_lock<std::mutex>& lock);
  bool present(uint64_t id) const;  // needs mutex_

  const std::function<bool()> stopping_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Rule> rules_;
  uint64_t next_id_ = 1;
  std::atomic<size_t> rule_count_{0};  // read without the lock: no rule, no cost

  std::atomic<uint64_t> eio_open_{0}, eio_read_{0}, stall_open_{0}, stall_read_{0}, stalled_now_{0};
};

}  // namespace prestage::pfs
