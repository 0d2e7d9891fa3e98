// HDF5 rows: hdf5::describe (type and shape checks), read_row of the first and last rows and of
// the last slice along the last axis, read_labels, and Catalog::from_hdf5 (one locator per row,
// labels), on a file the input is written to. Input: an HDF5 file; the array dataset is "x", the
// labels dataset "y".
//
// The parsing itself is the HDF5 library's (not built with the sanitizers here); what this covers
// is prestage's side: the checks on what the library reports, and the buffers sized from it.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "formats/hdf5.hpp"
#include "fuzz_util.hpp"
#include "prestage/catalog.hpp"
#include "prestage/error.hpp"

namespace {

constexpr uint64_t kMaxBytes = uint64_t{1} << 22;  // max_sample_bytes for one row

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace hdf5 = prestage::detail::hdf5;
  static const std::string file = (prestage::fuzz::scratch_dir() / "fuzz.h5").string();
  static std::vector<std::byte> out;
  // Open files are cached by name: drop the previous input's before writing this one.
  hdf5::close_all();
  prestage::fuzz::write_file(file, prestage::fuzz::as_bytes(data, size));
  try {
    const prestage::detail::Hdf5Dataset d = hdf5::describe(file, "x", 0, kMaxBytes, file);
    prestage::fuzz::harness_check(d.row.bytes <= kMaxBytes, "describe: row over max_bytes");
    out.resize(static_cast<size_t>(d.row.bytes));
    if (d.rows > 0) {
      hdf5::read_row(file, "x", 0, 0, d.row, out, file);
      hdf5::read_row(file, "x", 0, d.rows - 1, d.row, out, file);
    }
  } catch (const prestage::Error&) {
  }
  try {
    const prestage::detail::Hdf5Dataset d = hdf5::describe(file, "x", -1, kMaxBytes, file);
    out.resize(static_cast<size_t>(d.row.bytes));
    if (d.rows > 0) hdf5::read_row(file, "x", -1, d.rows - 1, d.row, out, file);
  } catch (const prestage::Error&) {
  }
  try {
    static_cast<void>(hdf5::read_labels(file, "y", file));
  } catch (const prestage::Error&) {
  }
  try {
    const auto catalog = prestage::Catalog::from_hdf5({file}, "x", "y");
    prestage::fuzz::harness_check(
        catalog.size() > 0 && catalog.kind() == prestage::Catalog::Kind::kHdf5,
        "from_hdf5: an empty or mislabelled catalog");
  } catch (const prestage::Error&) {
  }
  return 0;
}
