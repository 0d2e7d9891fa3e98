#include "tiers/router.hpp"

#include <pthread.h>
#include <unistd.h>

#include <array>
#include <condition_variable>
#include <thread>

namespace prestage::detail {

// The source model's probes, made on a thread of their own, one at a time, so that no read waits
// on one: a probe's bytes are dropped once it is learned from. The thread starts at the first probe
// (most loaders never probe) and is joined by the destructor (in the process that started it: a
// forked copy of a loader has none of its threads).
class Router::Prober {
 public:
  Prober(Router& router, Peers& peers, SourceModel& model)
      : router_(router), peers_(peers), model_(model) {}
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
      if (job.source >= SourceModel::kPeer0) router_.update_quiet();  // a link's estimate changed
      lock.lock();
    }
  }

  Router& router_;
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

Router::Router(const Catalog& catalog, Peers& peers, bool home_copy_always)
    : catalog_(catalog), peers_(peers) {
  if (!peers.on() || home_copy_always) return;
  model_ = std::make_unique<SourceModel>(peers.ranks());
  prober_ = std::make_unique<Prober>(*this, peers_, *model_);
  uint64_t known = 0, total = 0;
  for (uint64_t id = 0; id < catalog_.size(); ++id) {
    const uint64_t size = catalog_sample_size(catalog_, id);
    if (size == Catalog::kUnknownSize) continue;
    ++known;
    total += size;
  }
  mean_sample_bytes_ = known != 0 ? total / known : 0;
  // Enough to learn a link (ModelParams::min_samples), with room for probes that fail (an owner
  // still making its copy answers "absent" after a while).
  early_probes_.store(static_cast<int>(4 * ModelParams{}.min_samples), std::memory_order_relaxed);
}

Router::~Router() = default;

void Router::stop_probes() {
  if (prober_ != nullptr) prober_->stop();
}

void Router::probe_links_early() {
  if (early_probes_.load(std::memory_order_relaxed) <= 0 || prober_->busy()) return;
  uint64_t sample = 0, owner = 0;
  const bool target = peers_.early_probe(sample, owner) && !peers_.down(owner);
  const uint64_t size = target ? catalog_sample_size(catalog_, sample) : Catalog::kUnknownSize;
  const size_t link = SourceModel::kPeer0 + (target ? peers_.node_of(owner) : 0);
  if (size == Catalog::kUnknownSize || model_->learned(link)) {
    early_probes_.store(0, std::memory_order_relaxed);  // nothing to probe, or learned
    return;
  }
  if (prober_->start(catalog_.locator(sample), link, size)) {
    early_probes_.fetch_sub(1, std::memory_order_relaxed);
  }
}

SourceModel::Links Router::links() const {
  return model_ != nullptr ? model_->links_against_pfs(mean_sample_bytes_)
                           : SourceModel::Links::kUnknown;
}

bool Router::home_first() const {
  if (model_ == nullptr) return true;  // home_copy_always
  const double by = home_first_.load(std::memory_order_relaxed) ? 1.0 : kHomeFirstBy;
  const bool now = model_->links_against_pfs(mean_sample_bytes_, by) == SourceModel::Links::kFaster;
  home_first_.store(now, std::memory_order_relaxed);
  return now;
}

void Router::update_quiet() {
  std::lock_guard lock(quiet_mutex_);
  const bool quiet = links() == SourceModel::Links::kSlower;
  if (quiet == quiet_.load(std::memory_order_relaxed)) return;
  quiet_.store(quiet, std::memory_order_relaxed);
  peers_.set_quiet(quiet);
}

Peers::Fetched Router::fetch_home(const Catalog::Locator& loc, uint64_t sample_bytes,
                                  std::vector<std::byte>& buffer, bool& pfs_chosen, Home where) {
  pfs_chosen = false;
  if (model_ != nullptr) probe_links_early();
  Peers::Fetched fetched = Peers::Fetched::kNone;
  uint64_t owner = 0;
  const Peers::Fetched home = peers_.home(loc, owner);
  if (where == Home::kOtherNode && home != Peers::Fetched::kPeer) return Peers::Fetched::kNone;
  // A rank marked down is skipped (fetch() reads nothing from it, and counts it) whatever the link
  // to its node is worth: the model's estimates are per node, a rank's death is not. Without a
  // model (fewest PFS reads) a home copy is always asked for.
  if (home == Peers::Fetched::kNone || peers_.down(owner) || model_ == nullptr) {
    fetched = peers_.fetch(loc, buffer);  // counts what it must (beyond budget, a peer down)
  } else {
    // A read moves the sample's bytes from a home copy (a peer sends only them: a range of its
    // copy), and from the PFS what it reads of the file (a compressed file: its whole stream).
    const size_t near = home == Peers::Fetched::kPeer ? SourceModel::kPeer0 + peers_.node_of(owner)
                                                      : SourceModel::kStage;
    const std::array<size_t, 2> sources{near, SourceModel::kPfs};
    const std::array<uint64_t, 2> bytes{sample_bytes, source_bytes(catalog_, loc, sample_bytes)};
    // While the links are faster, a home copy on another node is read there, and learned from
    // (see home_first()).
    const bool to_home =
        home == Peers::Fetched::kPeer &&
        model_->links_against_pfs(mean_sample_bytes_) == SourceModel::Links::kFaster;
    const SourceModel::Choice choice =
        to_home ? SourceModel::Choice{near} : model_->choose(sources, bytes, !prober_->busy());
    if (choice.probe != SourceModel::kNoProbe && !peers_.closing()) {
      prober_->start(loc, choice.probe, choice.probe_bytes);
    }
    if (choice.read == near) {
      TimedRead timed(model_.get(), near, sample_bytes, !to_home);
      std::chrono::microseconds waited{0};
      fetched = peers_.fetch(loc, buffer, &waited);
      timed.end(fetched != Peers::Fetched::kNone, waited);
      // A link read while quiet: the model chose it over the source, so the view may have turned
      // (a look at every link's estimate; not made while not quiet, where every read may be a
      // link's, and a turn to kSlower sends the reads to the source and the link's probes see it).
      if (near != SourceModel::kStage && quiet_.load(std::memory_order_relaxed)) update_quiet();
    } else {
      pfs_chosen = true;
    }
  }
  return fetched;
}

void Router::pfs_unqueued(const Catalog::Locator& loc, uint64_t bytes) {
  if (model_ != nullptr)
    model_->done(SourceModel::kPfs, source_bytes(catalog_, loc, bytes), 0, false);
}

}  // namespace prestage::detail
