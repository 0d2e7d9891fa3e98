#include "bindings.hpp"
#include "prestage/prestage.hpp"

PYBIND11_MODULE(_core, m) {
  m.doc() = "prestage's C++ core. Use the `prestage` package, not this module.";
  m.attr("__version__") = prestage::kVersion;
  prestage::python::register_errors(m);
  prestage::python::register_catalog(m);
  prestage::python::register_plan(m);
  prestage::python::register_loader(m);
  prestage::python::register_pack(m);
  prestage::python::register_staging(m);
  auto transforms = m.def_submodule("transforms", "Stage 3's random transforms.");
  prestage::python::register_transforms(transforms);
}
