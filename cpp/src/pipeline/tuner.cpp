#include "pipeline/tuner.hpp"

#include <algorithm>
#include <cstdio>

namespace prestage::detail {

namespace {

// A step is kept when the rate rose by at least this share of the step's relative size.
constexpr double kGainShare = 0.25;
// A stage whose threads are busy less than this share of the time is not the bottleneck.
constexpr double kBusy = 0.5;
// Stage 3's threads busy this share of the time: decoding holds the pipeline up, lookahead cannot
// help.
constexpr double kSaturated = 0.8;
// Rates (averaged over two windows) that move by more than this factor mean new conditions.
constexpr double kNewConditions = 1.33;

std::string rate_text(double batches_per_s) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f", batches_per_s);
  return text;
}

}  // namespace

const char* knob_name(KnobId knob) noexcept {
  switch (knob) {
    case KnobId::kDecode:
      return "readers";
    case KnobId::kReads:
      return "reads_in_flight";
    case KnobId::kLookahead:
      return "lookahead";
  }
  return "?";
}

Tuner::Tuner(std::array<Knob, kKnobs> knobs) : knobs_(knobs) { backoff_.fill(kFirstBackoff); }

std::optional<TuneChange> Tuner::observe(const TunerWindow& w) {
  ++windows_;
  elapsed_s_ += w.seconds;
  if (w.seconds <= 0) return std::nullopt;
  const double rate = static_cast<double>(w.batches) / w.seconds;
  if (trial_) {
    if (trial_->settle_windows > 0) {
      --trial_->settle_windows;  // this window mixed the old value and the new one
      return std::nullopt;
    }
    return judge(*trial_, rate);
  }
  recent_.push_back(rate);
  if (recent_.size() < 2) return std::nullopt;
  const double base = (recent_[recent_.size() - 1] + recent_[recent_.size() - 2]) / 2;
  if (settled_rate_ > 0 &&
      (base * kNewConditions < settled_rate_ || base > settled_rate_ * kNewConditions)) {
    // New conditions: every knob may be worth a step again.
    blocked_until_.fill(0);
    backoff_.fill(kFirstBackoff);
  }
  settled_rate_ = base;
  return step(w, base);
}

std::optional<TuneChange> Tuner::judge(Trial& trial, double rate) {
  const Trial t = trial;
  trial_.reset();
  recent_.clear();
  const double needed =
      1 + kGainShare * static_cast<double>(t.to - t.from) / static_cast<double>(t.from);
  if (rate >= t.base_rate * needed) {
    ++kept_;
    settled_at_s_ = elapsed_s_;
    settled_rate_ = rate;
    recent_.push_back(rate);
    backoff_[static_cast<size_t>(t.knob)] = kFirstBackoff;
    return std::nullopt;
  }
  ++undone_;
  at(t.knob).value = t.from;
  uint64_t& backoff = backoff_[static_cast<size_t>(t.knob)];
  blocked_until_[static_cast<size_t>(t.knob)] = windows_ + backoff;
  const uint64_t waited = backoff;
  backoff = std::min(backoff * 2, kMaxBackoff);
  return TuneChange{t.knob, t.to, t.from,
                    "undone: " + rate_text(rate) + " batches/s with " + std::to_string(t.to) +
                        " against " + rate_text(t.base_rate) + " with " + std::to_string(t.from) +
                        "; not tried again for " + std::to_string(waited) + " windows"};
}

std::optional<TuneChange> Tuner::step(const TunerWindow& w, double base) {
  const double wait = w.consumer_wait_s / w.seconds;
  if (wait < kWaitFloor) return std::nullopt;  // the pipeline keeps up: nothing to gain
  const Knob& decode = knob(KnobId::kDecode);
  const Knob& reads = knob(KnobId::kReads);
  const double decode_busy = w.decode_busy_s / (w.seconds * static_cast<double>(decode.value));
  const double stage_busy =
      reads.max == 0 ? 0 : w.stage_busy_s / (w.seconds * static_cast<double>(reads.value));
  const double idle_cpus = static_cast<double>(w.cpus) - w.cpu_s / w.seconds;

  // The busier stage is the bottleneck: only its knob can help. Stage 3 busy: more decode threads
  // if a core is idle. Stage 2 busy: more reads in flight. Neither (stage 2's threads wait for
  // work while the consumer waits): more batches for stage 2 to work on ahead.
  std::vector<KnobId> order;
  if (reads.max == 0 || decode_busy >= stage_busy) {
    if (decode_busy >= kBusy) order.push_back(KnobId::kDecode);
  } else if (stage_busy >= kBusy) {
    order.push_back(KnobId::kReads);
  }
  if (decode_busy < kSaturated && stage_busy < kBusy) order.push_back(KnobId::kLookahead);
  for (const KnobId id : order) {
    const Knob& k = knob(id);
    if (!k.tunable() || windows_ < blocked_until_[static_cast<size_t>(id)]) continue;
    if (id == KnobId::kDecode && idle_cpus < 0.5) continue;  // no core left to decode on
    const uint64_t to = std::min(
        k.max, id == KnobId::kDecode ? k.value + std::max<uint64_t>(1, k.value / 4) : k.value * 2);
    const uint64_t from = k.value;
    trial_ = Trial{id, from, to, base, 1};
    recent_.clear();
    at(id).value = to;
    char why[160];
    std::snprintf(why, sizeof(why),
                  "consumer waits %.0f%% of the time, %.1f batches/s; decode threads busy %.0f%%, "
                  "stage 2 threads %.0f%%, %.1f CPUs idle",
                  wait * 100, base, decode_busy * 100, stage_busy * 100, std::max(0.0, idle_cpus));
    return TuneChange{id, from, to, why};
  }
  return std::nullopt;
}

}  // namespace prestage::detail
