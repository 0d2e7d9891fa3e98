// The memory tier: the bytes stage 2 read ahead for a sample of the batch being decoded
// (tiers/read_ahead.hpp), handed to the read as DecodeRead::held. Nearest of all, so first in the
// chain for a decode; it serves nothing else.
#pragma once

#include <optional>

#include "tiers/tier.hpp"

namespace prestage::detail {

class MemoryTier final : public TierReader {
 public:
  using TierReader::serve;
  std::optional<Served> serve(Want& want, const DecodeRead& read) override {
    if (!read.held) return std::nullopt;
    return use_bytes(Tier::kMemory, MemorySource(*read.held, want.path), read);
  }
};

}  // namespace prestage::detail
