#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "bindings.hpp"
#include "pipeline/tuner.hpp"
#include "prestage/prestage.hpp"
#include "tiers/tiers.hpp"
#include "util/io_trace.hpp"

namespace {

template <typename Names>
pybind11::tuple names_of(const Names& names) {
  const std::vector<std::string> list(std::begin(names), std::end(names));
  return pybind11::tuple(pybind11::cast(list));
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "prestage's C++ core. Use the `prestage` package, not this module.";
  m.attr("__version__") = prestage::kVersion;
  // Numbers the I/O trace records, by name (prestage.trace).
  namespace detail = prestage::detail;
  m.attr("TIERS") = names_of(detail::kTierNames);
  m.attr("TRACE_KINDS") = names_of(detail::kTraceKindNames);
  m.attr("TRACE_TUNE_KIND") = static_cast<int>(detail::TraceKind::kTune);
  std::vector<std::string> knobs;
  for (size_t k = 0; k < detail::kKnobs; ++k) {
    knobs.emplace_back(detail::knob_name(static_cast<detail::KnobId>(k)));
  }
  m.attr("KNOBS") = names_of(knobs);
  prestage::python::register_errors(m);
  prestage::python::register_catalog(m);
  prestage::python::register_plan(m);
  prestage::python::register_loader(m);
  prestage::python::register_pack(m);
  prestage::python::register_staging(m);
  auto transforms = m.def_submodule("transforms", "Stage 3's random transforms.");
  prestage::python::register_transforms(transforms);
}
