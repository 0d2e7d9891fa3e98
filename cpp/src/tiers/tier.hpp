// The shape every tier of the chain has (tiers/tiers.hpp tries them in the order its table gives
// for each purpose): one read is a Want (what is read, and why), its bytes go where the read's
// Delivery says, and a tier either serves the read whole (Served) or declines it, and the next
// tier is tried. A tier counts nothing: the chain records each read it serves, once, in its ledger
// (tiers/ledger.hpp). The tiers, nearest first, each in a file of its own: memory (the bytes stage
// 2 read ahead, tiers/memory_tier.hpp), the stage directory (tiers/stage_tier.hpp), the peers
// (tiers/peer_tier.hpp), the source (tiers/source_tier.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "prestage/catalog.hpp"
#include "tiers/ledger.hpp"
#include "tiers/stage_directory.hpp"
#include "util/byte_source.hpp"

namespace prestage::detail {

// What a use of a sample (Tiers::serve) does with it, which says how a staged copy is checked.
enum class Access : uint8_t {
  kLook,   // reads nothing of its bytes (a size from the catalog or the file's length)
  kBytes,  // reads them whole, with ByteSource::all() (which checks a whole staged copy)
  kFile,   // reads parts of the file itself (a codec's header and data)
};

// Thrown by CheckedCopy::all() for a copy that failed: the next tier serves.
struct CorruptCopy {};

// Per-thread strings for the paths a lookup builds, so that no read allocates once warm.
struct TierScratch {
  std::string staged;
  std::string source;
  std::vector<std::byte> check;    // a staged copy's bytes, read to check it whole
  std::vector<std::byte> fetched;  // a decode's bytes fetched or decompressed, unless kept
};

// A callable borrowed for the length of one call, without an allocation (the use of a sample's
// bytes). It must outlive the call it is passed to.
template <typename Signature>
class FunctionRef;
template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  template <typename F>
  FunctionRef(const F& f) noexcept  // NOLINT(google-explicit-constructor): a parameter's type
      : object_(&f), call_([](const void* object, Args... args) -> R {
          return (*static_cast<const F*>(object))(std::forward<Args>(args)...);
        }) {}
  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

 private:
  const void* object_;
  R (*call_)(const void*, Args...);
};

// A decode's use of a sample's bytes: returns the bytes it took, which are counted (0 with
// Access::kFile from a file: a header looked at, whose data a later use reads and counts).
using Use = FunctionRef<uint64_t(const ByteSource&)>;

// One read through the chain.
struct Want {
  Purpose purpose;
  uint64_t sample;          // the catalog sample; IoTrace::kNoSample for a whole file (kCopy)
  Catalog::Locator loc;     // where it lies in its file (kCopy: the whole file)
  uint64_t size;            // the catalog's size of the bytes wanted (Catalog::kUnknownSize)
  const std::string& path;  // the source path, which errors name
  Access access;            // kDecode: what the use reads
  std::optional<std::span<const std::byte>> held;  // kDecode: the bytes stage 2 read ahead
  // Counted in the ledger: a decode or a look for a batch (a first look at the set is not), and
  // every read of stage 2's.
  bool counted;
};

// Where a read's bytes go, by purpose, and the notes one tier leaves for the tiers after it.
struct Delivery {
  const Use* use = nullptr;        // kDecode: the use of the bytes
  TierScratch* scratch = nullptr;  // kDecode
  // kDecode: where a home copy or a compressed sample's decompressed bytes land for a caller that
  // keeps them past the read (null: scratch->fetched).
  std::vector<std::byte>* keep = nullptr;
  std::span<std::byte> out;  // kReadAhead: the sample's place, of its catalog size
  // kReadAhead: where a home copy lands before it is copied to `out`; kCopy: the file's bytes;
  // kLocate: room to check a staged copy.
  std::vector<std::byte>* buffer = nullptr;
  const StageDirectory::Sink* write = nullptr;  // kCopy: where a streamed copy goes
  int64_t* mtime_ns = nullptr;                  // kCopy: the copy's modification time
  bool pfs_chosen = false;  // the router chose the source, and queued its read in the model
  bool written = false;     // kCopy: the bytes went to `write` as they were read

  std::vector<std::byte>& landing() const noexcept {
    return keep != nullptr ? *keep : scratch->fetched;
  }
};

// A read a tier served: the tier that counts it (the peer tier serves a home copy of this node's
// as kStage), its bytes, and whether it is counted at all (see Use).
struct Served {
  Tier tier;
  uint64_t bytes;
  bool counted = true;
};

// Thread-safe: serve() may be called from any thread at once.
class TierReader {
 public:
  virtual ~TierReader() = default;
  // Serves `want` as `to` says, or declines it (nullopt: the next tier is tried). Errors
  // propagate, but those a tier hides by declining (a staged copy that vanished or failed its
  // check).
  virtual std::optional<Served> serve(const Want& want, Delivery& to) = 0;
};

// kDecode: `to`'s use of `bytes`, served by `tier`, and whether the read is counted.
inline Served use_bytes(Tier tier, const ByteSource& bytes, const Want& want, const Delivery& to) {
  const uint64_t n = (*to.use)(bytes);
  return {tier, n, n != 0 || bytes.file() == nullptr || want.access != Access::kFile};
}

// The source path of catalog file `file`, built in `out` (valid until its next use).
const std::string& source_path(const Catalog& catalog, uint64_t file, std::string& out);

}  // namespace prestage::detail
