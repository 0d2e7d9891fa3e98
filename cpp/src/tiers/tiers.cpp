#include "tiers/tiers.hpp"

#include <array>
#include <stdexcept>
#include <variant>

#include "tiers/peers.hpp"
#include "util/file_io.hpp"

namespace prestage::detail {

namespace {

// The tiers a chain may hold, by their place in Tiers' readers.
enum class Step : uint8_t { kMemory, kStage, kPeer, kAwaitedCopy, kSource };

// One link of a chain: a tier, and the tier a read must start at or before for it to be tried
// (DecodeRead::from: a decode that starts at the stage directory skips memory).
struct Link {
  Step step;
  Tier rank;
};

// The order of the tiers for each purpose: the one table.
constexpr Link kDecodeChain[] = {{Step::kMemory, Tier::kMemory},
                                 {Step::kStage, Tier::kStage},
                                 {Step::kPeer, Tier::kPeer},
                                 {Step::kAwaitedCopy, Tier::kSource},
                                 {Step::kSource, Tier::kSource}};
constexpr Link kLocateChain[] = {{Step::kStage, Tier::kStage}, {Step::kSource, Tier::kSource}};
constexpr Link kReadAheadChain[] = {{Step::kPeer, Tier::kPeer}, {Step::kSource, Tier::kSource}};
constexpr Link kCopyChain[] = {{Step::kPeer, Tier::kPeer}, {Step::kSource, Tier::kSource}};

std::span<const Link> chain(Purpose purpose) {
  switch (purpose) {
    case Purpose::kDecode:
      return kDecodeChain;
    case Purpose::kLocate:
      return kLocateChain;
    case Purpose::kReadAhead:
      return kReadAheadChain;
    case Purpose::kCopy:
      return kCopyChain;
  }
  return {};
}

}  // namespace

const std::string& source_path(const Catalog& catalog, uint64_t file, std::string& out) {
  out.assign(catalog.root().native());
  if (!out.empty() && out.back() != '/') out += '/';
  out += catalog.file_path(file);
  return out;
}

Tiers::Tiers(const Catalog& catalog, StageDirectory* stage, uint64_t max_read_bytes)
    : catalog_(catalog),
      stage_(stage),
      max_read_bytes_(max_read_bytes),
      stage_tier_(
          catalog, stage,
          [this](uint64_t file, const StageDirectory::Sink& write, std::vector<std::byte>& buffer,
                 int64_t& mtime_ns) { open(FileCopy{file, buffer, mtime_ns, &write}, nullptr); }),
      peer_tier_(catalog, router_, max_read_bytes),
      awaited_copy_tier_(stage_tier_),
      source_tier_(catalog, router_) {}

Tiers::~Tiers() = default;

void Tiers::set_peers(Peers* peers, bool home_copy_always) {
  router_.reset();
  if (peers != nullptr) router_ = std::make_unique<Router>(catalog_, *peers, home_copy_always);
}

Tiers::Opened Tiers::open(const Request& request, TierTally* tally) {
  return std::visit([&](const auto& r) { return handle(r, tally); }, request);
}

template <typename R>
Tier Tiers::chain_read(Want& want, const R& request, TierTally* tally, Tier from) {
  const std::array<TierReader*, 5> readers{&memory_tier_, &stage_tier_, &peer_tier_,
                                           &awaited_copy_tier_, &source_tier_};
  // A decode's read is timed from the tier that serves it; stage 2's from its first try (the
  // router's choice is part of it); a look at where a sample lies is not timed.
  int64_t start = want.purpose == Purpose::kLocate ? 0 : ledger_.now_ns();
  for (const Link& link : chain(want.purpose)) {
    if (link.rank < from) continue;
    if (want.purpose == Purpose::kDecode && want.counted) start = ledger_.now_ns();
    const std::optional<Served> served =
        readers[static_cast<size_t>(link.step)]->serve(want, request);
    if (!served) continue;
    if (want.counted && served->counted) {
      const bool range = want.purpose == Purpose::kDecode || want.purpose == Purpose::kReadAhead;
      ledger_.record({served->tier, want.purpose, want.sample, want.loc.file,
                      range ? want.loc.offset : 0, served->bytes, start, tally});
    }
    return served->tier;
  }
  throw std::logic_error("tiers: no tier served a read");  // the source serves or throws
}

Tiers::Opened Tiers::handle(const DecodeRead& read, TierTally* tally) {
  const Catalog::Locator loc = catalog_.locator(read.sample);
  const std::string& path = source_path(loc.file, read.scratch.source);
  Want want{Purpose::kDecode, read.sample, loc, sample_size(read.sample), path, tally != nullptr};
  return {chain_read(want, read, tally, read.from), {}};
}

Tiers::Opened Tiers::handle(const SampleBytes& read, TierTally* tally) {
  const uint64_t id = read.sample;
  const uint64_t size = sample_size(id);
  check_size(id, size);
  std::span<const std::byte> bytes;
  const auto use = [&](const ByteSource& at) {
    bytes = at.all(read.buffer);
    if (size == Catalog::kUnknownSize) check_size(id, bytes.size());
    return static_cast<uint64_t>(bytes.size());
  };
  // A home copy the peer tier fetches lands in `buffer` too, not in the thread's scratch: the
  // caller keeps the bytes while it reads its batch's next samples on this thread.
  const Tier tier =
      handle(DecodeRead{id, Access::kBytes, use, read.scratch, read.held, &read.buffer}, tally)
          .tier;
  const Catalog::Locator loc = catalog_.locator(id);
  if (tier == Tier::kSource && loc.offset == 0 && loc.length == Catalog::kWholeFile) {
    stage_tier_.stage_miss(loc.file, bytes, read.scratch.check, router_ != nullptr);
  }
  return {tier, bytes};
}

Tiers::Opened Tiers::handle(const Look& look, TierTally* tally) {
  const Catalog::Locator loc = catalog_.locator(look.sample);
  std::string path;
  source_path(loc.file, path);
  Want want{Purpose::kLocate, look.sample, loc, sample_size(look.sample), path, tally != nullptr};
  return {chain_read(want, look, tally, Tier::kMemory), {}};
}

Tiers::Opened Tiers::handle(const Prefetch& read, TierTally* tally) {
  const uint64_t size = sample_size(read.sample);
  if (size != read.out.size()) {
    throw std::logic_error("tiers: a sample read ahead must have its catalog size as its place");
  }
  check_size(read.sample, size);
  const Catalog::Locator loc = catalog_.locator(read.sample);
  std::string path;
  source_path(loc.file, path);
  Want want{Purpose::kReadAhead, read.sample, loc, size, path, true};
  return {chain_read(want, read, tally, Tier::kMemory), {}};
}

Tiers::Opened Tiers::handle(const FileCopy& copy, TierTally* tally) {
  std::string path;
  source_path(copy.file, path);
  Catalog::Locator whole;
  whole.file = copy.file;
  Want want{Purpose::kCopy, IoTrace::kNoSample, whole, catalog_.file_size(copy.file), path, true};
  const Tier tier = chain_read(want, copy, tally, Tier::kMemory);
  // Counted as read before it is written: a copy that fails to be written was still read.
  if (copy.write != nullptr && !want.written) (*copy.write)(copy.buffer);
  return {tier, {}};
}

uint64_t Tiers::sample_size(uint64_t id) const { return catalog_sample_size(catalog_, id); }

void Tiers::check_size(uint64_t id, uint64_t size) const {
  if (size == Catalog::kUnknownSize || size <= max_read_bytes_) return;
  throw DecodeError(catalog_.source_path(id).string(),
                    "sample of " + std::to_string(size) + " bytes exceeds max_sample_bytes (" +
                        std::to_string(max_read_bytes_) + " bytes)");
}

}  // namespace prestage::detail
