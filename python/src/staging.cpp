#include <pybind11/stl/filesystem.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "prestage/catalog.hpp"
#include "tiers/stage_directory.hpp"
#include "tiers/tiers.hpp"

namespace py = pybind11;

namespace prestage::python {

void register_staging(py::module_& m) {
  m.def(
      "stage_area",
      [](const std::filesystem::path& stage_dir, const Catalog& catalog) {
        return detail::StageDirectory::area_of(stage_dir, catalog).string();
      },
      py::arg("stage_dir"), py::arg("catalog"),
      "Where the copies of the catalog's files go under a stage directory (there or not).\n\n"
      ">>> prestage._core.stage_area('/local/stage', catalog)\n"
      "'/local/stage/prestage-8f3c2a9d0b1e4f67'");
  m.def(
      "make_stage_area",
      [](const std::filesystem::path& stage_dir, const Catalog& catalog, const std::string& group) {
        const detail::StageAccess access = detail::StageAccess::of(group);
        const std::filesystem::path area = detail::StageDirectory::area_of(stage_dir, catalog);
        const detail::UniqueFd parent = detail::open_parent_dir(stage_dir.string(), access);
        detail::open_private_dir(parent.get(), area.filename().string(), area.string(), access);
        return area.string();
      },
      py::arg("stage_dir"), py::arg("catalog"), py::arg("group") = "",
      "Makes (or checks) the catalog's area under a stage directory as a loader does: the job's\n"
      "user's alone (0700; with `group`, 02770 of that group). Raises prestage.IoError (EPERM)\n"
      "for an area another user owns or others can write. Returns its path.\n\n"
      ">>> prestage._core.make_stage_area('/tmp', catalog)\n"
      "'/tmp/prestage-8f3c2a9d0b1e4f67'");
  m.def("staged_copy_path", &detail::StageDirectory::copy_path, py::arg("area"), py::arg("file"),
        "The path of the copy of catalog file `file` in a stage area (there or not).\n\n"
        ">>> prestage._core.staged_copy_path(area, 300)\n"
        "'/local/stage/prestage-8f3c2a9d0b1e4f67/2c/12c'");
  m.def(
      "decompressed_sample",
      [](const Catalog& catalog, uint64_t index) {
        if (index >= catalog.size()) {
          throw ConfigError("sample " + std::to_string(index) + " of a catalog of " +
                            std::to_string(catalog.size()));
        }
        const Catalog::Locator loc = catalog.locator(index);
        if (catalog.file_codec(loc.file) == Catalog::Codec::kNone) {
          throw ConfigError("sample " + std::to_string(index) + "'s file is not compressed");
        }
        std::vector<std::byte> out;
        {
          py::gil_scoped_release release;
          detail::read_compressed_sample(catalog, loc, catalog.file_source_path(loc.file).string(),
                                         out);
        }
        return py::bytes(reinterpret_cast<const char*>(out.data()), out.size());
      },
      py::arg("catalog"), py::arg("index"),
      "The bytes of sample `index` of a file compressed whole (catalog.file_codec), decompressed\n"
      "from the source: the whole stream is read and checked against the catalog's size and\n"
      "CRC-32C (prestage.DecodeError naming the file if they differ), only the sample's bytes "
      "kept.\n"
      "What the staged sampler hands out where no decompressed copy is staged.\n\n"
      ">>> prestage._core.decompressed_sample(catalog, 7)[:4]\n"
      "b'\\xff\\xd8\\xff\\xe0'");
}

}  // namespace prestage::python
