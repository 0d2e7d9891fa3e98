// Stage 3's random transforms, exposed so that tests and users can reproduce what a loader drew.
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "decode/transform.hpp"

namespace py = pybind11;

namespace prestage::python {

void register_transforms(py::module_& m) {
  m.def(
      "random_resized_crop_params",
      [](uint64_t seed, uint64_t epoch, uint64_t index, int height, int width) {
        if (height <= 0 || width <= 0) throw py::value_error("height and width must be positive");
        const auto box = detail::random_resized_crop(seed, epoch, index, height, width);
        return py::make_tuple(box.top, box.left, box.height, box.width, box.flip);
      },
      py::arg("seed"), py::arg("epoch"), py::arg("index"), py::arg("height"), py::arg("width"),
      R"doc(
The crop box and flip that transform="random-resized-crop" uses for sample `index` (catalog index)
of `epoch` with loader seed `seed`, on an image of height x width: (top, left, h, w, flip), as
torchvision's RandomResizedCrop.get_params (scale (0.08, 1), ratio (3/4, 4/3)) and
RandomHorizontalFlip(0.5) compute them.

>>> prestage.transforms.random_resized_crop_params(seed=0, epoch=0, index=7, height=375, width=500)
)doc");
  m.def(
      "crop_draws",
      [](uint64_t seed, uint64_t epoch, uint64_t index, size_t count) {
        if (count > 1024) throw py::value_error("count must be at most 1024");
        return detail::crop_draws(seed, epoch, index, count);
      },
      py::arg("seed"), py::arg("epoch"), py::arg("index"), py::arg("count"),
      "The uniform numbers in [0, 1) that random_resized_crop_params consumes, in order: each try "
      "takes two (scale, log-ratio), an accepted try two more (top, left: floor(u * n)), then one "
      "for the flip (u < 0.5).\n\n>>> prestage.transforms.crop_draws(0, 0, 7, count=5)");
}

}  // namespace prestage::python
