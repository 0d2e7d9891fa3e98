#include "formats/hdf5.hpp"

#include <hdf5.h>

#include <algorithm>
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
  std::string dtype;  // NumPy type string of an element, little-endian
  size_t item_size = 0;
  uint32_t rank = 0;
  hsize_t dims[kMaxDims + 1] = {};
  uint64_t bytes = 0;  // all of the dataset, decoded
  bool chunked = false;
  hsize_t chunk[kMaxDims + 1] = {};  // chunked: the chunk shape
  uint64_t chunk_bytes = 0;          // chunked: a whole chunk, decoded
  bool filtered = false;             // chunked: stored chunks are compressed (sizes vary)
  uint64_t file_bytes = 0;           // chunked: the file's size when opened
};

// The one lock and the cache of open datasets, most recently used first.
//
// HDF5 shuts itself down at exit (H5_term_library, which H5open registers with atexit), closing
// what is still open and forgetting every identifier. The cache must close its identifiers before
// that: closed after it, each close fails and HDF5 prints its error stack ("H5Dclose(): not a
// dataset ID") to stderr. The constructor calls H5open first, so HDF5's handler is registered
// before this object's destructor is (when construction completes), and exit runs the destructor
// first.
struct State {
  State() { static_cast<void>(H5open()); }
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

// HDF5 allocates a whole chunk's buffer before it reads (and inflates) the chunk: a corrupt chunk
// shape, size or address could make it ask for gigabytes. A chunk's decoded size must stay under
// kMaxChunkBytes (checked at open) and every chunk a row touches must lie inside the file (checked
// before each read: a lookup per chunk, one for the usual chunking of one or more whole rows).
constexpr uint64_t kMaxChunkBytes = uint64_t{1} << 30;

// The size of the open file (the one HDF5 opened, whatever its name leads to now).
uint64_t file_bytes(const Open& o, const std::string& path) {
  hsize_t size = 0;
  if (H5Fget_filesize(o.file_id.get(), &size) < 0) fail(path, "cannot read the file's size");
  return size;
}

// Checks one stored chunk (address HADDR_UNDEF: not stored) against the file and the chunk shape.
void check_chunk(const Open& o, haddr_t address, hsize_t stored, const std::string& path) {
  if (address == HADDR_UNDEF) return;
  if (address > o.file_bytes || stored > o.file_bytes - address) {
    fail(path, "a chunk of '" + o.dataset + "' lies outside the file (corrupt chunk index)");
  }
  // HDF5 1.10 copies an unfiltered chunk out of a buffer of its stored size, trusting the chunk
  // shape: a shorter chunk would be read past its end.
  if (!o.filtered && stored != o.chunk_bytes) {
    fail(path, "a chunk of '" + o.dataset + "' stores " + std::to_string(stored) + " bytes, not " +
                   std::to_string(o.chunk_bytes) + " (corrupt)");
  }
}

void read_layout(Open& o, const std::string& dataset, const std::string& path) {
  Id plist(H5Dget_create_plist(o.dataset_id.get()), H5Pclose);
  if (!plist.valid()) fail(path, "cannot read the storage layout of '" + dataset + "'");
  const H5D_layout_t layout = H5Pget_layout(plist.get());
  if (layout == H5D_COMPACT) {
    // HDF5 1.10 copies a compact dataset out of the buffer it read from the header, trusting the
    // dataspace: data shorter than rows x row bytes would be read past its end.
    if (o.bytes > H5Dget_storage_size(o.dataset_id.get())) {
      fail(path, "dataset '" + dataset + "' stores fewer bytes than its shape needs (corrupt)");
    }
    return;
  }
  if (layout != H5D_CHUNKED) return;
  const int rank = H5Pget_chunk(plist.get(), static_cast<int>(kMaxDims + 1), o.chunk);
  if (rank != static_cast<int>(o.rank)) {
    fail(path, "cannot read the chunk shape of '" + dataset + "'");
  }
  uint64_t chunk_bytes = std::max<uint64_t>(o.item_size, 1);
  for (int d = 0; d < rank; ++d) {
    if (o.chunk[d] == 0 || chunk_bytes > kMaxChunkBytes / o.chunk[d]) {
      fail(path, "dataset '" + dataset + "' has chunks over 1 GiB");
    }
    chunk_bytes *= o.chunk[d];
  }
  o.chunk_bytes = chunk_bytes;
  const int filters = H5Pget_nfilters(plist.get());
  if (filters < 0) fail(path, "cannot read the filters of '" + dataset + "'");
  o.filtered = filters > 0;
  o.file_bytes = file_bytes(o, path);
  // The chunks' stored sizes add up to this: more than the file holds is a corrupt chunk index.
  if (H5Dget_storage_size(o.dataset_id.get()) > o.file_bytes) {
    fail(path, "dataset '" + dataset + "' claims more stored bytes than the file holds (corrupt)");
  }
  o.chunked = true;
  // A small index is checked whole, entry by entry (HDF5 1.10 finds an entry by its position in
  // linear time, so a large index is left to the per-row checks).
  constexpr hsize_t kCheckedChunks = 4096;
  Id space(H5Dget_space(o.dataset_id.get()), H5Sclose);
  hsize_t chunks = 0;
  if (!space.valid() || H5Dget_num_chunks(o.dataset_id.get(), space.get(), &chunks) < 0) {
    fail(path, "cannot read the chunk index of '" + dataset + "'");
  }
  if (chunks > kCheckedChunks) return;
  for (hsize_t i = 0; i < chunks; ++i) {
    hsize_t offset[kMaxDims + 1] = {};
    unsigned filter_mask = 0;
    haddr_t address = HADDR_UNDEF;
    hsize_t stored = 0;
    if (H5Dget_chunk_info(o.dataset_id.get(), space.get(), i, offset, &filter_mask, &address,
                          &stored) < 0) {
      fail(path, "cannot read the chunk index of '" + dataset + "'");
    }
    for (int d = 0; d < rank; ++d) {
      const hsize_t extent = o.dims[d];
      if (offset[d] % o.chunk[d] != 0 || offset[d] >= std::max<hsize_t>(extent, 1)) {
        fail(path, "dataset '" + dataset + "' has a corrupt chunk index");
      }
    }
    check_chunk(o, address, stored, path);
  }
}

// Checks that every stored chunk that slice `row` along `axis` touches lies inside the file.
void check_row_chunks(const Open& o, uint32_t axis, uint64_t row, const std::string& path) {
  if (!o.chunked) return;
  hsize_t coord[kMaxDims + 1] = {};
  coord[axis] = row / o.chunk[axis] * o.chunk[axis];
  while (true) {
    unsigned filter_mask = 0;
    haddr_t address = HADDR_UNDEF;
    hsize_t stored = 0;
    if (H5Dget_chunk_info_by_coord(o.dataset_id.get(), coord, &filter_mask, &address, &stored) <
        0) {
      fail(path, "cannot look up a chunk of '" + o.dataset + "' (corrupt chunk index)");
    }
    check_chunk(o, address, stored, path);
    // Next chunk along the slice's axes (odometer, last axis fastest).
    uint32_t d = o.rank;
    while (d-- > 0) {
      if (d == axis) continue;
      coord[d] += o.chunk[d];
      if (coord[d] < o.dims[d]) break;
      coord[d] = 0;
    }
    if (d == UINT32_MAX) return;
  }
}

// Opens (or finds) `dataset` of `file`. Called with the lock held.
void quiet(State& s) {
  if (!s.quiet) {
    // HDF5 prints its error stack to stderr by default; errors reach the caller as DecodeErrors.
    static_cast<void>(H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr));
    s.quiet = true;
  }
}

// Opens `dataset` of the open file o.file_id and describes it.
void open_in_file(Open& o, const std::string& dataset, const std::string& path);

Open& open_dataset(State& s, const FileRef& file, const std::string& dataset,
                   const std::string& path) {
  for (auto it = s.open.begin(); it != s.open.end(); ++it) {
    if (it->file == file.path() && it->dataset == dataset) {
      s.open.splice(s.open.begin(), s.open, it);
      return s.open.front();
    }
  }
  quiet(s);
  Open o;
  o.file = file.path();
  o.dataset = dataset;
  with_file_name(file, [&](const std::string& name) {
    if (H5Fis_hdf5(name.c_str()) <= 0) fail(path, "not an HDF5 file (or unreadable)");
    o.file_id = Id(H5Fopen(name.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  });
  if (!o.file_id.valid()) fail(path, "cannot open the file");
  open_in_file(o, dataset, path);
  if (s.open.size() >= kMaxOpen) s.open.pop_back();
  s.open.push_front(std::move(o));
  return s.open.front();
}

// `dataset` of the HDF5 file whose bytes are `image` (a copy the tiers hold in memory), opened
// through HDF5's core driver, which copies the image. Not cached: the image is the caller's, for
// one call; each use costs a copy of the file, which is why only files within max_sample_bytes are
// served so (a DecodeRead, Tiers::open).
Open open_image(State& s, std::span<const std::byte> image, const std::string& dataset,
                const std::string& path) {
  quiet(s);
  Open o;
  o.dataset = dataset;
  Id fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  if (!fapl.valid() || H5Pset_fapl_core(fapl.get(), 1 << 20, 0) < 0 ||
      H5Pset_file_image(fapl.get(), const_cast<std::byte*>(image.data()), image.size()) < 0) {
    fail(path, "cannot open the file's bytes in memory");
  }
  // A name of its own: never taken for a file of the same path that HDF5 holds open from disk.
  const std::string name = path + "#in-memory";
  o.file_id = Id(H5Fopen(name.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose);
  if (!o.file_id.valid()) fail(path, "not an HDF5 file (or corrupt)");
  open_in_file(o, dataset, path);
  return o;
}

void open_in_file(Open& o, const std::string& dataset, const std::string& path) {
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
  if (static_cast<size_t>(rank) > kMaxDims)
    fail(path, "dataset '" + dataset + "' has too many dimensions");
  hsize_t dims[kMaxDims + 1];
  if (H5Sget_simple_extent_dims(space.get(), dims, nullptr) != rank) {
    fail(path, "cannot read the shape of '" + dataset + "'");
  }
  o.dtype = std::string(size == 1 ? "|" : "<") + kind + std::to_string(size);
  o.rank = static_cast<uint32_t>(rank);
  o.item_size = size;
  ArrayInfo all;  // the whole dataset: checks that its size is a number of bytes
  all.dtype = o.dtype;
  all.ndim = o.rank;
  for (int d = 0; d < rank; ++d) o.dims[d] = all.shape[static_cast<size_t>(d)] = dims[d];
  finish_array_info(all, ~uint64_t{0}, path);
  o.bytes = all.bytes;
  read_layout(o, dataset, path);
}

// The dataset sliced along `axis`. Each slice becomes a catalog entry (and a label): a corrupt
// header claiming far more slices than the file stores is refused before anything is allocated
// for them. Compression can shrink data, but not a thousandfold.
Hdf5Dataset along(const Open& o, int64_t axis, uint64_t max_bytes, const std::string& path) {
  const auto resolved = resolve_axis(axis, o.rank);
  if (!resolved) {
    fail(path, "dataset '" + o.dataset + "' has " + std::to_string(o.rank) +
                   " dimensions: no axis " + std::to_string(axis));
  }
  Hdf5Dataset d;
  d.axis = *resolved;
  d.rows = o.dims[d.axis];
  d.row.dtype = o.dtype;
  for (uint32_t k = 0; k < o.rank; ++k) {
    if (k != d.axis) d.row.shape[d.row.ndim++] = o.dims[k];
  }
  finish_array_info(d.row, max_bytes, path);
  // The stored size comes from the file's own (possibly corrupt) header: no more than the file
  // holds.
  const uint64_t stored =
      std::min<uint64_t>(H5Dget_storage_size(o.dataset_id.get()), file_bytes(o, path));
  const uint64_t row_bytes = std::max<uint64_t>(d.row.bytes, 1);
  constexpr uint64_t kMaxRatio = 1024;
  if (d.rows > (stored * kMaxRatio + (uint64_t{1} << 20)) / row_bytes) {
    fail(path, "dataset '" + o.dataset + "' claims " + std::to_string(d.rows) + " slices of " +
                   std::to_string(row_bytes) + " bytes but stores " + std::to_string(stored) +
                   " bytes");
  }
  return d;
}

}  // namespace

Hdf5Dataset describe(const FileRef& file, const std::string& dataset, int64_t axis,
                     uint64_t max_bytes, const std::string& path) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  return along(open_dataset(s, file, dataset, path), axis, max_bytes, path);
}

namespace {

void read_row_of(Open& o, const std::string& dataset, int64_t axis, uint64_t row,
                 const ArrayInfo& info, std::span<std::byte> out, const std::string& path) {
  if (out.size() != info.bytes) throw std::logic_error("hdf5::read_row: output of the wrong size");
  const Hdf5Dataset d = along(o, axis, ~uint64_t{0}, path);
  if (!d.row.same_layout(info)) {
    fail(path, "dataset '" + dataset + "' changed type or shape since the catalog was built");
  }
  if (row >= d.rows) {
    fail(path, "slice " + std::to_string(row) + " is past the " + std::to_string(d.rows) +
                   " along axis " + std::to_string(d.axis) + " of '" + dataset + "'");
  }
  check_row_chunks(o, d.axis, row, path);
  Id file_space(H5Dget_space(o.dataset_id.get()), H5Sclose);
  if (!file_space.valid()) fail(path, "cannot read the shape of '" + dataset + "'");
  const uint32_t rank = o.rank;
  hsize_t start[kMaxDims + 1] = {};
  hsize_t count[kMaxDims + 1];
  for (uint32_t k = 0; k < rank; ++k) count[k] = o.dims[k];
  start[d.axis] = row;
  count[d.axis] = 1;
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

}  // namespace

void read_row(const FileRef& file, const std::string& dataset, int64_t axis, uint64_t row,
              const ArrayInfo& info, std::span<std::byte> out, const std::string& path) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  read_row_of(open_dataset(s, file, dataset, path), dataset, axis, row, info, out, path);
}

Hdf5Dataset describe(std::span<const std::byte> image, const std::string& dataset, int64_t axis,
                     uint64_t max_bytes, const std::string& path) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  return along(open_image(s, image, dataset, path), axis, max_bytes, path);
}

void read_row(std::span<const std::byte> image, const std::string& dataset, int64_t axis,
              uint64_t row, const ArrayInfo& info, std::span<std::byte> out,
              const std::string& path) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  Open o = open_image(s, image, dataset, path);
  read_row_of(o, dataset, axis, row, info, out, path);
}

std::vector<int64_t> read_labels(const FileRef& file, const std::string& dataset,
                                 const std::string& path) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  Open& o = open_dataset(s, file, dataset, path);
  if (o.rank != 1 || o.dtype[1] == 'f') {
    fail(path, "labels dataset '" + dataset + "' must be a 1-D integer dataset");
  }
  const Hdf5Dataset d = along(o, 0, ~uint64_t{0}, path);
  if (o.chunked) {
    for (uint64_t row = 0; row < d.rows; row += o.chunk[0]) check_row_chunks(o, 0, row, path);
  }
  std::vector<int64_t> labels(d.rows);
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
