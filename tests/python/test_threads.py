"""Which calls of one prestage.Loader may run at once: stats() and close() from other threads while
one waits for a batch."""

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


def test_close_from_two_threads_at_once(stalled_catalog, native_threads):
    before = native_threads()
    loader = prestage.Loader(stalled_catalog, batch_size=1, image_size=(8, 8), io_timeout=600)
    outcome = []
    waiter = _wait_for_a_batch(loader, outcome)
    time.sleep(0.2)
    closers = [threading.Thread(target=loader.close, daemon=True) for _ in range(2)]
    for closer in closers:
        closer.start()
    for thread in closers + [waiter]:
        thread.join(timeout=20)
        assert not thread.is_alive()
    assert outcome == ["closed"]
    # Both returned once the loader's threads were joined (the stalled read left behind excepted).
    assert native_threads() <= before + 1
