#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "prestage/plan.hpp"

namespace py = pybind11;

namespace prestage::python {

namespace {

using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;

PlanOptions plan_options(uint64_t n, uint64_t batch_size, bool drop_last, uint64_t rank,
                         uint64_t world_size, uint64_t seed, bool shuffle, uint64_t resume_epoch,
                         const Ranges& consumed) {
  PlanOptions o{n, batch_size, seed, shuffle, drop_last, rank, world_size, {}};
  o.resume.epoch = resume_epoch;
  for (const auto& [begin, end] : consumed) o.resume.consumed.push_back({begin, end});
  return o;
}

}  // namespace

void register_plan(py::module_& m) {
  m.def(
      "epoch_order",
      [](uint64_t n, uint64_t seed, uint64_t epoch, bool shuffle) {
        auto order = epoch_order(n, seed, epoch, shuffle);
        return py::array_t<uint64_t>(static_cast<py::ssize_t>(order.size()), order.data());
      },
      py::arg("num_samples"), py::arg("seed"), py::arg("epoch"), py::arg("shuffle") = true,
      "The global sample order of an epoch (stage 1).\n\n>>> prestage.plan.epoch_order(10, seed=0, "
      "epoch=0)");
  m.def(
      "epoch_batches",
      [](uint64_t n, uint64_t batch_size, uint64_t seed, uint64_t epoch, bool shuffle,
         bool drop_last, uint64_t rank, uint64_t world_size, const Ranges& consumed) {
        const PlanOptions o = plan_options(n, batch_size, drop_last, rank, world_size, seed,
                                           shuffle, epoch, consumed);
        return EpochPlan(o, epoch).batches();
      },
      py::arg("num_samples"), py::arg("batch_size"), py::arg("seed"), py::arg("epoch"),
      py::arg("shuffle") = true, py::arg("drop_last") = false, py::arg("rank") = 0,
      py::arg("world_size") = 1, py::arg("consumed") = Ranges{},
      "One rank's batches of an epoch, as lists of catalog indices; with `consumed` ([(begin, "
      "end), "
      "...] positions of the epoch's global order), the batches of the rest of it (a resume).\n\n"
      ">>> prestage.plan.epoch_batches(10, 4, seed=0, epoch=0, rank=1, world_size=2)");
  m.def(
      "consumed_positions",
      [](uint64_t n, uint64_t batch_size, uint64_t world_size, bool drop_last,
         const std::vector<uint64_t>& delivered, const Ranges& consumed) {
        const PlanOptions o =
            plan_options(n, batch_size, drop_last, 0, world_size, 0, true, 0, consumed);
        Ranges out;
        for (const PositionRange& r : consumed_positions(o, 0, delivered))
          out.emplace_back(r.begin, r.end);
        return out;
      },
      py::arg("num_samples"), py::arg("batch_size"), py::arg("world_size"), py::arg("drop_last"),
      py::arg("delivered"), py::arg("consumed") = Ranges{},
      "The global position: the positions of an epoch's global order consumed once rank r has "
      "delivered its first delivered[r] batches of a plan that left out `consumed` (sorted "
      "[(begin, end), ...]). Independent of seed and shuffle.\n\n"
      ">>> prestage.plan.consumed_positions(100, 4, 2, False, [3, 3])\n[(0, 24)]");
  m.def(
      "batches_in_epoch",
      [](uint64_t n, uint64_t batch_size, uint64_t world_size, bool drop_last,
         const Ranges& consumed) {
        return batches_in_epoch(
            plan_options(n, batch_size, drop_last, 0, world_size, 0, true, 0, consumed), 0);
      },
      py::arg("num_samples"), py::arg("batch_size"), py::arg("world_size"), py::arg("drop_last"),
      py::arg("consumed") = Ranges{},
      "Batches per rank of an epoch that leaves out `consumed` positions.\n\n"
      ">>> prestage.plan.batches_in_epoch(100, 4, 2, False, [(0, 24)])\n10");
}

}  // namespace prestage::python
