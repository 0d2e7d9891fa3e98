#include "pipeline/window.hpp"

#include <algorithm>

namespace prestage::detail {

uint64_t WindowHold::start(uint64_t lookahead) {
  std::lock_guard lock(mutex_);
  held_back_ = max_ - std::min(lookahead, max_);
  owed_ = 0;
  return held_back_;
}

bool WindowHold::hold_release() {
  std::lock_guard lock(mutex_);
  if (owed_ == 0) return false;
  --owed_;
  ++held_back_;
  return true;
}

uint64_t WindowHold::set(uint64_t lookahead) {
  std::lock_guard lock(mutex_);
  const uint64_t target = max_ - std::min(lookahead, max_);
  const uint64_t now = held_back_ + owed_;
  if (target >= now) {
    owed_ += target - now;
    return 0;
  }
  uint64_t release = now - target;
  const uint64_t cancelled = std::min(release, owed_);
  owed_ -= cancelled;
  release -= cancelled;
  held_back_ -= release;
  return release;
}

}  // namespace prestage::detail
