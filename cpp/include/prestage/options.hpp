// LoaderOptions: everything a Loader is configured with. Names follow Serizawa & Tatebe (BDCAT'19)
// where they have one: prefetchers (stage 2 threads), readers (stage 3 threads), lookahead, depth.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "prestage/plan.hpp"

namespace prestage {

// How stage 3 turns a sample's bytes into its part of the batch. The sample's bytes are what its
// catalog names: a file, a byte range, a TFRecord record's data feature, an HDF5 row. A sample that
// is a zstd frame is decompressed first (every mode but kRaw).
enum class DecodeMode {
  kJpeg,  // JPEG -> RGB images (see Transform, Layout, OutputType)
  kRaw,   // the sample's bytes as they are (ragged: one buffer plus offsets); typed: raw_dtype
  kNpy,   // a .npy array: any dtype and shape, C or Fortran order
  kNpz,   // one array of a .npz archive (stored or deflated members): LoaderOptions::array_name
  kHdf5,  // a row along axis 0 of an HDF5 dataset (catalogs from Catalog::from_hdf5 only)
  // No decoding and no read: stages 1 and 2 only. Each batch says where each sample's bytes are
  // now, one byte per sample (Batch::data()): kLocatedStaged, in the stage directory (its copy,
  // StageDirectory's path), or kLocatedSource, at the source (not staged in time: a miss). For
  // users who decode the samples themselves (prestage.torch.StagedSampler).
  kLocate,
  // Images of any supported format (JPEG, PNG or WebP, told apart by their bytes' signatures, never
  // by file names) -> RGB images, as kJpeg. kJpeg refuses PNG and WebP files.
  kImage,
};
// kJpeg or kImage: the samples are images, decoded to RGB (Transform, Layout and OutputType apply).
inline constexpr bool decodes_images(DecodeMode mode) {
  return mode == DecodeMode::kJpeg || mode == DecodeMode::kImage;
}
inline constexpr uint8_t kLocatedStaged = 1;  // the numbers of the tiers: see tiers/tiers.hpp
inline constexpr uint8_t kLocatedSource = 3;

// kJpeg with an image_size: how each image is brought to it.
enum class Transform {
  kCenterCrop,  // resize the shorter side to cover, crop the centre (torchvision's eval path)
  kRandomResizedCrop,  // torchvision's RandomResizedCrop + RandomHorizontalFlip(0.5), seeded
};

enum class Layout { kNHWC, kNCHW };

// kJpeg: the element type of the images. kFloat32 is (pixel / 255 - mean[c]) / std[c].
enum class OutputType { kUint8, kFloat32 };

// Which staged file a full stage directory gives up.
enum class Eviction {
  kClairvoyant,  // the one whose next use in the plan is farthest away (Belady): optimal
  kLru,          // the least recently used one
};

// What stage 3 does with a sample that cannot be read or decoded (IoError, DecodeError, a timed-out
// read included).
enum class OnError {
  kRaise,  // the consumer gets the sample's error (naming its path) at that sample's batch
  // The sample is replaced, in its place in the batch, by the next sample of this rank's epoch that
  // reads and decodes: the samples that follow it in the order the rank's batches run through the
  // epoch (batch by batch, position by position), wrapping around to the epoch's first. At most
  // kSkipCandidates are tried; if none is good the batch raises the sample's error. The choice
  // depends only on the plan and the data, never on thread timing. Batch::indices() and labels()
  // name the replacement; Stats::skipped counts the replaced samples.
  kSkip,
};

// on_error=skip: the most samples tried in place of a failed one before its error is raised.
inline constexpr uint64_t kSkipCandidates = 32;

// Where kJpeg images with an image_size are decoded.
enum class DecodeDevice {
  kCpu,  // stage 3's readers, libjpeg-turbo (the default)
  // nvJPEG (the hardware engines where there are), cropped, resized and flipped by NPP with the
  // CPU path's boxes, beside the CPU decoders (gpu_cpu_share); the batch is born on the CUDA device
  // current on the thread that makes the Loader (Batch::device_data()). NHWC uint8 only.
  // libcudart, libnvjpeg and libnppig are opened at run time (PRESTAGE_CUDART, PRESTAGE_NVJPEG,
  // PRESTAGE_NPP name them): a machine without them, or without a device, gets a ConfigError from
  // the Loader's constructor naming what is missing.
  kCuda,
};

// decode_device=kCuda, images on nvJPEG's hardware engine: where the crop box is applied.
enum class GpuCrop {
  // The first batches are timed each way (the GPU's time per image, kResize and kRoi in turn) and
  // the faster is kept (Stats::gpu_decode.crop says which and why). Without a hardware engine, or
  // without nvJPEG's per-image parameters (nvjpegDecodeBatchedEx), kResize without trials.
  kAuto,
  kResize,  // nvJPEG decodes the whole image; NPP's resize reads the box out of it
  kRoi,     // nvJPEG decodes only the box (a region per image); NPP resizes all of it. Images
            // the engine cannot take with their region go to the CUDA backend, as kResize.
};

// With the peer tier on: what a read of a sample whose home copy another node holds goes for.
enum class PfsReads {
  // The job's time: that copy or the source, whichever the tier expects to finish the read first
  // (links learned by probes); with a PFS faster than the links a file is read there again.
  kFastest,
  // The PFS's load: that copy whenever a node holds it (waiting for the link rather than reading
  // the source; no probe), and the nodes' stage directories keep their home copies ahead of other
  // files: a file is read from the PFS once per job where the nodes' caches hold it.
  kFewest,
};

struct ImageSize {
  uint32_t height = 0;
  uint32_t width = 0;
  bool empty() const noexcept { return height == 0 && width == 0; }
  friend bool operator==(const ImageSize&, const ImageSize&) = default;
};

// LoaderOptions is made of one part per concern, each read by the units of that concern and
// checked by its own validate(). Each part is a public base of LoaderOptions, so every option is
// spelt options.batch_size, options.stage_dir, ... as one flat struct. Designated initialisers
// (LoaderOptions{.batch_size = 8}) do not work across the bases: set the fields by name instead.

// Stage 1, the plan: which samples each batch of this rank holds, in which order.
struct LoaderPlanOptions {
  uint64_t batch_size = 32;  // samples per batch on this rank
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;
  uint64_t rank = 0;
  uint64_t world_size = 1;
  // Resume from a global position taken on any world_size and batch_size (plan.hpp, Resume): epoch
  // resume.epoch runs only the samples of its global order that resume.consumed does not hold,
  // split over these ranks (batches_in_epoch()); the next epochs are whole. Empty: no resume.
  Resume resume;

  // Throws ConfigError naming the first invalid option of this part.
  void validate() const;
  friend bool operator==(const LoaderPlanOptions&, const LoaderPlanOptions&) = default;
};

// Stage 2: the node-local stage directory and how long stage 3 waits for its copies.
struct LoaderStagingOptions {
  // Node-local directory that stage 2 copies the samples to. Empty: stage 3 reads the source
  // directly. It may be shared with other users (/tmp, mode 1777): the area of this data set in it
  // (prestage-<fingerprint>) and everything in it are made for the job's user alone (directories
  // 0700, files 0600, whatever the umask). An area there that another user owns or that others can
  // write, or a symbolic link in it, is refused at construction (IoError, EPERM; ELOOP for a link):
  // the loader never falls back to reading the source from it.
  std::string stage_dir;
  // A group whose members' jobs share the node's copies too (rare): the area and its folders are
  // made 02770 and its files 0660, of that group, and an area of that group made by any of its
  // members is used. Every member of the group is then trusted with the copies as the job's user
  // is. Empty: the job's user alone. A group this process is not a member of is a ConfigError.
  std::string stage_group;
  // The most bytes the stage directory may hold, files being written included; 0: no bound. A file
  // the bound keeps out (it would displace files needed sooner) is read into memory by stage 2
  // instead (JPEG and raw files, up to 64 MiB per batch: Stats::read_ahead).
  // kFitFreeSpace: no bound if the data set fits in 90% of the room the stage directory has at
  // start (its file system's free space plus what the directory takes already), else that 90%
  // (Stats::cache_bytes says which), counted as the disk counts it: each copy in whole blocks of
  // the file system, copies being written, and the directory's own files (index.log, node.table),
  // so that a node-local disk is never filled up. A bound given counts the copies' bytes.
  // Processes sharing one stage directory (the ranks of a node) share the bound: it holds for the
  // bytes of all their copies, so give each the node's bound (they all get about the same default).
  static constexpr uint64_t kFitFreeSpace = UINT64_MAX;
  uint64_t cache_bytes = kFitFreeSpace;
  Eviction eviction = Eviction::kClairvoyant;

  // How long the consumer's next batch may wait for stage 2 to finish its copies before stage 3
  // takes it and reads the files no copy has started straight from the source (counted as misses
  // and in Stats::stage_expedited): stage 3 never waits for more than the copies under way.
  // kWaitForStaging: it always waits for stage 2 (what is staged then follows the plan exactly).
  // Stage 3 waits for stage 2 whatever this says (Stats::stage_patience_s none; the option stays as
  // given) with the peer tier on (a home copy is waited for, so that the source is read once), and
  // with a stage directory where the catalog's files hold several samples each (shards, array or
  // HDF5 files: each is copied whole for its other samples in any case, and a sample read from
  // the source meanwhile would open and read its file twice).
  static constexpr uint64_t kWaitForStaging = UINT64_MAX;
  uint64_t stage_patience_ms = 50;

  // Throws ConfigError naming the first invalid option of this part.
  void validate() const;
  friend bool operator==(const LoaderStagingOptions&, const LoaderStagingOptions&) = default;
};

// Stage 3: what a sample's bytes are decoded to, and what is done with one that fails.
struct LoaderDecodeOptions {
  // Output size. Empty: no resize, each image keeps its own size (a batch of mixed sizes is ragged,
  // see Batch::ragged). Otherwise the shorter side is resized to cover it, then the centre is
  // cropped (torchvision Resize + CenterCrop).
  ImageSize image_size{};
  DecodeMode decode = DecodeMode::kJpeg;
  // A sample that cannot be read or decoded: raise its error at its batch, or skip it (OnError).
  OnError on_error = OnError::kRaise;

  // Images with more pixels than this are refused before any large allocation (decompression
  // bombs).
  uint64_t max_pixels = 89'478'485;  // PIL's default MAX_IMAGE_PIXELS

  // kJpeg with an image_size. Random crops are drawn from (seed, epoch, sample index): a rerun
  // gives the same pixels whatever the thread counts.
  Transform transform = Transform::kCenterCrop;
  Layout layout = Layout::kNHWC;
  OutputType dtype = OutputType::kUint8;
  // kFloat32 only (validate() refuses other values with kUint8): per channel (R, G, B), on the 0..1
  // scale (torchvision's ToTensor + Normalize).
  float mean[3] = {0.0f, 0.0f, 0.0f};
  float stddev[3] = {1.0f, 1.0f, 1.0f};

  // kJpeg with an image_size: where images are decoded (DecodeDevice).
  DecodeDevice decode_device = DecodeDevice::kCpu;
  // decode_device=kCuda: the fraction of each batch decoded by the CPU path (its last
  // round(share x size) samples, on the readers) while the GPU decodes the rest; the CPU's pixels
  // are copied into the device batch. kAutoShare: sized at run time so that both parts of a batch
  // finish together, from their measured times (decode/gpu_share.hpp; between 1 and size - 1
  // samples); it follows the self-tuning's reader steps. A value in [0, 1) given is kept as it is.
  // Stats::gpu_decode says which share is in use and why.
  static constexpr double kAutoShare = -1.0;
  double gpu_cpu_share = kAutoShare;
  // decode_device=kCuda: where the crop box is applied on the hardware engine (GpuCrop).
  GpuCrop gpu_crop = GpuCrop::kAuto;

  // kNpz: the member to take from each archive, without ".npy"; empty: the archive's only array.
  std::string array_name;
  // kNpy, kNpz, kHdf5: a sample whose header claims more bytes than this is refused before any
  // allocation (decompression bombs, lying headers).
  uint64_t max_sample_bytes = uint64_t{4} << 30;

  // kRaw: each sample (a file, a byte range, a TFRecord feature) as an array of this NumPy type
  // string ("|u1", "<f4", ">i2", ...: the batch's dtype, bytes kept in their stored order) instead
  // of its bytes. Its size must be a whole number of items and fit raw_shape, else a DecodeError
  // naming the sample. Empty: the bytes as they are (a TFRecord float_list or int64_list feature:
  // its values as "<f4" or "<i8"; a raw_dtype given for one must be that type).
  std::string raw_dtype;
  // kRaw with a raw_dtype: each sample's shape; one dimension may be -1, inferred from the sample's
  // size (NumPy's reshape). None: 1-D, as many items as the sample holds.
  std::optional<std::vector<int64_t>> raw_shape;

  // Throws ConfigError naming the first invalid option of this part.
  void validate() const;
  friend bool operator==(const LoaderDecodeOptions&, const LoaderDecodeOptions&) = default;
};

// The threads and buffers of the pipeline: sized to the machine where left at kAuto, and tuned
// online (autotune).
struct LoaderTuningOptions {
  // kAuto: sized to the machine when the loader is made, from the CPUs this process may use (its
  // affinity and cgroup quota) shared among the ranks of its node (the launcher's environment);
  // Stats::threads_why says what was chosen and why, and Loader::options() gives the values.
  static constexpr uint64_t kAuto = 0;
  uint64_t prefetchers = kAuto;  // stage 2 threads (I/O bound: more than cores is normal)
  uint64_t readers = kAuto;      // stage 3 threads (CPU bound: about the cores you can spare)
  uint64_t lookahead = kAuto;    // batches that stage 2 may work on ahead of stage 3
  // Online self-tuning: while the job runs, the loader adjusts the values left at kAuto (readers:
  // the samples decoded at once, up to this rank's share of the CPUs; prefetchers: the reads in
  // flight, up to 128; lookahead, up to 32, but not with a stage directory bounded below the data
  // set, whose eviction window is fixed) from what it measures, within memory_budget. A value
  // given is kept as it is. false: the values sized to the machine stay fixed. Stats::tuning says
  // what it did; pipeline/tuner.hpp how.
  bool autotune = true;
  // Bytes the self-tuning may spend on stage 2's reads in flight and read-ahead (lookahead x up to
  // 64 MiB per batch); 0: a quarter of the memory this process may use (the cgroup's limit, else
  // the machine's) shared by the node's ranks.
  uint64_t memory_budget = 0;
  // Batch buffers in the ring: batches decoded ahead plus those the caller holds. At least 2: a
  // loop holds one batch while it asks for the next, so with 1 the second next() would find every
  // buffer lent and throw (Loader::next); at most 4096.
  uint64_t depth = 4;

  // Throws ConfigError naming the first invalid option of this part.
  void validate() const;
  friend bool operator==(const LoaderTuningOptions&, const LoaderTuningOptions&) = default;
};

// The peer tier: a node's copies served to the other nodes over MPI.
struct LoaderPeerOptions {
  // The peer tier (beyond one node; needs a stage_dir and the MPI plugin, libprestage_mpi.so): a
  // sample that is not on this node is fetched over MPI from the stage directory of the node that
  // owns its home copy instead of being read again from the source. Ownership is computed from the
  // plan (see the README, "Beyond one node"); ranks with the same PRESTAGE_NODE environment value
  // form one node (tests), else those that share memory. When the MPI world does not match
  // world_size, or the plugin is missing, the tier is off and Stats::peer_tier_why says why.
  // Starting it is collective: every rank creates its loader together.
  bool peers = false;
  // How long a fetch waits for its peer's answer before it reads the source instead.
  uint64_t peer_timeout_ms = 1000;
  // The job's time (kFastest, a job never slower for the tier) or the PFS's load (kFewest): see
  // PfsReads and the README, "Beyond one node".
  PfsReads pfs_reads = PfsReads::kFastest;
  // The communicator whose ranks are the loader's ranks: the address of an MPI_Comm (C++; it must
  // live until the loader starts), else a Fortran handle (mpi4py: comm.py2f()), else
  // MPI_COMM_WORLD.
  const void* peer_comm = nullptr;
  int64_t peer_comm_fortran = -1;

  // Throws ConfigError naming the first invalid option of this part.
  void validate() const;
  friend bool operator==(const LoaderPeerOptions&, const LoaderPeerOptions&) = default;
};

// Every read of a sample's or a file's bytes, whichever stage makes it.
struct LoaderIoOptions {
  // A read of the source (or of the stage directory) that takes longer than this fails (an IoError,
  // ETIMEDOUT, at its sample's batch) instead of hanging on a stalled file system; 0: no limit.
  // Each loader has its own limit, on the threads that read for it.
  uint64_t io_timeout_ms = 0;
  // A file to write the I/O trace to: one record per read of a sample's or a file's bytes (sample,
  // tier, file, offset, size, start, end, thread), for `prestage trace FILE`. Empty: no trace.
  std::string trace;

  // Throws ConfigError naming the first invalid option of this part.
  void validate() const;
  friend bool operator==(const LoaderIoOptions&, const LoaderIoOptions&) = default;
};

struct LoaderOptions : LoaderPlanOptions,
                       LoaderStagingOptions,
                       LoaderDecodeOptions,
                       LoaderTuningOptions,
                       LoaderPeerOptions,
                       LoaderIoOptions {
  // Throws ConfigError naming the first invalid option. The one place where options are checked:
  // each part's validate(), then the rules that span parts. The Python package converts its
  // arguments to these fields and leaves every rule to this.
  void validate() const;
  friend bool operator==(const LoaderOptions&, const LoaderOptions&) = default;
};

}  // namespace prestage
