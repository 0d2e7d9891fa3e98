// TFRecord, for the catalog and stage 3: record framing with CRC32C checks, and a minimal reader of
// the tf.train.Example protocol buffer (Features: map<string, Feature>, with bytes_list, float_list
// and int64_list, packed or not). No TensorFlow or protobuf library is needed.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "util/crc32c.hpp"

namespace prestage::detail {

// TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t masked_crc32c(std::span<const std::byte> bytes);

// A record on disk: u64 length, masked CRC of the length, `length` bytes of data, masked CRC of
// the data. kFramingBytes is everything but the data.
inline constexpr uint64_t kFramingBytes = 16;

// Checks one framed record (both CRCs, the length against the bytes) and returns its data. Throws
// DecodeError naming `path`.
std::span<const std::byte> unframe_record(std::span<const std::byte> framed,
                                          const std::string& path);

// A damaged record found by scan_tfrecord at byte `offset`: why, and whether the rest of the file
// is lost with it (true: its length cannot be trusted, or the file ends inside it, so no record
// after it can be located) or only this record (false: its length's CRC holds, so the next record
// is where the length says; its data is bad).
using TfrecordDamage =
    std::function<void(uint64_t offset, const std::string& reason, bool rest_of_file)>;

// Reads the TFRecord file `file` from start to end, checking every record, and calls `record` with
// each good record's offset, framed length and data (valid during the call). A damaged record (a
// bad CRC, a record longer than `max_record`, a truncated last record): without `damaged`, a
// DecodeError naming `path` and the byte; with it, `damaged` is called and the scan goes on with
// the next record if it can be located, else ends. An error reading the file is an IoError either
// way.
void scan_tfrecord(const std::string& file, const std::string& path, uint64_t max_record,
                   const std::function<void(uint64_t offset, uint64_t framed_length,
                                            std::span<const std::byte> data)>& record,
                   const TfrecordDamage& damaged = nullptr);

// tf.train.Example accessors. Each finds feature `name` (the last entry wins, as in protobuf maps);
// returns false if the Example has no such feature, throws DecodeError (naming `path`) if the
// message is malformed or the feature is of another kind or empty.
bool example_bytes(std::span<const std::byte> example, std::string_view name,
                   std::span<const std::byte>& value, const std::string& path);
bool example_int64(std::span<const std::byte> example, std::string_view name, int64_t& value,
                   const std::string& path);

// The values of data feature `name`, whatever its kind: a bytes_list's first value (`dtype` "|u1",
// `values` inside `example`), or a float_list's or int64_list's values, packed or not, in order,
// as little-endian float32 ("<f4") or int64 ("<i8") written into `buffer` (grown, never shrunk;
// more than `max_bytes` of them is a DecodeError). Returns false and throws as the accessors above.
bool example_values(std::span<const std::byte> example, std::string_view name, uint64_t max_bytes,
                    std::vector<std::byte>& buffer, std::span<const std::byte>& values,
                    std::string_view& dtype, const std::string& path);
// Whether the Example has data feature `name` that example_values can read (without copying its
// values), and the dtype example_values would give it into `dtype` if not null; throws as the
// accessors above.
bool example_has_data(std::span<const std::byte> example, std::string_view name,
                      const std::string& path, std::string_view* dtype = nullptr);

}  // namespace prestage::detail
