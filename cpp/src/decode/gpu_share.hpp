// decode_device=cuda: the CPU's share of each batch (LoaderOptions::gpu_cpu_share), sized at run
// time so that the GPU's part and the CPU's part of a batch finish together. A pure unit: it is
// told what each batch's two parts took and answers with the share for the next batches, so tests
// drive it with simulated times and no thread.
//
// The rule (DALI's hw_decoder_load, sized by measurement instead of by hand): with g the seconds
// per image of the GPU's part (from its submission to its completion) and c the wall seconds per
// image of the CPU's part (its readers together), a batch of n with a share x takes g n (1 - x) on
// the GPU and c n x on the CPU; both finish together at x = g / (g + c). Each batch's g and c are
// smoothed (an exponential average), and the share moves to the balance only when it is more than a
// dead band away, so that timing noise does not make it wander. Per-image times that depend on the
// share (a fixed cost per batch on the GPU; fewer CPU images than readers) still settle at the
// balance: x = g / (g + c) holds exactly when both parts take the same time.
//
// The readers' count changes the CPU's wall time per image: readers_changed() (the self-tuning's
// steps) rescales c at once, so that the share follows a step in the same window the tuner judges
// it by, instead of fighting it for a few batches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

#include "prestage/options.hpp"

namespace prestage::detail {

// What one batch's two parts took.
struct GpuShareSample {
  uint64_t gpu_images = 0;  // given to the GPU decoder
  double gpu_s = 0;         // from their submission to the completion of their GPU work
  uint64_t cpu_images = 0;  // decoded by the readers (the share)
  double cpu_s = 0;         // the readers' wall time on them, first start to last end
};

// Thread-safe: any thread may call any member.
class GpuShare {
 public:
  // A new batch's weight in the smoothed per-image times.
  static constexpr double kSmoothing = 0.3;
  // The share moves only to a balance further than this from it.
  static constexpr double kDeadBand = 0.02;
  // Before any measurement: seconds per image of the CPU path on one reader (RandomResizedCrop
  // 224 on the H100 node: ~700 images/s per thread, DESIGN.md) and of the GPU (nvJPEG's hardware
  // engine on an A100: ~5,000 images/s, the published figure). Replaced by the first batches.
  static constexpr double kPriorCpuS = 1.0 / 700;
  static constexpr double kPriorGpuS = 1.0 / 5000;

  // `given`: a share in [0, 1), fixed (nothing here moves it); a negative value: sized at run time,
  // starting from the balance of the prior times with `readers` decoding.
  GpuShare(double given, uint64_t readers);

  bool automatic() const noexcept { return automatic_; }
  double share() const;
  // How many of a batch of n the CPU decodes: round(share x n); sized at run time, at least one
  // and at most n - 1 (for n >= 2), so that both parts keep being measured.
  size_t cpu_count(size_t n) const;
  // A batch's times. A given share does not move; its times are still reported.
  void observe(const GpuShareSample& sample);
  // The readers decoding went from `from` to `to` (the self-tuning): the CPU's wall time per image
  // is scaled by from / to until the next batches measure it.
  void readers_changed(uint64_t from, uint64_t to);

  struct Report {
    double share = 0;
    bool automatic = false;
    double gpu_ms_per_image = 0;  // smoothed; 0: not measured yet
    double cpu_ms_per_image = 0;
    uint64_t batches = 0;  // batches observed
    uint64_t moves = 0;    // times the share moved
    std::string why;
  };
  Report report() const;

 private:
  void settle();  // needs mutex_ held: moves the share to the balance if outside the dead band

  const bool automatic_;
  mutable std::mutex mutex_;
  double share_ = 0;
  double gpu_s_ = kPriorGpuS;  // per image, smoothed
  double cpu_s_ = kPriorCpuS;  // per image (wall, all readers), smoothed
  bool gpu_measured_ = false;
  bool cpu_measured_ = false;
  uint64_t readers_ = 1;
  uint64_t batches_ = 0;
  uint64_t moves_ = 0;
};

// decode_device=cuda, GpuCrop::kAuto: whether the hardware engine decodes whole images (NPP's
// resize reads the crop box) or only the boxes (nvJPEG's region decode), whichever measures faster:
// the first batches go kTrials each way, in turn, timed as the share's GPU part is (seconds per
// image of the GPU's part), and the way with the lower best time is kept from then on. The best
// (not the mean) of each way's trials, so that the first batch's allocations and a noisy one do not
// decide. A way given (kResize, kRoi) is used without trials; where region decode is not available
// (no hardware engine, or the library lacks the calls) kResize is. Thread-safe.
class GpuCropChoice {
 public:
  static constexpr uint64_t kTrials = 3;

  GpuCropChoice(GpuCrop given, bool roi_available);
  // A decoder found it cannot decode regions after all (no hardware engine): resize from now on.
  void roi_unavailable();
  // The way the next batch takes. During the trials: the way with fewer batches under trial
  // (begun, timed or not), resize first.
  GpuCrop next();
  // A batch decoded `used` took `gpu_s` for `images` images on the GPU.
  void observe(GpuCrop used, uint64_t images, double gpu_s);

  struct Report {
    GpuCrop crop = GpuCrop::kResize;  // kAuto while trying
    std::string why;
  };
  Report report() const;

 private:
  struct Way {
    uint64_t begun = 0, timed = 0;
    double best_s = 0;  // per image
  };
  Way& way(GpuCrop crop) { return crop == GpuCrop::kRoi ? roi_ : resize_; }
  void decide();  // needs mutex_ held

  mutable std::mutex mutex_;
  GpuCrop crop_;  // kAuto while trying
  std::string why_;
  Way resize_, roi_;
};

}  // namespace prestage::detail
