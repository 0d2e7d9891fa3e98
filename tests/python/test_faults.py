"""Faults injected for real: a full, read-only or vanishing stage directory, a process killed while
staging, a source replaced after staging, processes sharing a stage directory, read errors (EIO) and
stalls of the source (through the emulated parallel file system), and every way a loader's life can
end. In each case the loader goes on and serves exactly the source's bytes."""

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import prestage


def pil_rgb(path):
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def check_epoch(loader, cat):
    """Runs an epoch and checks every image against Pillow; returns the samples seen."""
    seen = []
    for b in loader:
        for k, i in enumerate(b.indices):
            np.testing.assert_array_equal(b.images[k], pil_rgb(cat.source_path(int(i))))
            seen.append(int(i))
    assert sorted(seen) == list(range(len(cat)))
    return seen


def test_a_stage_directory_that_fills_up_falls_back_to_direct_reads(make_folder, tmpfs):
    cat = prestage.Catalog.from_folder(make_folder(3, 12, size=(64, 96)))
    total = sum(cat.source_path(i).stat().st_size for i in range(len(cat)))
    small = tmpfs(max(16, total // 2048))  # room for about half the set
    # cache_bytes=0: no bound, whatever the free space (the default would bound it; see below).
    with prestage.Loader(cat, batch_size=4, stage_dir=small, cache_bytes=0) as loader:
        check_epoch(loader, cat)
        check_epoch(loader, cat)
        s = loader.stats(epochs="all")
    assert s["stage_dir_disabled"]
    assert "No space left" in s["stage_dir_error"]
    assert 0 < s["staged_files"] < len(cat)
    assert s["read_ahead"] > 0  # once full, the files not staged are read ahead into memory
    assert s["epochs"][1]["hits"] > 0  # and the copies made before are still served


def test_by_default_a_stage_directory_too_small_for_the_set_is_bounded_not_filled(make_folder, tmpfs):
    cat = prestage.Catalog.from_folder(make_folder(3, 12, size=(64, 96)))
    total = sum(cat.source_path(i).stat().st_size for i in range(len(cat)))
    small = tmpfs(max(16, total // 2048))  # room for about half the set
    free = shutil.disk_usage(small).free
    with prestage.Loader(cat, batch_size=4, stage_dir=small, stage_patience=None) as loader:
        check_epoch(loader, cat)
        check_epoch(loader, cat)
        s = loader.stats(epochs="all")
    assert 0 < s["cache_bytes"] <= 0.9 * free  # 90% of the room at start
    assert not s["stage_dir_disabled"], s["stage_dir_error"]
    assert 0 < s["stage_bytes_peak"] <= s["cache_bytes"]
    assert s["read_ahead"] > 0  # the files kept out were read into memory instead
    assert s["epochs"][1]["hits"] > 0  # and what fits is staged and reused


def test_by_default_a_set_that_fits_is_not_bounded(folder, tmp_path):
    cat = prestage.Catalog.from_folder(folder)
    with prestage.Loader(cat, batch_size=4, stage_dir=tmp_path / "stage") as loader:
        check_epoch(loader, cat)
        assert loader.stats(epochs="all")["cache_bytes"] == 0


def test_a_read_only_stage_directory_is_not_fatal(folder, tmpfs):
    cat = prestage.Catalog.from_folder(folder)
    ro = tmpfs(1024)
    subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
    with prestage.Loader(cat, batch_size=4, stage_dir=ro) as loader:
        check_epoch(loader, cat)
        s = loader.stats(epochs="all")
    assert s["stage_dir_disabled"] and "Read-only" in s["stage_dir_error"]
    assert s["misses"] >= len(cat)
    assert s["read_ahead"] > 0  # by stage 2, into memory, as the directory cannot take copies


def test_a_stage_directory_that_disappears_mid_epoch(make_folder, tmp_path):
    cat = prestage.Catalog.from_folder(make_folder(3, 10))
    stage = tmp_path / "stage"
    with prestage.Loader(cat, batch_size=3, stage_dir=stage, lookahead=1, depth=2) as loader:
        seen = []
        for k, b in enumerate(loader):
            if k == 2:
                subprocess.run(["rm", "-rf", str(stage)], check=True)
            for j, i in enumerate(b.indices):
                np.testing.assert_array_equal(b.images[j], pil_rgb(cat.source_path(int(i))))
                seen.append(int(i))
        assert sorted(seen) == list(range(len(cat)))
        del b  # holds a buffer
        check_epoch(loader, cat)  # copies gone: read from the source
        s = loader.stats(epochs="all")
    assert s["stage_dir_disabled"] or s["misses"] > 0


KILLED_RUN = textwrap.dedent("""
    import sys, time, prestage
    cat = prestage.Catalog.from_folder(sys.argv[1])
    loader = prestage.Loader(cat, batch_size=2, stage_dir=sys.argv[2], prefetchers=8, lookahead=64,
                             depth=2, decode="raw")
    for b in loader:
        print("batch", flush=True)
        time.sleep(0.05)  # a slow consumer: stage 2 runs far ahead, copying
""")


def test_killed_while_staging_then_restarted_serves_nothing_partial(make_folder, tmp_path):
    root = make_folder(4, 40, size=(256, 256))
    stage = tmp_path / "stage"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_RUN, str(root), str(stage)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "batch"
    time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    cat = prestage.Catalog.from_folder(root)
    with prestage.Loader(cat, batch_size=8, stage_dir=stage) as loader:
        check_epoch(loader, cat)
        s = loader.stats(epochs="all")
    assert s["staged_files"] + s["already_staged"] >= len(cat)
    assert not list(stage.rglob("*.part"))


def test_a_source_replaced_after_staging_is_staged_again(folder, tmp_path):
    cat = prestage.Catalog.from_folder(folder)
    stage = tmp_path / "stage"
    with prestage.Loader(cat, batch_size=4, stage_patience=None, stage_dir=stage) as loader:
        check_epoch(loader, cat)
    victim = cat.source_path(3)
    time.sleep(0.01)  # a distinct modification time
    Image.fromarray(np.full((32, 48, 3), 200, np.uint8)).save(victim, quality=95)
    fresh = prestage.Catalog.from_folder(folder)  # a new job builds (or reloads) its catalog
    with prestage.Loader(fresh, batch_size=4, stage_patience=None, stage_dir=stage) as loader:
        check_epoch(loader, fresh)
        s = loader.stats(epochs="all")
    assert s["staged_files"] == 1  # only the replaced file


SHARED_RUN = textwrap.dedent("""
    import json, sys, prestage
    cat = prestage.Catalog.from_folder(sys.argv[1])
    with prestage.Loader(cat, batch_size=4, stage_patience=None, stage_dir=sys.argv[2], seed=int(sys.argv[3]),
                         decode="raw") as loader:
        for b in loader:
            for k, i in enumerate(b.indices):
                data = b.data[b.offsets[k]:b.offsets[k + 1]].tobytes()
                assert data == cat.source_path(int(i)).read_bytes(), cat.path(int(i))
        s = loader.stats(epochs="all")
    print(json.dumps({"staged": s["staged_files"], "adopted": s["adopted_files"]}))
""")


def test_processes_sharing_a_stage_directory_stage_each_file_once(make_folder, tmp_path):
    import json

    root = make_folder(4, 25, size=(128, 128))
    stage = tmp_path / "stage"
    procs = [subprocess.Popen([sys.executable, "-c", SHARED_RUN, str(root), str(stage), str(seed)],
                              stdout=subprocess.PIPE, text=True) for seed in (1, 2, 3)]
    try:
        outputs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:  # none outlives the test, whatever happened
            p.kill()
            p.wait()
    assert all(p.returncode == 0 for p in procs)
    results = [json.loads(out) for out in outputs]
    assert sum(r["staged"] for r in results) == 100  # each file copied by one process only
    copies = [p for p in stage.rglob("*") if p.is_file() and p.name not in ("index.log", "node.table", "start.lock")]
    assert len(copies) == 100


def test_keyboard_interrupt_while_waiting_is_prompt_and_clean(make_folder, native_threads, sigint_raises):
    import _thread

    cat = prestage.Catalog.from_folder(make_folder(2, 40, size=(512, 512)))
    before = native_threads()
    loader = prestage.Loader(cat, batch_size=40, readers=1, depth=2)
    timer = threading.Timer(0.05, _thread.interrupt_main)
    start = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        for _ in loader:
            pass
    assert time.monotonic() - start < 1.5
    start = time.monotonic()
    loader.close()
    assert time.monotonic() - start < 1.0
    assert native_threads() <= before  # threads of earlier tests may still be leaving


def test_an_exception_in_the_training_loop_leaves_no_thread(folder, native_threads):
    cat = prestage.Catalog.from_folder(folder)
    before = native_threads()
    with pytest.raises(RuntimeError):
        with prestage.Loader(cat, batch_size=2) as loader:
            for _ in loader:
                raise RuntimeError("training step failed")
    assert native_threads() <= before  # threads of earlier tests may still be leaving


def test_interpreter_exit_with_a_live_loader_is_clean(folder):
    code = textwrap.dedent(f"""
        import prestage
        cat = prestage.Catalog.from_folder({str(folder)!r})
        loader = prestage.Loader(cat, batch_size=2, prefetchers=4, stage_dir={str(folder.parent / 'ex')!r})
        it = iter(loader)
        next(it)
        print("exiting", flush=True)
    """)
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert "exiting" in r.stdout
    assert time.monotonic() - start < 10


def test_a_loader_used_after_fork_refuses_clearly(folder):
    cat = prestage.Catalog.from_folder(folder)
    loader = prestage.Loader(cat, batch_size=2)
    next(iter(loader))
    pid = os.fork()
    if pid == 0:  # child: must get a clear error, not a hang or a crash
        code = 3
        try:
            next(iter(loader))
        except prestage.Error as e:
            code = 0 if "fork" in str(e) else 4
        except BaseException:
            code = 5
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    loader.close()


def test_a_loader_made_after_fork_from_a_process_whose_loader_ran_is_refused_at_once(folder, tmp_path):
    # The parent's loader has run: oneTBB's state is in the child without its threads. A loader made
    # there (a DataLoader worker making its own) is refused at construction, saying what to do,
    # instead of waiting for ever at its first batch.
    import select

    cat = prestage.Catalog.from_folder(folder)
    with prestage.Loader(cat, batch_size=2) as loader:
        next(iter(loader))
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            said = "served"
            try:
                with prestage.Loader(cat, batch_size=2, stage_dir=tmp_path / "child") as own:
                    next(iter(own))
            except prestage.Error as e:
                said = f"{type(e).__name__}: {e}"
            os.write(w, said.encode())
            os._exit(0)
        os.close(w)
        ready, _, _ = select.select([r], [], [], 30)
        said = os.read(r, 4096).decode() if ready else "no answer in 30 s"
        if not ready:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    assert said.startswith("Error: ") and "forked" in said and "spawn" in said, said
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_a_stalled_read_times_out_instead_of_hanging(folder, tmp_path):
    import errno

    cat = prestage.Catalog.from_folder(folder)
    paths = [cat.path(i) for i in range(len(cat))]
    fifo = folder / "class_0" / "stalled.jpg"
    os.mkfifo(fifo)  # no writer: opening it blocks, as a read from a hung file server does
    paths.insert(5, "class_0/stalled.jpg")
    stalled = prestage.Catalog.from_paths(folder, paths)
    outcomes = []
    start = time.monotonic()
    try:
        with prestage.Loader(stalled, batch_size=4, shuffle=False, stage_dir=tmp_path / "s",
                             io_timeout=1.0) as loader:
            it = iter(loader)
            while True:
                try:
                    b = next(it)
                except StopIteration:
                    break
                except prestage.IoError as e:
                    assert e.errno == errno.ETIMEDOUT and e.filename == str(fifo)
                    outcomes.append("timeout")
                else:
                    outcomes.append(len(b))
    finally:
        try:  # release the abandoned reads, if any still waits
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
    assert outcomes == [4, "timeout", 4, 4, 4, 2]
    assert time.monotonic() - start < 10


# Read errors and stalls of the source, injected by the emulated parallel file system (FUSE): the
# files are served through a mount, and the emulator makes chosen ones fail with EIO or stall.

def epoch_outcomes(loader, backing, cat):
    """Runs an epoch to its end through the per-sample errors of its batches: one entry per batch,
    either the list of its sample ids, each image checked against Pillow's decode of its file under
    `backing` on arrival (no batch is held), or the IoError or DecodeError the batch raised."""
    outcomes = []
    it = iter(loader)
    while True:
        try:
            b = next(it)
        except StopIteration:
            return outcomes
        except (prestage.IoError, prestage.DecodeError) as e:
            outcomes.append(e)
            continue
        ids = [int(i) for i in b.indices]
        for k, i in enumerate(ids):
            np.testing.assert_array_equal(b.images[k], pil_rgb(backing / cat.path(i)))
        outcomes.append(ids)
        del b


def check_batches(outcomes, plan, cat, failing):
    """Checks an epoch's outcomes against its plan: a batch with a sample of `failing` (catalog path ->
    the errno expected of it) raised an IoError naming one of them, with its errno; every other batch
    holds exactly its planned samples."""
    assert len(outcomes) == len(plan)
    for planned, outcome in zip(plan, outcomes):
        bad = {cat.path(i) for i in planned} & set(failing)
        if bad:
            assert isinstance(outcome, prestage.IoError), outcome
            name = Path(outcome.filename).relative_to(cat.root).as_posix()
            assert name in bad and outcome.errno == failing[name]
        else:
            assert outcome == list(planned)


@pytest.mark.parametrize("where", ["open", "read"])
def test_eio_from_the_source_fails_only_its_batches_and_staging_goes_on(make_folder, pfs, tmp_path,
                                                                        where):
    import errno

    backing = make_folder(3, 8)
    emulator = pfs(backing)
    cat = prestage.Catalog.from_folder(emulator.mountpoint)
    # The files fail only after the catalog was built, as on a file system that breaks mid-job.
    victims = ["class_0/img_002.jpg", "class_2/img_005.jpg"]
    emulator.inject(*(f"eio-{where} {v}" for v in victims))
    plan = prestage.plan.epoch_batches(len(cat), 4, seed=7, epoch=0)
    with prestage.Loader(cat, batch_size=4, seed=7, stage_patience=None, stage_dir=tmp_path / "stage") as loader:
        check_batches(epoch_outcomes(loader, backing, cat), plan, cat, {v: errno.EIO for v in victims})
        s = loader.stats(epochs="all")
        # Stage 2 gave up on the two files (again for the next epoch, if its look-ahead reached it)
        # and staged every other one.
        assert not s["stage_dir_disabled"]
        assert s["stage_failures"] >= len(victims)
        assert s["staged_files"] == len(cat) - len(victims)
        assert emulator.stats()["faults"][f"eio_{where}"] >= 2 * len(victims)  # stages 2 and 3

        # The source recovers: the next epochs serve every sample, and the two files get staged (not
        # at once: batches planned before the recovery, up to `lookahead + depth` and more, read the
        # two files from the source).
        emulator.clear()
        for epoch in (1, 2, 3):
            check_batches(epoch_outcomes(loader, backing, cat),
                          prestage.plan.epoch_batches(len(cat), 4, seed=7, epoch=epoch), cat, {})
        assert loader.stats(epochs="all")["staged_files"] == len(cat)


def test_a_read_stalled_on_the_source_times_out_and_unmounting_is_prompt(make_folder, pfs, tmp_path):
    import errno

    backing = make_folder(3, 6)
    emulator = pfs(backing, stall_read=["class_1/img_004.jpg"])  # for ever, until unmounted
    cat = prestage.Catalog.from_folder(emulator.mountpoint)
    plan = prestage.plan.epoch_batches(len(cat), 4, seed=3, epoch=0)
    start = time.monotonic()
    loader = prestage.Loader(cat, batch_size=4, seed=3, stage_dir=tmp_path / "stage", io_timeout=1.0)
    try:
        check_batches(epoch_outcomes(loader, backing, cat), plan, cat,
                      {"class_1/img_004.jpg": errno.ETIMEDOUT})
        # Stage 2 and stage 3 each wait for the file, then give it up: timeouts, not a hang.
        assert time.monotonic() - start < 5
        assert loader.stats(epochs="all")["stage_failures"] >= 1
        # The abandoned reads are still stalled (a second read of the same page may wait for the
        # first in the kernel instead of reaching the emulator).
        assert emulator.stats()["faults"]["stalled_now"] >= 1
    finally:
        closing = time.monotonic()
        loader.close()
        assert time.monotonic() - closing < 1.0
    stopping = time.monotonic()
    emulator.stop()  # the reads left stalled in the emulator are failed by the unmount
    assert time.monotonic() - stopping < 2.0


def test_a_read_stage_2_gave_up_on_is_not_waited_for_again_by_stage_3(make_folder, pfs, tmp_path):
    import errno

    backing = make_folder(3, 6)
    plan = prestage.plan.epoch_batches(18, 4, seed=3, epoch=0)
    first = plan[0][0]  # class_c/img_i.jpg, in the catalog's sorted order
    victim = f"class_{first // 6}/img_{first % 6:03d}.jpg"
    emulator = pfs(backing, stall_read=[victim])  # for ever, until unmounted
    cat = prestage.Catalog.from_folder(emulator.mountpoint)
    assert cat.path(first) == victim
    # Stage 2 tries the file (a copy) and gives it up after io_timeout; stage 3 does not open it
    # again for the same batch, it raises stage 2's timeout at once.
    loader = prestage.Loader(cat, batch_size=4, seed=3, stage_dir=tmp_path / "stage", io_timeout=0.5,
                             lookahead=1, depth=2, stage_patience=None)
    try:
        with pytest.raises(prestage.IoError) as raised:
            next(iter(loader))
        assert raised.value.errno == errno.ETIMEDOUT
        assert Path(raised.value.filename).relative_to(cat.root).as_posix() == victim
        assert emulator.stats()["paths"][victim]["opens"] == 1
    finally:
        loader.close()
    emulator.stop()


def test_a_slow_read_within_io_timeout_is_not_an_error(make_folder, pfs, tmp_path):
    backing = make_folder(2, 6)
    emulator = pfs(backing, stall_read=["class_0/img_00[0-2].jpg"], stall_ms=100)
    cat = prestage.Catalog.from_folder(emulator.mountpoint)
    plan = prestage.plan.epoch_batches(len(cat), 4, seed=1, epoch=0)
    with prestage.Loader(cat, batch_size=4, seed=1, stage_dir=tmp_path / "stage",
                         io_timeout=2.0) as loader:
        check_batches(epoch_outcomes(loader, backing, cat), plan, cat, {})
        assert loader.stats(epochs="all")["stage_failures"] == 0
    assert emulator.stats()["faults"]["stall_read"] >= 3


def test_a_first_file_that_stalls_times_out_at_its_batch_not_when_the_loader_is_built(make_folder, pfs):
    # Without image_size each image keeps its own size: building the loader reads no image.
    import errno

    backing = make_folder(2, 3)
    emulator = pfs(backing)
    cat = prestage.Catalog.from_folder(emulator.mountpoint)
    emulator.inject(f"stall-read {cat.path(0)}")
    watchdog = threading.Timer(5.0, emulator.clear)  # a hang becomes a failure, not a stuck suite
    watchdog.start()
    start = time.monotonic()
    try:
        with prestage.Loader(cat, batch_size=2, shuffle=False, io_timeout=0.3) as loader:
            it = iter(loader)
            with pytest.raises(prestage.IoError) as error:
                next(it)
            assert next(it).indices.tolist() == [2, 3]  # the epoch goes on
    finally:
        watchdog.cancel()
    assert time.monotonic() - start < 2.0
    assert error.value.errno == errno.ETIMEDOUT and error.value.filename == str(cat.source_path(0))


def test_stage_3_does_not_wait_for_a_slow_stage_2(make_folder, pfs, tmp_path):
    # One prefetcher against 10 ms per PFS operation cannot keep up with 2 readers: when the
    # consumer's next batch is still being staged, stage 3 takes it and reads the files no copy has
    # started from the source itself.
    root = make_folder(2, 24)
    emulator = pfs(root, open_ms=10, read_ms=10)
    cat = prestage.Catalog.from_folder(emulator.mountpoint)
    with prestage.Loader(cat, batch_size=16, seed=1, stage_dir=tmp_path / "stage", prefetchers=1,
                         readers=2, lookahead=2) as loader:
        check_epoch(loader, cat)
        s = loader.stats(epochs="all")
    assert s["stage_expedited"] > 0
    assert s["misses"] >= s["stage_expedited"]  # each given-up file was read by stage 3
    assert s["staged_files"] + s["stage_expedited"] + s["stage_failures"] >= len(cat)
    with prestage.Loader(cat, batch_size=16, seed=1, stage_dir=tmp_path / "waits", prefetchers=1,
                         readers=2, lookahead=2, stage_patience=None) as loader:
        check_epoch(loader, cat)
        s = loader.stats(epochs="all")
    assert s["stage_expedited"] == 0 and s["staged_files"] == len(cat)  # waited for every copy
    with pytest.raises(prestage.ConfigError, match="stage_patience"):
        prestage.Loader(cat, batch_size=16, stage_patience=-1)



def test_copies_of_an_earlier_run_are_checked_after_the_directory_fills_up(make_folder, tmpfs):
    # A first run stages part of the set and stops. Its copies then rot (same size, other bytes:
    # only their records' CRCs can tell) and the directory fills up, so the second run's stage 2
    # soon stops copying and checking. The first run's copies are still there: none may be served.
    cat = prestage.Catalog.from_folder(make_folder(3, 40, size=(64, 96)))
    stage = tmpfs(4096)
    with prestage.Loader(cat, batch_size=4, stage_dir=stage, lookahead=1, cache_bytes=0) as loader:
        for k, _ in enumerate(loader):
            if k == 12:
                break
    copies = [p for p in stage.rglob("*") if p.is_file() and p.suffix != ".log"
              and p.stat().st_size > 1000]
    assert 0 < len(copies) < len(cat)
    for p in copies:
        data = bytearray(p.read_bytes())
        middle = len(data) // 2
        data[middle:middle + 64] = bytes(b ^ 0x5A for b in data[middle:middle + 64])
        p.write_bytes(bytes(data))
    fd = os.open(stage / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, bytes(4096)) > 0:
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    with prestage.Loader(cat, batch_size=4, stage_dir=stage, seed=1, cache_bytes=0) as loader:
        check_epoch(loader, cat)
        s = loader.stats(epochs="all")
    assert s["stage_dir_disabled"] and "No space left" in s["stage_dir_error"]
