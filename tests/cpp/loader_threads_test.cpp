// Which calls of one Loader may run at once (loader.hpp, "Thread safety"): stats() and close() from
// other threads while one waits in next(); close() from several threads and the destructor; next()
// from several threads, served one at a time.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "prestage/prestage.hpp"
#include "test_util.hpp"

using prestage::Catalog;
using prestage::Loader;
using prestage::LoaderOptions;
using prestage::Stats;
using prestage::test::stalled_third;
using prestage::test::TempDir;
using Clock = std::chrono::steady_clock;

namespace {

LoaderOptions stalling_options(uint64_t threads, const std::string& stage_dir) {
  LoaderOptions o;
  o.batch_size = 2;
  o.shuffle = false;
  o.stage_dir = stage_dir;
  o.prefetchers = threads;
  o.readers = threads;
  // With batches of 2 and no shuffle, the consumer's second batch waits on the stalled file, whose
  // read outlasts the test unless the loader stops.
  o.io_timeout_ms = 600'000;
  o.stage_patience_ms = LoaderOptions::kWaitForStaging;  // with a stage directory: stage 2 stalls
  return o;
}

enum class Outcome { kBatch, kEndOfEpoch, kClosed, kOtherError };

Outcome next_outcome(Loader& loader) {
  try {
    return loader.next() ? Outcome::kBatch : Outcome::kEndOfEpoch;
  } catch (const prestage::ConfigError&) {
    return Outcome::kClosed;
  } catch (...) {
    return Outcome::kOtherError;
  }
}

// The result of `f`, which must come within `limit`: a thread that hangs cannot be joined, so the
// test program ends there.
template <typename T>
T within(std::future<T>& f, std::chrono::seconds limit, const char* what) {
  if (f.wait_for(limit) != std::future_status::ready) {
    std::cout << std::flush;  // the failures reported so far
    std::fprintf(stderr, "loader_threads_test: %s hung\n", what);
    std::_Exit(1);
  }
  return f.get();
}

// Calls stats() without pause until `stop`; true if every figure was as `sane` says.
template <typename Check>
std::future<bool> watch_stats(const Loader& loader, const std::atomic<bool>& stop, Check sane) {
  return std::async(std::launch::async, [&loader, &stop, sane] {
    bool ok = true;
    while (!stop.load()) ok = sane(loader.stats()) && ok;
    return ok;
  });
}

}  // namespace

TEST_CASE("loader threads: close() from another thread wakes a waiting next(); stats() meanwhile") {
  TempDir dir;
  prestage::test::make_image_folder(dir / "data", 1, 5);
  const prestage::test::StalledFile stalled(dir / "data/class_0/stalled.jpg");
  const Catalog cat = stalled_third(dir);
  for (const bool staged : {true, false}) {
    for (const uint64_t threads : {1, 2, 4}) {
      CAPTURE(staged);
      CAPTURE(threads);
      // Stage 2 (with a stage directory) or stage 3 (without) is stuck in the second batch's read.
      const std::string stage_dir =
          staged ? (dir / ("stage" + std::to_string(threads))).string() : std::string();
      Loader loader(cat, stalling_options(threads, stage_dir));
      loader.start_epoch(0);
      REQUIRE(loader.next().has_value());
      const Stats first = loader.stats();
      REQUIRE(first.batches == 1);
      REQUIRE(first.samples == 2);

      auto waiter = std::async(std::launch::async, [&] { return next_outcome(loader); });
      std::atomic<bool> stop{false};
      auto watcher = watch_stats(loader, stop, [](const Stats& s) {
        return s.batches == 1 && s.samples == 2 && s.consumer_stall_s >= 0;
      });
      // The wait under way counts in the consumer's stall as it goes.
      double stall = first.consumer_stall_s;
      for (const auto give_up = Clock::now() + std::chrono::seconds(5);
           stall < first.consumer_stall_s + 0.1 && Clock::now() < give_up;) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        stall = loader.stats().consumer_stall_s;
      }
      CHECK(stall >= first.consumer_stall_s + 0.1);
      REQUIRE(waiter.wait_for(std::chrono::seconds(0)) == std::future_status::timeout);

      const auto closing = Clock::now();
      loader.close();
      CHECK(within(waiter, std::chrono::seconds(10), "next() after close()") == Outcome::kClosed);
      CHECK(Clock::now() - closing < std::chrono::seconds(5));
      stop = true;
      CHECK(within(watcher, std::chrono::seconds(10), "stats()"));
      CHECK_THROWS_AS(loader.next(), prestage::ConfigError);
      const Stats last = loader.stats();
      CHECK(last.batches == 1);
      CHECK(last.consumer_stall_s >= stall);
    }
  }
}

TEST_CASE("loader threads: close() from two threads at once, and racing the destructor") {
  TempDir dir;
  prestage::test::make_image_folder(dir / "data", 1, 5);
  const prestage::test::StalledFile stalled(dir / "data/class_0/stalled.jpg");
  const Catalog cat = stalled_third(dir);
  for (const uint64_t threads : {1, 2, 4}) {
    CAPTURE(threads);
    for (const bool two_closers : {true, false}) {
      CAPTURE(two_closers);
      auto loader = std::make_unique<Loader>(cat, stalling_options(threads, ""));
      Loader* const raw = loader.get();
      raw->start_epoch(0);
      REQUIRE(raw->next().has_value());
      auto waiter = std::async(std::launch::async, [raw] { return next_outcome(*raw); });
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      std::vector<std::future<void>> closers;
      closers.push_back(std::async(std::launch::async, [raw] { raw->close(); }));
      if (two_closers) closers.push_back(std::async(std::launch::async, [raw] { raw->close(); }));
      CHECK(within(waiter, std::chrono::seconds(10), "next() after close()") == Outcome::kClosed);
      if (!two_closers) {
        // The waiter woke: the one close() is under way or done, and the destructor's own close()
        // waits for it.
        loader.reset();
      }
      for (auto& closer : closers) within(closer, std::chrono::seconds(10), "close()");
    }
  }
}

TEST_CASE("loader threads: next() from several threads gives each batch once, in plan order") {
  TempDir dir;
  prestage::test::make_image_folder(dir / "data", 2, 20);
  const Catalog cat = Catalog::from_folder(dir / "data");
  for (const uint64_t threads : {1, 2, 4}) {
    CAPTURE(threads);
    LoaderOptions o;
    o.batch_size = 2;
    o.readers = threads;
    o.prefetchers = threads;
    o.depth = 4;  // each consumer holds at most one batch while it asks for the next
    Loader loader(cat, o);
    loader.start_epoch(0);
    std::atomic<bool> stop{false};
    // Every batch has 2 samples: a count of batches and samples read apart from each other shows.
    auto watcher =
        watch_stats(loader, stop, [](const Stats& s) { return s.samples == 2 * s.batches; });
    const auto consume = [&] {
      std::vector<uint64_t> seen;
      try {
        while (auto batch = loader.next()) seen.push_back(batch->index());
      } catch (...) {
        seen.push_back(UINT64_MAX);
      }
      return seen;
    };
    std::vector<std::future<std::vector<uint64_t>>> consumers;
    for (int c = 0; c < 3; ++c) consumers.push_back(std::async(std::launch::async, consume));
    std::vector<int> delivered(loader.batches_per_epoch(), 0);
    for (auto& consumer : consumers) {
      const std::vector<uint64_t> seen = within(consumer, std::chrono::seconds(60), "next()");
      for (size_t k = 0; k < seen.size(); ++k) {
        REQUIRE(seen[k] < delivered.size());
        if (k > 0) CHECK(seen[k - 1] < seen[k]);
        ++delivered[seen[k]];
      }
    }
    for (const int count : delivered) CHECK(count == 1);
    stop = true;
    CHECK(within(watcher, std::chrono::seconds(10), "stats()"));
    CHECK(loader.stats().batches == loader.batches_per_epoch());
  }
}
