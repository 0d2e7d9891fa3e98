#include "faults.hpp"

#include <fnmatch.h>
#include <pthread.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <utility>

namespace prestage::pfs {

namespace {

using Clock = std::chrono::steady_clock;

// How often a stall looks at `stopping`: the longest an unmount waits for a stalled operation.
constexpr auto kStopPoll = std::chrono::milliseconds(20);

std::vector<std::string_view> words(std::string_view line) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
    const size_t start = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t' && line[i] != '\r') ++i;
    if (i > start) out.push_back(line.substr(start, i - start));
  }
  return out;
}

bool matches(const std::string& glob, const char* path) {
  return ::fnmatch(glob.c_str(), path, 0) == 0;
}

// Stalls hold a FUSE worker thread; at unmount libfuse cancels its workers, and a cancellation in
// the middle of a wait would leave the counters wrong. The stall ends on its own within kStopPoll.
class NoCancellation {
 public:
  NoCancellation() { ::pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old_); }
  ~NoCancellation() { ::pthread_setcancelstate(old_, nullptr); }
  NoCancellation(const NoCancellation&) = delete;
  NoCancellation& operator=(const NoCancellation&) = delete;

 private:
  int old_ = PTHREAD_CANCEL_ENABLE;
};

}  // namespace

Faults::Faults(std::function<bool()> stopping) : stopping_(std::move(stopping)) {}

bool Faults::apply(std::string_view text, std::string* error) {
  // Parsed first, applied in order once every line is understood: all or none.
  struct Command {
    bool clear;
    Rule rule;  // for a clear, only `glob` (empty: every rule)
  };
  std::vector<Command> commands;
  size_t line_number = 0;
  while (!text.empty()) {
    const size_t end = text.find('\n');
    const std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    ++line_number;
    const auto w = words(line);
    if (w.empty() || w[0].front() == '#') continue;
    auto bad = [&](const std::string& why) {
      *error = "line " + std::to_string(line_number) + " '" + std::string(line) + "': " + why;
      return false;
    };
    Command command{};
    if (w[0] == "clear") {
      if (w.size() > 2) return bad("clear takes at most one glob");
      command.clear = true;
      if (w.size() == 2) command.rule.glob = std::string(w[1]);
      commands.push_back(std::move(command));
      continue;
    }
    Rule& rule = command.rule;
    if (w[0] == "eio-open" || w[0] == "eio-read") {
      rule.eio = true;
      if (w.size() != 2) return bad("expected: " + std::string(w[0]) + " GLOB");
    } else if (w[0] == "stall-open" || w[0] == "stall-read") {
      rule.eio = false;
      if (w.size() != 2 && w.size() != 3)
        return bad("expected: " + std::string(w[0]) + " GLOB [MS]");
      if (w.size() == 3) {
        uint64_t ms = 0;
        const auto [end_ptr, ec] = std::from_chars(w[2].data(), w[2].data() + w[2].size(), ms);
        if (ec != std::errc() || end_ptr != w[2].data() + w[2].size() || ms > 1'000'000'000) {
          return bad("MS must be a whole number of milliseconds");
        }
        rule.stall = std::chrono::milliseconds(ms);
      }
    } else {
      return bad("unknown command (eio-open, eio-read, stall-open, stall-read, clear)");
    }
    rule.op = w[0].ends_with("-open") ? Op::kOpen : Op::kRead;
    rule.glob = std::string(w[1]);
    commands.push_back(std::move(command));
  }
  {
    std::lock_guard lock(mutex_);
    for (Command& command : commands) {
      if (command.clear) {
        const std::string& glob = command.rule.glob;
        std::erase_if(rules_, [&](const Rule& r) { return glob.empty() || r.glob == glob; });
      } else {
        command.rule.id = next_id_++;
        rules_.push_back(std::move(command.rule));
      }
    }
    rule_count_.store(rules_.size(), std::memory_order_release);
  }
  changed_.notify_all();
  return true;
}

bool Faults::present(uint64_t id) const {
  return std::any_of(rules_.begin(), rules_.end(), [&](const Rule& r) { return r.id == id; });
}

void Faults::stall(const Rule& rule, std::unique_lock<std::mutex>& lock) {
  const auto deadline =
      rule.stall.count() > 0 ? Clock::now() + rule.stall : Clock::time_point::max();
  while (present(rule.id) && !stopping_()) {
    const auto now = Clock::now();
    if (now >= deadline) break;
    changed_.wait_until(lock, deadline - now > kStopPoll ? now + kStopPoll : deadline);
  }
}

int Faults::before(Op op, const char* relative_path) {
  if (rule_count_.load(std::memory_order_acquire) == 0) return 0;
  NoCancellation no_cancellation;
  std::unique_lock lock(mutex_);
  for (const Rule& r : rules_) {
    if (r.eio || r.op != op || !matches(r.glob, relative_path)) continue;
    const Rule held = r;  // `rules_` may change while this operation waits
    (op == Op::kOpen ? stall_open_ : stall_read_).fetch_add(1, std::memory_order_relaxed);
    stalled_now_.fetch_add(1, std::memory_order_relaxed);
    stall(held, lock);
    stalled_now_.fetch_sub(1, std::memory_order_relaxed);
    break;
  }
  if (stopping_()) return -EIO;
  for (const Rule& r : rules_) {
    if (r.eio && r.op == op && matches(r.glob, relative_path)) {
      (op == Op::kOpen ? eio_open_ : eio_read_).fetch_add(1, std::memory_order_relaxed);
      return -EIO;
    }
  }
  return 0;
}

std::string Faults::rules_text() const {
  std::lock_guard lock(mutex_);
  std::string text;
  for (const Rule& r : rules_) {
    text += r.eio ? "eio-" : "stall-";
    text += r.op == Op::kOpen ? "open " : "read ";
    text += r.glob;
    if (!r.eio && r.stall.count() > 0) text.append(" ").append(std::to_string(r.stall.count()));
    text += "\n";
  }
  return text;
}

FaultCounters Faults::counters() const {
  FaultCounters c;
  c.eio_open = eio_open_.load(std::memory_order_relaxed);
  c.eio_read = eio_read_.load(std::memory_order_relaxed);
  c.stall_open = stall_open_.load(std::memory_order_relaxed);
  c.stall_read = stall_read_.load(std::memory_order_relaxed);
  c.stalled_now = stalled_now_.load(std::memory_order_relaxed);
  return c;
}

}  // namespace prestage::pfs
