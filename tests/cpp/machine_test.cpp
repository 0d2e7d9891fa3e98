// Defaults sized to the machine: usable CPUs from affinity and a cgroup v2 quota (a fake cgroup
// tree), the node's ranks from the launcher's environment, and the thread counts they give.
#include <doctest/doctest.h>

#include <sched.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "pipeline/machine.hpp"
#include "prestage/loader.hpp"
#include "test_util.hpp"

using prestage::LoaderOptions;
using prestage::detail::local_ranks;
using prestage::detail::size_to_machine;
using prestage::detail::usable_cpus;
using prestage::test::TempDir;

namespace {

void write(const std::filesystem::path& p, const std::string& text) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

uint64_t affinity() {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(sched_getaffinity(0, sizeof(set), &set) == 0);
  return static_cast<uint64_t>(CPU_COUNT(&set));
}

}  // namespace

TEST_CASE("machine: usable CPUs are the affinity's, capped by the tightest cgroup quota above") {
  TempDir dir;
  const auto root = dir / "cgroup";
  write(dir / "self", "0::/slurm/job1/step0\n");
  std::string why;
  // No cpu.max anywhere: the affinity.
  std::filesystem::create_directories(root / "slurm/job1/step0");
  CHECK(usable_cpus(why, root.string(), (dir / "self").string()) == affinity());
  CHECK(why.find("affinity") != std::string::npos);
  // "max": no quota.
  write(root / "slurm/job1/step0/cpu.max", "max 100000\n");
  CHECK(usable_cpus(why, root.string(), (dir / "self").string()) == affinity());
  // A quota of half a CPU above: rounded up to one, whatever the affinity.
  write(root / "slurm/cpu.max", "50000 100000\n");
  CHECK(usable_cpus(why, root.string(), (dir / "self").string()) == 1);
  CHECK(why.find("/slurm") != std::string::npos);
  // A quota larger than the affinity does not raise it.
  write(root / "slurm/cpu.max", "6400000 100000\n");
  CHECK(usable_cpus(why, root.string(), (dir / "self").string()) == affinity());
  // A malformed file or a missing /proc entry: no quota.
  write(root / "slurm/cpu.max", "lots\n");
  CHECK(usable_cpus(why, root.string(), (dir / "self").string()) == affinity());
  CHECK(usable_cpus(why, root.string(), (dir / "missing").string()) == affinity());
}

TEST_CASE("machine: the node's ranks come from the first launcher variable set") {
  std::map<std::string, std::string> vars;
  const auto env = [&](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
  std::string why;
  CHECK(local_ranks(why, env) == 1);
  vars["OMPI_COMM_WORLD_LOCAL_SIZE"] = "8";
  CHECK(local_ranks(why, env) == 8);
  CHECK(why.find("OMPI_COMM_WORLD_LOCAL_SIZE") != std::string::npos);
  vars["SLURM_NTASKS_PER_NODE"] = "4(x2)";
  CHECK(local_ranks(why, env) == 4);
  vars["LOCAL_WORLD_SIZE"] = "2";
  CHECK(local_ranks(why, env) == 2);
  vars["LOCAL_WORLD_SIZE"] = "garbage";  // unusable: the next one
  CHECK(local_ranks(why, env) == 4);
}

TEST_CASE("machine: thread counts from the rank's share of the CPUs; given values are kept") {
  std::string why;
  LoaderOptions o;
  size_to_machine(o, 16, 1, why);
  CHECK(o.readers == 15);
  CHECK(o.prefetchers == 30);
  CHECK(o.lookahead == 8);
  CHECK(why.find("readers 15") != std::string::npos);

  LoaderOptions shared;
  size_to_machine(shared, 16, 4, why);  // 4 ranks on a 16-CPU node
  CHECK(shared.readers == 3);
  CHECK(shared.prefetchers == 16);  // at least 16 reads in flight
  CHECK(shared.lookahead == 8);

  LoaderOptions small;
  size_to_machine(small, 2, 1, why);  // the share is too small to give a CPU away
  CHECK(small.readers == 2);
  CHECK(small.prefetchers == 16);

  LoaderOptions crowded;
  size_to_machine(crowded, 2, 8, why);  // more ranks than CPUs: one reader each
  CHECK(crowded.readers == 1);

  LoaderOptions given;
  given.readers = 5;
  given.lookahead = 2;
  size_to_machine(given, 64, 1, why);
  CHECK(given.readers == 5);
  CHECK(given.lookahead == 2);
  CHECK(given.prefetchers == 16);  // twice the readers given, at least 16
  CHECK(why.find("readers") == std::string::npos);

  LoaderOptions one_read;
  one_read.prefetchers = 1;
  size_to_machine(one_read, 2, 1, why);
  CHECK(one_read.prefetchers == 1);
  CHECK(one_read.lookahead == 8);

  LoaderOptions all;
  all.readers = 1, all.prefetchers = 1, all.lookahead = 1;
  size_to_machine(all, 64, 1, why);
  CHECK(why.empty());
}

TEST_CASE("machine: a loader with no thread option says what it chose") {
  TempDir dir;
  std::filesystem::create_directories(dir / "src");
  prestage::test::write_file(dir / "src/a", std::vector<unsigned char>(10, 1));
  const auto catalog = prestage::Catalog::from_paths(dir / "src", {"a"});
  LoaderOptions o;
  o.decode = prestage::DecodeMode::kRaw;
  o.batch_size = 1;
  prestage::Loader loader(catalog, o);
  CHECK(loader.options().readers >= 1);
  CHECK(loader.options().prefetchers >= 4);
  const prestage::Stats s = loader.stats();
  CHECK(s.usable_cpus >= 1);
  CHECK(s.local_ranks >= 1);
  CHECK(s.threads_why.find("readers") != std::string::npos);
  LoaderOptions fixed = o;
  fixed.readers = 1, fixed.prefetchers = 1, fixed.lookahead = 1;
  prestage::Loader pinned(catalog, fixed);
  CHECK(pinned.options().readers == 1);
  CHECK(pinned.stats().threads_why.empty());
}

TEST_CASE(
    "machine: usable memory is the machine's, capped by the tightest cgroup memory.max above") {
  TempDir dir;
  const auto root = dir / "cgroup";
  write(dir / "self", "0::/job/step\n");
  std::filesystem::create_directories(root / "job/step");
  std::string why;
  const uint64_t machine =
      prestage::detail::usable_memory(why, root.string(), (dir / "self").string());
  CHECK(machine > (uint64_t{64} << 20));
  CHECK(why.find("machine") != std::string::npos);
  write(root / "job/step/memory.max", "max\n");
  CHECK(prestage::detail::usable_memory(why, root.string(), (dir / "self").string()) == machine);
  write(root / "job/memory.max", "1073741824\n");
  write(root / "job/step/memory.max", "2147483648\n");
  CHECK(prestage::detail::usable_memory(why, root.string(), (dir / "self").string()) ==
        std::min<uint64_t>(machine, uint64_t{1} << 30));
  CHECK(why.find("/job") != std::string::npos);
  write(root / "job/memory.max", "garbage\n");
  CHECK(prestage::detail::usable_memory(why, root.string(), (dir / "self").string()) ==
        std::min<uint64_t>(machine, uint64_t{2} << 30));
}

TEST_CASE(
    "machine: the self-tuning's limits come from the CPUs and the memory budget; given values "
    "stay") {
  LoaderOptions o;
  o.batch_size = 256;
  std::string why;
  size_to_machine(o, 16, 2, why);  // readers 7, prefetchers 16, lookahead 8
  const std::array<bool, 3> none{false, false, false};
  const uint64_t gib = uint64_t{1} << 30;
  // 8 CPUs for this rank; 1 GiB: 512 MiB of 100 KB files, 512 MiB of 25.6 MB batches.
  auto l = prestage::detail::tune_limits(o, none, 16, 2, gib, 100'000, 100'000);
  CHECK(l.readers == 8);
  CHECK(l.prefetchers == prestage::detail::kMaxReadsInFlight);
  CHECK(l.lookahead == 20);  // 512 MiB / 25.6 MB
  // Shards of 1 GB: a budget of 4 GiB holds 2 in stage 2's threads, below the machine-sized 16.
  l = prestage::detail::tune_limits(o, none, 16, 2, 4 * gib, gib, 100'000);
  CHECK(l.prefetchers == 16);
  // A small budget never lowers a value below the one given (fit_to_memory lowers the values).
  l = prestage::detail::tune_limits(o, none, 16, 2, 1 << 20, 100'000, 100'000);
  CHECK(l.prefetchers == 16);
  CHECK(l.lookahead == 8);
  // Given values, or autotune off: the values themselves.
  l = prestage::detail::tune_limits(o, {true, true, true}, 16, 2, gib, 100'000, 100'000);
  CHECK((l.readers == 7 && l.prefetchers == 16 && l.lookahead == 8));
  o.autotune = false;
  l = prestage::detail::tune_limits(o, none, 16, 2, gib, 100'000, 100'000);
  CHECK((l.readers == 7 && l.prefetchers == 16 && l.lookahead == 8));
}

TEST_CASE(
    "machine: chosen prefetchers and lookahead fit half the memory budget each; given ones stay") {
  const std::array<bool, 3> none{false, false, false};
  const uint64_t gib = uint64_t{1} << 30;
  std::string why;
  LoaderOptions o;
  o.batch_size = 256;
  size_to_machine(o, 16, 1, why);  // readers 15, prefetchers 30, lookahead 8
  LoaderOptions fits = o;
  std::string fits_why;
  prestage::detail::fit_to_memory(fits, none, gib, 100'000, 100'000, fits_why);
  CHECK((fits.prefetchers == 30 && fits.lookahead == 8));  // 100 KB files: room for both
  CHECK(fits_why.empty());
  // Shards of 64 MiB with a 1 GiB budget: 8 in stage 2's threads; batches of 64 MiB (the read-ahead
  // budget): 8 of them.
  LoaderOptions big = o;
  std::string big_why;
  prestage::detail::fit_to_memory(big, none, gib, 64 << 20, 64 << 20, big_why);
  CHECK(big.prefetchers == 8);
  CHECK(big.lookahead == 8);
  CHECK(big_why.find("prefetchers lowered from 30 to 8") != std::string::npos);
  // Files of 1 GiB and a budget of 256 MiB (room for 0 files and 2 batches): never below 4.
  prestage::detail::fit_to_memory(big, none, gib / 4, gib, gib, big_why);
  CHECK((big.prefetchers == 4 && big.lookahead == 4));
  // Given values stay; an unknown file size lowers nothing.
  LoaderOptions given = o;
  prestage::detail::fit_to_memory(given, {true, true, true}, gib, gib, gib, why);
  CHECK((given.prefetchers == 30 && given.lookahead == 8));
  LoaderOptions unknown = o;
  std::string unknown_why;
  prestage::detail::fit_to_memory(unknown, none, gib, 0, 0, unknown_why);
  CHECK(unknown.prefetchers == 30);
  CHECK(unknown_why.empty());
}
