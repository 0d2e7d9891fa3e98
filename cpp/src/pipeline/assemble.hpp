// The loader's parts, each built from the options it needs: what Loader::Impl's constructor puts
// together, in this order, and what the loader's first start adds (the threads, stage 2).
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "pipeline/graph.hpp"
#include "pipeline/machine.hpp"
#include "pipeline/tuner.hpp"

namespace prestage::detail {

// Throws prestage::Error, saying what to do instead, in a process forked from one whose loader
// started its threads; threads_started() marks the process that starts them.
void threads_can_start();
void threads_started();
// Lets oneTBB run `workers` worker threads besides the caller's (only raised, for the process's
// life).
void allow_workers(size_t workers);

// The thread options the user gave (not LoaderOptions::kAuto): never tuned.
std::array<bool, kKnobs> pinned_knobs(const LoaderTuningOptions& options);

// What the machine sizing chose, and why (Stats: threads_why, usable_cpus, local_ranks,
// tuning.memory_budget).
struct Sizing {
  std::string why;
  uint64_t usable_cpus = 0;
  uint64_t local_ranks = 0;
  uint64_t memory_budget = 0;
  TuneLimits limits;  // the most the self-tuning may raise each thread option to
};
// Fills the thread options left to the loader from the machine's CPUs, ranks and memory and the
// catalog's mean file and sample sizes.
Sizing size_loader(LoaderOptions& options, const std::array<bool, kKnobs>& pinned,
                   const Catalog& catalog);

// The stage directory and its cache (options.stage_dir, cache_bytes, eviction). Returns why the
// directory cannot be used (stage 2 then reads ahead into memory), or "". Throws UnsafePath: a
// directory another user holds is never used, nor quietly replaced by reads of the source.
std::string open_stage(Shared& shared);

// The tiers every read of a sample's bytes goes through, and the I/O trace (options.trace).
void make_tiers(Shared& shared);

// Stage 3: the images' size and normaliser (decode=jpeg) and the batch decoder. Returns the bytes
// of one batch buffer (0: buffers grow to their batches).
size_t make_decoder(Shared& shared);

// Stage 2's threads, made at the loader's first start. `timeout`: the loader's io_timeout.
std::unique_ptr<Stager> make_stager(Shared& shared, std::chrono::milliseconds timeout);

}  // namespace prestage::detail
