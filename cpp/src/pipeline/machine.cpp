#include "pipeline/machine.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

namespace prestage::detail {

namespace {

// The cgroup v2 path of this process ("0::/some/path"), or empty.
std::string own_cgroup(const std::string& self_cgroup) {
  std::ifstream in(self_cgroup);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("0::", 0) == 0) return line.substr(3);
  }
  return {};
}

// cpu.max of one cgroup directory: the CPUs its quota allows (rounded up), or 0 for no quota.
uint64_t quota_cpus(const std::string& dir) {
  std::ifstream in(dir + "/cpu.max");
  std::string quota;
  uint64_t period = 0;
  if (!(in >> quota >> period) || quota == "max" || period == 0) return 0;
  char* end = nullptr;
  const unsigned long long q = std::strtoull(quota.c_str(), &end, 10);
  if (end == quota.c_str() || *end != '\0' || q == 0) return 0;
  return std::max<uint64_t>(1, (q + period - 1) / period);
}

// memory.max of one cgroup directory in bytes, or 0 for no limit.
uint64_t memory_limit(const std::string& dir) {
  std::ifstream in(dir + "/memory.max");
  std::string limit;
  if (!(in >> limit) || limit == "max") return 0;
  char* end = nullptr;
  const unsigned long long bytes = std::strtoull(limit.c_str(), &end, 10);
  return end != limit.c_str() && *end == '\0' ? bytes : 0;
}

// The smallest non-zero `limit(dir)` from the process's cgroup up to the root, and where it is.
template <typename Limit>
uint64_t tightest(const std::string& cgroup_root, const std::string& self_cgroup, Limit limit,
                  std::string& at) {
  std::string path = own_cgroup(self_cgroup);
  uint64_t best = 0;
  while (!path.empty()) {
    const uint64_t v = limit(cgroup_root + (path == "/" ? "" : path));
    if (v != 0 && (best == 0 || v < best)) {
      best = v;
      at = path;
    }
    if (path == "/") break;
    const size_t slash = path.find_last_of('/');
    path = slash == 0 ? "/" : path.substr(0, slash);
  }
  return best;
}

uint64_t first_count(const char* value) {
  if (value == nullptr) return 0;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(value, &end, 10);
  return end != value ? n : 0;
}

}  // namespace

uint64_t usable_cpus(std::string& why, const std::string& cgroup_root,
                     const std::string& self_cgroup) {
  uint64_t cpus = 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) cpus = static_cast<uint64_t>(CPU_COUNT(&set));
  std::ostringstream out;
  if (cpus == 0) {
    cpus = 1;
    out << "affinity unknown";
  } else {
    out << cpus << " in this process's affinity";
  }
  std::string quota_at;
  const uint64_t quota = tightest(cgroup_root, self_cgroup, quota_cpus, quota_at);
  if (quota != 0 && quota < cpus) {
    out << ", " << quota << " by the cgroup quota of " << quota_at;
    cpus = quota;
  }
  why = out.str();
  return cpus;
}

uint64_t usable_memory(std::string& why, const std::string& cgroup_root,
                       const std::string& self_cgroup) {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  uint64_t bytes = pages > 0 && page > 0
                       ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page)
                       : uint64_t{1} << 30;
  std::ostringstream out;
  out << (bytes >> 20) << " MiB on the machine";
  std::string limit_at;
  const uint64_t limit = tightest(cgroup_root, self_cgroup, memory_limit, limit_at);
  if (limit != 0 && limit < bytes) {
    out << ", " << (limit >> 20) << " MiB by the cgroup limit of " << limit_at;
    bytes = limit;
  }
  why = out.str();
  return bytes;
}

uint64_t local_ranks(std::string& why, const std::function<const char*(const char*)>& env) {
  const auto get = [&](const char* name) { return env ? env(name) : std::getenv(name); };
  for (const char* name : {"LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE",
                           "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
    const uint64_t n = first_count(get(name));
    if (n != 0) {
      why = std::to_string(n) + " ranks on this node (" + name + ")";
      return n;
    }
  }
  why = "1 rank on this node (no launcher variable)";
  return 1;
}

void size_to_machine(LoaderTuningOptions& options, uint64_t cpus, uint64_t ranks,
                     std::string& why) {
  const bool any = options.readers == LoaderTuningOptions::kAuto ||
                   options.prefetchers == LoaderTuningOptions::kAuto ||
                   options.lookahead == LoaderTuningOptions::kAuto;
  why.clear();
  if (!any) return;
  const uint64_t share = std::max<uint64_t>(1, cpus / std::max<uint64_t>(1, ranks));
  std::vector<std::string> chosen;
  if (options.readers == LoaderTuningOptions::kAuto) {
    options.readers = share >= 4 ? share - 1 : share;
    chosen.push_back("readers " + std::to_string(options.readers));
  }
  if (options.prefetchers == LoaderTuningOptions::kAuto) {
    options.prefetchers = std::clamp<uint64_t>(2 * options.readers, 16, 64);
    chosen.push_back("prefetchers " + std::to_string(options.prefetchers));
  }
  if (options.lookahead == LoaderTuningOptions::kAuto) {
    options.lookahead = 8;
    chosen.push_back("lookahead " + std::to_string(options.lookahead));
  }
  std::string list;
  for (const std::string& c : chosen) list += (list.empty() ? "" : ", ") + c;
  why = list + " from " + std::to_string(share) + " CPUs for this rank (" + std::to_string(cpus) +
        " usable / " + std::to_string(std::max<uint64_t>(1, ranks)) + " ranks)";
}

namespace {

// How many items of `item_bytes` half of `budget` holds (unknown sizes: no limit).
uint64_t half_holds(uint64_t budget, uint64_t item_bytes) {
  return item_bytes == 0 ? UINT64_MAX : budget / 2 / item_bytes;
}

uint64_t batch_bytes(const LoaderOptions& options, uint64_t mean_sample_bytes) {
  return std::min<uint64_t>(kReadAheadBytesPerBatch, std::max<uint64_t>(1, mean_sample_bytes) *
                                                         std::max<uint64_t>(1, options.batch_size));
}

}  // namespace

void fit_to_memory(LoaderOptions& options, const std::array<bool, 3>& pinned, uint64_t budget,
                   uint64_t mean_file_bytes, uint64_t mean_sample_bytes, std::string& why) {
  constexpr uint64_t kFloor = 4;
  const auto lower = [&](uint64_t& value, uint64_t holds, const char* name) {
    const uint64_t to = std::max(kFloor, std::min(value, holds));
    if (to >= value) return;
    why += std::string(why.empty() ? "" : "; ") + name + " lowered from " + std::to_string(value) +
           " to " + std::to_string(to) + " to fit half the memory budget of " +
           std::to_string(budget >> 20) + " MiB";
    value = to;
  };
  if (!pinned[1] && mean_file_bytes != 0) {
    lower(options.prefetchers, half_holds(budget, mean_file_bytes), "prefetchers");
  }
  if (!pinned[2]) {
    lower(options.lookahead, half_holds(budget, batch_bytes(options, mean_sample_bytes)),
          "lookahead");
  }
}

TuneLimits tune_limits(const LoaderOptions& options, const std::array<bool, 3>& pinned,
                       uint64_t cpus, uint64_t ranks, uint64_t budget, uint64_t mean_file_bytes,
                       uint64_t mean_sample_bytes) {
  TuneLimits limits{options.readers, options.prefetchers, options.lookahead};
  if (!options.autotune) return limits;
  const uint64_t share = std::max<uint64_t>(1, cpus / std::max<uint64_t>(1, ranks));
  if (!pinned[0]) limits.readers = std::max(options.readers, share);
  if (!pinned[1]) {
    const uint64_t files = half_holds(budget, std::max<uint64_t>(1, mean_file_bytes));
    limits.prefetchers =
        std::max(options.prefetchers, std::min<uint64_t>(kMaxReadsInFlight, files));
  }
  if (!pinned[2]) {
    limits.lookahead =
        std::max(options.lookahead,
                 std::min<uint64_t>(kMaxLookahead,
                                    half_holds(budget, batch_bytes(options, mean_sample_bytes))));
  }
  return limits;
}

}  // namespace prestage::detail
