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

}  // namespace prestage::detail
