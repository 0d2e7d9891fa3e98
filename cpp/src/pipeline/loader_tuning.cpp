// The self-tuning's actuator: a window of measurements per Tuner::due(), the Tuner's change applied
// to the part it tunes (stage 3's concurrency, stage 2's threads, the pipeline's window), logged.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "pipeline/loader_impl.hpp"

namespace prestage {

using Clock = std::chrono::steady_clock;

void Loader::Impl::start_tuner(const std::array<bool, detail::kKnobs>& pinned) {
  const LoaderOptions& o = shared->options;
  // Stage 2 has threads wherever a stage directory was asked for (see restart()).
  const bool staged = !o.stage_dir.empty();
  const std::array<detail::Knob, detail::kKnobs> knobs{
      detail::Knob{o.readers, shared->readers_max, pinned[0]},
      detail::Knob{staged ? o.prefetchers : 0, staged ? sizing.limits.prefetchers : 0, pinned[1]},
      detail::Knob{o.lookahead, shared->lookahead_max, pinned[2]}};
  if (std::none_of(knobs.begin(), knobs.end(), [](const detail::Knob& k) { return k.tunable(); })) {
    return;
  }
  tuner.emplace(knobs);
}

Loader::Impl::TuneWindow Loader::Impl::tune_now() const {
  TuneWindow w;
  w.start = Clock::now();
  w.batches = batches;
  w.stall_ns = stall_ns;
  w.decode_ns = shared->decoder->busy_ns();
  w.stage_ns = shared->stager ? shared->stager->busy_ns() : 0;
  rusage usage{};
  if (::getrusage(RUSAGE_SELF, &usage) == 0) {
    w.cpu_s = static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
              static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
  }
  return w;
}

void Loader::Impl::tune() {
  if (!tuner) return;
  if (tune_from.start == Clock::time_point{}) {
    tune_from = tune_now();  // the first batch: the pipeline has filled
    return;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - tune_from.start).count();
  if (!tuner->due(seconds, batches - tune_from.batches)) return;
  const TuneWindow now = tune_now();
  detail::TunerWindow w;
  w.seconds = std::chrono::duration<double>(now.start - tune_from.start).count();
  w.batches = now.batches - tune_from.batches;
  w.consumer_wait_s = static_cast<double>(now.stall_ns - tune_from.stall_ns) * 1e-9;
  w.decode_busy_s = static_cast<double>(now.decode_ns - tune_from.decode_ns) * 1e-9;
  w.stage_busy_s = static_cast<double>(now.stage_ns - tune_from.stage_ns) * 1e-9;
  w.cpu_s = now.cpu_s - tune_from.cpu_s;
  w.cpus = sizing.usable_cpus;
  tune_from = now;
  const std::optional<detail::TuneChange> change = tuner->observe(w);
  if (!change) return;
  switch (change->knob) {
    case detail::KnobId::kDecode:
      shared->set_readers(change->to);
      // decode_device=cuda: the CPU's share of each batch follows, not a few batches later.
      shared->decoder->readers_changed(change->from, change->to);
      break;
    case detail::KnobId::kReads:
      if (shared->stager) shared->stager->set_threads(change->to);
      break;
    case detail::KnobId::kLookahead:
      shared->lookahead.store(change->to, std::memory_order_relaxed);
      if (pipeline) pipeline->set_lookahead(change->to);
      break;
  }
  if (shared->trace) {
    shared->trace->add_tuning(static_cast<uint8_t>(change->knob), change->from, change->to);
  }
  char at[32];
  std::snprintf(at, sizeof(at),
                "%.1f s: ", std::chrono::duration<double>(now.start - started).count());
  std::string line = at + std::string(detail::knob_name(change->knob)) + " " +
                     std::to_string(change->from) + " -> " + std::to_string(change->to) + " (" +
                     change->why + ")";
  tuning_log.push_back(line);
  if (tuning_log.size() > Stats::kMaxTuningListed) tuning_log.pop_front();
  if (tuning_unread.size() < Stats::kMaxTuningListed) tuning_unread.push_back(std::move(line));
}

}  // namespace prestage
