// The memory tier: the bytes stage 2 read ahead for a sample of the batch being decoded
// (tiers/read_ahead.hpp), handed to the read as Want::held. Nearest of all, so first in the chain
// for a decode; it serves nothing else.
#pragma once

#include <optional>

#include "tiers/tier.hpp"

namespace prestage::detail {

class MemoryTier final : public TierReader {
 public:
  std::optional<Served> serve(const Want& want, Delivery& to) override {
    if (want.purpose != Purpose::kDecode || !want.held) return std::nullopt;
    return use_bytes(Tier::kMemory, MemorySource(*want.held, want.path), want, to);
  }
};

}  // namespace prestage::detail
