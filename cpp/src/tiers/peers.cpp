#include "tiers/peers.hpp"

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

#include "prestage/error.hpp"
#include "util/crc32c.hpp"
#include "util/file_io.hpp"

namespace prestage::detail {

Ownership Ownership::compute(const std::vector<uint64_t>& file_of,
                             const std::vector<uint64_t>& file_size, PlanOptions plan,
                             uint64_t epoch, const std::vector<uint64_t>& node_of,
                             const std::vector<uint64_t>& budget_of) {
  Ownership own;
  own.owner.assign(file_size.size(), kNoOwner);
  own.home.assign(file_size.size(), 0);
  plan.rank = 0;
  const EpochPlan e(plan, epoch);
  // Per node, its files in order of first use: the order its home budget is spent in.
  std::map<uint64_t, std::vector<uint64_t>> by_node;
  for (uint64_t b = 0; b < e.num_batches(); ++b) {
    for (uint64_t r = 0; r < plan.world_size; ++r) {
      const uint64_t* ids = e.batch_of(b, r);
      for (uint64_t k = 0; k < e.batch_size(b); ++k) {
        const uint64_t f = file_of[ids[k]];
        if (own.owner[f] != kNoOwner) continue;
        own.owner[f] = r;
        by_node[node_of[r]].push_back(f);
      }
    }
  }
  std::map<uint64_t, uint64_t> budget;  // per node: the budget of its lowest rank
  for (uint64_t r = plan.world_size; r-- > 0;) budget[node_of[r]] = budget_of[r];
  for (const auto& [node, files] : by_node) {
    const uint64_t limit = budget[node];
    uint64_t used = 0;
    for (const uint64_t f : files) {
      if (limit != 0 && (file_size[f] > limit - used)) break;  // the rest are beyond the budget
      used += file_size[f];
      own.home[f] = 1;
    }
  }
  return own;
}

TransportStart Peers::plugin(std::string& why) {
  static std::once_flag once;
  static TransportStart start = nullptr;
  static std::string reason;
  std::call_once(once, [] {
    std::vector<std::string> tried;
    if (const char* path = std::getenv("PRESTAGE_MPI_PLUGIN"); path != nullptr && *path != '\0') {
      tried.emplace_back(path);
    } else {
      // Beside the object that holds this code (the Python extension, or the program or shared
      // library linking prestage), then where the dynamic loader looks.
      Dl_info info;
      if (dladdr(reinterpret_cast<void*>(&Peers::plugin), &info) != 0 &&
          info.dli_fname != nullptr) {
        tried.push_back(
            (std::filesystem::path(info.dli_fname).parent_path() / kTransportPlugin).string());
      }
      tried.emplace_back(kTransportPlugin);
    }
    std::string errors;
    for (const std::string& path : tried) {
      // Global: MPI's own components, which it opens itself, need the MPI library's symbols.
      void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
      if (handle == nullptr) {
        const char* e = dlerror();
        errors += std::string(errors.empty() ? "" : "; ") + (e != nullptr ? e : path);
        continue;
      }
      start = reinterpret_cast<TransportStart>(dlsym(handle, kTransportStartSymbol));
      if (start != nullptr) return;
      errors += "; " + path + " has no " + kTransportStartSymbol;
    }
    reason = std::string("plugin missing: ") + kTransportPlugin + " could not be opened (" +
             errors + ")";
  });
  why = reason;
  return start;
}

namespace {

uint64_t file_bytes(const Catalog& catalog, uint64_t f) {
  const uint64_t known = catalog.file_size(f);
  if (known != Catalog::kUnknownSize) return known;
  struct stat st;
  if (::stat(catalog.file_source_path(f).c_str(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_size);
}

// PRESTAGE_NODE: ranks given the same number form one node (tests emulate nodes on one host).
int64_t node_override() {
  const char* value = std::getenv("PRESTAGE_NODE");
  if (value == nullptr || *value == '\0') return -1;
  char* end = nullptr;
  const long long n = std::strtoll(value, &end, 10);
  if (*end != '\0' || n < 0) {
    throw ConfigError(std::string("PRESTAGE_NODE must be a number >= 0, not '") + value + "'");
  }
  return n;
}

// PRESTAGE_PEER_LINK="LATENCY_MS,MBS": an emulated peer link (see Peers::emulate_link).
void link_override(double& latency_s, double& bytes_per_s) {
  const char* value = std::getenv("PRESTAGE_PEER_LINK");
  if (value == nullptr || *value == '\0') return;
  char* end = nullptr;
  const double ms = std::strtod(value, &end);
  double mbs = 0;
  bool ok = end != value && *end == ',' && ms >= 0;
  if (ok) {
    const char* rest = end + 1;
    mbs = std::strtod(rest, &end);
    ok = end != rest && *end == '\0' && mbs > 0;
  }
  if (!ok) {
    throw ConfigError(std::string("PRESTAGE_PEER_LINK must be LATENCY_MS,MBS (e.g. 2,100), not '") +
                      value + "'");
  }
  latency_s = ms / 1000;
  bytes_per_s = mbs * 1e6;
}

}  // namespace

Peers::Peers(const Catalog& catalog, const PlanOptions& plan, StageDirectory* stage,
             uint64_t home_budget, const PeerOptions& options)
    : catalog_(catalog), plan_(plan), stage_(stage), options_(options), pid_(::getpid()) {
  if (plan.world_size < 2) {
    why_off_ = "world_size 1: no other rank to fetch from";
    return;
  }
  link_override(link_latency_s_, link_bytes_per_s_);
  std::string why;
  const TransportStart start = options.start != nullptr ? options.start : plugin(why);
  if (start == nullptr) {
    why_off_ = why;
    return;
  }
  TransportConfig config;
  config.comm = options.comm;
  config.comm_fortran = options.comm_fortran;
  config.node_override = node_override();
  config.expect_rank = plan.rank;
  config.expect_world_size = plan.world_size;
  config.value = home_budget;
  config.serve = [this](const PeerRange& range, std::vector<std::byte>& bytes, PeerCheck& check) {
    return serve(range, bytes, check);
  };
  transport_.reset(start(&config, &why));
  if (transport_ == nullptr) {
    why_off_ = why;
    return;
  }
  node_of_ = transport_->nodes();
  declined_ = std::make_unique<std::atomic<uint8_t>[]>(catalog.num_files());
  for (uint64_t f = 0; f < catalog.num_files(); ++f) {
    declined_[f].store(0, std::memory_order_relaxed);
  }
  down_ = std::make_unique<std::atomic<uint8_t>[]>(node_of_.size());
  gone_ = std::make_unique<std::atomic<uint8_t>[]>(node_of_.size());
  for (size_t r = 0; r < node_of_.size(); ++r) {
    down_[r].store(0, std::memory_order_relaxed);
    gone_[r].store(0, std::memory_order_relaxed);
  }
}

Peers::~Peers() {
  stop();
  // In a forked process the transport's thread and MPI state are the parent's: joining that thread
  // or freeing its state would hang or crash, so the copy is left as it is.
  if (::getpid() != pid_) (void)transport_.release();
}

void Peers::stop() {
  if (transport_ && ::getpid() == pid_) transport_->stop();
}

void Peers::set_quiet(bool quiet) {
  if (transport_ && ::getpid() == pid_) transport_->set_quiet(quiet);
}

void Peers::start_epoch(uint64_t epoch) {
  if (!on()) return;
  std::call_once(computed_, [&] {
    std::vector<uint64_t> file_of(catalog_.size()), sizes(catalog_.num_files());
    for (uint64_t s = 0; s < file_of.size(); ++s) file_of[s] = catalog_.locator(s).file;
    for (uint64_t f = 0; f < sizes.size(); ++f) sizes[f] = file_bytes(catalog_, f);
    own_ = Ownership::compute(file_of, sizes, plan_, epoch, node_of_, transport_->values());
    // The first sample of the start epoch's first batch of the lowest rank on another node.
    for (uint64_t r = 0; r < node_of_.size(); ++r) {
      if (node_of_[r] == node_of_[plan_.rank]) continue;
      PlanOptions theirs = plan_;
      theirs.rank = r;
      const EpochPlan plan(theirs, epoch);
      if (plan.num_batches() == 0 || plan.batch_size(0) == 0) break;
      const uint64_t sample = plan.batch(0)[0];
      const uint64_t owner = own_.owner[catalog_.locator(sample).file];
      if (owner != Ownership::kNoOwner && own_.home[catalog_.locator(sample).file] != 0 &&
          node_of_[owner] == node_of_[r]) {
        early_sample_ = sample;
        early_owner_ = owner;
      }
      break;
    }
    ready_.store(true, std::memory_order_release);
  });
}

void Peers::not_coming(uint64_t file) noexcept {
  if (declined_) declined_[file].store(1, std::memory_order_release);
}

bool Peers::not_here(uint64_t file) const {
  return declined_[file].load(std::memory_order_acquire) != 0 || gone_from_node(file);
}

bool Peers::home_here(uint64_t file) const {
  const uint64_t owner = own_.owner[file];
  return own_.home[file] != 0 && node_of_[owner] == node_of_[plan_.rank];
}

Peers::Fetched Peers::home(const Catalog::Locator& loc, uint64_t& owner) const {
  if (!on() || closing() || !ready_.load(std::memory_order_acquire) || ::getpid() != pid_) {
    return Fetched::kNone;
  }
  owner = own_.owner[loc.file];
  if (owner == Ownership::kNoOwner || !own_.home[loc.file]) return Fetched::kNone;
  if (node_of_[owner] == node_of_[plan_.rank])
    return stage_ != nullptr ? Fetched::kLocal : Fetched::kNone;
  return Fetched::kPeer;
}

bool Peers::early_probe(uint64_t& sample, uint64_t& owner) const {
  if (!on() || closing() || !ready_.load(std::memory_order_acquire) || ::getpid() != pid_ ||
      early_owner_ == Ownership::kNoOwner) {
    return false;
  }
  sample = early_sample_;
  owner = early_owner_;
  return true;
}

void Peers::emulate_link(uint64_t bytes) {
  if (link_bytes_per_s_ <= 0) return;
  const auto transfer = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(static_cast<double>(bytes) / link_bytes_per_s_));
  const auto latency = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(link_latency_s_));
  std::chrono::steady_clock::time_point until;
  {
    std::lock_guard lock(link_mutex_);
    link_free_ = std::max(link_free_, std::chrono::steady_clock::now()) + transfer;
    until = link_free_ + latency;
  }
  std::this_thread::sleep_until(until);
}

Peers::Fetched Peers::fetch(const Catalog::Locator& loc, std::vector<std::byte>& out,
                            std::chrono::microseconds* held, Count count) {
  const bool counted = count == Count::kRead;
  std::chrono::microseconds ignored{0};
  std::chrono::microseconds& waited = held != nullptr ? *held : ignored;
  waited = std::chrono::microseconds{0};
  if (!on() || closing() || !ready_.load(std::memory_order_acquire) || ::getpid() != pid_) {
    return Fetched::kNone;
  }
  const uint64_t owner = own_.owner[loc.file];
  if (owner == Ownership::kNoOwner) return Fetched::kNone;
  if (!own_.home[loc.file]) {
    if (counted) beyond_.fetch_add(1, std::memory_order_relaxed);
    return Fetched::kNone;
  }
  if (node_of_[owner] == node_of_[plan_.rank]) return local(loc, out, waited);
  std::vector<std::byte> bytes;
  PeerCheck check;
  const auto fall_back = [&](bool corrupt) {
    if (!counted) return Fetched::kNone;
    fallbacks_.fetch_add(1, std::memory_order_relaxed);
    if (corrupt) corrupt_.fetch_add(1, std::memory_order_relaxed);
    return Fetched::kNone;
  };
  // A peer that said goodbye has closed its loader on purpose (its job is ending): reading the
  // source instead is no failure of the tier, and is not counted as a fallback.
  if (down_[owner].load(std::memory_order_acquire)) {
    return gone_[owner].load(std::memory_order_relaxed) ? Fetched::kNone : fall_back(false);
  }
  RequestEnd end = RequestEnd::kReply;
  const bool whole = loc.length == Catalog::kWholeFile;
  const PeerRange range{loc.file, whole ? 0 : loc.offset, whole ? PeerRange::kWhole : loc.length};
  const bool answered =
      transport_->request(owner, range, options_.timeout, bytes, check, &end, &waited);
  if (answered) emulate_link(bytes.size());
  if (answered && !counted) {
    // A probe's answer is counted whatever its checks find: its owner counted it served.
    probes_.fetch_add(1, std::memory_order_relaxed);
    probe_bytes_.fetch_add(bytes.size(), std::memory_order_relaxed);
  }
  if (!answered) {
    if (end == RequestEnd::kGone) gone_[owner].store(1, std::memory_order_relaxed);
    if ((end == RequestEnd::kNoAnswer || end == RequestEnd::kGone) &&
        down_[owner].exchange(1, std::memory_order_acq_rel) == 0) {
      (end == RequestEnd::kGone ? closed_count_ : down_count_)
          .fetch_add(1, std::memory_order_relaxed);
    }
    return end == RequestEnd::kGone ? Fetched::kNone : fall_back(false);
  }
  // The owner's copy is the file the catalog knows (its size), and the bytes are those it read
  // from it for the range asked (their length and CRC).
  const uint64_t size = catalog_.file_size(loc.file);
  if ((size != Catalog::kUnknownSize && check.file_size != size) ||
      bytes.size() != (whole ? check.file_size : loc.length) || crc32c(bytes) != check.crc) {
    return fall_back(true);
  }
  // A read, counted by the tiers' ledger once a reader has its bytes (PeerCounts).
  out = std::move(bytes);
  return Fetched::kPeer;
}

Peers::Fetched Peers::local(const Catalog::Locator& loc, std::vector<std::byte>& out,
                            std::chrono::microseconds& waited) {
  if (stage_ == nullptr) return Fetched::kNone;
  const auto asked = std::chrono::steady_clock::now();
  const auto until = asked + options_.timeout;
  while (true) {
    stage_->take_over_published();
    if (stage_->is_staged(loc.file)) {
      waited = std::chrono::duration_cast<std::chrono::microseconds>(
          std::chrono::steady_clock::now() - asked);
      // Read as the stage directory serves a copy to a reader of its bytes: a copy that fails is
      // removed, and the caller reads the source.
      const bool whole = loc.length == Catalog::kWholeFile;
      std::vector<std::byte> copy;
      return stage_->read_checked(loc.file, whole ? 0 : loc.offset,
                                  whole ? StageDirectory::kWholeCopy : loc.length, out, copy)
                 ? Fetched::kLocal
                 : Fetched::kNone;
    }
    // The wait is for a home copy that is coming (the start epoch's first copy). One that was on
    // the node and is gone (evicted, found corrupt), or that this process declined to copy, is
    // not: the source is read now.
    if (not_here(loc.file) || closing() || std::chrono::steady_clock::now() >= until) {
      return Fetched::kNone;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

bool Peers::gone_from_node(uint64_t file) const {
  // Published once and no longer on disk (evicted, or removed as corrupt). A copy on disk that
  // this process has not taken over yet (it may be waiting for its neighbour's lock on it) is
  // coming.
  NodeTable& node = stage_->node();
  return node.ever_published(file) && !node.on_disk(file);
}

PeerAnswer Peers::serve(const PeerRange& range, std::vector<std::byte>& bytes, PeerCheck& check) {
  const uint64_t file = range.file;
  if (!ready_.load(std::memory_order_acquire)) return PeerAnswer::kLater;  // e0 not started here
  if (stage_ == nullptr || file >= own_.home.size() || !home_here(file)) return PeerAnswer::kAbsent;
  stage_->take_over_published();  // a copy a neighbour on this node made
  if (!stage_->is_staged(file)) {
    // Its copy is coming (e0), unless it was here and is gone (evicted, found corrupt) or this
    // node declined it (no room under its own uses): then none is.
    return not_here(file) ? PeerAnswer::kAbsent : PeerAnswer::kLater;
  }
  check.file_size = stage_->staged_size(file);
  const bool whole = range.length == PeerRange::kWhole;
  // Never a wrong byte: the copy is checked against its record before any of it is sent, as the
  // node's own readers are served one. A copy that changed on this node's SSD is removed here too,
  // not only refused by the asker. A range the copy does not hold (a locator that does not fit its
  // file) is none of this copy's.
  std::vector<std::byte> copy;  // read (and checked) only where the copy is checked whole
  if (!stage_->read_checked(file, range.offset, whole ? StageDirectory::kWholeCopy : range.length,
                            bytes, copy)) {
    return PeerAnswer::kAbsent;
  }
  // The CRC-32C of the bytes sent (for a whole copy, the one its record holds, checked above).
  check.crc = whole ? stage_->staged_crc(file) : crc32c(bytes);
  served_.fetch_add(1, std::memory_order_relaxed);
  served_bytes_.fetch_add(bytes.size(), std::memory_order_relaxed);
  return PeerAnswer::kServed;
}

PeerCounts Peers::counts() const {
  PeerCounts c;
  c.probes = probes_.load(std::memory_order_relaxed);
  c.probe_bytes = probe_bytes_.load(std::memory_order_relaxed);
  c.fallbacks = fallbacks_.load(std::memory_order_relaxed);
  c.corrupt = corrupt_.load(std::memory_order_relaxed);
  c.beyond_budget = beyond_.load(std::memory_order_relaxed);
  c.served = served_.load(std::memory_order_relaxed);
  c.served_bytes = served_bytes_.load(std::memory_order_relaxed);
  c.down = down_count_.load(std::memory_order_relaxed);
  c.closed = closed_count_.load(std::memory_order_relaxed);
  return c;
}

void Peers::add_to(Stats& stats, const Ledger& ledger) const {
  stats.peer_tier = on();
  stats.peer_tier_why = why_off();
  const TierCounts reads = ledger.all();
  stats.peer_reads = reads.reads[static_cast<size_t>(Tier::kPeer)];
  stats.peer_bytes = reads.bytes[static_cast<size_t>(Tier::kPeer)];
  const PeerCounts c = counts();
  stats.peer_probes = c.probes;
  stats.peer_probe_bytes = c.probe_bytes;
  stats.peer_fallbacks = c.fallbacks;
  stats.peer_corrupt = c.corrupt;
  stats.beyond_budget = c.beyond_budget;
  stats.peer_served = c.served;
  stats.peer_served_bytes = c.served_bytes;
  stats.peers_down = c.down;
  stats.peers_closed = c.closed;
}

}  // namespace prestage::detail
