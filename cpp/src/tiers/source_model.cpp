#include "tiers/source_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace prestage::detail {

namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// The fitted line of a read's seconds against its bytes: {intercept (latency), slope
// (1/bandwidth)}.
struct Line {
  double latency, per_byte;
};

Line fit(const SourceEstimate& e) {
  if (e.samples == 0) return {kInfinity, kInfinity};
  if (e.mean_b <= 0) return {e.mean_s, 0};
  const double var = e.mean_bb - e.mean_b * e.mean_b;
  const double cov = e.mean_sb - e.mean_s * e.mean_b;
  // A slope only where the sizes vary (5% of their mean) and time grows with them.
  if (e.samples >= 2 && var > 0.0025 * e.mean_b * e.mean_b && cov > 0) {
    const double slope = cov / var;
    const double intercept = e.mean_s - slope * e.mean_b;
    if (intercept >= 0) return {intercept, slope};
  }
  return {0, e.mean_s / e.mean_b};
}

}  // namespace

double SourceEstimate::latency_s() const { return samples == 0 ? 0 : fit(*this).latency; }

double SourceEstimate::bytes_per_s() const {
  if (samples == 0) return 0;
  const double per_byte = fit(*this).per_byte;
  return per_byte > 0 ? 1 / per_byte : kInfinity;
}

double expected_finish_s(const SourceEstimate& e, uint64_t bytes) {
  const Line line = fit(e);
  if (line.latency == kInfinity) return kInfinity;
  return line.latency + static_cast<double>(e.queued_bytes + bytes) * line.per_byte;
}

size_t choose_source(std::span<const SourceEstimate> options, std::span<const uint64_t> bytes,
                     uint64_t choice, const ModelParams& params, bool* probed, size_t* best_out) {
  if (probed != nullptr) *probed = false;
  const size_t n = options.size();
  size_t best = n, least = n, unlearned = n;
  double best_s = kInfinity;
  for (size_t i = 0; i < n; ++i) {
    const SourceEstimate& e = options[i];
    if (e.down) continue;
    if (e.probe && e.samples < params.min_samples && unlearned == n) unlearned = i;
    const double s = expected_finish_s(e, bytes[i]);
    if (best == n || s < best_s) {
      best = i;
      best_s = s;
    }
  }
  if (best_out != nullptr) *best_out = best;
  if (unlearned != n) {
    if (probed != nullptr) *probed = true;
    return unlearned;
  }
  for (size_t i = 0; i < n; ++i) {
    const SourceEstimate& e = options[i];
    if (e.down || !e.probe || i == best || choice < e.next_probe) continue;
    if (least == n || e.samples < options[least].samples) least = i;
  }
  if (least != n) {
    if (probed != nullptr) *probed = true;
    return least;
  }
  return best;
}

SourceEstimate observe(SourceEstimate e, uint64_t bytes, double seconds,
                       const ModelParams& params) {
  const double b = static_cast<double>(bytes);
  const double s = std::max(seconds, 0.0);
  // The first read is the whole estimate; then each read weighs alpha (at least 1/samples, so that
  // the first few are an even mean rather than the first one's echo).
  const double w =
      e.samples == 0 ? 1.0 : std::max(params.alpha, 1.0 / static_cast<double>(e.samples + 1));
  e.mean_s += w * (s - e.mean_s);
  e.mean_b += w * (b - e.mean_b);
  e.mean_bb += w * (b * b - e.mean_bb);
  e.mean_sb += w * (s * b - e.mean_sb);
  ++e.samples;
  return e;
}

SourceModel::SourceModel(size_t ranks, ModelParams params)
    : params_(params),
      est_(kPeer0 + ranks),
      reads_(kPeer0 + ranks),
      bytes_(kPeer0 + ranks),
      probes_(kPeer0 + ranks) {
  // The source's estimate is learned from every read of it (stage 2's copies, the read-ahead's
  // reads): it is never probed, so that a source read is never made only to measure it.
  est_[kPfs].probe = false;
  for (SourceEstimate& e : est_) e.next_probe = params_.probe_every;
}

SourceModel::Choice SourceModel::choose(std::span<const size_t> sources,
                                        std::span<const uint64_t> bytes, bool may_probe) {
  std::lock_guard lock(mutex_);
  std::vector<SourceEstimate> options;
  options.reserve(sources.size());
  for (const size_t s : sources) {
    SourceEstimate e = est_[s];
    if (s >= kPeer0 && e.samples < params_.min_samples && pooled_.samples >= params_.min_samples) {
      e.samples = pooled_.samples;  // the other peers' estimate, with this one's queue
      e.mean_s = pooled_.mean_s;
      e.mean_b = pooled_.mean_b;
      e.mean_bb = pooled_.mean_bb;
      e.mean_sb = pooled_.mean_sb;
    }
    options.push_back(e);
  }
  const uint64_t choice = choices_++;
  bool probed = false;
  size_t best = sources.size();
  const size_t i = choose_source(options, bytes, choice, params_, &probed, &best);
  Choice out{kPfs};
  if (i == sources.size()) {  // every option down: the source
    if (sources.size() > 1) ++moved_;
    ++est_[kPfs].queued;
    return out;
  }
  size_t read = i;
  if (probed) {
    // The read goes where it is expected to finish first; with nothing learned of any option (the
    // loader's first reads), to the probed one: it is learned from that read.
    read = std::isinf(expected_finish_s(options[best], bytes[best])) ? i : best;
    if (may_probe && read != i) {
      SourceEstimate& e = est_[sources[i]];
      if (e.samples < params_.min_samples) {  // still learning it
        e.next_probe = choice + params_.probe_every;
      } else {  // probed again no sooner than twice as many choices later
        e.probe_gap = e.probe_gap == 0 ? params_.probe_every : 2 * e.probe_gap;
        e.next_probe = choice + e.probe_gap;
      }
      out.probe = sources[i];
      out.probe_bytes = bytes[i];
    }
  }
  const size_t source = sources[read];
  if (est_[source].probe && read == best) {  // the best: probed again soon once it is not
    est_[source].probe_gap = 0;
    est_[source].next_probe = choice + params_.probe_every;
  }
  if (source == kPfs && sources.size() > 1) ++moved_;
  out.read = source;
  est_[source].queued_bytes += bytes[read];
  ++est_[source].queued;
  return out;
}

void SourceModel::done(size_t source, uint64_t bytes, double seconds, bool ok) {
  std::lock_guard lock(mutex_);
  SourceEstimate& e = est_[source];
  // The read occupied the source for its share of the time it was under way with the others
  // queued there (so that the bandwidth learned is the source's, not one read's).
  const double share = seconds / std::max<uint32_t>(e.queued, 1);
  e.queued_bytes -= std::min(e.queued_bytes, bytes);
  if (e.queued > 0) --e.queued;
  ++reads_[source];
  bytes_[source] += bytes;
  if (ok) {
    e = observe(e, bytes, share, params_);
    if (source >= kPeer0) pooled_ = observe(pooled_, bytes, share, params_);
  }
}

void SourceModel::begin(size_t source, uint64_t bytes, Read read) {
  std::lock_guard lock(mutex_);
  if (read == Read::kProbe) ++probes_[source];
  est_[source].queued_bytes += bytes;
  ++est_[source].queued;
}

void SourceModel::set_down(size_t source) {
  std::lock_guard lock(mutex_);
  est_[source].down = true;
}

bool SourceModel::learned(size_t source) const {
  std::lock_guard lock(mutex_);
  const SourceEstimate& e = est_[source];
  return e.samples >= params_.min_samples && e.bytes_per_s() > 0;
}

SourceModel::Links SourceModel::links_against_pfs(uint64_t bytes, double by) const {
  std::lock_guard lock(mutex_);
  const auto learned = [&](const SourceEstimate& e) {
    return e.samples >= params_.min_samples && e.bytes_per_s() > 0;
  };
  if (!learned(est_[kPfs])) return Links::kUnknown;
  const auto seconds = [&](const SourceEstimate& e) {
    return e.latency_s() + static_cast<double>(bytes) / e.bytes_per_s();
  };
  const double pfs = seconds(est_[kPfs]);
  size_t faster = 0, slower = 0;
  for (size_t s = kPeer0; s < est_.size(); ++s) {
    const SourceEstimate& e = est_[s];
    if (e.down || !learned(e)) continue;
    (seconds(e) * by < pfs ? faster : slower) += 1;
  }
  if (faster + slower == 0) return Links::kUnknown;
  return slower == 0 ? Links::kFaster : faster == 0 ? Links::kSlower : Links::kMixed;
}

std::vector<SourceModel::Row> SourceModel::rows() const {
  std::lock_guard lock(mutex_);
  std::vector<Row> rows;
  for (size_t s = 0; s < est_.size(); ++s) {
    const SourceEstimate& e = est_[s];
    if (reads_[s] == 0 && e.samples == 0 && !e.down && probes_[s] == 0) continue;  // never used
    Row r;
    r.name = s == kStage ? "stage" : s == kPfs ? "pfs" : "node " + std::to_string(s - kPeer0);
    r.reads = reads_[s];
    r.bytes = bytes_[s];
    r.probes = probes_[s];
    r.samples = e.samples;
    r.latency_s = e.latency_s();
    r.bytes_per_s = e.bytes_per_s();
    r.down = e.down;
    rows.push_back(std::move(r));
  }
  return rows;
}

uint64_t SourceModel::moved_to_pfs() const {
  std::lock_guard lock(mutex_);
  return moved_;
}

}  // namespace prestage::detail
