#include "tiers/peers.hpp"

#include <doctest/doctest.h>
#include <zstd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "prestage/error.hpp"
#include "prestage/options.hpp"
#include "prestage/plan.hpp"
#include "prestage/stats.hpp"
#include "staging/stager.hpp"
#include "test_util.hpp"
#include "tiers/ledger.hpp"
#include "tiers/source_model.hpp"
#include "tiers/stage_directory.hpp"
#include "tiers/tiers.hpp"
#include "tiers/transport.hpp"
#include "util/crc32c.hpp"
#include "util/io_trace.hpp"

using prestage::PlanOptions;
using prestage::detail::Ownership;

namespace {

// The rule restated from the epoch's global order alone (plan.hpp: global batch g holds positions
// [g * B * W, ...) of the padded order, rank r its r-th slice): per sample, the rank at its first
// position.
std::vector<uint64_t> owners_from_order(const PlanOptions& p, uint64_t epoch) {
  std::vector<uint64_t> order = prestage::epoch_order(p.num_samples, p.seed, epoch, p.shuffle);
  const uint64_t per_rank = (p.num_samples + p.world_size - 1) / p.world_size;
  for (uint64_t i = 0; order.size() < per_rank * p.world_size; ++i) order.push_back(order[i]);
  std::vector<uint64_t> owner(p.num_samples, Ownership::kNoOwner);
  for (uint64_t pos = 0; pos < order.size(); ++pos) {
    const uint64_t g = pos / (p.batch_size * p.world_size);
    const uint64_t in_batch = std::min(p.batch_size, per_rank - g * p.batch_size);  // last: short
    const uint64_t rank = (pos - g * p.batch_size * p.world_size) / in_batch;
    if (owner[order[pos]] == Ownership::kNoOwner) owner[order[pos]] = rank;
  }
  return owner;
}

std::vector<uint64_t> identity(uint64_t n) {
  std::vector<uint64_t> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

}  // namespace

TEST_CASE("peers: the owner of a file is the first rank to use it in the start epoch") {
  for (const uint64_t n : {64, 61, 7}) {  // even, padded (duplicates of the first samples), tiny
    PlanOptions p;
    p.num_samples = n;
    p.batch_size = 3;
    p.seed = 11;
    p.world_size = 4;
    const std::vector<uint64_t> node_of = {0, 0, 2, 2};
    const Ownership own = Ownership::compute(identity(n), std::vector<uint64_t>(n, 10), p, 5,
                                             node_of, std::vector<uint64_t>(4, 0));
    CHECK(own.owner == owners_from_order(p, 5));
    CHECK(own.home == std::vector<uint8_t>(n, 1));  // no budget: every file has a home copy
  }
}

TEST_CASE("peers: files sharing a container are owned together, by the first user of any of them") {
  PlanOptions p;
  p.num_samples = 40;
  p.batch_size = 2;
  p.world_size = 2;
  std::vector<uint64_t> file_of(40);
  for (uint64_t s = 0; s < 40; ++s) file_of[s] = s / 4;  // 10 shards of 4 samples
  const Ownership own =
      Ownership::compute(file_of, std::vector<uint64_t>(10, 1), p, 0, {0, 1}, {0, 0});
  const std::vector<uint64_t> by_sample = owners_from_order(p, 0);
  // A shard's owner is the owner of its sample used first.
  const std::vector<uint64_t> order = prestage::epoch_order(40, 0, 0, true);
  std::vector<uint64_t> expected(10, Ownership::kNoOwner);
  for (const uint64_t s : order) {
    if (expected[file_of[s]] == Ownership::kNoOwner) expected[file_of[s]] = by_sample[s];
  }
  CHECK(own.owner == expected);
}

TEST_CASE("peers: a node keeps its files in order of first use while they fit its budget") {
  PlanOptions p;
  p.num_samples = 50;
  p.batch_size = 4;
  p.seed = 3;
  p.world_size = 4;
  std::vector<uint64_t> sizes(50);
  for (uint64_t f = 0; f < 50; ++f) sizes[f] = 100 + 37 * (f % 7);
  const std::vector<uint64_t> node_of = {0, 0, 2, 2};
  const std::vector<uint64_t> budget_of = {1500, 1500, 4000, 4000};
  const Ownership own = Ownership::compute(identity(50), sizes, p, 0, node_of, budget_of);
  const std::vector<uint64_t> owner = owners_from_order(p, 0);
  CHECK(own.owner == owner);
  // Walk each node's files in order of first use: a prefix is home, within the budget, and the next
  // file would not have fit.
  std::vector<uint64_t> order = prestage::epoch_order(50, 3, 0, true);
  std::map<uint64_t, std::vector<uint64_t>> by_node;
  std::set<uint64_t> seen;
  for (const uint64_t s : order) {
    if (seen.insert(s).second) by_node[node_of[owner[s]]].push_back(s);
  }
  // The global order visits batch by batch and rank by rank within each: the first-use order.
  for (const auto& [node, files] : by_node) {
    uint64_t used = 0;
    size_t k = 0;
    while (k < files.size() && used + sizes[files[k]] <= budget_of[node]) used += sizes[files[k++]];
    CHECK(k > 0);
    CHECK(k < files.size());  // the budgets are below what each node owns
    for (size_t i = 0; i < files.size(); ++i) CHECK(own.home[files[i]] == (i < k ? 1 : 0));
  }
}

TEST_CASE("peers: with drop_last, files no rank uses in the start epoch have no owner") {
  PlanOptions p;
  p.num_samples = 30;
  p.batch_size = 4;
  p.world_size = 2;
  p.drop_last = true;  // 3 global batches of 8: 6 samples left out
  const Ownership own =
      Ownership::compute(identity(30), std::vector<uint64_t>(30, 1), p, 2, {0, 1}, {0, 0});
  uint64_t unowned = 0;
  for (uint64_t f = 0; f < 30; ++f) unowned += own.owner[f] == Ownership::kNoOwner ? 1 : 0;
  CHECK(unowned == 6);
  for (uint64_t f = 0; f < 30; ++f) {
    if (own.owner[f] == Ownership::kNoOwner) CHECK(own.home[f] == 0);
  }
}

TEST_CASE("peers: without the plugin or an MPI launcher the tier stays off and says why") {
  // Run without mpiexec: no plugin path that exists, then (where the test builds it) the real one.
  prestage::Catalog catalog = prestage::Catalog::from_paths(".", {"a", "b"});
  PlanOptions p;
  p.num_samples = 2;
  p.world_size = 2;
  const prestage::detail::Peers one(catalog, PlanOptions{2, 1, 0, true, false, 0, 1}, nullptr, 0,
                                    {});
  CHECK_FALSE(one.on());
  CHECK(one.why_off().find("world_size 1") != std::string::npos);
  if (std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr && std::getenv("PMI_RANK") == nullptr) {
    const prestage::detail::Peers two(catalog, p, nullptr, 0, {});
    CHECK_FALSE(two.on());
    const std::string why = two.why_off();
    CHECK((why.rfind("plugin missing", 0) == 0 ||
           why.rfind("MPI world of 1 does not match", 0) == 0));
  }
}

TEST_CASE("peers: a peer timeout of zero is refused") {
  prestage::LoaderOptions o;
  o.peers = true;
  o.peer_timeout_ms = 0;
  CHECK_THROWS_AS(o.validate(), prestage::ConfigError);
  o.peer_timeout_ms = 1;
  CHECK_NOTHROW(o.validate());
}

namespace {

using prestage::Catalog;
using prestage::detail::FileCopy;
using prestage::detail::Look;
using prestage::detail::PeerAnswer;
using prestage::detail::PeerCheck;
using prestage::detail::PeerRange;
using prestage::detail::Peers;
using prestage::detail::PeerServe;
using prestage::detail::Prefetch;
using prestage::detail::RequestEnd;
using prestage::detail::SampleBytes;
using prestage::detail::StageDirectory;
using prestage::detail::Transport;
using prestage::detail::TransportConfig;

// A transport double: the ranks of a job are Peers of this process, rank r alone on node r. A
// request calls its owner's serve() on the asking thread (a kLater answer is asked again until the
// request's time runs out), and `tamper` (if set) changes each served reply on its way, as a faulty
// link would. Records every range asked, and each rank's set_quiet() calls. Per owner rank, a link:
// `delay` before each answer (a slow link), or `held_all`: each answer says the owner held it for
// a second, so that the asker's model learns the link as taking no time at all (a fast link, whose
// time no real read of the source can beat).
struct Loop {
  std::mutex mutex;
  std::vector<PeerServe> serve = std::vector<PeerServe>(2);  // per rank; empty: stopped
  std::vector<PeerRange> asked;
  std::function<void(std::vector<std::byte>&, PeerCheck&)> tamper;
  std::vector<std::chrono::milliseconds> delay = std::vector<std::chrono::milliseconds>(2);
  std::vector<uint8_t> held_all = std::vector<uint8_t>(2);
  std::vector<std::vector<bool>> quiet = std::vector<std::vector<bool>>(2);
};

Loop& loop() {
  static Loop l;
  return l;
}

class LoopTransport final : public Transport {
 public:
  LoopTransport(uint64_t rank, uint64_t world) : rank_(rank), nodes_(world), values_(world) {
    for (uint64_t r = 0; r < world; ++r) nodes_[r] = r;
  }
  ~LoopTransport() override { stop(); }
  uint64_t rank() const override { return rank_; }
  uint64_t world_size() const override { return nodes_.size(); }
  const std::vector<uint64_t>& nodes() const override { return nodes_; }
  const std::vector<uint64_t>& values() const override { return values_; }
  bool request(uint64_t rank, const PeerRange& range, std::chrono::milliseconds timeout,
               std::vector<std::byte>& bytes, PeerCheck& check, RequestEnd* end,
               std::chrono::microseconds* held) override {
    if (held != nullptr) *held = std::chrono::microseconds{0};
    PeerServe serve;
    std::chrono::milliseconds delay{0};
    bool held_all = false;
    {
      std::lock_guard lock(loop().mutex);
      loop().asked.push_back(range);
      serve = loop().serve[rank];
      delay = loop().delay[rank];
      held_all = loop().held_all[rank] != 0;
    }
    std::this_thread::sleep_for(delay);
    if (end != nullptr) *end = serve ? RequestEnd::kReply : RequestEnd::kGone;
    if (!serve) return false;
    const auto until = std::chrono::steady_clock::now() + timeout;
    PeerAnswer answer = PeerAnswer::kLater;
    while ((answer = serve(range, bytes, check)) == PeerAnswer::kLater &&
           std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (answer != PeerAnswer::kServed) return false;
    if (held_all && held != nullptr) *held = std::chrono::seconds(1);
    std::lock_guard lock(loop().mutex);
    if (loop().tamper) loop().tamper(bytes, check);
    return true;
  }
  void stop() override {
    std::lock_guard lock(loop().mutex);
    loop().serve[rank_] = nullptr;
  }
  void set_quiet(bool quiet) override {
    std::lock_guard lock(loop().mutex);
    loop().quiet[rank_].push_back(quiet);
  }

 private:
  uint64_t rank_;
  std::vector<uint64_t> nodes_, values_;
};

PeerRange loop_asked_back() {
  std::lock_guard lock(loop().mutex);
  REQUIRE(!loop().asked.empty());
  return loop().asked.back();
}

void set_tamper(std::function<void(std::vector<std::byte>&, PeerCheck&)> tamper) {
  std::lock_guard lock(loop().mutex);
  loop().tamper = std::move(tamper);
}

Transport* loop_start(const TransportConfig* config, std::string* /*error*/) {
  std::lock_guard lock(loop().mutex);
  const uint64_t world = config->expect_world_size, rank = config->expect_rank;
  if (loop().serve.size() != world) {  // a job of another size than the last
    loop().serve.assign(world, nullptr);
    loop().delay.assign(world, std::chrono::milliseconds{0});
    loop().held_all.assign(world, 0);
    loop().quiet.assign(world, {});
  }
  loop().serve[rank] = config->serve;
  loop().delay[rank] = std::chrono::milliseconds{0};
  loop().held_all[rank] = 0;
  loop().quiet[rank].clear();
  loop().asked.clear();
  loop().tamper = nullptr;
  return new LoopTransport(rank, world);
}

// Rank `rank` of `world`'s peer tier over the in-process transport, started on epoch 0 (each rank
// of a job in turn: the double needs no collective start).
std::unique_ptr<Peers> start_loop_peers(const Catalog& catalog, StageDirectory* stage,
                                        uint64_t rank, uint64_t world) {
  PlanOptions plan;
  plan.num_samples = catalog.size();
  plan.batch_size = 2;
  plan.seed = 3;
  plan.world_size = world;
  plan.rank = rank;
  prestage::detail::PeerOptions options;
  options.timeout = std::chrono::seconds(5);
  options.start = &loop_start;
  auto peers = std::make_unique<Peers>(catalog, plan, stage, 0, options);
  REQUIRE_MESSAGE(peers->on(), peers->why_off());
  peers->start_epoch(0);
  return peers;
}

// `world` ranks over the in-process transport, each alone on its node with its own stage
// directory under `dir`, their peer tiers started on epoch 0.
struct LoopNodes {
  std::vector<std::unique_ptr<StageDirectory>> stage;  // before peers: they are destroyed after
  std::vector<std::unique_ptr<Peers>> peers;
  LoopNodes(const Catalog& catalog, const std::filesystem::path& dir, uint64_t world) {
    for (uint64_t r = 0; r < world; ++r) {
      stage.push_back(
          std::make_unique<StageDirectory>(dir / ("node" + std::to_string(r)), catalog));
      peers.push_back(start_loop_peers(catalog, stage.back().get(), r, world));
    }
  }
};

// The source model's row named `name` ("pfs", "node 1"), or an empty one.
prestage::detail::SourceModel::Row model_row(const prestage::detail::SourceModel& model,
                                             const std::string& name) {
  for (const auto& r : model.rows()) {
    if (r.name == name) return r;
  }
  return {};
}

std::vector<bool> loop_quiet(uint64_t rank) {
  std::lock_guard lock(loop().mutex);
  return loop().quiet[rank];
}

std::vector<std::byte> file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(all.size());
  std::memcpy(bytes.data(), all.data(), all.size());
  return bytes;
}

std::vector<std::byte> slice(const std::vector<std::byte>& all, uint64_t offset, uint64_t length) {
  return {all.begin() + static_cast<std::ptrdiff_t>(offset),
          all.begin() + static_cast<std::ptrdiff_t>(offset + length)};
}

// Flips the byte at `at` of the file at `path`, in place.
void flip_byte(const std::string& path, uint64_t at) {
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  f.seekg(static_cast<std::streamoff>(at));
  const char c = static_cast<char>(f.get());
  f.seekp(static_cast<std::streamoff>(at));
  f.put(static_cast<char>(~c));
  REQUIRE(f.good());
}

// Two ranks on two nodes over the double, each with its stage directory, over 8 files of a few kB
// (sizes recorded by the catalog), and a file owned by rank 1 whose home copy it has made.
struct Job {
  prestage::test::TempDir dir;
  Catalog catalog;
  std::unique_ptr<StageDirectory> stage[2];
  std::unique_ptr<Peers> peers[2];
  uint64_t theirs = 0;            // rank 1's home copy
  std::vector<std::byte> source;  // its bytes

  Job() : catalog(make_catalog(dir)) {
    for (uint64_t r = 0; r < 2; ++r) {
      stage[r] = std::make_unique<StageDirectory>(dir / ("node" + std::to_string(r)), catalog);
    }
    start();
    uint64_t owner = 0;
    while (theirs < catalog.num_files() &&
           peers[0]->home(Catalog::Locator{theirs}, owner) != Peers::Fetched::kPeer) {
      ++theirs;
    }
    REQUIRE(theirs < catalog.num_files());
    REQUIRE(owner == 1);
    const std::string path = (catalog.root() / catalog.file_path(theirs)).string();
    source = file_bytes(path);
    REQUIRE(source.size() == catalog.file_size(theirs));
    std::vector<std::byte> buffer;
    REQUIRE(stage[1]->try_claim(theirs));
    REQUIRE(stage[1]->stage(theirs, path, buffer) == StageDirectory::Outcome::kStaged);
  }

  static Catalog make_catalog(const prestage::test::TempDir& dir) {
    for (uint32_t i = 0; i < 8; ++i) {
      std::vector<unsigned char> bytes(3000 + 517 * i);
      for (size_t k = 0; k < bytes.size(); ++k)
        bytes[k] = static_cast<unsigned char>(k * 131 + i * 7 + k / 251);
      prestage::test::write_file(dir / "set" / "c0" / ("f" + std::to_string(i) + ".bin"), bytes);
    }
    return Catalog::from_folder(dir / "set", {".bin"});
  }

  // Peers over the stage directories as they are now (anew: after a directory is reopened).
  void start() {
    for (auto& p : peers) p.reset();
    for (uint64_t r = 0; r < 2; ++r) peers[r] = start_loop_peers(catalog, stage[r].get(), r, 2);
  }

  Catalog::Locator range(uint64_t offset, uint64_t length) const {
    return Catalog::Locator{theirs, offset, length};
  }
};

}  // namespace

TEST_CASE("peers: a request names the sample's range, and the owner sends exactly its bytes") {
  Job job;
  const uint64_t size = job.source.size();
  std::vector<std::byte> out;
  struct Case {
    uint64_t offset, length;
  };
  uint64_t sent = 0;
  for (const Case c : {Case{100, 777}, Case{size - 10, 10}, Case{0, 1}}) {
    CAPTURE(c.offset);
    REQUIRE(job.peers[0]->fetch(job.range(c.offset, c.length), out) == Peers::Fetched::kPeer);
    CHECK(out == slice(job.source, c.offset, c.length));
    sent += c.length;
    // The owner read and sent only the range, the asker took only it.
    CHECK(loop_asked_back().offset == c.offset);
    CHECK(loop_asked_back().length == c.length);
    CHECK(job.peers[1]->counts().served_bytes == sent);
  }
  // A sample that is its whole file, or a slice of one (its offset is a slice's index, not a byte):
  // the whole file.
  for (const uint64_t offset : {0, 3}) {
    REQUIRE(job.peers[0]->fetch(job.range(offset, Catalog::kWholeFile), out) ==
            Peers::Fetched::kPeer);
    CHECK(out == job.source);
    CHECK(loop_asked_back().offset == 0);
    CHECK(loop_asked_back().length == PeerRange::kWhole);
  }
  CHECK(job.peers[1]->counts().served_bytes == sent + 2 * size);
  CHECK(job.peers[0]->counts().fallbacks == 0);
  // A range past the end of the owner's copy (a locator that does not fit the file, an offset and
  // a length whose sum overflows) is answered absent: a fallback to the source, not a corrupt
  // reply.
  for (const Case c : {Case{size - 5, 10}, Case{size + 1, 1}, Case{1, ~uint64_t{0} - 1}}) {
    CAPTURE(c.offset);
    CHECK(job.peers[0]->fetch(job.range(c.offset, c.length), out) == Peers::Fetched::kNone);
  }
  CHECK(job.peers[0]->counts().fallbacks == 3);
  CHECK(job.peers[0]->counts().corrupt == 0);
  CHECK(job.peers[1]->counts().served == 5);
  CHECK(job.stage[1]->corrupt() == 0);  // the copy itself is sound
}

TEST_CASE("peers: each answer the owner serves is counted by its asker, as a read or as a probe") {
  Job job;
  const uint64_t size = job.source.size();
  std::vector<std::byte> out;
  REQUIRE(job.peers[0]->fetch(job.range(0, Catalog::kWholeFile), out) == Peers::Fetched::kPeer);
  REQUIRE(job.peers[0]->fetch(job.range(100, 777), out, nullptr, Peers::Count::kProbe) ==
          Peers::Fetched::kPeer);
  REQUIRE(job.peers[0]->fetch(job.range(0, 10), out, nullptr, Peers::Count::kProbe) ==
          Peers::Fetched::kPeer);
  // The read is counted by the ledger of the tiers that asked for it (the ledger test below): here,
  // the one answer fetched as a read.
  const auto asker = job.peers[0]->counts();
  const auto owner = job.peers[1]->counts();
  CHECK(asker.probes == 2);
  CHECK(asker.probe_bytes == 787);
  CHECK(owner.served == 1 + asker.probes);
  CHECK(owner.served_bytes == size + asker.probe_bytes);
}

TEST_CASE(
    "peers: a reply that fails its checks, or an owner's copy changed on its SSD, is a "
    "counted fallback to the source") {
  Job job;
  const Catalog::Locator loc = job.range(100, 777);
  std::vector<std::byte> out;
  using Tamper = std::function<void(std::vector<std::byte>&, PeerCheck&)>;
  const std::vector<Tamper> tampers = {
      [](std::vector<std::byte>& b, PeerCheck&) { b[5] ^= std::byte{1}; },  // a byte on the way
      [](std::vector<std::byte>&, PeerCheck& c) { c.crc ^= 1; },
      [](std::vector<std::byte>&, PeerCheck& c) {
        c.file_size += 1;
      },                                             // another file than the catalog's
      [](std::vector<std::byte>& b, PeerCheck& c) {  // a short range with its own CRC
        b.pop_back();
        c.crc = prestage::detail::crc32c(b);
      },
  };
  uint64_t n = 0;
  for (const Tamper& tamper : tampers) {
    CAPTURE(n);
    set_tamper(tamper);
    CHECK(job.peers[0]->fetch(loc, out) == Peers::Fetched::kNone);
    ++n;
    CHECK(job.peers[0]->counts().corrupt == n);
    CHECK(job.peers[0]->counts().fallbacks == n);
  }
  set_tamper(nullptr);
  REQUIRE(job.peers[0]->fetch(loc, out) == Peers::Fetched::kPeer);
  CHECK(out == slice(job.source, 100, 777));
  CHECK(job.peers[0]->counts().fallbacks == n);

  SUBCASE(
      "a byte of the owner's copy changed, outside the range asked: found by its check, removed") {
    flip_byte(job.stage[1]->staged_path(job.theirs), 0);
    CHECK(job.peers[0]->fetch(loc, out) == Peers::Fetched::kNone);
    CHECK(job.stage[1]->corrupt() == 1);
    CHECK_FALSE(job.stage[1]->is_staged(job.theirs));
    CHECK(job.peers[0]->fetch(loc, out) == Peers::Fetched::kNone);  // gone: absent at once
    CHECK(job.peers[0]->counts().fallbacks == n + 2);
    CHECK(job.peers[0]->counts().corrupt == n);  // the owner refused it: nothing wrong was sent
  }
  SUBCASE("a copy left by an earlier run is checked whole before a range of it is sent") {
    for (const bool damaged : {false, true}) {
      CAPTURE(damaged);
      if (!job.stage[1]->is_staged(job.theirs)) {
        std::vector<std::byte> buffer;
        REQUIRE(job.stage[1]->try_claim(job.theirs));
        REQUIRE(job.stage[1]->stage(
                    job.theirs, (job.catalog.root() / job.catalog.file_path(job.theirs)).string(),
                    buffer) == StageDirectory::Outcome::kStaged);
      }
      const std::string copy = job.stage[1]->staged_path(job.theirs);
      job.peers[0].reset();
      job.peers[1].reset();
      job.stage[1].reset();
      if (damaged) flip_byte(copy, job.source.size() - 1);  // same size: only its CRC tells
      job.stage[1] = std::make_unique<StageDirectory>(job.dir / "node1", job.catalog);
      REQUIRE(job.stage[1]->is_staged(job.theirs));
      REQUIRE(job.stage[1]->unverified(job.theirs));
      job.start();
      if (damaged) {
        CHECK(job.peers[0]->fetch(loc, out) == Peers::Fetched::kNone);
        CHECK(job.stage[1]->corrupt() == 1);
        CHECK(job.peers[0]->counts().fallbacks == 1);
        CHECK(job.peers[0]->counts().corrupt == 0);
      } else {
        REQUIRE(job.peers[0]->fetch(loc, out) == Peers::Fetched::kPeer);
        CHECK(out == slice(job.source, 100, 777));
        CHECK_FALSE(job.stage[1]->unverified(job.theirs));
        CHECK(job.peers[1]->counts().served_bytes == 777);
      }
    }
  }
}

TEST_CASE(
    "peers: the transport is quiet only once every link learned is slower than the source, and "
    "not once one is found faster") {
  using prestage::detail::SourceModel;
  using prestage::detail::Tiers;
  using Links = SourceModel::Links;
  prestage::test::TempDir dir;
  const Catalog catalog = Job::make_catalog(dir);
  // 3 ranks over the double, each alone on its node; rank 0 reads through its tiers.
  constexpr uint64_t kWorld = 3;
  LoopNodes job(catalog, dir.path(), kWorld);
  const auto& stage = job.stage;
  const auto& peers = job.peers;
  // A file of each rank's own (rank 0's read from the source); ranks 1 and 2 make all their home
  // copies (whatever a probe asks for is there).
  uint64_t own[kWorld] = {~uint64_t{0}, ~uint64_t{0}, ~uint64_t{0}};
  for (uint64_t f = 0; f < catalog.num_files(); ++f) {
    uint64_t owner = 0;
    const Peers::Fetched home = peers[0]->home(Catalog::Locator{f}, owner);
    if (home == Peers::Fetched::kNone) continue;
    if (home == Peers::Fetched::kLocal) owner = 0;
    if (own[owner] == ~uint64_t{0}) own[owner] = f;
    if (owner == 0) continue;
    std::vector<std::byte> buffer;
    REQUIRE(stage[owner]->try_claim(f));
    REQUIRE(stage[owner]->stage(f, (catalog.root() / catalog.file_path(f)).string(), buffer) ==
            StageDirectory::Outcome::kStaged);
  }
  for (uint64_t r = 0; r < kWorld; ++r) REQUIRE(own[r] != ~uint64_t{0});
  {
    std::lock_guard lock(loop().mutex);
    loop().delay[1] = std::chrono::milliseconds(200);  // node 1's link: slower than any local read
    loop().held_all[2] = 1;                            // node 2's link: faster than any
  }
  Tiers tiers(catalog, stage[0].get(), uint64_t{1} << 30);
  tiers.set_peers(peers[0].get());
  const SourceModel& model = *tiers.source_model();
  const auto row = [&](const std::string& name) { return model_row(model, name); };
  // Waits (without a bound on how long it may take, but 30 s) for `done`.
  const auto wait_for = [](const auto& done) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!done() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return done();
  };
  std::vector<std::byte> buffer;
  int64_t mtime_ns = 0;
  // The source is learned from the reads of this node's own file; no link is known.
  for (int k = 0; k < 3; ++k) tiers.open(FileCopy{own[0], buffer, mtime_ns}, nullptr);
  REQUIRE(row("pfs").samples >= 2);
  // Node 1's link, learned by probes (the tiers' early ones, then beside reads): not quiet while
  // it is known from fewer than 2. (The transport's record is read first: the model learns from a
  // probe before the quiet it implies is set.)
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (row("node 1").samples < 2 && std::chrono::steady_clock::now() < until) {
    tiers.open(FileCopy{own[1], buffer, mtime_ns}, nullptr);
    const std::vector<bool> quiet = loop_quiet(0);
    if (row("node 1").samples < 2) CHECK(quiet.empty());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  REQUIRE(row("node 1").samples >= 2);
  CHECK(row("node 2").samples == 0);
  // Every link learned is slower (node 2's, not learned yet, is not counted): quiet.
  CHECK(tiers.links() == Links::kSlower);
  REQUIRE(wait_for([&] { return !loop_quiet(0).empty(); }));
  CHECK(loop_quiet(0) == std::vector<bool>{true});
  // Node 2's link starts from the slow estimate of node 1's (links are alike), so its reads go to
  // the source and it is probed when due (every so many reads, while no probe is under way: under
  // a sanitizer on a loaded host more than 500 reads could pass first); its second probe finds it
  // faster: no longer quiet.
  const auto learned_by = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (row("node 2").samples < 2 && std::chrono::steady_clock::now() < learned_by) {
    tiers.open(FileCopy{own[2], buffer, mtime_ns}, nullptr);
    if (row("node 2").probes > row("node 2").samples) {
      REQUIRE(wait_for([&] { return row("node 2").samples == row("node 2").probes; }));
    }
    const std::vector<bool> quiet = loop_quiet(0);
    if (row("node 2").samples < 2) CHECK(quiet == std::vector<bool>{true});
  }
  REQUIRE(row("node 2").samples == 2);
  CHECK(tiers.links() == Links::kMixed);
  REQUIRE(wait_for([&] { return loop_quiet(0).size() == 2; }));
  CHECK(loop_quiet(0) == std::vector<bool>{true, false});
  CHECK(loop_quiet(1).empty());  // ranks that read nothing are never told
  CHECK(loop_quiet(2).empty());
  tiers.stop_probes();
}

TEST_CASE(
    "peers: the start epoch's probes of a link whose home copy never comes stop at their budget, "
    "and no read waits on them") {
  using prestage::detail::SourceModel;
  using prestage::detail::Tiers;
  prestage::test::TempDir dir;
  const Catalog catalog = Job::make_catalog(dir);
  LoopNodes job(catalog, dir.path(), 2);
  const auto& stage = job.stage;
  const auto& peers = job.peers;
  // Rank 1 declines every home copy (no room for any): each probe of its link is answered
  // "absent" at once, and the link is never learned. Rank 0 reads one of its own files again and
  // again, each read a chance for the tiers' early probe.
  uint64_t own = ~uint64_t{0};
  for (uint64_t f = 0; f < catalog.num_files(); ++f) {
    uint64_t owner = 0;
    const Peers::Fetched home = peers[0]->home(Catalog::Locator{f}, owner);
    if (home == Peers::Fetched::kLocal && own == ~uint64_t{0}) own = f;
    if (home == Peers::Fetched::kPeer) peers[1]->not_coming(f);
  }
  REQUIRE(own != ~uint64_t{0});
  uint64_t sample = 0, owner = 0;
  REQUIRE(peers[0]->early_probe(sample, owner));
  CHECK(owner == 1);
  Tiers tiers(catalog, stage[0].get(), uint64_t{1} << 30);
  tiers.set_peers(peers[0].get());
  const SourceModel& model = *tiers.source_model();
  const auto link = [&] { return model_row(model, "node 1"); };
  const uint64_t budget = 4 * prestage::detail::ModelParams{}.min_samples;
  std::vector<std::byte> buffer;
  int64_t mtime_ns = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (link().probes < budget && std::chrono::steady_clock::now() < until) {
    const auto start = std::chrono::steady_clock::now();
    tiers.open(FileCopy{own, buffer, mtime_ns}, nullptr);
    // The read is the source's, whatever the probe beside it does (the loop double answers at
    // once; a read that waited on a probe would take the peer timeout, 5 s).
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(2));
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  CHECK(link().probes == budget);
  // Spent: however many reads follow, no early probe more, and the link is still not known.
  for (int k = 0; k < 50; ++k) {
    tiers.open(FileCopy{own, buffer, mtime_ns}, nullptr);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(link().probes == budget);
  CHECK(link().samples == 0);
  CHECK(tiers.links() == SourceModel::Links::kUnknown);
  CHECK(peers[1]->counts().served == 0);
  tiers.stop_probes();
}

namespace {

// Every event of a ledger, as its observer sees them.
struct Events final : prestage::detail::Ledger::Observer {
  std::mutex mutex;
  std::vector<prestage::detail::ReadEvent> seen;
  void on_read(const prestage::detail::ReadEvent& event) override {
    std::lock_guard lock(mutex);
    seen.push_back(event);
  }
};

// The records of the I/O trace at `path` (its layout: util/io_trace.hpp).
std::vector<prestage::detail::TraceRecord> trace_records(const std::filesystem::path& path) {
  using prestage::detail::TraceRecord;
  const std::vector<std::byte> bytes = file_bytes(path);
  REQUIRE(bytes.size() >= 16);
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, bytes.data() + 8, 8);
  const size_t body = bytes.size() - 16 - header_bytes;
  REQUIRE(body % sizeof(TraceRecord) == 0);
  std::vector<TraceRecord> records(body / sizeof(TraceRecord));
  if (body > 0) std::memcpy(records.data(), bytes.data() + 16 + header_bytes, body);
  return records;
}

}  // namespace

TEST_CASE(
    "ledger: one read through each tier for each purpose is one event and one trace record, equal "
    "to the figures") {
  using prestage::detail::IoTrace;
  using prestage::detail::Purpose;
  using prestage::detail::ReadEvent;
  using prestage::detail::Tier;
  using prestage::detail::TierCounts;
  using prestage::detail::Tiers;
  using prestage::detail::TierScratch;
  using prestage::detail::TierTally;
  using prestage::detail::TraceKind;
  using prestage::detail::TraceRecord;
  Job job;  // rank 1 keeps the home copy of job.theirs
  const Catalog& catalog = job.catalog;
  {
    std::lock_guard lock(loop().mutex);
    loop().held_all[1] = 1;  // rank 1's link: faster than any read of the source, always chosen
  }
  // Rank 0's files: `mine` staged on its node (its home copy), `plain` read from the source (its
  // home copy is not coming, so no read waits for it). Rank 1 makes no other home copy: a probe
  // of its link is answered at once.
  uint64_t mine = ~uint64_t{0}, plain = ~uint64_t{0};
  for (uint64_t f = 0; f < catalog.num_files(); ++f) {
    uint64_t owner = 0;
    const Peers::Fetched home = job.peers[0]->home(Catalog::Locator{f}, owner);
    if (home == Peers::Fetched::kPeer && f != job.theirs) job.peers[1]->not_coming(f);
    if (home != Peers::Fetched::kLocal) continue;
    if (mine == ~uint64_t{0}) {
      mine = f;
    } else if (plain == ~uint64_t{0}) {
      plain = f;
    }
  }
  REQUIRE(plain != ~uint64_t{0});
  job.peers[0]->not_coming(plain);
  {
    std::vector<std::byte> buffer;
    REQUIRE(job.stage[0]->try_claim(mine));
    REQUIRE(job.stage[0]->stage(mine, (catalog.root() / catalog.file_path(mine)).string(),
                                buffer) == StageDirectory::Outcome::kStaged);
  }
  for (const uint64_t f : {mine, plain, job.theirs}) REQUIRE(catalog.locator(f).file == f);

  const std::filesystem::path trace_path = job.dir / "reads.trace";
  IoTrace trace(trace_path.string(), catalog.root().string(), catalog.num_files());
  Events events;
  Tiers tiers(catalog, job.stage[0].get(), uint64_t{1} << 30);
  tiers.set_peers(job.peers[0].get());
  tiers.set_trace(&trace);
  tiers.ledger().set_observer(&events);

  TierTally decoding, staging;  // the figures of a batch of stage 3's and one of stage 2's
  TierScratch scratch;
  std::vector<std::byte> buffer, fetched;
  int64_t mtime_ns = 0;
  const auto size = [&](uint64_t f) { return catalog.file_size(f); };
  const std::string held_text = "held!";
  std::vector<std::byte> held(held_text.size());
  std::memcpy(held.data(), held_text.data(), held.size());
  // Each read is exactly one event: of the tier, purpose, bytes and batch expected.
  const auto one = [&](const char* what, Tier tier, Purpose purpose, uint64_t bytes,
                       const TierTally* batch, const auto& read) {
    CAPTURE(what);
    const size_t before = events.seen.size();
    read();
    REQUIRE(events.seen.size() == before + 1);
    const ReadEvent& e = events.seen.back();
    CHECK(e.tier == tier);
    CHECK(e.purpose == purpose);
    CHECK(e.bytes == bytes);
    CHECK(e.batch == batch);
  };
  // Stage 3's reads and looks.
  one("decode, memory", Tier::kMemory, Purpose::kDecode, held.size(), &decoding, [&] {
    tiers.open(SampleBytes{plain, std::span<const std::byte>(held), buffer, scratch}, &decoding);
  });
  one("decode, stage directory", Tier::kStage, Purpose::kDecode, size(mine), &decoding,
      [&] { tiers.open(SampleBytes{mine, std::nullopt, buffer, scratch}, &decoding); });
  one("decode, peer", Tier::kPeer, Purpose::kDecode, size(job.theirs), &decoding, [&] {
    CHECK(tiers.open(SampleBytes{job.theirs, std::nullopt, buffer, scratch}, &decoding)
              .bytes.size() == job.source.size());
  });
  one("decode, source", Tier::kSource, Purpose::kDecode, size(plain), &decoding,
      [&] { tiers.open(SampleBytes{plain, std::nullopt, buffer, scratch}, &decoding); });
  one("locate, stage directory", Tier::kStage, Purpose::kLocate, size(mine), &decoding,
      [&] { CHECK(tiers.open(Look{mine}, &decoding).tier == Tier::kStage); });
  one("locate, source", Tier::kSource, Purpose::kLocate, size(plain), &decoding,
      [&] { CHECK(tiers.open(Look{plain}, &decoding).tier == Tier::kSource); });
  // Stage 2's.
  const auto ahead = [&](uint64_t f) {
    std::vector<std::byte> out(size(f));
    tiers.open(Prefetch{f, out, fetched}, &staging);
  };
  one("read-ahead, stage directory", Tier::kStage, Purpose::kReadAhead, size(mine), &staging,
      [&] { ahead(mine); });
  one("read-ahead, peer", Tier::kPeer, Purpose::kReadAhead, size(job.theirs), &staging,
      [&] { ahead(job.theirs); });
  one("read-ahead, source", Tier::kSource, Purpose::kReadAhead, size(plain), &staging,
      [&] { ahead(plain); });
  one("copy, peer", Tier::kPeer, Purpose::kCopy, size(job.theirs), &staging,
      [&] { tiers.open(FileCopy{job.theirs, buffer, mtime_ns}, &staging); });
  one("copy, source", Tier::kSource, Purpose::kCopy, size(plain), &staging,
      [&] { tiers.open(FileCopy{plain, buffer, mtime_ns}, &staging); });
  // A look at the set (no batch) is no read of an epoch's sample: no event.
  const size_t reads = events.seen.size();
  tiers.open(SampleBytes{plain, std::nullopt, buffer, scratch}, nullptr);
  CHECK(events.seen.size() == reads);
  tiers.stop_probes();

  // One trace record per event but a locate's (which reads nothing), with its fields.
  trace.flush();
  const auto key = [](uint64_t sample, uint64_t file, uint64_t offset, uint64_t bytes, uint8_t tier,
                      TraceKind kind) {
    return std::make_tuple(sample, file, offset, bytes, tier, static_cast<uint8_t>(kind));
  };
  using Key = decltype(key(0, 0, 0, 0, 0, TraceKind::kRead));
  std::multiset<Key> expected, recorded;
  static constexpr TraceKind kKind[] = {TraceKind::kRead, TraceKind::kRead, TraceKind::kReadAhead,
                                        TraceKind::kCopy};
  for (const ReadEvent& e : events.seen) {
    if (e.purpose == Purpose::kLocate) continue;
    expected.insert(key(e.sample, e.file, e.offset, e.bytes, static_cast<uint8_t>(e.tier),
                        kKind[static_cast<size_t>(e.purpose)]));
  }
  for (const TraceRecord& r : trace_records(trace_path)) {
    recorded.insert(key(r.sample, r.file, r.offset, r.size, r.tier, TraceKind(r.kind)));
  }
  CHECK(expected.size() == events.seen.size() - 2);
  CHECK(recorded == expected);

  // The figures: the run's by purpose, stage 3's and stage 2's, each batch's, and the peer tier's
  // reads in stats() are the events summed.
  const auto sum = [&](const auto& keep) {
    TierCounts c;
    for (const ReadEvent& e : events.seen) {
      if (!keep(e)) continue;
      ++c.reads[static_cast<size_t>(e.tier)];
      c.bytes[static_cast<size_t>(e.tier)] += e.bytes;
    }
    return c;
  };
  const auto same = [](const TierCounts& a, const TierCounts& b) {
    return a.reads == b.reads && a.bytes == b.bytes;
  };
  for (const Purpose p :
       {Purpose::kDecode, Purpose::kLocate, Purpose::kReadAhead, Purpose::kCopy}) {
    CAPTURE(static_cast<int>(p));
    CHECK(same(tiers.ledger().totals(p), sum([&](const ReadEvent& e) { return e.purpose == p; })));
  }
  const auto stage3 = [](const ReadEvent& e) {
    return e.purpose == Purpose::kDecode || e.purpose == Purpose::kLocate;
  };
  CHECK(same(tiers.served(), sum(stage3)));
  CHECK(same(tiers.fetched(), sum([&](const ReadEvent& e) { return !stage3(e); })));
  CHECK(same(decoding.counts(), sum([&](const ReadEvent& e) { return e.batch == &decoding; })));
  CHECK(same(staging.counts(), sum([&](const ReadEvent& e) { return e.batch == &staging; })));
  CHECK(same(tiers.ledger().all(), sum([](const ReadEvent&) { return true; })));
  // The peer tier's reads and stage 2's figures in stats() come from the ledger.
  prestage::Stats stats;
  job.peers[0]->add_to(stats, tiers.ledger());
  const TierCounts peer = sum([](const ReadEvent& e) { return e.tier == Tier::kPeer; });
  REQUIRE(peer.all_reads() == 3);  // a decode, a read-ahead and a copy
  CHECK(stats.peer_reads == peer.all_reads());
  CHECK(stats.peer_bytes == peer.all_bytes());
  prestage::detail::Stager(tiers, 0).add_to(stats);
  const TierCounts ahead_read =
      sum([](const ReadEvent& e) { return e.purpose == Purpose::kReadAhead; });
  CHECK(stats.read_ahead == ahead_read.all_reads());
  CHECK(stats.read_ahead_bytes == ahead_read.all_bytes());
}

namespace {

// A tar member: a ustar header with its checksum, then `data` padded to 512-byte blocks.
std::string tar_member(const std::string& name, const std::string& data) {
  std::string h(512, '\0');
  std::memcpy(h.data(), name.data(), std::min<size_t>(name.size(), 100));
  std::memcpy(h.data() + 100, "0000644", 7);
  std::snprintf(h.data() + 124, 12, "%011llo", static_cast<unsigned long long>(data.size()));
  std::memcpy(h.data() + 136, "00000000000", 11);
  h[156] = '0';
  std::memcpy(h.data() + 257, "ustar", 6);
  std::memcpy(h.data() + 263, "00", 2);
  std::memset(h.data() + 148, ' ', 8);
  unsigned sum = 0;
  for (const unsigned char c : h) sum += c;
  std::snprintf(h.data() + 148, 8, "%06o", sum);
  return h + data + std::string((512 - data.size() % 512) % 512, '\0');
}

}  // namespace

TEST_CASE(
    "source model: a copy of a compressed file read from the source is learned from its stored "
    "bytes, not its decompressed ones") {
  prestage::test::TempDir dir;
  // A WebDataset shard compressed whole, of members that compress well: its stream on the source
  // is a small part of its decompressed bytes.
  std::string tar;
  for (int k = 0; k < 4; ++k) {
    tar += tar_member("s" + std::to_string(k) + ".jpg",
                      std::string(20000, static_cast<char>('a' + k)));
    tar += tar_member("s" + std::to_string(k) + ".cls", std::to_string(k));
  }
  tar += std::string(1024, '\0');
  std::vector<unsigned char> stream(ZSTD_compressBound(tar.size()));
  const size_t n = ZSTD_compress(stream.data(), stream.size(), tar.data(), tar.size(), 3);
  REQUIRE_FALSE(ZSTD_isError(n));
  stream.resize(n);
  const std::filesystem::path shard = dir / "set" / "s.tar.zst";
  prestage::test::write_file(shard, stream);
  const Catalog catalog = Catalog::from_webdataset({shard.string()});
  REQUIRE(catalog.size() == 4);
  REQUIRE(catalog.file_codec(0) == Catalog::Codec::kZstd);
  REQUIRE(catalog.file_stored_size(0) == n);
  REQUIRE(catalog.file_size(0) == tar.size());

  // Two ranks, so that the tier is on and the router's model learns the PFS from stage 2's copies.
  // Rank 0 owns the one file (its first use is rank 0's first batch): its copy is read from the
  // source.
  LoopNodes nodes(catalog, dir / "stage", 2);
  prestage::detail::Tiers tiers(catalog, nodes.stage[0].get(), uint64_t{1} << 30);
  tiers.set_peers(nodes.peers[0].get());
  std::vector<std::byte> buffer;
  int64_t mtime_ns = 0;
  tiers.open(FileCopy{0, buffer, mtime_ns}, nullptr);
  CHECK(buffer.size() == tar.size());
  const auto source = static_cast<size_t>(prestage::detail::Tier::kSource);
  CHECK(tiers.fetched().reads[source] == 1);
  CHECK(tiers.fetched().bytes[source] == n);  // the ledger: the bytes read from the source
  const auto pfs = model_row(*tiers.source_model(), "pfs");
  CHECK(pfs.reads == 1);
  CHECK(pfs.samples == 1);
  CHECK(pfs.bytes == n);  // the model: the same bytes, not the decompressed ones
  tiers.stop_probes();
}
