#include <algorithm>
#include <array>
#include <chrono>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "prestage/batch.hpp"
#include "prestage/error.hpp"
#include "prestage/loader.hpp"

namespace py = pybind11;

namespace prestage::python {

namespace {

// A NumPy view of memory owned by `owner` (a Batch): no copy, and the batch goes back to the ring
// only when the last view of it is collected.
template <typename T>
py::array view(py::handle owner, const T* data, std::vector<py::ssize_t> shape) {
  return py::array(py::dtype::of<T>(), std::move(shape), {}, data, owner);
}

// A typed NumPy view of bytes [begin, end) of a batch's buffer (the batch's dtype).
py::array typed_view(py::handle owner, const Batch& b, std::vector<py::ssize_t> shape,
                     uint64_t begin, uint64_t end) {
  const py::dtype dtype(std::string(b.dtype()));
  py::ssize_t count = 1;
  for (const auto d : shape) count *= d;
  if (static_cast<uint64_t>(count) * static_cast<uint64_t>(dtype.itemsize()) != end - begin) {
    throw std::logic_error("batch buffer and shape disagree");
  }
  return py::array(dtype, std::move(shape), {}, b.data().data() + begin, owner);
}

// A batch's samples (zero-copy): one (N, *shape) array when their shapes agree, else a list of N
// arrays of their own shapes.
py::object sample_views(py::handle owner, const Batch& b) {
  const auto shape_of = [&](size_t i) {
    std::vector<py::ssize_t> shape;
    for (const uint64_t d : b.sample_shape(i)) shape.push_back(static_cast<py::ssize_t>(d));
    return shape;
  };
  if (!b.ragged() && b.size() > 0) {
    std::vector<py::ssize_t> shape = shape_of(0);
    shape.insert(shape.begin(), static_cast<py::ssize_t>(b.size()));
    return typed_view(owner, b, shape, 0, b.data().size());
  }
  py::list out;
  for (size_t i = 0; i < b.size(); ++i) {
    out.append(typed_view(owner, b, shape_of(i), b.offsets()[i], b.offsets()[i + 1]));
  }
  return out;
}

// Why a batch decoded on the GPU has no host view.
constexpr const char* kOnDevice =
    "this batch's images are in CUDA device memory (decode_device='cuda'): use "
    "batch.__cuda_array_interface__ (torch.as_tensor(batch, device='cuda'), cupy.asarray(batch)) "
    "or prestage.torch.Loader";

// Stats as a dict, from the table of fields each struct of stats.hpp keeps (T::fields()).
template <typename T>
concept HasFields = requires { T::fields(); };

template <typename Struct, typename Fields>
py::dict to_dict(const Struct& s, const Fields& fields);

// Plain values as pybind11 casts them; structs through their table; vectors as lists.
template <typename T>
py::object to_python(const T& value) {
  return py::cast(value);
}
template <HasFields T>
py::object to_python(const T& s) {
  return to_dict(s, T::fields());
}
py::object to_python(Pinning p) { return py::str(std::string(to_string(p))); }  // "cuda", ...
template <typename T>
py::object to_python(const std::vector<T>& values) {
  py::list out;
  for (const T& v : values) out.append(to_python(v));
  return out;
}

template <typename Struct, typename Fields>
py::dict to_dict(const Struct& s, const Fields& fields) {
  py::dict d;
  std::apply([&](const auto&... f) { ((d[f.name] = to_python(s.*(f.member))), ...); }, fields);
  return d;
}

}  // namespace

void register_loader(py::module_& m) {
  py::enum_<DecodeMode>(m, "DecodeMode")
      .value("jpeg", DecodeMode::kJpeg)
      .value("image", DecodeMode::kImage)
      .value("raw", DecodeMode::kRaw)
      .value("locate", DecodeMode::kLocate)
      .value("npy", DecodeMode::kNpy)
      .value("npz", DecodeMode::kNpz)
      .value("hdf5", DecodeMode::kHdf5);

  py::enum_<Transform>(m, "Transform")
      .value("center_crop", Transform::kCenterCrop)
      .value("random_resized_crop", Transform::kRandomResizedCrop);
  py::enum_<Layout>(m, "Layout").value("NHWC", Layout::kNHWC).value("NCHW", Layout::kNCHW);
  py::enum_<OutputType>(m, "OutputType")
      .value("uint8", OutputType::kUint8)
      .value("float32", OutputType::kFloat32);

  py::enum_<Eviction>(m, "Eviction")
      .value("clairvoyant", Eviction::kClairvoyant)
      .value("lru", Eviction::kLru);

  py::enum_<DecodeDevice>(m, "DecodeDevice")
      .value("cpu", DecodeDevice::kCpu)
      .value("cuda", DecodeDevice::kCuda);
  py::enum_<PfsReads>(m, "PfsReads")
      .value("fastest", PfsReads::kFastest)
      .value("fewest", PfsReads::kFewest);
  py::enum_<GpuCrop>(m, "GpuCrop")
      .value("auto", GpuCrop::kAuto)
      .value("resize", GpuCrop::kResize)
      .value("roi", GpuCrop::kRoi);

  py::enum_<OnError>(m, "OnError").value("raise", OnError::kRaise).value("skip", OnError::kSkip);

  py::class_<LoaderOptions> options(m, "LoaderOptions", R"doc(
Every option of a Loader, as C++ holds it (see prestage.Loader for their meaning, and
prestage.options for how the Python arguments become these fields). validate() is the one check.

>>> o = prestage._core.LoaderOptions(); o.readers = 4; o.validate()
)doc");
  options.attr("FIT_FREE_SPACE") = LoaderOptions::kFitFreeSpace;
  options.attr("WAIT_FOR_STAGING") = LoaderOptions::kWaitForStaging;
  options.attr("AUTO_SHARE") = LoaderOptions::kAutoShare;
  options.def(py::init<>(), "The defaults.")
      .def(py::init<const LoaderOptions&>(), py::arg("other"), "A copy of `other`.")
      .def_readwrite("batch_size", &LoaderOptions::batch_size)
      .def_property(
          "image_size",
          [](const LoaderOptions& o) -> py::object {
            if (o.image_size.empty()) return py::none();
            return py::make_tuple(o.image_size.height, o.image_size.width);
          },
          [](LoaderOptions& o, std::optional<std::pair<uint32_t, uint32_t>> size) {
            o.image_size = size ? ImageSize{size->first, size->second} : ImageSize{};
          })
      .def_readwrite("decode", &LoaderOptions::decode)
      .def_readwrite("shuffle", &LoaderOptions::shuffle)
      .def_readwrite("seed", &LoaderOptions::seed)
      .def_readwrite("drop_last", &LoaderOptions::drop_last)
      .def_readwrite("rank", &LoaderOptions::rank)
      .def_readwrite("world_size", &LoaderOptions::world_size)
      .def_property(
          "resume",
          [](const LoaderOptions& o) -> py::object {
            if (o.resume.consumed.empty()) return py::none();
            std::vector<std::pair<uint64_t, uint64_t>> ranges;
            for (const PositionRange& r : o.resume.consumed) ranges.emplace_back(r.begin, r.end);
            return py::make_tuple(o.resume.epoch, ranges);
          },
          [](LoaderOptions& o,
             std::optional<std::pair<uint64_t, std::vector<std::pair<uint64_t, uint64_t>>>>
                 resume) {
            o.resume = {};
            if (!resume) return;
            o.resume.epoch = resume->first;
            for (const auto& [begin, end] : resume->second)
              o.resume.consumed.push_back({begin, end});
          },
          "(epoch, [(begin, end), ...]): the positions of that epoch's global order already "
          "consumed, which the loader leaves out of it (a resume on any world_size); None: none.")
      .def_readwrite("stage_dir", &LoaderOptions::stage_dir)
      .def_readwrite("stage_group", &LoaderOptions::stage_group)
      .def_readwrite("cache_bytes", &LoaderOptions::cache_bytes)
      .def_readwrite("eviction", &LoaderOptions::eviction)
      .def_readwrite("prefetchers", &LoaderOptions::prefetchers)
      .def_readwrite("readers", &LoaderOptions::readers)
      .def_readwrite("lookahead", &LoaderOptions::lookahead)
      .def_readwrite("autotune", &LoaderOptions::autotune)
      .def_readwrite("memory_budget", &LoaderOptions::memory_budget)
      .def_readwrite("depth", &LoaderOptions::depth)
      .def_readwrite("max_pixels", &LoaderOptions::max_pixels)
      .def_readwrite("io_timeout_ms", &LoaderOptions::io_timeout_ms)
      .def_readwrite("stage_patience_ms", &LoaderOptions::stage_patience_ms)
      .def_readwrite("peers", &LoaderOptions::peers)
      .def_readwrite("peer_timeout_ms", &LoaderOptions::peer_timeout_ms)
      .def_readwrite("pfs_reads", &LoaderOptions::pfs_reads)
      .def_readwrite("peer_comm_fortran", &LoaderOptions::peer_comm_fortran)
      .def_readwrite("on_error", &LoaderOptions::on_error)
      .def_readwrite("transform", &LoaderOptions::transform)
      .def_readwrite("layout", &LoaderOptions::layout)
      .def_readwrite("dtype", &LoaderOptions::dtype)
      .def_property(
          "mean", [](const LoaderOptions& o) { return std::vector<float>(o.mean, o.mean + 3); },
          [](LoaderOptions& o, const std::array<float, 3>& v) {
            std::copy(v.begin(), v.end(), o.mean);
          })
      .def_property(
          "std", [](const LoaderOptions& o) { return std::vector<float>(o.stddev, o.stddev + 3); },
          [](LoaderOptions& o, const std::array<float, 3>& v) {
            std::copy(v.begin(), v.end(), o.stddev);
          })
      .def_readwrite("array_name", &LoaderOptions::array_name)
      .def_readwrite("max_sample_bytes", &LoaderOptions::max_sample_bytes)
      .def_readwrite("raw_dtype", &LoaderOptions::raw_dtype)
      .def_readwrite("raw_shape", &LoaderOptions::raw_shape)
      .def_readwrite("trace", &LoaderOptions::trace)
      .def_readwrite("decode_device", &LoaderOptions::decode_device)
      .def_readwrite("gpu_cpu_share", &LoaderOptions::gpu_cpu_share)
      .def_readwrite("gpu_crop", &LoaderOptions::gpu_crop)
      .def(
          "to_dict",
          [](py::object self) {
            return py::module_::import("prestage.options").attr("keywords")(self);
          },
          R"doc(
The options as the keywords of prestage.Loader take them (stage_patience in seconds, enums by name,
None where the loader sizes or bounds the value itself): prestage.options.keywords.

>>> prestage._core.LoaderOptions().to_dict()["stage_patience"]
0.05
)doc")
      .def("__repr__",
           [](py::object self) {
             return py::module_::import("prestage.options").attr("format_options")(self);
           })
      .def("validate", &LoaderOptions::validate, R"doc(
Raises prestage.ConfigError naming the first invalid option: the one place options are checked.

>>> options = prestage._core.LoaderOptions(); options.depth = 1; options.validate()
)doc");

  py::class_<Batch, std::shared_ptr<Batch>>(m, "Batch", R"doc(
A decoded batch, lent by the loader. Its arrays are views of a batch buffer of the loader's ring (no
copy); the buffer is reused only after the batch and every array viewing it have been collected.
)doc")
      .def("__len__", &Batch::size)
      .def_property_readonly("epoch", &Batch::epoch)
      .def_property_readonly("index", &Batch::index, "Position in the epoch, from 0.")
      .def_property_readonly("pinned", &Batch::pinned,
                             "Whether the buffer is page-locked (by mlock or CUDA registration).")
      .def_property_readonly(
          "pinning", [](const Batch& b) { return std::string(to_string(b.pinning())); },
          "How the buffer is pinned: \"cuda\" (registered with the CUDA driver: device copies are "
          "asynchronous), \"mlock\" or \"none\".")
      .def_property_readonly(
          "images",
          [](py::object self) -> py::object {
            const auto& b = self.cast<const Batch&>();
            if (!decodes_images(b.mode()))
              throw ConfigError("images: this loader does not decode images");
            if (b.device_data() != nullptr) throw ConfigError(kOnDevice);
            if (b.ragged()) return sample_views(self, b);
            const auto s = b.shape();
            return typed_view(self, b,
                              {static_cast<py::ssize_t>(s[0]), static_cast<py::ssize_t>(s[1]),
                               static_cast<py::ssize_t>(s[2]), static_cast<py::ssize_t>(s[3])},
                              0, b.data().size());
          },
          "RGB images (zero-copy): (N, H, W, 3) or (N, 3, H, W) (layout=), uint8 or float32 "
          "(dtype=). Without image_size, a batch of images of mixed sizes (ragged) is a list of N "
          "arrays, (H_i, W_i, 3) or (3, H_i, W_i).")
      .def_property_readonly(
          "arrays",
          [](py::object self) {
            const auto& b = self.cast<const Batch&>();
            if (b.device_data() != nullptr) throw ConfigError(kOnDevice);
            return sample_views(self, b);
          },
          "The samples as NumPy arrays (zero-copy): one (N, *shape) array when their shapes agree, "
          "else "
          "a list of N arrays. decode='raw': the samples' bytes (uint8, or raw_dtype).")
      .def_property_readonly(
          "on_device", [](const Batch& b) { return b.device_data() != nullptr; },
          "Whether the images are in CUDA device memory (decode_device='cuda'): then "
          "__cuda_array_interface__ describes them and images is refused.")
      .def_property_readonly(
          "__cuda_array_interface__",
          [](const Batch& b) -> py::dict {
            if (b.device_data() == nullptr) {
              throw py::attribute_error("this batch is in host memory (decode_device='cpu')");
            }
            const auto s = b.shape();
            py::dict d;
            d["shape"] = py::make_tuple(s[0], s[1], s[2], s[3]);
            d["typestr"] = std::string(b.dtype());
            d["data"] = py::make_tuple(reinterpret_cast<uintptr_t>(b.device_data()), false);
            d["strides"] = py::none();
            d["version"] = 3;
            // The consumer makes its stream wait for this one (CUDA Array Interface v3).
            d["stream"] = reinterpret_cast<uintptr_t>(b.device_stream());
            return d;
          },
          "decode_device='cuda': the device batch, (N, H, W, 3) uint8, as the CUDA Array "
          "Interface (v3) describes it: torch.as_tensor(batch, device='cuda'), cupy.asarray(batch) "
          "view it without a copy and hold the batch while they live. Its \"stream\" is the one "
          "that wrote it: a consumer waits for it before reading. The buffer is written over by "
          "a later batch once the batch is collected: no queued work may still read it then. "
          "AttributeError for a batch in host memory.")
      .def_property_readonly(
          "device_ready",
          [](const Batch& b) -> py::object {
            if (b.device_data() == nullptr) return py::none();
            return py::int_(reinterpret_cast<uintptr_t>(b.device_ready()));
          },
          "decode_device='cuda': the cudaEvent_t (an integer) recorded after the work that wrote "
          "the device batch (wait for it before reading); None for a batch in host memory.")
      .def_property_readonly(
          "device_stream",
          [](const Batch& b) -> py::object {
            if (b.device_data() == nullptr) return py::none();
            return py::int_(reinterpret_cast<uintptr_t>(b.device_stream()));
          },
          "decode_device='cuda': the cudaStream_t (an integer) that wrote the device batch "
          "(torch.cuda.ExternalStream takes it); None for a batch in host memory.")
      .def_property_readonly("ragged", &Batch::ragged, "Whether the samples' shapes differ.")
      .def_property_readonly(
          "dtype", [](const Batch& b) { return py::dtype(std::string(b.dtype())); },
          "The NumPy dtype of the samples' elements.")
      .def_property_readonly(
          "shapes",
          [](const Batch& b) {
            py::list out;
            for (size_t i = 0; i < b.size(); ++i) {
              py::tuple t(b.sample_shape(i).size());
              size_t k = 0;
              for (const uint64_t d : b.sample_shape(i)) t[k++] = d;
              out.append(t);
            }
            return out;
          },
          "Each sample's shape, a list of tuples.")
      .def_property_readonly(
          "data",
          [](py::object self) {
            const auto& b = self.cast<const Batch&>();
            return view(self, reinterpret_cast<const uint8_t*>(b.data().data()),
                        {static_cast<py::ssize_t>(b.data().size())});
          },
          "The whole batch buffer as a 1-D uint8 array (decode='raw': samples back to back).")
      .def_property_readonly(
          "offsets",
          [](py::object self) {
            const auto& b = self.cast<const Batch&>();
            return view(self, b.offsets().data(), {static_cast<py::ssize_t>(b.offsets().size())});
          },
          "decode='raw': N + 1 offsets into data; sample i is data[offsets[i]:offsets[i + 1]].")
      .def_property_readonly(
          "labels",
          [](py::object self) {
            const auto& b = self.cast<const Batch&>();
            return view(self, b.labels().data(), {static_cast<py::ssize_t>(b.labels().size())});
          },
          "int64 array (N,).")
      .def_property_readonly(
          "indices",
          [](py::object self) {
            const auto& b = self.cast<const Batch&>();
            return view(self, b.indices().data(), {static_cast<py::ssize_t>(b.indices().size())});
          },
          "int64 array (N,): the samples' catalog indices.");

  py::class_<Loader>(m, "Loader", "The C++ loader; use prestage.Loader.")
      .def(py::init<Catalog, LoaderOptions>(), py::arg("catalog"), py::arg("options"),
           py::call_guard<py::gil_scoped_release>(), R"doc(
Validates `options` (prestage.ConfigError naming the first invalid one) and allocates the ring.

>>> core = prestage._core.Loader(catalog, prestage._core.LoaderOptions())
)doc")
      .def_property_readonly("batches_per_epoch", &Loader::batches_per_epoch)
      .def("batches_in_epoch", &Loader::batches_in_epoch, py::arg("epoch"),
           "Batches of `epoch`: batches_per_epoch, or fewer for the epoch options.resume resumes.")
      .def_property_readonly(
          "options", [](const Loader& l) { return l.options(); },
          "A copy of the options in effect.\n\n>>> core.options.depth")
      .def_property_readonly(
          "image_size",
          [](const Loader& l) -> py::object {
            const ImageSize size = l.image_size();
            if (size.empty()) return py::none();
            return py::make_tuple(size.height, size.width);
          },
          R"doc(
decode="jpeg": (height, width) of every image of a batch: the image_size option. None without
it (images are not resized: each keeps its own size, Batch.shapes) and for the other decode modes.

>>> core.image_size
(224, 224)
)doc")
      .def_property_readonly(
          "position",
          [](const Loader& l) {
            const Loader::Position p = l.position();
            return py::make_tuple(p.epoch, p.batch);
          },
          R"doc(
(epoch, batch): the batch next() returns next. A batch counts once next() has returned it or
raised its sample's error (IoError, DecodeError); a next() that raises anything else (a closed
loader, every buffer held, KeyboardInterrupt) leaves the position as it was.

>>> core.position
(0, 3)
)doc")
      .def("start_epoch", &Loader::start_epoch, py::arg("epoch"), py::arg("first_batch") = 0,
           py::call_guard<py::gil_scoped_release>())
      .def(
          "next",
          [](Loader& loader) -> std::shared_ptr<Batch> {
            // Waits without the GIL, waking every 50 ms so that Ctrl+C interrupts the wait.
            while (true) {
              std::optional<Batch> out;
              Loader::Wait result;
              {
                py::gil_scoped_release release;
                result = loader.next_for(std::chrono::milliseconds(50), out);
              }
              if (result == Loader::Wait::kBatch) return std::make_shared<Batch>(std::move(*out));
              if (result == Loader::Wait::kEndOfEpoch) return nullptr;
              if (PyErr_CheckSignals() != 0) throw py::error_already_set();
            }
          },
          "The next batch of the epoch, or None at its end. Raises the error of a failed sample, "
          "and prestage.ConfigError once the loader is closed (also by a close() from another "
          "thread while this one waits). Calls from several threads are served one at a time.")
      .def("staged_path", &Loader::staged_path, py::arg("sample"),
           "Where the copy of sample's file goes in the stage directory (there or not); '' without "
           "one.")
      .def(
          "stats",
          [](const Loader& l) {
            Stats stats;
            {
              // Any thread, also while another waits in next(): its lock is never held for long,
              // but not with the GIL.
              py::gil_scoped_release release;
              stats = l.stats();
            }
            return to_dict(stats, Stats::fields());
          },
          "Per-stage counters (prestage.Loader.stats); any thread, any time, also after "
          "close().\n\n"
          ">>> core.stats()['consumer_stall_s']")
      .def(
          "take_tuning_log", &Loader::take_tuning_log, py::call_guard<py::gil_scoped_release>(),
          "The self-tuning's decisions since the last call, oldest first (stats()['tuning']['log'] "
          "keeps the latest 100).\n\n>>> core.take_tuning_log()")
      .def("close", &Loader::close, py::call_guard<py::gil_scoped_release>(), R"doc(
Stops the pipeline and joins its threads; any thread. A next() waiting in another thread raises
prestage.ConfigError at once. Idempotent: a close() that finds another under way waits for it.

>>> core.close()
)doc");
}

}  // namespace prestage::python
