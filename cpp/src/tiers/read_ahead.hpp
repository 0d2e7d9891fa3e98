// The bytes stage 2 reads ahead into memory for one batch: the samples the stage directory
// declined, chosen by stage 1 within a byte budget, read by stage 2 through Tiers::open (Prefetch),
// handed to stage 3 by batch position (the memory tier, tiers/memory_tier.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace prestage::detail {

// Owned by a batch's work item and recycled with it. The items' bytes lie back to back in one
// buffer laid out by stage 1 from the sizes the catalog records (a sample of unknown size is never
// read ahead), so that the memory a work item keeps is a quarter more than the largest batch's
// read-ahead, within the budget, whatever the number of batches it carries; once warm nothing is
// allocated per batch. Stage 1 plans it (plan(), add(), lay_out()), then stage 2's threads each
// read distinct items (fill(), read()), then stage 3 reads it (at()) once stage 2 is done with the
// batch, which orders the writes before the reads: no lock is needed.
class ReadAhead {
 public:
  // A batch of `count` samples, none of them to read ahead yet.
  void plan(size_t count) {
    ids_.clear();
    offsets_.assign(1, 0);
    read_.clear();
    item_of_.assign(count, kNone);
  }
  // The sample at batch position `position` (catalog sample `id`, `bytes` long) is to be read
  // ahead.
  void add(size_t position, uint64_t id, uint64_t bytes) {
    item_of_[position] = static_cast<uint32_t>(ids_.size());
    ids_.push_back(id);
    offsets_.push_back(offsets_.back() + bytes);
    read_.push_back(0);
  }
  // After the batch's last add(): makes room for its items. A buffer too small is replaced by one
  // a quarter larger than needed, and at least `grow_to` (the largest the other work items' have
  // grown to), so that a pipeline's buffers grow a few times in its first batches, not once more
  // every few epochs as batches of other sizes come. Returns the capacity.
  size_t lay_out(size_t grow_to) {
    const size_t need = static_cast<size_t>(offsets_.back());
    if (buffer_.size() < need)
      std::vector<std::byte>(std::max(need + need / 4, grow_to)).swap(buffer_);
    return buffer_.size();
  }

  // Stage 2: items to read, each one's sample, the place its bytes go (exactly its size), and that
  // it was read (a read that failed leaves it unread: stage 3 reads the sample itself and reports
  // the error).
  size_t size() const noexcept { return ids_.size(); }
  uint64_t id(size_t item) const { return ids_[item]; }
  std::span<std::byte> fill(size_t item) {
    return std::span<std::byte>(buffer_).subspan(offsets_[item],
                                                 offsets_[item + 1] - offsets_[item]);
  }
  void read(size_t item) { read_[item] = 1; }
  // Every item unread (the task is submitted again: nothing is held from a former try).
  void unread() { read_.assign(ids_.size(), 0); }

  // Stage 3: the bytes read ahead for the sample at batch position `position`, or none (not
  // planned, or its read failed).
  std::optional<std::span<const std::byte>> at(size_t position) const {
    if (position >= item_of_.size()) return std::nullopt;
    const uint32_t item = item_of_[position];
    if (item == kNone || read_[item] == 0) return std::nullopt;
    return std::span<const std::byte>(buffer_).subspan(offsets_[item],
                                                       offsets_[item + 1] - offsets_[item]);
  }

  // The bytes this work item keeps for its read-ahead (stats()'s memory figures).
  size_t capacity() const noexcept { return buffer_.size(); }

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  std::vector<uint64_t> ids_;      // per item: its catalog sample
  std::vector<uint64_t> offsets_;  // per item, and one past the last: where its bytes lie
  std::vector<uint32_t> item_of_;  // per batch position: its item, or kNone
  std::vector<std::byte> buffer_;  // every item's bytes (its capacity kept across batches)
  std::vector<uint8_t> read_;      // per item: 1 once stage 2 has read it
};

}  // namespace prestage::detail
