// The tier seam: every read of a sample's bytes tries memory, the stage directory, then the source,
// and is counted in the tier that served it.
#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "prestage/catalog.hpp"
#include "prestage/error.hpp"
#include "test_util.hpp"
#include "tiers/stage_directory.hpp"
#include "tiers/tiers.hpp"

using prestage::Catalog;
using prestage::detail::Access;
using prestage::detail::DecodeRead;
using prestage::detail::FileCopy;
using prestage::detail::Look;
using prestage::detail::Prefetch;
using prestage::detail::SampleBytes;
using prestage::detail::StageDirectory;
using prestage::detail::Tier;
using prestage::detail::Tiers;
using prestage::detail::TierScratch;
using prestage::detail::TierTally;
using prestage::test::TempDir;

namespace {

std::vector<unsigned char> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(std::span<const std::byte> b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}
size_t at(Tier t) { return static_cast<size_t>(t); }

struct Set {
  TempDir dir;
  Catalog catalog;
  Set() : catalog(make()) {}
  Catalog make() {
    std::filesystem::create_directories(dir / "src");
    prestage::test::write_file(dir / "src/a", bytes_of("alpha"));
    prestage::test::write_file(dir / "src/b", bytes_of("bravo!"));
    prestage::test::write_file(dir / "src/c", bytes_of(std::string(100, 'c')));
    return Catalog::from_paths(dir / "src", {"a", "b", "c"});
  }
};

void stage_file(StageDirectory& stage, const Catalog& catalog, uint64_t id) {
  std::vector<std::byte> buffer;
  REQUIRE(stage.try_claim(id));
  REQUIRE(stage.stage(id, catalog.file_source_path(id).string(), buffer) ==
          StageDirectory::Outcome::kStaged);
}

}  // namespace

TEST_CASE("tiers: memory, then the stage directory, then the source, each counted") {
  Set set;
  StageDirectory stage(set.dir / "stage", set.catalog);
  stage_file(stage, set.catalog, 1);
  Tiers tiers(set.catalog, &stage, 1 << 20);
  TierScratch scratch;
  TierTally tally;
  std::vector<std::byte> buffer;

  const std::string held_text = "held!";
  std::vector<std::byte> held(held_text.size());
  std::memcpy(held.data(), held_text.data(), held.size());
  TierTally batch;  // one batch's reads, counted besides the tiers' own
  CHECK(text(tiers.open(SampleBytes{0, std::span<const std::byte>(held), buffer, scratch}, &batch)
                 .bytes) == "held!");  // memory first
  CHECK(text(tiers.open(SampleBytes{1, std::nullopt, buffer, scratch}, &batch).bytes) == "bravo!");
  CHECK(text(tiers.open(SampleBytes{0, std::nullopt, buffer, scratch}, &batch).bytes) == "alpha");
  CHECK(text(tiers.open(SampleBytes{0, std::nullopt, buffer, scratch}, nullptr).bytes) ==
        "alpha");  // a look: uncounted

  const auto served = tiers.served();
  CHECK(batch.counts().reads == served.reads);
  CHECK(batch.counts().bytes == served.bytes);
  CHECK(served.reads[at(Tier::kMemory)] == 1);
  CHECK(served.bytes[at(Tier::kMemory)] == 5);
  CHECK(served.reads[at(Tier::kStage)] == 1);
  CHECK(served.bytes[at(Tier::kStage)] == 6);
  CHECK(served.reads[at(Tier::kSource)] == 1);
  CHECK(served.bytes[at(Tier::kSource)] == 5);
  CHECK(served.reads[at(Tier::kPeer)] == 0);
  CHECK(tiers.fetched().reads[at(Tier::kSource)] == 0);
}

TEST_CASE("tiers: a staged copy that vanished is read from the source") {
  Set set;
  StageDirectory stage(set.dir / "stage", set.catalog);
  stage_file(stage, set.catalog, 1);
  std::filesystem::remove(stage.staged_path(1));
  Tiers tiers(set.catalog, &stage, 1 << 20);
  TierScratch scratch;
  TierTally tally;
  std::vector<std::byte> buffer;
  CHECK(text(tiers.open(SampleBytes{1, std::nullopt, buffer, scratch}, &tally).bytes) == "bravo!");
  CHECK(tiers.served().reads[at(Tier::kStage)] == 0);
  CHECK(tiers.served().reads[at(Tier::kSource)] == 1);
}

TEST_CASE("tiers: a copy left by an earlier run is not served until it is checked") {
  Set set;
  std::string staged;
  {
    StageDirectory earlier(set.dir / "stage", set.catalog);
    stage_file(earlier, set.catalog, 1);
    staged = earlier.staged_path(1);
  }
  // The copy rots between runs (same size, other bytes): only its record's CRC can tell.
  prestage::test::write_file(staged, bytes_of("BRAVO!"));
  StageDirectory stage(set.dir / "stage", set.catalog);
  REQUIRE(stage.is_staged(1));
  REQUIRE(stage.unverified(1));
  Tiers tiers(set.catalog, &stage, 1 << 20);
  TierScratch scratch;
  TierTally tally;
  std::vector<std::byte> buffer;
  CHECK(text(tiers.open(SampleBytes{1, std::nullopt, buffer, scratch}, &tally).bytes) == "bravo!");
  CHECK(tiers.served().reads[at(Tier::kStage)] == 0);
  CHECK(tiers.served().reads[at(Tier::kSource)] == 1);
  // Checked, it fails its record and is gone; the next read is the source's again.
  CHECK_FALSE(stage.verify(1, buffer));
  CHECK(text(tiers.open(SampleBytes{1, std::nullopt, buffer, scratch}, &tally).bytes) == "bravo!");
}

TEST_CASE("tiers: serve starts at the tier a first look chose and counts only when asked") {
  Set set;
  StageDirectory stage(set.dir / "stage", set.catalog);
  stage_file(stage, set.catalog, 1);
  Tiers tiers(set.catalog, &stage, 1 << 20);
  TierScratch scratch;
  TierTally tally;
  std::string file;
  const auto look = [&](const prestage::detail::ByteSource& sample) -> uint64_t {
    file = sample.file()->path();
    return 6;
  };
  CHECK(tiers
            .open(DecodeRead{1, Access::kLook, look, scratch, std::nullopt, nullptr, Tier::kStage},
                  nullptr)
            .tier == Tier::kStage);
  CHECK(file == stage.staged_path(1));
  CHECK(tiers
            .open(DecodeRead{1, Access::kLook, look, scratch, std::nullopt, nullptr, Tier::kSource},
                  &tally)
            .tier == Tier::kSource);
  CHECK(file == set.catalog.file_source_path(1).string());
  CHECK(tiers.served().reads[at(Tier::kStage)] == 0);
  CHECK(tiers.served().reads[at(Tier::kSource)] == 1);
  // An error other than a vanished copy is the sample's: it is not hidden by the next tier.
  CHECK_THROWS_AS(tiers
                      .open(DecodeRead{1, Access::kLook,
                                       [](const prestage::detail::ByteSource& s) -> uint64_t {
                                         throw prestage::DecodeError(s.path(), "bad");
                                       },
                                       scratch, std::nullopt, nullptr, Tier::kStage},
                            &tally)
                      .tier,
                  prestage::DecodeError);
}

TEST_CASE("tiers: stage 2's fetches read below the stage directory and are counted apart") {
  Set set;
  StageDirectory stage(set.dir / "stage", set.catalog);
  stage_file(stage, set.catalog, 0);
  Tiers tiers(set.catalog, &stage, 1 << 20);
  std::vector<std::byte> buffer;
  int64_t mtime = 0;
  TierTally batch;
  tiers.open(FileCopy{0, buffer, mtime}, &batch);  // staged, yet fetched from the source: a copy
  CHECK(text(buffer) == "alpha");
  CHECK(mtime > 0);  // the source's, from the same open
  CHECK(tiers.fetched().reads[at(Tier::kSource)] == 1);
  CHECK(tiers.fetched().bytes[at(Tier::kSource)] == 5);
  // A read ahead: samples whose sizes the catalog records (byte ranges), into their places.
  const Catalog ranges =
      Catalog::from_ranges(set.dir / "src", {"a", "c"}, {{0, 1, 3}, {1, 0, 100}});
  Tiers ahead(ranges, nullptr, 1 << 20);
  std::vector<std::byte> place(100), fetched;
  ahead.open(Prefetch{1, place, fetched}, &batch);
  CHECK(text(place) == std::string(100, 'c'));
  std::vector<std::byte> part(3);
  ahead.open(Prefetch{0, part, fetched}, nullptr);  // no tally: counted in the tiers' own only
  CHECK(text(part) == "lph");
  CHECK(ahead.fetched().reads[at(Tier::kSource)] == 2);
  CHECK(ahead.fetched().bytes[at(Tier::kSource)] == 103);
  CHECK(batch.counts().reads[at(Tier::kSource)] == 2);
  CHECK(batch.counts().bytes[at(Tier::kSource)] == 105);
  CHECK(ahead.served().reads[at(Tier::kSource)] == 0);
  // A place of another size than the sample's is a broken invariant, never a short read.
  CHECK_THROWS_AS(ahead.open(Prefetch{0, place, fetched}, nullptr), std::logic_error);
}

TEST_CASE("tiers: a sample over the limit is refused, unread when its size is known") {
  Set set;
  // A folder walk records every file's size.
  std::filesystem::create_directories(set.dir / "walked/class");
  prestage::test::write_file(set.dir / "walked/class/big.bin", bytes_of(std::string(100, 'x')));
  prestage::test::write_file(set.dir / "walked/class/small.bin", bytes_of("small"));
  const Catalog walked = Catalog::from_folder(set.dir / "walked", {".bin"});
  const uint64_t big = walked.file_path(0) == "class/big.bin" ? 0 : 1;
  Tiers known(walked, nullptr, 10);
  TierScratch scratch;
  TierTally tally;
  std::vector<std::byte> buffer;
  CHECK_THROWS_AS(known.open(SampleBytes{big, std::nullopt, buffer, scratch}, &tally).bytes,
                  prestage::DecodeError);
  std::vector<std::byte> place(100);
  CHECK_THROWS_AS(known.open(Prefetch{big, place, buffer}, nullptr), prestage::DecodeError);
  CHECK(buffer.capacity() == 0);
  CHECK(text(known.open(SampleBytes{1 - big, std::nullopt, buffer, scratch}, &tally).bytes) ==
        "small");
  // A list without sizes: refused once read.
  Tiers unknown(set.catalog, nullptr, 10);
  CHECK_THROWS_AS(unknown.open(SampleBytes{2, std::nullopt, buffer, scratch}, &tally).bytes,
                  prestage::DecodeError);
  // Nothing of unknown size is read ahead: a place of any size is refused.
  CHECK_THROWS_AS(unknown.open(Prefetch{2, place, buffer}, nullptr), std::logic_error);
}

TEST_CASE(
    "tiers: a staged copy changed after it was written is never served, read whole or in part") {
  Set set;
  StageDirectory stage(set.dir / "stage", set.catalog);
  stage_file(stage, set.catalog, 1);
  stage_file(stage, set.catalog, 2);
  REQUIRE_FALSE(stage.unverified(1));
  Tiers tiers(set.catalog, &stage, 1 << 20);
  TierScratch scratch;
  TierTally tally;
  std::vector<std::byte> buffer;
  CHECK(text(tiers.open(SampleBytes{1, std::nullopt, buffer, scratch}, &tally).bytes) == "bravo!");
  CHECK(tiers.served().reads[at(Tier::kStage)] == 1);
  // Overwritten in place (same size, other bytes: a failing disk, a stray job), during the run.
  prestage::test::write_file(stage.staged_path(1), bytes_of("BRAVO!"));
  prestage::test::write_file(stage.staged_path(2), bytes_of(std::string(100, 'C')));
  // Read whole: its CRC fails, the copy goes, the source serves.
  CHECK(text(tiers.open(SampleBytes{1, std::nullopt, buffer, scratch}, &tally).bytes) == "bravo!");
  CHECK(tiers.served().reads[at(Tier::kStage)] == 1);
  CHECK(tiers.served().reads[at(Tier::kSource)] == 1);
  CHECK(stage.corrupt() == 1);
  CHECK_FALSE(stage.is_staged(1));
  CHECK_FALSE(std::filesystem::exists(stage.staged_path(1)));
  // Read in part (as a codec reads a header): its identity changed, so its bytes are checked whole
  // first, and fail.
  std::string served_from;
  const auto part = [&](const prestage::detail::ByteSource& at) -> uint64_t {
    served_from = at.file()->path();
    return 10;
  };
  CHECK(tiers
            .open(DecodeRead{2, Access::kFile, part, scratch, std::nullopt, nullptr, Tier::kStage},
                  &tally)
            .tier == Tier::kSource);
  CHECK(served_from == set.catalog.file_source_path(2).string());
  CHECK(stage.corrupt() == 2);
  CHECK_FALSE(stage.is_staged(2));
  // decode=locate points at the source for a copy that fails.
  stage_file(stage, set.catalog, 2);
  CHECK(tiers.open(Look{2}, nullptr).tier == Tier::kStage);
  prestage::test::write_file(stage.staged_path(2), bytes_of(std::string(100, 'D')));
  CHECK(tiers.open(Look{2}, nullptr).tier == Tier::kSource);
  CHECK(stage.corrupt() == 3);
}

TEST_CASE(
    "tiers: a copy read in part is checked whole until it has settled, then by its identity") {
  Set set;
  StageDirectory stage(set.dir / "stage", set.catalog);
  stage_file(stage, set.catalog, 2);
  Tiers tiers(set.catalog, &stage, 1 << 20);
  TierScratch scratch;
  const auto part = [](const prestage::detail::ByteSource&) -> uint64_t { return 10; };
  // Younger than the file times' tick: a write in it would not show, so each read checks it whole.
  for (int i = 0; i < 2; ++i) {
    scratch.check.clear();
    CHECK(
        tiers
            .open(DecodeRead{2, Access::kFile, part, scratch, std::nullopt, nullptr, Tier::kStage},
                  nullptr)
            .tier == Tier::kStage);
    CHECK(scratch.check.size() == 100);
  }
  // Settled: checked whole once more, then trusted while its identity holds.
  stage.set_settle_time(std::chrono::nanoseconds(0));
  scratch.check.clear();
  CHECK(tiers
            .open(DecodeRead{2, Access::kFile, part, scratch, std::nullopt, nullptr, Tier::kStage},
                  nullptr)
            .tier == Tier::kStage);
  CHECK(scratch.check.size() == 100);
  scratch.check.clear();
  CHECK(tiers
            .open(DecodeRead{2, Access::kFile, part, scratch, std::nullopt, nullptr, Tier::kStage},
                  nullptr)
            .tier == Tier::kStage);
  CHECK(scratch.check.empty());
  CHECK(stage.corrupt() == 0);
  // Any write changes its identity (a tick later at most): checked whole again, and caught.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  prestage::test::write_file(stage.staged_path(2), bytes_of(std::string(100, 'X')));
  CHECK(tiers
            .open(DecodeRead{2, Access::kFile, part, scratch, std::nullopt, nullptr, Tier::kStage},
                  nullptr)
            .tier == Tier::kSource);
  CHECK(stage.corrupt() == 1);
}

TEST_CASE("tiers: a use that reads a whole staged copy must check it") {
  Set set;
  StageDirectory stage(set.dir / "stage", set.catalog);
  stage_file(stage, set.catalog, 1);
  Tiers tiers(set.catalog, &stage, 1 << 20);
  TierScratch scratch;
  CHECK_THROWS_AS(
      tiers
          .open(DecodeRead{1, Access::kBytes,
                           [](const prestage::detail::ByteSource&) -> uint64_t { return 6; },
                           scratch, std::nullopt, nullptr, Tier::kStage},
                nullptr)
          .tier,
      std::logic_error);
}

namespace {

// Files whose sizes and modification times the catalog records (a list, as a folder walk records
// them): f0..f3, 1000 bytes each, every one different.
struct Recorded {
  static constexpr size_t kSize = 1000;
  TempDir dir;
  Catalog catalog;
  Recorded() : catalog(make()) {}
  static std::string content(uint64_t f) {
    std::string s(kSize, '\0');
    for (size_t j = 0; j < kSize; ++j) s[j] = static_cast<char>((f * 131 + j * 7) & 0xff);
    return s;
  }
  Catalog make() {
    std::ofstream list(dir / "list");
    for (uint64_t f = 0; f < 4; ++f) {
      prestage::test::write_file(dir / "src" / ("f" + std::to_string(f)), bytes_of(content(f)));
      list << "f" << f << "\n";
    }
    list.close();
    return Catalog::from_list(dir / "list", dir / "src");
  }
};

std::string file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST_CASE("tiers: a whole file read from the source is staged as stage 2 would stage it") {
  Recorded set;
  for (const uint64_t bound : {uint64_t{0}, uint64_t{10'000}}) {
    CAPTURE(bound);
    const auto ours = set.dir / ("stage3-" + std::to_string(bound));
    const auto theirs = set.dir / ("stage2-" + std::to_string(bound));
    {
      StageDirectory stage(ours, set.catalog);
      Tiers tiers(set.catalog, &stage, 1 << 20);
      tiers.set_stage_bound(bound);
      TierScratch scratch;
      TierTally tally;
      std::vector<std::byte> buffer;
      CHECK(text(tiers.open(SampleBytes{1, std::nullopt, buffer, scratch}, &tally).bytes) ==
            Recorded::content(1));
      CHECK(tiers.served().reads[at(Tier::kSource)] == 1);
      CHECK(tiers.misses_staged() == 1);
      REQUIRE(stage.servable(1));
      CHECK(file_text(stage.staged_path(1)) == Recorded::content(1));
      CHECK(stage.node().used() == Recorded::kSize);  // its bytes, counted once
      // The next read is the copy's: the source is read once.
      CHECK(text(tiers.open(SampleBytes{1, std::nullopt, buffer, scratch}, &tally).bytes) ==
            Recorded::content(1));
      CHECK(tiers.served().reads[at(Tier::kStage)] == 1);
      CHECK(tiers.served().reads[at(Tier::kSource)] == 1);
      CHECK(tiers.misses_staged() == 1);
      // Stage 2's copy of the same file in a directory of its own: the record to match.
      StageDirectory other(theirs, set.catalog);
      Tiers copier(set.catalog, &other, 1 << 20);
      REQUIRE(other.try_claim(1));
      CHECK(other.stage(1,
                        StageDirectory::Stream([&](const StageDirectory::Sink& write,
                                                   std::vector<std::byte>& out, int64_t& mtime_ns) {
                          copier.open(FileCopy{1, out, mtime_ns, &write}, nullptr);
                        }),
                        buffer) == StageDirectory::Outcome::kStaged);
      CHECK(stage.staged_size(1) == other.staged_size(1));
      CHECK(stage.staged_crc(1) == other.staged_crc(1));
    }
    // A later run's start-up vouches for both copies by their records (size, the source's time,
    // against the catalog's), and their bytes pass the check against the CRC.
    for (const auto& area : {ours, theirs}) {
      StageDirectory later(area, set.catalog);
      CHECK(later.found_at_start() == 1);
      REQUIRE(later.is_staged(1));
      std::vector<std::byte> buffer;
      CHECK(later.verify(1, buffer));
      CHECK(text(buffer) == Recorded::content(1));
    }
    CHECK(file_text(StageDirectory::copy_path(StageDirectory::area_of(ours, set.catalog), 1)) ==
          file_text(StageDirectory::copy_path(StageDirectory::area_of(theirs, set.catalog), 1)));
  }
}

TEST_CASE("tiers: a miss with no room in the bound leaves nothing staged") {
  Recorded set;
  StageDirectory stage(set.dir / "stage", set.catalog);
  Tiers tiers(set.catalog, &stage, 1 << 20);
  tiers.set_stage_bound(Recorded::kSize + Recorded::kSize / 2);  // room for one copy
  TierScratch scratch;
  TierTally tally;
  std::vector<std::byte> buffer;
  CHECK(text(tiers.open(SampleBytes{0, std::nullopt, buffer, scratch}, &tally).bytes) ==
        Recorded::content(0));
  CHECK(stage.servable(0));
  CHECK(text(tiers.open(SampleBytes{2, std::nullopt, buffer, scratch}, &tally).bytes) ==
        Recorded::content(2));
  CHECK(stage.is_absent(2));
  CHECK_FALSE(stage.node().claimed(2));
  CHECK_FALSE(std::filesystem::exists(stage.staged_path(2)));
  CHECK_FALSE(std::filesystem::exists(stage.staged_path(2) + ".part"));
  CHECK(stage.node().used() == Recorded::kSize);
  CHECK(tiers.misses_staged() == 1);
  // Still read from the source, and still not staged.
  CHECK(text(tiers.open(SampleBytes{2, std::nullopt, buffer, scratch}, &tally).bytes) ==
        Recorded::content(2));
  CHECK(tiers.served().reads[at(Tier::kSource)] == 3);
  CHECK(stage.is_absent(2));
}

TEST_CASE(
    "tiers: a miss completes stage 1's claim on its reservation, and leaves a copy under way") {
  Recorded set;
  StageDirectory stage(set.dir / "stage", set.catalog);
  Tiers tiers(set.catalog, &stage, 1 << 20);
  const uint64_t bound = 10 * Recorded::kSize;
  tiers.set_stage_bound(bound);
  TierScratch scratch;
  TierTally tally;
  std::vector<std::byte> buffer;
  // Stage 1 claimed file 3 for a later batch (reserved, then claimed); its copy has not begun.
  REQUIRE(stage.reserve(3, Recorded::kSize, bound));
  REQUIRE(stage.try_claim(3));
  CHECK(text(tiers.open(SampleBytes{3, std::nullopt, buffer, scratch}, &tally).bytes) ==
        Recorded::content(3));
  CHECK(stage.servable(3));
  CHECK(stage.node().used() == Recorded::kSize);  // the claim's reservation, not a second one
  CHECK_FALSE(stage.node().claimed(3));
  CHECK(tiers.misses_staged() == 1);
  // Stage 2's turn finds it done.
  CHECK(stage.stage(3, set.catalog.file_source_path(3).string(), buffer) ==
        StageDirectory::Outcome::kDropped);
  CHECK(file_text(stage.staged_path(3)) == Recorded::content(3));

  // File 2 is being copied (stage 2 holds it) when stage 3 reads it from the source: left to its
  // copier, which publishes its own copy.
  REQUIRE(stage.reserve(2, Recorded::kSize, bound));
  REQUIRE(stage.try_claim(2));
  TierScratch reader;
  std::vector<std::byte> read_bytes;
  CHECK(
      stage.stage(
          2,
          StageDirectory::Stream([&](const StageDirectory::Sink& write, std::vector<std::byte>& out,
                                     int64_t& mtime_ns) {
            CHECK(stage.state(2) == StageDirectory::kCopying);
            CHECK(
                text(tiers.open(SampleBytes{2, std::nullopt, read_bytes, reader}, &tally).bytes) ==
                Recorded::content(2));
            CHECK(tiers.misses_staged() == 1);
            tiers.open(FileCopy{2, out, mtime_ns, &write}, nullptr);
          }),
          buffer) == StageDirectory::Outcome::kStaged);
  CHECK(stage.servable(2));
  CHECK(stage.node().used() == 2 * Recorded::kSize);
}

TEST_CASE("tiers: misses that are not a whole file of a recorded size and time are not staged") {
  Recorded set;
  // Byte ranges of files whose sizes and times are recorded (a shard's samples; one from the
  // start), and whole files without a recorded size or time.
  const Catalog ranges =
      Catalog::from_located(set.dir / "src", {"f0", "f1"}, {{0, 0, 10}, {1, 10, 20}}, {}, {}, {});
  REQUIRE(ranges.file_mtime(0) != Catalog::kUnknownMtime);
  const Catalog paths = Catalog::from_paths(set.dir / "src", {"f0", "f1"});
  for (const Catalog* catalog : {&ranges, &paths}) {
    TempDir stage_dir;
    StageDirectory stage(stage_dir / "stage", *catalog);
    Tiers tiers(*catalog, &stage, 1 << 20);
    tiers.set_stage_bound(0);
    TierScratch scratch;
    TierTally tally;
    std::vector<std::byte> buffer;
    for (uint64_t id = 0; id < 2; ++id)
      tiers.open(SampleBytes{id, std::nullopt, buffer, scratch}, &tally);
    CHECK(tiers.served().reads[at(Tier::kSource)] == 2);
    CHECK(tiers.misses_staged() == 0);
    CHECK(stage.is_absent(0));
    CHECK(stage.is_absent(1));
  }
  // Without set_stage_bound (a loader with no usable stage directory sets none), nothing either.
  StageDirectory stage(set.dir / "unset", set.catalog);
  Tiers tiers(set.catalog, &stage, 1 << 20);
  TierScratch scratch;
  std::vector<std::byte> buffer;
  tiers.open(SampleBytes{0, std::nullopt, buffer, scratch}, nullptr);
  CHECK(stage.is_absent(0));
}
