// Stage 1's decisions for one batch, in plan order so that the stage directory's contents follow
// the plan exactly: which files stage 2 copies, and which of the samples the directory declines it
// reads into memory instead (the read-ahead, laid out in one buffer per batch).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "staging/stage_cache.hpp"
#include "tiers/read_ahead.hpp"

namespace prestage::detail {

struct Shared;

// One batch's decisions; kept by its work item and reused (nothing is allocated per batch).
struct BatchAdmission {
  std::vector<uint64_t> files;   // the files stage 2 copies for the batch (claimed)
  std::vector<size_t> declined;  // positions of the samples the stage directory declined
  // Of those, the samples stage 2 reads into memory instead, up to kReadAheadBytesPerBatch
  // (machine.hpp) per batch (and none larger): their bytes live until the batch is decoded.
  ReadAhead read_ahead;
  uint64_t read_ahead_counted = 0;  // what it last added to Shared::read_ahead_held
};

// Serial: stage 1's node alone calls it.
class Admitter {
 public:
  explicit Admitter(Shared& shared) : shared_(shared) {}
  // Decides batch `index` of `epoch`, samples `ids[0, count)`, into `out`; adds its hits, misses
  // and evictions to `costs`.
  void admit(uint64_t epoch, uint64_t index, const uint64_t* ids, size_t count, BatchAdmission& out,
             Admission& costs);
  // The read-ahead buffers' bytes `out` holds, no longer counted in Shared::read_ahead_held.
  void forget(BatchAdmission& out);

 private:
  void plan_read_ahead(const uint64_t* ids, size_t count, BatchAdmission& out);

  Shared& shared_;
  size_t read_ahead_grown_ = 0;  // the largest read-ahead buffer of a batch (ReadAhead::lay_out)
};

}  // namespace prestage::detail
