// .npz, for the catalog and stage 3: one array (member) of a NumPy zip archive, stored (np.savez)
// or deflated (np.savez_compressed), zip64 included. The only file that includes zlib.h is
// npz.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "formats/array.hpp"

namespace prestage::detail {

// Whether `bytes` starts like a zip archive (a local file header).
bool is_zip(std::span<const std::byte> bytes);

// Where one member's array lies in its archive, found by NpzDecoder::probe.
struct NpzMember {
  uint64_t data_start = 0;  // first byte of the member's (compressed) data in the archive
  uint64_t compressed = 0;
  uint64_t uncompressed = 0;
  uint32_t crc = 0;
  bool deflated = false;
  uint64_t npy_offset = 0;  // the array's data within the uncompressed member (after its header)
};

// One per reader thread, created once (an inflate stream plus scratch). Not thread-safe. Every
// error is a DecodeError naming the source's path.
class NpzDecoder {
 public:
  NpzDecoder();
  ~NpzDecoder();
  NpzDecoder(const NpzDecoder&) = delete;
  NpzDecoder& operator=(const NpzDecoder&) = delete;

  // Finds member `name` + ".npy" (empty `name`: the archive must hold exactly one member) and reads
  // its .npy header, without reading or inflating the rest of the member.
  NpzMember probe(const ByteSource& archive, const std::string& name, ArrayInfo& info,
                  uint64_t max_bytes);

  // Writes the member's array (C order) into `out` (info.bytes bytes) and checks the member's CRC.
  void decode(const ByteSource& archive, const NpzMember& member, const ArrayInfo& info,
              std::span<std::byte> out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The array of an array file, whose samples are slices of it: a .npy file's, or member `name` of an
// .npz archive (empty: its only one), described in `info` (up to `max_bytes`) without reading its
// data. `data_offset` is where its data start in the file (a deflated member: 0, as its data are
// read only once inflated, by NpzDecoder::decode); `member` is set for an archive. A DecodeError
// naming the file if it is neither.
struct ArrayFile {
  uint64_t data_offset = 0;
  std::optional<NpzMember> member;
};
ArrayFile probe_array_file(const ByteSource& file, const std::string& name, ArrayInfo& info,
                           uint64_t max_bytes, NpzDecoder& npz, std::vector<std::byte>& scratch);

}  // namespace prestage::detail
