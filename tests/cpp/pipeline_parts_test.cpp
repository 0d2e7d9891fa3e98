// The pipeline's parts that hold no thread of their own: the window's held-back slots and the
// consumer's hand-off queue.
#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "memory/batch_ring.hpp"
#include "pipeline/hand_off.hpp"
#include "pipeline/window.hpp"

using prestage::detail::BatchRing;
using prestage::detail::HandOff;
using prestage::detail::Slot;
using prestage::detail::WindowHold;
using namespace std::chrono_literals;

TEST_CASE("window: a lower lookahead holds slots back at once or at the next releases") {
  WindowHold hold(8);
  CHECK(hold.start(8) == 0);
  CHECK_FALSE(hold.hold_release());
  // Down to 5: 3 slots owed, taken from the next 3 releases, not from the limiter at once.
  CHECK(hold.set(5) == 0);
  CHECK(hold.hold_release());
  CHECK(hold.hold_release());
  CHECK(hold.hold_release());
  CHECK_FALSE(hold.hold_release());
  // Up to 7: 2 of the 3 held back are given back now.
  CHECK(hold.set(7) == 2);
  // Down to 4 (3 owed), then up to 6 before any release: the owed ones are cancelled first.
  CHECK(hold.set(4) == 0);
  CHECK(hold.set(6) == 0);
  CHECK(hold.hold_release());  // one still owed: 8 - 6 = 2 held back in all
  CHECK_FALSE(hold.hold_release());
  CHECK(hold.set(8) == 2);
  // A restart with lookahead 3 takes 5 slots at once; a lookahead above the most holds none.
  CHECK(hold.start(3) == 5);
  CHECK(hold.set(100) == 5);
}

TEST_CASE("hand-off: batches in order; a skip passes over planned ones; interrupt and failure") {
  auto ring = std::make_shared<BatchRing>(4, 1, 16, prestage::DecodeMode::kRaw);
  std::atomic<uint64_t> planned{0}, drop_before{0};
  HandOff queue(*ring);
  std::vector<Slot*> slots;
  for (int i = 0; i < 3; ++i) slots.push_back(ring->acquire());
  const auto never = [](uint64_t) { FAIL("no patience was given"); };
  queue.push(slots[0]);
  CHECK(queue.pop(1s, std::nullopt, never) == slots[0]);
  // Nothing ready: a timeout, not a wait without end.
  CHECK(queue.pop(10ms, std::nullopt, never) == nullptr);
  // Skipping 2 needs both planned: 1 planned past the one delivered is too few.
  planned = 2;
  CHECK_FALSE(queue.skip(2, planned, drop_before));
  planned = 3;
  CHECK(queue.skip(2, planned, drop_before));
  CHECK(drop_before == 3);
  queue.push(slots[1]);
  queue.push(slots[2]);
  ring->release(slots[0]);
  const size_t free_before = ring->free_count();
  // Both were dropped: given back to the ring, and nothing delivered.
  CHECK(queue.pop(10ms, std::nullopt, never) == nullptr);
  CHECK(ring->free_count() == free_before + 2);
  std::thread waker([&] {
    std::this_thread::sleep_for(20ms);
    queue.interrupt();
  });
  CHECK(queue.pop(10s, std::nullopt, never) == nullptr);
  waker.join();
  HandOff failing(*ring);
  failing.fail(std::make_exception_ptr(std::runtime_error("broken")));
  CHECK_THROWS_WITH(failing.pop(1s, std::nullopt, never), "broken");
}

TEST_CASE("hand-off: past its patience a wait expedites the batch waited for") {
  auto ring = std::make_shared<BatchRing>(2, 1, 16, prestage::DecodeMode::kRaw);
  HandOff queue(*ring);
  std::vector<uint64_t> expedited;
  const auto expedite = [&](uint64_t seq) { expedited.push_back(seq); };
  CHECK(queue.pop(60ms, 20ms, expedite) == nullptr);
  CHECK(expedited == std::vector<uint64_t>{0});
  // The same batch waited for again: its patience ran out already (counted from the first wait),
  // so it is expedited again at once (the stager takes a second call as the first).
  CHECK(queue.pop(30ms, 20ms, expedite) == nullptr);
  CHECK(expedited == std::vector<uint64_t>{0, 0});
  Slot* slot = ring->acquire();
  queue.push(slot);
  CHECK(queue.pop(1s, 20ms, expedite) == slot);
  // The next batch has a patience of its own: not expedited before it ends.
  const auto next = std::chrono::steady_clock::now();
  CHECK(queue.pop(10ms, 20ms, expedite) == nullptr);
  CHECK(expedited.size() == 2);
  CHECK(queue.pop(60ms, 20ms, expedite) == nullptr);
  CHECK(expedited == std::vector<uint64_t>{0, 0, 1});
  CHECK(std::chrono::steady_clock::now() - next >= 20ms);
  ring->release(slot);
}
