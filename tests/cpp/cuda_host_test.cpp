// CUDA registration of the batch ring's buffers, against a test double of the runtime
// (fake_cudart.c, opened from FAKE_CUDART_PATH) that records every call.
#include <doctest/doctest.h>

#include <dlfcn.h>
#include <oneapi/tbb/global_control.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "memory/batch_ring.hpp"
#include "memory/cuda_host.hpp"
#include "prestage/prestage.hpp"
#include "test_util.hpp"
#include "util/cuda_open.hpp"

using prestage::DecodeMode;
using prestage::Pinning;
using prestage::detail::BatchRing;
using prestage::detail::CudaHost;
using prestage::detail::PinnedBuffer;

namespace {

struct Call {  // fake_cudart_call
  int op;
  uintptr_t pointer;
  size_t size;
  int device;
  unsigned flags;
  int result;
};
enum { kCount = 1, kRegister = 2, kUnregister = 3, kSetDevice = 4 };
constexpr int kMemoryAllocation = 2;  // cudaErrorMemoryAllocation
constexpr int kNoDevice = 100;        // cudaErrorNoDevice

// The double's controls; the library stays open (as prestage's own handle does).
struct Fake {
  void* library = ::dlopen(FAKE_CUDART_PATH, RTLD_NOW | RTLD_LOCAL);
  void (*configure)(int, int, int) = nullptr;
  size_t (*calls)(Call*, size_t) = nullptr;
  size_t (*registered)() = nullptr;
  int (*set_device)(int) = nullptr;

  Fake() {
    REQUIRE(library != nullptr);
    configure =
        reinterpret_cast<void (*)(int, int, int)>(::dlsym(library, "fake_cudart_configure"));
    calls = reinterpret_cast<size_t (*)(Call*, size_t)>(::dlsym(library, "fake_cudart_calls"));
    registered = reinterpret_cast<size_t (*)()>(::dlsym(library, "fake_cudart_registered"));
    set_device = reinterpret_cast<int (*)(int)>(::dlsym(library, "cudaSetDevice"));
    const bool found = configure && calls && registered && set_device;
    REQUIRE(found);
  }
  ~Fake() { ::dlclose(library); }

  std::vector<Call> log() const {
    std::vector<Call> out(4096);
    out.resize(std::min(calls(out.data(), out.size()), out.size()));
    return out;
  }
  std::vector<Call> log(int op) const {
    std::vector<Call> out;
    for (const Call& c : log()) {
      if (c.op == op) out.push_back(c);
    }
    return out;
  }
};

// Every successful registration is followed, later in the log, by exactly one successful
// unregistration of the same pointer, before that pointer is registered again.
void check_paired(const std::vector<Call>& log) {
  std::map<uintptr_t, size_t> open;  // pointer -> size
  for (const Call& c : log) {
    if (c.result != 0) continue;
    if (c.op == kRegister) {
      CHECK(open.count(c.pointer) == 0);
      open[c.pointer] = c.size;
    } else if (c.op == kUnregister) {
      REQUIRE(open.count(c.pointer) == 1);
      CHECK(open[c.pointer] == c.size);
      open.erase(c.pointer);
    }
  }
  CHECK(open.empty());
}

size_t count_calls(const std::vector<Call>& log, int op, uintptr_t pointer) {
  size_t n = 0;
  for (const Call& c : log) n += c.op == op && c.pointer == pointer && c.result == 0;
  return n;
}

}  // namespace

TEST_CASE("cuda host: PRESTAGE_CUDART=none or a library that cannot be opened: no registration") {
  const CudaHost off("none");
  CHECK_FALSE(off.available());
  CHECK_FALSE(off.why().empty());
  CHECK(off.current_device() == -1);
  const CudaHost missing("/nonexistent/libcudart.so");
  CHECK_FALSE(missing.available());
  CHECK_FALSE(missing.why().empty());
  // A library without the runtime's entry points (the C library) is refused too.
  const CudaHost not_cuda("libc.so.6");
  CHECK_FALSE(not_cuda.available());
  // The ring then page-locks (or not), and says why it did not register.
  BatchRing ring(2, 4, 4096, DecodeMode::kRaw, off);
  const PinnedBuffer::Status s = ring.status();
  CHECK(s.pinning != Pinning::kCuda);
  CHECK(s.why.find(off.why()) != std::string::npos);
}

TEST_CASE("cuda host: no runtime found: the reason names every place looked at") {
  const std::vector<std::string> tried = {"libcudart-absent.so.99",
                                          "/nonexistent/nvidia/lib/libcudart.so.12"};
  const CudaHost host(tried);
  CHECK_FALSE(host.available());
  for (const std::string& name : tried) CHECK(host.why().find(name) != std::string::npos);
  CHECK(host.why().find("PRESTAGE_CUDART") != std::string::npos);
}

TEST_CASE("cuda host: the search opens the first candidate that exists, in order") {
  Fake fake;
  fake.configure(1, 0, 0);
  const CudaHost host(std::vector<std::string>{"/nonexistent/libcudart.so.13", FAKE_CUDART_PATH});
  CHECK(host.available());
  CHECK(host.why().find(FAKE_CUDART_PATH) != std::string::npos);
}

TEST_CASE("cuda host: the default search covers the loader's path, NVIDIA's wheels, CUDA_HOME") {
  const std::vector<std::string> names =
      prestage::detail::cuda_search("cudart", "/site/prestage", "/opt/cuda-12.4");
  const auto position = [&](const std::string& name) {
    const auto it = std::find(names.begin(), names.end(), name);
    REQUIRE_MESSAGE(it != names.end(), name);
    return it - names.begin();
  };
  // Sonames first (a runtime PyTorch already loaded is found by its soname), then paths.
  CHECK(position("libcudart.so") < position("libcudart.so.12"));
  CHECK(position("libcudart.so.11") < position("/site/nvidia/cuda_runtime/lib/libcudart.so.12"));
  CHECK(position("/site/nvidia/cu13/lib/libcudart.so.13") <
        position("/opt/cuda-12.4/lib64/libcudart.so.12"));
  CHECK(position("/opt/cuda-12.4/lib64/libcudart.so.12") <
        position("/usr/local/cuda/lib64/libcudart.so.12"));
  // Without a package directory or CUDA_HOME, neither kind of path appears.
  for (const std::string& name : prestage::detail::cuda_search("cudart", "", "")) {
    CHECK(name.find("nvidia") == std::string::npos);
    CHECK(name.find("/opt/") == std::string::npos);
  }
}

TEST_CASE("cuda host: no device, or cudaGetDeviceCount failing: never a call to register") {
  Fake fake;
  for (const auto& [devices, error] : {std::pair{0, 0}, std::pair{1, kNoDevice}}) {
    fake.configure(devices, error, 0);
    const CudaHost host(FAKE_CUDART_PATH);
    CHECK_FALSE(host.available());
    {
      BatchRing ring(3, 4, 10000, DecodeMode::kRaw, host);
      CHECK(ring.pinned() != Pinning::kCuda);
      CHECK(ring.status().why == host.why());
    }
    CHECK(fake.log(kCount).size() == 1);
    CHECK(fake.log(kRegister).empty());
    CHECK(fake.log(kUnregister).empty());
  }
}

TEST_CASE("cuda host: every buffer is registered once and unregistered once, before it is freed") {
  Fake fake;
  fake.configure(1, 0, 0);
  const CudaHost host(FAKE_CUDART_PATH);
  REQUIRE(host.available());
  std::vector<uintptr_t> buffers;
  {
    BatchRing ring(3, 4, 10000, DecodeMode::kJpeg, host);
    CHECK(ring.pinned() == Pinning::kCuda);
    CHECK(fake.registered() == 3);
    for (int i = 0; i < 3; ++i) {
      auto* slot = ring.acquire();
      CHECK(slot->data.pinning() == Pinning::kCuda);
      buffers.push_back(reinterpret_cast<uintptr_t>(slot->data.data()));
    }
    const auto registered = fake.log(kRegister);
    REQUIRE(registered.size() == 3);
    for (const Call& c : registered) {
      CHECK(c.result == 0);
      CHECK(c.size >= 10000);
      CHECK(c.size % ::sysconf(_SC_PAGESIZE) == 0);
    }
    CHECK(fake.log(kUnregister).empty());  // none while the ring lives
  }
  CHECK(fake.registered() == 0);
  const auto log = fake.log();
  for (uintptr_t p : buffers) {
    CHECK(count_calls(log, kRegister, p) == 1);
    CHECK(count_calls(log, kUnregister, p) == 1);
  }
  check_paired(log);
}

TEST_CASE("cuda host: a buffer regrown by reserve is unregistered, then the new one registered") {
  Fake fake;
  fake.configure(1, 0, 0);
  const CudaHost host(FAKE_CUDART_PATH);
  std::vector<std::byte*> seen;
  {
    PinnedBuffer buffer;
    buffer.use_cuda(&host, -1);
    buffer.reserve(100);
    seen.push_back(buffer.data());
    buffer.reserve(buffer.capacity());  // no change: no call
    CHECK(fake.log().size() == 2);      // count, register
    buffer.reserve(buffer.capacity() * 8);
    seen.push_back(buffer.data());
    buffer.reserve(buffer.capacity() * 8);
    seen.push_back(buffer.data());
    CHECK(buffer.pinning() == Pinning::kCuda);
    buffer.data()[buffer.capacity() - 1] = std::byte{1};
  }
  std::vector<Call> log;
  for (const Call& c : fake.log()) {
    if (c.op == kRegister || c.op == kUnregister) log.push_back(c);
  }
  REQUIRE(log.size() == 6);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(log[2 * i].op == kRegister);
    CHECK(log[2 * i].pointer == reinterpret_cast<uintptr_t>(seen[i]));
    CHECK(log[2 * i + 1].op == kUnregister);
    CHECK(log[2 * i + 1].pointer == reinterpret_cast<uintptr_t>(seen[i]));
  }
  check_paired(fake.log());
}

TEST_CASE("cuda host: a failing cudaHostRegister falls back to mlock and says why") {
  Fake fake;
  fake.configure(1, 0, kMemoryAllocation);
  const CudaHost host(FAKE_CUDART_PATH);
  REQUIRE(host.available());
  {
    BatchRing ring(2, 4, 8192, DecodeMode::kRaw, host);
    const PinnedBuffer::Status s = ring.status();
    CHECK(s.pinning != Pinning::kCuda);  // kMlock, or kNone where RLIMIT_MEMLOCK refuses
    CHECK(s.why.find("cudaHostRegister") != std::string::npos);
    CHECK(s.why.find(std::to_string(kMemoryAllocation)) != std::string::npos);
    CHECK(fake.log(kRegister).size() == 2);
  }
  CHECK(fake.log(kUnregister).empty());  // nothing registered, nothing to unregister
  // Registration works again: a new buffer is registered.
  fake.configure(1, 0, 0);
  PinnedBuffer buffer;
  buffer.use_cuda(&host, -1);
  buffer.reserve(4096);
  CHECK(buffer.pinning() == Pinning::kCuda);
  CHECK(buffer.status().why == host.why());
}

TEST_CASE("cuda host: a buffer grown in another thread is registered on the ring's device") {
  Fake fake;
  fake.configure(2, 0, 0);
  const CudaHost host(FAKE_CUDART_PATH);
  REQUIRE(fake.set_device(1) == 0);  // this thread uses device 1, as a rank of a two-GPU node would
  CHECK(host.current_device() == 1);
  {
    BatchRing ring(1, 1, 4096, DecodeMode::kRaw, host);
    auto* slot = ring.acquire();
    std::thread decoder(
        [&] { slot->data.reserve(1 << 20); });  // a decode thread: device 0 until set
    decoder.join();
    ring.release(slot);
    const auto registered = fake.log(kRegister);
    REQUIRE(registered.size() == 2);
    CHECK(registered[0].device == 1);
    CHECK(registered[1].device == 1);
  }
  REQUIRE(fake.set_device(0) == 0);
  check_paired(fake.log());
}

TEST_CASE("cuda host: the ring's pinning can be read while a buffer is regrown in another thread") {
  Fake fake;
  fake.configure(1, 0, 0);
  const CudaHost host(FAKE_CUDART_PATH);
  BatchRing ring(2, 1, 4096, DecodeMode::kRaw, host);
  auto* slot = ring.acquire();
  std::atomic<bool> done{false};
  std::atomic<size_t> reads{0};
  std::thread grower([&] {
    // Each regrowth waits for a read after it, so that the reads and the regrowths interleave
    // whatever the scheduling (a loaded machine could otherwise run all of them between two reads).
    for (size_t bytes = 8192; bytes <= (size_t{1} << 22); bytes *= 2) {
      const size_t seen = reads.load();
      slot->data.reserve(bytes);
      while (reads.load() == seen) std::this_thread::yield();
    }
    done = true;
  });
  bool always_cuda = true;
  do {  // as stats() does from the consumer's thread while a decode thread grows a slot
    const PinnedBuffer::Status s = ring.status();
    always_cuda = always_cuda && s.pinning == Pinning::kCuda && s.why == host.why();
    reads.fetch_add(1);
  } while (!done.load());
  grower.join();
  CHECK(always_cuda);  // a regrowth never shows as a buffer that lost its registration
  CHECK(reads.load() >= 10);
  ring.release(slot);
  CHECK(fake.log(kRegister).size() == 2 + 10);
}

TEST_CASE(
    "cuda host: a Batch held after its loader is closed stays registered until it is released") {
  Fake fake;
  fake.configure(1, 0, 0);
  // The loader uses the process's runtime, loaded once from the environment: the double, here.
  ::setenv("PRESTAGE_CUDART", FAKE_CUDART_PATH, 1);
  REQUIRE(CudaHost::instance().available());
  prestage::test::TempDir dir;
  prestage::test::make_image_folder(dir / "data", 2, 6);
  const prestage::Catalog cat = prestage::Catalog::from_folder(dir / "data");
  prestage::LoaderOptions o;
  o.batch_size = 4;
  o.depth = 2;
  // The images' own size: buffers of a known size, allocated and registered when the loader is
  // built (without an image_size they are allocated, as for arrays, when the first batches are laid
  // out).
  o.image_size = {16, 24};
  // oneTBB frees an arena observer (the loader's ArenaIoTimeout) lazily, in a worker thread: joined
  // below before the process exits, so that a leak check at exit does not see it in flight.
  tbb::task_scheduler_handle workers{tbb::attach{}};

  for (const bool race : {false, true}) {
    fake.configure(1, 0, 0);
    auto loader = std::make_unique<prestage::Loader>(cat, o);
    CHECK(loader->stats().pinned == Pinning::kCuda);
    CHECK(loader->stats().pinned_why == CudaHost::instance().why());
    std::optional<prestage::Batch> batch = loader->next();
    REQUIRE(batch.has_value());
    CHECK(batch->pinning() == Pinning::kCuda);
    CHECK(batch->pinned());
    const auto buffer = reinterpret_cast<uintptr_t>(batch->data().data());
    const std::vector<std::byte> snapshot(batch->data().begin(), batch->data().end());
    CHECK(count_calls(fake.log(), kRegister, buffer) == 1);
    if (race) {
      // close() in one thread while this one reads and releases the batch.
      std::thread closer([&] { loader->close(); });
      CHECK(std::memcmp(batch->data().data(), snapshot.data(), snapshot.size()) == 0);
      batch.reset();
      closer.join();
      loader.reset();
    } else {
      loader->close();
      loader.reset();
      // The ring outlives the loader while the batch holds it: nothing unregistered yet.
      CHECK(fake.log(kUnregister).empty());
      CHECK(fake.registered() == o.depth);
      CHECK(std::memcmp(batch->data().data(), snapshot.data(), snapshot.size()) == 0);
      batch.reset();
    }
    CHECK(fake.registered() == 0);
    const auto log = fake.log();
    CHECK(count_calls(log, kUnregister, buffer) == 1);
    CHECK(fake.log(kRegister).size() == o.depth);
    check_paired(log);
  }
  CHECK(tbb::finalize(workers, std::nothrow));
}
