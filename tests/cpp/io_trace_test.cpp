#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "prestage/error.hpp"
#include "test_util.hpp"
#include "util/io_trace.hpp"

using prestage::detail::IoTrace;
using prestage::detail::TraceKind;
using prestage::detail::TraceRecord;
using prestage::test::TempDir;

namespace {

struct ReadBack {
  std::string header;
  std::vector<TraceRecord> records;
};

ReadBack read_back(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(bytes.size() >= 16);
  CHECK(bytes.substr(0, 8) == "PSTGTRC1");
  uint64_t header_bytes;
  std::memcpy(&header_bytes, bytes.data() + 8, 8);
  ReadBack out;
  out.header = bytes.substr(16, header_bytes);
  const size_t body = bytes.size() - 16 - header_bytes;
  REQUIRE(body % sizeof(TraceRecord) == 0);
  out.records.resize(body / sizeof(TraceRecord));
  if (body > 0) std::memcpy(out.records.data(), bytes.data() + 16 + header_bytes, body);
  return out;
}

}  // namespace

TEST_CASE("io trace: every record added from many threads is in the file once, whole") {
  TempDir dir;
  const std::string path = (dir.path() / "t.trace").string();
  constexpr int kThreads = 8, kPerThread = 5000;  // more than a slot's batch: written while running
  {
    IoTrace trace(path, "/data/\"set\"", 42);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < kPerThread; ++i) {
          const int64_t start = trace.now_ns();
          trace.add(static_cast<uint64_t>(t) * kPerThread + i, t, i, 100 + i, start, 3,
                    TraceKind::kRead);
        }
      });
    }
    for (auto& th : threads) th.join();
    CHECK(trace.records() == kThreads * kPerThread);
    CHECK(trace.write_errors() == 0);
  }
  const ReadBack back = read_back(path);
  CHECK(back.header == R"({"format": 1, "root": "/data/\"set\"", "files": 42})");
  REQUIRE(back.records.size() == kThreads * kPerThread);
  std::vector<int> seen(kThreads * kPerThread, 0);
  for (const TraceRecord& r : back.records) {
    REQUIRE(r.sample < seen.size());
    ++seen[r.sample];
    const uint64_t i = r.sample % kPerThread;
    CHECK(r.file == r.sample / kPerThread);
    CHECK(r.offset == i);
    CHECK(r.size == 100 + i);
    CHECK(r.end_ns >= r.start_ns);
    CHECK(r.tier == 3);
  }
  for (const int n : seen) CHECK(n == 1);
}

TEST_CASE("io trace: flush makes the file whole while the trace stays open") {
  TempDir dir;
  const std::string path = (dir.path() / "t.trace").string();
  IoTrace trace(path, "/r", 1);
  trace.add(IoTrace::kNoSample, 0, 0, 7, trace.now_ns(), 3, TraceKind::kCopy);
  CHECK(read_back(path).records.empty());  // buffered
  trace.flush();
  const ReadBack back = read_back(path);
  REQUIRE(back.records.size() == 1);
  CHECK(back.records[0].sample == IoTrace::kNoSample);
  CHECK(back.records[0].kind == static_cast<uint8_t>(TraceKind::kCopy));
}

TEST_CASE("io trace: a file that cannot be created is an IoError naming it") {
  TempDir dir;
  const std::string path = (dir.path() / "missing" / "t.trace").string();
  CHECK_THROWS_WITH_AS(IoTrace(path, "/r", 1), doctest::Contains("missing/t.trace"),
                       prestage::IoError);
}
