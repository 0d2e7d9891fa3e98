// tf.train.Example: the protocol-buffer reader behind example_bytes and example_int64 (varints,
// length-delimited fields, skipped fields of every wire type, packed and unpacked int64 lists).
// Input: a serialized Example (one TFRecord record's data).
#include <cstddef>
#include <cstdint>
#include <string>

#include "decode/tfrecord.hpp"
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
  }
  return 0;
}
