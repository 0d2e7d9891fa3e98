// Catalog: the immutable, indexed list of samples 0..N-1 of a data set.
#pragma once

#include <climits>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "prestage/options.hpp"

namespace prestage {

// A catalog is cheap to copy (its contents are shared and never change). Each sample is a locator
// plus an integer label: a whole file, or a byte range of a file that holds many samples (TFRecord
// records, archive members, ...). Files are named by paths relative to the data set's root; a path
// can never name a file outside the root: absolute paths and ".." components are refused when the
// catalog is built or loaded. Stage 2 stages files; stage 3 reads samples.
//
// Symbolic links under the root are followed wherever they lead by default, as torchvision's
// ImageFolder does. Where others can plant links in the data set (a shared file system),
// Symlinks::kInside refuses a link that leads out of the root (an IoError, EXDEV, naming the path):
// from_folder while it walks the tree, from_list as it looks at each file. The policy is saved with
// the catalog, and a reader of its source files opens them under it (source_file, in
// tiers/stage_directory.hpp), checked on the file actually opened, so that a link changed after the
// build is refused too.
class Catalog {
 public:
  static constexpr uint64_t kWholeFile = ~uint64_t{0};
  struct Locator {
    uint64_t file = 0;    // index into the catalog's files
    uint64_t offset = 0;  // first byte of the sample in the file
    uint64_t length = kWholeFile;
  };

  enum class Symlinks : uint8_t {
    kFollow,  // a link is followed wherever it leads (the default, as torchvision)
    kInside,  // a link (or a chain of them) that leads out of the root is refused
  };

  // One class per sub-folder of `root`, as torchvision's ImageFolder: label = index of the class
  // folder in sorted order; files are taken in sorted order within each class. Only files whose
  // extension (case insensitive) is in `extensions` are taken; an empty list takes every regular
  // file. Links to folders are walked into; with Symlinks::kInside, a link (to a folder or a file)
  // that leads out of the root is an IoError (EXDEV) naming it.
  static Catalog from_folder(const std::filesystem::path& root,
                             const std::vector<std::string>& extensions = {".jpg", ".jpeg"},
                             Symlinks symlinks = Symlinks::kFollow);

  // A text file of `relative/path[,label]` lines (label defaults to -1); blank lines and lines
  // starting with '#' are ignored. With Symlinks::kInside, a listed file that leads out of the root
  // is an IoError (EXDEV) naming it; a missing one is left to the read (it may appear later).
  static Catalog from_list(const std::filesystem::path& list_file,
                           const std::filesystem::path& root,
                           Symlinks symlinks = Symlinks::kFollow);

  // Builds a catalog from explicit paths (relative to `root`) and labels (same length, or empty for
  // -1). Touches no file: `symlinks` is checked when the files are read.
  static Catalog from_paths(const std::filesystem::path& root,
                            const std::vector<std::string>& paths,
                            const std::vector<int64_t>& labels = {},
                            const std::vector<std::string>& classes = {},
                            Symlinks symlinks = Symlinks::kFollow);

  // Samples that are byte ranges of shared files: `files` relative to `root`, one locator per
  // sample.
  static Catalog from_ranges(const std::filesystem::path& root,
                             const std::vector<std::string>& files,
                             const std::vector<Locator>& locators,
                             const std::vector<int64_t>& labels = {},
                             const std::vector<std::string>& classes = {},
                             Symlinks symlinks = Symlinks::kFollow);

  // A set packed by `prestage pack`: the samples in the order of `dir`/index.tsv (one line per
  // sample: shard, offset, length, label, CRC-32C of the original file, original path; '#' lines
  // hold the class names and the format). Samples are byte ranges of the shards, staged a shard at
  // a time. The shards' sizes and times are recorded (a stat per shard). IoError if the index
  // cannot be read, ConfigError naming the line if it is malformed.
  static Catalog from_shards(const std::filesystem::path& dir);

  // What a sample's locator means: the codec that reads it is chosen from this and decode=.
  enum class Kind : uint8_t {
    kFiles,     // whole files or byte ranges of files (the constructors above)
    kTfrecord,  // framed TFRecord records (the locator's byte range); field() names the data
                // feature
    kHdf5,      // slices of an HDF5 dataset along axis(): locator.offset is the index along it;
                // field() names the dataset
    kArrays,    // slices of the array of a .npy file or of an .npz member along axis():
                // locator.offset is the index along it; field() names the member ("": the only one)
  };

  // Samples are the slices along `axis` of `dataset` in each of `files`, in order: with axis 0 (the
  // default) its rows, the usual layout (a file of one sample is a dataset of one row); a negative
  // axis counts from the last (-1). A sample has the dataset's shape without that axis. `labels`:
  // a 1-D integer dataset with one entry per sample of its file, or empty (-1). The root is the
  // files' common folder. Opens each file once (IoError, DecodeError naming the file; ConfigError
  // if a dataset has no such axis).
  static Catalog from_hdf5(const std::vector<std::filesystem::path>& files,
                           const std::string& dataset, const std::string& labels = "",
                           int64_t axis = 0);

  // Samples are the slices along `axis` of one array per file, in order: the array of each `.npy`
  // file, or member `member` of each `.npz` archive (np.savez or np.savez_compressed; empty: the
  // archive's only member). Axis 0 is the usual layout; some generators put the samples along the
  // last axis (-1). A sample has the array's shape without that axis, in C order whatever the
  // file's order. `labels`: a 1-D integer member of each archive with one entry per sample, or
  // empty (-1); a .npy file holds one array, so it cannot have labels (ConfigError). Reads each
  // file's headers (and labels) once (IoError, DecodeError naming the file; ConfigError if an array
  // has no such axis). Decode with DecodeMode::kNpy.
  //
  // Costs: along axis 0 of a C-order array a sample is one contiguous read; along another axis its
  // elements are strided, and it is read a run at a time, or the span it covers (up to 64 MiB) at
  // once. A deflated member is inflated whole for each sample (its size counts against
  // max_sample_bytes), so store many-sample files uncompressed. A slice of a stored member is read
  // without the member's CRC, which covers the whole member.
  static Catalog from_arrays(const std::vector<std::filesystem::path>& files, int64_t axis = 0,
                             const std::string& member = "", const std::string& labels = "");

  // Samples are the records of TFRecord `files` (tf.train.Example messages), in order. Reads every
  // record once to build the index (offsets and lengths, checking both CRCs of each record, and
  // that `data_feature` is there: a bytes_list, or for decode=raw a float_list or int64_list too);
  // `label_feature`, an int64 feature, gives the labels (else -1).
  // Save the catalog to build the index only once.
  //
  // A damaged record (a bad CRC, a truncated file, an Example that is malformed or lacks a
  // feature): with OnError::kRaise, a DecodeError naming the file and the byte. With
  // OnError::kSkip, the catalog keeps every good record and lists what it left out in damage(): a
  // record whose length's CRC holds but whose data is bad (or not a usable Example) is left out
  // alone and the scan goes on with the next; a bad length CRC or a truncated record loses the rest
  // of its file (no record after it can be located). An error reading a file (IoError) is raised
  // either way: it may be passing, and a catalog is saved and reused. Files are opened as given
  // (links followed): they are named one by one, and their root is only their common folder.
  static Catalog from_tfrecord(const std::vector<std::filesystem::path>& files,
                               const std::string& data_feature,
                               const std::string& label_feature = "",
                               OnError on_error = OnError::kRaise);

  // What a WebDataset sample lacking a field becomes (DALI's missing_component_behavior).
  enum class Missing : uint8_t {
    kError,  // damage: a DecodeError, or left out and listed in damage() with OnError::kSkip
    kSkip,   // left out, silently
    kEmpty,  // kept: a missing data member is a sample of 0 bytes, a missing label is -1
  };

  // Samples are the samples of WebDataset tar `shards`, in order: each shard is a path, a glob
  // (`*?[`, sorted) or a brace pattern (`train-{000000..000123}.tar`, `{a,b}`). One pass over each
  // shard's headers (ustar, GNU and pax) groups its regular members into samples: runs of adjacent
  // members whose names share a key (the name up to the first dot after the last '/'; the rest is
  // the extension, lower-cased); names without one, and `__*__` metadata, are passed over. A
  // sample is the byte range of its data member, the first of the `data` extensions (alternatives
  // separated by ';', as DALI's ext) that it has, read from the shard as it is: a shard is staged
  // whole. A shard compressed whole (gzip: `.tar.gz`, `.tgz`; zstd: `.tar.zst`; told by its first
  // bytes) is read twice, in one streaming pass of decompression each (its size and CRC, then its
  // headers), and its samples are byte ranges of its decompressed bytes (file_codec()); a stream
  // that is corrupt or truncated is damage of the whole shard (none of its samples is kept: its
  // own check failed), named as the damage below. `label`: the extension of a member holding
  // the label as decimal text ("cls"), or "json:KEY" for the integer at KEY of a JSON object in
  // its ".json" member, or "" (labels -1). A missing field is handled as `missing` says.
  //
  // Damage (a header with a bad checksum or bad fields, a pax record that is malformed or
  // disagrees with its header, a member running past the end of the shard, a key whose members are
  // not adjacent, an extension twice in one sample, a label that does not parse, a missing field
  // with Missing::kError): with OnError::kRaise, a DecodeError naming the shard, the member or key
  // and the byte. With OnError::kSkip, the catalog keeps every good sample and lists what it left
  // out in damage(): after a bad header the scan goes on at the next good one (the sample being
  // read is lost with it, as what follows a lying size); a truncated shard loses its end. An
  // IoError reading a shard is raised either way. Paths are opened as given (links followed);
  // the root is their common folder.
  //
  // `indexes`: empty (scan every shard), or one DALI index per shard (wds2idx's `.idx`, v1.1 or
  // v1.2), in the order of the shards as expanded: each shard's samples are taken from its index,
  // which is checked against the shard (members in order within it, each after a tar header of its
  // size, and name for v1.2) instead of scanning it; an index that does not describe its shard is a
  // ConfigError naming both.
  static Catalog from_webdataset(const std::vector<std::string>& shards,
                                 const std::string& data = "jpg;jpeg",
                                 const std::string& label = "cls",
                                 Missing missing = Missing::kError,
                                 OnError on_error = OnError::kRaise,
                                 const std::vector<std::filesystem::path>& indexes = {});

  // Samples are the samples of a MosaicML Streaming MDS set in folder `dir`, in the order of its
  // index.json (version 2): one read of each shard's offset table, and of each sample's column
  // sizes, locates column `data` of every sample as a byte range of its shard (read as it is: a
  // shard is staged whole): the JPEG of a `jpeg` column, the bytes of `bytes`/`png`/`str`, the
  // values of an `ndarray` column (decode raw), the pixels of a `pil` one (decode raw, uint8).
  // `label`: an integer column (int, int8..int64, uint8..uint64, str_int), or "" (labels -1).
  // A shard written with compression ("zstd", "gz": index.json's zip_data) is read from its
  // decompressed copy (raw_data) where that is beside it; else it is decompressed as
  // from_webdataset decompresses a `.tar.gz` (file_codec()), and any other compression is a
  // ConfigError naming it. ConfigError for an index that is not an MDS index or lacks a column
  // (naming those it has). Damage (a shard whose sample count disagrees with the index, offsets out
  // of order or past the end of the shard, column sizes that do not add up): with OnError::kRaise a
  // DecodeError naming the shard and the sample; with OnError::kSkip the catalog keeps every good
  // sample and lists the rest in damage(). IoError either way.
  static Catalog from_mds(const std::filesystem::path& dir, const std::string& data = "image",
                          const std::string& label = "label", OnError on_error = OnError::kRaise);

  // What from_tfrecord, from_webdataset, from_mds or from_located (with OnError::kSkip) found
  // damaged and left out of the catalog, in file and byte order; empty for any other catalog.
  // Saved with the catalog.
  struct Damage {
    uint64_t file = 0;          // index into the catalog's files
    uint64_t offset = 0;        // byte of the file where the damaged record (or tar member) starts
    bool rest_of_file = false;  // true: no record from `offset` to the file's end could be read
    std::string reason;
  };
  const std::vector<Damage>& damage() const noexcept;

  // Samples that a reader outside this library located as byte ranges of `files` (relative to
  // `root`): from_ranges, with what that reader found damaged and left out (`damage`, in file and
  // byte order) kept as from_webdataset keeps it, and each file's size and time recorded (a stat
  // per file, as from_folder). Catalog.from_hf in Python builds its catalogs so: pyarrow finds the
  // buffers of Arrow and Parquet files, and the loader reads the ranges.
  static Catalog from_located(const std::filesystem::path& root,
                              const std::vector<std::string>& files,
                              const std::vector<Locator>& locators,
                              const std::vector<int64_t>& labels,
                              const std::vector<std::string>& classes, std::vector<Damage> damage);

  Kind kind() const noexcept;
  // kTfrecord: the data feature; kHdf5: the dataset; kArrays: the .npz member; else "".
  const std::string& field() const noexcept;
  // kHdf5, kArrays: the axis the samples are taken along, as given (negative: from the last);
  // else 0.
  int64_t axis() const noexcept;
  // kHdf5, kArrays: the data set's dtype (NumPy's type string, "<f4"), the one most samples have
  // (ties: the one of the earliest sample), read with the headers the catalog reads anyway;
  // kTfrecord: that of the data feature as decode=raw reads it ("|u1" for a bytes_list, "<f4" a
  // float_list, "<i8" an int64_list). The loader holds every sample to it, without probing (kNpy
  // for arrays, kHdf5, kRaw for records). "": not known (other kinds, or a catalog saved before it
  // was recorded).
  const std::string& dtype() const noexcept;
  Symlinks symlinks() const noexcept;  // how source files are opened (see the class comment)

  // Saves to / loads from one binary file, so a job does not walk the file system at every start.
  void save(const std::filesystem::path& file) const;
  static Catalog load(const std::filesystem::path& file);

  size_t size() const noexcept;  // samples
  const std::filesystem::path& root() const noexcept;
  std::string_view path(size_t i) const;              // sample i's file, relative to root()
  std::filesystem::path source_path(size_t i) const;  // root() / path(i)
  int64_t label(size_t i) const;
  Locator locator(size_t i) const;

  size_t num_files() const noexcept;
  std::string_view file_path(size_t f) const;  // relative to root()
  std::filesystem::path file_source_path(size_t f) const;
  // The file's size when the catalog was built (from_folder and from_list record it), else
  // kUnknownSize. A bounded stage directory needs it to plan its space.
  static constexpr uint64_t kUnknownSize = ~uint64_t{0};
  uint64_t file_size(size_t f) const;
  // The file's modification time (ns since the epoch) when the catalog was built, else
  // kUnknownMtime.
  static constexpr int64_t kUnknownMtime = INT64_MIN;
  int64_t file_mtime(size_t f) const;
  const std::vector<std::string>& classes()
      const noexcept;  // class names (from_folder), else empty

  // How a file is stored at the source. A file compressed whole (from_webdataset's `.tar.gz` and
  // `.tar.zst` shards, from_mds's shards written with compression "zstd" or "gz") cannot be read
  // by byte range: its samples' locators are byte ranges of its decompressed bytes, file_size() is
  // their count, and it is read only from the decompressed copy stage 2 writes to the stage
  // directory (a loader without one refuses such a catalog). The codec is told by the file's
  // first bytes, not its name.
  enum class Codec : uint8_t { kNone = 0, kGzip = 1, kZstd = 2 };
  Codec file_codec(size_t f) const;
  // A compressed file: its bytes at the source when the catalog was built, and the CRC-32C of its
  // decompressed bytes (what its staged copy must hold). Any other file: file_size() and 0.
  uint64_t file_stored_size(size_t f) const;
  uint32_t file_crc(size_t f) const;
  bool has_compressed_files() const noexcept;

  // A 64-bit digest of the root and every path (and of Symlinks::kInside, so that a confined
  // catalog never shares copies made by a catalog that followed links out of the root): names the
  // catalog's area of a shared stage directory.
  uint64_t fingerprint() const noexcept;

  struct Data;

 private:
  explicit Catalog(std::shared_ptr<const Data> data);
  std::shared_ptr<const Data> data_;
};

}  // namespace prestage
