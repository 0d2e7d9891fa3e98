#include "tiers/tiers.hpp"

#include <array>
#include <stdexcept>

#include "tiers/peers.hpp"
#include "util/file_io.hpp"

namespace prestage::detail {

namespace {

// The tiers a chain may hold, by their place in Tiers' readers.
enum class Step : uint8_t { kMemory, kStage, kPeer, kAwaitedCopy, kSource };

// One link of a chain: a tier, and the tier a read must start at or before for it to be tried
// (Tiers::serve's `from`: a decode that starts at the stage directory skips memory).
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
                 int64_t& mtime_ns) { copy_file(file, write, buffer, mtime_ns); }),
      peer_tier_(catalog, router_, max_read_bytes),
      awaited_copy_tier_(stage_tier_),
      source_tier_(catalog, router_) {}

Tiers::~Tiers() = default;

void Tiers::set_peers(Peers* peers, bool home_copy_always) {
  router_.reset();
  if (peers != nullptr) router_ = std::make_unique<Router>(catalog_, *peers, home_copy_always);
}

Tier Tiers::open(const Want& want, Delivery& to, TierTally* tally, Tier from) {
  const std::array<TierReader*, 5> readers{&memory_tier_, &stage_tier_, &peer_tier_,
                                           &awaited_copy_tier_, &source_tier_};
  // A decode's read is timed from the tier that serves it; stage 2's from its first try (the
  // router's choice is part of it); a look at where a sample lies is not timed.
  int64_t start = want.purpose == Purpose::kLocate ? 0 : ledger_.now_ns();
  for (const Link& link : chain(want.purpose)) {
    if (link.rank < from) continue;
    if (want.purpose == Purpose::kDecode && want.counted) start = ledger_.now_ns();
    const std::optional<Served> served = readers[static_cast<size_t>(link.step)]->serve(want, to);
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

uint64_t Tiers::sample_size(uint64_t id) const { return catalog_sample_size(catalog_, id); }

void Tiers::check_size(uint64_t id, uint64_t size) const {
  if (size == Catalog::kUnknownSize || size <= max_read_bytes_) return;
  throw DecodeError(catalog_.source_path(id).string(),
                    "sample of " + std::to_string(size) + " bytes exceeds max_sample_bytes (" +
                        std::to_string(max_read_bytes_) + " bytes)");
}

Tier Tiers::serve(uint64_t id, Tier from, std::optional<std::span<const std::byte>> held,
                  TierScratch& scratch, TierTally* tally, Access access, Use use,
                  std::vector<std::byte>* keep) {
  const Catalog::Locator loc = catalog_.locator(id);
  const std::string& path = source_path(loc.file, scratch.source);
  Delivery to;
  to.use = &use;
  to.scratch = &scratch;
  to.keep = keep;
  return open(
      Want{Purpose::kDecode, id, loc, sample_size(id), path, access, held, tally != nullptr}, to,
      tally, from);
}

std::span<const std::byte> Tiers::read(uint64_t id, std::optional<std::span<const std::byte>> held,
                                       std::vector<std::byte>& buffer, TierScratch& scratch,
                                       TierTally* tally) {
  const uint64_t size = sample_size(id);
  check_size(id, size);
  std::span<const std::byte> bytes;
  const Tier tier = serve(
      id, Tier::kMemory, held, scratch, tally, Access::kBytes,
      [&](const ByteSource& at) {
        bytes = at.all(buffer);
        if (size == Catalog::kUnknownSize) check_size(id, bytes.size());
        return static_cast<uint64_t>(bytes.size());
      },
      // A home copy the peer tier fetches lands in `buffer` too, not in the thread's scratch: the
      // caller keeps the bytes while it reads its batch's next samples on this thread.
      &buffer);
  const Catalog::Locator loc = catalog_.locator(id);
  if (tier == Tier::kSource && loc.offset == 0 && loc.length == Catalog::kWholeFile) {
    stage_tier_.stage_miss(loc.file, bytes, scratch.check, router_ != nullptr);
  }
  return bytes;
}

Tier Tiers::locate(uint64_t id, TierTally* tally) {
  const Catalog::Locator loc = catalog_.locator(id);
  std::string path;
  source_path(loc.file, path);
  std::vector<std::byte> check;
  Delivery to;
  to.buffer = &check;
  return open(Want{Purpose::kLocate, id, loc, sample_size(id), path, Access::kLook, std::nullopt,
                   tally != nullptr},
              to, tally);
}

void Tiers::fetch_file(uint64_t file, std::vector<std::byte>& buffer, int64_t& mtime_ns,
                       TierTally* tally) {
  fetch(file, buffer, mtime_ns, tally, nullptr);
}

void Tiers::copy_file(uint64_t file, const StageDirectory::Sink& write,
                      std::vector<std::byte>& buffer, int64_t& mtime_ns, TierTally* tally) {
  fetch(file, buffer, mtime_ns, tally, &write);
}

void Tiers::fetch(uint64_t file, std::vector<std::byte>& buffer, int64_t& mtime_ns,
                  TierTally* tally, const StageDirectory::Sink* write) {
  std::string path;
  source_path(file, path);
  Catalog::Locator whole;
  whole.file = file;
  Delivery to;
  to.buffer = &buffer;
  to.write = write;
  to.mtime_ns = &mtime_ns;
  open(Want{Purpose::kCopy, IoTrace::kNoSample, whole, catalog_.file_size(file), path,
            Access::kBytes, std::nullopt, true},
       to, tally);
  if (write != nullptr && !to.written) (*write)(buffer);
}

void Tiers::fetch_sample(uint64_t id, std::span<std::byte> out, std::vector<std::byte>& fetched,
                         TierTally* tally) {
  const uint64_t size = sample_size(id);
  if (size != out.size()) {
    throw std::logic_error("tiers: a sample read ahead must have its catalog size as its place");
  }
  check_size(id, size);
  const Catalog::Locator loc = catalog_.locator(id);
  std::string path;
  source_path(loc.file, path);
  Delivery to;
  to.out = out;
  to.buffer = &fetched;
  open(Want{Purpose::kReadAhead, id, loc, size, path, Access::kBytes, std::nullopt, true}, to,
       tally);
}

}  // namespace prestage::detail
