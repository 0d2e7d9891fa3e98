// The peer tier's transport over MPI: the plugin libprestage_mpi.so, opened at run time by the core
// (tiers/peers.cpp) and never linked into it. This file alone includes mpi.h.
//
// Two-sided messages on a duplicate of the job's communicator: a request (its id, the file and the
// byte range) and a reply (a header with the id, the size and CRC-32C of the bytes sent, the file's
// recorded size and the answer, then the bytes), received with MPI_Improbe/MPI_Mrecv since its size
// is not known in advance. Both ends are the same build: the messages carry no version. One
// progress thread makes every MPI call once the transport has started (MPI_THREAD_SERIALIZED is
// enough; MULTIPLE is missing or flaky on some fabrics); other threads hand it their requests
// through a queue and wait for the answer with a timeout. MPI has no call that waits for a message
// and for a local event at once, so the thread polls while there is traffic and otherwise sleeps on
// a condition variable, a sleep that doubles while nothing comes, up to 2 ms: an idle transport
// costs a few hundred wake-ups a second, not a core. A quiet transport (set_quiet: its loader finds
// every link slower than the source, so other ranks only probe it) lets that sleep grow to 50 ms,
// but not while requests of its own await replies or it owes an answer (held back, or still being
// sent): its own reads are not slowed. A request made on this rank wakes the thread at once; one
// from another rank is picked up at the next poll, so each reply's `held_us` carries the expected
// pickup delay (half the gap between the two polls for requests around its arrival), which the
// requester's source model leaves out with the rest of `held_us`. The MPI C API alone: the
// deprecated C++ bindings that mpi.h pulls in for C++ would need a library that is not linked.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <dlfcn.h>
#include <mpi.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>

#include "tiers/transport.hpp"

namespace prestage::detail {
namespace {

constexpr int kTagRequest = 7301;
constexpr int kTagReply = 7302;
constexpr int kTagGoodbye = 7303;  // no body: the sender's transport stopped
constexpr auto kMaxIdleSleep = std::chrono::microseconds(2000);
constexpr auto kMinIdleSleep = std::chrono::microseconds(50);
// The idle sleep's bound while quiet. 50 ms: 20 wake-ups a second instead of 500 (on a node whose
// cores the loader's own work fills, the 2 ms polling cost a few percent of an epoch), while a
// request that does come (a probe: a read made only to measure the link, off the batch's path) is
// picked up within 50 ms, well inside any peer_timeout, with its expected delay (half of it) in
// held_us. Longer would save little more and would delay the pickup of the first reads after the
// other ranks' view turns, before this rank's own view turns too.
constexpr auto kQuietIdleSleep = std::chrono::microseconds(50'000);
// At stop, how long sends under way (replies to a rank that is not receiving) are given to finish.
constexpr auto kStopGrace = std::chrono::milliseconds(200);
// A request held back (kLater) is answered "absent" this long before its requester stops waiting
// (at most a quarter of its wait), so that a requester that hears nothing knows its peer is
// stalled. The margin covers the answer's way back on a loaded node: 100 ms was once too little
// (a rank with 16 processes on 2 cores heard its answer late and marked a live peer down).
constexpr auto kAnswerMargin = std::chrono::milliseconds(1000);

struct RequestMessage {
  uint64_t id;
  uint64_t file, offset, length;  // PeerRange
  uint64_t timeout_ms;  // how long the requester waits: a kLater answer is retried for that long
};

struct ReplyHeader {
  uint64_t id;
  uint64_t size;       // of the bytes that follow
  uint32_t crc;        // PeerCheck
  uint32_t answer;     // PeerAnswer
  uint64_t held_us;    // the expected pickup delay, plus how long the answer was held back (kLater)
  uint64_t file_size;  // PeerCheck
};

class MpiTransport;

// Process-wide: whether this plugin initialised MPI (then it finalises it at exit, after stopping
// the transports still running), and in which process (a forked child never calls MPI).
std::mutex g_mutex;
bool g_initialised_here = false;
pid_t g_init_pid = 0;
pid_t g_first_pid = 0;  // of the first start: a forked child (a DataLoader worker) never calls MPI
std::set<MpiTransport*> g_live;  // guarded by g_mutex

void finalize_at_exit();

class MpiTransport final : public Transport {
 public:
  MpiTransport(MPI_Comm comm, uint64_t rank, std::vector<uint64_t> nodes,
               std::vector<uint64_t> values, PeerServe serve)
      : comm_(comm),
        rank_(rank),
        nodes_(std::move(nodes)),
        values_(std::move(values)),
        serve_(std::move(serve)),
        gone_(nodes_.size(), 0) {
    {
      std::lock_guard lock(g_mutex);
      g_live.insert(this);
    }
    thread_ = std::thread([this] { run(); });
  }

  ~MpiTransport() override {
    stop();
    std::lock_guard lock(g_mutex);
    g_live.erase(this);
  }

  uint64_t rank() const override { return rank_; }
  uint64_t world_size() const override { return nodes_.size(); }
  const std::vector<uint64_t>& nodes() const override { return nodes_; }
  const std::vector<uint64_t>& values() const override { return values_; }

  bool request(uint64_t rank, const PeerRange& range, std::chrono::milliseconds timeout,
               std::vector<std::byte>& bytes, PeerCheck& check, RequestEnd* end,
               std::chrono::microseconds* held) override {
    RequestEnd ignored;
    RequestEnd& how = end != nullptr ? *end : ignored;
    Waiter w;
    w.rank = rank;
    w.range = range;
    w.timeout = timeout;
    w.bytes = &bytes;
    std::unique_lock lock(mutex_);
    if (stopping_) {
      how = RequestEnd::kStopped;
      return false;
    }
    if (rank < gone_.size() && gone_[rank]) {
      how = RequestEnd::kGone;
      return false;
    }
    w.id = next_id_++;
    outgoing_.push_back(&w);
    waiting_.emplace(w.id, &w);
    work_.notify_one();
    answered_.wait_for(lock, timeout, [&] { return w.done; });
    if (!w.done) {  // timed out: a late reply is dropped by the progress thread
      waiting_.erase(w.id);
      outgoing_.erase(std::remove(outgoing_.begin(), outgoing_.end(), &w), outgoing_.end());
      how = RequestEnd::kNoAnswer;
      return false;
    }
    how = w.end;
    check = w.check;
    if (held != nullptr) *held = std::chrono::microseconds(w.held_us);
    return w.ok;
  }

  void stop() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    work_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  void set_quiet(bool quiet) override {
    {
      std::lock_guard lock(mutex_);
      if (quiet_ == quiet) return;
      quiet_ = quiet;
    }
    work_.notify_all();  // a sleep under the quiet bound ends: the short one applies at once
  }

 private:
  struct Waiter {
    uint64_t id = 0, rank = 0;
    PeerRange range;
    std::chrono::milliseconds timeout{0};
    std::vector<std::byte>* bytes = nullptr;
    PeerCheck check;
    uint64_t held_us = 0;                 // guarded by mutex_
    bool ok = false, done = false;        // guarded by mutex_
    RequestEnd end = RequestEnd::kReply;  // guarded by mutex_
  };
  struct Send {
    MPI_Request request = MPI_REQUEST_NULL;
    std::vector<std::byte> buffer;
  };
  struct Deferred {  // a kLater answer, asked again until `until`
    int source;
    RequestMessage message;
    std::chrono::steady_clock::time_point until;
    std::chrono::steady_clock::time_point arrived;  // expected: see receive_requests()
  };

  void run() {
    // Named, so that its wake-ups can be told apart (top -H, /proc/PID/task/*/status).
    pthread_setname_np(pthread_self(), "prestage-mpi");  // at most 15 characters
    auto sleep = kMinIdleSleep;
    std::vector<Waiter> to_send;  // copies: a waiter may time out while its request is sent
    while (true) {
      bool active = false;
      {
        std::unique_lock lock(mutex_);
        if (outgoing_.empty() && !stopping_) {
          // Quiet, the sleep may grow to the longer bound, unless this rank awaits replies (its own
          // reads), or owes answers held back or sends under way (which progress only as it polls).
          const bool long_sleep = quiet_ && waiting_.empty() && deferred_.empty() && sends_.empty();
          const auto bound = long_sleep ? kQuietIdleSleep : kMaxIdleSleep;
          work_.wait_for(lock, std::min(sleep, bound), [&] {
            return stopping_ || !outgoing_.empty() || (long_sleep && !quiet_);
          });
        }
        if (stopping_) break;
        to_send.clear();
        for (Waiter* w : outgoing_) to_send.push_back(*w);
        outgoing_.clear();
      }
      for (const Waiter& w : to_send) {
        const RequestMessage m{w.id, w.range.file, w.range.offset, w.range.length,
                               static_cast<uint64_t>(w.timeout.count())};
        send(static_cast<int>(w.rank), kTagRequest, &m, sizeof m, nullptr, 0);
        active = true;
      }
      active |= receive_requests();
      active |= receive_replies();
      active |= receive_goodbyes();
      active |= retry_deferred();
      test_sends();
      sleep = active ? kMinIdleSleep : std::min(kQuietIdleSleep, sleep * 2);
    }
    // Stopping: requests held back are answered (absent), every other rank hears goodbye, every
    // wait ends, and sends under way get a short grace, then are let go.
    for (const Deferred& d : deferred_) {
      const ReplyHeader h{d.message.id, 0, 0, static_cast<uint32_t>(PeerAnswer::kAbsent), 0, 0};
      send(d.source, kTagReply, &h, sizeof h, nullptr, 0);
    }
    deferred_.clear();
    const char goodbye = 0;
    for (size_t r = 0; r < nodes_.size(); ++r) {
      if (r != rank_) send(static_cast<int>(r), kTagGoodbye, &goodbye, 1, nullptr, 0);
    }
    {
      std::lock_guard lock(mutex_);
      for (auto& [id, w] : waiting_) {
        w->done = true;
        w->end = RequestEnd::kStopped;
      }
      waiting_.clear();
    }
    answered_.notify_all();
    const auto until = std::chrono::steady_clock::now() + kStopGrace;
    while (!sends_.empty() && std::chrono::steady_clock::now() < until) {
      test_sends();
      std::this_thread::sleep_for(kMinIdleSleep);
    }
    for (Send& s : sends_) {
      // MPI may still read the buffer of a send it has not finished: it is kept (leaked) for that.
      MPI_Request_free(&s.request);
      new std::vector<std::byte>(std::move(s.buffer));
    }
    sends_.clear();
  }

  void send(int to, int tag, const void* head, size_t head_size, const std::byte* body,
            size_t body_size) {
    Send& s = sends_.emplace_back();
    s.buffer.resize(head_size + body_size);
    std::memcpy(s.buffer.data(), head, head_size);
    if (body_size != 0) std::memcpy(s.buffer.data() + head_size, body, body_size);
    // A send to a rank whose process has ended (a goodbye to a rank that exited first) fails: the
    // communicator returns errors instead of aborting the job, and the message is dropped.
    if (MPI_Isend(s.buffer.data(), static_cast<int>(s.buffer.size()), MPI_BYTE, to, tag, comm_,
                  &s.request) != MPI_SUCCESS) {
      sends_.pop_back();
    }
  }

  void test_sends() {
    for (auto it = sends_.begin(); it != sends_.end();) {
      int done = 0;
      const bool failed = MPI_Test(&it->request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS;
      it = done || failed ? sends_.erase(it) : std::next(it);
    }
  }

  // Answers a request now, or defers it (kLater) while its requester still waits. True if answered.
  // `arrived`: when the request is expected to have arrived, which held_us counts from.
  bool answer(int source, const RequestMessage& m, std::chrono::steady_clock::time_point until,
              std::chrono::steady_clock::time_point arrived) {
    PeerCheck check;
    PeerAnswer a = PeerAnswer::kAbsent;
    try {
      a = serve_(PeerRange{m.file, m.offset, m.length}, body_, check);
    } catch (...) {  // no exception may end the progress thread: the requester reads the source
    }
    if (a == PeerAnswer::kLater) {
      if (std::chrono::steady_clock::now() < until) return false;
      a = PeerAnswer::kAbsent;
    }
    // A reply's size is an int: a larger range is read from the source by the requester.
    if (a == PeerAnswer::kServed &&
        body_.size() > static_cast<size_t>(INT_MAX) - sizeof(ReplyHeader)) {
      a = PeerAnswer::kAbsent;
    }
    const bool served = a == PeerAnswer::kServed;
    const auto held = std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::steady_clock::now() - arrived);
    const ReplyHeader h{m.id,
                        served ? body_.size() : 0,
                        check.crc,
                        static_cast<uint32_t>(a),
                        static_cast<uint64_t>(std::max<int64_t>(held.count(), 0)),
                        check.file_size};
    send(source, kTagReply, &h, sizeof h, body_.data(), served ? body_.size() : 0);
    return true;
  }

  // A request found by this poll came in after the previous poll had found none (`polled_`) and
  // before this one began: at a time the requester's timing is independent of, so uniformly within
  // that gap, and it waited half the gap on average before it was picked up. Its answer's held_us
  // counts from that expected arrival, so that a requester's estimate of the link is not charged
  // with this rank's sleep, however long (quiet) or short. (A request found later in the same poll
  // waited for the ones before it to be answered: this rank's service time, which the requester
  // counts as it counts a queue at the source.)
  bool receive_requests() {
    bool any = false;
    const auto poll = std::chrono::steady_clock::now();
    const auto pickup = (poll - polled_) / 2;
    int misses = 0;
    while (true) {
      int flag = 0;
      MPI_Message message;
      MPI_Status status;
      MPI_Improbe(MPI_ANY_SOURCE, kTagRequest, comm_, &flag, &message, &status);
      if (!flag) {
        // A probe may match only what an earlier call's progress brought in (Open MPI's ob1 looks,
        // then progresses): a second look finds a request that came while this thread slept, so
        // that it is picked up after the gap it came in, not one gap later.
        if (++misses < 2) continue;
        polled_ = std::chrono::steady_clock::now();
        return any;
      }
      RequestMessage m{};
      MPI_Mrecv(&m, sizeof m, MPI_BYTE, &message, MPI_STATUS_IGNORE);
      any = true;
      const auto wait = std::chrono::milliseconds(m.timeout_ms);
      const auto now = std::chrono::steady_clock::now();
      const auto until = now + wait - std::min<std::chrono::milliseconds>(kAnswerMargin, wait / 4);
      const auto arrived = now - pickup;
      if (!answer(status.MPI_SOURCE, m, until, arrived)) {
        deferred_.push_back({status.MPI_SOURCE, m, until, arrived});
      }
    }
  }

  bool retry_deferred() {
    bool any = false;
    for (auto it = deferred_.begin(); it != deferred_.end();) {
      if (answer(it->source, it->message, it->until, it->arrived)) {
        it = deferred_.erase(it);
        any = true;
      } else {
        ++it;
      }
    }
    return any;
  }

  bool receive_replies() {
    bool any = false;
    while (true) {
      int flag = 0;
      MPI_Message message;
      MPI_Status status;
      MPI_Improbe(MPI_ANY_SOURCE, kTagReply, comm_, &flag, &message, &status);
      if (!flag) return any;
      int count = 0;
      MPI_Get_count(&status, MPI_BYTE, &count);
      reply_.resize(static_cast<size_t>(std::max(count, 0)));
      MPI_Mrecv(reply_.data(), count, MPI_BYTE, &message, MPI_STATUS_IGNORE);
      any = true;
      if (reply_.size() < sizeof(ReplyHeader)) continue;  // not ours: dropped
      ReplyHeader h;
      std::memcpy(&h, reply_.data(), sizeof h);
      std::lock_guard lock(mutex_);
      const auto it = waiting_.find(h.id);
      if (it == waiting_.end()) continue;  // its requester gave up waiting
      Waiter& w = *it->second;
      w.ok = h.answer == static_cast<uint32_t>(PeerAnswer::kServed) &&
             h.size == reply_.size() - sizeof h;
      if (w.ok) w.bytes->assign(reply_.begin() + sizeof h, reply_.end());
      w.check = PeerCheck{h.crc, h.file_size};
      w.held_us = h.held_us;
      w.done = true;
      waiting_.erase(it);
      answered_.notify_all();
    }
  }

  // Goodbyes: the rank whose transport stopped answers no more; the waits on it end at once.
  bool receive_goodbyes() {
    bool any = false;
    while (true) {
      int flag = 0;
      MPI_Message message;
      MPI_Status status;
      MPI_Improbe(MPI_ANY_SOURCE, kTagGoodbye, comm_, &flag, &message, &status);
      if (!flag) return any;
      char goodbye = 0;
      MPI_Mrecv(&goodbye, 1, MPI_BYTE, &message, MPI_STATUS_IGNORE);
      any = true;
      const auto from = static_cast<uint64_t>(status.MPI_SOURCE);
      // Requests it held back are answered by its stop; none is owed to it any more.
      deferred_.remove_if([&](const Deferred& d) { return d.source == status.MPI_SOURCE; });
      std::lock_guard lock(mutex_);
      if (from < gone_.size()) gone_[from] = 1;
      for (auto it = waiting_.begin(); it != waiting_.end();) {
        Waiter& w = *it->second;
        if (w.rank != from) {
          ++it;
          continue;
        }
        w.ok = false;
        w.done = true;
        w.end = RequestEnd::kGone;
        it = waiting_.erase(it);
      }
      answered_.notify_all();
    }
  }

  MPI_Comm comm_;
  uint64_t rank_;
  std::vector<uint64_t> nodes_, values_;
  PeerServe serve_;

  std::mutex mutex_;
  std::condition_variable work_, answered_;
  std::deque<Waiter*> outgoing_;                   // guarded by mutex_
  std::unordered_map<uint64_t, Waiter*> waiting_;  // guarded by mutex_
  uint64_t next_id_ = 1;                           // guarded by mutex_
  bool stopping_ = false;                          // guarded by mutex_
  bool quiet_ = false;                             // guarded by mutex_
  std::vector<uint8_t> gone_;                      // per rank, said goodbye (mutex_)

  // The progress thread's own.
  std::list<Send> sends_;
  std::list<Deferred> deferred_;
  std::vector<std::byte> body_, reply_;
  // When the last look for requests found none (receive_requests).
  std::chrono::steady_clock::time_point polled_ = std::chrono::steady_clock::now();
  std::thread thread_;
};

void finalize_at_exit() {
  std::set<MpiTransport*> live;
  {
    std::lock_guard lock(g_mutex);
    if (::getpid() != g_init_pid) return;  // a forked child: MPI is its parent's
    live = g_live;
  }
  for (MpiTransport* t : live) t->stop();  // no MPI call may run during or after MPI_Finalize
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

// OpenMPI opens its own components with dlopen; they need libmpi's symbols in the global scope,
// which a library opened with RTLD_LOCAL (as Python opens extensions) does not give them. So libmpi
// is opened again, global, before MPI_Init (mpi4py does the same).
void make_mpi_global() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&MPI_Init), &info) != 0 && info.dli_fname != nullptr) {
    dlopen(info.dli_fname, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
  }
}

// Started by an MPI launcher (mpirun, mpiexec, srun)? Without one, MPI_Init would make a world of
// one (a singleton), which the loader's world size then refuses: tell so without initialising MPI.
bool launched_by_mpi() {
  for (const char* name :
       {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

Transport* start(const TransportConfig& config, std::string& error) {
  {
    std::lock_guard lock(g_mutex);
    if (g_first_pid == 0) g_first_pid = ::getpid();
    if (g_first_pid != ::getpid()) {
      error = "a process forked from one that started MPI does not use it";
      return nullptr;
    }
  }
  int initialised = 0, finalized = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalized);
  if (finalized) {
    error = "MPI was finalised before the loader started";
    return nullptr;
  }
  if (!initialised) {
    if (!launched_by_mpi()) {
      error = "MPI world of 1 does not match world_size " +
              std::to_string(config.expect_world_size) +
              " (the process was not started by mpirun, mpiexec or srun)";
      return nullptr;
    }
    std::lock_guard lock(g_mutex);
    make_mpi_global();
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
      error = "MPI_Init_thread failed";
      return nullptr;
    }
    g_initialised_here = true;
    g_init_pid = ::getpid();
    std::atexit(finalize_at_exit);
  }
  int provided = 0;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_SERIALIZED) {
    error = "MPI was initialised with a thread level below MPI_THREAD_SERIALIZED";
    return nullptr;
  }
  MPI_Comm base = MPI_COMM_WORLD;
  if (config.comm != nullptr) {
    base = *static_cast<const MPI_Comm*>(config.comm);
  } else if (config.comm_fortran >= 0) {
    base = MPI_Comm_f2c(static_cast<MPI_Fint>(config.comm_fortran));
  }
  int size = 0, rank = 0;
  MPI_Comm_size(base, &size);
  MPI_Comm_rank(base, &rank);
  if (static_cast<uint64_t>(size) != config.expect_world_size) {
    error = "MPI world of " + std::to_string(size) + " does not match world_size " +
            std::to_string(config.expect_world_size);
    return nullptr;
  }
  // Every rank of this world gets here: agree on the ranks before anything else is collective.
  int ok = static_cast<uint64_t>(rank) == config.expect_rank ? 1 : 0, all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, base);
  if (!all_ok) {
    error = ok ? "another rank's loader rank differs from its MPI rank"
               : "MPI rank " + std::to_string(rank) + " is not the loader's rank " +
                     std::to_string(config.expect_rank);
    return nullptr;
  }
  MPI_Comm comm;
  MPI_Comm_dup(base, &comm);
  // Errors on the tier's own communicator are returned, not fatal: a rank that has ended must not
  // take the job down with it (see send()).
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  MPI_Comm node_comm;
  if (config.node_override >= 0) {
    MPI_Comm_split(comm, static_cast<int>(config.node_override % INT_MAX), rank, &node_comm);
  } else {
    MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node_comm);
  }
  int node = 0;
  MPI_Allreduce(&rank, &node, 1, MPI_INT, MPI_MIN, node_comm);
  MPI_Comm_free(&node_comm);
  uint64_t mine[2] = {static_cast<uint64_t>(node), config.value};
  std::vector<uint64_t> all(2 * static_cast<size_t>(size));
  MPI_Allgather(mine, 2, MPI_UINT64_T, all.data(), 2, MPI_UINT64_T, comm);
  std::vector<uint64_t> nodes(size), values(size);
  for (int r = 0; r < size; ++r) {
    nodes[r] = all[2 * r];
    values[r] = all[2 * r + 1];
  }
  return new MpiTransport(comm, static_cast<uint64_t>(rank), std::move(nodes), std::move(values),
                          config.serve);
}

}  // namespace
}  // namespace prestage::detail

extern "C" __attribute__((visibility("default"))) prestage::detail::Transport*
prestage_transport_start(const prestage::detail::TransportConfig* config, std::string* error) {
  try {
    return prestage::detail::start(*config, *error);
  } catch (const std::exception& e) {
    *error = e.what();
    return nullptr;
  }
}
