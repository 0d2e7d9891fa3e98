// The POSIX file access under stages 2 and 3: every failure an IoError with its path and errno,
// reads bounded by io_timeout and given up on the cancel flag.
#include <doctest/doctest.h>

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "prestage/catalog.hpp"
#include "prestage/error.hpp"
#include "test_util.hpp"
#include "util/file_io.hpp"

using prestage::Catalog;
using prestage::IoError;
using prestage::test::TempDir;
namespace io = prestage::detail;

namespace {

void write(const std::filesystem::path& p, const std::string& text) {
  std::ofstream(p, std::ios::trunc | std::ios::binary) << text;
}

std::string text(std::span<const std::byte> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

// The errno of the IoError that `call` throws (REQUIREd to throw one), naming `path`.
template <typename Call>
int io_errno(const std::string& path, const Call& call) {
  try {
    call();
  } catch (const IoError& e) {
    CHECK(e.path() == path);
    return e.error_code();
  }
  FAIL("no IoError for " << path);
  return 0;
}

Catalog::Locator whole(uint64_t file) { return {file, 0, Catalog::kWholeFile}; }

}  // namespace

TEST_CASE("file io: a good file is read whole, by range, at its exact size and by locator") {
  TempDir dir;
  const std::string path = (dir / "good").string();
  write(path, "0123456789");
  std::vector<std::byte> buffer(3);  // resized to fit
  int64_t mtime = 0;
  CHECK(io::read_file(path, buffer, &mtime) == 10);
  CHECK(text(buffer) == "0123456789");
  struct stat st;
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK(mtime == static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec);
  CHECK(io::file_size(path) == 10);

  std::vector<std::byte> range(4);
  io::read_range(path, 3, range);
  CHECK(text(range) == "3456");
  io::read_range(path, 10, std::span<std::byte>());  // an empty range at the end
  std::vector<std::byte> exact(10);
  io::read_file_exact(path, exact);
  CHECK(text(exact) == "0123456789");

  io::read_located(path, whole(0), buffer);
  CHECK(text(buffer) == "0123456789");
  io::read_located(path, {0, 6, 4}, buffer);
  CHECK(text(buffer) == "6789");
  std::vector<std::byte> out(2);
  io::read_located(path, {0, 1, 2}, std::span<std::byte>(out));
  CHECK(text(out) == "12");
  out.resize(10);
  io::read_located(path, whole(0), std::span<std::byte>(out));
  CHECK(text(out) == "0123456789");

  write(path, "");  // an empty file is a good file
  CHECK(io::read_file(path, buffer) == 0);
  CHECK(buffer.empty());
}

TEST_CASE("file io: a missing file is an IoError with ENOENT, whichever way it is read") {
  TempDir dir;
  const std::string path = (dir / "missing").string();
  std::vector<std::byte> buffer;
  std::vector<std::byte> out(4);
  CHECK(io_errno(path, [&] { io::read_file(path, buffer); }) == ENOENT);
  CHECK(io_errno(path, [&] { io::read_range(path, 0, out); }) == ENOENT);
  CHECK(io_errno(path, [&] { io::read_file_exact(path, out); }) == ENOENT);
  CHECK(io_errno(path, [&] { io::file_size(path); }) == ENOENT);
  CHECK(io_errno(path, [&] { io::read_located(path, whole(0), buffer); }) == ENOENT);
  CHECK(io_errno(path, [&] { io::read_located(path, {0, 1, 2}, buffer); }) == ENOENT);
  CHECK(io_errno(path, [&] { io::read_located(path, whole(0), std::span<std::byte>(out)); }) ==
        ENOENT);
}

TEST_CASE("file io: a file too short for its range or size is an IoError, nothing read past it") {
  TempDir dir;
  const std::string path = (dir / "short").string();
  write(path, "abc");
  std::vector<std::byte> buffer;
  std::vector<std::byte> four(4);
  CHECK_THROWS_AS(io::read_range(path, 0, four), IoError);
  CHECK_THROWS_AS(io::read_range(path, 2, std::span<std::byte>(four).first(2)), IoError);
  CHECK_THROWS_AS(io::read_range(path, 4, std::span<std::byte>()), IoError);  // starts past the end
  CHECK_THROWS_AS(io::read_file_exact(path, four), IoError);
  std::vector<std::byte> two(2);
  CHECK_THROWS_AS(io::read_file_exact(path, two), IoError);  // longer than expected: it changed too
  CHECK_THROWS_AS(io::read_located(path, {0, 1, 3}, buffer), IoError);
  CHECK_THROWS_AS(io::read_located(path, whole(0), std::span<std::byte>(four)), IoError);
  const int err = io_errno(path, [&] { io::read_range(path, 0, four); });
  CHECK(err != 0);
}

TEST_CASE(
    "file io: a file of another size than expected is an EIO naming both sizes, read exact "
    "otherwise") {
  TempDir dir;
  const std::string path = (dir / "f").string();
  write(path, "abcdef");
  for (const size_t expected : {size_t{0}, size_t{3}, size_t{5}, size_t{7}, size_t{100}}) {
    CAPTURE(expected);
    std::vector<std::byte> out(expected);
    try {
      io::read_file_exact(path, out);
      FAIL("a file of 6 bytes was read as one of " << expected);
    } catch (const IoError& e) {
      CHECK(e.error_code() == EIO);
      const std::string what = e.what();
      CHECK(what.find("is 6 bytes, its catalog says " + std::to_string(expected)) !=
            std::string::npos);
      CHECK(what.find(expected < 6 ? "longer" : "shorter") != std::string::npos);
    }
  }
  std::vector<std::byte> six(6);
  io::read_file_exact(path, six);
  CHECK(std::string(reinterpret_cast<const char*>(six.data()), 6) == "abcdef");
  write(path, "");
  std::vector<std::byte> none;
  io::read_file_exact(path, none);  // an empty file of an expected 0 bytes
}

TEST_CASE("file io: a direct read gives the file's bytes, or reads as before where refused") {
  // The local disk refuses O_DIRECT for a read of an unaligned length (ext4, xfs: EINVAL), tmpfs
  // may take it: the bytes are the file's either way, and a file of another size is still an EIO.
  TempDir dir;
  const std::string path = (dir / "large").string();
  std::string content(300'001, '\0');
  for (size_t i = 0; i < content.size(); ++i) content[i] = static_cast<char>(i * 7 % 251);
  write(path, content);
  CHECK_FALSE(io::direct_reads());
  io::set_direct_reads(true);
  bool off_elsewhere = true;
  std::thread([&] { off_elsewhere = !io::direct_reads(); }).join();
  CHECK(off_elsewhere);  // per thread
  for (const int timeout_ms : {0, 5000}) {
    CAPTURE(timeout_ms);
    const io::IoTimeoutScope limit{std::chrono::milliseconds(timeout_ms)};
    std::vector<std::byte> out(content.size());
    io::read_file_exact(path, out);
    CHECK(text(out) == content);
    std::vector<std::byte> shorter(content.size() - 1), longer(content.size() + 1);
    CHECK(io_errno(path, [&] { io::read_file_exact(path, shorter); }) == EIO);
    CHECK(io_errno(path, [&] { io::read_file_exact(path, longer); }) == EIO);
  }
  io::set_direct_reads(false);
  CHECK_FALSE(io::source_is_fuse(dir.path().string()));
  CHECK_FALSE(io::source_is_fuse(""));
}

TEST_CASE(
    "file io: an open file serves every read from the file it opened, with or without a limit") {
  TempDir dir;
  const std::string path = (dir / "held").string();
  write(path, "0123456789");
  for (const int limit_ms : {0, 5000}) {
    CAPTURE(limit_ms);
    const io::IoTimeoutScope limit{std::chrono::milliseconds(limit_ms)};
    const io::OpenFile file(path);
    CHECK(file.size() == 10);
    // The name now leads elsewhere: the reads still see the file that was opened.
    std::filesystem::rename(path, (dir / "moved").string());
    write(path, "other");
    std::vector<std::byte> out(4);
    file.read(2, out);
    CHECK(text(out) == "2345");
    file.read(6, out);
    CHECK(text(out) == "6789");
    file.read(10, std::span<std::byte>());
    CHECK(io_errno(path, [&] { file.read(8, out); }) == EIO);  // past its end
    // Cut short while open: a read of what is gone fails, naming the file.
    std::filesystem::resize_file(dir / "moved", 5);
    CHECK(io_errno(path, [&] { file.read(4, out); }) == EIO);
    std::filesystem::remove(dir / "moved");
    write(path, "0123456789");
  }
  CHECK(io_errno(dir.path().string(), [&] { io::OpenFile{dir.path().string()}; }) == EISDIR);
  CHECK(io_errno((dir / "missing").string(), [&] { io::OpenFile{(dir / "missing").string()}; }) ==
        ENOENT);
}

TEST_CASE("file io: a directory or an unreadable file is an IoError with its errno") {
  TempDir dir;
  const std::string sub = (dir / "sub").string();
  std::filesystem::create_directories(sub);
  std::vector<std::byte> buffer;
  std::vector<std::byte> out(1);
  // Opening a directory read-only works; reading it as a file does not.
  CHECK(io_errno(sub, [&] { io::read_file(sub, buffer); }) == EISDIR);
  CHECK(io_errno(sub, [&] { io::read_range(sub, 0, out); }) == EISDIR);
  CHECK(io_errno(sub, [&] { io::read_file_exact(sub, out); }) == EISDIR);
  CHECK(io_errno(sub, [&] { io::file_size(sub); }) == EISDIR);
  // A path through a regular file.
  const std::string through = (dir / "plain").string();
  write(through, "x");
  CHECK(io_errno(through + "/inside", [&] { io::read_file(through + "/inside", buffer); }) ==
        ENOTDIR);
  if (::geteuid() != 0) {  // root reads whatever the mode
    const std::string locked = (dir / "locked").string();
    write(locked, "secret");
    REQUIRE(::chmod(locked.c_str(), 0) == 0);
    CHECK(io_errno(locked, [&] { io::read_file(locked, buffer); }) == EACCES);
    CHECK(io_errno(locked, [&] { io::read_range(locked, 0, out); }) == EACCES);
  }
}

TEST_CASE("file io: write_file_atomically publishes a whole file, and no partial one on failure") {
  TempDir dir;
  const std::string path = (dir / "out").string();
  const std::string tmp = path + ".tmp";
  const std::string payload(100000, 'p');
  const auto bytes = std::as_bytes(std::span(payload));
  io::write_file_atomically(path, tmp, bytes);
  std::vector<std::byte> back;
  io::read_file(path, back);
  CHECK(text(back) == payload);
  CHECK(!std::filesystem::exists(tmp));
  // Replacing an existing file: a reader sees the old or the new one.
  io::write_file_atomically(path, tmp, std::as_bytes(std::span(std::string_view("new"))));
  io::read_file(path, back);
  CHECK(text(back) == "new");

  // A temporary name that exists already (another writer's) is refused and left alone.
  write(tmp, "another writer's");
  CHECK_THROWS_AS(io::write_file_atomically(path, tmp, bytes), IoError);
  io::read_file(tmp, back);
  CHECK(text(back) == "another writer's");
  io::read_file(path, back);
  CHECK(text(back) == "new");
  std::filesystem::remove(tmp);

  // The rename fails (a directory is in the way): the temporary file is removed.
  const std::string blocked = (dir / "blocked").string();
  std::filesystem::create_directories(blocked + "/inside");
  CHECK(io_errno(blocked, [&] { io::write_file_atomically(blocked, blocked + ".tmp", bytes); }) !=
        0);
  CHECK(!std::filesystem::exists(blocked + ".tmp"));
  CHECK(std::filesystem::is_directory(blocked));

  // The write fails part way (a file size limit, as a full disk would): the partial temporary file
  // is removed and nothing is published.
  {
    struct rlimit old_limit;
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old_limit) == 0);
    const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);  // the write fails with EFBIG instead
    struct rlimit small = old_limit;
    small.rlim_cur = 4096;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
    const std::string big = (dir / "big").string();
    const int err =
        io_errno(big + ".tmp", [&] { io::write_file_atomically(big, big + ".tmp", bytes); });
    ::setrlimit(RLIMIT_FSIZE, &old_limit);
    std::signal(SIGXFSZ, old_handler);
    CHECK(err == EFBIG);
    CHECK(!std::filesystem::exists(big + ".tmp"));
    CHECK(!std::filesystem::exists(big));
  }
  // The temporary file cannot be created: nothing is published.
  const std::string nowhere = (dir / "no-such-dir" / "out").string();
  CHECK(io_errno(nowhere + ".tmp",
                 [&] { io::write_file_atomically(nowhere, nowhere + ".tmp", bytes); }) == ENOENT);
  CHECK(!std::filesystem::exists(nowhere));
}

TEST_CASE("file io: a read that stalls fails with ETIMEDOUT after io_timeout, whatever the call") {
  TempDir dir;
  const std::string path = (dir / "stalled").string();
  const prestage::test::StalledFile stalled(path);
  std::vector<std::byte> buffer;
  std::vector<std::byte> out(4);
  const io::IoTimeoutScope limit(std::chrono::milliseconds(200));
  CHECK(io::io_timeout() == std::chrono::milliseconds(200));
  const auto timed = [&](const auto& call) {
    const auto start = std::chrono::steady_clock::now();
    const int err = io_errno(path, call);
    const auto took = std::chrono::steady_clock::now() - start;
    CHECK(took >= std::chrono::milliseconds(190));
    CHECK(took < std::chrono::seconds(20));  // not hung: a loaded machine is slow, not stuck
    return err;
  };
  CHECK(timed([&] { io::read_file(path, buffer); }) == ETIMEDOUT);
  CHECK(timed([&] { io::read_range(path, 0, out); }) == ETIMEDOUT);
  CHECK(timed([&] { io::read_file_exact(path, out); }) == ETIMEDOUT);
  CHECK(timed([&] { io::read_located(path, whole(0), buffer); }) == ETIMEDOUT);
  // A good file is still read under a limit, on the helper threads (a generous one: this machine
  // may be loaded, and the stalled reads above still hold threads).
  const io::IoTimeoutScope generous(std::chrono::seconds(30));
  const std::string good = (dir / "good").string();
  write(good, "fine");
  io::read_file(good, buffer);
  CHECK(text(buffer) == "fine");
}

TEST_CASE("file io: the limit and cancel flag are per thread, and a scope restores them") {
  CHECK(io::io_timeout() == std::chrono::milliseconds(0));
  CHECK(io::io_cancel() == nullptr);
  std::atomic<bool> cancel{false};
  {
    const io::IoTimeoutScope outer(std::chrono::milliseconds(300), &cancel);
    CHECK(io::io_cancel() == &cancel);
    std::chrono::milliseconds seen{-1};
    std::thread([&] { seen = io::io_timeout(); }).join();
    CHECK(seen == std::chrono::milliseconds(0));
    {
      const io::IoTimeoutScope inner(std::chrono::milliseconds(5));
      CHECK(io::io_timeout() == std::chrono::milliseconds(5));
      CHECK(io::io_cancel() == nullptr);
    }
    CHECK(io::io_timeout() == std::chrono::milliseconds(300));
    CHECK(io::io_cancel() == &cancel);
  }
  CHECK(io::io_timeout() == std::chrono::milliseconds(0));
  CHECK(io::io_cancel() == nullptr);
}

TEST_CASE("file io: the cancel flag gives a stalled read up (ECANCELED) long before its limit") {
  TempDir dir;
  const std::string path = (dir / "stalled").string();
  const prestage::test::StalledFile stalled(path);
  std::atomic<bool> cancel{false};
  const io::IoTimeoutScope limit(std::chrono::minutes(10), &cancel);
  std::vector<std::byte> buffer;
  // Already set: given up at the first look.
  cancel.store(true);
  auto start = std::chrono::steady_clock::now();
  CHECK(io_errno(path, [&] { io::read_file(path, buffer); }) == ECANCELED);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
  // Set while the read waits.
  cancel.store(false);
  start = std::chrono::steady_clock::now();
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    cancel.store(true);
  });
  std::vector<std::byte> out(4);
  CHECK(io_errno(path, [&] { io::read_range(path, 0, out); }) == ECANCELED);
  const auto took = std::chrono::steady_clock::now() - start;
  setter.join();
  CHECK(took >= std::chrono::milliseconds(100));  // not given up before the flag was set
  CHECK(took < std::chrono::seconds(20));         // far from the 10 minutes of the limit
}
