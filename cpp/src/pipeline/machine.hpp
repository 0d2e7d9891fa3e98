// Defaults sized to the machine: the loader's thread counts when the user gives none, from the CPUs
// this process may use (its affinity, a cgroup v2 quota as containers and Slurm set) shared among
// the ranks of its node (from the launcher's environment).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>

#include "prestage/options.hpp"

namespace prestage::detail {

// The CPUs this process may run on: sched_getaffinity's count, capped by the cgroup v2 quota
// (cpu.max "quota period", rounded up) of its cgroup and of every cgroup above it. `why` says
// where the figure came from. The roots are parameters so that tests can give a fake tree.
uint64_t usable_cpus(std::string& why, const std::string& cgroup_root = "/sys/fs/cgroup",
                     const std::string& self_cgroup = "/proc/self/cgroup");

// The bytes of memory this process may use: the machine's (sysconf), capped by the tightest cgroup
// v2 memory.max of its cgroup and every cgroup above it. `why` says where the figure came from.
uint64_t usable_memory(std::string& why, const std::string& cgroup_root = "/sys/fs/cgroup",
                       const std::string& self_cgroup = "/proc/self/cgroup");

// The ranks that share this node, from the first launcher variable set among LOCAL_WORLD_SIZE
// (torchrun), SLURM_NTASKS_PER_NODE (srun; "4(x2)" forms taken by their first count),
// OMPI_COMM_WORLD_LOCAL_SIZE (Open MPI), MPI_LOCALNRANKS (MPICH); 1 if none. `env` looks a
// variable up (null: unset).
uint64_t local_ranks(std::string& why,
                     const std::function<const char*(const char*)>& env = nullptr);

// Fills the thread options left at LoaderOptions::kAuto from `cpus` usable CPUs shared by `ranks`
// ranks, and says what it chose and why in `why` (empty when every value was given):
//  - readers (decode, CPU bound): this rank's share of the CPUs, less one from 4 up for the
//    training loop's own thread (below 4 the share is too small to give one away: when stage 3
//    is ahead its threads sleep, and when it is behind the loop is waiting for it anyway);
//  - prefetchers (I/O bound, mostly waiting on the file system): twice the readers, 16 to 64
//    (16 measured at least as fast as 4 in every scenario of benchmarks/autotune_bench.py on 2
//    CPUs, and the self-tuning climbs from there in fewer steps);
//  - lookahead: 8 batches (enough copies for 16 reads in flight to stay busy).
// Values the user gave are kept as they are. fit_to_memory() then lowers what was chosen where the
// files are large.
void size_to_machine(LoaderTuningOptions& options, uint64_t cpus, uint64_t ranks, std::string& why);

// Lowers the prefetchers and lookahead that size_to_machine() chose (not `pinned`: given by the
// user) to what half the memory `budget` holds each -- a stage 2 thread holds one file of
// `mean_file_bytes` at a time, a batch read ahead up to kReadAheadBytesPerBatch of
// `mean_sample_bytes` samples -- never below 4. Appends what it lowered, and why, to `why`.
void fit_to_memory(LoaderOptions& options, const std::array<bool, 3>& pinned, uint64_t budget,
                   uint64_t mean_file_bytes, uint64_t mean_sample_bytes, std::string& why);

// The most the self-tuning may raise each thread option to (LoaderOptions::autotune): readers up to
// this rank's share of the CPUs; reads in flight (prefetchers) up to 128, and as many files as half
// the memory budget holds (a stage 2 thread holds one file at a time); lookahead up to 32, and as
// many batches as the other half holds in read-ahead (up to 64 MiB a batch). A value the user gave
// (pinned), or any with autotune off, stays as it is. `options` has been sized to the machine.
inline constexpr uint64_t kMaxReadsInFlight = 128;
inline constexpr uint64_t kMaxLookahead = 32;
inline constexpr uint64_t kReadAheadBytesPerBatch = uint64_t{64} << 20;  // graph.cpp's budget
struct TuneLimits {
  uint64_t readers = 0, prefetchers = 0, lookahead = 0;
};
TuneLimits tune_limits(const LoaderOptions& options, const std::array<bool, 3>& pinned,
                       uint64_t cpus, uint64_t ranks, uint64_t budget, uint64_t mean_file_bytes,
                       uint64_t mean_sample_bytes);

}  // namespace prestage::detail
