// The Loader with decode_device=cuda over the test doubles of the CUDA runtime, nvJPEG and NPP
// (fake_cudart.c, fake_nvjpeg.c, fake_npp.c, named by PRESTAGE_CUDART/NVJPEG/NPP before the
// libraries are first opened). The doubles' "device" memory is host memory and the nvJPEG double
// decodes with libjpeg-turbo, so device batches are read in place; the NPP double's filter is not
// the CPU path's, so pixels are compared within gpu_jpeg_test's tolerance and crop boxes exactly.
// Nothing here runs on a GPU.
#include <doctest/doctest.h>

#include <dlfcn.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "decode/gpu_share.hpp"
#include "decode/transform.hpp"
#include "gpu_fakes.hpp"
#include "prestage/prestage.hpp"
#include "test_util.hpp"

using prestage::Catalog;
using prestage::ConfigError;
using prestage::DecodeDevice;
using prestage::ImageSize;
using prestage::Loader;
using prestage::LoaderOptions;
using prestage::OnError;
using prestage::Transform;
using prestage::test::TempDir;

namespace {

// Before main: the process's GPU libraries are opened once, from these variables.
[[maybe_unused]] const bool kDoublesNamed = [] {
  ::setenv("PRESTAGE_CUDART", FAKE_CUDART_PATH, 1);
  ::setenv("PRESTAGE_NVJPEG", FAKE_NVJPEG_PATH, 1);
  ::setenv("PRESTAGE_NPP", FAKE_NPP_PATH, 1);
  return true;
}();

using prestage::test::check_balanced;
using prestage::test::created;
using prestage::test::Fakes;
using prestage::test::ResizeRecord;
using prestage::test::smooth_jpeg;
using enum prestage::test::GpuObject;

// root/class_c/img_i.jpg: `classes` x `per_class` smooth JPEGs of mixed sizes; their (h, w) by
// "class_c/img_i.jpg".
std::map<std::string, std::pair<int, int>> make_smooth_folder(const std::filesystem::path& root,
                                                              int classes, int per_class) {
  std::map<std::string, std::pair<int, int>> sizes;
  int seed = 0;
  for (int c = 0; c < classes; ++c) {
    for (int i = 0; i < per_class; ++i, ++seed) {
      const int w = 96 + 24 * (seed % 4), h = 72 + 16 * (seed % 3);
      const std::string name = "class_" + std::to_string(c) + "/img_" + std::to_string(i) + ".jpg";
      prestage::test::write_file(root / name, smooth_jpeg(w, h, seed));
      sizes[name] = {h, w};
    }
  }
  return sizes;
}

LoaderOptions gpu_options(uint64_t batch_size, uint64_t readers) {
  LoaderOptions o;
  o.batch_size = batch_size;
  o.seed = 5;
  o.readers = readers;
  o.prefetchers = 1;
  o.autotune = false;
  o.depth = 3;
  o.image_size = ImageSize{32, 40};
  o.transform = Transform::kRandomResizedCrop;
  o.decode_device = DecodeDevice::kCuda;
  o.gpu_cpu_share = 0.0;                    // all on the GPU unless a test says otherwise
  o.gpu_crop = prestage::GpuCrop::kResize;  // whole images, NPP crops (unless a test says)
  return o;
}

struct Delivered {
  std::vector<int64_t> indices;
  std::vector<uint8_t> pixels;  // the device batches (the doubles' device memory is host memory)
  size_t batches = 0;
};

Delivered run(Loader& loader, uint64_t epoch) {
  Delivered d;
  loader.start_epoch(epoch);
  while (auto batch = loader.next()) {
    ++d.batches;
    d.indices.insert(d.indices.end(), batch->indices().begin(), batch->indices().end());
    if (batch->device_data() == nullptr) {
      const auto* host = reinterpret_cast<const uint8_t*>(batch->data().data());
      d.pixels.insert(d.pixels.end(), host, host + batch->data().size());
      continue;
    }
    CHECK(batch->data().empty());
    CHECK(batch->device_ready() != nullptr);
    CHECK(batch->device_stream() != nullptr);
    const auto shape = batch->shape();
    CHECK(shape[0] == batch->size());
    CHECK(shape[1] == 32);
    CHECK(shape[2] == 40);
    CHECK(shape[3] == 3);
    const auto* p = static_cast<const uint8_t*>(batch->device_data());
    d.pixels.insert(d.pixels.end(), p, p + batch->size() * 32 * 40 * 3);
  }
  return d;
}

}  // namespace

TEST_CASE(
    "gpu loader: device batches with the CPU path's crop boxes and pixels; every stream, handle "
    "and buffer made once per slot and destroyed once") {
  for (uint64_t readers : {1, 2, 4}) {
    CAPTURE(readers);
    TempDir dir;
    const auto sizes = make_smooth_folder(dir / "data", 3, 6);  // 18 images: batches 4 4 4 4 2
    const Catalog cat = Catalog::from_folder(dir / "data");
    Fakes fakes(7);
    const auto before = fakes.objects();
    Delivered gpu[2], cpu[2];
    prestage::Stats stats;
    {
      Loader loader(cat, gpu_options(4, readers));
      gpu[0] = run(loader, 0);
      gpu[1] = run(loader, 1);
      loader.close();  // no batch is being decoded: the counters are final and consistent
      stats = loader.stats();
    }
    const auto after = fakes.objects();
    {
      LoaderOptions o = gpu_options(4, readers);
      o.decode_device = DecodeDevice::kCpu;
      Loader loader(cat, o);
      cpu[0] = run(loader, 0);
      cpu[1] = run(loader, 1);
      CHECK_FALSE(loader.stats().gpu_decode.on);
    }
    check_balanced(before, after);
    // One decoder per ring slot used, each with its stream, its two nvJPEG handles (hardware and
    // default backends), a JPEG stream per batch place, its output, flip and CPU buffers, and its
    // staging grown once (every batch fits the first growth).
    const size_t decoders = stats.gpu_decode.decoders;
    CHECK(decoders >= 1);
    CHECK(decoders <= 3);
    CHECK(created(before, after, kStream) == decoders);
    CHECK(created(before, after, kHandle) == 2 * decoders);
    CHECK(created(before, after, kState) == 2 * decoders);
    CHECK(created(before, after, kJpegStream) == 4 * decoders);
    CHECK(created(before, after, kDevice) == 3 * decoders);  // output, flip, decoded staging
    CHECK(created(before, after, kEvent) == 4 * decoders);   // ready, staged, two timing
    CHECK(stats.gpu_decode.buffer_growths == 2 * decoders);  // pinned input, device decoded
    CHECK(stats.gpu_decode.on);
    CHECK(stats.gpu_decode.hardware >= 36);
    CHECK(stats.gpu_decode.hardware == stats.decode.items);
    CHECK(stats.gpu_decode.gpu + stats.gpu_decode.cpu_share + stats.gpu_decode.cpu_unsupported +
              stats.gpu_decode.cpu_gpu_failed + stats.gpu_decode.cpu_replacements ==
          0);

    for (int e = 0; e < 2; ++e) {
      CAPTURE(e);
      REQUIRE(gpu[e].indices == cpu[e].indices);
      REQUIRE(gpu[e].pixels.size() == cpu[e].pixels.size());
      CHECK(gpu[e].batches == 5);
      const size_t image = 32 * 40 * 3;
      for (size_t i = 0; i < gpu[e].indices.size(); ++i) {
        CAPTURE(i);
        double total = 0;
        int worst = 0;
        for (size_t k = i * image; k < (i + 1) * image; ++k) {
          const int diff = std::abs(int{gpu[e].pixels[k]} - int{cpu[e].pixels[k]});
          total += diff;
          worst = std::max(worst, diff);
        }
        // gpu_jpeg_test's tolerance: the filters differ (the double's, Pillow's on the CPU).
        CHECK(total / image < 2.0);
        CHECK(worst <= 16);
      }
    }
    // Each delivered sample was resized from its RandomResizedCrop box (seed, epoch, sample).
    std::multiset<std::tuple<int, int, int, int>> got, expected;
    for (const ResizeRecord& r : fakes.resize_log()) got.insert({r.x, r.y, r.width, r.height});
    for (int e = 0; e < 2; ++e) {
      for (const int64_t id : gpu[e].indices) {
        const std::filesystem::path path = cat.source_path(static_cast<uint64_t>(id));
        const auto [h, w] = sizes.at((path.parent_path().filename() / path.filename()).string());
        const auto box =
            prestage::detail::random_resized_crop(5, e, static_cast<uint64_t>(id), h, w);
        expected.insert({box.left, box.top, box.width, box.height});
      }
    }
    // Batches decoded ahead of the consumer (the next epoch's) were resized too.
    CHECK(std::includes(got.begin(), got.end(), expected.begin(), expected.end()));
  }
}

TEST_CASE("gpu loader: files the GPU cannot take and the CPU share go to the CPU path, counted") {
  TempDir dir;
  // Not shuffled, batches of 4: every batch is base, progressive, CMYK, base (the CPU's share).
  for (int c = 0; c < 2; ++c) {
    const auto root = dir / "data" / ("class_" + std::to_string(c));
    prestage::test::write_file(root / "a.jpg", smooth_jpeg(120, 90, c));
    prestage::test::write_file(root / "b.jpg",
                               smooth_jpeg(120, 90, c + 1, TJSAMP_420, TJFLAG_PROGRESSIVE));
    prestage::test::write_file(root / "c.jpg",
                               smooth_jpeg(120, 90, c + 2, TJSAMP_444, 0, /*cmyk=*/true));
    prestage::test::write_file(root / "d.jpg", smooth_jpeg(120, 90, c + 3));
  }
  const Catalog cat = Catalog::from_folder(dir / "data");
  Fakes fakes(7);
  const auto before = fakes.objects();
  LoaderOptions o = gpu_options(4, 2);
  o.shuffle = false;
  o.gpu_cpu_share = 0.25;
  prestage::Stats stats;
  Delivered gpu, cpu;
  {
    Loader loader(cat, o);
    gpu = run(loader, 0);
    loader.close();
    stats = loader.stats();
  }
  check_balanced(before, fakes.objects());
  o.decode_device = DecodeDevice::kCpu;
  {
    Loader loader(cat, o);
    cpu = run(loader, 0);
  }
  REQUIRE(gpu.indices == cpu.indices);
  const auto& g = stats.gpu_decode;
  CHECK(g.batches >= 2);
  CHECK(g.hardware == g.batches);
  CHECK(g.gpu == g.batches);              // progressive: the hardware engine declines it
  CHECK(g.cpu_unsupported == g.batches);  // CMYK
  CHECK(g.cpu_share == g.batches);
  CHECK(g.cpu_gpu_failed == 0);
  // The CPU's samples are the CPU path's pixels exactly (positions 2 and 3 of each batch).
  const size_t image = 32 * 40 * 3;
  for (size_t i = 0; i < gpu.indices.size(); ++i) {
    if (i % 4 < 2) continue;
    CAPTURE(i);
    CHECK(std::equal(gpu.pixels.begin() + i * image, gpu.pixels.begin() + (i + 1) * image,
                     cpu.pixels.begin() + i * image));
  }
}

TEST_CASE("gpu loader: a corrupt JPEG raises the CPU path's error, or is replaced as it is") {
  TempDir dir;
  make_smooth_folder(dir / "data", 2, 5);
  prestage::test::write_file(dir / "data" / "class_1" / "img_2.jpg",
                             std::vector<unsigned char>{0xff, 0xd8, 0xff, 0xe0, 'n', 'o', 't'});
  const Catalog cat = Catalog::from_folder(dir / "data");
  Fakes fakes(0);  // no hardware engine: the default backend
  const auto before = fakes.objects();
  for (OnError policy : {OnError::kRaise, OnError::kSkip}) {
    CAPTURE(static_cast<int>(policy));
    std::vector<std::string> messages[2];
    std::vector<int64_t> indices[2];
    prestage::Stats stats[2];
    for (int device = 0; device < 2; ++device) {
      LoaderOptions o = gpu_options(3, 2);
      o.on_error = policy;
      o.decode_device = device == 0 ? DecodeDevice::kCpu : DecodeDevice::kCuda;
      Loader loader(cat, o);
      loader.start_epoch(0);
      for (;;) {
        try {
          auto batch = loader.next();
          if (!batch) break;
          indices[device].insert(indices[device].end(), batch->indices().begin(),
                                 batch->indices().end());
        } catch (const prestage::DecodeError& e) {
          messages[device].push_back(e.what());
        }
      }
      loader.close();
      stats[device] = loader.stats();
    }
    CHECK(indices[1] == indices[0]);
    CHECK(messages[1] == messages[0]);
    if (policy == OnError::kRaise) {
      CHECK(messages[1].size() == 1);
    } else {
      CHECK(messages[1].empty());
      CHECK(stats[1].skipped == 1);
      CHECK(stats[1].skipped_samples.at(0).error == stats[0].skipped_samples.at(0).error);
      CHECK(stats[1].gpu_decode.cpu_replacements >= 1);  // decoded by the CPU path
    }
    CHECK(stats[1].gpu_decode.cpu_unsupported >= 1);
  }
  check_balanced(before, fakes.objects());
}

TEST_CASE(
    "gpu loader: an NPP failure fails its batch with a prestage::Error; the next batches come") {
  TempDir dir;
  make_smooth_folder(dir / "data", 2, 6);
  const Catalog cat = Catalog::from_folder(dir / "data");
  Fakes fakes(7);
  const auto before = fakes.objects();
  {
    LoaderOptions o = gpu_options(4, 1);
    o.shuffle = false;
    fakes.npp_fail("nppiResize_8u_C3R_Ctx", 6, -1);  // in the second batch
    Loader loader(cat, o);
    loader.start_epoch(0);
    size_t good = 0, failed = 0;
    for (int k = 0; k < 3; ++k) {
      try {
        auto batch = loader.next();
        REQUIRE(batch);
        CHECK(batch->device_data() != nullptr);
        ++good;
      } catch (const prestage::DecodeError&) {
        FAIL("a GPU failure is not a sample's DecodeError");
      } catch (const prestage::Error&) {
        ++failed;
      }
    }
    CHECK(good == 2);
    CHECK(failed == 1);
  }
  check_balanced(before, fakes.objects());
}

TEST_CASE(
    "gpu loader: decode_device=cuda takes JPEG, an image_size, NHWC uint8, a share in [0, 1)") {
  TempDir dir;
  make_smooth_folder(dir / "data", 1, 2);
  const Catalog cat = Catalog::from_folder(dir / "data");
  LoaderOptions o = gpu_options(2, 1);
  CHECK_NOTHROW(o.validate());
  LoaderOptions bad = o;
  bad.image_size = ImageSize{};
  bad.transform = Transform::kCenterCrop;
  CHECK_THROWS_AS(Loader(cat, bad), ConfigError);
  bad = o;
  bad.layout = prestage::Layout::kNCHW;
  CHECK_THROWS_AS(Loader(cat, bad), ConfigError);
  bad = o;
  bad.dtype = prestage::OutputType::kFloat32;
  CHECK_THROWS_AS(Loader(cat, bad), ConfigError);
  bad = o;
  bad.decode = prestage::DecodeMode::kRaw;
  bad.image_size = ImageSize{};
  bad.transform = Transform::kCenterCrop;
  CHECK_THROWS_AS(Loader(cat, bad), ConfigError);
  for (double share : {-0.1, 1.0, 2.0}) {
    bad = o;
    bad.gpu_cpu_share = share;
    CHECK_THROWS_AS(Loader(cat, bad), ConfigError);
  }
}

namespace {

// Runs `epochs` epochs; the stats after them (the loader closed: no batch is being decoded).
prestage::Stats run_epochs(const Catalog& cat, const LoaderOptions& o, uint64_t epochs) {
  Loader loader(cat, o);
  for (uint64_t e = 0; e < epochs; ++e) run(loader, e);
  loader.close();
  return loader.stats();
}

}  // namespace

TEST_CASE(
    "gpu loader: the CPU share sized at run time settles where both parts take as long, from "
    "above (GPU 3x faster than the CPU) and from below (3x slower)") {
  TempDir dir;
  make_smooth_folder(dir / "data", 2, 32);  // 64 images: 4 batches of 16 per epoch
  const Catalog cat = Catalog::from_folder(dir / "data");
  Fakes fakes(7);
  const auto before = fakes.objects();
  LoaderOptions o = gpu_options(16, 4);
  // The CPU's wall time per image here, now: measured by the loader on a given half share.
  o.gpu_cpu_share = 0.5;
  const prestage::Stats calibration = run_epochs(cat, o, 2);
  const double cpu_ms = calibration.gpu_decode.cpu_ms_per_image;
  REQUIRE(cpu_ms > 0);
  o.gpu_cpu_share = LoaderOptions::kAutoShare;
  for (const double gpu_over_cpu : {1.0 / 3, 3.0}) {
    CAPTURE(gpu_over_cpu);
    // The double's GPU time is virtual and exact: this many ms per image on the GPU.
    const double gpu_ms = cpu_ms * gpu_over_cpu;
    fakes.image_ns(static_cast<uint64_t>(gpu_ms * 1e6));
    fakes.not_ready(3);  // the first batches' GPU times are known only at their slot's next batch
    const double start = Loader(cat, o).stats().gpu_decode.share;
    const prestage::Stats stats = run_epochs(cat, o, 10);
    const auto& g = stats.gpu_decode;
    MESSAGE("start " << start << ", now " << g.share << ": " << g.share_why);
    CHECK(g.share_auto);
    // The start (the prior with 4 readers) lies between the two balances.
    CHECK(start > 0.3);
    CHECK(start < 0.5);
    // The GPU time is the double's exactly, through the immediate and the deferred measurements.
    CHECK(g.gpu_ms_per_image == doctest::Approx(gpu_ms).epsilon(1e-3));
    // Settled at the balance of the times it measured, within the dead band and the smoothing's
    // last steps. The CPU's time is real, on a shared machine, so the balance is computed from the
    // CPU time the loader measured in this run, not from the calibration's.
    const double balance = g.gpu_ms_per_image / (g.gpu_ms_per_image + g.cpu_ms_per_image);
    CHECK(std::abs(g.share - balance) <= 0.06);
    // From above or from below: down when the GPU is faster, up when it is slower, wherever the
    // balance measured lies clearly on one side of the start (it does unless the machine's load
    // made the CPU several times slower than in the calibration: gpu_share_test shows both
    // directions on exact, simulated times).
    if (balance < start - 0.06) CHECK(g.share < start);
    if (balance > start + 0.06) CHECK(g.share > start);
    CHECK(g.share_moves >= 1);
    CHECK(g.cpu_share > 0);
    CHECK(g.hardware + g.cpu_share == stats.decode.items);
  }
  check_balanced(before, fakes.objects());
}

TEST_CASE(
    "gpu loader: a given share never moves, however the parts' times differ; sized at run time, "
    "nothing is allocated per image once warm") {
  TempDir dir;
  make_smooth_folder(dir / "data", 2, 16);  // 32 images: 2 batches of 16 per epoch
  const Catalog cat = Catalog::from_folder(dir / "data");
  Fakes fakes(7);
  const auto before = fakes.objects();
  for (const double given : {0.0, 0.25, 0.5}) {
    CAPTURE(given);
    LoaderOptions o = gpu_options(16, 2);
    o.gpu_cpu_share = given;
    fakes.image_ns(5'000'000);  // 5 ms per image on the GPU: far slower than the CPU
    const prestage::Stats stats = run_epochs(cat, o, 4);
    const auto& g = stats.gpu_decode;
    CHECK_FALSE(g.share_auto);
    CHECK(g.share == given);
    CHECK(g.share_moves == 0);
    CHECK(g.share_why.find("given") != std::string::npos);
    CHECK(g.cpu_share == static_cast<uint64_t>(std::llround(given * 16)) * g.batches);
    CHECK(g.gpu_ms_per_image == doctest::Approx(5.0).epsilon(1e-3));  // still measured
  }
  {
    LoaderOptions o = gpu_options(16, 2);
    o.gpu_cpu_share = LoaderOptions::kAutoShare;
    fakes.image_ns(200'000);
    const auto cold = fakes.objects();
    Loader loader(cat, o);
    for (uint64_t e = 0; e < 4; ++e) run(loader, e);  // the share settles, the buffers grow
    const auto warm = fakes.objects();
    const auto warm_stats = loader.stats().gpu_decode;
    for (uint64_t e = 4; e < 12; ++e) run(loader, e);
    loader.close();
    const auto& g = loader.stats().gpu_decode;
    CHECK(g.share_auto);
    // Whatever was made after the warm-up belongs to a decoder of a ring slot first used then
    // (each makes the same set, once): nothing per image or per batch.
    REQUIRE(warm_stats.decoders >= 1);
    const size_t per_decoder = prestage::test::created_since(cold, warm) / warm_stats.decoders;
    const uint64_t new_decoders = g.decoders - warm_stats.decoders;
    CHECK(prestage::test::created_since(warm, fakes.objects()) == per_decoder * new_decoders);
    CHECK(g.buffer_growths - warm_stats.buffer_growths ==
          warm_stats.buffer_growths / warm_stats.decoders * new_decoders);
  }
  check_balanced(before, fakes.objects());
}

TEST_CASE(
    "gpu loader: gpu_crop=auto keeps whichever way measures faster on the first batches; a way "
    "given is used throughout") {
  TempDir dir;
  make_smooth_folder(dir / "data", 2, 16);  // 32 images: 4 batches of 8 per epoch
  const Catalog cat = Catalog::from_folder(dir / "data");
  Fakes fakes(7);
  const auto before = fakes.objects();
  // Whole images take 1 ms each on the double's GPU; regions 0.4 or 2.5 ms.
  for (const uint64_t roi_ns : {400'000u, 2'500'000u}) {
    CAPTURE(roi_ns);
    fakes.image_ns(1'000'000);
    fakes.roi_image_ns(roi_ns);
    LoaderOptions o = gpu_options(8, 2);
    o.gpu_crop = prestage::GpuCrop::kAuto;
    const prestage::Stats stats = run_epochs(cat, o, 4);
    const auto& g = stats.gpu_decode;
    CAPTURE(g.crop_why);
    CHECK(g.crop == (roi_ns < 1'000'000 ? "roi" : "resize"));
    CHECK(g.crop_why.rfind("measured", 0) == 0);
    // At least the trials decoded regions; with regions kept, every batch after them too.
    CHECK(g.roi >= 8 * prestage::detail::GpuCropChoice::kTrials);
    if (roi_ns < 1'000'000) CHECK(g.roi >= g.hardware / 2);
    // Regions dropped: at most the timed trials, each decoder's untimed first batch of that way
    // (one decoder per ring slot: depth), and the batches begun before the choice was made (at
    // most one per slot).
    if (roi_ns > 1'000'000) {
      CHECK(g.roi <= 8 * (prestage::detail::GpuCropChoice::kTrials + 2 * o.depth));
    }
  }
  for (const auto given : {prestage::GpuCrop::kRoi, prestage::GpuCrop::kResize}) {
    LoaderOptions o = gpu_options(8, 2);
    o.gpu_crop = given;
    const prestage::Stats stats = run_epochs(cat, o, 2);
    const auto& g = stats.gpu_decode;
    CHECK(g.crop == (given == prestage::GpuCrop::kRoi ? "roi" : "resize"));
    CHECK(g.crop_why.rfind("given", 0) == 0);
    CHECK(g.hardware == stats.decode.items);
    CHECK(g.roi == (given == prestage::GpuCrop::kRoi ? g.hardware : 0));
  }
  {
    Fakes no_engine(0);
    LoaderOptions o = gpu_options(8, 2);
    o.gpu_crop = prestage::GpuCrop::kAuto;
    const prestage::Stats stats = run_epochs(cat, o, 1);
    CHECK(stats.gpu_decode.crop == "resize");
    CHECK(stats.gpu_decode.roi == 0);
  }
  check_balanced(before, fakes.objects());
}

TEST_CASE(
    "gpu loader: gpu_crop=auto's trials leave out each decoder's first batch of each way: a cold "
    "start does not decide") {
  TempDir dir;
  make_smooth_folder(dir / "data", 2, 24);  // 48 images: 6 batches of 8 per epoch
  const Catalog cat = Catalog::from_folder(dir / "data");
  Fakes fakes(7);
  // Regions are faster once warm (0.4 against 1 ms per image), but each decoder's first region
  // decode takes 100 ms more: with those batches as trials, resize would win.
  fakes.image_ns(1'000'000);
  fakes.roi_image_ns(400'000);
  fakes.first_roi_ns(100'000'000);
  LoaderOptions o = gpu_options(8, 2);
  o.depth = 6;  // the default: six decoders, each warming up on its first batch
  o.gpu_crop = prestage::GpuCrop::kAuto;
  const prestage::Stats stats = run_epochs(cat, o, 4);
  const auto& g = stats.gpu_decode;
  CAPTURE(g.crop_why);
  CHECK(g.crop == "roi");
  CHECK(g.crop_why.rfind("measured", 0) == 0);
}

TEST_CASE(
    "gpu loader: PRESTAGE_GPU_RESIZE=batch resizes each batch in one NPP call per "
    "interpolation, with the same pixels; another value is a ConfigError") {
  TempDir dir;
  make_smooth_folder(dir / "data", 2, 6);  // 12 images: batches 4 4 4
  const Catalog cat = Catalog::from_folder(dir / "data");
  Fakes fakes(7);
  Delivered each, batched;
  {
    Loader loader(cat, gpu_options(4, 2));
    fakes.npp_fail("", 0, 0);  // clears the records
    each = run(loader, 0);
    CHECK(fakes.npp_batches() == 0);
  }
  ::setenv("PRESTAGE_GPU_RESIZE", "batch", 1);
  {
    Loader loader(cat, gpu_options(4, 2));
    fakes.npp_fail("", 0, 0);
    batched = run(loader, 0);
    CHECK(fakes.npp_batches() >= 3);  // at least one call per batch
    CHECK(fakes.npp_batches() <= 6);  // at most one per interpolation and batch
  }
  ::setenv("PRESTAGE_GPU_RESIZE", "bulk", 1);
  CHECK_THROWS_WITH_AS(Loader(cat, gpu_options(4, 2)),
                       doctest::Contains("PRESTAGE_GPU_RESIZE must be 'each' or 'batch'"),
                       prestage::ConfigError);
  ::unsetenv("PRESTAGE_GPU_RESIZE");
  CHECK(each.indices == batched.indices);
  CHECK(each.pixels == batched.pixels);
  CHECK(each.batches == 3);
}
