import gc
import os
import threading
import time

import numpy as np
import pytest
from PIL import Image

import prestage


def pil_rgb(path):
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def pil_resize_center_crop(path, height, width):
    """torchvision Resize (to cover) + CenterCrop, done with Pillow's antialiased bilinear."""
    with Image.open(path) as im:
        img = im.convert("RGB")
    w, h = img.size
    # The side that binds is scaled to the output exactly; the other is truncated, as torchvision's
    # Resize(int) computes int(size * long / short).
    if height * w >= width * h:
        rh, rw = height, max(width, height * w // h)
    else:
        rh, rw = max(height, width * h // w), width
    img = img.resize((rw, rh), Image.BILINEAR)
    top, left = int(round((rh - height) / 2.0)), int(round((rw - width) / 2.0))
    return np.asarray(img.crop((left, top, left + width, top + height)))


def epoch(loader):
    """(indices, labels, images) of one epoch, copied out of the batches."""
    idx, lab, img = [], [], []
    for b in loader:
        idx.append(b.indices.copy())
        lab.append(b.labels.copy())
        img.append(b.images.copy())
    return np.concatenate(idx), np.concatenate(lab), np.concatenate(img)


def test_native_size_decode_equals_pil(folder, tmp_path):
    cat = prestage.Catalog.from_folder(folder)
    with prestage.Loader(cat, batch_size=4, stage_dir=tmp_path / "stage") as loader:
        idx, lab, img = epoch(loader)
    assert sorted(idx.tolist()) == list(range(len(cat)))
    assert img.shape == (len(cat), 32, 48, 3) and img.dtype == np.uint8
    for k, i in enumerate(idx):
        assert lab[k] == cat.label(int(i))
        np.testing.assert_array_equal(img[k], pil_rgb(cat.source_path(int(i))))


@pytest.mark.parametrize("size", [(24, 24), (16, 40), (50, 30)])
def test_resize_and_center_crop_agree_with_pillow(make_folder, size):
    root = make_folder(2, 4, size=None)  # mixed sizes, landscape and portrait
    cat = prestage.Catalog.from_folder(root)
    with prestage.Loader(cat, batch_size=3, image_size=size) as loader:
        idx, _, img = epoch(loader)
    assert img.shape == (len(cat), *size, 3)
    for k, i in enumerate(idx):
        path = cat.source_path(int(i))
        expected = pil_resize_center_crop(path, *size).astype(int)
        diff = np.abs(img[k].astype(int) - expected)
        with Image.open(path) as im:
            w, h = im.size
        if max(size[0] / h, size[1] / w) > 0.5:
            # Full-size decode, then the same antialiased bilinear resampling as Pillow's.
            assert diff.max() <= 1, (cat.path(int(i)), diff.max())
        else:
            # libjpeg-turbo's DCT scaling (decode at 1/2, 1/4, 1/8) is sharper than Pillow's
            # antialiasing filter: close, not equal (mean below 2.6 over 165 images measured).
            assert diff.mean() < 3.0, (cat.path(int(i)), diff.mean())


def test_batches_identical_for_1_2_4_threads(make_folder, tmp_path):
    cat = prestage.Catalog.from_folder(make_folder(3, 10))
    runs = []
    for threads in (1, 2, 4):
        with prestage.Loader(cat, batch_size=4, image_size=(16, 16), readers=threads,
                             prefetchers=threads, stage_dir=tmp_path / f"s{threads}", seed=9) as loader:
            loader.set_epoch(2)
            runs.append(epoch(loader))
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_sample_once_per_epoch_across_ranks(folder, world, drop_last):
    cat = prestage.Catalog.from_folder(folder)  # 21 samples
    bs = 4
    seen, lengths = [], set()
    for rank in range(world):
        with prestage.Loader(cat, batch_size=bs, rank=rank, world_size=world, drop_last=drop_last,
                             image_size=(8, 8), seed=5) as loader:
            idx, _, _ = epoch(loader)
            lengths.add(len(loader))
            seen.extend(idx.tolist())
    assert len(lengths) == 1
    counts = np.bincount(seen, minlength=len(cat))
    if drop_last:
        assert counts.max() == 1
        assert counts.sum() == len(cat) // (bs * world) * bs * world
    else:
        assert counts.min() == 1  # every sample
        assert counts.sum() - len(cat) < world  # repeats only to even out the ranks


def test_missing_and_corrupt_files_raise_at_their_batch_naming_them(folder, tmp_path):
    cat = prestage.Catalog.from_folder(folder)
    missing, corrupt = 5, 13  # with shuffle=False: batches 1 and 3 of size 4
    cat.source_path(corrupt).write_bytes(b"\xff\xd8\xff\xe0 this is not a jpeg")
    cat = prestage.Catalog.from_folder(folder)  # of its size now: a changed size is an IoError (EIO)
    cat.source_path(missing).unlink()
    loader = prestage.Loader(cat, batch_size=4, shuffle=False, stage_dir=tmp_path / "stage")
    it = iter(loader)
    outcomes = []
    while True:
        try:
            b = next(it)
        except StopIteration:
            break
        except prestage.IoError as e:
            assert isinstance(e, OSError) and e.errno == 2
            assert e.filename == str(cat.source_path(missing))
            outcomes.append("io")
        except prestage.DecodeError as e:
            assert e.path == str(cat.source_path(corrupt))
            assert str(cat.source_path(corrupt)) in str(e)
            outcomes.append("decode")
        else:
            outcomes.append(b.index)
    assert outcomes == [0, "io", 2, "decode", 4, 5]
    loader.close()


def test_second_run_over_the_same_stage_dir_copies_nothing(folder, tmp_path):
    cat = prestage.Catalog.from_folder(folder)
    with prestage.Loader(cat, batch_size=5, stage_patience=None, stage_dir=tmp_path / "stage") as first:
        epoch(first)
        assert first.stats(epochs="all")["staged_files"] == len(cat)
    with prestage.Loader(cat, batch_size=5, stage_patience=None, stage_dir=tmp_path / "stage") as second:
        epoch(second)
        stats = second.stats(epochs="all")
    assert stats["staged_files"] == 0
    assert stats["misses"] == 0 and stats["hits"] >= len(cat)


def test_leftover_partial_files_are_never_served(folder, tmp_path):
    cat = prestage.Catalog.from_folder(folder)
    stage = tmp_path / "stage"
    with prestage.Loader(cat, batch_size=len(cat), stage_patience=None, stage_dir=stage) as first:
        epoch(first)
    own = ("index.log", "node.table", "start.lock")
    copies = [p for p in stage.rglob("*") if p.is_file() and p.name not in own]
    assert len(copies) == len(cat)
    # As a process killed mid-copy leaves them: half-written part files, and copies cut short.
    for k, p in enumerate(copies):
        data = p.read_bytes()
        if k % 2:
            p.unlink()
            p.with_name(p.name + ".part").write_bytes(data[: len(data) // 2])
        else:
            p.write_bytes(data[: len(data) // 2])
    with prestage.Loader(cat, batch_size=4, stage_patience=None, stage_dir=stage) as loader:
        idx, _, img = epoch(loader)
        assert loader.stats(epochs="all")["staged_files"] == len(cat)  # every copy made again
    for k, i in enumerate(idx):
        np.testing.assert_array_equal(img[k], pil_rgb(cat.source_path(int(i))))
    assert not list(stage.rglob("*.part"))


def test_breaking_mid_epoch_and_deleting_leaves_no_thread(make_folder, tmp_path, native_threads):
    cat = prestage.Catalog.from_folder(make_folder(2, 20))
    before = native_threads()
    for threads in (1, 2, 4):
        loader = prestage.Loader(cat, batch_size=2, readers=threads, prefetchers=threads,
                                 stage_dir=tmp_path / "stage")
        for b in loader:
            held = b.images  # a view outliving the loader stays valid
            break
        start = time.monotonic()
        del loader, b
        gc.collect()
        assert time.monotonic() - start < 1.0
        assert held.shape == (2, 32, 48, 3) and int(held.sum()) > 0
        del held
    assert native_threads() <= before  # threads of earlier tests may still be leaving


def test_arrays_are_zero_copy_views_that_keep_their_buffer(folder):
    cat = prestage.Catalog.from_folder(folder)
    with prestage.Loader(cat, batch_size=4, depth=2, shuffle=False) as loader:
        it = iter(loader)
        first = next(it)
        images = first.images
        assert not images.flags.owndata
        assert np.shares_memory(images, first.images)
        snapshot = images.copy()
        del first  # the array alone keeps the buffer lent
        for _ in range(3):  # the other buffer cycles; ours must not be reused
            next(it)
        np.testing.assert_array_equal(images, snapshot)


def test_gil_is_released_while_waiting(make_folder):
    # Enough decoding for a wait well over 10 ms on one reader (256 x 256 took as little as 8 ms).
    cat = prestage.Catalog.from_folder(make_folder(2, 30, size=(640, 640)))
    ticks = [0]
    stop = threading.Event()

    def count():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.0005)

    t = threading.Thread(target=count)
    t.start()
    try:
        with prestage.Loader(cat, batch_size=30, readers=1) as loader:
            start = time.monotonic()
            epoch(loader)
            waited = loader.stats(epochs="all")["consumer_stall_s"]
            elapsed = time.monotonic() - start
    finally:
        stop.set()
        t.join()
    assert waited > 0.01
    assert ticks[0] > 0.25 * elapsed / 0.0005 * (waited / elapsed)


def test_len_set_epoch_and_epochs_advance(folder):
    cat = prestage.Catalog.from_folder(folder)
    loader = prestage.Loader(cat, batch_size=4, image_size=(8, 8))
    assert len(loader) == 6
    e0 = epoch(loader)[0]
    assert loader.epoch == 1
    e1 = epoch(loader)[0]
    assert not np.array_equal(e0, e1)
    loader.set_epoch(0)
    np.testing.assert_array_equal(epoch(loader)[0], e0)
    loader.close()
    loader.close()  # idempotent
    with pytest.raises(prestage.ConfigError):
        iter(loader)


def test_stats_report_every_stage(folder, tmp_path):
    cat = prestage.Catalog.from_folder(folder)
    with prestage.Loader(cat, batch_size=4, stage_patience=None, stage_dir=tmp_path / "s") as loader:
        epoch(loader)
        s = loader.stats(epochs="all")
    for stage in ("plan", "stage", "decode"):
        assert set(s[stage]) == {"busy_s", "idle_s", "items", "bytes"}
    assert s["batches"] == 6 and s["samples"] == len(cat)
    assert s["decode"]["items"] >= len(cat) and s["decode"]["busy_s"] > 0
    assert s["staged_files"] == len(cat)
    assert s["consumer_stall_s"] >= 0 and s["wall_s"] > 0


def test_raw_mode_returns_file_bytes(folder):
    cat = prestage.Catalog.from_folder(folder)
    with prestage.Loader(cat, batch_size=5, decode="raw") as loader:
        for b in loader:
            data, off = b.data, b.offsets
            assert len(off) == len(b) + 1
            for k, i in enumerate(b.indices):
                assert data[off[k]:off[k + 1]].tobytes() == cat.source_path(int(i)).read_bytes()
                assert b.arrays[k].tobytes() == cat.source_path(int(i)).read_bytes()
            assert b.shapes == [(int(off[k + 1] - off[k]),) for k in range(len(b))]


@pytest.mark.parametrize("kwargs", [
    {"batch_size": 0}, {"readers": 0}, {"prefetchers": -1}, {"lookahead": 1.5}, {"depth": 1}, {"rank": 2, "world_size": 2},
    {"image_size": (0, 4)}, {"image_size": (4,)}, {"decode": "png"}, {"batch_size": 2.5},
    {"batch_size": 100, "drop_last": True},
])
def test_bad_options_raise_config_error(folder, kwargs):
    cat = prestage.Catalog.from_folder(folder)
    args = {"batch_size": 4, **kwargs}
    with pytest.raises(prestage.ConfigError):
        prestage.Loader(cat, **args)


def test_mixed_sizes_without_image_size_keep_their_sizes(make_folder):
    cat = prestage.Catalog.from_folder(make_folder(1, 6, size=None))
    with prestage.Loader(cat, batch_size=6) as loader:
        batch = next(iter(loader))
        assert batch.ragged
        for index, image in zip(batch.indices.tolist(), batch.images):
            with Image.open(cat.source_path(index)) as im:
                assert image.shape == (im.height, im.width, 3)


def test_holding_every_buffer_raises_instead_of_hanging(folder):
    cat = prestage.Catalog.from_folder(folder)
    with prestage.Loader(cat, batch_size=2, depth=3) as loader:
        held = []
        with pytest.raises(prestage.ConfigError, match="depth"):
            for b in loader:
                held.append(b.images)  # a view keeps its buffer lent


# ------------------------------------------------------------------------------- resume and options

def test_state_dict_counts_a_batch_that_raised_its_sample_error_as_delivered(folder):
    cat = prestage.Catalog.from_folder(folder)
    cat.source_path(5).unlink()  # with shuffle=False: batch 1 of size 4
    with prestage.Loader(cat, batch_size=4, shuffle=False) as loader:
        it = iter(loader)
        next(it)
        with pytest.raises(prestage.IoError):
            next(it)
        assert loader.state_dict()["batch"] == 2  # a resume goes on past the failed batch
        assert next(it).index == 2


def test_state_dict_does_not_count_a_refused_next_as_delivered(folder):
    cat = prestage.Catalog.from_folder(folder)
    with prestage.Loader(cat, batch_size=4, depth=2, shuffle=False) as loader:
        it = iter(loader)
        held = [next(it).images, next(it).images]  # every buffer lent
        with pytest.raises(prestage.ConfigError):
            next(it)
        assert loader.state_dict()["batch"] == 2
        del held
        gc.collect()
        assert next(it).index == 2  # the refused batch comes now
        assert loader.state_dict()["batch"] == 3


def test_state_dict_of_a_closed_loader_counts_what_was_delivered(folder):
    cat = prestage.Catalog.from_folder(folder)
    loader = prestage.Loader(cat, batch_size=4)
    it = iter(loader)
    next(it), next(it)
    loader.close()
    with pytest.raises(prestage.ConfigError):
        next(it)
    assert loader.state_dict()["batch"] == 2


def test_state_dict_does_not_count_an_interrupted_wait_as_delivered(stalled_catalog, sigint_raises):
    import _thread

    # The one sample's read never returns, so next() waits until Ctrl+C.
    loader = prestage.Loader(stalled_catalog, batch_size=1, image_size=(8, 8), io_timeout=60)
    timer = threading.Timer(0.2, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            next(iter(loader))
        assert loader.state_dict()["batch"] == 0
    finally:
        timer.cancel()
        loader.close()


@pytest.fixture
def tuned_file(tmp_path):
    path = tmp_path / "tuned.json"
    path.write_text('{"options": {"readers": 1, "prefetchers": 9, "lookahead": 3, "depth": 5}}')
    return path


def test_tuned_file_fills_only_the_options_not_given(folder, tuned_file):
    cat = prestage.Catalog.from_folder(folder)
    # readers and prefetchers given, equal to their defaults: they stay.
    with prestage.Loader(cat, batch_size=4, readers=2, prefetchers=4, tuned=tuned_file) as loader:
        o = loader.options
        assert (o.readers, o.prefetchers, o.lookahead, o.depth) == (2, 4, 3, 5)
    with prestage.Loader(cat, batch_size=4, tuned=tuned_file) as loader:
        o = loader.options
        assert (o.readers, o.prefetchers, o.lookahead, o.depth) == (1, 9, 3, 5)


@pytest.mark.parametrize("depth", [1, 2])
def test_depth_two_is_the_least_a_loop_can_run_with(folder, depth):
    cat = prestage.Catalog.from_folder(folder)
    if depth == 1:  # a loop holds one batch while it asks for the next
        with pytest.raises(prestage.ConfigError):
            prestage.Loader(cat, batch_size=4, depth=depth)
        return
    with prestage.Loader(cat, batch_size=4, depth=depth) as loader:
        assert [b.index for b in loader] == list(range(6))


@pytest.mark.parametrize("kwargs", [
    {"mean": (0.5, 0.5, 0.5)}, {"std": (0.5, 0.5, 0.5)},  # uint8 images are not normalised
    {"dtype": "float32", "std": (1.0, 0.0, 1.0)}, {"mean": (0.5, 0.5)}, {"batch_size": -1},
    {"seed": -1}, {"batch_size": True}, {"image_size": (0, 0)}, {"io_timeout": 0}, {"eviction": "fifo"},
    {"depth": 4097}, {"readers": 1025}, {"stage_patience": -1}, {"cache_bytes": -1}, {"on_error": "ignore"},
])
def test_more_bad_options_raise_config_error(folder, kwargs):
    cat = prestage.Catalog.from_folder(folder)
    with pytest.raises(prestage.ConfigError):
        prestage.Loader(cat, **{"batch_size": 4, **kwargs})


def test_unknown_option_is_a_type_error(folder):
    cat = prestage.Catalog.from_folder(folder)
    with pytest.raises(TypeError):
        prestage.Loader(cat, batch_size=4, bogus=1)


def test_image_size_is_the_size_of_the_images_delivered(make_folder):
    cat = prestage.Catalog.from_folder(make_folder(1, 3, size=(20, 30)))
    with prestage.Loader(cat, batch_size=3) as loader:
        assert loader.image_size is None  # each image keeps its own size
        assert next(iter(loader)).images.shape == (3, 20, 30, 3)
    with prestage.Loader(cat, batch_size=3, image_size=(8, 9)) as loader:
        assert loader.image_size == (8, 9)
    with prestage.Loader(cat, batch_size=3, decode="raw") as loader:
        assert loader.image_size is None


def test_options_are_what_was_given_plus_the_machine_sizing(folder, tmp_path):
    """Loader.options: every option as the user gave it; only the thread options left to the loader
    are filled in (by the machine sizing). What stage 3 waits for stage 2 is in stats()."""
    cat = prestage.Catalog.from_folder(folder)
    defaults = prestage._core.LoaderOptions().to_dict()
    given = {"batch_size": 4, "image_size": (16, 16), "seed": 7, "depth": 3,
             "stage_dir": str(tmp_path / "stage"), "stage_patience": 0.2, "readers": 2}
    for patience in (0.2, None):
        given["stage_patience"] = patience
        with prestage.Loader(cat, **given) as loader:
            epoch(loader)
            got = loader.options.to_dict()
            assert loader.stats()["stage_patience"] == patience
        for key, value in got.items():
            if key in given:
                assert value == given[key], key
            elif key in ("prefetchers", "lookahead"):  # left to the loader: sized to the machine
                assert value is not None and value >= 1, key
            else:
                assert value == defaults[key], key


def test_stats_keys_are_the_documented_ones(folder):
    cat = prestage.Catalog.from_folder(folder)
    cat.source_path(3).write_bytes(b"not a jpeg")
    with prestage.Loader(cat, batch_size=4, on_error="skip") as loader:
        epoch(loader)
        s = loader.stats(epochs="all")
    assert set(s) == {
        "wall_s", "batches", "samples", "consumer_stall_s", "plan", "stage", "decode", "threads_why",
        "usable_cpus", "local_ranks", "stage_patience", "tuning", "memory", "staged_files", "adopted_files", "already_staged", "stage_failures",
        "stage_corrupt", "stage_expedited", "read_ahead",
        "read_ahead_bytes", "stage_dir_disabled", "stage_dir_error", "hits", "misses", "misses_read_ahead",
        "misses_staged", "missed_bytes", "bytes_from_source", "bytes_from_stage", "source_reads", "source_bytes", "skipped",
        "skipped_samples", "pinned", "pinned_why", "cache_bytes", "stage_bytes", "stage_bytes_peak",
        "epochs", "peer_tier", "peer_tier_why", "peer_reads", "peer_bytes", "peer_fallbacks",
        "peer_corrupt", "beyond_budget", "peer_served", "peer_served_bytes", "peers_down",
        "peers_closed", "peer_reads_to_pfs", "peer_home_first", "peer_probes", "peer_probe_bytes",
        "sources", "gpu_decode"}
    assert set(s["gpu_decode"]) == {"on", "why", "batches", "hardware", "gpu", "cpu_share",
                                    "cpu_unsupported", "cpu_gpu_failed", "cpu_replacements",
                                    "buffer_growths", "decoders", "share", "share_auto",
                                    "share_why", "share_moves", "gpu_ms_per_image",
                                    "cpu_ms_per_image", "crop", "crop_why", "roi"}
    assert s["gpu_decode"]["on"] is False
    assert s["peer_tier"] is False and s["peer_tier_why"] == "not asked for (peers=False)"
    assert set(s["tuning"]) == {"on", "readers", "reads_in_flight", "lookahead", "steps_kept",
                                "steps_undone", "settled_s", "memory_budget", "log"}
    assert set(s["memory"]) == {"batch_buffers", "read_ahead", "decode_scratch"}
    assert s["skipped"] == 1
    assert set(s["skipped_samples"][0]) == {"path", "error", "sample", "replacement", "epoch", "batch"}
    assert s["skipped_samples"][0]["sample"] == 3 and isinstance(s["skipped_samples"][0]["path"], str)
    assert set(s["epochs"][0]) == {"epoch", "hits", "misses", "evictions", "source_reads",
                                   "bytes_from_source", "copies_made", "copies_adopted", "peer_reads",
                                   "bytes_from_peers", "decoded_from_stage", "decoded_from_memory",
                                   "decoded_from_peers", "decoded_from_source"}
    assert s["pinned"] in ("cuda", "mlock", "none") and s["pinned_why"] and isinstance(s["wall_s"], float)


def test_thread_options_left_out_are_sized_to_the_machine_and_given_ones_kept(folder, monkeypatch):
    cat = prestage.Catalog.from_folder(folder)
    for name in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "OMPI_COMM_WORLD_LOCAL_SIZE",
                 "MPI_LOCALNRANKS"):
        monkeypatch.delenv(name, raising=False)
    cpus = len(os.sched_getaffinity(0))
    with prestage.Loader(cat, batch_size=4) as loader:
        s = loader.stats(epochs="all")
        assert s["usable_cpus"] <= cpus and s["local_ranks"] == 1
        share = s["usable_cpus"]
        assert loader.options.readers == (share - 1 if share >= 4 else share)
        assert loader.options.prefetchers == min(64, max(16, 2 * loader.options.readers))
        assert loader.options.lookahead == 8
        assert "readers" in s["threads_why"] and "no launcher variable" in s["threads_why"]
        assert len(next(iter(loader))) == 4
    # Four ranks on the node share its CPUs.
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    with prestage.Loader(cat, batch_size=4) as loader:
        s = loader.stats(epochs="all")
        assert s["local_ranks"] == 4 and "LOCAL_WORLD_SIZE" in s["threads_why"]
        share = max(1, s["usable_cpus"] // 4)
        assert loader.options.readers == (share - 1 if share >= 4 else share)
    # Given values stay; None is the same as leaving one out.
    with prestage.Loader(cat, batch_size=4, readers=3, prefetchers=None, lookahead=2) as loader:
        assert (loader.options.readers, loader.options.lookahead) == (3, 2)
        assert loader.options.prefetchers == 16  # twice the readers, at least 16
        assert "readers" not in loader.stats(epochs="all")["threads_why"].split(" from ")[0]
    with prestage.Loader(cat, batch_size=4, readers=1, prefetchers=1, lookahead=1) as loader:
        assert loader.stats(epochs="all")["threads_why"] == ""


def test_options_show_themselves_under_the_keywords_names(folder, tmp_path):
    """loader.options: a repr that shows the values, and to_dict() with the keywords' names and units
    (stage_patience in seconds, not stage_patience_ms), which make the same options again."""
    cat = prestage.Catalog.from_folder(folder)
    given = dict(stage_patience=0.2, readers=2, eviction="lru", io_timeout=3, stage_dir=str(tmp_path / "s"),
                 transform="random-resized-crop", layout="NCHW")
    with prestage.Loader(cat, 4, (8, 8), **given) as loader:
        options = loader.options
    text = repr(options)
    assert text.startswith("LoaderOptions(batch_size=4, image_size=(8, 8), ") and " at 0x" not in text
    assert "stage_patience=0.2" in text and "stage_patience_ms" not in text
    d = options.to_dict()
    assert {k: d[k] for k in given} == {**given, "io_timeout": 3.0}
    assert set(d) == {"batch_size", "image_size", "peer_comm"} | set(prestage.options._CONVERT) - {"comm"}
    rest = {k: v for k, v in d.items() if k not in ("batch_size", "image_size", "peer_comm")}
    with prestage.Loader(cat, d["batch_size"], d["image_size"], **rest) as again:
        assert again.options.to_dict() == d


def test_a_folder_given_for_a_saved_catalog_is_a_config_error_naming_the_fix(folder):
    with pytest.raises(prestage.ConfigError, match="Catalog.from_folder"):
        prestage.Loader(str(folder), 4)
