"""Which calls of one prestage.Loader may run at once: stats() and close() from other threads while
one waits for a batch."""

import os
import threading
import time

import prestage


def _wait_for_a_batch(loader, outcome):
    """The next batch of a new iteration, in a daemon thread: what it gave or raised goes to outcome."""

    def wait():
        try:
            next(iter(loader))
            outcome.append("batch")
        except prestage.ConfigError:
            outcome.append("closed")
        except BaseException as e:  # noqa: B036 - reported to the test, not swallowed
            outcome.append(e)

    thread = threading.Thread(target=wait, daemon=True)  # a hung one must not hold up the run
    thread.start()
    return thread


def _watch_stats(loader, stop, problems):
    """stats() without pause until stop is set; anything odd goes to problems."""

    def watch():
        while not stop.is_set():
            try:
                s = loader.stats()
                if s.get("batches", 0) != 0 or s.get("consumer_stall_s", 0) < 0:
                    problems.append(s)
            except BaseException as e:  # noqa: B036
                problems.append(e)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_close_from_another_thread_wakes_a_next_that_waits(stalled_catalog):
    # The one sample's read never returns, so the batch never comes.
    loader = prestage.Loader(stalled_catalog, batch_size=1, image_size=(8, 8), io_timeout=600)
    outcome, problems, stop = [], [], threading.Event()
    waiter = _wait_for_a_batch(loader, outcome)
    watcher = _watch_stats(loader, stop, problems)
    give_up = time.monotonic() + 10
    while loader.stats()["consumer_stall_s"] < 0.2 and time.monotonic() < give_up:
        time.sleep(0.01)
    waiting = loader.stats()
    assert waiting["consumer_stall_s"] >= 0.2  # the wait under way counts
    assert waiting["batches"] == 0
    assert waiter.is_alive()

    closer = threading.Thread(target=loader.close, daemon=True)
    closing = time.monotonic()
    closer.start()
    closer.join(timeout=20)
    waiter.join(timeout=20)
    assert not closer.is_alive(), "close() hung"
    assert not waiter.is_alive(), "next() did not wake"
    assert time.monotonic() - closing < 10
    assert outcome == ["closed"]
    stop.set()
    watcher.join(timeout=20)
    assert not watcher.is_alive()
    assert problems == []
    closed = loader.stats()  # the figures at closing
    assert closed["batches"] == 0
    assert closed["consumer_stall_s"] >= waiting["consumer_stall_s"]
    assert loader.state_dict()["batch"] == 0


def _threads():
    """{native id: name} of this process's threads; a thread that ends while it is read is left out."""
    names = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names[int(tid)] = f.read().strip()
        except OSError:
            pass
    return names


def test_close_from_two_threads_at_once(stalled_catalog):
    # Threads are told apart by identity, not counted: a count against the threads of before the
    # loader is off by the process's I/O helpers (shared with earlier tests' loaders, idle ones
    # leaving 2 s later), by one helper per read of the stalled sample under way (this epoch's batch
    # and the next epoch's: one or two), and by the test's own threads, joined but not yet gone.
    before = set(_threads())
    loader = prestage.Loader(stalled_catalog, batch_size=1, image_size=(8, 8), io_timeout=600)
    outcome = []
    waiter = _wait_for_a_batch(loader, outcome)
    give_up = time.monotonic() + 10
    while loader.stats()["consumer_stall_s"] == 0 and time.monotonic() < give_up:
        time.sleep(0.01)  # until the waiter waits in next()
    closers = [threading.Thread(target=loader.close, daemon=True) for _ in range(2)]
    for closer in closers:
        closer.start()
    for thread in closers + [waiter]:
        thread.join(timeout=20)
        assert not thread.is_alive()
    assert outcome == ["closed"]
    # Both returned once every thread of the loader was joined: what is left that was not there
    # before is the I/O helpers (the stalled reads left behind, or idle) and the test's own threads.
    ours = {thread.native_id for thread in closers + [waiter]}
    left = {tid: name for tid, name in _threads().items() if tid not in before | ours}
    assert [name for name in left.values() if name != "prestage-io"] == [], left
