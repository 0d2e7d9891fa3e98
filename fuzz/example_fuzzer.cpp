// tf.train.Example: the protocol-buffer reader behind example_bytes, example_int64,
// example_values and example_has_data (varints, length-delimited fields, skipped fields of every
// wire type, packed and unpacked float and int64 lists, mixed).
// Input: a serialized Example (one TFRecord record's data).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "formats/tfrecord.hpp"
#include "fuzz_util.hpp"
#include "prestage/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "fuzz.example";
  const auto example = prestage::fuzz::as_bytes(data, size);
  for (const char* name : {"image", "label", "x"}) {
    try {
      std::span<const std::byte> value;
      if (prestage::detail::example_bytes(example, name, value, path)) {
        prestage::fuzz::harness_check(
            value.empty() || (value.data() >= example.data() &&
                              value.data() + value.size() <= example.data() + example.size()),
            "example_bytes: value outside the message");
      }
    } catch (const prestage::Error&) {
    }
    try {
      int64_t value = 0;
      prestage::detail::example_int64(example, name, value, path);
    } catch (const prestage::Error&) {
    }
    // Whatever example_has_data accepts, example_values reads, within its bound and the message.
    bool has = false;
    try {
      has = prestage::detail::example_has_data(example, name, path);
    } catch (const prestage::Error&) {
    }
    try {
      static std::vector<std::byte> buffer;
      std::span<const std::byte> values;
      std::string_view dtype;
      constexpr uint64_t kMaxBytes = 1 << 16;
      const bool found =
          prestage::detail::example_values(example, name, kMaxBytes, buffer, values, dtype, path);
      prestage::fuzz::harness_check(found == has, "example_values and example_has_data disagree");
      if (found && dtype == "|u1") {
        prestage::fuzz::harness_check(
            values.empty() || (values.data() >= example.data() &&
                               values.data() + values.size() <= example.data() + example.size()),
            "example_values: bytes outside the message");
      } else if (found) {
        prestage::fuzz::harness_check(
            values.size() <= kMaxBytes && values.size() % (dtype == "<f4" ? 4 : 8) == 0 &&
                (values.empty() || values.data() == buffer.data()),
            "example_values: values not whole items in the buffer, or over the bound");
      }
    } catch (const prestage::Error&) {
      // A list over the bound is refused by example_values alone.
    }
  }
  return 0;
}
