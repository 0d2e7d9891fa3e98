#include <map>
#include <optional>
#include <string>
#include <tuple>

#include <pybind11/numpy.h>
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

Catalog::Symlinks symlink_policy(const std::string& name) {
  if (name == "follow") return Catalog::Symlinks::kFollow;
  if (name == "inside") return Catalog::Symlinks::kInside;
  throw ConfigError("symlinks must be 'follow' or 'inside', got '" + name + "'");
}

OnError error_policy(const std::string& name) {
  if (name == "raise") return OnError::kRaise;
  if (name == "skip") return OnError::kSkip;
  throw ConfigError("on_error must be 'raise' or 'skip', got '" + name + "'");
}

// One RuntimeWarning (through Python's warnings, so filters apply) summing up what from_tfrecord
// (records) or from_webdataset (samples) left out. Needs the GIL.
void warn_damage(const Catalog& catalog, const std::string& from = "from_tfrecord",
                 const std::string& what = "record") {
  const auto& damage = catalog.damage();
  if (damage.empty()) return;
  size_t files = 0;
  for (size_t i = 0; i < damage.size(); ++i) {
    files += i == 0 || damage[i].file != damage[i - 1].file;
  }
  const auto& first = damage.front();
  const std::string message =
      from + ": " + std::to_string(damage.size()) + " damaged " + what +
      (damage.size() == 1 ? "" : "s") + " in " + std::to_string(files) + " file" +
      (files == 1 ? "" : "s") + " left out of the catalog (on_error='skip'); the first: '" +
      catalog.file_source_path(first.file).string() + "' at byte " + std::to_string(first.offset) +
      ": " + first.reason + (first.rest_of_file ? " (the rest of the file is lost)" : "") +
      ". Catalog.damage lists them all.";
  if (PyErr_WarnEx(PyExc_RuntimeWarning, message.c_str(), 1) != 0) throw py::error_already_set();
}

Catalog::Missing missing_policy(const std::string& name) {
  if (name == "error") return Catalog::Missing::kError;
  if (name == "skip") return Catalog::Missing::kSkip;
  if (name == "empty") return Catalog::Missing::kEmpty;
  throw ConfigError("missing must be 'error', 'skip' or 'empty', got '" + name + "'");
}

// One pattern (str or os.PathLike) or a sequence of them, as text.
std::vector<std::string> pattern_list(py::handle patterns) {
  std::vector<std::string> out;
  for (const auto& p : path_list(patterns)) out.push_back(p.string());
  return out;
}

const char* symlinks_name(Catalog::Symlinks s) {
  return s == Catalog::Symlinks::kInside ? "inside" : "follow";
}

// The `fields` of from_webdataset and from_mds: {"image" or "data": what feeds the images or
// arrays, "label": what feeds the labels (None: no labels)}, each defaulted where left out.
std::pair<std::string, std::string> data_and_label(
    const std::string& who, const std::map<std::string, std::optional<std::string>>& fields,
    std::string data, std::string label) {
  bool have_data = false;
  for (const auto& [key, value] : fields) {
    if (key == "image" || key == "data") {
      if (have_data || !value) {
        throw ConfigError(who + ": fields needs one 'image' or 'data' entry");
      }
      data = *value;
      have_data = true;
    } else if (key == "label") {
      label = value.value_or("");
    } else {
      throw ConfigError(who + ": fields takes the keys 'image' or 'data', and 'label', got '" +
                        key + "'");
    }
  }
  return {data, label};
}

}  // namespace

void register_catalog(py::module_& m) {
  py::class_<Catalog> catalog(m, "Catalog", R"doc(
The immutable, indexed list of samples 0..N-1 of a data set: a path relative to the root and a label.
Symbolic links under the root are followed wherever they lead, as torchvision does, unless the
catalog is built with symlinks="inside" (see from_folder).

>>> cat = prestage.Catalog.from_folder("/data/imagenet/train")
>>> len(cat), cat.path(0), cat.label(0)
)doc");
  catalog
      .def_static(
          "from_folder",
          [](const std::filesystem::path& root, const std::vector<std::string>& extensions,
             const std::string& symlinks) {
            const auto policy = symlink_policy(symlinks);
            py::gil_scoped_release release;
            return Catalog::from_folder(root, extensions, policy);
          },
          py::arg("root"), py::arg("extensions") = std::vector<std::string>{".jpg", ".jpeg"},
          py::kw_only(), py::arg("symlinks") = "follow", R"doc(
One class per sub-folder of `root` (label = index of the folder in sorted order, as torchvision's
ImageFolder); files with one of `extensions` (case-insensitive), sorted.

`symlinks`: "follow" (the default, as torchvision does) follows symbolic links wherever they lead;
"inside" refuses a link that leads out of `root` (prestage.IoError, errno EXDEV, naming it) while
the tree is walked, before walking into a linked folder. Use "inside" on a shared file system where
others can create links in the data set. The choice is saved with the catalog (`symlinks`).

>>> prestage.Catalog.from_folder("train/")
>>> prestage.Catalog.from_folder("/shared/train", symlinks="inside")
)doc")
      .def_static(
          "from_list",
          [](const std::filesystem::path& path, const std::filesystem::path& root,
             const std::string& symlinks) {
            const auto policy = symlink_policy(symlinks);
            py::gil_scoped_release release;
            return Catalog::from_list(path, root, policy);
          },
          py::arg("path"), py::arg("root"), py::kw_only(), py::arg("symlinks") = "follow", R"doc(
A text file of `relative/path[,label]` lines; paths are relative to `root`. `symlinks`: as for
from_folder ("inside" refuses a listed file that leads out of `root`; a missing one is left to
the read).

>>> prestage.Catalog.from_list("train.txt", root="/data/set")
)doc")
      .def_static(
          "from_paths",
          [](const std::filesystem::path& root, const std::vector<std::string>& paths,
             const std::vector<int64_t>& labels, const std::vector<std::string>& classes,
             const std::string& symlinks) {
            return Catalog::from_paths(root, paths, labels, classes, symlink_policy(symlinks));
          },
          py::arg("root"), py::arg("paths"), py::arg("labels") = std::vector<int64_t>{},
          py::arg("classes") = std::vector<std::string>{}, py::kw_only(),
          py::arg("symlinks") = "follow", R"doc(
Explicit relative paths and labels (or no labels: -1). No file is touched here; `symlinks`
("follow" or "inside", as for from_folder) is recorded with the catalog for its readers.

>>> prestage.Catalog.from_paths("/data", ["a/1.jpg", "b/2.jpg"], [0, 1])
)doc")
      .def_static(
          "from_shards",
          [](const std::filesystem::path& dir) {
            py::gil_scoped_release release;
            return Catalog::from_shards(dir);
          },
          py::arg("dir"), R"doc(
A set packed by `prestage pack SRC DIR`: its samples, in the order of DIR/index.tsv, are byte
ranges of the shards in DIR, with the labels and class names of the set they were packed from.
A shard is staged whole; a sample packed with zstd is decompressed by every decode mode but "raw".

>>> prestage.Catalog.from_shards("/pfs/imagenet-packed")
)doc")
      .def_static(
          "from_hdf5",
          [](py::handle paths, const std::string& dataset, const std::optional<std::string>& labels,
             int64_t axis) {
            const auto files = path_list(paths);
            py::gil_scoped_release release;
            return Catalog::from_hdf5(files, dataset, labels.value_or(""), axis);
          },
          py::arg("paths"), py::arg("dataset"), py::arg("labels") = py::none(), py::kw_only(),
          py::arg("axis") = 0, R"doc(
Samples are the slices along `axis` of `dataset` in each file of `paths`, in order: its rows with
axis=0 (one sample per file is a dataset of one row); a negative axis counts from the last. A
sample has the dataset's shape without that axis (h5py's ``dset[i]``, ``dset[:, i]``, ...).
`labels`: a 1-D integer dataset with one entry per sample of its file, or None (-1). Decode with
Loader(decode="hdf5"). HDF5 calls are serialised process-wide (the library is not thread-safe).

>>> cat = prestage.Catalog.from_hdf5(["climate_0.h5", "climate_1.h5"], "fields", labels="labels")
>>> cat = prestage.Catalog.from_hdf5(files, "records", labels="labels", axis=-1)
)doc")
      .def_static(
          "from_arrays",
          [](py::handle paths, int64_t axis, const std::optional<std::string>& member,
             const std::optional<std::string>& labels) {
            const auto files = path_list(paths);
            py::gil_scoped_release release;
            return Catalog::from_arrays(files, axis, member.value_or(""), labels.value_or(""));
          },
          py::arg("paths"), py::kw_only(), py::arg("axis") = 0, py::arg("member") = py::none(),
          py::arg("labels") = py::none(), R"doc(
Samples are the slices along `axis` of one array per file of `paths`, in order: the array of a
``.npy`` file, or member `member` of a ``.npz`` archive (``np.savez`` or ``np.savez_compressed``;
None: its only member). A sample has the array's shape without that axis, in C order (NumPy's
``np.take(a, i, axis)``); a negative axis counts from the last, as some generators put the
samples. `labels`: a 1-D integer member of each ``.npz`` with one entry per sample, or None (-1).
Reads each file's headers (and labels) once; save() the catalog to do that only once. Decode
with Loader(decode="npy") (the default for this catalog).

Along axis 0 of a C-order array a sample is one contiguous read; along another axis it is read
a run at a time, or as the span it covers (up to 64 MiB) at once. A deflated member is inflated
whole for each sample (its size counts against max_sample_bytes): store many-sample archives with
np.savez. A slice of a stored member is read without the member's CRC (which covers all of it).

>>> files = sorted(glob.glob("data/*.npz"))
>>> cat = prestage.Catalog.from_arrays(files, axis=-1, member="x", labels="y")
)doc")
      .def_static(
          "from_tfrecord",
          [](py::handle paths, const std::map<std::string, std::string>& features,
             const std::string& on_error) {
            for (const auto& [key, value] : features) {
              if (key != "image" && key != "data" && key != "label") {
                throw ConfigError(
                    "from_tfrecord: features takes the keys 'image' or 'data', and 'label', got '" +
                    key + "'");
              }
            }
            // "data" is "image" by another name, for features that are not images.
            auto image = features.find("image");
            const auto data = features.find("data");
            if ((image == features.end()) == (data == features.end()))
              throw ConfigError("from_tfrecord: features needs one 'image' or 'data' entry");
            if (image == features.end()) image = data;
            const auto label = features.find("label");
            const auto files = path_list(paths);
            const auto policy = error_policy(on_error);
            std::optional<Catalog> catalog;
            {
              py::gil_scoped_release release;
              catalog.emplace(Catalog::from_tfrecord(
                  files, image->second, label == features.end() ? "" : label->second, policy));
            }
            warn_damage(*catalog);
            return *catalog;
          },
          py::arg("paths"), py::arg("features"), py::kw_only(), py::arg("on_error") = "raise",
          R"doc(
Samples are the records (tf.train.Example) of the TFRecord files `paths`, in order. `features`:
{"image": name of the bytes feature to decode (decode="jpeg", "raw", "npy" or "npz"),
 "label": name of an int64 feature (optional)}; "data" may stand for "image" (one of the two). With
decode="raw" the data feature may also be a float_list or int64_list (float32 or int64 arrays), and
raw_dtype/raw_shape give a bytes feature its type and shape. Reads every record once, checking its
CRCs, to build the index of record offsets; save() the catalog to do that only once.

A damaged record (bad CRC, truncated file, an Example that is malformed or lacks a feature):
on_error="raise" (the default) raises prestage.DecodeError naming the file and the byte;
on_error="skip" keeps every good record, warns once (RuntimeWarning) and lists what it left out in
`damage`. A record whose data is bad but whose length is intact is left out alone; a bad length or a
truncation loses the rest of that file (nothing after it can be located). Read errors
(prestage.IoError) are raised either way. Paths are opened as given, symbolic links followed.

>>> cat = prestage.Catalog.from_tfrecord(["train-0.tfrecord"],
...                                      features={"image": "image/encoded", "label": "image/class/label"})
>>> cat = prestage.Catalog.from_tfrecord(shards, features={"image": "jpg"}, on_error="skip")
>>> cat = prestage.Catalog.from_tfrecord(files, features={"data": "image", "label": "size"})
>>> cat.damage   # [{"path": ..., "offset": ..., "rest_of_file": ..., "reason": ...}, ...]
)doc")
      .def_static(
          "from_webdataset",
          [](py::handle shards, const std::map<std::string, std::optional<std::string>>& fields,
             const std::string& missing, const std::string& on_error, py::handle index) {
            const auto [data, label] = data_and_label("from_webdataset", fields, "jpg;jpeg", "cls");
            const auto patterns = pattern_list(shards);
            const auto missing_policy_ = missing_policy(missing);
            const auto policy = error_policy(on_error);
            const auto indexes =
                index.is_none() ? std::vector<std::filesystem::path>{} : path_list(index);
            std::optional<Catalog> catalog;
            {
              py::gil_scoped_release release;
              catalog.emplace(Catalog::from_webdataset(patterns, data, label, missing_policy_,
                                                       policy, indexes));
            }
            warn_damage(*catalog, "from_webdataset", "sample");
            return *catalog;
          },
          py::arg("shards"),
          py::arg("fields") =
              std::map<std::string, std::optional<std::string>>{{"image", "jpg;jpeg"},
                                                                {"label", "cls"}},
          py::kw_only(), py::arg("missing") = "error", py::arg("on_error") = "raise",
          py::arg("index") = py::none(), R"doc(
Samples are the samples of WebDataset tar shards, in order. `shards`: a path, a glob ("*?[",
sorted) or a brace pattern ("train-{000000..000123}.tar", "{a,b}"), or a list of them. One pass
over each shard's headers (ustar, GNU long names and base-256 sizes, pax as Python's tarfile and
webdataset's TarWriter write them) groups its regular members into samples, as webdataset does:
runs of adjacent members whose names share a key (the name up to the first dot after the last
"/"; the rest, lower-cased, is the extension); "__*__" metadata is passed over. Every field is a
byte range of the shard: nothing is unpacked, and a shard is staged whole.

A shard compressed whole (gzip: ".tar.gz", ".tgz", webdataset's ``TarWriter(compress=True)``;
zstd: ".tar.zst"; told by its first bytes) cannot be read by byte range: it is decompressed in two
streaming passes (its size and CRC, then its headers), its samples are byte ranges of its
decompressed bytes, and stage 2 writes it decompressed to the stage directory, whence every sample
is read (a Loader of such a catalog needs ``stage_dir``). A stream that is corrupt or truncated is
damage of the whole shard (on_error below; none of its samples is kept).

`fields`: {"image": extensions of the member to decode, alternatives separated by ";" as DALI's
ext (default "jpg;jpeg"; "data" may stand for "image", e.g. "npy" for decode="npy", or any
extension for decode="raw"), "label": the extension of a member holding the label as decimal text
("cls", the default), or "json:KEY" for the integer at KEY of the sample's ".json" object, or None
(labels -1)}. `missing`: what a sample lacking a field becomes, as DALI's
missing_component_behavior: "error" (damage, see on_error), "skip" (left out silently) or "empty"
(a data member of 0 bytes: decode="raw" gives an empty array, other decoders a DecodeError at its
batch; a label of -1).

Damage (a header with a bad checksum, a malformed pax record or one that disagrees with its header,
a member past the end of the shard, a key whose members are not adjacent, an extension twice in a
sample, a label that does not parse, a missing field with missing="error"): on_error="raise" (the
default) raises prestage.DecodeError naming the shard, the member or key and the byte;
on_error="skip" keeps every good sample, warns once (RuntimeWarning) and lists what it left out in
`damage`. After a bad header the scan goes on at the next good one (the sample being read when it
was found is lost with it); a truncated shard loses its end. Read errors (prestage.IoError) are
raised either way. Save the catalog to scan the shards only once.

`index`: a DALI index per shard (wds2idx's ``.idx``, v1.1 or v1.2), a path or a list in the order
of the shards as expanded, read instead of scanning each shard. Each is checked against its shard
as it is read (its members in order within the shard, each after a tar header of its size, and of
its name for v1.2): an index that does not describe its shard is prestage.ConfigError naming both.

>>> cat = prestage.Catalog.from_webdataset("/pfs/laion/train-{000000..000123}.tar")
>>> cat = prestage.Catalog.from_webdataset("shards/*.tar", fields={"image": "jpg;jpeg",
...                                         "label": "json:label"}, on_error="skip")
>>> cat = prestage.Catalog.from_webdataset(shards, fields={"data": "npy", "label": None})
>>> cat = prestage.Catalog.from_webdataset("train-{0..9}.tar", index=[f"train-{i}.idx" for i in range(10)])
)doc")
      .def_static(
          "from_mds",
          [](const std::filesystem::path& dir,
             const std::map<std::string, std::optional<std::string>>& fields,
             const std::string& on_error) {
            const auto [data, label] = data_and_label("from_mds", fields, "image", "label");
            const auto policy = error_policy(on_error);
            std::optional<Catalog> catalog;
            {
              py::gil_scoped_release release;
              catalog.emplace(Catalog::from_mds(dir, data, label, policy));
            }
            warn_damage(*catalog, "from_mds", "sample");
            return *catalog;
          },
          py::arg("dir"),
          py::arg("fields") = std::map<std::string, std::optional<std::string>>{{"image", "image"},
                                                                                {"label", "label"}},
          py::kw_only(), py::arg("on_error") = "raise", R"doc(
Samples are the samples of a MosaicML Streaming MDS set (the folder `dir` of MDSWriter's index.json,
version 2, and its shards), in order. One read of each shard's offset table and of each sample's
column sizes locates one column of every sample as a byte range of its shard (nothing is unpacked;
a shard is staged whole). `fields`: {"image": the column to decode ("data" may stand for it): a
`jpeg` column for decode="jpeg"; `bytes`, `png`, `str` columns as they are, an `ndarray` column's
values and a `pil` column's pixels for decode="raw"; "label": an integer column (int, int8..int64,
uint8..uint64, str_int) or None (labels -1)}. A shard written with compression ("zstd", "gz") is
read from its decompressed copy (index.json's raw_data, as Streaming's cache keeps it) where that
is beside it, else from its zip_data as a compressed WebDataset shard is (decompressed while
staging; a Loader needs ``stage_dir``); another compression is prestage.ConfigError.

Damage (a shard whose sample count disagrees with index.json, offsets out of order or past the end
of the shard, column sizes that do not add up): on_error="raise" raises prestage.DecodeError
naming the shard and the sample; on_error="skip" keeps every good sample, warns once and lists the
rest in `damage`.

>>> cat = prestage.Catalog.from_mds("/pfs/imagenet-mds", fields={"image": "jpg", "label": "cls"})
)doc")
      .def_property_readonly(
          "kind",
          [](const Catalog& c) {
            switch (c.kind()) {
              case Catalog::Kind::kTfrecord:
                return "tfrecord";
              case Catalog::Kind::kHdf5:
                return "hdf5";
              case Catalog::Kind::kArrays:
                return "arrays";
              default:
                return "files";
            }
          },
          "'files', 'tfrecord', 'hdf5' or 'arrays' (from_arrays): what a sample's locator names.")
      .def_property_readonly(
          "field", &Catalog::field,
          "The TFRecord data feature, the HDF5 dataset or the .npz member ('' for files).")
      .def_property_readonly("axis", &Catalog::axis,
                             "from_hdf5 and from_arrays: the axis the samples are sliced along, as "
                             "given (negative: from the last); else 0.")
      .def_property_readonly(
          "dtype",
          [](const Catalog& c) -> py::object {
            if (c.dtype().empty()) return py::none();
            return py::str(c.dtype());
          },
          "from_hdf5 and from_arrays: the data set's dtype as NumPy's type string ('<f4'), the one "
          "most samples have, read with the headers the catalog reads anyway; from_tfrecord: the "
          "data feature's as decode='raw' reads it ('|u1' bytes, '<f4' floats, '<i8' int64s). The "
          "loader holds every sample to it without probing. None: not known (other catalogs, or "
          "one saved by an older version, for which the loader probes a few samples' headers).")
      .def_property_readonly(
          "symlinks", [](const Catalog& c) { return symlinks_name(c.symlinks()); },
          "'follow' or 'inside': how symbolic links under the root are treated (see from_folder).")
      .def_property_readonly(
          "damage",
          [](const Catalog& c) {
            py::list out;
            for (const auto& d : c.damage()) {
              py::dict entry;
              entry["path"] = c.file_source_path(d.file).string();
              entry["offset"] = d.offset;
              entry["rest_of_file"] = d.rest_of_file;
              entry["reason"] = d.reason;
              out.append(entry);
            }
            return out;
          },
          R"doc(
What from_tfrecord, from_webdataset, from_mds or from_hf (with on_error="skip") left out, in file
and byte order: a list of {"path", "offset" (byte of the damaged record, tar member, MDS sample,
Arrow record batch or Parquet page),
"rest_of_file" (True: nothing after it in that file could be read), "reason"}. Empty for any other
catalog; saved with it.

>>> [(d["path"], d["offset"]) for d in cat.damage]
)doc")
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
      .def(
          "locator",
          [](const Catalog& c, size_t i) {
            if (i >= c.size())
              throw py::index_error("sample " + std::to_string(i) + " of " +
                                    std::to_string(c.size()));
            const Catalog::Locator loc = c.locator(i);
            return py::make_tuple(loc.file, loc.offset,
                                  loc.length == Catalog::kWholeFile
                                      ? py::object(py::none())
                                      : py::object(py::int_(loc.length)));
          },
          py::arg("i"),
          "(file, offset, length) of sample i: the index of its file (file_path), and its byte "
          "range "
          "in it (length None: the whole file). For kind 'hdf5' and 'arrays', offset is the "
          "sample's index along `axis` in the whole file.")
      .def_property_readonly("num_files", &Catalog::num_files,
                             "Files the samples are in (a file may hold several: HDF5, TFRecord).")
      .def(
          "file_sizes",
          [](const Catalog& c) {
            py::array_t<int64_t> out(static_cast<py::ssize_t>(c.num_files()));
            auto sizes = out.mutable_unchecked<1>();
            for (size_t f = 0; f < c.num_files(); ++f) {
              const uint64_t size = c.file_size(f);
              sizes(static_cast<py::ssize_t>(f)) =
                  size == Catalog::kUnknownSize ? -1 : static_cast<int64_t>(size);
            }
            return out;
          },
          "Each file's size in bytes when the catalog was built (from_folder, from_list), -1 where "
          "it was not recorded; an int64 array of num_files entries, read from the catalog (no "
          "file system call). A compressed file's is that of its decompressed bytes.")
      .def(
          "file_codec",
          [](const Catalog& c, size_t f) {
            if (f >= c.num_files())
              throw py::index_error("file " + std::to_string(f) + " of " +
                                    std::to_string(c.num_files()));
            switch (c.file_codec(f)) {
              case Catalog::Codec::kGzip:
                return "gzip";
              case Catalog::Codec::kZstd:
                return "zstd";
              default:
                return "none";
            }
          },
          py::arg("f"),
          "How file f is stored at the source: 'none', or 'gzip'/'zstd' for a shard compressed "
          "whole (a .tar.gz, .tar.zst, an MDS shard written with compression), whose samples are "
          "byte ranges of its decompressed bytes, read only from the copy stage 2 writes to the "
          "stage directory.\n\n>>> catalog.file_codec(0)\n'gzip'")
      .def_property_readonly("compressed", &Catalog::has_compressed_files,
                             "Whether some file is compressed whole (see file_codec): a loader "
                             "of this catalog needs a stage directory.")
      .def("__repr__", [](const Catalog& c) {
        return "<prestage.Catalog of " + std::to_string(c.size()) + " samples under '" +
               c.root().string() + "'" +
               (c.damage().empty()
                    ? std::string()
                    : ", " + std::to_string(c.damage().size()) + " damaged records left out") +
               ">";
      });

  // Catalog.from_hf (python/prestage/hf.py) locates its samples with pyarrow and builds its catalog
  // here: arrays of one entry per sample, and the damage it found as (file, offset, rest_of_file,
  // reason) tuples.
  m.def(
      "_catalog_from_located",
      [](const std::filesystem::path& root, const std::vector<std::string>& files,
         py::array_t<uint64_t, py::array::c_style | py::array::forcecast> file_index,
         py::array_t<uint64_t, py::array::c_style | py::array::forcecast> offsets,
         py::array_t<uint64_t, py::array::c_style | py::array::forcecast> lengths,
         py::array_t<int64_t, py::array::c_style | py::array::forcecast> labels,
         const std::vector<std::string>& classes,
         const std::vector<std::tuple<uint64_t, uint64_t, bool, std::string>>& damage) {
        const auto n = static_cast<size_t>(file_index.size());
        if (offsets.size() != file_index.size() || lengths.size() != file_index.size() ||
            labels.size() != file_index.size()) {
          throw ConfigError("catalog: located samples of unequal lengths");
        }
        std::vector<Catalog::Locator> locators(n);
        const uint64_t* f = file_index.data();
        const uint64_t* o = offsets.data();
        const uint64_t* l = lengths.data();
        for (size_t i = 0; i < n; ++i) locators[i] = Catalog::Locator{f[i], o[i], l[i]};
        std::vector<int64_t> label_list(labels.data(), labels.data() + n);
        std::vector<Catalog::Damage> damage_list;
        for (const auto& [file, offset, rest, reason] : damage) {
          damage_list.push_back(Catalog::Damage{file, offset, rest, reason});
        }
        py::gil_scoped_release release;
        return Catalog::from_located(root, files, locators, label_list, classes,
                                     std::move(damage_list));
      },
      py::arg("root"), py::arg("files"), py::arg("file_index"), py::arg("offsets"),
      py::arg("lengths"), py::arg("labels"), py::arg("classes"), py::arg("damage"));
}

}  // namespace prestage::python
