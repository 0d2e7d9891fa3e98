// The choice of a source per read (tiers/source_model.hpp) on fixed estimates: the PFS when peers
// are slower, a peer when faster, reads moved once a queue builds, probes, peers down; and the
// estimates' fit of latency and bandwidth.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

#include "tiers/source_model.hpp"

using prestage::detail::choose_source;
using prestage::detail::expected_finish_s;
using prestage::detail::ModelParams;
using prestage::detail::observe;
using prestage::detail::SourceEstimate;
using prestage::detail::SourceModel;

namespace {

constexpr uint64_t kMB = 1000 * 1000;

// An estimate learned from `n` reads of each size in `sizes`, each taking latency + size /
// bandwidth.
SourceEstimate learned(double latency_s, double bytes_per_s, std::vector<uint64_t> sizes, int n = 8,
                       bool probe = true) {
  SourceEstimate e;
  e.probe = probe;
  e.next_probe = ~uint64_t{0};  // no probe due
  for (int i = 0; i < n; ++i) {
    for (const uint64_t b : sizes) {
      e = observe(e, b, latency_s + static_cast<double>(b) / bytes_per_s, ModelParams{});
    }
  }
  return e;
}

// Choice 1 of a run: not a probe's turn (probe_every divides 0).
constexpr uint64_t kNotProbe = 1;

}  // namespace

TEST_CASE("the fit recovers latency and bandwidth from reads of two sizes") {
  const SourceEstimate e = learned(0.002, 100.0 * kMB, {100'000, 1 * kMB});
  CHECK(e.latency_s() == doctest::Approx(0.002).epsilon(1e-6));
  CHECK(e.bytes_per_s() == doctest::Approx(100.0 * kMB).epsilon(1e-6));
  CHECK(expected_finish_s(e, 2 * kMB) == doctest::Approx(0.002 + 0.02).epsilon(1e-6));
  // Reads all of one size: their whole time on the bandwidth.
  const SourceEstimate one = learned(0.002, 100.0 * kMB, {1 * kMB});
  CHECK(one.latency_s() == 0);
  CHECK(one.bytes_per_s() == doctest::Approx(kMB / 0.012).epsilon(1e-6));
  // Nothing learned: expected never to finish.
  CHECK(std::isinf(expected_finish_s(SourceEstimate{}, 1)));
}

TEST_CASE("a queue counts: the bytes queued at a source are read before a new one") {
  SourceEstimate e = learned(0.001, 50.0 * kMB, {10'000, 1 * kMB});
  const double idle = expected_finish_s(e, kMB);
  e.queued_bytes = 4 * kMB;
  e.queued = 4;
  CHECK(expected_finish_s(e, kMB) == doctest::Approx(idle + 4 * kMB / (50.0 * kMB)).epsilon(1e-6));
}

TEST_CASE("the PFS when the peer is slower, the peer when it is faster") {
  const ModelParams p;
  const SourceEstimate pfs = learned(0.005, 200.0 * kMB, {50'000, 200'000}, 8, false);
  const std::array<uint64_t, 2> bytes{100'000, 100'000};  // {peer, PFS}
  // A slow link: 2 ms and 10 MB/s -> 12 ms for 100 kB against the PFS's 5.5 ms.
  const SourceEstimate slow = learned(0.002, 10.0 * kMB, {50'000, 200'000});
  CHECK(choose_source(std::array{slow, pfs}, bytes, kNotProbe, p) == 1);
  // A fast link: 0.1 ms and 1 GB/s.
  const SourceEstimate fast = learned(0.0001, 1000.0 * kMB, {50'000, 200'000});
  CHECK(choose_source(std::array{fast, pfs}, bytes, kNotProbe, p) == 0);
  // Where the fast link must move far more bytes (10 MB against 100 kB), it is slower.
  const std::array<uint64_t, 2> packed{10 * kMB, 100'000};
  CHECK(choose_source(std::array{fast, pfs}, packed, kNotProbe, p) == 1);
  // Equal expectations: the nearer source (listed first).
  CHECK(choose_source(std::array{pfs, pfs}, bytes, kNotProbe, p) == 0);
}

TEST_CASE("reads move to the PFS as the peer's queue builds, and back as it drains") {
  SourceModel model(2);
  const size_t peer = SourceModel::kPeer0 + 1;
  // Learned: the peer 100 MB/s, the PFS 50 MB/s, no latency; 1 MB reads.
  for (int i = 0; i < 8; ++i) {
    model.begin(peer, kMB);
    model.done(peer, kMB, 0.01, true);
    model.begin(SourceModel::kPfs, kMB);
    model.done(SourceModel::kPfs, kMB, 0.02, true);
  }
  const std::array<size_t, 2> sources{peer, SourceModel::kPfs};
  const std::array<uint64_t, 2> bytes{kMB, kMB};
  std::vector<size_t> chosen;
  for (int i = 0; i < 6; ++i) chosen.push_back(model.choose(sources, bytes).read);
  // Expected finish, queue counted: peer 10, 20, 30 ms; PFS 20, 40 ms: ties to the peer (first).
  CHECK(chosen ==
        std::vector<size_t>{peer, peer, SourceModel::kPfs, peer, peer, SourceModel::kPfs});
  CHECK(model.moved_to_pfs() == 2);
  // Drained (their times as learned): the next read goes to the peer again.
  for (const size_t s : chosen) model.done(s, kMB, s == peer ? 0.01 : 0.02, true);
  CHECK(model.choose(sources, bytes).read == peer);
}

TEST_CASE("probes: a new source is tried until it has an estimate, then when it is due") {
  ModelParams p;
  p.min_samples = 3;
  const SourceEstimate pfs = learned(0.001, 500.0 * kMB, {50'000, 200'000}, 8, false);
  const std::array<uint64_t, 2> bytes{100'000, 100'000};
  // Nothing learned of the peer: chosen whatever the PFS's estimate.
  SourceEstimate peer;
  bool probed = false;
  for (uint64_t k = 0; k < 3; ++k) {
    CHECK(choose_source(std::array{peer, pfs}, bytes, k, p, &probed) == 0);
    CHECK(probed);
    peer = observe(peer, 100'000, 0.5, p);  // slow
  }
  // Learned and slower: the PFS until the peer is due (its next_probe), then the peer.
  peer.next_probe = 4;
  std::vector<size_t> picks;
  for (uint64_t choice = 1; choice <= 6; ++choice) {
    picks.push_back(choose_source(std::array{peer, pfs}, bytes, choice, p, &probed));
    CHECK(probed == (picks.back() == 0));
  }
  CHECK(picks == std::vector<size_t>{1, 1, 1, 0, 0, 0});
  // The PFS is never probed: a faster peer gets every read.
  const SourceEstimate fast = learned(0.0001, 1000.0 * kMB, {50'000, 200'000});
  for (uint64_t choice = 0; choice < 8; ++choice) {
    CHECK(choose_source(std::array{fast, pfs}, bytes, choice, p) == 0);
  }
}

TEST_CASE("a slower peer is probed ever more rarely, and never on a read's path") {
  SourceModel model(2);
  const size_t peer = SourceModel::kPeer0;
  for (int i = 0; i < 8; ++i) {
    model.begin(SourceModel::kPfs, kMB);
    model.done(SourceModel::kPfs, kMB, 0.01, true);
  }
  const std::array<size_t, 2> sources{peer, SourceModel::kPfs};
  const std::array<uint64_t, 2> bytes{kMB, kMB};
  int probes = 0;
  for (int i = 0; i < 4000; ++i) {
    const SourceModel::Choice c = model.choose(sources, bytes);
    CHECK(c.read == SourceModel::kPfs);  // the peer is unlearned, then slower: never read
    if (c.probe != SourceModel::kNoProbe) {
      CHECK(c.probe == peer);
      CHECK(c.probe_bytes == kMB);
      model.begin(peer, kMB, SourceModel::Read::kProbe);
      model.done(peer, kMB, 0.5, true);  // the peer 50 times slower
      ++probes;
    }
    model.done(c.read, kMB, 0.01, true);
  }
  // 2 to learn it, then after 32, 64, ..., 2048 choices: 2 + 7.
  CHECK(probes >= 5);
  CHECK(probes <= 10);
  const auto rows = model.rows();
  REQUIRE(rows.size() == 2);
  CHECK(rows[1].name == "node 0");
  CHECK(rows[1].probes == static_cast<uint64_t>(probes));
  CHECK(rows[1].reads == static_cast<uint64_t>(probes));
  CHECK(rows[0].probes == 0);
}

TEST_CASE("a probe is named beside the read, not instead of it") {
  const std::array<uint64_t, 2> bytes{kMB, kMB};
  SUBCASE("the PFS learned, the peer not: the read goes to the PFS, the peer is probed") {
    SourceModel model(2);
    model.begin(SourceModel::kPfs, kMB);
    model.done(SourceModel::kPfs, kMB, 0.5, true);  // however slow
    const std::array<size_t, 2> sources{SourceModel::kPeer0 + 1, SourceModel::kPfs};
    const SourceModel::Choice c = model.choose(sources, bytes);
    CHECK(c.read == SourceModel::kPfs);
    CHECK(c.probe == SourceModel::kPeer0 + 1);
    CHECK(model.moved_to_pfs() == 1);
  }
  SUBCASE("nothing learned of either (a loader's first read): the peer, read, not probed") {
    SourceModel model(2);
    const std::array<size_t, 2> sources{SourceModel::kPeer0 + 1, SourceModel::kPfs};
    const SourceModel::Choice c = model.choose(sources, bytes);
    CHECK(c.read == SourceModel::kPeer0 + 1);
    CHECK(c.probe == SourceModel::kNoProbe);
  }
  SUBCASE("a probe under way: none named, and the peer still due at the next choice") {
    SourceModel model(2);
    model.begin(SourceModel::kPfs, kMB);
    model.done(SourceModel::kPfs, kMB, 0.01, true);
    const std::array<size_t, 2> sources{SourceModel::kPeer0 + 1, SourceModel::kPfs};
    const SourceModel::Choice busy = model.choose(sources, bytes, false);
    CHECK(busy.read == SourceModel::kPfs);
    CHECK(busy.probe == SourceModel::kNoProbe);
    CHECK(model.choose(sources, bytes).probe == SourceModel::kPeer0 + 1);
  }
  SUBCASE("a faster peer, once learned by probes, gets the reads") {
    SourceModel model(2);
    const size_t peer = SourceModel::kPeer0 + 1;
    for (int i = 0; i < 4; ++i) {
      model.begin(SourceModel::kPfs, kMB);
      model.done(SourceModel::kPfs, kMB, 0.02, true);
    }
    const std::array<size_t, 2> sources{peer, SourceModel::kPfs};
    std::vector<size_t> reads;
    for (int i = 0; i < 4; ++i) {
      const SourceModel::Choice c = model.choose(sources, bytes);
      reads.push_back(c.read);
      if (c.probe != SourceModel::kNoProbe) {
        model.begin(c.probe, c.probe_bytes, SourceModel::Read::kProbe);
        model.done(c.probe, c.probe_bytes, 0.001, true);
      }
      model.done(c.read, kMB, c.read == peer ? 0.001 : 0.02, true);
    }
    // A probe learns it while the PFS serves; then its estimate, though not yet min_samples
    // reads, is the best: the peer serves (that read is also its second sample).
    CHECK(reads == std::vector<size_t>{SourceModel::kPfs, peer, peer, peer});
  }
  SUBCASE("no option learned and no PFS among them: the first read there learns it") {
    SourceModel model(3);
    const std::array<size_t, 2> peers{SourceModel::kPeer0 + 1, SourceModel::kPeer0 + 2};
    const SourceModel::Choice c = model.choose(peers, bytes);
    CHECK(c.read == SourceModel::kPeer0 + 1);
    CHECK(c.probe == SourceModel::kNoProbe);
  }
}

TEST_CASE("a peer not yet learned starts from the other peers' estimate, not from probes") {
  const std::array<uint64_t, 2> bytes{kMB, kMB};
  for (const bool fast : {true, false}) {
    SourceModel model(3);
    for (int i = 0; i < 8; ++i) {
      model.begin(SourceModel::kPfs, kMB);
      model.done(SourceModel::kPfs, kMB, 0.01, true);
      model.begin(SourceModel::kPeer0, kMB);
      model.done(SourceModel::kPeer0, kMB, fast ? 0.001 : 0.1, true);
    }
    const std::array<size_t, 2> sources{SourceModel::kPeer0 + 2, SourceModel::kPfs};
    CHECK(model.choose(sources, bytes).read ==
          (fast ? SourceModel::kPeer0 + 2 : SourceModel::kPfs));
  }
}

TEST_CASE("a peer marked down is skipped, even unlearned or faster") {
  const ModelParams p;
  const SourceEstimate pfs = learned(0.01, 10.0 * kMB, {50'000, 200'000}, 8, false);
  SourceEstimate fast = learned(0.0001, 1000.0 * kMB, {50'000, 200'000});
  fast.down = true;
  SourceEstimate unlearned;
  unlearned.down = true;
  const std::array<uint64_t, 2> bytes{100'000, 100'000};
  for (uint64_t choice = 0; choice < 8; ++choice) {
    CHECK(choose_source(std::array{fast, pfs}, bytes, choice, p) == 1);
    CHECK(choose_source(std::array{unlearned, pfs}, bytes, choice, p) == 1);
  }
  SourceEstimate pfs_down = pfs;
  pfs_down.down = true;
  CHECK(choose_source(std::array{fast, pfs_down}, bytes, 1, p) == 2);  // none: size()

  SourceModel model(3);
  model.set_down(SourceModel::kPeer0 + 2);
  const std::array<size_t, 2> sources{SourceModel::kPeer0 + 2, SourceModel::kPfs};
  const SourceModel::Choice c = model.choose(sources, bytes);
  CHECK(c.read == SourceModel::kPfs);
  CHECK(c.probe == SourceModel::kNoProbe);  // a peer down is not probed either
}

TEST_CASE(
    "the links against the PFS: unknown until both are learned, then faster, slower or mixed") {
  // Reads of two sizes through the model, each taking latency + bytes / bandwidth.
  const auto learn = [](SourceModel& m, size_t source, double latency_s, double bytes_per_s) {
    for (int i = 0; i < 4; ++i) {
      for (const uint64_t b : {50'000, 200'000}) {
        m.begin(source, b);
        m.done(source, b, latency_s + static_cast<double>(b) / bytes_per_s, true);
      }
    }
  };
  using Links = SourceModel::Links;
  const size_t node2 = SourceModel::kPeer0 + 2, node4 = SourceModel::kPeer0 + 4;
  SourceModel model(6);
  CHECK(model.links_against_pfs(100'000) == Links::kUnknown);
  learn(model, node2, 0.001, 200.0 * kMB);
  CHECK(model.links_against_pfs(100'000) == Links::kUnknown);  // the PFS not learned
  learn(model, SourceModel::kPfs, 0.010, 50.0 * kMB);
  CHECK(model.links_against_pfs(100'000) == Links::kFaster);
  // 1.5 ms against 12 ms for 100 kB: faster by 8x, not by 10x (a margin a layout may ask for).
  CHECK(model.links_against_pfs(100'000, 7.0) == Links::kFaster);
  CHECK(model.links_against_pfs(100'000, 10.0) == Links::kSlower);
  learn(model, node4, 0.030, 4.0 * kMB);
  CHECK(model.links_against_pfs(100'000) == Links::kMixed);
  model.set_down(node2);  // a link down no longer counts
  CHECK(model.links_against_pfs(100'000) == Links::kSlower);

  SourceModel one_read(4);  // a link seen once is not learned yet
  learn(one_read, SourceModel::kPfs, 0.010, 50.0 * kMB);
  one_read.begin(SourceModel::kPeer0, 1000);
  one_read.done(SourceModel::kPeer0, 1000, 0.0001, true);
  CHECK(one_read.links_against_pfs(1000) == Links::kUnknown);
  // The bytes count: a link of low latency and little bandwidth against a PFS of high latency
  // and much is faster for small reads only.
  SourceModel sizes(4);
  learn(sizes, SourceModel::kPfs, 0.010, 1000.0 * kMB);
  learn(sizes, SourceModel::kPeer0 + 2, 0.0001, 10.0 * kMB);
  CHECK(sizes.links_against_pfs(10'000) == Links::kFaster);     // 1.1 ms against 10 ms
  CHECK(sizes.links_against_pfs(1'000'000) == Links::kSlower);  // 100 ms against 11 ms
}

TEST_CASE("the model's rows: reads per source and the estimates") {
  SourceModel model(2);
  for (int i = 0; i < 4; ++i) {
    model.begin(SourceModel::kPfs, 1000);
    model.done(SourceModel::kPfs, 1000, 0.001, true);
  }
  model.begin(SourceModel::kPeer0, 3000);
  model.done(SourceModel::kPeer0, 3000, 0.5, false);  // a failed read: counted, not learned from
  const auto rows = model.rows();
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].name == "pfs");
  CHECK(rows[0].reads == 4);
  CHECK(rows[0].bytes == 4000);
  CHECK(rows[0].samples == 4);
  CHECK(rows[0].bytes_per_s == doctest::Approx(1e6));
  CHECK(rows[1].name == "node 0");
  CHECK(rows[1].reads == 1);
  CHECK(rows[1].samples == 0);
}

TEST_CASE("the model is safe to use from many threads at once") {
  SourceModel model(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&model, t] {
      const std::array<size_t, 2> sources{SourceModel::kPeer0 + static_cast<size_t>(t),
                                          SourceModel::kPfs};
      const std::array<uint64_t, 2> bytes{1000, 1000};
      for (int i = 0; i < 2000; ++i) {
        const SourceModel::Choice c = model.choose(sources, bytes, i % 2 == 0);
        if (c.probe != SourceModel::kNoProbe) {
          model.begin(c.probe, c.probe_bytes, SourceModel::Read::kProbe);
          model.done(c.probe, c.probe_bytes, 0.0001 * (1 + t), true);
        }
        model.done(c.read, 1000, 0.0001 * (1 + t), true);
        (void)model.rows();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  uint64_t reads = 0, probes = 0;
  for (const auto& r : model.rows()) {
    reads += r.reads;
    probes += r.probes;
  }
  CHECK(reads == 4 * 2000 + probes);
}
