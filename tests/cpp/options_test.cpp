#include <doctest/doctest.h>

#include <string>
#include <type_traits>

#include "prestage/prestage.hpp"
#include "test_util.hpp"

using prestage::Catalog;
using prestage::ConfigError;
using prestage::Loader;
using prestage::LoaderDecodeOptions;
using prestage::LoaderIoOptions;
using prestage::LoaderOptions;
using prestage::LoaderPeerOptions;
using prestage::LoaderPlanOptions;
using prestage::LoaderStagingOptions;
using prestage::LoaderTuningOptions;
using prestage::test::run_epoch;
using prestage::test::TempDir;

namespace {

// Each part of the options holds one concern, and every option keeps its flat spelling.
static_assert(std::is_base_of_v<LoaderPlanOptions, LoaderOptions>);
static_assert(std::is_base_of_v<LoaderStagingOptions, LoaderOptions>);
static_assert(std::is_base_of_v<LoaderDecodeOptions, LoaderOptions>);
static_assert(std::is_base_of_v<LoaderTuningOptions, LoaderOptions>);
static_assert(std::is_base_of_v<LoaderPeerOptions, LoaderOptions>);
static_assert(std::is_base_of_v<LoaderIoOptions, LoaderOptions>);
static_assert(std::is_same_v<decltype(&LoaderOptions::batch_size), uint64_t LoaderPlanOptions::*>);
static_assert(LoaderOptions::kAuto == LoaderTuningOptions::kAuto);
static_assert(LoaderOptions::kWaitForStaging == LoaderStagingOptions::kWaitForStaging);

int g_comm = 0;  // stands for an MPI_Comm: never read with the peer tier off

// The catalog every_part_given() is made for: 16 images of two classes, in a folder of its own.
struct SixteenImages {
  TempDir dir;
  Catalog catalog = make(dir);

  static Catalog make(const TempDir& dir) {
    prestage::test::make_image_folder(dir / "data", 2, 8);
    return Catalog::from_folder(dir / "data");
  }
};

// Options with a value other than the default in each part (the knobs `auto_knobs` left to the
// machine), for a catalog of 16 images of two classes.
LoaderOptions every_part_given(const TempDir& dir, bool auto_knobs) {
  LoaderOptions o;
  // Plan: rank 1 of 2, resumed a little into epoch 0.
  o.batch_size = 2;
  o.shuffle = false;
  o.seed = 11;
  o.drop_last = true;
  o.rank = 1;
  o.world_size = 2;
  o.resume.epoch = 0;
  o.resume.consumed = {{0, 4}};
  // Staging.
  o.stage_dir = (dir / "stage").string();
  o.cache_bytes = uint64_t{1} << 30;
  o.eviction = prestage::Eviction::kLru;
  o.stage_patience_ms = 7;
  // Decode.
  o.image_size = {8, 12};
  o.on_error = prestage::OnError::kSkip;
  o.max_pixels = uint64_t{1} << 24;
  o.transform = prestage::Transform::kRandomResizedCrop;
  o.layout = prestage::Layout::kNCHW;
  o.dtype = prestage::OutputType::kFloat32;
  o.mean[0] = 0.5f, o.mean[1] = 0.4f, o.mean[2] = 0.3f;
  o.stddev[0] = 0.2f, o.stddev[1] = 0.25f, o.stddev[2] = 0.3f;
  o.gpu_cpu_share = 0.25;
  o.gpu_crop = prestage::GpuCrop::kRoi;
  o.max_sample_bytes = uint64_t{1} << 20;
  // Tuning.
  o.readers = 2;
  o.prefetchers = auto_knobs ? LoaderOptions::kAuto : 3;
  o.lookahead = auto_knobs ? LoaderOptions::kAuto : 5;
  o.autotune = true;
  o.memory_budget = uint64_t{64} << 20;
  o.depth = 3;
  // Peers (the tier off: its other options are kept, unused).
  o.peer_timeout_ms = 250;
  o.pfs_reads = prestage::PfsReads::kFewest;
  o.peer_comm = &g_comm;
  o.peer_comm_fortran = 7;
  // I/O.
  o.io_timeout_ms = 60'000;
  o.trace = (dir / "trace.bin").string();
  return o;
}

// Each part compared on its own first, so that a failure names the part.
void check_same(const LoaderOptions& got, const LoaderOptions& want) {
  CHECK(static_cast<const LoaderPlanOptions&>(got) == want);
  CHECK(static_cast<const LoaderStagingOptions&>(got) == want);
  CHECK(static_cast<const LoaderDecodeOptions&>(got) == want);
  CHECK(static_cast<const LoaderTuningOptions&>(got) == want);
  CHECK(static_cast<const LoaderPeerOptions&>(got) == want);
  CHECK(static_cast<const LoaderIoOptions&>(got) == want);
  CHECK(got == want);
}

}  // namespace

TEST_CASE("options: Loader::options() is what was given, plus the machine's values for kAuto") {
  const SixteenImages set;
  const LoaderOptions given = every_part_given(set.dir, true);
  Loader loader(set.catalog, given);
  const LoaderOptions& got = loader.options();
  // The machine sizing filled the knobs left to it, and only those.
  CHECK(got.prefetchers != LoaderOptions::kAuto);
  CHECK(got.lookahead != LoaderOptions::kAuto);
  LoaderOptions want = given;
  want.prefetchers = got.prefetchers;
  want.lookahead = got.lookahead;
  check_same(got, want);
  // Running (stage 2 and 3, the self-tuning) changes none of them either.
  const uint64_t delivered = run_epoch(loader, 0).sizes.size();
  CHECK(delivered == loader.batches_in_epoch(0));
  run_epoch(loader, 1);
  check_same(loader.options(), want);
  loader.close();
  check_same(loader.options(), want);
}

TEST_CASE("options: with every knob given, Loader::options() is exactly what was given") {
  const SixteenImages set;
  const LoaderOptions given = every_part_given(set.dir, false);
  Loader loader(set.catalog, given);
  check_same(loader.options(), given);
  run_epoch(loader, 0);
  check_same(loader.options(), given);
}

TEST_CASE("options: each part's validate() finds the part's faults, as LoaderOptions::validate()") {
  const auto message = [](const auto& options) -> std::string {
    try {
      options.validate();
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  LoaderOptions whole;
  CHECK(message(whole).empty());
  SUBCASE("plan") {
    whole.rank = 2;
    CHECK_THROWS_AS(static_cast<const LoaderPlanOptions&>(whole).validate(), ConfigError);
    CHECK(message(static_cast<const LoaderPlanOptions&>(whole)) == message(whole));
  }
  SUBCASE("decode") {
    whole.decode = prestage::DecodeMode::kRaw;
    whole.raw_shape = std::vector<int64_t>{4};
    CHECK_THROWS_AS(static_cast<const LoaderDecodeOptions&>(whole).validate(), ConfigError);
    CHECK(message(static_cast<const LoaderDecodeOptions&>(whole)) == message(whole));
  }
  SUBCASE("tuning") {
    whole.depth = 1;
    CHECK_THROWS_AS(static_cast<const LoaderTuningOptions&>(whole).validate(), ConfigError);
    CHECK(message(static_cast<const LoaderTuningOptions&>(whole)) == message(whole));
  }
  SUBCASE("peers") {
    whole.peers = true;
    whole.peer_timeout_ms = 0;
    CHECK_THROWS_AS(static_cast<const LoaderPeerOptions&>(whole).validate(), ConfigError);
    CHECK(message(static_cast<const LoaderPeerOptions&>(whole)) == message(whole));
  }
  // Every value of these two parts is valid: their files are checked when the loader opens them.
  CHECK_NOTHROW(static_cast<const LoaderStagingOptions&>(whole).validate());
  CHECK_NOTHROW(static_cast<const LoaderIoOptions&>(whole).validate());
}
