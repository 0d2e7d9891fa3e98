#include "decode/hdf5.hpp"

#include <hdf5.h>

#include <list>
#include <mutex>
#include <stdexcept>
#include <utility>

#include "prestage/error.hpp"

namespace prestage::detail::hdf5 {
namespace {

constexpr size_t kMaxOpen = 64;

// Closes an HDF5 identifier with the matching call when it goes out of scope.
class Id {
 public:
  using Closer = herr_t (*)(hid_t);
  Id() = default;
  Id(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  Id(Id&& other) noexcept : id_(std::exchange(other.id_, -1)), closer_(other.closer_) {}
  Id& operator=(Id&& other) noexcept {
    if (this != &other) {
      reset();
      id_ = std::exchange(other.id_, -1);
      closer_ = other.closer_;
    }
    return *this;
  }
  ~Id() { reset(); }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset() {
    // A failed close leaves nothing to recover; the identifier is dropped either way.
    if (id_ >= 0 && closer_ != nullptr) static_cast<void>(closer_(id_));
    id_ = -1;
  }

 private:
  hid_t id_ = -1;
  Closer closer_ = nullptr;
};

struct Open {
  std::string file, dataset;
  Id file_id, dataset_id, memory_type;
  Hdf5Dataset info;
};

// The one lock and the cache of open datasets, most recently used first.
struct State {
  std::mutex mutex;
  std::list<Open> open;
  bool quiet = false;
};

State& state() {
  static State s;
  return s;
}

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw DecodeError(path, "HDF5: " + why);
}

const char* class_name(H5T_class_t c) {
  switch (c) {
    case H5T_INTEGER:
      return "integer";
    case H5T_FLOAT:
      return "float";
    case H5T_STRING:
      return "string";
    case H5T_BITFIELD:
      return "bitfield";
    case H5T_OPAQUE:
      return "opaque";
    case H5T_COMPOUND:
      return "compound";
    case H5T_REFERENCE:
      return "reference";
    case H5T_ENUM:
      return "enum";
    case H5T_VLEN:
      return "variable-length";
    case H5T_ARRAY:
      return "array";
    default:
      return "unknown";
  }
}

// Opens (or finds) `dataset` of `file`. Called with the lock held.
Open& open_dataset(State& s, const std::string& file, const std::string& dataset,
                   uint64_t max_bytes, const std::string& path) {
  for (auto it = s.open.begin(); it != s.open.end(); ++it) {
    if (it->file == file && it->dataset == dataset) {
      s.open.splice(s.open.begin(), s.open, it);
      return s.open.front();
    }
  }
  if (!s.quiet) {
    // HDF5 prints its error stack to stderr by default; errors reach the caller as DecodeErrors.
    static_cast<void>(H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr));
    s.quiet = true;
  }
  Open o;
  o.file = file;
  o.dataset = dataset;
  if (H5Fis_hdf5(file.c_str()) <= 0) fail(path, "not an HDF5 file (or unreadable)");
  o.file_id = Id(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!o.file_id.valid()) fail(path, "cannot open the file");
  o.dataset_id = Id(H5Dopen2(o.file_id.get(), dataset.c_str(), H5P_DEFAULT), H5Dclose);
  if (!o.dataset_id.valid()) fail(path, "no dataset '" + dataset + "'");
  Id type(H5Dget_type(o.dataset_id.get()), H5Tclose);
  if (!type.valid()) fail(path, "cannot read the type of '" + dataset + "'");
  const H5T_class_t cls = H5Tget_class(type.get());
  const size_t size = H5Tget_size(type.get());
  char kind = 0;
  if (cls == H5T_INTEGER) {
    const H5T_sign_t sign = H5Tget_sign(type.get());
    if (sign < 0) fail(path, "cannot read the sign of '" + dataset + "'");
    kind = sign == H5T_SGN_NONE ? 'u' : 'i';
  } else if (cls == H5T_FLOAT) {
    kind = 'f';
  }
  if (kind == 0 || (size != 1 && size != 2 && size != 4 && size != 8)) {
    fail(path, "dataset '" + dataset + "' holds " + class_name(cls) + " data of " +
                   std::to_string(size) +
                   "-byte elements; only integer and floating-point datasets can be decoded");
  }
  if (kind == 'f' && size == 1) fail(path, "dataset '" + dataset + "' holds 1-byte floats");
  // Read in the file's type, little-endian: HDF5 converts the byte order and nothing else.
  o.memory_type = Id(H5Tcopy(type.get()), H5Tclose);
  if (!o.memory_type.valid() || (size > 1 && H5Tset_order(o.memory_type.get(), H5T_ORDER_LE) < 0)) {
    fail(path, "cannot build a memory type for '" + dataset + "'");
  }
  Id space(H5Dget_space(o.dataset_id.get()), H5Sclose);
  const int rank = space.valid() ? H5Sget_simple_extent_ndims(space.get()) : -1;
  if (rank < 1) fail(path, "dataset '" + dataset + "' is a scalar or has no simple shape: no rows");
  if (static_cast<size_t>(rank) > kMaxDims + 1)
    fail(path, "dataset '" + dataset + "' has too many dimensions");
  hsize_t dims[kMaxDims + 1];
  if (H5Sget_simple_extent_dims(space.get(), dims, nullptr) != rank) {
    fail(path, "cannot read the shape of '" + dataset + "'");
  }
  o.info.rows = dims[0];
  o.info.row.dtype = std::string(size == 1 ? "|" : "<") + kind + std::to_string(size);
  o.info.row.ndim = static_cast<uint32_t>(rank - 1);
  for (int d = 1; d < rank; ++d) o.info.row.shape[static_cast<size_t>(d - 1)] = dims[d];
  finish_array_info(o.info.row, max_bytes, path);
  if (s.open.size() >= kMaxOpen) s.open.pop_back();
  s.open.push_front(std::move(o));
  return s.open.front();
}

}  // namespace

Hdf5Dataset describe(const std::string& file, const std::string& dataset, uint64_t max_bytes,
                     const std::string& path) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  return open_dataset(s, file, dataset, max_bytes, path).info;
}

void read_row(const std::string& file, const std::string& dataset, uint64_t row,
              const ArrayInfo& info, std::span<std::byte> out, const std::string& path) {
  if (out.size() != info.bytes) throw std::logic_error("hdf5::read_row: output of the wrong size");
  State& s = state();
  std::lock_guard lock(s.mutex);
  Open& o = open_dataset(s, file, dataset, ~uint64_t{0}, path);
  if (!o.info.row.same_layout(info)) {
    fail(path, "dataset '" + dataset + "' changed type or shape since the catalog was built");
  }
  if (row >= o.info.rows) {
    fail(path, "row " + std::to_string(row) + " is past the " + std::to_string(o.info.rows) +
                   " rows of '" + dataset + "'");
  }
  Id file_space(H5Dget_space(o.dataset_id.get()), H5Sclose);
  if (!file_space.valid()) fail(path, "cannot read the shape of '" + dataset + "'");
  const uint32_t rank = info.ndim + 1;
  hsize_t start[kMaxDims + 1] = {};
  hsize_t count[kMaxDims + 1];
  start[0] = row;
  count[0] = 1;
  for (uint32_t d = 0; d < info.ndim; ++d) count[d + 1] = info.shape[d];
  if (H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start, nullptr, count, nullptr) < 0) {
    fail(path, "cannot select row " + std::to_string(row));
  }
  Id memory_space(H5Screate_simple(static_cast<int>(rank), count, nullptr), H5Sclose);
  if (!memory_space.valid()) fail(path, "cannot create a memory space");
  if (H5Dread(o.dataset_id.get(), o.memory_type.get(), memory_space.get(), file_space.get(),
              H5P_DEFAULT, out.data()) < 0) {
    fail(path, "cannot read row " + std::to_string(row) + " of '" + dataset +
                   "' (corrupt or truncated file)");
  }
}

std::vector<int64_t> read_labels(const std::string& file, const std::string& dataset,
                                 const std::string& path) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  Open& o = open_dataset(s, file, dataset, ~uint64_t{0}, path);
  if (o.info.row.ndim != 0 || o.info.row.dtype[1] == 'f') {
    fail(path, "labels dataset '" + dataset + "' must be a 1-D integer dataset");
  }
  std::vector<int64_t> labels(o.info.rows);
  if (!labels.empty() && H5Dread(o.dataset_id.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL,
                                 H5P_DEFAULT, labels.data()) < 0) {
    fail(path, "cannot read labels dataset '" + dataset + "'");
  }
  return labels;
}

void close_all() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  s.open.clear();
}

}  // namespace prestage::detail::hdf5
