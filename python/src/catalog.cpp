#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include "bindings.hpp"
#include "prestage/catalog.hpp"

namespace py = pybind11;

namespace prestage::python {

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
      .def_static("load", &Catalog::load, py::arg("path"), py::call_guard<py::gil_scoped_release>(),
                  "Loads a catalog saved by save().\n\n>>> prestage.Catalog.load('train.catalog')")
      .def("save", &Catalog::save, py::arg("path"), py::call_guard<py::gil_scoped_release>(),
           "Saves to one binary file.\n\n>>> cat.save('train.catalog')")
      .def("__len__", &Catalog::size)
      .def_property_readonly("root", &Catalog::root)
      .def_property_readonly("classes", &Catalog::classes)
      .def_property_readonly("fingerprint", &Catalog::fingerprint)
      .def("path", [](const Catalog& c, size_t i) { return std::string(c.path(i)); }, py::arg("i"),
           "The relative path of sample i.")
      .def("source_path", &Catalog::source_path, py::arg("i"), "root / path(i).")
      .def("label", &Catalog::label, py::arg("i"))
      .def("__repr__", [](const Catalog& c) {
        return "<prestage.Catalog of " + std::to_string(c.size()) + " samples under '" +
               c.root().string() + "'>";
      });
}

}  // namespace prestage::python
