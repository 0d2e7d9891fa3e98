// Each file of the bindings registers one concept on the module.
#pragma once

#include <pybind11/pybind11.h>

namespace prestage::python {

void register_errors(pybind11::module_& m);
void register_catalog(pybind11::module_& m);
void register_plan(pybind11::module_& m);
void register_loader(pybind11::module_& m);
void register_transforms(pybind11::module_& m);
void register_pack(pybind11::module_& m);
void register_staging(pybind11::module_& m);

}  // namespace prestage::python
