#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "prestage/plan.hpp"

namespace py = pybind11;

namespace prestage::python {

void register_plan(py::module_& m) {
  m.def(
      "epoch_order",
      [](uint64_t n, uint64_t seed, uint64_t epoch, bool shuffle) {
        auto order = epoch_order(n, seed, epoch, shuffle);
        return py::array_t<uint64_t>(static_cast<py::ssize_t>(order.size()), order.data());
      },
      py::arg("num_samples"), py::arg("seed"), py::arg("epoch"), py::arg("shuffle") = true,
      "The global sample order of an epoch (stage 1).\n\n>>> prestage.plan.epoch_order(10, seed=0, epoch=0)");
  m.def(
      "epoch_batches",
      [](uint64_t n, uint64_t batch_size, uint64_t seed, uint64_t epoch, bool shuffle, bool drop_last,
         uint64_t rank, uint64_t world_size) {
        PlanOptions o{n, batch_size, seed, shuffle, drop_last, rank, world_size};
        return EpochPlan(o, epoch).batches();
      },
      py::arg("num_samples"), py::arg("batch_size"), py::arg("seed"), py::arg("epoch"),
      py::arg("shuffle") = true, py::arg("drop_last") = false, py::arg("rank") = 0,
      py::arg("world_size") = 1,
      "One rank's batches of an epoch, as lists of catalog indices.\n\n"
      ">>> prestage.plan.epoch_batches(10, 4, seed=0, epoch=0, rank=1, world_size=2)");
}

}  // namespace prestage::python
