#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>

#include "memory/batch_ring.hpp"
#include "prestage/batch.hpp"

using prestage::DecodeMode;
using prestage::detail::BatchRing;

TEST_CASE("batch ring: buffers are page-aligned, allocated once, and recycled") {
  auto ring = std::make_shared<BatchRing>(3, 8, 100000, DecodeMode::kJpeg);
  CHECK(ring->depth() == 3);
  CHECK(ring->free_count() == 3);
  auto* a = ring->acquire();
  auto* b = ring->acquire();
  CHECK(a != b);
  CHECK(reinterpret_cast<uintptr_t>(a->data.data()) % ::sysconf(_SC_PAGESIZE) == 0);
  CHECK(a->data.capacity() >= 100000);
  CHECK(a->labels.capacity() >= 8);
  CHECK(ring->free_count() == 1);
  const std::byte* memory = a->data.data();
  ring->release(a);
  ring->release(b);
  CHECK(ring->free_count() == 3);
  // The same buffers come back: nothing is allocated per batch.
  auto* again = ring->acquire();
  CHECK((again->data.data() == memory || again == b));
}

TEST_CASE("batch ring: a Batch returns its buffer exactly once, when it (or its last owner) dies") {
  auto ring = std::make_shared<BatchRing>(2, 4, 4096, DecodeMode::kJpeg);
  std::atomic<int> releases{0};
  ring->set_release_hook([&] { releases.fetch_add(1); });
  {
    prestage::Batch first(ring, ring->acquire());
    CHECK(ring->free_count() == 1);
    prestage::Batch moved(std::move(first));
    CHECK(releases.load() == 0);
    prestage::Batch other(ring, ring->acquire());
    other = std::move(moved);  // `other`'s own buffer goes back now
    CHECK(releases.load() == 1);
    CHECK(ring->free_count() == 1);
  }
  CHECK(releases.load() == 2);
  CHECK(ring->free_count() == 2);
}

TEST_CASE("batch ring: a buffer outlives its ring's other owners while a Batch holds it") {
  prestage::Batch kept = [] {
    auto ring = std::make_shared<BatchRing>(1, 1, 64, DecodeMode::kRaw);
    auto* slot = ring->acquire();
    slot->data_bytes = 3;
    std::memcpy(slot->data.data(), "abc", 3);
    return prestage::Batch(ring, slot);
  }();
  REQUIRE(kept.data().size() == 3);
  CHECK(static_cast<char>(kept.data()[2]) == 'c');
}

TEST_CASE("pinned buffer: reserve grows, keeps alignment, and reports page-locking") {
  prestage::detail::PinnedBuffer buffer;
  buffer.reserve(10);
  CHECK(buffer.capacity() >= 10);
  const size_t first = buffer.capacity();
  buffer.reserve(first);  // no change
  CHECK(buffer.capacity() == first);
  buffer.reserve(first * 3);
  CHECK(buffer.capacity() >= first * 3);
  CHECK(reinterpret_cast<uintptr_t>(buffer.data()) % ::sysconf(_SC_PAGESIZE) == 0);
  // Locking is allowed or not by RLIMIT_MEMLOCK; either way the buffer is usable.
  buffer.data()[buffer.capacity() - 1] = std::byte{7};
  CHECK(buffer.data()[buffer.capacity() - 1] == std::byte{7});
}

TEST_CASE(
    "batch ring: a buffer that grows takes a quarter more, and the others grow to it at once") {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  auto ring = std::make_shared<BatchRing>(3, 8, 0, DecodeMode::kRaw);
  CHECK(ring->held_bytes() == 3 * page);  // nothing asked for: a page each
  auto* a = ring->acquire();
  auto* b = ring->acquire();
  a->data.reserve(100 * page);
  const size_t grown = a->data.capacity();
  CHECK(grown >= 125 * page);
  CHECK(grown <= 126 * page);
  // A smaller batch in another buffer: it grows to what the first grew to, not once per size.
  b->data.reserve(2 * page);
  CHECK(b->data.capacity() == grown);
  b->data.reserve(grown);  // within it: no change
  CHECK(b->data.capacity() == grown);
  CHECK(ring->held_bytes() == 2 * grown + page);
  ring->release(a);
  ring->release(b);
}
