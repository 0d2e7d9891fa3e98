// What `prestage pack` needs from the core: a shard's samples are checksummed with the stage
// index's CRC-32C and optionally compressed as zstd frames (which every decode mode but "raw"
// decompresses). Both release the GIL, so pack's threads run them in parallel.

#include <span>
#include <string>

#include "bindings.hpp"
#include "prestage/error.hpp"
#include "util/crc32c.hpp"
#include "util/zstd_stream.hpp"

namespace py = pybind11;

namespace prestage::python {

namespace {

std::span<const std::byte> bytes_of(const py::buffer_info& info) {
  return {static_cast<const std::byte*>(info.ptr), static_cast<size_t>(info.size * info.itemsize)};
}

}  // namespace

void register_pack(py::module_& m) {
  m.def(
      "crc32c",
      [](const py::buffer& data) {
        const py::buffer_info info = data.request();
        py::gil_scoped_release release;
        return detail::crc32c(bytes_of(info));
      },
      py::arg("data"),
      "CRC-32C (Castagnoli) of a bytes-like object, as the stage index records it.");
  m.def(
      "zstd_compress",
      [](const py::buffer& data, int level) {
        const py::buffer_info info = data.request();
        std::string out;
        {
          py::gil_scoped_release release;
          out = detail::zstd_compress(bytes_of(info), level);
        }
        return py::bytes(out);
      },
      py::arg("data"), py::arg("level") = 3,
      "One zstd frame holding `data` (with its size in the frame header).");
}

}  // namespace prestage::python
