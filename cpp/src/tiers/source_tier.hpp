// The source (the PFS) as a tier, the last of every chain: it never declines a read, it serves it
// or throws. Its rules: a file compressed whole (Catalog::file_codec) is read only as its whole
// stream, decompressed and checked against the catalog's size and CRC-32C (never a byte range of
// it); a file whose read of stage 2's ran past io_timeout is marked stalled, and the next read of
// it (stage 3's, of the same batch) fails at once instead of waiting out the limit again; stage 2's
// reads are timed for the router's model when it chose the source (Want::pfs_chosen).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "prestage/catalog.hpp"
#include "prestage/error.hpp"
#include "tiers/router.hpp"
#include "tiers/tier.hpp"

namespace prestage::detail {

// The bytes of `loc`, a sample of a file compressed whole (Catalog::file_codec), decompressed from
// the source file at `path` into `out`: the whole stream is read and checked against the catalog's
// size and CRC-32C (a DecodeError naming the file if they differ; an IoError if its size changed or
// it cannot be read), only the sample's bytes kept. For a consumer with no staged copy to read.
void read_compressed_sample(const Catalog& catalog, const Catalog::Locator& loc,
                            const std::string& path, std::vector<std::byte>& out);

// Thread-safe. The catalog must outlive it; `router` as PeerTier's.
class SourceTier final : public TierReader {
 public:
  SourceTier(const Catalog& catalog, const std::unique_ptr<Router>& router)
      : catalog_(catalog),
        router_(router),
        stalled_(new std::atomic<uint8_t>[catalog.num_files()]()) {}

  using TierReader::serve;
  std::optional<Served> serve(Want& want, const DecodeRead& read) override;
  std::optional<Served> serve(Want& want, const Look& look) override;
  std::optional<Served> serve(Want& want, const Prefetch& read) override;
  std::optional<Served> serve(Want& want, const FileCopy& copy) override;

  // The bytes of `loc`, a sample of a compressed file, decompressed from the source into `out`:
  // the whole stream is read (its size and CRC checked against the catalog's: never a wrong
  // byte), only the sample's bytes kept; a read that runs past io_timeout marks the file stalled.
  void read_compressed(const Catalog::Locator& loc, std::vector<std::byte>& out);

 private:
  template <typename Read>
  void stalled_if_timed_out(uint64_t file, const Read& read) {
    try {
      read();
    } catch (const IoError& e) {
      if (e.error_code() == ETIMEDOUT) stalled_[file].store(1, std::memory_order_relaxed);
      throw;
    }
  }
  void refuse_if_stalled(uint64_t file, const std::string& path);
  SourceModel* model() const noexcept { return router_ != nullptr ? router_->model() : nullptr; }

  const Catalog& catalog_;
  const std::unique_ptr<Router>& router_;
  std::unique_ptr<std::atomic<uint8_t>[]> stalled_;  // per file: see stalled_if_timed_out()
};

}  // namespace prestage::detail
