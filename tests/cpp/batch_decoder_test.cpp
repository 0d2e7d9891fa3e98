// Stage 3's batch assembly through the loader: limits are kept for every codec, a batch's type is
// its samples' (an odd sample is the one named), and a failure inside the pipeline itself reaches
// the consumer instead of a wait for ever.
#include <doctest/doctest.h>

#include <oneapi/tbb/global_control.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "pipeline/graph.hpp"
#include "prestage/prestage.hpp"
#include "test_util.hpp"

using prestage::Catalog;
using prestage::DecodeMode;
using prestage::Loader;
using prestage::LoaderOptions;
using prestage::OnError;
using prestage::test::TempDir;

namespace {

// A 1-D .npy file of `count` elements of `descr` ("<f4" or "<i2"), every byte `fill`.
void write_npy(const std::filesystem::path& path, const std::string& descr, size_t count,
               unsigned char fill) {
  prestage::test::write_npy(path, descr, "(" + std::to_string(count) + ",)",
                            std::string(count * (descr == "<f4" ? 4 : 2), static_cast<char>(fill)));
}

LoaderOptions in_order(DecodeMode mode, uint64_t batch_size) {
  LoaderOptions o;
  o.decode = mode;
  o.batch_size = batch_size;
  o.shuffle = false;
  o.readers = 2;
  return o;
}

}  // namespace

TEST_CASE("batch decoder: a raw sample over max_sample_bytes is refused at its batch, or skipped") {
  TempDir dir;
  prestage::test::write_file(dir / "small", std::vector<unsigned char>(100, 1));
  prestage::test::write_file(dir / "large", std::vector<unsigned char>(5000, 2));
  prestage::test::write_file(dir / "other", std::vector<unsigned char>(100, 3));
  const Catalog cat = Catalog::from_paths(dir.path(), {"small", "large", "other"});
  LoaderOptions o = in_order(DecodeMode::kRaw, 1);
  o.max_sample_bytes = 1000;
  {
    Loader loader(cat, o);
    loader.start_epoch(0);
    CHECK(loader.next()->data().size() == 100);
    try {
      loader.next();
      FAIL("a 5000-byte sample was served under a limit of 1000");
    } catch (const prestage::DecodeError& e) {
      CHECK(e.path() == (dir / "large").string());
    }
    CHECK(loader.next()->data().size() == 100);
  }
  o.on_error = OnError::kSkip;
  Loader skipping(cat, o);
  skipping.start_epoch(0);
  skipping.next();
  const auto replaced = skipping.next();
  CHECK(replaced->indices()[0] == 2);
  CHECK(skipping.stats().skipped == 1);
}

TEST_CASE("batch decoder: the sample whose dtype differs from its batch's is the one named") {
  TempDir dir;
  write_npy(dir / "0.npy", "<f4", 3, 9);  // first in its batch, of another dtype than the rest
  for (int i = 1; i < 4; ++i) write_npy(dir / (std::to_string(i) + ".npy"), "<i2", 3, i);
  const Catalog cat = Catalog::from_paths(dir.path(), {"0.npy", "1.npy", "2.npy", "3.npy"});
  for (const size_t readers : {1, 2, 4}) {
    CAPTURE(readers);
    LoaderOptions o = in_order(DecodeMode::kNpy, 4);
    o.readers = readers;
    {
      Loader loader(cat, o);
      loader.start_epoch(0);
      try {
        loader.next();
        FAIL("a batch of two dtypes was served");
      } catch (const prestage::DecodeError& e) {
        CHECK(e.path() == (dir / "0.npy").string());
      }
    }
    o.on_error = OnError::kSkip;
    Loader loader(cat, o);
    loader.start_epoch(0);
    const auto batch = loader.next();
    REQUIRE(batch);
    CHECK(batch->dtype() == "<i2");
    CHECK(std::vector<int64_t>(batch->indices().begin(), batch->indices().end()) ==
          std::vector<int64_t>{1, 1, 2, 3});
    CHECK(loader.stats().skipped == 1);
  }
}

TEST_CASE(
    "batch decoder: the dtype is the data set's, so an odd file first in a tied batch is named") {
  // Batches of 2 over [odd, good, good, good]: the batch's own majority is a tie, which went to the
  // first sample, so the good file after it was named and skip replaced it.
  TempDir dir;
  write_npy(dir / "0.npy", "<f4", 3, 9);
  for (int i = 1; i < 4; ++i) write_npy(dir / (std::to_string(i) + ".npy"), "<i2", 3, i);
  const Catalog cat = Catalog::from_paths(dir.path(), {"0.npy", "1.npy", "2.npy", "3.npy"});
  for (const size_t readers : {1, 2, 4}) {
    CAPTURE(readers);
    LoaderOptions o = in_order(DecodeMode::kNpy, 2);
    o.readers = readers;
    {
      Loader loader(cat, o);
      loader.start_epoch(0);
      try {
        loader.next();
        FAIL("a batch of two dtypes was served");
      } catch (const prestage::DecodeError& e) {
        CHECK(e.path() == (dir / "0.npy").string());
      }
      const auto second = loader.next();
      REQUIRE(second);
      CHECK(second->dtype() == "<i2");
    }
    o.on_error = OnError::kSkip;
    Loader loader(cat, o);
    loader.start_epoch(0);
    const auto batch = loader.next();
    REQUIRE(batch);
    CHECK(batch->dtype() == "<i2");
    CHECK(std::vector<int64_t>(batch->indices().begin(), batch->indices().end()) ==
          std::vector<int64_t>{1, 1});
    CHECK(loader.stats().skipped == 1);
  }
}

TEST_CASE("batch decoder: JPEGs of mixed sizes without image_size are ragged, each its own shape") {
  TempDir dir;
  // (width, height): batch 0 mixes two sizes, batch 1 has one, batch 2 is a single image.
  const std::vector<std::pair<int, int>> sizes = {{16, 8}, {10, 21}, {16, 8}, {16, 8}, {33, 7}};
  std::vector<std::string> names;
  for (size_t i = 0; i < sizes.size(); ++i) {
    names.push_back(std::to_string(i) + ".jpg");
    prestage::test::write_jpeg(dir / names.back(), sizes[i].first, sizes[i].second,
                               static_cast<uint32_t>(i));
  }
  const Catalog cat = Catalog::from_paths(dir.path(), names);
  for (const auto layout : {prestage::Layout::kNHWC, prestage::Layout::kNCHW}) {
    for (const size_t readers : {1, 2, 4}) {
      CAPTURE(readers);
      LoaderOptions o = in_order(DecodeMode::kJpeg, 2);
      o.readers = readers;
      o.layout = layout;
      Loader loader(cat, o);
      CHECK(loader.image_size().empty());
      loader.start_epoch(0);
      size_t sample = 0;
      for (const bool ragged : {true, false, false}) {
        const auto batch = loader.next();
        REQUIRE(batch);
        CHECK(batch->ragged() == ragged);
        const auto offsets = batch->offsets();
        REQUIRE(offsets.size() == batch->size() + 1);
        for (size_t k = 0; k < batch->size(); ++k, ++sample) {
          const auto [w, h] = sizes[sample];
          const std::vector<uint64_t> shape =
              layout == prestage::Layout::kNHWC
                  ? std::vector<uint64_t>{uint64_t(h), uint64_t(w), 3}
                  : std::vector<uint64_t>{3, uint64_t(h), uint64_t(w)};
          const auto got = batch->sample_shape(k);
          CHECK(std::vector<uint64_t>(got.begin(), got.end()) == shape);
          // Back to back: each image's pixels at its own offset, in the batch's layout.
          const std::vector<uint8_t> rgb =
              prestage::test::decode_with_turbojpeg(dir / names[sample]);
          REQUIRE(offsets[k + 1] - offsets[k] == rgb.size());
          const auto* data = reinterpret_cast<const uint8_t*>(batch->data().data()) + offsets[k];
          size_t wrong = 0;
          for (size_t p = 0; p < size_t(w) * h; ++p) {
            for (size_t c = 0; c < 3; ++c) {
              const uint8_t v =
                  layout == prestage::Layout::kNHWC ? data[p * 3 + c] : data[c * size_t(w) * h + p];
              wrong += v != rgb[p * 3 + c];
            }
          }
          CHECK(wrong == 0);
        }
        if (!ragged) {
          const auto [w, h] = sizes[sample - 1];
          const auto shape = batch->shape();
          CHECK(shape[0] == batch->size());
          CHECK(batch->data().size() == batch->size() * size_t(w) * h * 3);
        }
      }
      CHECK(sample == sizes.size());
      CHECK_FALSE(loader.next());
    }
  }
}

TEST_CASE("pipeline: a broken invariant inside a node is raised at pop, not waited on for ever") {
  TempDir dir;
  for (const char* name : {"a", "b", "c", "d"}) {
    prestage::test::write_file(dir / name, std::vector<unsigned char>(10, 7));
  }
  const Catalog cat = Catalog::from_paths(dir.path(), {"a", "b", "c", "d"});
  LoaderOptions o = in_order(DecodeMode::kRaw, 1);
  o.depth = 2;
  namespace detail = prestage::detail;
  detail::Shared shared(cat, o, o.readers, o.lookahead);
  shared.codec = detail::Codec::choose(shared.catalog, shared.options);
  shared.tiers = std::make_unique<detail::Tiers>(shared.catalog, nullptr, UINT64_MAX);
  shared.decoder = std::make_unique<detail::BatchDecoder>(shared.options, shared.options, o.readers,
                                                          shared.codec, prestage::ImageSize{},
                                                          nullptr, *shared.tiers);
  shared.stager = std::make_unique<detail::Stager>(*shared.tiers, 0);
  // One buffer where the pipeline counts on `depth` of them: the second batch's decode finds none
  // free (the ring's logic_error, as a limiter out of step would raise).
  auto ring = std::make_shared<detail::BatchRing>(1, 1, 0, DecodeMode::kRaw);
  detail::Pipeline pipeline(shared, ring, 0, 0);
  // The first batch takes the one buffer and is held here; the second's decode then fails.
  std::vector<detail::Slot*> delivered;
  bool raised = false;
  const auto start = std::chrono::steady_clock::now();
  for (int k = 0; k < 3 && !raised; ++k) {
    try {
      detail::Slot* slot = pipeline.pop(std::chrono::seconds(20));
      REQUIRE(slot != nullptr);  // never a silent wait
      delivered.push_back(slot);
    } catch (const std::logic_error&) {
      raised = true;
    }
  }
  CHECK(raised);
  CHECK(delivered.size() <= 1);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
  CHECK_THROWS_AS(pipeline.pop(std::chrono::seconds(1)), std::logic_error);  // and again
  for (detail::Slot* slot : delivered) ring->release(slot);
}

TEST_CASE("pipeline: lookahead and decode concurrency change while batches flow; none is lost") {
  TempDir dir;
  std::vector<std::string> names;
  for (int i = 0; i < 48; ++i) {
    names.push_back("f" + std::to_string(i));
    prestage::test::write_file(dir / names.back(),
                               std::vector<unsigned char>(16, static_cast<unsigned char>(i)));
  }
  const Catalog cat = Catalog::from_paths(dir.path(), names);
  LoaderOptions o = in_order(DecodeMode::kRaw, 2);
  o.lookahead = 2;
  o.depth = 3;
  namespace detail = prestage::detail;
  // The arena and the window sized for 4 decode threads and a lookahead of 8.
  const tbb::global_control workers(tbb::global_control::max_allowed_parallelism, 5);
  detail::Shared shared(cat, o, 4, 8);
  shared.codec = detail::Codec::choose(shared.catalog, shared.options);
  shared.tiers = std::make_unique<detail::Tiers>(shared.catalog, nullptr, UINT64_MAX);
  shared.decoder = std::make_unique<detail::BatchDecoder>(shared.options, shared.options, o.readers,
                                                          shared.codec, prestage::ImageSize{},
                                                          nullptr, *shared.tiers);
  shared.stager = std::make_unique<detail::Stager>(*shared.tiers, 0);
  shared.decoder->set_concurrency(2);
  shared.arena.initialize();
  auto ring = std::make_shared<detail::BatchRing>(o.depth, o.batch_size, 0, DecodeMode::kRaw);
  {
    detail::Pipeline pipeline(shared, ring, 0, 0);
    const uint64_t lookaheads[] = {8, 1, 5, 2, 8, 3, 1};
    const uint64_t decoders[] = {1, detail::Gate::kOpen, 3, 1, 4, 2};
    // Two epochs of 24 batches, in order, each sample its own bytes.
    for (uint64_t n = 0; n < 48; ++n) {
      if (n % 3 == 0) pipeline.set_lookahead(lookaheads[(n / 3) % 7]);
      if (n % 4 == 1) shared.decoder->set_concurrency(decoders[(n / 4) % 6]);
      detail::Slot* slot = pipeline.pop(std::chrono::seconds(60));
      REQUIRE(slot != nullptr);
      CHECK(slot->epoch == n / 24);
      CHECK(slot->index == n % 24);
      REQUIRE(slot->indices.size() == 2);
      for (size_t k = 0; k < 2; ++k) {
        CHECK(slot->indices[k] == static_cast<int64_t>((n % 24) * 2 + k));
        const auto* bytes =
            reinterpret_cast<const unsigned char*>(slot->data.data()) + slot->offsets[k];
        CHECK(bytes[0] == static_cast<unsigned char>(slot->indices[k]));
      }
      ring->release(slot);
    }
  }
  shared.arena.terminate();
}
