// Stats: always-on counters per stage, cheap enough to keep in production runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "prestage/pinning.hpp"

namespace prestage {

// One field of a struct below: its name in Python's Loader.stats() (the C++ name, where fields()
// does not say otherwise) and the member. Each struct lists every field of its own in fields(), in
// the order stats() gives them, for code that walks them (the Python bindings make their dict from
// it and keep no list of their own): a field added to a struct is added to its fields() too, which
// tests/cpp/stats_test.cpp checks.
template <typename Struct, typename Member>
struct StatsField {
  const char* name;
  Member Struct::* member;
};
template <typename Struct, typename Member>
constexpr StatsField<Struct, Member> stats_field(const char* name, Member Struct::* member) {
  return {name, member};
}

struct StageStats {
  double busy_s = 0;   // summed over the stage's threads
  double idle_s = 0;   // threads x wall time - busy
  uint64_t items = 0;  // samples dealt with
  // Stage 3: the bytes its samples were decoded from (an image's as read, an array's data as it
  // was placed in its batch, decompressed). Stage 2: the bytes of the copies it wrote. Not counts
  // of reads, which are hits, misses, read_ahead, source_reads and the peer_reads below.
  uint64_t bytes = 0;

  static constexpr auto fields() {
    using S = StageStats;
    return std::make_tuple(stats_field("busy_s", &S::busy_s), stats_field("idle_s", &S::idle_s),
                           stats_field("items", &S::items), stats_field("bytes", &S::bytes));
  }
};

// What one epoch's batches cost this process. Stage 1 decides, as it plans a batch, which samples
// the stage directory holds (hits) and which must come from the source (misses); the rest is
// counted as the reads happen. So an epoch planned ahead shows before it is consumed, and its
// figures grow until its last batch is decoded. Processes that share a stage directory (ranks of
// one node) each count their own: the node's reads of the source are the sum of theirs.
struct EpochStats {
  uint64_t epoch = 0;
  uint64_t hits = 0;       // samples whose file was staged (by this process or a neighbour) or on
                           // its way, so that its bytes did not come from the source for them
  uint64_t misses = 0;     // samples whose bytes this process read from the source: copied to the
                           // stage directory, read ahead into memory, or read by stage 3 itself
                           // (with the peer tier on, also those a peer served: peer_reads)
  uint64_t evictions = 0;  // files removed from the stage directory to make room
  uint64_t source_reads = 0;       // reads of the source for this epoch's batches (one per file
                                   // copied, per sample read ahead or read by stage 3 itself)
  uint64_t bytes_from_source = 0;  // the bytes of those reads
  uint64_t copies_made = 0;        // files this process copied to the stage directory
  uint64_t copies_adopted = 0;     // files it was to copy and found copied by a neighbour
  uint64_t peer_reads = 0;         // samples of this epoch's batches fetched from another node's
  uint64_t bytes_from_peers = 0;   // home copy (the peer tier), and their bytes
  // Stage 3's reads of this epoch's samples by where their bytes were when it decoded them (counted
  // as its batches are decoded; each is one of Stats::hits, or of Stats::misses, whose sums over
  // the epochs they are): the stage directory, memory stage 2 read ahead, a peer, the source.
  uint64_t decoded_from_stage = 0;
  uint64_t decoded_from_memory = 0;
  uint64_t decoded_from_peers = 0;
  uint64_t decoded_from_source = 0;

  static constexpr auto fields() {
    using S = EpochStats;
    return std::make_tuple(stats_field("epoch", &S::epoch), stats_field("hits", &S::hits),
                           stats_field("misses", &S::misses),
                           stats_field("evictions", &S::evictions),
                           stats_field("source_reads", &S::source_reads),
                           stats_field("bytes_from_source", &S::bytes_from_source),
                           stats_field("copies_made", &S::copies_made),
                           stats_field("copies_adopted", &S::copies_adopted),
                           stats_field("peer_reads", &S::peer_reads),
                           stats_field("bytes_from_peers", &S::bytes_from_peers),
                           stats_field("decoded_from_stage", &S::decoded_from_stage),
                           stats_field("decoded_from_memory", &S::decoded_from_memory),
                           stats_field("decoded_from_peers", &S::decoded_from_peers),
                           stats_field("decoded_from_source", &S::decoded_from_source));
  }
};

// on_error=skip: a sample that failed and was replaced in its batch by another.
struct SkippedSample {
  uint64_t epoch = 0;
  uint64_t batch = 0;        // the batch's index in its epoch
  uint64_t sample = 0;       // the failed sample's catalog index
  uint64_t replacement = 0;  // the catalog index of the sample delivered in its place
  std::string path;          // the failed sample's source path
  std::string error;         // why it failed (the error on_error=raise would have raised)

  static constexpr auto fields() {
    using S = SkippedSample;
    return std::make_tuple(stats_field("path", &S::path), stats_field("error", &S::error),
                           stats_field("sample", &S::sample),
                           stats_field("replacement", &S::replacement),
                           stats_field("epoch", &S::epoch), stats_field("batch", &S::batch));
  }
};

// With the peer tier on: one source of stage 2's reads (this node's stage directory, another node's
// link, the PFS) as the source model sees it: the reads it served and what it has learned of it
// (see Stats::sources).
struct SourceStats {
  std::string name;  // "stage", "pfs", "node <its lowest rank>"
  // The reads the model queued there or learned from (stage 2's copies and read-ahead, stage 3's
  // reads it sent to the PFS, probes, reads that failed), and their bytes as the source moves them
  // (the PFS: a compressed file's stored bytes): the model's own observations, not a count of the
  // reads served (source_reads, peer_reads).
  uint64_t reads = 0, bytes = 0;
  uint64_t samples = 0;   // reads the estimates are learned from
  double latency_ms = 0;  // estimated per read
  double mbs = 0;         // estimated bandwidth, MB/s (0: not learned yet)
  bool down = false;      // a peer marked down: never chosen
  uint64_t probes = 0;    // of the reads, probes: made to measure it, off the batch path

  static constexpr auto fields() {
    using S = SourceStats;
    return std::make_tuple(stats_field("name", &S::name), stats_field("reads", &S::reads),
                           stats_field("bytes", &S::bytes), stats_field("samples", &S::samples),
                           stats_field("latency_ms", &S::latency_ms), stats_field("mbs", &S::mbs),
                           stats_field("down", &S::down), stats_field("probes", &S::probes));
  }
};

struct Stats {
  double wall_s = 0;  // since the loader started its current run of epochs
  uint64_t batches = 0;
  uint64_t samples = 0;
  double consumer_stall_s = 0;  // time the consumer waited in next(): the number that matters

  StageStats plan;
  StageStats stage;
  StageStats decode;

  // What the thread options left to the machine (LoaderOptions::kAuto) came to, and why: the
  // CPUs this process may use and the ranks of its node. Empty when every value was given.
  std::string threads_why;
  uint64_t usable_cpus = 0;
  uint64_t local_ranks = 0;
  // How long the consumer's next batch waits for stage 2's copies before stage 3 takes it: the
  // option stage_patience, or none where it waits for them (stage_patience kWaitForStaging, or the
  // peer tier on: a home copy is made before its sample is read).
  std::optional<double> stage_patience_s;
  // Online self-tuning (LoaderOptions::autotune): the values in use now, the steps it kept and
  // undid, when it last kept one (seconds of the run: the settle time), and its latest decisions
  // (one line each, the newest last; at most kMaxTuningListed).
  struct Tuning {
    bool on = false;
    uint64_t readers = 0;
    uint64_t reads_in_flight = 0;  // stage 2's threads (0: no stage directory, no stage 2 threads)
    uint64_t lookahead = 0;
    uint64_t steps_kept = 0;
    uint64_t steps_undone = 0;
    double settled_s = 0;
    uint64_t memory_budget = 0;
    std::vector<std::string> log;

    static constexpr auto fields() {
      using S = Tuning;
      return std::make_tuple(
          stats_field("on", &S::on), stats_field("readers", &S::readers),
          stats_field("reads_in_flight", &S::reads_in_flight),
          stats_field("lookahead", &S::lookahead), stats_field("steps_kept", &S::steps_kept),
          stats_field("steps_undone", &S::steps_undone), stats_field("settled_s", &S::settled_s),
          stats_field("memory_budget", &S::memory_budget), stats_field("log", &S::log));
    }
  };
  static constexpr size_t kMaxTuningListed = 100;
  Tuning tuning;

  // What the loader holds in memory now for its batches, in bytes, by what holds it; bounded by
  // its options whatever the number of epochs (README, "Memory"):
  //  - batch_buffers: the `depth` batch buffers, each as large as the largest batch it held (a
  //    ragged batch's: a quarter more), all of them as large as the largest;
  //  - read_ahead: stage 2's reads into memory, one buffer per batch the pipeline can hold
  //    (lookahead + depth + 1), each as large as the largest read-ahead of a batch it carried
  //    (the samples the stage directory declined, at most 64 MiB a batch);
  //  - decode_scratch: stage 3's samples' bytes between a batch's steps (JPEGs without an
  //    image_size, raw files), one scratch per batch being decoded (depth at most), each sample's
  //    buffer at most twice the bytes it last held.
  struct Memory {
    uint64_t batch_buffers = 0;
    uint64_t read_ahead = 0;
    uint64_t decode_scratch = 0;

    static constexpr auto fields() {
      using S = Memory;
      return std::make_tuple(stats_field("batch_buffers", &S::batch_buffers),
                             stats_field("read_ahead", &S::read_ahead),
                             stats_field("decode_scratch", &S::decode_scratch));
    }
  };
  Memory memory;

  // Stage 2.
  uint64_t staged_files = 0;     // files copied to the stage directory in this run (by stage 2,
                                 // and by stage 3 from the misses it read: misses_staged)
  uint64_t adopted_files = 0;    // copies another process (sharing the directory) made meanwhile,
                                 // taken over instead of read from the source
  uint64_t already_staged = 0;   // found staged (this run or an earlier one): not copied again
  uint64_t stage_failures = 0;   // samples stage 2 gave up on (source or stage directory errors)
  uint64_t stage_expedited = 0;  // samples stage 3 read itself because stage 2 had not started them
                                 // when the consumer's next batch was due
  uint64_t read_ahead = 0;       // samples the stage directory declined (a bounded cache keeps
  uint64_t read_ahead_bytes = 0;  // what is needed sooner), read into memory by stage 2 instead
  uint64_t stage_corrupt = 0;     // staged copies whose bytes did not match their record when read:
                                  // removed, and the source read instead (never a wrong byte)
  bool stage_dir_disabled = false;  // the stage directory failed; reads go to the source
  std::string stage_dir_error;

  // Stage 3: where the bytes came from.
  uint64_t hits = 0;    // read from the stage directory
  uint64_t misses = 0;  // not read from it (not staged in time, or no stage directory): read from
                        // the source, or a peer's home copy
  uint64_t misses_read_ahead = 0;  // of those, read by stage 2 ahead (Stats::read_ahead): the rest
                                   // stage 3 read itself
  uint64_t misses_staged = 0;  // of staged_files, those stage 3 made: files it read whole from the
                               // source (misses) and published as their copies from those bytes,
                               // within the bound, so that stage 2 does not read them again
  uint64_t missed_bytes = 0;   // the bytes of the misses, wherever they came from (the source's
                               // own bytes, for every stage: source_bytes)
  uint64_t bytes_from_stage = 0;  // the bytes of the hits

  // Every read of the source by this process, for all stages (stage 2's copies and reads ahead,
  // stage 3's own reads): the sums of the epochs' source_reads and bytes_from_source.
  uint64_t source_reads = 0;
  uint64_t source_bytes = 0;

  // on_error=skip: samples replaced in the batches delivered so far (a sample that fails in two
  // epochs counts twice), and the first kMaxSkippedListed of them, in delivery order.
  static constexpr size_t kMaxSkippedListed = 1000;
  uint64_t skipped = 0;
  std::vector<SkippedSample> skipped_samples;

  // decode_device=cuda: where the JPEGs of the batches decoded so far went (each sample once; a
  // replacement decoded under on_error=skip counts in cpu_replacements), and the GPU decoders'
  // staging buffer growths (none once warm: memory is reused, never allocated per image).
  struct GpuDecode {
    bool on = false;
    std::string why;  // the libraries in use
    uint64_t batches = 0;
    uint64_t hardware = 0;          // nvJPEG's hardware engine
    uint64_t gpu = 0;               // nvJPEG's default (CUDA) backend
    uint64_t cpu_share = 0;         // the CPU's share of each batch (gpu_cpu_share)
    uint64_t cpu_unsupported = 0;   // fallbacks: files the GPU cannot take (CMYK, 4:1:1, headers
                                    // nvJPEG refuses, corrupt files, over max_pixels; a progressive
                                    // file goes from the hardware engine to the CUDA backend)
    uint64_t cpu_gpu_failed = 0;    // fallbacks: samples of a batched GPU decode that failed
    uint64_t cpu_replacements = 0;  // on_error=skip: replacements, decoded by the CPU path
    uint64_t buffer_growths = 0;
    uint64_t decoders = 0;  // GPU decoders made (one per ring slot used)
    // The CPU's share of the next batches (LoaderOptions::gpu_cpu_share): given (fixed), or sized
    // at run time (share_auto) so that both parts of a batch finish together; share_why says from
    // what (decode/gpu_share.hpp); share_moves counts its changes. The measured times per image,
    // smoothed (0: none measured yet): the GPU's part from its submission to its completion, the
    // CPU's part as the readers' wall time on it.
    double share = 0;
    bool share_auto = false;
    std::string share_why;
    uint64_t share_moves = 0;
    double gpu_ms_per_image = 0;
    double cpu_ms_per_image = 0;
    // Where the hardware engine applies the crop boxes (LoaderOptions::gpu_crop): "resize" or
    // "roi" ("trying" while the first batches are timed each way), why, and the images of which
    // only the box was decoded (of `hardware`).
    std::string crop;
    std::string crop_why;
    uint64_t roi = 0;

    static constexpr auto fields() {
      using S = GpuDecode;
      return std::make_tuple(
          stats_field("on", &S::on), stats_field("why", &S::why),
          stats_field("batches", &S::batches), stats_field("hardware", &S::hardware),
          stats_field("gpu", &S::gpu), stats_field("cpu_share", &S::cpu_share),
          stats_field("cpu_unsupported", &S::cpu_unsupported),
          stats_field("cpu_gpu_failed", &S::cpu_gpu_failed),
          stats_field("cpu_replacements", &S::cpu_replacements),
          stats_field("buffer_growths", &S::buffer_growths), stats_field("decoders", &S::decoders),
          stats_field("share", &S::share), stats_field("share_auto", &S::share_auto),
          stats_field("share_why", &S::share_why), stats_field("share_moves", &S::share_moves),
          stats_field("gpu_ms_per_image", &S::gpu_ms_per_image),
          stats_field("cpu_ms_per_image", &S::cpu_ms_per_image), stats_field("crop", &S::crop),
          stats_field("crop_why", &S::crop_why), stats_field("roi", &S::roi));
    }
  };
  GpuDecode gpu_decode;

  // How the batch buffers are pinned: the least of all buffers (kCuda only if every one is
  // registered), and why it is not better (or, for kCuda, the runtime registered with).
  Pinning pinned = Pinning::kNone;
  std::string pinned_why;

  // Bounded stage directory: the bound in effect (0: none; see LoaderOptions::kFitFreeSpace), bytes
  // held now and at most (files being written included; with the default bound, in whole blocks
  // with the directory's own files), by every process sharing the directory, as of the batches this
  // one has planned.
  uint64_t cache_bytes = 0;
  uint64_t stage_bytes = 0;
  uint64_t stage_bytes_peak = 0;

  // The peer tier (LoaderOptions::peers): whether it is on and, if not, why ("plugin missing: ...",
  // "MPI world of 1 does not match world_size 4", ...). Bytes from the local SSD are
  // bytes_from_stage, from the source source_bytes; from peers:
  bool peer_tier = false;
  std::string peer_tier_why;
  uint64_t peer_reads = 0;  // samples and files fetched from another node's home copy, used here
  uint64_t peer_bytes = 0;
  uint64_t peer_probes = 0;  // answers with bytes fetched from another node only to measure its
  uint64_t peer_probe_bytes = 0;  // link (the source model's probes): their bytes are dropped
  uint64_t peer_fallbacks = 0;    // fetches that ended in a read of the source: no answer within
                                  // peer_timeout, no copy, or a reply that failed its check
  uint64_t peer_corrupt = 0;      // of those, replies whose size or CRC-32C did not match
  uint64_t beyond_budget = 0;  // uses of samples beyond their owner node's home budget (read from
                               // the source each time)
  // Requests of other ranks this rank answered with bytes: their reads and probes alike. A job's
  // peer_served is the sum of its ranks' peer_reads, peer_probes and peer_corrupt, plus answers
  // that reached a rank no longer waiting for them (past peer_timeout, or its loader closed) or
  // that it fetched for a sample whose header its codec then refused (no read, as from any tier);
  // its peer_served_bytes the sum of peer_bytes and peer_probe_bytes plus those answers' bytes.
  uint64_t peer_served = 0;
  uint64_t peer_served_bytes = 0;
  uint64_t peers_down = 0;  // peers marked down (no answer within peer_timeout: stalled, dead):
                            // their files are read from the source at once from then on
  uint64_t peers_closed =
      0;  // peers that said goodbye (closed their loader): the same from then on
  // Each read of a sample with a home copy goes to that copy or to the PFS, whichever the source
  // model expects to finish first (its queue counted): the reads it sent to the PFS, and per source
  // its reads and estimates, so that a user sees why.
  uint64_t peer_reads_to_pfs = 0;
  // The layout of the node's stage directory: home copies first (kept for the other nodes' reads
  // while their links are faster than the PFS), or run as without the tier.
  bool peer_home_first = false;
  std::vector<SourceStats> sources;
  std::vector<EpochStats> epochs;  // in epoch order

  // In the order stats() has always given them (not declaration order), two names differing from
  // the C++ ones: "stage_patience" (stage_patience_s), and "bytes_from_source", the name
  // missed_bytes had before it counted a peer's bytes too, kept beside it for existing scripts.
  static constexpr auto fields() {
    using S = Stats;
    return std::make_tuple(
        stats_field("wall_s", &S::wall_s), stats_field("batches", &S::batches),
        stats_field("samples", &S::samples), stats_field("consumer_stall_s", &S::consumer_stall_s),
        stats_field("plan", &S::plan), stats_field("stage", &S::stage),
        stats_field("decode", &S::decode), stats_field("threads_why", &S::threads_why),
        stats_field("usable_cpus", &S::usable_cpus), stats_field("local_ranks", &S::local_ranks),
        stats_field("stage_patience", &S::stage_patience_s), stats_field("tuning", &S::tuning),
        stats_field("memory", &S::memory), stats_field("staged_files", &S::staged_files),
        stats_field("adopted_files", &S::adopted_files),
        stats_field("already_staged", &S::already_staged),
        stats_field("stage_failures", &S::stage_failures),
        stats_field("stage_corrupt", &S::stage_corrupt),
        stats_field("stage_expedited", &S::stage_expedited),
        stats_field("read_ahead", &S::read_ahead),
        stats_field("read_ahead_bytes", &S::read_ahead_bytes),
        stats_field("stage_dir_disabled", &S::stage_dir_disabled),
        stats_field("stage_dir_error", &S::stage_dir_error), stats_field("hits", &S::hits),
        stats_field("misses", &S::misses), stats_field("misses_read_ahead", &S::misses_read_ahead),
        stats_field("misses_staged", &S::misses_staged),
        stats_field("missed_bytes", &S::missed_bytes),
        stats_field("bytes_from_source", &S::missed_bytes),
        stats_field("bytes_from_stage", &S::bytes_from_stage),
        stats_field("source_reads", &S::source_reads),
        stats_field("source_bytes", &S::source_bytes), stats_field("skipped", &S::skipped),
        stats_field("skipped_samples", &S::skipped_samples), stats_field("pinned", &S::pinned),
        stats_field("pinned_why", &S::pinned_why), stats_field("cache_bytes", &S::cache_bytes),
        stats_field("stage_bytes", &S::stage_bytes),
        stats_field("stage_bytes_peak", &S::stage_bytes_peak), stats_field("epochs", &S::epochs),
        stats_field("peer_tier", &S::peer_tier), stats_field("peer_tier_why", &S::peer_tier_why),
        stats_field("peer_reads", &S::peer_reads), stats_field("peer_bytes", &S::peer_bytes),
        stats_field("peer_probes", &S::peer_probes),
        stats_field("peer_probe_bytes", &S::peer_probe_bytes),
        stats_field("peer_fallbacks", &S::peer_fallbacks),
        stats_field("peer_corrupt", &S::peer_corrupt),
        stats_field("beyond_budget", &S::beyond_budget),
        stats_field("peer_served", &S::peer_served),
        stats_field("peer_served_bytes", &S::peer_served_bytes),
        stats_field("peers_down", &S::peers_down), stats_field("peers_closed", &S::peers_closed),
        stats_field("peer_reads_to_pfs", &S::peer_reads_to_pfs),
        stats_field("peer_home_first", &S::peer_home_first), stats_field("sources", &S::sources),
        stats_field("gpu_decode", &S::gpu_decode));
  }
};

}  // namespace prestage
