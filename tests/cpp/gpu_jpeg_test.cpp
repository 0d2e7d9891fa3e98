// The GPU JPEG decoder against test doubles of the CUDA runtime, nvJPEG and NPP (fake_cudart.c,
// fake_nvjpeg.c, fake_npp.c, opened from FAKE_*_PATH). The doubles' "device" memory is host memory
// and the nvJPEG double decodes with libjpeg-turbo, so pixels are real; the NPP double's resampling
// filter is not the CPU path's, so pixels are compared within a tolerance and crop boxes exactly.
// Nothing here runs on a GPU.
#include <doctest/doctest.h>

#include <dlfcn.h>
#include <turbojpeg.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "decode/gpu_jpeg.hpp"
#include "decode/gpu_libs.hpp"
#include "decode/jpeg.hpp"
#include "decode/transform.hpp"
#include "gpu_fakes.hpp"
#include "prestage/error.hpp"
#include "test_util.hpp"
#include "util/cuda_open.hpp"

using prestage::ConfigError;
using prestage::DecodeError;
using prestage::ImageSize;
using prestage::Transform;
using prestage::detail::CropBox;
using prestage::detail::GpuError;
using prestage::detail::GpuJpegDecoder;
using prestage::detail::GpuRoute;
using prestage::detail::JpegDecoder;
namespace gpu = prestage::detail::gpu;

namespace {

using prestage::test::check_balanced;
using prestage::test::created_since;
using prestage::test::Fakes;
using prestage::test::ResizeRecord;

std::vector<std::byte> jpeg(int width, int height, int seed, int subsamp = TJSAMP_420,
                            int flags = 0, int pixel_format = TJPF_RGB) {
  const std::vector<unsigned char> bytes =
      prestage::test::smooth_jpeg(width, height, seed, subsamp, flags, pixel_format == TJPF_CMYK);
  const auto* first = reinterpret_cast<const std::byte*>(bytes.data());
  return {first, first + bytes.size()};
}

const gpu::Libraries& fake_libraries() {
  static const gpu::Libraries libraries(FAKE_CUDART_PATH, FAKE_NVJPEG_PATH, FAKE_NPP_PATH);
  return libraries;
}

GpuJpegDecoder::Options options(size_t max_batch, Transform transform, double cpu_share = 0.0,
                                size_t outputs = 1) {
  GpuJpegDecoder::Options o;
  o.max_batch = max_batch;
  o.size = ImageSize{32, 40};
  o.transform = transform;
  o.seed = 1234;
  o.max_pixels = 1 << 24;
  o.cpu_share = cpu_share;
  o.outputs = outputs;
  return o;
}

struct Batch {
  std::vector<std::vector<std::byte>> files;
  std::vector<std::string> paths;
  std::vector<GpuJpegDecoder::Sample> samples;
  void add(std::vector<std::byte> bytes) {
    files.push_back(std::move(bytes));
    paths.push_back("/data/img" + std::to_string(paths.size()) + ".jpg");
  }
  std::vector<GpuJpegDecoder::Sample>& make(uint64_t epoch) {
    samples.clear();
    for (size_t i = 0; i < files.size(); ++i) {
      samples.push_back({std::span<const std::byte>(files[i]), epoch, 100 + i, &paths[i]});
    }
    return samples;
  }
};

Batch mixed_sizes(size_t n) {
  Batch b;
  for (size_t i = 0; i < n; ++i) {
    b.add(jpeg(96 + 24 * static_cast<int>(i % 4), 72 + 16 * static_cast<int>(i % 3),
               static_cast<int>(i), i % 2 == 0 ? TJSAMP_420 : TJSAMP_444));
  }
  return b;
}

// The CPU path's result for sample i, as the loader's CPU decoders compute it.
std::vector<uint8_t> cpu_result(const GpuJpegDecoder::Options& o, const GpuJpegDecoder::Sample& s) {
  JpegDecoder cpu(o.max_pixels);
  std::vector<uint8_t> out(size_t{o.size.height} * o.size.width * 3);
  std::span<std::byte> view(reinterpret_cast<std::byte*>(out.data()), out.size());
  if (o.transform == Transform::kRandomResizedCrop) {
    cpu.decode_random_crop(s.jpeg, o.size, o.seed, s.epoch, s.index, view, *s.path);
  } else {
    cpu.decode_resized(s.jpeg, o.size, view, *s.path);
  }
  return out;
}

// Output k's first `count` samples, copied to the host as a consumer would (after ready(k)).
std::vector<uint8_t> read_output(const gpu::Libraries& lib, const GpuJpegDecoder& d, size_t k,
                                 size_t count) {
  std::vector<uint8_t> host(count * d.sample_bytes());
  REQUIRE(lib.memcpy_async(host.data(), d.output(k), host.size(), gpu::kMemcpyDeviceToHost,
                           d.stream()) == gpu::kCudaSuccess);
  REQUIRE(lib.stream_synchronize(d.stream()) == gpu::kCudaSuccess);
  return host;
}

// Mean and largest absolute difference of two images.
std::pair<double, int> difference(const uint8_t* got, const std::vector<uint8_t>& expected) {
  double total = 0;
  int worst = 0;
  for (size_t k = 0; k < expected.size(); ++k) {
    const int diff = std::abs(int{got[k]} - int{expected[k]});
    total += diff;
    worst = std::max(worst, diff);
  }
  return {total / static_cast<double>(expected.size()), worst};
}

// The fake's device memory is host memory: the output is read in place.
const uint8_t* sample_at(const GpuJpegDecoder& d, size_t i, size_t k = 0) {
  return reinterpret_cast<const uint8_t*>(d.output(k)) + i * d.sample_bytes();
}

}  // namespace

TEST_CASE(
    "gpu libs: missing libraries or entry points: not available, and why names where it looked") {
  const gpu::Libraries off("none", "", "");
  CHECK_FALSE(off.available());
  CHECK(off.why().find("PRESTAGE_CUDART=none") != std::string::npos);
  const gpu::Libraries missing(FAKE_CUDART_PATH, "/nonexistent/libnvjpeg.so.12", FAKE_NPP_PATH);
  CHECK_FALSE(missing.available());
  CHECK(missing.why().find("PRESTAGE_NVJPEG=/nonexistent/libnvjpeg.so.12") != std::string::npos);
  const gpu::Libraries not_nvjpeg(FAKE_CUDART_PATH, "libc.so.6", FAKE_NPP_PATH);
  CHECK_FALSE(not_nvjpeg.available());
  CHECK(not_nvjpeg.why().find("nvjpegCreateEx") != std::string::npos);
  const gpu::Libraries not_npp(FAKE_CUDART_PATH, FAKE_NVJPEG_PATH, FAKE_NVJPEG_PATH);
  CHECK_FALSE(not_npp.available());
  CHECK(not_npp.why().find("nppiResize_8u_C3R_Ctx") != std::string::npos);
  CHECK(fake_libraries().available());
  {
    // A runtime that sees no device.
    void* cudart = ::dlopen(FAKE_CUDART_PATH, RTLD_NOW | RTLD_LOCAL);
    REQUIRE(cudart != nullptr);
    void* symbol = ::dlsym(cudart, "fake_cudart_configure");
    REQUIRE(symbol != nullptr);
    const auto configure = reinterpret_cast<void (*)(int, int, int)>(symbol);
    configure(0, 0, 0);
    const gpu::Libraries no_device(FAKE_CUDART_PATH, FAKE_NVJPEG_PATH, FAKE_NPP_PATH);
    configure(1, 0, 0);
    ::dlclose(cudart);
    CHECK_FALSE(no_device.available());
    CHECK(no_device.why() == "no CUDA device");
  }
  // The decoder refuses to start without them, saying why.
  try {
    GpuJpegDecoder decoder(missing, options(4, Transform::kRandomResizedCrop));
    FAIL("no ConfigError");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()).find("/nonexistent/libnvjpeg.so.12") != std::string::npos);
  }
}

TEST_CASE("gpu libs: the default search: sonames, NVIDIA's wheels, torchvision's copy, CUDA_HOME") {
  prestage::test::TempDir dir;
  const auto site = dir.path() / "site-packages";
  std::filesystem::create_directories(site / "prestage");
  std::filesystem::create_directories(site / "torchvision.libs");
  prestage::test::write_file(site / "torchvision.libs" / "libnvjpeg.1a2b3c4d.so.12", {0});
  const auto nvjpeg =
      prestage::detail::cuda_search("nvjpeg", (site / "prestage").string(), "/opt/cuda");
  const auto has = [&](const std::vector<std::string>& list, const std::string& name) {
    return std::find(list.begin(), list.end(), name) != list.end();
  };
  CHECK(nvjpeg.front() == "libnvjpeg.so");
  CHECK(has(nvjpeg, "libnvjpeg.so.13"));
  CHECK(has(nvjpeg, "libnvjpeg.so.12"));
  CHECK(has(nvjpeg, (site / "nvidia" / "cu13" / "lib" / "libnvjpeg.so.13").string()));
  CHECK(has(nvjpeg, (site / "nvidia" / "nvjpeg" / "lib" / "libnvjpeg.so.12").string()));
  CHECK(has(nvjpeg, (site / "torchvision.libs" / "libnvjpeg.1a2b3c4d.so.12").string()));
  CHECK(has(nvjpeg, "/opt/cuda/lib64/libnvjpeg.so.12"));
  CHECK(has(nvjpeg, "/usr/local/cuda/lib64/libnvjpeg.so.13"));
  const auto npp = prestage::detail::cuda_search("nppig", (site / "prestage").string(), "");
  CHECK(has(npp, "libnppig.so.12"));
  CHECK(has(npp, (site / "nvidia" / "npp" / "lib" / "libnppig.so.12").string()));
}

TEST_CASE(
    "gpu jpeg: every handle, state, stream, event and buffer is created once and destroyed once") {
  for (unsigned engines : {0u, 7u}) {
    CAPTURE(engines);
    Fakes fakes(engines);
    const auto before = fakes.objects();
    Batch batch = mixed_sizes(6);
    {
      GpuJpegDecoder decoder(fake_libraries(), options(8, Transform::kRandomResizedCrop));
      CHECK(decoder.hardware() == (engines > 0));
      std::vector<GpuRoute> routes;
      std::vector<std::exception_ptr> errors;
      decoder.decode(batch.make(0), 0, routes, errors);
      const auto warm = fakes.objects();
      const uint64_t growths = decoder.counters().buffer_growths;
      // The steady state: the same batch shapes again allocate nothing.
      for (uint64_t epoch = 1; epoch < 4; ++epoch) {
        decoder.decode(batch.make(epoch), 0, routes, errors);
      }
      CHECK(created_since(warm, fakes.objects()) == 0);
      CHECK(decoder.counters().buffer_growths == growths);
      CHECK(decoder.counters().batches == 4);
    }
    check_balanced(before, fakes.objects());
    // Handles: one per backend; JPEG streams: max_batch with the hardware engine, else none.
    const auto after = fakes.objects();
    CHECK(after[12] - before[12] == (engines > 0 ? 2u : 1u));  // nvJPEG handles
    CHECK(after[18] - before[18] == (engines > 0 ? 8u : 0u));  // nvJPEG JPEG streams
    CHECK(after[6] - before[6] == 1);                          // CUDA streams
    CHECK(after[9] - before[9] == 4);  // CUDA events: the output's, the staging's, two timing
  }
}

TEST_CASE("gpu jpeg: the CPU path's crop boxes, and pixels within a tolerance of the CPU path's") {
  for (Transform transform : {Transform::kRandomResizedCrop, Transform::kCenterCrop}) {
    CAPTURE(static_cast<int>(transform));
    Fakes fakes(7);
    Batch batch = mixed_sizes(12);
    const auto o = options(12, transform);
    GpuJpegDecoder decoder(fake_libraries(), o);
    std::vector<GpuRoute> routes;
    std::vector<std::exception_ptr> errors;
    auto& samples = batch.make(3);
    decoder.decode(samples, 0, routes, errors);
    const std::vector<uint8_t> output = read_output(fake_libraries(), decoder, 0, samples.size());
    const auto resizes = fakes.resize_log();
    REQUIRE(resizes.size() == samples.size());
    size_t flips = 0;
    for (size_t i = 0; i < samples.size(); ++i) {
      CAPTURE(i);
      CHECK(routes[i] == GpuRoute::kHardware);
      CHECK(errors[i] == nullptr);
      tjhandle tj = tjInitDecompress();
      int w = 0, h = 0, s = 0, cs = 0;
      const auto* data = reinterpret_cast<const unsigned char*>(samples[i].jpeg.data());
      REQUIRE(tjDecompressHeader3(tj, data, samples[i].jpeg.size(), &w, &h, &s, &cs) == 0);
      tjDestroy(tj);
      const CropBox box =
          transform == Transform::kRandomResizedCrop
              ? prestage::detail::random_resized_crop(o.seed, 3, samples[i].index, h, w)
              : prestage::detail::centre_crop_box(h, w, o.size);
      CHECK(resizes[i].x == box.left);
      CHECK(resizes[i].y == box.top);
      CHECK(resizes[i].width == box.width);
      CHECK(resizes[i].height == box.height);
      CHECK(resizes[i].dst_width == 40);
      CHECK(resizes[i].dst_height == 32);
      CHECK(resizes[i].stream == decoder.stream());
      flips += box.flip;
      const std::vector<uint8_t> expected = cpu_result(o, samples[i]);
      const auto [mean, worst] = difference(output.data() + i * decoder.sample_bytes(), expected);
      // Resampling filters differ (the double's area/bilinear, Pillow's with DCT scaling on the
      // CPU): the mean difference stays under 2 levels and no pixel differs by more than 16
      // (measured: at most 1.06 and 6).
      CHECK(mean < 2.0);
      CHECK(worst <= 16);
    }
    CHECK(fakes.mirrors() == flips);
    if (transform == Transform::kRandomResizedCrop) CHECK(flips > 0);
  }
}

TEST_CASE(
    "gpu jpeg: the batched resize gives the pixels of one call per image in one call per "
    "interpolation, the boxes uploaded with it") {
  for (const bool roi : {false, true}) {
    for (Transform transform : {Transform::kRandomResizedCrop, Transform::kCenterCrop}) {
      CAPTURE(roi);
      CAPTURE(static_cast<int>(transform));
      Fakes fakes(7);
      const auto before = fakes.objects();
      Batch batch = mixed_sizes(12);
      batch.add(jpeg(120, 80, 1, TJSAMP_420, TJFLAG_PROGRESSIVE));  // the default backend's
      batch.add(jpeg(30, 20, 2));  // smaller than the output: bilinear, not area averaging
      auto o = options(16, transform);
      o.roi = roi;
      std::vector<std::vector<uint8_t>> outputs;
      std::vector<std::vector<ResizeRecord>> logs;
      std::vector<size_t> mirrors;
      for (const bool batched : {false, true}) {
        o.batched_resize = batched;
        GpuJpegDecoder decoder(fake_libraries(), o);
        CHECK(decoder.batched_resize() == batched);
        std::vector<GpuRoute> routes;
        std::vector<std::exception_ptr> errors;
        auto& samples = batch.make(3);
        fakes.npp_fail("", 0, 0);  // clears the records
        decoder.decode(samples, 0, routes, errors, roi);
        CHECK(errors == std::vector<std::exception_ptr>(samples.size()));
        CHECK(routes[12] == GpuRoute::kGpu);
        outputs.push_back(read_output(fake_libraries(), decoder, 0, samples.size()));
        logs.push_back(fakes.resize_log());
        mirrors.push_back(fakes.mirrors());
        std::set<int> interpolations;
        for (const ResizeRecord& r : logs.back()) interpolations.insert(r.interpolation);
        CHECK(interpolations.size() == 2);
        if (batched) {
          CHECK(fakes.npp_batches() == 2);  // one call per interpolation
          CHECK(decoder.counters().resize_calls == 2);
        } else {
          CHECK(fakes.npp_batches() == 0);
          CHECK(decoder.counters().resize_calls == samples.size());
        }
      }
      // The same boxes (in another order: grouped by interpolation), mirrors and pixels.
      const auto key = [](const ResizeRecord& r) {
        return std::array<int, 7>{r.x,         r.y,          r.width,        r.height,
                                  r.dst_width, r.dst_height, r.interpolation};
      };
      std::multiset<std::array<int, 7>> each, batched;
      for (const ResizeRecord& r : logs[0]) each.insert(key(r));
      for (const ResizeRecord& r : logs[1]) batched.insert(key(r));
      CHECK(logs[0].size() == 14);
      CHECK(each == batched);
      CHECK(mirrors[0] == mirrors[1]);
      CHECK(outputs[0] == outputs[1]);
      check_balanced(before, fakes.objects());
    }
  }
}

TEST_CASE(
    "gpu jpeg: baseline to the hardware engine, progressive to the default backend, CMYK and "
    "4:1:1 to the CPU, in one batch each") {
  Fakes fakes(7);
  Batch batch;
  batch.add(jpeg(96, 72, 0));                                   // 0 baseline
  batch.add(jpeg(120, 80, 1, TJSAMP_420, TJFLAG_PROGRESSIVE));  // 1 progressive
  batch.add(jpeg(96, 72, 2, TJSAMP_411));                       // 2 4:1:1
  batch.add(jpeg(96, 72, 3, TJSAMP_444, 0, TJPF_CMYK));         // 3 CMYK
  batch.add(jpeg(100, 90, 4, TJSAMP_GRAY));                     // 4 grey
  batch.add(jpeg(144, 96, 5, TJSAMP_422));                      // 5 baseline
  const auto o = options(8, Transform::kRandomResizedCrop);
  GpuJpegDecoder decoder(fake_libraries(), o);
  std::vector<GpuRoute> routes;
  std::vector<std::exception_ptr> errors;
  auto& samples = batch.make(0);
  decoder.decode(samples, 0, routes, errors);
  const std::vector<GpuRoute> expected = {GpuRoute::kHardware,       GpuRoute::kGpu,
                                          GpuRoute::kCpuUnsupported, GpuRoute::kCpuUnsupported,
                                          GpuRoute::kHardware,       GpuRoute::kHardware};
  CHECK(routes == expected);
  const std::vector<std::pair<int, int>> lanes = {{gpu::kBackendHardware, 3},
                                                  {gpu::kBackendDefault, 1}};
  CHECK(fakes.batch_log() == lanes);
  CHECK(decoder.counters().hardware == 3);
  CHECK(decoder.counters().gpu == 1);
  CHECK(decoder.counters().cpu_unsupported == 2);
  // The CPU's samples are the CPU path's pixels exactly (or its error).
  for (size_t i : {size_t{2}, size_t{3}}) {
    CAPTURE(i);
    try {
      const std::vector<uint8_t> want = cpu_result(o, samples[i]);
      REQUIRE(errors[i] == nullptr);
      CHECK(std::memcmp(sample_at(decoder, i), want.data(), want.size()) == 0);
    } catch (const DecodeError& e) {
      REQUIRE(errors[i] != nullptr);
      CHECK_THROWS_AS(std::rethrow_exception(errors[i]), DecodeError);
    }
  }
}

TEST_CASE("gpu jpeg: without a hardware engine every GPU image goes to the default backend") {
  Fakes fakes(0);
  Batch batch = mixed_sizes(5);
  GpuJpegDecoder decoder(fake_libraries(), options(8, Transform::kRandomResizedCrop));
  std::vector<GpuRoute> routes;
  std::vector<std::exception_ptr> errors;
  decoder.decode(batch.make(0), 0, routes, errors);
  CHECK(routes == std::vector<GpuRoute>(5, GpuRoute::kGpu));
  CHECK(fakes.batch_log() == std::vector<std::pair<int, int>>{{gpu::kBackendDefault, 5}});
}

TEST_CASE("gpu jpeg: a fixed CPU share of each batch, decoded as the CPU path does") {
  Fakes fakes(7);
  Batch batch = mixed_sizes(8);
  const auto o = options(8, Transform::kRandomResizedCrop, 0.25);
  GpuJpegDecoder decoder(fake_libraries(), o);
  std::vector<GpuRoute> routes;
  std::vector<std::exception_ptr> errors;
  auto& samples = batch.make(1);
  decoder.decode(samples, 0, routes, errors);
  for (size_t i = 0; i < 8; ++i) {
    CAPTURE(i);
    CHECK(routes[i] == (i < 6 ? GpuRoute::kHardware : GpuRoute::kCpuShare));
  }
  CHECK(fakes.batch_log() == std::vector<std::pair<int, int>>{{gpu::kBackendHardware, 6}});
  for (size_t i : {size_t{6}, size_t{7}}) {
    const std::vector<uint8_t> want = cpu_result(o, samples[i]);
    CHECK(std::memcmp(sample_at(decoder, i), want.data(), want.size()) == 0);
  }
  CHECK(decoder.counters().cpu_share == 2);
  CHECK_THROWS_AS(GpuJpegDecoder(fake_libraries(), options(8, Transform::kCenterCrop, 1.0)),
                  ConfigError);
}

TEST_CASE(
    "gpu jpeg: the GPU time of a batch, from its submission to its GPU work's end, once it is "
    "done") {
  Fakes fakes(7);
  Batch batch = mixed_sizes(8);
  GpuJpegDecoder decoder(fake_libraries(), options(8, Transform::kRandomResizedCrop, 0.25));
  std::vector<GpuRoute> routes;
  std::vector<std::exception_ptr> errors;
  CHECK_FALSE(decoder.gpu_seconds());  // no batch yet
  // The double's GPU time is virtual: 1 ms per image of a batched decode, for the 6 images the
  // GPU takes (the CPU's 2 are not in it).
  fakes.image_ns(1'000'000);
  decoder.decode(batch.make(0), 0, routes, errors);
  std::optional<double> seconds = decoder.gpu_seconds();
  REQUIRE(seconds);
  CHECK(*seconds == doctest::Approx(0.006).epsilon(1e-4));
  // While the work runs, nothing (never a wait); the same once it is done.
  fakes.not_ready(1);
  CHECK_FALSE(decoder.gpu_seconds());
  decoder.wait();
  CHECK(*decoder.gpu_seconds() == doctest::Approx(0.006).epsilon(1e-4));
  // A batch that fails has none; the next one has its own.
  fakes.npp_fail("nppiResize_8u_C3R_Ctx", 1, -6);
  CHECK_THROWS_AS(decoder.decode(batch.make(1), 0, routes, errors), GpuError);
  CHECK_FALSE(decoder.gpu_seconds());
  fakes.npp_fail("", 0, 0);
  fakes.image_ns(500'000);
  decoder.decode(batch.make(2), 0, routes, errors);
  CHECK(*decoder.gpu_seconds() == doctest::Approx(0.003).epsilon(1e-4));
}

TEST_CASE(
    "gpu jpeg: region decode: the engine decodes each crop box (nvjpegDecodeBatchedEx), NPP "
    "resizes "
    "it whole; the same pixels as NPP reading the box out of the whole image") {
  for (Transform transform : {Transform::kRandomResizedCrop, Transform::kCenterCrop}) {
    CAPTURE(static_cast<int>(transform));
    Fakes fakes(7);
    const auto before = fakes.objects();
    Batch batch = mixed_sizes(6);
    batch.add(jpeg(120, 80, 9, TJSAMP_420, TJFLAG_PROGRESSIVE));  // the engine declines it
    auto o = options(8, transform);
    o.roi = true;
    {
      GpuJpegDecoder decoder(fake_libraries(), o);
      REQUIRE(decoder.roi_available());
      std::vector<GpuRoute> routes;
      std::vector<std::exception_ptr> errors;
      auto& samples = batch.make(2);
      // Whole images first (the resize way), kept as the reference.
      decoder.decode(samples, 0, routes, errors, /*roi=*/false);
      const std::vector<uint8_t> whole(sample_at(decoder, 0),
                                       sample_at(decoder, 0) + 7 * decoder.sample_bytes());
      CHECK(decoder.counters().roi == 0);
      CHECK(fakes.roi_log().empty());
      fakes.npp_fail("", 0, 0);  // forgets the resizes recorded
      decoder.decode(samples, 0, routes, errors, /*roi=*/true);
      CHECK(std::memcmp(sample_at(decoder, 0), whole.data(), whole.size()) == 0);
      // The six baseline images: their boxes decoded by the engine, in one Ex call; the
      // progressive one whole, on the default backend, its box read by NPP.
      for (size_t i = 0; i < 6; ++i) CHECK(routes[i] == GpuRoute::kHardware);
      CHECK(routes[6] == GpuRoute::kGpu);
      CHECK(decoder.counters().roi == 6);
      const auto rois = fakes.roi_log();
      const auto resizes = fakes.resize_log();
      REQUIRE(rois.size() == 6);
      REQUIRE(resizes.size() == 7);
      for (size_t i = 0; i < 7; ++i) {
        CAPTURE(i);
        int h = 0, w = 0;
        {
          tjhandle tj = tjInitDecompress();
          int samp = 0, colorspace = 0;
          REQUIRE(tjDecompressHeader3(tj,
                                      reinterpret_cast<const unsigned char*>(batch.files[i].data()),
                                      static_cast<unsigned long>(batch.files[i].size()), &w, &h,
                                      &samp, &colorspace) == 0);
          tjDestroy(tj);
        }
        const CropBox box = transform == Transform::kRandomResizedCrop
                                ? prestage::detail::random_resized_crop(o.seed, 2, 100 + i, h, w)
                                : prestage::detail::centre_crop_box(h, w, o.size);
        if (i < 6) {
          CHECK(rois[i] == std::array<int, 4>{box.left, box.top, box.width, box.height});
          // NPP resizes the decoded box whole.
          CHECK(resizes[i].x == 0);
          CHECK(resizes[i].y == 0);
        } else {
          CHECK(resizes[i].x == box.left);
          CHECK(resizes[i].y == box.top);
        }
        CHECK(resizes[i].width == box.width);
        CHECK(resizes[i].height == box.height);
      }
    }
    const auto after = fakes.objects();
    check_balanced(before, after);
    // One decode parameter object per batch place, made once.
    CHECK(prestage::test::created(before, after, prestage::test::kDecodeParams) == 8);
  }
}

TEST_CASE("gpu jpeg: no region decode without a hardware engine or without Options::roi") {
  Fakes none(0);
  auto o = options(8, Transform::kRandomResizedCrop);
  o.roi = true;
  Batch batch = mixed_sizes(4);
  const auto before = none.objects();
  {
    GpuJpegDecoder decoder(fake_libraries(), o);
    CHECK_FALSE(decoder.roi_available());
    std::vector<GpuRoute> routes;
    std::vector<std::exception_ptr> errors;
    decoder.decode(batch.make(0), 0, routes, errors,
                   /*roi=*/true);  // whole, on the default backend
    CHECK(decoder.counters().roi == 0);
    CHECK(decoder.counters().gpu == 4);
    CHECK(none.roi_log().empty());
  }
  o.roi = false;
  Fakes engines(7);
  {
    GpuJpegDecoder decoder(fake_libraries(), o);
    CHECK_FALSE(decoder.roi_available());
  }
  CHECK(prestage::test::created(before, engines.objects(), prestage::test::kDecodeParams) == 0);
}

TEST_CASE(
    "gpu jpeg: corrupt files get the CPU path's DecodeError, the rest of the batch is decoded") {
  Fakes fakes(7);
  Batch batch = mixed_sizes(4);
  batch.files[1].resize(batch.files[1].size() / 2);  // truncated: the header parses, the data not
  batch.files[3] = std::vector<std::byte>(100, std::byte{0x42});  // not a JPEG
  const auto o = options(8, Transform::kRandomResizedCrop);
  GpuJpegDecoder decoder(fake_libraries(), o);
  std::vector<GpuRoute> routes;
  std::vector<std::exception_ptr> errors;
  auto& samples = batch.make(0);
  decoder.decode(samples, 0, routes, errors);
  // The hardware lane fails as a whole (nvJPEG's batched decode has one status): its images go to
  // the CPU; the file that is not a JPEG never reaches the GPU.
  CHECK(routes[0] == GpuRoute::kCpuGpuFailed);
  CHECK(routes[1] == GpuRoute::kCpuGpuFailed);
  CHECK(routes[2] == GpuRoute::kCpuGpuFailed);
  CHECK(routes[3] == GpuRoute::kCpuUnsupported);
  CHECK(decoder.counters().cpu_gpu_failed == 3);
  CHECK(decoder.counters().cpu_unsupported == 1);
  for (size_t i : {size_t{1}, size_t{3}}) {
    CAPTURE(i);
    REQUIRE(errors[i] != nullptr);
    // The CPU path's own error, with its path and message.
    std::string cpu_message;
    try {
      cpu_result(o, samples[i]);
    } catch (const DecodeError& e) {
      cpu_message = e.what();
    }
    REQUIRE_FALSE(cpu_message.empty());
    try {
      std::rethrow_exception(errors[i]);
    } catch (const DecodeError& e) {
      CHECK(std::string(e.what()) == cpu_message);
      CHECK(e.path() == batch.paths[i]);
    }
  }
  for (size_t i : {size_t{0}, size_t{2}}) {
    CHECK(errors[i] == nullptr);
    const std::vector<uint8_t> want = cpu_result(o, samples[i]);
    CHECK(std::memcmp(sample_at(decoder, i), want.data(), want.size()) == 0);
  }
}

TEST_CASE("gpu jpeg: a call failing mid-batch is a GpuError; everything is still destroyed once") {
  Fakes fakes(7);
  Batch batch = mixed_sizes(6);
  const auto before = fakes.objects();
  SUBCASE("NPP resize") {
    GpuJpegDecoder decoder(fake_libraries(), options(8, Transform::kRandomResizedCrop));
    std::vector<GpuRoute> routes;
    std::vector<std::exception_ptr> errors;
    fakes.npp_fail("nppiResize_8u_C3R_Ctx", 3, -6);
    CHECK_THROWS_AS(decoder.decode(batch.make(0), 0, routes, errors), GpuError);
    // The decoder stays usable.
    fakes.npp_fail("", 0, 0);
    decoder.decode(batch.make(0), 0, routes, errors);
    CHECK(routes == std::vector<GpuRoute>(6, GpuRoute::kHardware));
  }
  SUBCASE("NPP batched resize") {
    auto o = options(8, Transform::kRandomResizedCrop);
    o.batched_resize = true;
    GpuJpegDecoder decoder(fake_libraries(), o);
    std::vector<GpuRoute> routes;
    std::vector<std::exception_ptr> errors;
    fakes.npp_fail("nppiResizeBatch_8u_C3R_Advanced_Ctx", 1, -6);
    CHECK_THROWS_AS(decoder.decode(batch.make(0), 0, routes, errors), GpuError);
    // The decoder stays usable.
    fakes.npp_fail("", 0, 0);
    decoder.decode(batch.make(0), 0, routes, errors);
    CHECK(routes == std::vector<GpuRoute>(6, GpuRoute::kHardware));
    CHECK(errors == std::vector<std::exception_ptr>(6));
  }
  SUBCASE("a host-to-device copy") {
    GpuJpegDecoder decoder(fake_libraries(), options(8, Transform::kRandomResizedCrop, 0.5));
    std::vector<GpuRoute> routes;
    std::vector<std::exception_ptr> errors;
    fakes.cuda_fail("cudaMemcpyAsync", 2, 700);
    CHECK_THROWS_AS(decoder.decode(batch.make(0), 0, routes, errors), GpuError);
  }
  SUBCASE("the staging allocation") {
    GpuJpegDecoder decoder(fake_libraries(), options(8, Transform::kRandomResizedCrop));
    std::vector<GpuRoute> routes;
    std::vector<std::exception_ptr> errors;
    fakes.cuda_fail("cudaMalloc", 1, 2);
    CHECK_THROWS_AS(decoder.decode(batch.make(0), 0, routes, errors), GpuError);
    fakes.cuda_fail("", 0, 0);
    decoder.decode(batch.make(0), 0, routes, errors);
    CHECK(errors == std::vector<std::exception_ptr>(6));
  }
  SUBCASE("nvJPEG's pre-allocation is a hint: refused, the engine still decodes") {
    fakes.nvjpeg_fail("nvjpegDecodeBatchedPreAllocate", 1, 2);
    GpuJpegDecoder decoder(fake_libraries(), options(8, Transform::kRandomResizedCrop));
    CHECK(decoder.hardware());
    std::vector<GpuRoute> routes;
    std::vector<std::exception_ptr> errors;
    decoder.decode(batch.make(0), 0, routes, errors);
    CHECK(routes == std::vector<GpuRoute>(6, GpuRoute::kHardware));
    CHECK(errors == std::vector<std::exception_ptr>(6));
  }
  SUBCASE("nvJPEG's batched decode: the lane goes to the CPU, no error") {
    GpuJpegDecoder decoder(fake_libraries(), options(8, Transform::kRandomResizedCrop));
    std::vector<GpuRoute> routes;
    std::vector<std::exception_ptr> errors;
    fakes.nvjpeg_fail("nvjpegDecodeBatched", 1, 6);
    decoder.decode(batch.make(0), 0, routes, errors);
    CHECK(routes == std::vector<GpuRoute>(6, GpuRoute::kCpuGpuFailed));
    CHECK(errors == std::vector<std::exception_ptr>(6));
  }
  for (const char* call : {"cudaMalloc", "cudaHostAlloc", "cudaEventCreateWithFlags",
                           "nvjpegJpegStreamCreate", "nvjpegJpegStateCreate"}) {
    SUBCASE(call) {
      // While setting up: every object made so far is destroyed.
      if (std::string(call).rfind("nvjpeg", 0) == 0) {
        fakes.nvjpeg_fail(call, 2, 5);
      } else {
        fakes.cuda_fail(call, 1, 2);
      }
      CHECK_THROWS_AS(GpuJpegDecoder(fake_libraries(), options(8, Transform::kRandomResizedCrop)),
                      GpuError);
    }
  }
  check_balanced(before, fakes.objects());
}

TEST_CASE("gpu jpeg: one device batch per output; a batch stays in its output while others fill") {
  Fakes fakes(7);
  const auto before = fakes.objects();
  {
    Batch first = mixed_sizes(4);
    Batch second = mixed_sizes(6);
    GpuJpegDecoder decoder(fake_libraries(), options(8, Transform::kRandomResizedCrop, 0.0, 3));
    std::vector<GpuRoute> routes;
    std::vector<std::exception_ptr> errors;
    decoder.decode(first.make(0), 0, routes, errors);
    const size_t bytes = 4 * decoder.sample_bytes();
    const std::vector<uint8_t> kept(sample_at(decoder, 0, 0), sample_at(decoder, 0, 0) + bytes);
    decoder.decode(second.make(1), 1, routes, errors);
    decoder.decode(second.make(2), 2, routes, errors);
    CHECK(std::memcmp(sample_at(decoder, 0, 0), kept.data(), bytes) == 0);
    CHECK(decoder.output(0) != decoder.output(1));
    CHECK(decoder.ready(0) != decoder.ready(1));
    CHECK_THROWS_AS(decoder.decode(first.make(0), 3, routes, errors), std::logic_error);
  }
  const auto after = fakes.objects();
  check_balanced(before, after);
  CHECK(after[9] - before[9] == 6);  // CUDA events: 3 outputs, the staging, two timing
}

// On a machine with a GPU and the libraries (PRESTAGE_CUDART, PRESTAGE_NVJPEG, PRESTAGE_NPP or the
// default search): the real nvJPEG and NPP against the CPU path. Elsewhere it says why and passes.
TEST_CASE(
    "gpu jpeg on a real GPU: the CPU path's pixels within a tolerance (skipped without one)") {
  const gpu::Libraries& real = gpu::Libraries::instance();
  if (!real.available()) {
    MESSAGE("no GPU decoding here: " << real.why());
    return;
  }
  // Both crop paths where the engine has region decoding: the whole image resized from its box
  // (roi false), and only the box decoded (roi true); each with one NPP resize per image and with
  // the batched resize.
  struct Way {
    bool roi, batched;
  };
  for (const Way way : {Way{false, false}, Way{true, false}, Way{false, true}, Way{true, true}}) {
    const bool roi = way.roi;
    for (Transform transform : {Transform::kRandomResizedCrop, Transform::kCenterCrop}) {
      CAPTURE(roi);
      CAPTURE(way.batched);
      CAPTURE(static_cast<int>(transform));
      Batch batch = mixed_sizes(12);
      batch.add(jpeg(120, 80, 1, TJSAMP_420, TJFLAG_PROGRESSIVE));
      auto o = options(16, transform, 0.0, 2);
      o.roi = roi;
      o.batched_resize = way.batched;
      GpuJpegDecoder decoder(real, o);
      MESSAGE("hardware engine: " << decoder.hardware() << ", regions: " << decoder.roi_available()
                                  << ", batched resize: " << decoder.batched_resize());
      if ((roi && !decoder.roi_available()) || (way.batched && !decoder.batched_resize())) continue;
      std::vector<GpuRoute> routes;
      std::vector<std::exception_ptr> errors;
      auto& samples = batch.make(3);
      for (size_t k = 0; k < 2; ++k) {  // twice: the second batch reuses every buffer
        decoder.decode(samples, k, routes, errors, roi);
        MESSAGE("batch " << k << ": hardware " << decoder.counters().hardware
                         << ", default backend " << decoder.counters().gpu << ", regions "
                         << decoder.counters().roi);
        const std::vector<uint8_t> output = read_output(real, decoder, k, samples.size());
        double worst_mean = 0;
        int worst = 0;
        for (size_t i = 0; i < samples.size(); ++i) {
          CAPTURE(i);
          CHECK(errors[i] == nullptr);
          CHECK((routes[i] == GpuRoute::kHardware || routes[i] == GpuRoute::kGpu));
          const auto [mean, max] =
              difference(output.data() + i * decoder.sample_bytes(), cpu_result(o, samples[i]));
          worst_mean = std::max(worst_mean, mean);
          worst = std::max(worst, max);
        }
        MESSAGE("largest mean difference " << worst_mean << ", largest difference " << worst);
        // NPP's filters are not the CPU path's. Measured on an H200 (CUDA 13.0, both crop paths):
        // mean 0.42 (centre crop) and 1.07 (random resized crop), largest 6; bounds at about 2x.
        CHECK(worst_mean < 2.0);
        CHECK(worst <= 16);
      }
      CHECK(decoder.counters().buffer_growths <= 2);
      if (roi) CHECK(decoder.counters().roi > 0);
    }
  }
}

TEST_CASE("gpu jpeg: the centre crop box is Resize + CenterCrop's window in source pixels") {
  // 100 x 200 (h x w) to 32 x 40: the height binds (scale 0.32), the window is 125 wide, centred
  // at (200 - 125) / 2 = 37.5, rounded half to even as CenterCrop does.
  CropBox box = prestage::detail::centre_crop_box(100, 200, ImageSize{32, 40});
  CHECK(box.top == 0);
  CHECK(box.height == 100);
  CHECK(box.width == 125);
  CHECK(box.left == 38);
  CHECK_FALSE(box.flip);
  // 300 x 90 to 32 x 40: the width binds (scale 4/9), the window is 72 high.
  box = prestage::detail::centre_crop_box(300, 90, ImageSize{32, 40});
  CHECK(box.left == 0);
  CHECK(box.width == 90);
  CHECK(box.height == 72);
  CHECK(box.top == 114);
  // The output's own aspect ratio: the whole image.
  box = prestage::detail::centre_crop_box(64, 80, ImageSize{32, 40});
  CHECK((box.top == 0 && box.left == 0 && box.height == 64 && box.width == 80));
}

TEST_CASE("gpu jpeg: an image over max_pixels goes to the CPU path, which refuses it as it does") {
  Fakes fakes(7);
  Batch batch;
  batch.add(jpeg(96, 72, 0));
  batch.add(jpeg(200, 150, 1));  // 30,000 pixels
  auto o = options(4, Transform::kRandomResizedCrop);
  o.max_pixels = 20'000;
  GpuJpegDecoder decoder(fake_libraries(), o);
  std::vector<GpuRoute> routes;
  std::vector<std::exception_ptr> errors;
  auto& samples = batch.make(0);
  decoder.decode(samples, 0, routes, errors);
  CHECK(routes[0] == GpuRoute::kHardware);
  CHECK(routes[1] == GpuRoute::kCpuUnsupported);
  CHECK(errors[0] == nullptr);
  REQUIRE(errors[1] != nullptr);
  std::string cpu_message;
  try {
    cpu_result(o, samples[1]);
  } catch (const DecodeError& e) {
    cpu_message = e.what();
  }
  REQUIRE_FALSE(cpu_message.empty());
  try {
    std::rethrow_exception(errors[1]);
  } catch (const DecodeError& e) {
    CHECK(std::string(e.what()) == cpu_message);
  }
}
