// Tar archives, for the catalog: one pass over the headers of a shard, giving each regular member's
// name and the byte range of its data, so that a sample is later read by range from the archive
// (WebDataset shards). ustar (with its name prefix), GNU (`L`/`K` long names, base-256 sizes) and
// pax (`x` per member, `g` global: `path` and `size`) headers; other member types are passed over.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "prestage/catalog.hpp"
#include "util/file_io.hpp"

namespace prestage::detail {

class Decompressor;

// Reads a file forward through a window, as a header scan does: a header or a small member whose
// bytes lie in the window costs no read; the window moves (one read of up to kWindow bytes) when a
// range leaves it, so a shard of small members is read once, in large reads, and one of large
// members costs a read per header. Not thread-safe.
//
// A compressed file (formats/compressed.hpp) is read the same way through its decompressed bytes,
// forward only: offsets are those of the decompressed bytes, `size` (their count, from a first
// pass: measure_compressed) is size(), a range before the window's start is refused (a
// DecodeError: such a file cannot be read backwards), and the bytes between the window and a range
// further on are decompressed and passed over. The window holds at most the largest range asked
// for or kWindow bytes.
class ForwardReader {
 public:
  static constexpr uint64_t kWindow = uint64_t{1} << 20;
  explicit ForwardReader(const FileRef& file);
  ForwardReader(const FileRef& file, Catalog::Codec codec, uint64_t size);
  ~ForwardReader();
  uint64_t size() const noexcept { return size_; }
  // `length` bytes at `offset` (within size()), valid until the next call. IoError if the read
  // fails; DecodeError for a compressed stream that is corrupt or changed since it was measured.
  std::span<const std::byte> bytes(uint64_t offset, uint64_t length);

 private:
  std::span<const std::byte> stream_bytes(uint64_t offset, uint64_t length);
  std::string path_;
  std::optional<OpenFile> file_;
  std::unique_ptr<Decompressor> stream_;
  uint64_t size_ = 0;
  uint64_t start_ = 0;  // the window's first byte in the file
  std::vector<std::byte> window_;
};

// Whether `block` (512 bytes) is a tar header whose checksum holds.
bool tar_header_ok(std::span<const std::byte> block);

// What one header block says of its own member, for a check against an index that names the
// member: its type flag, its size field (none where it does not parse) and its ustar name (prefix
// and name; a pax or GNU long name before it is not read). None if `block` is not a tar header
// whose checksum holds.
struct TarHeader {
  char type = 0;
  std::optional<uint64_t> size;
  std::string name;
};
std::optional<TarHeader> read_tar_header(std::span<const std::byte> block);

struct TarMember {
  std::string name;     // the pax path, else the GNU long name, else ustar prefix + "/" + name
  uint64_t header = 0;  // the first byte of its first header (a pax or long-name header, if any)
  uint64_t offset = 0;  // the first byte of its data
  uint64_t size = 0;
};

// Something wrong in the archive at byte `offset` (of a header). `name`: the member it concerns,
// when it can be told ("" otherwise; a header whose checksum fails names it only if it still looks
// like a ustar header with a printable name). `rest_of_file`: nothing after it can be located (the
// file ends inside it); otherwise the scan went on at the next header it found (`resumed`: its
// byte), and the members between were lost with it. `previous_suspect`: the damage may be the
// previous member's doing (a bad header right after its data, which does not look like a header:
// that member's size may be what lies).
struct TarDamage {
  uint64_t offset = 0;
  std::string name;
  std::string reason;
  bool rest_of_file = false;
  uint64_t resumed = 0;
  bool previous_suspect = false;
};

// Calls `member` for each regular member of the archive read by `in`, in order, and `damaged` for
// each damage: a header whose checksum fails or whose fields do not parse, a pax record or GNU long
// name that is malformed, a member whose size runs past the end of the file, a truncated header, a
// sparse or multi-volume member (their data is not one range). After damage the scan goes on at the
// next block that holds a header with a good checksum (as GNU tar's "skipping to next header"),
// else ends. The archive ends at a zero block or at the end of the file (as Python's tarfile).
// A pax `size` that disagrees with its header's (non-zero) size is damage: one of them lies.
void scan_tar(ForwardReader& in, const std::function<void(const TarMember&)>& member,
              const std::function<void(const TarDamage&)>& damaged);

}  // namespace prestage::detail
