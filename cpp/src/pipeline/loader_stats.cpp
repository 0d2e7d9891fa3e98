// Loader::stats(): the figures of every part, gathered under the loader's state lock.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>

#include "pipeline/loader_impl.hpp"

namespace prestage {

Stats Loader::Impl::stats() const {
  Stats s;
  const auto lock = lock_state();
  if (!shared) return s;
  const auto now = Clock::now();
  if (owner.load(std::memory_order_relaxed) != 0) {
    s.wall_s = std::chrono::duration<double>(now - started).count();
  }
  s.batches = batches;
  s.samples = samples;
  // A wait under way counts as it goes.
  const uint64_t waiting_ns =
      waiting_since
          ? std::chrono::duration_cast<std::chrono::nanoseconds>(now - *waiting_since).count()
          : 0;
  s.consumer_stall_s = static_cast<double>(stall_ns + waiting_ns) * 1e-9;
  s.plan.busy_s = shared->plan_ns.load() * 1e-9;
  s.plan.idle_s = std::max(0.0, s.wall_s - s.plan.busy_s);
  if (shared->stager) shared->stager->add_to(s);
  const detail::BatchDecoder& decoder = *shared->decoder;
  s.decode.busy_s = decoder.busy_ns() * 1e-9;
  s.decode.idle_s =
      std::max(0.0, s.wall_s * static_cast<double>(shared->options.readers) - s.decode.busy_s);
  s.decode.items = decoder.decoded();
  s.decode.bytes = decoder.bytes_read();
  s.gpu_decode = decoder.gpu_stats();
  // Stage 3's reads by tier: bytes read ahead by stage 2 came from the source too.
  const detail::TierCounts served = shared->tiers->served();
  const auto tier = [](detail::Tier t) { return static_cast<size_t>(t); };
  s.hits = served.reads[tier(detail::Tier::kStage)];
  s.misses_read_ahead = served.reads[tier(detail::Tier::kMemory)];
  s.misses = s.misses_read_ahead + served.reads[tier(detail::Tier::kPeer)] +
             served.reads[tier(detail::Tier::kSource)];
  // Stage 3's copies of the misses it read are copies made in this run as stage 2's are.
  s.misses_staged = shared->tiers->misses_staged();
  s.staged_files += s.misses_staged;
  s.missed_bytes = served.bytes[tier(detail::Tier::kMemory)] +
                   served.bytes[tier(detail::Tier::kPeer)] +
                   served.bytes[tier(detail::Tier::kSource)];
  s.bytes_from_stage = served.bytes[tier(detail::Tier::kStage)];
  if (!stage_dir_error.empty()) {
    s.stage_dir_disabled = true;
    s.stage_dir_error = stage_dir_error;
  }
  s.skipped = skipped;
  s.skipped_samples = skipped_samples;
  s.threads_why = sizing.why;
  s.usable_cpus = sizing.usable_cpus;
  s.local_ranks = sizing.local_ranks;
  if (shared->patience) {
    s.stage_patience_s = std::chrono::duration<double>(*shared->patience).count();
  }
  s.tuning.on = tuner.has_value();
  s.tuning.memory_budget = sizing.memory_budget;
  s.memory.batch_buffers = ring ? ring->held_bytes() : 0;
  s.memory.read_ahead = shared->read_ahead_held.load(std::memory_order_relaxed);
  s.memory.decode_scratch = shared->scratch_held.load(std::memory_order_relaxed);
  s.tuning.readers = tuner ? tuner->knob(detail::KnobId::kDecode).value : shared->options.readers;
  s.tuning.reads_in_flight = shared->stager ? shared->stager->threads() : 0;
  s.tuning.lookahead = shared->lookahead.load(std::memory_order_relaxed);
  if (tuner) {
    s.tuning.steps_kept = tuner->steps_kept();
    s.tuning.steps_undone = tuner->steps_undone();
    s.tuning.settled_s = tuner->settled_at_s();
  }
  s.tuning.log.assign(tuning_log.begin(), tuning_log.end());
  detail::PinnedBuffer::Status pinning = ring->status();  // both read together
  s.pinned = pinning.pinning;
  s.pinned_why = std::move(pinning.why);
  if (shared->stage_dir) s.stage_corrupt = shared->stage_dir->corrupt();
  if (shared->peers) {
    shared->peers->add_to(s, shared->tiers->ledger());
    if (const detail::SourceModel* model = shared->tiers->source_model(); model != nullptr) {
      s.peer_reads_to_pfs = model->moved_to_pfs();
      for (const detail::SourceModel::Row& r : model->rows()) {
        s.sources.push_back({r.name, r.reads, r.bytes, r.samples, r.latency_s * 1e3,
                             std::isinf(r.bytes_per_s) ? 0.0 : r.bytes_per_s / 1e6, r.down,
                             r.probes});
      }
    }
  } else {
    s.peer_tier_why = "not asked for (peers=False)";
  }
  if (shared->cache) {
    s.peer_home_first = shared->cache->home_first_now();
    s.cache_bytes = shared->cache->capacity();
    s.stage_bytes = shared->cache->used_bytes();
    s.stage_bytes_peak = shared->cache->peak_bytes();
  }
  {
    std::lock_guard lock(shared->epochs_mutex);
    for (const auto& [e, costs] : shared->epochs) {
      s.epochs.push_back(costs);
      s.source_reads += costs.source_reads;
      s.source_bytes += costs.bytes_from_source;
    }
    s.already_staged = shared->already_staged;
  }
  return s;
}

}  // namespace prestage
