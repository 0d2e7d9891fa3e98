#include "decode/gpu_share.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace prestage::detail {

namespace {

double balance(double gpu_s, double cpu_s) {
  const double total = gpu_s + cpu_s;
  return total > 0 ? std::clamp(gpu_s / total, 0.0, 1.0) : 0.5;
}

}  // namespace

GpuShare::GpuShare(double given, uint64_t readers)
    : automatic_(given < 0), readers_(std::max<uint64_t>(1, readers)) {
  if (automatic_) {
    cpu_s_ = kPriorCpuS / static_cast<double>(readers_);
    share_ = balance(gpu_s_, cpu_s_);
  } else {
    share_ = given;
  }
}

double GpuShare::share() const {
  std::lock_guard lock(mutex_);
  return share_;
}

size_t GpuShare::cpu_count(size_t n) const {
  const double share = this->share();
  const auto count = static_cast<size_t>(std::llround(share * static_cast<double>(n)));
  if (!automatic_ || n < 2) return std::min(n, count);
  return std::clamp<size_t>(count, 1, n - 1);
}

void GpuShare::observe(const GpuShareSample& s) {
  std::lock_guard lock(mutex_);
  ++batches_;
  const auto smooth = [](double& value, bool& measured, double sample) {
    value = measured ? value + kSmoothing * (sample - value) : sample;
    measured = true;
  };
  if (s.gpu_images > 0 && s.gpu_s >= 0) {
    smooth(gpu_s_, gpu_measured_, s.gpu_s / static_cast<double>(s.gpu_images));
  }
  if (s.cpu_images > 0 && s.cpu_s >= 0) {
    smooth(cpu_s_, cpu_measured_, s.cpu_s / static_cast<double>(s.cpu_images));
  }
  if (automatic_) settle();
}

void GpuShare::readers_changed(uint64_t from, uint64_t to) {
  if (from == 0 || to == 0 || from == to) return;
  std::lock_guard lock(mutex_);
  cpu_s_ *= static_cast<double>(from) / static_cast<double>(to);
  readers_ = to;
  if (automatic_) settle();
}

void GpuShare::settle() {
  const double target = balance(gpu_s_, cpu_s_);
  if (std::abs(target - share_) <= kDeadBand) return;
  share_ = target;
  ++moves_;
}

GpuShare::Report GpuShare::report() const {
  std::lock_guard lock(mutex_);
  Report r;
  r.share = share_;
  r.automatic = automatic_;
  r.batches = batches_;
  r.moves = moves_;
  r.gpu_ms_per_image = gpu_measured_ ? gpu_s_ * 1e3 : 0;
  r.cpu_ms_per_image = cpu_measured_ ? cpu_s_ * 1e3 : 0;
  char text[320];
  std::snprintf(text, sizeof(text),
                "%s: GPU %.3f ms/image%s, CPU %.3f ms/image%s (wall, %llu readers): both parts of "
                "a batch finish together at %.3f; %llu batches measured",
                automatic_ ? "sized at run time" : "given (gpu_cpu_share), fixed", gpu_s_ * 1e3,
                gpu_measured_ ? "" : " (prior)", cpu_s_ * 1e3, cpu_measured_ ? "" : " (prior)",
                static_cast<unsigned long long>(readers_), balance(gpu_s_, cpu_s_),
                static_cast<unsigned long long>(batches_));
  r.why = text;
  return r;
}

GpuCropChoice::GpuCropChoice(GpuCrop given, bool roi_available) : crop_(given) {
  if (given == GpuCrop::kResize) {
    why_ = "given: resize";
  } else if (!roi_available) {
    crop_ = GpuCrop::kResize;
    why_ = given == GpuCrop::kRoi
               ? "roi given, but nvJPEG cannot decode regions here (no hardware engine, or no "
                 "nvjpegDecodeBatchedEx): resize"
               : "resize: nvJPEG cannot decode regions here (no hardware engine, or no "
                 "nvjpegDecodeBatchedEx)";
  } else if (given == GpuCrop::kRoi) {
    why_ = "given: roi";
  } else {
    why_ = "trying each way on the first batches";
  }
}

void GpuCropChoice::roi_unavailable() {
  std::lock_guard lock(mutex_);
  if (crop_ == GpuCrop::kResize) return;  // given or measured: nothing region-only to stop
  why_ = why_ == "given: roi"
             ? "roi given, but nvJPEG cannot decode regions here (no hardware engine): resize"
             : "resize: nvJPEG cannot decode regions here (no hardware engine)";
  crop_ = GpuCrop::kResize;
}

GpuCrop GpuCropChoice::next() {
  std::lock_guard lock(mutex_);
  if (crop_ != GpuCrop::kAuto) return crop_;
  const GpuCrop pick = roi_.begun < resize_.begun ? GpuCrop::kRoi : GpuCrop::kResize;
  ++way(pick).begun;
  return pick;
}

void GpuCropChoice::observe(GpuCrop used, uint64_t images, double gpu_s) {
  if (images == 0 || gpu_s < 0) return;
  std::lock_guard lock(mutex_);
  if (crop_ != GpuCrop::kAuto || used == GpuCrop::kAuto) return;
  Way& w = way(used);
  const double per_image = gpu_s / static_cast<double>(images);
  w.best_s = w.timed == 0 ? per_image : std::min(w.best_s, per_image);
  ++w.timed;
  decide();
}

void GpuCropChoice::decide() {
  if (resize_.timed < kTrials || roi_.timed < kTrials) return;
  crop_ = roi_.best_s < resize_.best_s ? GpuCrop::kRoi : GpuCrop::kResize;
  char text[200];
  std::snprintf(text, sizeof(text),
                "measured: %s (best of %llu batches each: resize %.3f ms/image, roi %.3f "
                "ms/image on the GPU)",
                crop_ == GpuCrop::kRoi ? "roi" : "resize", static_cast<unsigned long long>(kTrials),
                resize_.best_s * 1e3, roi_.best_s * 1e3);
  why_ = text;
}

GpuCropChoice::Report GpuCropChoice::report() const {
  std::lock_guard lock(mutex_);
  return Report{crop_, why_};
}

}  // namespace prestage::detail
