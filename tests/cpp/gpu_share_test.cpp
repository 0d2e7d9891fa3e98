// The CPU's share of a GPU-decoded batch, sized at run time, on a simulated batch (no threads, no
// GPU): the GPU's part takes a fixed cost plus a time per image, the CPU's part a wall time per
// image; the balance, where both take the same time, is solved here in closed form and the share
// must settle there from either side, stay put under noise, follow a change of readers, and never
// move when it was given. And the choice between NPP reading the crop box out of whole images and
// nvJPEG decoding only the box, by the first batches' times.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "decode/gpu_share.hpp"

using prestage::detail::GpuShare;
using prestage::detail::GpuShareSample;

namespace {

struct SimBatch {
  size_t n = 256;
  double gpu_fixed_s = 0;     // per batch on the GPU (e.g. the hardware engine's start-up)
  double gpu_image_s = 1e-4;  // per image on the GPU
  double cpu_image_s = 3e-4;  // per image, wall, on all the readers
  double noise = 0;           // relative amplitude of a deterministic noise on both times
  uint64_t tick = 0;

  double jitter() {
    tick = tick * 6364136223846793005ULL + 1442695040888963407ULL;
    return 1 + (static_cast<double>(tick >> 11) / 9007199254740992.0 - 0.5) * 2 * noise;
  }
  // One batch with the share's split; returns the fraction on the CPU it used.
  void run(GpuShare& share) {
    const size_t cpu = share.cpu_count(n);
    const size_t gpu = n - cpu;
    GpuShareSample s;
    s.gpu_images = gpu;
    s.gpu_s = (gpu_fixed_s + gpu_image_s * static_cast<double>(gpu)) * jitter();
    s.cpu_images = cpu;
    s.cpu_s = cpu_image_s * static_cast<double>(cpu) * jitter();
    share.observe(s);
  }
  // The share at which both parts take the same time: fixed + g n (1 - x) = c n x.
  double balance() const {
    const double nn = static_cast<double>(n);
    return (gpu_fixed_s + gpu_image_s * nn) / (gpu_image_s * nn + cpu_image_s * nn);
  }
};

}  // namespace

TEST_CASE("gpu share: the GPU 3x faster than the CPU: the share goes down to the balance, 0.25") {
  GpuShare share(-1, 4);
  REQUIRE(share.automatic());
  SimBatch sim;
  sim.gpu_image_s = 1e-4;
  sim.cpu_image_s = 3e-4;
  const double start = share.share();
  REQUIRE(start > 0.3);  // the prior's balance with 4 readers is above it: this is from above
  double last = start;
  for (int b = 0; b < 20; ++b) {
    sim.run(share);
    CHECK(share.share() <= last + 1e-12);  // never back up
    last = share.share();
  }
  CHECK(std::abs(share.share() - sim.balance()) <= GpuShare::kDeadBand + 0.005);
  CHECK(std::abs(sim.balance() - 0.25) < 1e-12);
  const auto r = share.report();
  CHECK(r.automatic);
  CHECK(r.batches == 20);
  CHECK(std::abs(r.gpu_ms_per_image - 0.1) < 0.01);
  CHECK(std::abs(r.cpu_ms_per_image - 0.3) < 0.03);
  CHECK(r.why.find("sized at run time") != std::string::npos);
}

TEST_CASE("gpu share: the GPU 3x slower than the CPU: the share goes up to the balance, 0.75") {
  GpuShare share(-1, 4);
  SimBatch sim;
  sim.gpu_image_s = 9e-4;
  sim.cpu_image_s = 3e-4;
  const double start = share.share();
  REQUIRE(start < 0.7);  // from below
  double last = start;
  for (int b = 0; b < 20; ++b) {
    sim.run(share);
    CHECK(share.share() >= last - 1e-12);
    last = share.share();
  }
  CHECK(std::abs(share.share() - 0.75) <= GpuShare::kDeadBand + 0.005);
}

TEST_CASE("gpu share: a fixed cost per GPU batch: it still settles where both parts take as long") {
  for (double fixed : {0.002, 0.01}) {
    CAPTURE(fixed);
    GpuShare share(-1, 16);
    SimBatch sim;
    sim.gpu_fixed_s = fixed;
    sim.gpu_image_s = 5e-5;
    sim.cpu_image_s = 1e-4;
    for (int b = 0; b < 40; ++b) sim.run(share);
    // Within the dead band of the balance, in share and so in time.
    CHECK(std::abs(share.share() - sim.balance()) <= GpuShare::kDeadBand + 0.01);
  }
}

TEST_CASE("gpu share: under 10% noise it settles and stays: no oscillation") {
  GpuShare share(-1, 8);
  SimBatch sim;
  sim.gpu_image_s = 2e-4;
  sim.cpu_image_s = 2e-4;
  sim.noise = 0.10;
  for (int b = 0; b < 30; ++b) sim.run(share);
  const uint64_t settled_moves = share.report().moves;
  for (int b = 0; b < 200; ++b) {
    sim.run(share);
    CHECK(std::abs(share.share() - 0.5) <= 0.06);
  }
  CHECK(share.report().moves - settled_moves <= 2);
}

TEST_CASE("gpu share: more readers make the CPU faster: the share follows at once") {
  GpuShare share(-1, 2);
  SimBatch sim;
  sim.gpu_image_s = 2e-4;
  sim.cpu_image_s = 4e-4;  // wall per image with 2 readers
  for (int b = 0; b < 30; ++b) sim.run(share);
  CHECK(std::abs(share.share() - 1.0 / 3) <= GpuShare::kDeadBand + 0.005);
  // The tuner doubles the readers: the wall time per image halves; the share moves before any
  // batch is measured with them, to the new balance (2 / (2 + 2) = 0.5).
  share.readers_changed(2, 4);
  CHECK(std::abs(share.share() - 0.5) < 0.01);
  sim.cpu_image_s = 2e-4;
  for (int b = 0; b < 10; ++b) sim.run(share);
  CHECK(std::abs(share.share() - 0.5) <= GpuShare::kDeadBand + 0.005);
}

TEST_CASE("gpu share: a given share never moves; its times are still reported") {
  for (double given : {0.0, 0.25, 0.9}) {
    CAPTURE(given);
    GpuShare share(given, 4);
    CHECK_FALSE(share.automatic());
    SimBatch sim;
    sim.gpu_image_s = 1e-3;
    sim.cpu_image_s = 1e-5;
    for (int b = 0; b < 50; ++b) {
      sim.run(share);
      CHECK(share.share() == given);
    }
    share.readers_changed(4, 8);
    CHECK(share.share() == given);
    const auto r = share.report();
    CHECK_FALSE(r.automatic);
    CHECK(r.moves == 0);
    CHECK(r.why.find("given") != std::string::npos);
    CHECK(r.gpu_ms_per_image > 0);
  }
}

TEST_CASE(
    "gpu share: the CPU's count of a batch: round(share x n); sized at run time, 1 to n - 1") {
  GpuShare fixed(0.25, 4);
  CHECK(fixed.cpu_count(4) == 1);
  CHECK(fixed.cpu_count(2) == 1);  // 0.5 rounds away from zero
  CHECK(fixed.cpu_count(256) == 64);
  GpuShare none(0.0, 4);
  CHECK(none.cpu_count(256) == 0);
  GpuShare automatic(-1, 4);
  SimBatch gpu_fast;
  gpu_fast.gpu_image_s = 1e-7;
  for (int b = 0; b < 20; ++b) gpu_fast.run(automatic);
  CHECK(automatic.share() < 0.01);
  CHECK(automatic.cpu_count(256) == 1);  // still measured
  CHECK(automatic.cpu_count(1) == 0);
  GpuShare slow(-1, 4);
  SimBatch gpu_slow;
  gpu_slow.gpu_image_s = 1.0;
  for (int b = 0; b < 20; ++b) gpu_slow.run(slow);
  CHECK(slow.share() > 0.99);
  CHECK(slow.cpu_count(256) == 255);
}

TEST_CASE("gpu crop: auto times each way in turn on the first batches and keeps the faster") {
  using prestage::GpuCrop;
  using prestage::detail::GpuCropChoice;
  for (const double roi_ms : {0.5, 2.0}) {  // resize takes 1 ms per image
    CAPTURE(roi_ms);
    GpuCropChoice choice(GpuCrop::kAuto, true);
    CHECK(choice.report().crop == GpuCrop::kAuto);
    std::vector<GpuCrop> tried;
    for (uint64_t b = 0; b < 2 * GpuCropChoice::kTrials; ++b) {
      const GpuCrop way = choice.next();
      tried.push_back(way);
      // The first batch of each way is slow (allocations): the best of the trials decides.
      const double ms = (way == GpuCrop::kRoi ? roi_ms : 1.0) * (b < 2 ? 5 : 1);
      choice.observe(way, 100, ms * 100 * 1e-3);
    }
    // In turn, resize first.
    for (size_t b = 0; b < tried.size(); ++b) {
      CHECK(tried[b] == (b % 2 == 0 ? GpuCrop::kResize : GpuCrop::kRoi));
    }
    const GpuCrop faster = roi_ms < 1.0 ? GpuCrop::kRoi : GpuCrop::kResize;
    CHECK(choice.report().crop == faster);
    CHECK(choice.report().why.rfind("measured", 0) == 0);
    for (int b = 0; b < 10; ++b) CHECK(choice.next() == faster);
    // Later times change nothing.
    choice.observe(faster, 100, 10.0);
    CHECK(choice.report().crop == faster);
  }
}

TEST_CASE("gpu crop: a way given is used without trials; no region decode here means resize") {
  using prestage::GpuCrop;
  using prestage::detail::GpuCropChoice;
  GpuCropChoice roi(GpuCrop::kRoi, true);
  GpuCropChoice resize(GpuCrop::kResize, true);
  for (int b = 0; b < 10; ++b) {
    CHECK(roi.next() == GpuCrop::kRoi);
    CHECK(resize.next() == GpuCrop::kResize);
    roi.observe(GpuCrop::kRoi, 10, 1.0);
    resize.observe(GpuCrop::kResize, 10, 1.0);
  }
  CHECK(roi.report().why == "given: roi");
  GpuCropChoice unable(GpuCrop::kAuto, false);
  CHECK(unable.next() == GpuCrop::kResize);
  CHECK(unable.report().crop == GpuCrop::kResize);
  GpuCropChoice later(GpuCrop::kRoi, true);
  later.roi_unavailable();  // a decoder found no hardware engine
  CHECK(later.next() == GpuCrop::kResize);
  CHECK(later.report().why.find("roi given") != std::string::npos);
}
