// The bytes stage 2 reads ahead into memory for one batch: the samples the stage directory
// declined, chosen by stage 1 within a byte budget, read by stage 2 through Tiers::fetch_sample,
// handed to stage 3 by batch position (Tiers::serve's memory tier).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace prestage::detail {

// Owned by a batch's work item and recycled with it: the buffers keep their capacity, so that once
// warm nothing is allocated per batch. Stage 1 plans it (plan(), add()), then stage 2's threads
// each read distinct items (fill(), read()), then stage 3 reads it (at()) once stage 2 is done with
// the batch, which orders the writes before the reads: no lock is needed.
class ReadAhead {
 public:
  // A batch of `count` samples, none of them to read ahead yet.
  void plan(size_t count) {
    ids_.clear();
    read_.clear();
    item_of_.assign(count, kNone);
  }
  // The sample at batch position `position` (catalog sample `id`) is to be read ahead.
  void add(size_t position, uint64_t id) {
    item_of_[position] = static_cast<uint32_t>(ids_.size());
    ids_.push_back(id);
    if (bytes_.size() < ids_.size()) bytes_.resize(ids_.size());
    read_.push_back(0);
  }

  // Stage 2: items to read, each one's sample, where its bytes go, and that it was read (a read
  // that failed leaves it unread: stage 3 reads the sample itself and reports the error).
  size_t size() const noexcept { return ids_.size(); }
  uint64_t id(size_t item) const { return ids_[item]; }
  std::vector<std::byte>& fill(size_t item) { return bytes_[item]; }
  void read(size_t item) { read_[item] = 1; }
  // Every item unread (the task is submitted again: nothing is held from a former try).
  void unread() { read_.assign(ids_.size(), 0); }

  // Stage 3: the bytes read ahead for the sample at batch position `position`, or null (not
  // planned, or its read failed).
  const std::vector<std::byte>* at(size_t position) const {
    if (position >= item_of_.size()) return nullptr;
    const uint32_t item = item_of_[position];
    return item != kNone && read_[item] != 0 ? &bytes_[item] : nullptr;
  }

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  std::vector<uint64_t> ids_;                   // per item: its catalog sample
  std::vector<uint32_t> item_of_;               // per batch position: its item, or kNone
  std::vector<std::vector<std::byte>> bytes_;   // per item (capacities kept across batches)
  std::vector<uint8_t> read_;                   // per item: 1 once stage 2 has read it
};

}  // namespace prestage::detail
