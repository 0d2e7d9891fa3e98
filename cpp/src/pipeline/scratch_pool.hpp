// Stage 3's scratch between the steps of a batch's decode, one per batch being decoded: as many as
// the ring lends buffers for at once (a batch decodes into one), not one per batch in flight, since
// each keeps what its largest batch needed (a ragged batch's every sample).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "decode/batch_decoder.hpp"

namespace prestage::detail {

class ScratchPool {
  struct Scratch {
    std::unique_ptr<BatchScratch> bytes;
    uint64_t counted = 0;  // what it last added to `held`
  };

 public:
  // `held`: the bytes the pool's scratches hold, kept up to date (Stats::Memory::decode_scratch).
  explicit ScratchPool(std::atomic<uint64_t>& held) : held_(held) {}
  ~ScratchPool();  // takes its scratches' bytes out of `held`
  ScratchPool(const ScratchPool&) = delete;
  ScratchPool& operator=(const ScratchPool&) = delete;

  // A scratch for one batch, given back (and its bytes counted) however the decode ends.
  class Lent {
   public:
    Lent(ScratchPool& pool, Scratch scratch) : pool_(pool), scratch_(std::move(scratch)) {}
    ~Lent() { pool_.give_back(std::move(scratch_)); }
    Lent(const Lent&) = delete;
    Lent& operator=(const Lent&) = delete;
    BatchScratch& operator*() const { return *scratch_.bytes; }

   private:
    ScratchPool& pool_;
    Scratch scratch_;
  };
  Lent take();

 private:
  void give_back(Scratch scratch);

  std::atomic<uint64_t>& held_;
  std::mutex mutex_;
  std::vector<Scratch> free_;  // mutex_; every one once the graph is idle
};

}  // namespace prestage::detail
