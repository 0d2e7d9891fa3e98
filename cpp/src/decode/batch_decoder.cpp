#include "decode/batch_decoder.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <optional>
#include <string>

#include "decode/batch_run.hpp"
#include "decode/gpu_batches.hpp"
#include "decode/skip_policy.hpp"
#include "prestage/error.hpp"
#include "util/file_io.hpp"

namespace prestage::detail {

namespace {

void trim_each(std::vector<std::vector<std::byte>>& buffers) noexcept {
  for (std::vector<std::byte>& b : buffers) {
    if (b.capacity() > 2 * b.size()) std::vector<std::byte>().swap(b);
  }
}

size_t capacity_of(const std::vector<std::vector<std::byte>>& buffers) noexcept {
  size_t total = 0;
  for (const std::vector<std::byte>& b : buffers) total += b.capacity();
  return total;
}

}  // namespace

void BatchScratch::trim() noexcept {
  gpu_errors.clear();
  share_errors.clear();
  trim_each(bytes);
  trim_each(unpacked);
}

size_t BatchScratch::held_bytes() const noexcept {
  return capacity_of(bytes) + capacity_of(unpacked);
}

// The CPU backend's run of one batch: the three steps, each sample's size and fill by codec, and
// replacement (the GPU backend's is GpuRun, gpu_batches.cpp).
class BatchDecoder::Run : public BatchRun {
 public:
  using BatchRun::BatchRun;

  void operator()() {
    s_.tiers.assign(b_.count, Tier::kMemory);
    s_.probes.resize(b_.count);
    if (keeps_bytes() || d_.codec_.arrays()) {
      // Only grown: the buffers keep their capacity for the next batches.
      if (s_.bytes.size() < b_.count) s_.bytes.resize(b_.count);
      if (keeps_bytes() && s_.unpacked.size() < b_.count) s_.unpacked.resize(b_.count);
      s_.kept.assign(b_.count, std::nullopt);
    }
    each([&](size_t i) { size(i, b_.ids[i]); }, [&](size_t i, uint64_t id) { size(i, id); });
    if ((slot_.error = first_error_.get())) return;
    if (!lay_out()) return;
    each([&](size_t i) { fill(i, static_cast<uint64_t>(slot_.indices[i])); },
         [&](size_t i, uint64_t id) {
           // The batch is laid out: a replacement must fit the failed sample's place, which a
           // candidate refused must not change for the next one.
           const ArrayInfo place = s_.probes[i].info;
           try {
             size(i, id);
             if (!s_.probes[i].info.same_layout(place)) {
               throw DecodeError(d_.tiers_.catalog().source_path(id).string(),
                                 "its type or shape differs from the failed sample's");
             }
           } catch (...) {
             s_.probes[i].info = place;
             throw;
           }
           fill(i, id);
         });
    slot_.error = first_error_.get();
  }

 private:
  // JPEGs that keep their own size: step 1 reads each one to learn it.
  bool unresized() const { return d_.codec_.mode == DecodeMode::kJpeg && d_.image_size_.empty(); }

  // Raw files: step 1 reads each one, so that a file that cannot be read, or no longer has its
  // catalog's size, fails before the batch is laid out (and is replaced by any good file, whatever
  // its size), with one open and one read and no stat; step 3 copies the bytes into place.
  bool raw_files() const { return d_.codec_.mode == DecodeMode::kRaw && !d_.codec_.arrays(); }

  // Step 1 keeps each sample's bytes for step 3.
  bool keeps_bytes() const { return unresized() || raw_files(); }

  // Without an image_size: reads sample i (catalog sample `id`) once, keeps its bytes and its JPEG
  // for step 3, and returns the image's size from its header (max_pixels checked there, before the
  // batch is laid out).
  ImageSize read_image(size_t i, uint64_t id) {
    Reader& r = reader();
    const auto bytes =
        d_.tiers_.open(SampleBytes{id, held(i, id), s_.bytes[i], r.paths}, b_.tally).bytes;
    d_.bytes_read_.fetch_add(bytes.size(), std::memory_order_relaxed);
    const std::string& path = r.paths.source;  // the sample's source path, as the read left it
    SampleDecoder& decoder = r.codec(d_.codec_);
    const std::span<const std::byte> jpeg = decoder.image_payload(bytes, path, s_.unpacked[i]);
    s_.kept[i] = jpeg;
    const ImageHeader header = decoder.image.header(jpeg, path);
    return {static_cast<uint32_t>(header.height), static_cast<uint32_t>(header.width)};
  }

  // The (height, width) of an image laid out as `info`.
  ImageSize image_size_of(const ArrayInfo& info) const {
    const size_t h = d_.options_.layout == Layout::kNCHW ? 1 : 0;
    return {static_cast<uint32_t>(info.shape[h]), static_cast<uint32_t>(info.shape[h + 1])};
  }

  // Step 1: sample i's size, type and shape (from catalog sample `id`), and the tier they came
  // from.
  void size(size_t i, uint64_t id) {
    ArrayInfo& info = s_.probes[i].info;
    const Codec& codec = d_.codec_;
    if (codec.mode == DecodeMode::kJpeg) {
      // Every image decodes to the loader's size (nothing to read yet), or keeps its own.
      const LoaderDecodeOptions& o = d_.options_;
      const ImageSize size = unresized() ? read_image(i, id) : d_.image_size_;
      info.dtype = o.dtype == OutputType::kFloat32 ? "<f4" : "|u1";
      info.ndim = 3;
      info.shape = {};
      if (o.layout == Layout::kNCHW) {
        info.shape[0] = 3, info.shape[1] = size.height, info.shape[2] = size.width;
      } else {
        info.shape[0] = size.height, info.shape[1] = size.width, info.shape[2] = 3;
      }
      info.bytes = image_sample_bytes(size.height, size.width, o.dtype);
      s_.tiers[i] = Tier::kMemory;
      return;
    }
    Reader& r = reader();
    if (!codec.arrays()) {
      // Raw files: the file's (or byte range's) bytes as one array (Codec::raw_array).
      const auto bytes =
          d_.tiers_.open(SampleBytes{id, held(i, id), s_.bytes[i], r.paths}, b_.tally).bytes;
      s_.kept[i] = bytes;
      s_.tiers[i] = Tier::kMemory;
      const uint64_t n = bytes.size();
      d_.tiers_.check_size(id, n);
      codec.raw_array(n, "|u1", info, r.paths.source);
      return;
    }
    // Bytes in memory (stage 2's, or a home copy the peer tier sent into s_.bytes[i]) are kept
    // for step 3 and counted here; a copy on disk is opened again by step 3, which counts it.
    s_.kept[i].reset();
    const Catalog::Locator loc = d_.tiers_.catalog().locator(id);
    const auto probe = [&](const ByteSource& at) -> uint64_t {
      r.codec(codec).probe(at, loc, s_.probes[i]);
      if (at.file() != nullptr) return 0;
      s_.kept[i] = at.memory();
      return at.size();
    };
    s_.tiers[i] =
        d_.tiers_
            .open(DecodeRead{id, Access::kFile, probe, r.paths, held(i, id), &s_.bytes[i]},
                  b_.tally)
            .tier;
  }

  // Step 3: sample i's data into its place (from catalog sample `id`).
  void fill(size_t i, uint64_t id) {
    const std::span<std::byte> out(slot_.data.data() + slot_.offsets[i],
                                   slot_.offsets[i + 1] - slot_.offsets[i]);
    Reader& r = reader();
    const Codec& codec = d_.codec_;
    if (codec.mode == DecodeMode::kJpeg) {
      fill_image(i, id, r, out);
      return;
    }
    if (!codec.arrays()) {
      // Step 1 read it (and counted the read).
      const std::span<const std::byte> bytes = *s_.kept[i];
      if (bytes.size() != out.size()) {
        throw DecodeError(d_.tiers_.catalog().source_path(id).string(),
                          "its size differs from the failed sample's");
      }
      std::copy(bytes.begin(), bytes.end(), out.begin());
    } else if (s_.kept[i]) {
      // Step 1 took its bytes from memory (and counted the read).
      const Catalog::Locator loc = d_.tiers_.catalog().locator(id);
      const std::string& path = d_.tiers_.source_path(loc.file, r.paths.source);
      r.codec(codec).fill(MemorySource(*s_.kept[i], path), loc, s_.probes[i], out);
    } else {
      const Catalog::Locator loc = d_.tiers_.catalog().locator(id);
      const auto fill = [&](const ByteSource& at) -> uint64_t {
        r.codec(codec).fill(at, loc, s_.probes[i], out);
        return out.size();
      };
      d_.tiers_.open(
          DecodeRead{id, Access::kFile, fill, r.paths, std::nullopt, nullptr, s_.tiers[i]},
          b_.tally);
    }
    // Decoded bytes: what a compressed sample took on disk is not tracked per read.
    d_.bytes_read_.fetch_add(out.size(), std::memory_order_relaxed);
  }

  void fill_image(size_t i, uint64_t id, Reader& r, std::span<std::byte> place) {
    const LoaderDecodeOptions& o = d_.options_;
    const ImageSize size = image_size_of(s_.probes[i].info);
    // NHWC uint8 is what the codec writes: straight into the batch buffer. Anything else goes
    // through the reader's RGB image and is converted into place.
    const bool direct = o.layout != Layout::kNCHW && o.dtype == OutputType::kUint8;
    const size_t rgb_bytes = size_t{size.height} * size.width * 3;
    if (!direct && r.image.size() < rgb_bytes) r.image.resize(rgb_bytes);
    const std::span<std::byte> rgb(
        direct ? place.data() : reinterpret_cast<std::byte*>(r.image.data()), rgb_bytes);
    SampleDecoder& decoder = r.codec(d_.codec_);
    if (unresized()) {
      // Step 1 read the sample and found its JPEG.
      const std::string& path =
          d_.tiers_.source_path(d_.tiers_.catalog().locator(id).file, r.paths.source);
      decoder.image.decode_exact(*s_.kept[i], size, rgb, path);
    } else {
      fill_resized(i, id, r, decoder, size, rgb);
    }
    if (!direct) {
      convert_image(r.image.data(), static_cast<int>(size.height), static_cast<int>(size.width),
                    o.layout, o.dtype, d_.normalizer_, place.data());
    }
  }

  // With an image_size: reads sample i (catalog sample `id`) and decodes it to `size` into `rgb`.
  void fill_resized(size_t i, uint64_t id, Reader& r, SampleDecoder& decoder, ImageSize size,
                    std::span<std::byte> rgb) {
    const LoaderDecodeOptions& o = d_.options_;
    const auto bytes =
        d_.tiers_.open(SampleBytes{id, held(i, id), r.buffer, r.paths}, b_.tally).bytes;
    d_.bytes_read_.fetch_add(bytes.size(), std::memory_order_relaxed);
    const std::string& path = r.paths.source;  // the sample's source path, as the read left it
    const auto jpeg = decoder.image_payload(bytes, path);
    if (o.transform == Transform::kRandomResizedCrop) {
      decoder.image.decode_random_crop(jpeg, size, d_.seed_, b_.epoch, id, rgb, path);
    } else {
      decoder.image.decode_resized(jpeg, size, rgb, path);
    }
  }

  // Step 2: the batch's type (the one most of its samples have; samples of another type fail or
  // are replaced), its layout (one array when the shapes agree, else ragged) and its buffer.
  bool lay_out() {
    const size_t n = b_.count;
    const std::string* expected =
        d_.codec_.mode == DecodeMode::kJpeg ? nullptr : d_.data_set_dtype(stopping_);
    const std::string& dtype = expected != nullptr ? *expected : batch_dtype();
    const std::string whose = expected != nullptr ? "the data set's " : "the batch's ";
    for (size_t i = 0; i < n; ++i) {
      if (s_.probes[i].info.dtype == dtype) continue;
      const ArrayInfo odd = s_.probes[i].info;
      replace_or_fail(i,
                      std::make_exception_ptr(
                          DecodeError(d_.tiers_.catalog().source_path(slot_.indices[i]).string(),
                                      "its dtype " + odd.dtype + " differs from " + whose + dtype)),
                      [&](size_t j, uint64_t id) {
                        size(j, id);
                        if (s_.probes[j].info.dtype != dtype) {
                          throw DecodeError(d_.tiers_.catalog().source_path(id).string(),
                                            "its dtype " + s_.probes[j].info.dtype +
                                                " differs from " + whose + dtype);
                        }
                      });
    }
    if ((slot_.error = first_error_.get())) return false;

    const ArrayInfo& first = s_.probes[0].info;
    slot_.dtype = dtype;
    slot_.ragged = false;
    slot_.offsets.assign(n + 1, 0);
    slot_.dim_offsets.assign(n + 1, 0);
    slot_.dims.clear();
    uint64_t total = 0;
    for (size_t i = 0; i < n; ++i) {
      const ArrayInfo& info = s_.probes[i].info;
      if (info.bytes > SIZE_MAX - total) {
        slot_.error = std::make_exception_ptr(DecodeError(
            d_.tiers_.catalog().source_path(slot_.indices[i]).string(),
            "the batch would take more than the address space (" + std::to_string(total) +
                " bytes before this sample's " + std::to_string(info.bytes) + ")"));
        return false;
      }
      if (!info.same_layout(first)) slot_.ragged = true;
      total += info.bytes;
      slot_.offsets[i + 1] = total;
      for (const uint64_t dim : info.dims()) slot_.dims.push_back(dim);
      slot_.dim_offsets[i + 1] = slot_.dims.size();
    }
    slot_.shape = {n, 0, 0, 0};
    if (d_.codec_.mode == DecodeMode::kJpeg) {
      for (size_t k = 0; k < 3; ++k) slot_.shape[k + 1] = first.shape[k];
    }
    try {
      slot_.data.reserve(static_cast<size_t>(total));
    } catch (const std::bad_alloc&) {
      // No exception may leave a graph node: the batch carries it to the consumer.
      slot_.error = std::current_exception();
      return false;
    }
    slot_.data_bytes = static_cast<size_t>(total);
    return true;
  }

  // Without the data set's dtype: the dtype most samples of the batch have; of equal counts, the
  // earliest sample's.
  const std::string& batch_dtype() const {
    const std::string* best = &s_.probes[0].info.dtype;
    size_t best_count = 0;
    for (size_t i = 0; i < b_.count; ++i) {
      const std::string& dtype = s_.probes[i].info.dtype;
      if (i > 0 && dtype == *best) continue;
      size_t count = 0;
      for (size_t j = 0; j < b_.count; ++j) count += s_.probes[j].info.dtype == dtype;
      if (count > best_count) best = &dtype, best_count = count;
      if (best_count * 2 > b_.count) break;
    }
    return *best;
  }
};

BatchDecoder::BatchDecoder(const LoaderDecodeOptions& options, const LoaderPlanOptions& plan,
                           uint64_t readers, const Codec& codec, ImageSize image_size,
                           const Normalizer* normalizer, Tiers& tiers)
    : options_(options),
      batch_size_(plan.batch_size),
      seed_(plan.seed),
      codec_(codec),
      image_size_(image_size),
      normalizer_(normalizer),
      tiers_(tiers),
      readers_(std::make_unique<tbb::enumerable_thread_specific<Reader>>()) {
  if (options.decode_device == DecodeDevice::kCuda) {
    gpu_ = std::make_unique<GpuBatches>(options, plan, readers, image_size);
  }
}

BatchDecoder::~BatchDecoder() = default;

void BatchDecoder::readers_changed(uint64_t from, uint64_t to) {
  if (gpu_) gpu_->readers_changed(from, to);
}

Stats::GpuDecode BatchDecoder::gpu_stats() const {
  return gpu_ ? gpu_->stats() : Stats::GpuDecode{};
}

void BatchDecoder::clear_thread_state() { readers_->clear(); }

const std::string* BatchDecoder::data_set_dtype(const std::atomic<bool>& stopping) {
  std::lock_guard lock(data_set_mutex_);
  if (data_set_probed_) return data_set_dtype_ ? &*data_set_dtype_ : nullptr;
  if (!codec_.arrays() || (codec_.mode == DecodeMode::kRaw && !codec_.raw_dtype.empty())) {
    // Declared or fixed: every sample has it or fails on its own (Codec::raw_array).
    data_set_probed_ = true;
    return nullptr;
  }
  const Catalog& catalog = tiers_.catalog();
  if (!catalog.dtype().empty() &&
      ((catalog.kind() == Catalog::Kind::kArrays && codec_.mode == DecodeMode::kNpy) ||
       (catalog.kind() == Catalog::Kind::kHdf5 && codec_.mode == DecodeMode::kHdf5) ||
       (catalog.kind() == Catalog::Kind::kTfrecord && codec_.mode == DecodeMode::kRaw))) {
    // Recorded by the catalog from every file's header (a sample has its array's dtype): no sample
    // is read for it.
    data_set_probed_ = true;
    data_set_dtype_ = catalog.dtype();
    return &*data_set_dtype_;
  }
  const uint64_t n = catalog.size();
  const uint64_t k = std::min(kDataSetProbes, n);
  SampleDecoder decoder(codec_);  // its own: the readers' are their threads'
  TierScratch paths;
  ArrayProbe probe;
  std::vector<std::string> found;  // in the order of the probes' ids
  for (uint64_t j = 0; j < k; ++j) {
    const uint64_t id = j * n / k;
    try {
      const auto look = [&](const ByteSource& at) -> uint64_t {
        decoder.probe(at, catalog.locator(id), probe);
        return 0;
      };
      tiers_.open(DecodeRead{id, Access::kFile, look, paths, std::nullopt, nullptr, Tier::kStage},
                  nullptr);
      found.push_back(probe.info.dtype);
    } catch (const Error&) {
      // Unreadable or undecodable: its batch reports it; the others decide.
    }
  }
  if (stopping.load(std::memory_order_acquire)) return nullptr;  // cancelled reads decide nothing
  data_set_probed_ = true;
  size_t best_count = 0;
  for (const std::string& dtype : found) {
    const auto count = static_cast<size_t>(std::count(found.begin(), found.end(), dtype));
    if (count > best_count) best_count = count, data_set_dtype_ = dtype;
  }
  return data_set_dtype_ ? &*data_set_dtype_ : nullptr;
}

void BatchDecoder::decode(const BatchSamples& batch, BatchScratch& scratch, Slot& slot,
                          const std::atomic<bool>& stopping) {
  slot.epoch = batch.epoch;
  slot.index = batch.index;
  slot.error = nullptr;
  slot.skipped.clear();
  slot.indices.assign(batch.ids, batch.ids + batch.count);
  slot.labels.resize(batch.count);
  for (size_t i = 0; i < batch.count; ++i) slot.labels[i] = tiers_.catalog().label(batch.ids[i]);
  if (stopping.load(std::memory_order_acquire)) return;  // nobody will look at it
  if (codec_.mode == DecodeMode::kLocate) {
    locate(batch, slot);
    return;
  }
  if (gpu_) {
    gpu_->decode(*this, batch, scratch, slot, stopping);
  } else {
    Run(*this, batch, scratch, slot, stopping)();
  }
  scratch.trim();
  // Recorded in thread order: listed in batch order.
  std::sort(slot.skipped.begin(), slot.skipped.end(),
            [](const Slot::Skip& a, const Slot::Skip& b) { return a.position < b.position; });
  decoded_.fetch_add(batch.count, std::memory_order_relaxed);
}

void BatchDecoder::locate(const BatchSamples& batch, Slot& slot) {
  const size_t n = batch.count;
  slot.dtype = "|u1";
  slot.ragged = false;
  slot.shape = {n, 0, 0, 0};
  slot.offsets.resize(n + 1);
  for (size_t i = 0; i <= n; ++i) slot.offsets[i] = i;
  slot.dims.clear();
  slot.dim_offsets.assign(n + 1, 0);
  try {
    slot.data.reserve(n);
  } catch (const std::bad_alloc&) {
    slot.error = std::current_exception();
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    slot.data.data()[i] = static_cast<std::byte>(tiers_.open(Look{batch.ids[i]}, batch.tally).tier);
  }
  slot.data_bytes = n;
  decoded_.fetch_add(n, std::memory_order_relaxed);
}

}  // namespace prestage::detail
