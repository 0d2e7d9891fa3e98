#include "tiers/tiers.hpp"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "tiers/peers.hpp"
#include "util/file_io.hpp"

namespace prestage::detail {

namespace {

// A sample's bytes into `buffer`: exactly `size` of them when the catalog records it (a file that
// changed size since is an IoError, and the read costs no stat), else as many as it has.
void read_sized(const FileRef& file, const Catalog::Locator& loc, uint64_t size,
                std::vector<std::byte>& buffer) {
  if (size != Catalog::kUnknownSize) {
    buffer.resize(size);
    read_located(file, loc, std::span<std::byte>(buffer));
  } else {
    read_located(file, loc, buffer);
  }
}

// A read of a source the model tracks: queued there (by the model's choice, or by begin()), and on
// its end, however it ends, dequeued and (if it delivered) learned from.
class TimedRead {
 public:
  TimedRead(SourceModel* model, size_t source, uint64_t bytes, bool queued)
      : model_(model), source_(source), bytes_(bytes), start_(std::chrono::steady_clock::now()) {
    if (model_ != nullptr && !queued) model_->begin(source_, bytes_);
  }
  ~TimedRead() { end(false); }
  TimedRead(const TimedRead&) = delete;
  TimedRead& operator=(const TimedRead&) = delete;

  // `waited`: of the read's time, the wait for a copy still being made (not the source's doing).
  void end(bool ok, std::chrono::microseconds waited = std::chrono::microseconds{0}) {
    if (model_ == nullptr) return;
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start_ - waited;
    model_->done(source_, bytes_, took.count(), ok);
    model_ = nullptr;
  }

 private:
  SourceModel* model_;
  size_t source_;
  uint64_t bytes_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

// The source model's probes, made on a thread of their own, one at a time, so that no read waits
// on one: a probe's bytes are dropped once it is learned from. The thread starts at the first probe
// (most loaders never probe) and is joined by the destructor (in the process that started it: a
// forked copy of a loader has none of its threads).
class Tiers::Prober {
 public:
  Prober(Tiers& tiers, Peers& peers, SourceModel& model)
      : tiers_(tiers), peers_(peers), model_(model) {}
  ~Prober() { stop(); }
  Prober(const Prober&) = delete;
  Prober& operator=(const Prober&) = delete;

  // Waits for the probe under way, if any (the peer tier ends its wait when it stops), and starts
  // none from then on.
  void stop() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) {
      if (::getpid() == pid_) {
        thread_.join();
      } else {
        thread_.detach();
      }
    }
  }

  bool busy() const noexcept { return busy_.load(std::memory_order_acquire); }

  // Starts the probe of `source`: a fetch of sample `loc` there, moving `bytes`. Nothing starts
  // while another is under way, or once stopping (false).
  bool start(const Catalog::Locator& loc, size_t source, uint64_t bytes) {
    std::lock_guard lock(mutex_);
    if (stop_ || busy_.load(std::memory_order_relaxed)) return false;
    job_ = Job{loc, source, bytes};
    busy_.store(true, std::memory_order_release);
    model_.begin(source, bytes, SourceModel::Read::kProbe);
    if (!thread_.joinable()) {
      pid_ = ::getpid();
      thread_ = std::thread([this] {
        pthread_setname_np(pthread_self(), "prestage-probe");  // told apart in top -H, /proc
        run();
      });
    }
    wake_.notify_all();
    return true;
  }

 private:
  struct Job {
    Catalog::Locator loc;
    size_t source = 0;
    uint64_t bytes = 0;
  };

  void run() {
    std::vector<std::byte> bytes;
    std::unique_lock lock(mutex_);
    while (true) {
      wake_.wait(lock, [&] { return stop_ || busy_.load(std::memory_order_relaxed); });
      // A probe started before the stop is made (at once if the peer tier has stopped): every
      // probe begun is ended, and counted.
      if (!busy_.load(std::memory_order_relaxed)) return;
      const Job job = job_;
      lock.unlock();
      const auto start = std::chrono::steady_clock::now();
      std::chrono::microseconds waited{0};
      const Peers::Fetched fetched = peers_.fetch(job.loc, bytes, &waited, Peers::Count::kProbe);
      const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start - waited;
      lock.lock();
      busy_.store(false, std::memory_order_release);  // free before its estimate is seen
      lock.unlock();
      model_.done(job.source, job.bytes, took.count(), fetched != Peers::Fetched::kNone);
      if (job.source >= SourceModel::kPeer0) tiers_.update_quiet();  // a link's estimate changed
      lock.lock();
    }
  }

  Tiers& tiers_;
  Peers& peers_;
  SourceModel& model_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;              // guarded by mutex_
  Job job_;                        // guarded by mutex_
  std::atomic<bool> busy_{false};  // a probe started and not yet learned from (set under mutex_)
  std::thread thread_;
  pid_t pid_ = 0;
};

void SampleAt::check(std::span<const std::byte> read) const {
  checked = true;
  if (stage != nullptr && !stage->intact(file_id, read)) throw CorruptCopy{};
}

Tiers::Tiers(const Catalog& catalog, StageDirectory* stage, uint64_t max_read_bytes)
    : catalog_(catalog),
      stage_(stage),
      max_read_bytes_(max_read_bytes),
      stalled_(new std::atomic<uint8_t>[catalog.num_files()]()) {}

Tiers::~Tiers() = default;

void Tiers::stop_probes() {
  if (prober_ != nullptr) prober_->stop();
}

void Tiers::set_peers(Peers* peers, bool home_copy_always) {
  prober_.reset();
  peers_ = peers;
  quiet_.store(false, std::memory_order_relaxed);  // a transport starts not quiet
  model_.reset(peers != nullptr && peers->on() && !home_copy_always
                   ? new SourceModel(peers->ranks())
                   : nullptr);
  if (model_ == nullptr) return;
  prober_ = std::make_unique<Prober>(*this, *peers_, *model_);
  uint64_t known = 0, total = 0;
  for (uint64_t id = 0; id < catalog_.size(); ++id) {
    const uint64_t size = sample_size(id);
    if (size == Catalog::kUnknownSize) continue;
    ++known;
    total += size;
  }
  mean_sample_bytes_ = known != 0 ? total / known : 0;
  // Enough to learn a link (ModelParams::min_samples), with room for probes that fail (an owner
  // still making its copy answers "absent" after a while).
  early_probes_.store(static_cast<int>(4 * ModelParams{}.min_samples), std::memory_order_relaxed);
}

void Tiers::probe_links_early() {
  if (early_probes_.load(std::memory_order_relaxed) <= 0 || prober_->busy()) return;
  uint64_t sample = 0, owner = 0;
  const bool target = peers_->early_probe(sample, owner) && !peers_->down(owner);
  const uint64_t size = target ? sample_size(sample) : Catalog::kUnknownSize;
  const size_t link = SourceModel::kPeer0 + (target ? peers_->node_of(owner) : 0);
  if (size == Catalog::kUnknownSize || model_->learned(link)) {
    early_probes_.store(0, std::memory_order_relaxed);  // nothing to probe, or learned
    return;
  }
  if (prober_->start(catalog_.locator(sample), link, size)) {
    early_probes_.fetch_sub(1, std::memory_order_relaxed);
  }
}

SourceModel::Links Tiers::links() const {
  return model_ != nullptr ? model_->links_against_pfs(mean_sample_bytes_)
                           : SourceModel::Links::kUnknown;
}

bool Tiers::home_first() const {
  if (peers_ == nullptr) return false;
  if (model_ == nullptr) return true;  // home_copy_always
  const double by = home_first_.load(std::memory_order_relaxed) ? 1.0 : kHomeFirstBy;
  const bool now = model_->links_against_pfs(mean_sample_bytes_, by) == SourceModel::Links::kFaster;
  home_first_.store(now, std::memory_order_relaxed);
  return now;
}

void Tiers::update_quiet() {
  std::lock_guard lock(quiet_mutex_);
  const bool quiet = links() == SourceModel::Links::kSlower;
  if (quiet == quiet_.load(std::memory_order_relaxed)) return;
  quiet_.store(quiet, std::memory_order_relaxed);
  peers_->set_quiet(quiet);
}

void Tiers::refuse_if_stalled(uint64_t file, const std::string& path) {
  if (stalled_[file].load(std::memory_order_relaxed) == 0 ||
      stalled_[file].exchange(0, std::memory_order_acq_rel) == 0) {
    return;
  }
  throw IoError(path, ETIMEDOUT,
                "'" + path + "': stage 2's read of it ran past io_timeout; not read again for this batch");
}

uint64_t Tiers::sample_size(uint64_t id) const {
  const Catalog::Locator loc = catalog_.locator(id);
  return loc.length != Catalog::kWholeFile ? loc.length : catalog_.file_size(loc.file);
}

void Tiers::check_size(uint64_t id, uint64_t size) const {
  if (size == Catalog::kUnknownSize || size <= max_read_bytes_) return;
  throw DecodeError(catalog_.source_path(id).string(),
                    "sample of " + std::to_string(size) + " bytes exceeds max_sample_bytes (" +
                        std::to_string(max_read_bytes_) + " bytes)");
}

const std::string& Tiers::source_path(uint64_t file, std::string& out) const {
  out.assign(catalog_.root().native());
  if (!out.empty() && out.back() != '/') out += '/';
  out += catalog_.file_path(file);
  return out;
}

std::span<const std::byte> Tiers::read(uint64_t id, std::optional<std::span<const std::byte>> held,
                                       std::vector<std::byte>& buffer, TierScratch& scratch,
                                       TierTally* tally) {
  const uint64_t size = sample_size(id);
  check_size(id, size);
  // A home copy the peer tier fetches lands in `buffer` too, not in the thread's scratch: the
  // caller keeps the bytes while it reads its batch's next samples on this thread.
  struct FetchInto {
    TierScratch& scratch;
    std::vector<std::byte>* before;
    ~FetchInto() { scratch.fetch_into = before; }
  } into{scratch, scratch.fetch_into};
  scratch.fetch_into = &buffer;
  std::span<const std::byte> bytes;
  serve(id, Tier::kMemory, held, scratch, tally, Access::kBytes, [&](const SampleAt& at) -> uint64_t {
    if (at.in_memory()) {
      bytes = at.bytes;
    } else {
      read_sized(at.open(), at.locator, size, buffer);
      if (size == Catalog::kUnknownSize) check_size(id, buffer.size());
      at.check(buffer);
      bytes = buffer;
    }
    return bytes.size();
  });
  return bytes;
}

Tier Tiers::locate(uint64_t id, TierTally* tally) {
  const uint64_t file = catalog_.locator(id).file;
  // The consumer reads what it is told to: a staged copy is checked first, as serve() checks one
  // that is read in part.
  std::vector<std::byte> check;
  const Tier tier = stage_ != nullptr && stage_->is_staged(file) && !stage_->unverified(file) &&
                            stage_->unchanged(file, check)
                        ? Tier::kStage
                        : Tier::kSource;
  const uint64_t size = sample_size(id);
  const uint64_t n = size == Catalog::kUnknownSize ? 0 : size;
  if (tally != nullptr) {
    served_.add(tier, n);
    tally->add(tier, n);
  }
  return tier;
}

void Tiers::fetch_file(uint64_t file, std::vector<std::byte>& buffer, int64_t& mtime_ns,
                       TierTally* tally) {
  std::string path;
  const int64_t start = trace_ != nullptr ? trace_->now_ns() : 0;
  const uint64_t size = catalog_.file_size(file);
  const int64_t mtime = catalog_.file_mtime(file);
  const bool known = size != Catalog::kUnknownSize && mtime != Catalog::kUnknownMtime;
  // A file whose size the catalog records may come from its home copy on another node (checked
  // against the size and the owner's CRC-32C), recorded with the catalog's modification time as a
  // read of the source is; a catalog without one checks none (a later catalog that records one
  // finds it differs, and copies the file again). Not this node's own home copy: stage 2 is the one
  // making it.
  bool pfs_chosen = false;
  Catalog::Locator whole;
  whole.file = file;
  const Tier tier = size != Catalog::kUnknownSize
                        ? fetch_home(whole, size, buffer, pfs_chosen, Home::kOtherNode)
                        : Tier::kSource;
  if (tier != Tier::kSource) {
    mtime_ns = mtime;
  } else {
    const FileRef source = source_file(catalog_, source_path(file, path));
    TimedRead timed(model_.get(), SourceModel::kPfs, size == Catalog::kUnknownSize ? 0 : size,
                    pfs_chosen);
    if (known) {
      // One open and one read, no stat: a file of another size than the catalog's is an IoError
      // (not staged, stage 3 reads it and reports it). The copy is recorded with the catalog's
      // modification time, which the source is not asked for: a rewrite that keeps the size is not
      // seen here, as it is not by a direct read.
      buffer.resize(size);
      stalled_if_timed_out(file, [&] { read_file_exact(source, buffer); });
      mtime_ns = mtime;
    } else {
      stalled_if_timed_out(file, [&] { read_file(source, buffer, &mtime_ns); });
    }
    timed.end(size != Catalog::kUnknownSize);
  }
  if (trace_ != nullptr) {
    trace_->add(IoTrace::kNoSample, file, 0, buffer.size(), start, static_cast<uint8_t>(tier),
                TraceKind::kCopy);
  }
  fetched_.add(tier, buffer.size());
  if (tally != nullptr) tally->add(tier, buffer.size());
}

Tier Tiers::fetch_home(const Catalog::Locator& loc, uint64_t sample_bytes,
                       std::vector<std::byte>& buffer, bool& pfs_chosen, Home where) {
  pfs_chosen = false;
  if (peers_ == nullptr) return Tier::kSource;
  if (model_ != nullptr) probe_links_early();
  Peers::Fetched fetched = Peers::Fetched::kNone;
  uint64_t owner = 0;
  const Peers::Fetched home = peers_->home(loc, owner);
  if (where == Home::kOtherNode && home != Peers::Fetched::kPeer) return Tier::kSource;
  // A rank marked down is skipped (fetch() reads nothing from it, and counts it) whatever the link
  // to its node is worth: the model's estimates are per node, a rank's death is not. Without a
  // model (fewest PFS reads) a home copy is always asked for.
  if (home == Peers::Fetched::kNone || peers_->down(owner) || model_ == nullptr) {
    fetched = peers_->fetch(loc, buffer);  // counts what it must (beyond budget, a peer down)
  } else {
    // A read moves the sample's bytes from each: a peer sends only them (a range of its copy).
    const size_t near = home == Peers::Fetched::kPeer ? SourceModel::kPeer0 + peers_->node_of(owner)
                                                      : SourceModel::kStage;
    const std::array<size_t, 2> sources{near, SourceModel::kPfs};
    const std::array<uint64_t, 2> bytes{sample_bytes, sample_bytes};
    // While the links are faster, a home copy on another node is read there, and learned from
    // (see home_first()).
    const bool to_home = home == Peers::Fetched::kPeer &&
                         model_->links_against_pfs(mean_sample_bytes_) == SourceModel::Links::kFaster;
    const SourceModel::Choice choice =
        to_home ? SourceModel::Choice{near} : model_->choose(sources, bytes, !prober_->busy());
    if (choice.probe != SourceModel::kNoProbe && !peers_->closing()) {
      prober_->start(loc, choice.probe, choice.probe_bytes);
    }
    if (choice.read == near) {
      TimedRead timed(model_.get(), near, sample_bytes, !to_home);
      std::chrono::microseconds waited{0};
      fetched = peers_->fetch(loc, buffer, &waited);
      timed.end(fetched != Peers::Fetched::kNone, waited);
      // A link read while quiet: the model chose it over the source, so the view may have turned
      // (a look at every link's estimate; not made while not quiet, where every read may be a
      // link's, and a turn to kSlower sends the reads to the source and the link's probes see it).
      if (near != SourceModel::kStage && quiet_.load(std::memory_order_relaxed)) update_quiet();
    } else {
      pfs_chosen = true;
    }
  }
  if (fetched == Peers::Fetched::kNone) return Tier::kSource;
  return fetched == Peers::Fetched::kLocal ? Tier::kStage : Tier::kPeer;
}

void Tiers::pfs_unqueued(uint64_t bytes) {
  if (model_ != nullptr) model_->done(SourceModel::kPfs, bytes, 0, false);
}

void Tiers::fetch_sample(uint64_t id, std::span<std::byte> out, std::vector<std::byte>& fetched,
                         TierTally* tally) {
  const uint64_t size = sample_size(id);
  if (size != out.size()) {
    throw std::logic_error("tiers: a sample read ahead must have its catalog size as its place");
  }
  check_size(id, size);
  std::string path;
  const Catalog::Locator loc = catalog_.locator(id);
  const int64_t start = trace_ != nullptr ? trace_->now_ns() : 0;
  bool pfs_chosen = false;  // the model chose the source over a home copy (and queued the read)
  const Tier tier = fetch_home(loc, size, fetched, pfs_chosen);
  if (tier == Tier::kSource) {
    // A loader that closes reads nothing more for batches it will not deliver.
    if (peers_ != nullptr && peers_->closing()) {
      if (pfs_chosen) pfs_unqueued(size);
      throw IoError(source_path(loc.file, path), ECANCELED, "the loader is closing");
    }
    TimedRead timed(model_.get(), SourceModel::kPfs, size, pfs_chosen);
    const FileRef source = source_file(catalog_, source_path(loc.file, path));
    stalled_if_timed_out(loc.file, [&] { read_located(source, loc, out); });
    timed.end(true);
  } else {
    // The peer tier checked the copy against the catalog's size.
    if (fetched.size() != out.size()) {
      throw IoError(source_path(loc.file, path), EIO, "a home copy of another size than the catalog's");
    }
    std::copy(fetched.begin(), fetched.end(), out.begin());
  }
  if (trace_ != nullptr) {
    trace_->add(id, loc.file, loc.offset, size, start, static_cast<uint8_t>(tier),
                TraceKind::kReadAhead);
  }
  fetched_.add(tier, size);
  if (tally != nullptr) tally->add(tier, size);
}

TierCounts TierTally::counts() const noexcept {
  TierCounts counts;
  for (size_t t = 0; t < kTierCount; ++t) {
    counts.reads[t] = reads_[t].load(std::memory_order_relaxed);
    counts.bytes[t] = bytes_[t].load(std::memory_order_relaxed);
  }
  return counts;
}

void TierTally::clear() noexcept {
  for (size_t t = 0; t < kTierCount; ++t) {
    reads_[t].store(0, std::memory_order_relaxed);
    bytes_[t].store(0, std::memory_order_relaxed);
  }
}

}  // namespace prestage::detail
