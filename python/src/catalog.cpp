#include <map>
#include <optional>
#include <string>

#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include "bindings.hpp"
#include "prestage/catalog.hpp"
#include "prestage/error.hpp"

namespace py = pybind11;

namespace prestage::python {

namespace {
// One path (str or os.PathLike) or a sequence of them.
std::vector<std::filesystem::path> path_list(py::handle paths) {
  if (py::isinstance<py::str>(paths) || py::hasattr(paths, "__fspath__")) {
    return {paths.cast<std::filesystem::path>()};
  }
  return paths.cast<std::vector<std::filesystem::path>>();
}
}  // namespace

void register_catalog(py::module_& m) {
  py::class_<Catalog>(m, "Catalog", R"doc(
The immutable, indexed list of samples 0..N-1 of a data set: a path relative to the root and a label.

>>> cat = prestage.Catalog.from_folder("/data/imagenet/train")
>>> len(cat), cat.path(0), cat.label(0)
)doc")
      .def_static("from_folder", &Catalog::from_folder, py::arg("root"),
                  py::arg("extensions") = std::vector<std::string>{".jpg", ".jpeg"},
                  py::call_guard<py::gil_scoped_release>(), R"doc(
One class per sub-folder of `root` (label = index of the folder in sorted order, as torchvision's
ImageFolder); files with one of `extensions` (case-insensitive), sorted.

>>> prestage.Catalog.from_folder("train/")
)doc")
      .def_static("from_list", &Catalog::from_list, py::arg("path"), py::arg("root"),
                  py::call_guard<py::gil_scoped_release>(), R"doc(
A text file of `relative/path[,label]` lines; paths are relative to `root`.

>>> prestage.Catalog.from_list("train.txt", root="/data/set")
)doc")
      .def_static("from_paths", &Catalog::from_paths, py::arg("root"), py::arg("paths"),
                  py::arg("labels") = std::vector<int64_t>{},
                  py::arg("classes") = std::vector<std::string>{}, R"doc(
Explicit relative paths and labels (or no labels: -1).

>>> prestage.Catalog.from_paths("/data", ["a/1.jpg", "b/2.jpg"], [0, 1])
)doc")
      .def_static(
          "from_hdf5",
          [](py::handle paths, const std::string& dataset,
             const std::optional<std::string>& labels) {
            const auto files = path_list(paths);
            py::gil_scoped_release release;
            return Catalog::from_hdf5(files, dataset, labels.value_or(""));
          },
          py::arg("paths"), py::arg("dataset"), py::arg("labels") = py::none(), R"doc(
Samples are the rows along axis 0 of `dataset` in each file of `paths`, in order (one sample per file
is a dataset of one row). `labels`: a 1-D integer dataset with as many rows, or None (-1). Decode
with Loader(decode="hdf5"). HDF5 calls are serialised process-wide (the library is not
thread-safe).

>>> cat = prestage.Catalog.from_hdf5(["climate_0.h5", "climate_1.h5"], "fields", labels="labels")
)doc")
      .def_static(
          "from_tfrecord",
          [](py::handle paths, const std::map<std::string, std::string>& features) {
            for (const auto& [key, value] : features) {
              if (key != "image" && key != "label") {
                throw ConfigError(
                    "from_tfrecord: features takes the keys 'image' and 'label', got '" + key +
                    "'");
              }
            }
            const auto image = features.find("image");
            if (image == features.end())
              throw ConfigError("from_tfrecord: features needs an 'image' entry");
            const auto label = features.find("label");
            const auto files = path_list(paths);
            py::gil_scoped_release release;
            return Catalog::from_tfrecord(files, image->second,
                                          label == features.end() ? "" : label->second);
          },
          py::arg("paths"), py::arg("features"), R"doc(
Samples are the records (tf.train.Example) of the TFRecord files `paths`, in order. `features`:
{"image": name of the bytes feature to decode (decode="jpeg", "raw", "npy" or "npz"),
 "label": name of an int64 feature (optional)}. Reads every record once, checking its CRCs, to build
the index of record offsets; save() the catalog to do that only once.

>>> cat = prestage.Catalog.from_tfrecord(["train-0.tfrecord"],
...                                      features={"image": "image/encoded", "label": "image/class/label"})
)doc")
      .def_property_readonly(
          "kind",
          [](const Catalog& c) {
            switch (c.kind()) {
              case Catalog::Kind::kTfrecord:
                return "tfrecord";
              case Catalog::Kind::kHdf5:
                return "hdf5";
              default:
                return "files";
            }
          },
          "'files', 'tfrecord' or 'hdf5': what a sample's locator names.")
      .def_property_readonly("field", &Catalog::field,
                             "The TFRecord data feature or the HDF5 dataset ('' for files).")
      .def_static("load", &Catalog::load, py::arg("path"), py::call_guard<py::gil_scoped_release>(),
                  "Loads a catalog saved by save().\n\n>>> prestage.Catalog.load('train.catalog')")
      .def("save", &Catalog::save, py::arg("path"), py::call_guard<py::gil_scoped_release>(),
           "Saves to one binary file.\n\n>>> cat.save('train.catalog')")
      .def("__len__", &Catalog::size)
      .def_property_readonly("root", &Catalog::root)
      .def_property_readonly("classes", &Catalog::classes)
      .def_property_readonly("fingerprint", &Catalog::fingerprint)
      .def(
          "path", [](const Catalog& c, size_t i) { return std::string(c.path(i)); }, py::arg("i"),
          "The relative path of sample i.")
      .def("source_path", &Catalog::source_path, py::arg("i"), "root / path(i).")
      .def("label", &Catalog::label, py::arg("i"))
      .def("__repr__", [](const Catalog& c) {
        return "<prestage.Catalog of " + std::to_string(c.size()) + " samples under '" +
               c.root().string() + "'>";
      });
}

}  // namespace prestage::python
