// The self-tuning controller on a simulated pipeline (no threads): decode-bound, I/O-bound,
// consumer-bound and latency-bound pipelines, a change of conditions halfway, values the user gave,
// and no oscillation once settled.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>

#include "pipeline/tuner.hpp"

using prestage::detail::kKnobs;
using prestage::detail::Knob;
using prestage::detail::KnobId;
using prestage::detail::Tuner;
using prestage::detail::TunerWindow;

namespace {

// A pipeline as a closed-form throughput model: the slowest of the consumer, stage 3 (decode
// threads on the cores left), stage 2 (reads in flight, each file one latency, up to what the file
// system serves at once, fed by lookahead x batch files) and the file system's bandwidth. Rates
// carry a deterministic +-3% noise.
struct SimPipeline {
  double cores = 16;
  double decode_s = 0.08;         // CPU seconds to decode one batch
  double consumer_s = 0.001;      // seconds the consumer computes per batch
  double files = 64;              // files per batch
  double latency_s = 0.002;       // per file read
  double fs_parallel = 1e9;       // reads the file system serves at once
  double fs_batches_per_s = 1e9;  // its bandwidth, in batches
  bool staged = true;             // stage 2 threads exist (reads in flight is a knob)
  uint64_t tick = 0;

  double noise() {
    // A fixed pseudo-random sequence in [-0.03, 0.03].
    tick = tick * 6364136223846793005ULL + 1442695040888963407ULL;
    return (static_cast<double>(tick >> 11) / 9007199254740992.0 - 0.5) * 0.06;
  }

  TunerWindow run(const Tuner& tuner, double seconds = 0.5) {
    const double decode = static_cast<double>(tuner.knob(KnobId::kDecode).value);
    const double reads = static_cast<double>(tuner.knob(KnobId::kReads).value);
    const double lookahead = static_cast<double>(tuner.knob(KnobId::kLookahead).value);
    const double decode_rate = std::min(decode, cores) / decode_s;
    double rate = std::min(decode_rate, 1 / consumer_s);
    double io_rate = 1e9;
    if (staged) {
      const double in_flight = std::min({reads, fs_parallel, lookahead * files});
      io_rate = std::min(in_flight / (latency_s * files), fs_batches_per_s);
      rate = std::min(rate, io_rate);
    }
    rate *= 1 + noise();
    TunerWindow w;
    w.seconds = seconds;
    w.batches = static_cast<uint64_t>(std::llround(rate * seconds));
    w.consumer_wait_s = std::max(0.0, seconds - rate * seconds * consumer_s);
    w.decode_busy_s = rate * seconds * decode_s;
    // Stage 2's threads are busy while their reads are under way.
    w.stage_busy_s = staged ? std::min(reads * seconds, rate * seconds * files * latency_s *
                                                            std::max(1.0, reads / fs_parallel))
                            : 0;
    w.cpu_s = w.decode_busy_s + rate * seconds * consumer_s;
    w.cpus = static_cast<uint64_t>(cores);
    return w;
  }

  // The best rate any knob values within the tuner's bounds give.
  double best(const Tuner& tuner) const {
    const double decode = static_cast<double>(tuner.knob(KnobId::kDecode).max);
    double rate = std::min(std::min(decode, cores) / decode_s, 1 / consumer_s);
    if (staged) {
      const double reads = static_cast<double>(tuner.knob(KnobId::kReads).max);
      const double lookahead = static_cast<double>(tuner.knob(KnobId::kLookahead).max);
      const double in_flight = std::min({reads, fs_parallel, lookahead * files});
      rate = std::min(rate, std::min(in_flight / (latency_s * files), fs_batches_per_s));
    }
    return rate;
  }
};

std::array<Knob, kKnobs> knobs(uint64_t decode, uint64_t decode_max, uint64_t reads,
                               uint64_t reads_max, uint64_t lookahead, uint64_t lookahead_max) {
  return {Knob{decode, decode_max, false}, Knob{reads, reads_max, false},
          Knob{lookahead, lookahead_max, false}};
}

// Runs `windows` windows, applying each change (the tuner has already applied it to its knobs);
// returns the number of changes.
uint64_t drive(Tuner& tuner, SimPipeline& sim, uint64_t windows) {
  uint64_t changes = 0;
  for (uint64_t i = 0; i < windows; ++i) {
    if (tuner.observe(sim.run(tuner))) ++changes;
  }
  return changes;
}

double steady_rate(const Tuner& tuner, SimPipeline sim) {
  double sum = 0;
  for (int i = 0; i < 20; ++i) {
    const TunerWindow w = sim.run(tuner);
    sum += static_cast<double>(w.batches) / w.seconds;
  }
  return sum / 20;
}

}  // namespace

TEST_CASE("tuner: a decode-bound pipeline gets decode threads up to the cores") {
  SimPipeline sim;  // 16 cores, fast I/O
  sim.latency_s = 0.0001;
  Tuner tuner(knobs(4, 16, 8, 64, 4, 32));
  drive(tuner, sim, 200);
  CHECK(tuner.knob(KnobId::kDecode).value >= 15);
  CHECK(steady_rate(tuner, sim) >= 0.9 * sim.best(tuner));
  CHECK(tuner.settled_at_s() < 30);  // 60 windows of 0.5 s
}

TEST_CASE("tuner: an I/O-bound pipeline gets reads in flight up to what the file system serves") {
  SimPipeline sim;
  sim.decode_s = 0.01;
  sim.latency_s = 0.002;
  sim.fs_parallel = 48;
  Tuner tuner(knobs(8, 16, 4, 128, 4, 32));
  drive(tuner, sim, 300);
  const uint64_t reads = tuner.knob(KnobId::kReads).value;
  CHECK(reads >= 32);
  CHECK(reads <= 64);                                                 // 128 does not pay: undone
  CHECK(steady_rate(tuner, sim) >= 0.9 * sim.best(tuner) * 32 / 48);  // doublings stop at 32 or 64
  CHECK(tuner.steps_undone() >= 1);
}

TEST_CASE("tuner: stage 2 starved of batches gets more lookahead") {
  SimPipeline sim;
  sim.decode_s = 0.005;
  sim.files = 4;  // small batches: lookahead x files caps the reads in flight
  sim.latency_s = 0.01;
  Tuner tuner(knobs(8, 16, 32, 64, 2, 16));
  drive(tuner, sim, 300);
  CHECK(tuner.knob(KnobId::kLookahead).value >= 8);
  CHECK(steady_rate(tuner, sim) >= 0.5 * sim.best(tuner));
}

TEST_CASE("tuner: a consumer-bound pipeline changes nothing") {
  SimPipeline sim;
  sim.consumer_s = 0.1;  // 10 batches/s; the pipeline could give 200
  Tuner tuner(knobs(4, 16, 8, 64, 4, 32));
  CHECK(drive(tuner, sim, 200) == 0);
  CHECK(tuner.knob(KnobId::kDecode).value == 4);
  CHECK(tuner.knob(KnobId::kReads).value == 8);
  CHECK(tuner.knob(KnobId::kLookahead).value == 4);
}

TEST_CASE("tuner: settled values do not oscillate") {
  SimPipeline sim;
  sim.decode_s = 0.01;
  sim.fs_parallel = 24;
  Tuner tuner(knobs(8, 16, 4, 128, 4, 32));
  drive(tuner, sim, 200);
  const uint64_t settled = tuner.knob(KnobId::kReads).value;
  const uint64_t kept = tuner.steps_kept();
  // From here on a knob may only be retried, at ever longer intervals, and undone.
  std::set<uint64_t> seen;
  uint64_t changes = 0;
  for (int i = 0; i < 1000; ++i) {
    if (tuner.observe(sim.run(tuner))) ++changes;
    seen.insert(tuner.knob(KnobId::kReads).value);
  }
  CHECK(tuner.steps_kept() == kept);
  CHECK(tuner.knob(KnobId::kReads).value == settled);
  CHECK(seen.size() <= 2);
  // Tries and undos of the 3 knobs with backoffs of 4, 8, ... 256 windows: at most 10 tries each.
  CHECK(changes <= 2 * 3 * 10);
}

TEST_CASE("tuner: re-adapts when the file system slows down halfway") {
  SimPipeline sim;
  sim.decode_s = 0.01;
  sim.latency_s = 0.0005;
  Tuner tuner(knobs(16, 16, 4, 128, 8, 32));
  drive(tuner, sim, 200);
  const uint64_t before = tuner.knob(KnobId::kReads).value;
  sim.latency_s = 0.004;  // eight times slower per operation
  drive(tuner, sim, 300);
  CHECK(tuner.knob(KnobId::kReads).value > before);
  CHECK(steady_rate(tuner, sim) >= 0.9 * sim.best(tuner));
}

TEST_CASE("tuner: values the user gave are never changed") {
  SimPipeline sim;
  sim.decode_s = 0.2;  // decode-bound
  sim.latency_s = 0.01;
  auto k = knobs(2, 16, 4, 64, 2, 32);
  k[0].pinned = true;
  k[1].pinned = true;
  k[2].pinned = true;
  Tuner tuner(k);
  CHECK(drive(tuner, sim, 200) == 0);
  CHECK(tuner.knob(KnobId::kDecode).value == 2);
  CHECK(tuner.knob(KnobId::kReads).value == 4);
  CHECK(tuner.knob(KnobId::kLookahead).value == 2);
}

TEST_CASE("tuner: no knob passes its maximum, and decode stops at the idle cores") {
  SimPipeline sim;
  sim.cores = 4;
  sim.decode_s = 0.2;
  sim.latency_s = 0.0001;
  Tuner tuner(knobs(2, 16, 4, 8, 2, 4));
  for (int i = 0; i < 300; ++i) {
    tuner.observe(sim.run(tuner));
    CHECK(tuner.knob(KnobId::kReads).value <= 8);
    CHECK(tuner.knob(KnobId::kLookahead).value <= 4);
    CHECK(tuner.knob(KnobId::kDecode).value <= 6);  // 4 cores busy: at most one step past them
  }
}

TEST_CASE("tuner: without stage 2 threads only decode and lookahead move") {
  SimPipeline sim;
  sim.staged = false;
  Tuner tuner(knobs(2, 8, 0, 0, 4, 16));
  drive(tuner, sim, 200);
  CHECK(tuner.knob(KnobId::kReads).value == 0);
  CHECK(tuner.knob(KnobId::kDecode).value >= 7);
}
