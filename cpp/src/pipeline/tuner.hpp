// Online self-tuning: the controller that adjusts, while the job runs, how many samples stage 3
// decodes at once, how many reads stage 2 keeps in flight and how many batches it works ahead, from
// what the pipeline measures anyway. A pure unit: it sees one window of measurements at a time and
// answers with the change to make, so tests drive it with a simulated pipeline and no thread.
//
// The algorithm is tf.data's hill climb, checked by measurement
// (tensorflow/core/framework/model.cc: raise the parallelism whose increase helps the output most;
// its optimisation period doubles up to a cap): while the consumer waits, the stage that is the
// bottleneck gets one step more (decode: +1 thread while cores are idle; reads in flight and
// lookahead: twice as many). The window after a step is left to settle, the next one judges it: the
// step is kept if the delivery rate rose by at least a quarter of the relative step (a doubling
// must give 25%), else it is undone and that knob is left alone for a backoff that doubles with
// each failed try (4 windows, then 8, ... up to 256). So the values never oscillate: after it
// settles, a knob is only retried, at ever longer intervals, and undone again if it still does not
// help. A delivery rate that moves by more than a quarter from the one it settled at (a slower file
// system, a second job, a faster model) ends every backoff.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace prestage::detail {

enum class KnobId : uint8_t { kDecode = 0, kReads = 1, kLookahead = 2 };
inline constexpr size_t kKnobs = 3;
const char* knob_name(KnobId knob) noexcept;  // "readers", "reads_in_flight", "lookahead"

struct Knob {
  uint64_t value = 1;
  uint64_t max = 1;     // from the CPUs (decode) or the memory budget (reads, lookahead)
  bool pinned = false;  // the user gave it: never changed
  // A knob that does not exist in this pipeline (no stage 2 threads: reads in flight): max 0.
  bool tunable() const noexcept { return !pinned && value < max; }
};

// What the pipeline did over one window of time.
struct TunerWindow {
  double seconds = 0;
  uint64_t batches = 0;        // delivered to the consumer
  double consumer_wait_s = 0;  // time the consumer spent waiting in next()
  double decode_busy_s = 0;    // thread-seconds stage 3 spent on samples
  double stage_busy_s = 0;     // thread-seconds stage 2 spent on its items (reads, copies)
  double cpu_s = 0;            // CPU time of the whole process
  uint64_t cpus = 1;           // CPUs it may use
};

struct TuneChange {
  KnobId knob;
  uint64_t from = 0;
  uint64_t to = 0;
  std::string why;
};

class Tuner {
 public:
  // A window ends once it is this long and holds this many batches (Loader: see due()).
  static constexpr double kMinWindowS = 0.25;
  static constexpr uint64_t kMinWindowBatches = 2;
  // The consumer waits for less than this share of the time: the pipeline keeps up, nothing to do.
  static constexpr double kWaitFloor = 0.03;
  static constexpr uint64_t kFirstBackoff = 4;
  static constexpr uint64_t kMaxBackoff = 256;

  explicit Tuner(std::array<Knob, kKnobs> knobs);

  bool due(double seconds, uint64_t batches) const noexcept {
    return seconds >= kMinWindowS && batches >= kMinWindowBatches;
  }
  // Takes one window's figures; returns the change to apply before the next window, if any.
  std::optional<TuneChange> observe(const TunerWindow& window);

  const Knob& knob(KnobId id) const noexcept { return knobs_[static_cast<size_t>(id)]; }
  uint64_t windows() const noexcept { return windows_; }
  uint64_t steps_kept() const noexcept { return kept_; }
  uint64_t steps_undone() const noexcept { return undone_; }
  // Seconds (of windows observed) at which the last kept step was made: the settle time.
  double settled_at_s() const noexcept { return settled_at_s_; }
  // The delivery rate (batches/s) of the last windows without a step under trial.
  double rate() const noexcept { return settled_rate_; }

 private:
  struct Trial {
    KnobId knob;
    uint64_t from, to;
    double base_rate;
    int settle_windows;  // windows left before the one that judges
  };
  std::optional<TuneChange> judge(Trial& trial, double rate);
  std::optional<TuneChange> step(const TunerWindow& w, double base);
  Knob& at(KnobId id) noexcept { return knobs_[static_cast<size_t>(id)]; }

  std::array<Knob, kKnobs> knobs_;
  std::array<uint64_t, kKnobs> backoff_{};        // windows to wait after the next failed step
  std::array<uint64_t, kKnobs> blocked_until_{};  // window index before which a knob is left alone
  std::optional<Trial> trial_;
  std::vector<double> recent_;  // rates of the windows since the last step
  double settled_rate_ = 0;
  double elapsed_s_ = 0;
  double settled_at_s_ = 0;
  uint64_t windows_ = 0;
  uint64_t kept_ = 0;
  uint64_t undone_ = 0;
};

}  // namespace prestage::detail
