// .npy, for the catalog and stage 3: NumPy's array file format (versions 1.0, 2.0 and 3.0), any
// simple dtype and shape, C or Fortran order. Stateless; every error is a DecodeError naming the
// source.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "formats/array.hpp"

namespace prestage::detail {

// Whether `bytes` starts with the .npy magic string.
bool is_npy(std::span<const std::byte> bytes);

// Parses the header at the start of `prefix`. Returns the offset of the array data (the header's
// length) and fills `info` (finished: see finish_array_info). Returns 0 when `prefix` is too short
// to hold the whole header; then `*needed` says how many bytes would do.
uint64_t parse_npy_header(std::span<const std::byte> prefix, ArrayInfo& info, uint64_t max_bytes,
                          const std::string& path, uint64_t* needed);

// Reads the header of the .npy held by `source` (reading only its first bytes when it is a file)
// and checks that the data that follows it has exactly info.bytes bytes. Returns the data offset.
uint64_t probe_npy(const ByteSource& source, ArrayInfo& info, uint64_t max_bytes,
                   std::vector<std::byte>& scratch);

// Writes the array (C order) into `out` (info.bytes bytes). C-order files are read straight into
// `out`; Fortran-order ones go through `scratch`.
void decode_npy(const ByteSource& source, const ArrayInfo& info, uint64_t data_offset,
                std::span<std::byte> out, std::vector<std::byte>& scratch);

}  // namespace prestage::detail
