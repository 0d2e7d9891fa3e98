// The shape every tier of the chain has (tiers/tiers.hpp tries them in the order its table gives
// for each purpose): one read is a request of its purpose's type (what its caller asks for, and
// where the bytes go) and a Want (what is read, as the tiers see it), and a tier either serves the
// read whole (Served) or declines it, and the next tier is tried. A tier counts nothing: the chain
// records each read it serves, once, in its ledger (tiers/ledger.hpp). The tiers, nearest first,
// each in a file of its own: memory (the bytes stage 2 read ahead, tiers/memory_tier.hpp), the
// stage directory (tiers/stage_tier.hpp), the peers (tiers/peer_tier.hpp), the source
// (tiers/source_tier.hpp).
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

// What a use of a sample (DecodeRead) does with it, which says how a staged copy is checked.
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

// The requests Tiers::open serves, one per purpose: each holds what its caller asks for and where
// the bytes go, nothing of the others'. They live on the caller's stack for the one call, with the
// buffers they name; the ByteSource a use sees is valid during the use alone.

// Stage 3: `use` called with sample `sample`'s bytes (a ByteSource: its byte range, or its whole
// file for a sample of the whole file or a slice of it) from the first tier of the decode chain
// from `from` on that has them; `access` says what `use` reads (see Access, and Tiers::open for how
// a staged copy is checked). A home copy fetched through the peer tier, or a compressed sample's
// bytes decompressed from the source, land in `*keep` (a caller that keeps them past the call: the
// ByteSource `use` saw stays valid while it is not changed), else in scratch.fetched. The sample's
// source path is left in scratch.source.
struct DecodeRead {
  uint64_t sample;
  Access access;
  Use use;
  TierScratch& scratch;
  std::optional<std::span<const std::byte>> held = std::nullopt;  // stage 2's bytes (memory)
  std::vector<std::byte>* keep = nullptr;
  Tier from = Tier::kMemory;

  std::vector<std::byte>& landing() const noexcept {
    return keep != nullptr ? *keep : scratch.fetched;
  }
};

// Stage 3: sample `sample`'s bytes whole, in memory: `held` (stage 2's), or read (or fetched from
// a peer) into `buffer` (resized to fit; the bytes stay valid while it is not changed), through
// the decode chain as a DecodeRead of Access::kBytes. A sample over the size limit is refused
// (DecodeError) before anything is allocated for it. The sample's source path is left in
// scratch.source. A miss read whole from the source is published as its file's copy
// (Tiers::misses_staged()).
struct SampleBytes {
  uint64_t sample;
  std::optional<std::span<const std::byte>> held;
  std::vector<std::byte>& buffer;
  TierScratch& scratch;
};

// decode=locate: the tier that would serve sample `sample` now, without reading it: the stage
// directory for a copy it may serve (as a DecodeRead's chain decides), else the source. Counted as
// a read of the sample's size (0 when unknown).
struct Look {
  uint64_t sample;
};

// Stage 2's read-ahead: sample `sample`'s bytes from the tiers below the stage directory (a peer's
// home copy, then the source) into `out`, which must be exactly the size the catalog records for
// it (a sample of unknown size is never read ahead: std::logic_error); a home copy the peer tier
// sends lands in `fetched` first (the caller's, reused). A sample over the size limit is refused
// (DecodeError); a sample of a compressed file is not read from the source (an IoError: stage 3
// reads it from the file's copy).
struct Prefetch {
  uint64_t sample;
  std::span<std::byte> out;
  std::vector<std::byte>& fetched;
};

// Stage 2's copies: the whole of catalog file `file`, from the tiers below the stage directory,
// into `buffer` (resized to fit), or, with `write`, to `write` (a copy written as it is read,
// StageDirectory::Stream): a compressed file read from the source in pieces of
// Decompressor::kChunk (`buffer` holds one), its size and CRC checked once the last is written (a
// DecodeError then: the copy is given up), any other file read whole into `buffer`, then written.
// `mtime_ns` gets the source's modification time. A compressed file is decompressed as it is read
// from the source (its decompressed bytes are checked against the catalog's size and CRC: a
// DecodeError naming the file if they differ, an IoError if the file's size changed); a home copy
// on another node holds them already. With the peer tier on, a file the catalog records the size
// of comes from its home copy on another node (checked against the size and the owner's CRC-32C)
// or from the source, whichever the source model expects to finish first, as a Prefetch chooses
// (the copy is then recorded with the catalog's modification time, kUnknownMtime if none).
struct FileCopy {
  uint64_t file;
  std::vector<std::byte>& buffer;
  int64_t& mtime_ns;
  const StageDirectory::Sink* write = nullptr;
};

// What a read is of, as the tiers of its chain see it (Tiers::open builds it from the request),
// and the notes one tier leaves for the tiers after it.
struct Want {
  Purpose purpose;
  uint64_t sample;          // the catalog sample; IoTrace::kNoSample for a whole file (kCopy)
  Catalog::Locator loc;     // where it lies in its file (kCopy: the whole file)
  uint64_t size;            // the catalog's size of the bytes wanted (Catalog::kUnknownSize)
  const std::string& path;  // the source path, which errors name
  // Counted in the ledger: a decode or a look for a batch (a first look at the set is not), and
  // every read of stage 2's.
  bool counted;
  bool pfs_chosen = false;  // the router chose the source, and queued its read in the model
  bool written = false;     // kCopy: the bytes went to FileCopy::write as they were read
};

// A read a tier served: the tier that counts it (the peer tier serves a home copy of this node's
// as kStage), its bytes, and whether it is counted at all (see Use).
struct Served {
  Tier tier;
  uint64_t bytes;
  bool counted = true;
};

// Thread-safe: serve() may be called from any thread at once. One overload per request: a tier
// serves the requests of the chains it is in (tiers.cpp's table) and declines the others.
class TierReader {
 public:
  virtual ~TierReader() = default;
  // Serves `want` as the request says, or declines it (nullopt: the next tier is tried). Errors
  // propagate, but those a tier hides by declining (a staged copy that vanished or failed its
  // check).
  virtual std::optional<Served> serve(Want& want, const DecodeRead& read);
  virtual std::optional<Served> serve(Want& want, const Look& look);
  virtual std::optional<Served> serve(Want& want, const Prefetch& read);
  virtual std::optional<Served> serve(Want& want, const FileCopy& copy);
};

inline std::optional<Served> TierReader::serve(Want&, const DecodeRead&) { return std::nullopt; }
inline std::optional<Served> TierReader::serve(Want&, const Look&) { return std::nullopt; }
inline std::optional<Served> TierReader::serve(Want&, const Prefetch&) { return std::nullopt; }
inline std::optional<Served> TierReader::serve(Want&, const FileCopy&) { return std::nullopt; }

// A DecodeRead's use of `bytes`, served by `tier`, and whether the read is counted.
inline Served use_bytes(Tier tier, const ByteSource& bytes, const DecodeRead& read) {
  const uint64_t n = read.use(bytes);
  return {tier, n, n != 0 || bytes.file() == nullptr || read.access != Access::kFile};
}

// The source path of catalog file `file`, built in `out` (valid until its next use).
const std::string& source_path(const Catalog& catalog, uint64_t file, std::string& out);

}  // namespace prestage::detail
