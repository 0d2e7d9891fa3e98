// prestage-pfs: a slow parallel file system on one machine, for benchmarks.
//
// A read-only FUSE pass-through of a local directory that makes every operation as slow as asked:
// a latency per operation (open, read, getattr/lookup, readdir), an aggregate read-bandwidth cap
// and a cap on concurrent operations (see throttle.hpp). Everything a benchmark compares reads
// through it, so every loader meets the same slow storage. It can also fail or stall the opens and
// reads of chosen files (see faults.hpp), for the reliability tests. This file alone includes
// libfuse3.
//
// The emulator's counters are readable, without any latency, as JSON from the hidden file
// MOUNTPOINT/.prestage-pfs-stats (not listed in its directory), with the opens and bytes read of
// each file ("paths") and the getattrs of each ("file_getattrs"), so that a test can say which file
// was read how often. Fault rules are written to, and listed by, the hidden file
// MOUNTPOINT/.prestage-pfs-faults. The mount itself is not `ro`, so that this one file can be
// written; every other change is refused with EROFS by the emulator.
//
// It runs in the foreground, prints "mounted MOUNTPOINT" on stdout once the mount is in place, and
// unmounts on SIGINT, SIGTERM or SIGHUP (and, with --exit-with-parent, when its parent dies).

#define FUSE_USE_VERSION 312
#include <dirent.h>
#include <fcntl.h>
#include <fuse.h>
#include <fuse_lowlevel.h>
#include <getopt.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "faults.hpp"
#include "throttle.hpp"

namespace prestage::pfs {
namespace {

constexpr const char* kStatsPath = "/.prestage-pfs-stats";
constexpr const char* kFaultsPath = "/.prestage-pfs-faults";

struct Config {
  std::string source;
  std::string mountpoint;
  ThrottleConfig throttle;
  std::string fault_rules;  // from the command line, in the syntax of faults.hpp
  unsigned threads = 0;     // 0: max_ops + 8, or 64 without a cap
  double attr_timeout_s = 1.0;
  bool direct_io = false;
  bool allow_other = false;
  bool exit_with_parent = false;
  bool debug = false;
};

// The mounted file system: what the FUSE callbacks reach through fuse_get_context()->private_data.
// Opens and bytes read of one file, since the mount.
struct PathCount {
  uint64_t opens = 0;
  std::atomic<uint64_t> bytes{0};
};

struct FileSystem {
  Config config;
  int root_fd = -1;
  std::unique_ptr<Throttle> throttle;
  std::unique_ptr<Faults> faults;
  std::atomic<fuse_session*> session{nullptr};
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  // Per file opened (its path relative to the source); nodes are stable, so a Handle keeps its own.
  std::mutex paths_mutex;
  std::map<std::string, PathCount> paths;
  // Getattrs (the kernel's lookups included) of each regular file, since the mount; guarded by
  // paths_mutex. Those of folders are in the ops' count only: a path's every component is looked
  // up again once its entry times out (--attr-timeout).
  std::map<std::string, uint64_t> file_getattrs;
};

// What fi->fh points to for an open file: a descriptor of the source file, or the text of a hidden
// file (a snapshot taken at open).
struct Handle {
  int fd = -1;
  std::string text;
  PathCount* count = nullptr;  // a source file's: its bytes read are added there
};

FileSystem& fs() { return *static_cast<FileSystem*>(fuse_get_context()->private_data); }

// FUSE paths are absolute and normalised by the kernel ("/", "/a/b"): no "." or ".." components.
const char* relative(const char* path) { return path[1] == '\0' ? "." : path + 1; }

bool is_stats(const char* path) { return std::strcmp(path, kStatsPath) == 0; }
bool is_faults(const char* path) { return std::strcmp(path, kFaultsPath) == 0; }

// `text` as a JSON string (quotes, backslashes and control characters escaped).
std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char ch : text) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", static_cast<unsigned>(ch));
      out += esc;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string paths_json(FileSystem& f) {
  std::lock_guard lock(f.paths_mutex);
  std::string out = "\"paths\": {";
  bool first = true;
  for (const auto& [path, count] : f.paths) {
    out += (first ? "" : ", ") + json_string(path) +
           ": {\"opens\": " + std::to_string(count.opens) +
           ", \"bytes\": " + std::to_string(count.bytes.load(std::memory_order_relaxed)) + "}";
    first = false;
  }
  out += "}, \"file_getattrs\": {";
  first = true;
  for (const auto& [path, count] : f.file_getattrs) {
    out += (first ? "" : ", ") + json_string(path) + ": " + std::to_string(count);
    first = false;
  }
  return out + "}, ";
}

std::string stats_json(FileSystem& f) {
  const ThrottleCounters c = f.throttle->counters();
  const ThrottleConfig& t = f.throttle->config();
  const double uptime =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - f.started).count();
  std::string ops, latency;
  for (size_t i = 0; i < kOpCount; ++i) {
    const char* name = op_name(static_cast<Op>(i));
    ops += std::string(i ? ", " : "") + "\"" + name + "\": " + std::to_string(c.ops[i]);
    char ms[64];
    std::snprintf(ms, sizeof ms, "%s\"%s\": %.6g", i ? ", " : "", name,
                  t.latency[i].count() * 1e-6);
    latency += ms;
  }
  const FaultCounters fc = f.faults->counters();
  char faults[256];
  std::snprintf(faults, sizeof faults,
                "\"faults\": {\"eio_open\": %llu, \"eio_read\": %llu, \"stall_open\": %llu, "
                "\"stall_read\": %llu, \"stalled_now\": %llu}, ",
                static_cast<unsigned long long>(fc.eio_open),
                static_cast<unsigned long long>(fc.eio_read),
                static_cast<unsigned long long>(fc.stall_open),
                static_cast<unsigned long long>(fc.stall_read),
                static_cast<unsigned long long>(fc.stalled_now));
  char tail[512];
  std::snprintf(tail, sizeof tail,
                "\"bytes_read\": %llu, \"queued_s\": %.6f, \"transfer_s\": %.6f, "
                "\"max_in_flight\": %u, \"uptime_s\": %.6f, \"config\": {\"bandwidth_mbs\": %.6g, "
                "\"max_ops\": %u, \"threads\": %u, \"attr_timeout_s\": %.6g, \"direct_io\": %s, ",
                static_cast<unsigned long long>(c.bytes), c.queued_s, c.transfer_s, c.max_in_flight,
                uptime, t.bytes_per_s / 1e6, t.max_ops, f.config.threads, f.config.attr_timeout_s,
                f.config.direct_io ? "true" : "false");
  return "{\"ops\": {" + ops + "}, " + faults + paths_json(f) + tail + "\"latency_ms\": {" +
         latency + "}}}\n";
}

void* op_init(fuse_conn_info* conn, fuse_config* cfg) {
  FileSystem& f = fs();
  cfg->use_ino = 1;
  cfg->entry_timeout = f.config.attr_timeout_s;
  cfg->attr_timeout = f.config.attr_timeout_s;
  cfg->negative_timeout = f.config.attr_timeout_s;
  cfg->kernel_cache = 0;  // every open drops the file's cached pages: each read meets the latency
  cfg->direct_io = 0;     // decided per open
  // The kernel sends at most max_background asynchronous requests (read-ahead) at once; keep that
  // above the emulated cap so that the cap, not the kernel, limits concurrency.
  const unsigned cap = f.config.throttle.max_ops;
  conn->max_background = cap == 0 ? 256 : std::max(16u, 2 * cap);
  conn->congestion_threshold = conn->max_background * 3 / 4;
  return &f;
}

// By path even for an open file (fstat): fi->fh is a Handle for files but a DIR* for directories.
int op_getattr(const char* path, struct stat* st, fuse_file_info*) {
  FileSystem& f = fs();
  if (is_stats(path) || is_faults(path)) {
    std::memset(st, 0, sizeof *st);
    st->st_mode = S_IFREG | (is_faults(path) ? 0644 : 0444);
    st->st_nlink = 1;
    st->st_uid = ::getuid();
    st->st_gid = ::getgid();
    return 0;
  }
  Throttle::Operation op(*f.throttle, Op::kGetattr);
  if (::fstatat(f.root_fd, relative(path), st, AT_SYMLINK_NOFOLLOW) != 0) return -errno;
  if (S_ISREG(st->st_mode)) {
    std::lock_guard lock(f.paths_mutex);
    ++f.file_getattrs[relative(path)];
  }
  return 0;
}

int op_readlink(const char* path, char* buf, size_t size) {
  FileSystem& f = fs();
  Throttle::Operation op(*f.throttle, Op::kGetattr);
  const ssize_t n = ::readlinkat(f.root_fd, relative(path), buf, size - 1);
  if (n < 0) return -errno;
  buf[n] = '\0';
  return 0;
}

int op_open(const char* path, fuse_file_info* fi) {
  FileSystem& f = fs();
  auto handle = std::make_unique<Handle>();
  if (is_faults(path)) {
    handle->text = f.faults->rules_text();
    fi->direct_io = 1;  // each write() reaches op_write as it is: one write, whole lines
  } else if ((fi->flags & O_ACCMODE) != O_RDONLY) {
    return -EROFS;
  } else if (is_stats(path)) {
    handle->text = stats_json(f);
    fi->direct_io = 1;  // its size is not known in advance, and each open is a new snapshot
  } else {
    // Before the service queue: a stalled open holds no slot, the others are served meanwhile.
    if (const int rc = f.faults->before(Op::kOpen, relative(path)); rc != 0) return rc;
    Throttle::Operation op(*f.throttle, Op::kOpen);
    handle->fd = ::openat(f.root_fd, relative(path), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (handle->fd < 0) return -errno;
    {
      std::lock_guard lock(f.paths_mutex);
      handle->count = &f.paths[relative(path)];
      ++handle->count->opens;
    }
    fi->direct_io = f.config.direct_io;
    fi->keep_cache = 0;
  }
  fi->fh = reinterpret_cast<uint64_t>(handle.release());
  return 0;
}

int op_read(const char* path, char* buf, size_t size, off_t offset, fuse_file_info* fi) {
  Handle& h = *reinterpret_cast<Handle*>(fi->fh);
  if (h.fd < 0) {  // a hidden file
    if (offset < 0 || static_cast<size_t>(offset) >= h.text.size()) return 0;
    const size_t n = std::min(size, h.text.size() - static_cast<size_t>(offset));
    std::memcpy(buf, h.text.data() + offset, n);
    return static_cast<int>(n);
  }
  // By path at each request, so that a rule added after the open still applies.
  if (path != nullptr) {
    if (const int rc = fs().faults->before(Op::kRead, relative(path)); rc != 0) return rc;
  }
  Throttle::Operation op(*fs().throttle, Op::kRead);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(h.fd, buf + done, size - done, offset + static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  op.transfer(done);
  h.count->bytes.fetch_add(done, std::memory_order_relaxed);
  return static_cast<int>(done);
}

int op_write(const char* path, const char* buf, size_t size, off_t, fuse_file_info*) {
  if (!is_faults(path)) return -EROFS;
  std::string error;
  if (!fs().faults->apply(std::string_view(buf, size), &error)) {
    std::fprintf(stderr, "prestage-pfs: %s: %s\n", kFaultsPath + 1, error.c_str());
    return -EINVAL;
  }
  return static_cast<int>(size);
}

// Opening the faults file with O_TRUNC truncates it first: nothing to do. Any other change: EROFS.
int op_truncate(const char* path, off_t, fuse_file_info*) { return is_faults(path) ? 0 : -EROFS; }
int op_utimens(const char* path, const timespec*, fuse_file_info*) {
  return is_faults(path) ? 0 : -EROFS;
}
int op_refuse_path(const char*) { return -EROFS; }
int op_refuse_two_paths(const char*, const char*) { return -EROFS; }
int op_refuse_mode(const char*, mode_t) { return -EROFS; }
int op_mknod(const char*, mode_t, dev_t) { return -EROFS; }
int op_rename(const char*, const char*, unsigned) { return -EROFS; }
int op_chmod(const char*, mode_t, fuse_file_info*) { return -EROFS; }
int op_chown(const char*, uid_t, gid_t, fuse_file_info*) { return -EROFS; }
int op_create(const char*, mode_t, fuse_file_info*) { return -EROFS; }

int op_release(const char*, fuse_file_info* fi) {
  std::unique_ptr<Handle> handle(reinterpret_cast<Handle*>(fi->fh));
  if (handle->fd >= 0) ::close(handle->fd);
  return 0;
}

int op_statfs(const char*, struct statvfs* st) {
  return ::fstatvfs(fs().root_fd, st) == 0 ? 0 : -errno;
}

int op_opendir(const char* path, fuse_file_info* fi) {
  FileSystem& f = fs();
  const int fd = ::openat(f.root_fd, relative(path), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -errno;
  DIR* dir = ::fdopendir(fd);
  if (dir == nullptr) {
    const int err = errno;
    ::close(fd);
    return -err;
  }
  fi->fh = reinterpret_cast<uint64_t>(dir);
  return 0;
}

int op_readdir(const char*, void* buf, fuse_fill_dir_t filler, off_t, fuse_file_info* fi,
               fuse_readdir_flags) {
  // Offset 0 for every entry: the library lists the whole directory in one call, one latency.
  Throttle::Operation op(*fs().throttle, Op::kReaddir);
  DIR* dir = reinterpret_cast<DIR*>(fi->fh);
  ::rewinddir(dir);
  errno = 0;
  while (const dirent* entry = ::readdir(dir)) {
    struct stat st{};
    st.st_ino = entry->d_ino;
    st.st_mode = static_cast<mode_t>(DTTOIF(entry->d_type));
    if (filler(buf, entry->d_name, &st, 0, static_cast<fuse_fill_dir_flags>(0)) != 0) break;
  }
  return errno == 0 ? 0 : -errno;
}

int op_releasedir(const char*, fuse_file_info* fi) {
  ::closedir(reinterpret_cast<DIR*>(fi->fh));
  return 0;
}

fuse_operations make_operations() {
  fuse_operations ops{};
  ops.init = op_init;
  ops.getattr = op_getattr;
  ops.readlink = op_readlink;
  ops.open = op_open;
  ops.read = op_read;
  ops.write = op_write;
  ops.truncate = op_truncate;
  ops.utimens = op_utimens;
  ops.mknod = op_mknod;
  ops.mkdir = op_refuse_mode;
  ops.unlink = op_refuse_path;
  ops.rmdir = op_refuse_path;
  ops.symlink = op_refuse_two_paths;
  ops.link = op_refuse_two_paths;
  ops.rename = op_rename;
  ops.chmod = op_chmod;
  ops.chown = op_chown;
  ops.create = op_create;
  ops.release = op_release;
  ops.statfs = op_statfs;
  ops.opendir = op_opendir;
  ops.readdir = op_readdir;
  ops.releasedir = op_releasedir;
  return ops;
}

const char* kUsage = R"(usage: prestage-pfs [options] SOURCE MOUNTPOINT

Serves the directory SOURCE read-only at MOUNTPOINT through FUSE, as slowly as a busy parallel file
system: each operation waits for a service slot, then its latency; reads then share one link of a
fixed bandwidth. Runs in the foreground; SIGINT/SIGTERM/SIGHUP unmount and exit. Counters (JSON) are
in MOUNTPOINT/.prestage-pfs-stats.

It can also fail or stall chosen files (faults). A fault is a rule naming files by GLOB, a shell
pattern matched against the path relative to SOURCE (`*` also matches `/`; no white space). Rules are
given with the options below, or written at any time, one per line, to MOUNTPOINT/.prestage-pfs-faults
(reading it lists the rules in force; a line not understood fails the write with EINVAL):
  eio-open GLOB         opening a matching file fails with EIO
  eio-read GLOB         every read request of a matching file fails with EIO (its open succeeds)
  stall-open GLOB [MS]  opening a matching file blocks MS ms first (0 or none: until cleared)
  stall-read GLOB [MS]  every read request of a matching file blocks MS ms first (same)
  clear [GLOB]          removes every rule, or those of exactly this GLOB; what they stalled goes on
A stall never delays unmounting by more than a few tens of ms: the stalled operation then fails
with EIO. Injected faults are counted under "faults" in the stats file.

options (times in milliseconds, bandwidth in MB/s = 10^6 bytes per second):
  --latency-ms MS      latency of every operation (default 2)
  --open-ms MS         latency of open (default: --latency-ms)
  --read-ms MS         latency of each read request the kernel sends (default: --latency-ms)
  --getattr-ms MS      latency of getattr, lookup and readlink (default: --latency-ms)
  --readdir-ms MS      latency of listing one directory (default: --latency-ms)
  --bandwidth-mbs MBS  aggregate read bandwidth cap in MB/s, 0 for none (default 200)
  --max-ops N          operations served at once, the others queue; 0 for no cap (default 16)
  --threads N          FUSE worker threads (default: max-ops + 8, or 64 without a cap)
  --attr-timeout S     seconds the kernel caches names and attributes (default 1)
  --direct-io          bypass the kernel page cache: every read() becomes requests of its size
  --allow-other        let other users read the mount (needs user_allow_other unless root)
  --exit-with-parent   unmount and exit when the parent process dies
  --eio-open GLOB      rule `eio-open GLOB` (repeatable)
  --eio-read GLOB      rule `eio-read GLOB` (repeatable)
  --stall-open GLOB    rule `stall-open GLOB --stall-ms` (repeatable)
  --stall-read GLOB    rule `stall-read GLOB --stall-ms` (repeatable)
  --stall-ms MS        how long the stalls of --stall-open/--stall-read last; 0: until cleared or
                       unmounted (default 0)
  --debug              print every FUSE request (libfuse's -d)
  -h, --help           this text
)";

bool parse_number(const char* text, double minimum, double* out) {
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0') return false;
  if (!(value >= minimum) || value > 1e12) return false;
  *out = value;
  return true;
}

std::chrono::nanoseconds from_ms(double ms) {
  return std::chrono::nanoseconds(static_cast<int64_t>(ms * 1e6 + 0.5));
}

// Returns 0 and fills `config`, or the exit code for --help (-1 then) or a usage error (2).
int parse_args(int argc, char** argv, Config* config) {
  enum {
    kLatency = 256,
    kOpen,
    kRead,
    kGetattr,
    kReaddir,
    kBandwidth,
    kMaxOps,
    kThreads,
    kAttrTimeout,
    kDirectIo,
    kAllowOther,
    kExitWithParent,
    kDebug,
    kEioOpen,
    kEioRead,
    kStallOpen,
    kStallRead,
    kStallMs
  };
  static const option long_options[] = {
      {"latency-ms", required_argument, nullptr, kLatency},
      {"open-ms", required_argument, nullptr, kOpen},
      {"read-ms", required_argument, nullptr, kRead},
      {"getattr-ms", required_argument, nullptr, kGetattr},
      {"readdir-ms", required_argument, nullptr, kReaddir},
      {"bandwidth-mbs", required_argument, nullptr, kBandwidth},
      {"max-ops", required_argument, nullptr, kMaxOps},
      {"threads", required_argument, nullptr, kThreads},
      {"attr-timeout", required_argument, nullptr, kAttrTimeout},
      {"direct-io", no_argument, nullptr, kDirectIo},
      {"allow-other", no_argument, nullptr, kAllowOther},
      {"exit-with-parent", no_argument, nullptr, kExitWithParent},
      {"debug", no_argument, nullptr, kDebug},
      {"eio-open", required_argument, nullptr, kEioOpen},
      {"eio-read", required_argument, nullptr, kEioRead},
      {"stall-open", required_argument, nullptr, kStallOpen},
      {"stall-read", required_argument, nullptr, kStallRead},
      {"stall-ms", required_argument, nullptr, kStallMs},
      {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0},
  };
  double latency = 2, bandwidth = 200, max_ops = 16, threads = 0, stall_ms = 0;
  std::vector<std::pair<std::string, std::string>> fault_options;  // (rule, GLOB)
  double per_op[kOpCount] = {-1, -1, -1, -1};
  int c;
  while ((c = getopt_long(argc, argv, "h", long_options, nullptr)) != -1) {
    double* target = nullptr;
    double minimum = 0;
    switch (c) {
      case 'h':
        std::fputs(kUsage, stdout);
        return -1;
      case kLatency:
        target = &latency;
        break;
      case kOpen:
        target = &per_op[static_cast<size_t>(Op::kOpen)];
        break;
      case kRead:
        target = &per_op[static_cast<size_t>(Op::kRead)];
        break;
      case kGetattr:
        target = &per_op[static_cast<size_t>(Op::kGetattr)];
        break;
      case kReaddir:
        target = &per_op[static_cast<size_t>(Op::kReaddir)];
        break;
      case kBandwidth:
        target = &bandwidth;
        break;
      case kMaxOps:
        target = &max_ops;
        break;
      case kThreads:
        target = &threads;
        minimum = 1;
        break;
      case kAttrTimeout:
        target = &config->attr_timeout_s;
        break;
      case kDirectIo:
        config->direct_io = true;
        break;
      case kAllowOther:
        config->allow_other = true;
        break;
      case kExitWithParent:
        config->exit_with_parent = true;
        break;
      case kDebug:
        config->debug = true;
        break;
      case kEioOpen:
      case kEioRead:
      case kStallOpen:
      case kStallRead:
        fault_options.emplace_back(long_options[c - kLatency].name, optarg);
        break;
      case kStallMs:
        target = &stall_ms;
        break;
      default:
        std::fputs(kUsage, stderr);
        return 2;
    }
    if (target != nullptr && !parse_number(optarg, minimum, target)) {
      std::fprintf(stderr, "prestage-pfs: invalid value '%s' for --%s\n", optarg,
                   long_options[c - kLatency].name);
      return 2;
    }
  }
  if (argc - optind != 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  for (const auto& [rule, glob] : fault_options) {
    std::string& rules = config->fault_rules;
    rules.append(rule).append(" ").append(glob);
    if (rule.starts_with("stall")) rules.append(" ").append(std::to_string(std::llround(stall_ms)));
    rules.append("\n");
  }
  config->source = argv[optind];
  config->mountpoint = argv[optind + 1];
  for (size_t i = 0; i < kOpCount; ++i) {
    config->throttle.latency[i] = from_ms(per_op[i] >= 0 ? per_op[i] : latency);
  }
  config->throttle.bytes_per_s = bandwidth * 1e6;
  config->throttle.max_ops = static_cast<unsigned>(max_ops);
  const unsigned cap = config->throttle.max_ops;
  config->threads = threads > 0 ? static_cast<unsigned>(threads) : (cap == 0 ? 64 : cap + 8);
  return 0;
}

int run(int argc, char** argv) {
  const pid_t parent = ::getppid();
  FileSystem f;
  if (const int rc = parse_args(argc, argv, &f.config); rc != 0) return rc < 0 ? 0 : rc;
  f.root_fd = ::open(f.config.source.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (f.root_fd < 0) {
    std::fprintf(stderr, "prestage-pfs: cannot open the source directory '%s': %s\n",
                 f.config.source.c_str(), std::strerror(errno));
    return 1;
  }
  f.throttle = std::make_unique<Throttle>(f.config.throttle);
  f.faults = std::make_unique<Faults>([&f] {
    fuse_session* session = f.session.load(std::memory_order_acquire);
    return session != nullptr && fuse_session_exited(session) != 0;
  });
  if (std::string error; !f.faults->apply(f.config.fault_rules, &error)) {
    std::fprintf(stderr, "prestage-pfs: invalid fault option: %s\n", error.c_str());
    ::close(f.root_fd);
    return 2;
  }

  std::string options = "default_permissions,fsname=prestage-pfs,subtype=prestage-pfs";
  if (f.config.allow_other) options += ",allow_other";
  std::vector<std::string> words = {"prestage-pfs", "-o", options};
  if (f.config.debug) words.push_back("-d");
  std::vector<char*> args_v;
  for (auto& w : words) args_v.push_back(w.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(args_v.size()), args_v.data());

  const fuse_operations ops = make_operations();
  fuse* handle = fuse_new(&args, &ops, sizeof ops, &f);
  if (handle == nullptr) {
    std::fprintf(stderr, "prestage-pfs: fuse_new failed\n");
    return 1;
  }
  if (fuse_mount(handle, f.config.mountpoint.c_str()) != 0) {
    std::fprintf(stderr,
                 "prestage-pfs: cannot mount at '%s' (is /dev/fuse usable, and fusermount3 "
                 "installed for a user other than root?)\n",
                 f.config.mountpoint.c_str());
    fuse_destroy(handle);
    return 1;
  }
  fuse_session* session = fuse_get_session(handle);
  f.session.store(session, std::memory_order_release);
  int rc = 1;
  if (fuse_set_signal_handlers(session) == 0) {
    if (f.config.exit_with_parent) {
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) fuse_exit(handle);  // the parent died before prctl
    }
    std::printf("mounted %s\n", f.config.mountpoint.c_str());
    std::fflush(stdout);
    fuse_loop_config* loop = fuse_loop_cfg_create();
    fuse_loop_cfg_set_max_threads(loop, f.config.threads);
    fuse_loop_cfg_set_idle_threads(loop, f.config.threads);
    // 0, or the number of the signal that ended the loop (the normal way out); negative on error.
    const int loop_rc = fuse_loop_mt(handle, loop);
    rc = loop_rc >= 0 ? 0 : 1;
    if (loop_rc < 0) std::fprintf(stderr, "prestage-pfs: %s\n", std::strerror(-loop_rc));
    fuse_loop_cfg_destroy(loop);
    fuse_remove_signal_handlers(session);
  } else {
    std::fprintf(stderr, "prestage-pfs: cannot install signal handlers\n");
  }
  fuse_unmount(handle);
  fuse_destroy(handle);
  ::close(f.root_fd);
  return rc;
}

}  // namespace
}  // namespace prestage::pfs

int main(int argc, char** argv) { return prestage::pfs::run(argc, argv); }
