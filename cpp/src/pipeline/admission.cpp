#include "pipeline/admission.hpp"

#include <algorithm>

#include "pipeline/graph.hpp"
#include "pipeline/machine.hpp"

namespace prestage::detail {

void Admitter::admit(uint64_t epoch, uint64_t index, const uint64_t* ids, size_t count,
                     BatchAdmission& out, Admission& costs) {
  out.files.clear();
  out.declined.clear();
  if (shared_.cache) {
    // What processes sharing the directory copied since the last batch: hits, not claims.
    shared_.stage_dir->take_over_published();
    shared_.cache->admit(epoch, index, ids, count, out.files, out.declined, costs);
    if (shared_.stager->disabled()) {
      // The stage directory failed: nothing more is copied or checked, so every file not staged
      // (or staged by an earlier run and not yet checked: the tiers do not serve it) is read ahead.
      for (const uint64_t f : out.files) shared_.stage_dir->abandon(f);
      out.files.clear();
      out.declined.clear();
      for (size_t k = 0; k < count; ++k) {
        const uint64_t file = shared_.catalog.locator(ids[k]).file;
        if (!shared_.stage_dir->servable(file)) {
          out.declined.push_back(k);
        }
      }
    }
    plan_read_ahead(ids, count, out);
    return;
  }
  costs.misses = count;  // no stage directory: every sample is read from the source
  // One was asked for but cannot be used: stage 2 reads the batch ahead into memory instead.
  // Without one (direct reads, the baseline) stage 3 reads everything.
  if (!shared_.options.stage_dir.empty()) {
    out.declined.resize(count);
    for (size_t k = 0; k < count; ++k) out.declined[k] = k;
  }
  plan_read_ahead(ids, count, out);
}

void Admitter::plan_read_ahead(const uint64_t* ids, size_t count, BatchAdmission& out) {
  out.read_ahead.plan(count);
  // Every codec decodes a sample from its bytes in memory: a whole file (JPEG, raw, .npy, .npz) or
  // a byte range (a TFRecord record, a packed sample). Not slices of an array (from_arrays,
  // from_hdf5): the bytes of one are its file's (its header, and HDF5's layout, lie there), shared
  // by many samples, which stage 3 reads from the node's copy, or as a whole home copy through the
  // peer tier, or in part from the source (a DecodeRead). With decode=locate nothing is read here
  // (the consumer reads what it was told where to find).
  const Catalog::Kind kind = shared_.codec.kind;
  const bool slices = kind == Catalog::Kind::kArrays || kind == Catalog::Kind::kHdf5;
  if (!slices && shared_.codec.mode != DecodeMode::kLocate) {
    uint64_t budget = kReadAheadBytesPerBatch;
    for (const size_t k : out.declined) {
      const uint64_t size = shared_.tiers->sample_size(ids[k]);
      if (size == Catalog::kUnknownSize || size > budget) continue;
      // A compressed file's samples are byte ranges of its copy, never of the source.
      const Catalog& catalog = shared_.catalog;
      if (catalog.file_codec(catalog.locator(ids[k]).file) != Catalog::Codec::kNone) continue;
      budget -= size;
      out.read_ahead.add(k, ids[k], size);
    }
  }
  const uint64_t held = out.read_ahead.lay_out(read_ahead_grown_);
  read_ahead_grown_ = std::max<size_t>(read_ahead_grown_, held);
  shared_.read_ahead_held.fetch_add(held - out.read_ahead_counted);  // modulo 2^64
  out.read_ahead_counted = held;
}

void Admitter::forget(BatchAdmission& out) {
  shared_.read_ahead_held.fetch_sub(out.read_ahead_counted);
  out.read_ahead_counted = 0;
}

}  // namespace prestage::detail
