"""on_error: a sample that cannot be read or decoded raises at its batch ("raise"), or is replaced by the
next good sample of this rank's epoch ("skip"), identically for any thread counts. The adaptors' on_error
is tested in test_torch.py and test_tf.py (importing a framework here would leave its threads running
into the thread-counting tests of test_loader.py)."""

import errno
import time

import numpy as np
import pytest
from PIL import Image

import prestage
import prestage.plan

SKIP_CANDIDATES = 32  # LoaderOptions: the most samples tried in place of a failed one


def pil_rgb(path):
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def spoil(cat, names):
    """Spoils the files named (relative paths), one kind of fault each in turn; returns their indices.

    The catalog is built first, so the deleted file is one the catalog still lists."""
    index = {cat.path(i): i for i in range(len(cat))}
    bad = []
    for k, name in enumerate(names):
        path = cat.source_path(index[name])
        data = path.read_bytes()
        kind = k % 4
        if kind == 0:
            path.unlink()  # missing
        elif kind == 1:  # headers intact, entropy-coded data garbage
            rng = np.random.default_rng(k)
            path.write_bytes(data[: len(data) // 2] + rng.integers(0, 256, len(data) - len(data) // 2,
                                                                   dtype=np.uint8).tobytes())
        elif kind == 2:
            path.write_bytes(data[: len(data) // 2])  # truncated
        else:
            path.write_bytes(b"GIF89a not a JPEG at all")
        bad.append(index[name])
    return set(bad)


def expected_delivery(num_samples, bad, batch_size, seed, epoch, shuffle=True, rank=0, world_size=1):
    """The rank's samples of the epoch, each bad one replaced by the first good one after it (wrapping)."""
    order = [i for b in prestage.plan.epoch_batches(num_samples, batch_size, seed=seed, epoch=epoch,
                                                    shuffle=shuffle, rank=rank, world_size=world_size)
             for i in b]
    n = len(order)
    out = []
    for q in range(n):
        for k in range(min(n - 1, SKIP_CANDIDATES) + 1):
            if order[(q + k) % n] not in bad:
                out.append(order[(q + k) % n])
                break
    return out


def run_epoch(loader):
    """(indices, labels, images, batch sizes) of one epoch, copied out of the batches."""
    idx, lab, img, sizes = [], [], [], []
    for b in loader:
        idx.append(b.indices.copy())
        lab.append(b.labels.copy())
        img.append(b.images.copy())
        sizes.append(len(b))
    return np.concatenate(idx), np.concatenate(lab), np.concatenate(img), sizes


BAD_NAMES = ["class_0/img_002.jpg", "class_0/img_005.jpg", "class_1/img_000.jpg", "class_2/img_006.jpg",
             "class_2/img_007.jpg"]


@pytest.fixture
def faulty(make_folder):
    """3 classes x 8 images with a missing, a corrupt, a truncated and two non-JPEG files."""
    cat = prestage.Catalog.from_folder(make_folder(3, 8))
    return cat, spoil(cat, BAD_NAMES)


@pytest.mark.parametrize("readers", [1, 2, 4])
def test_skip_keeps_batches_whole_with_good_samples_only(faulty, tmp_path, readers):
    cat, bad = faulty
    with prestage.Loader(cat, batch_size=5, seed=3, readers=readers, prefetchers=readers,
                         stage_dir=tmp_path / "stage", on_error="skip") as loader:
        idx, lab, img, sizes = run_epoch(loader)
        stats = loader.stats()
    assert sizes == [5, 5, 5, 5, 4]
    assert img.shape == (24, 32, 48, 3)
    assert not bad & set(idx.tolist())
    assert idx.tolist() == expected_delivery(len(cat), bad, 5, seed=3, epoch=0)
    for k, i in enumerate(idx.tolist()):
        assert lab[k] == cat.label(i)
        np.testing.assert_array_equal(img[k], pil_rgb(cat.source_path(i)))
    assert stats["skipped"] == len(bad)
    listed = stats["skipped_samples"]
    assert sorted(s["path"] for s in listed) == sorted(str(cat.source_path(i)) for i in bad)
    for s in listed:
        assert s["sample"] in bad and s["replacement"] not in bad
        assert s["path"] in s["error"] or "No such file" in s["error"]
        assert s["epoch"] == 0


def test_skip_is_the_same_for_any_thread_counts_and_epochs(faulty):
    cat, bad = faulty
    runs = []
    for readers in (1, 2, 4):
        with prestage.Loader(cat, batch_size=4, seed=9, readers=readers, prefetchers=readers,
                             on_error="skip") as loader:
            runs.append([run_epoch(loader)[0].tolist() for _ in range(2)])
            assert loader.stats()["skipped"] == 2 * len(bad)
    assert runs[0] == runs[1] == runs[2]
    assert runs[0][0] != runs[0][1]  # a new shuffle, skipped alike
    assert runs[0][1] == expected_delivery(len(cat), bad, 4, seed=9, epoch=1)


def test_raise_still_raises_naming_the_path(faulty):
    cat, bad = faulty
    paths = {str(cat.source_path(i)) for i in bad}
    failed = delivered = 0
    with prestage.Loader(cat, batch_size=4, seed=3) as loader:  # on_error="raise" is the default
        it = iter(loader)
        while True:
            try:
                next(it)
                delivered += 1
            except StopIteration:
                break
            except prestage.IoError as e:
                # Missing (ENOENT), or shorter than the catalog says (EIO: truncated, not a JPEG).
                assert e.filename in paths and e.errno in (errno.ENOENT, errno.EIO)
                failed += 1
            except prestage.DecodeError as e:
                assert e.path in paths and e.path in str(e)
                failed += 1
        assert loader.stats()["skipped"] == 0 and loader.stats()["skipped_samples"] == []
    assert failed >= 1 and failed + delivered == 6


def test_all_bad_data_raises_instead_of_hanging(make_folder):
    root = make_folder(2, 4)
    cat = prestage.Catalog.from_folder(root)
    for i in range(len(cat)):
        cat.source_path(i).write_bytes(b"not a jpeg")
    cat = prestage.Catalog.from_folder(root)  # of their sizes now: a changed size is an IoError
    start = time.monotonic()
    for image_size in (None, (16, 16)):  # each image its own size, or resized
        with prestage.Loader(cat, batch_size=4, image_size=image_size, on_error="skip") as loader:
            it = iter(loader)
            for _ in range(2):
                with pytest.raises(prestage.DecodeError):
                    next(it)
            with pytest.raises(StopIteration):
                next(it)
    assert time.monotonic() - start < 10


def test_a_bad_first_image_raises_at_its_batch_or_is_skipped(make_folder):
    root = make_folder(1, 6)
    prestage.Catalog.from_folder(root).source_path(0).write_bytes(b"not a jpeg")
    cat = prestage.Catalog.from_folder(root)  # of its size now: a changed size is an IoError
    with prestage.Loader(cat, batch_size=3, shuffle=False) as loader:  # no image read to build it
        it = iter(loader)
        with pytest.raises(prestage.DecodeError) as error:
            next(it)
        assert error.value.path == str(cat.source_path(0))
        assert next(it).indices.tolist() == [3, 4, 5]
    with prestage.Loader(cat, batch_size=3, on_error="skip") as loader:
        idx, _, img, _ = run_epoch(loader)
    assert 0 not in idx.tolist() and img.shape == (6, 32, 48, 3)


def test_skip_with_resize_delivers_the_replacements_own_pixels(faulty):
    cat, bad = faulty
    with prestage.Loader(cat, batch_size=6, image_size=(20, 20), seed=1, on_error="skip") as loader:
        idx, _, img, _ = run_epoch(loader)
    assert idx.tolist() == expected_delivery(len(cat), bad, 6, seed=1, epoch=0)
    # The good files alone, in order, through a loader without faults: each one's pixels.
    good = [i for i in range(len(cat)) if i not in bad]
    root = str(cat.source_path(0))[: -len(cat.path(0))]
    clean = prestage.Catalog.from_paths(root, [cat.path(i) for i in good])
    with prestage.Loader(clean, batch_size=6, image_size=(20, 20), shuffle=False) as loader:
        _, _, reference, _ = run_epoch(loader)
    for k, i in enumerate(idx.tolist()):
        np.testing.assert_array_equal(img[k], reference[good.index(i)])


def test_on_error_is_checked_at_construction(folder):
    cat = prestage.Catalog.from_folder(folder)
    with pytest.raises(prestage.ConfigError, match="on_error"):
        prestage.Loader(cat, batch_size=4, on_error="ignore")
    with pytest.raises(ValueError, match="on_error"):  # ConfigError is a ValueError
        prestage.Loader(cat, batch_size=4, on_error=None)


def test_raw_skips_missing_files(tmp_path):
    root = tmp_path / "raw"
    (root / "a").mkdir(parents=True)
    for i in range(10):
        (root / "a" / f"{i}.bin").write_bytes(bytes([i]) * (i + 1))
    cat = prestage.Catalog.from_folder(root, extensions=[".bin"])
    bad = {i for i in range(len(cat)) if cat.path(i) in ("a/3.bin", "a/8.bin")}
    for i in bad:
        cat.source_path(i).unlink()
    for readers in (1, 4):
        with prestage.Loader(cat, batch_size=4, decode="raw", seed=5, readers=readers,
                             stage_dir=tmp_path / f"stage{readers}", on_error="skip") as loader:
            idx = []
            for b in loader:
                for k, i in enumerate(b.indices.tolist()):
                    idx.append(i)
                    assert bytes(b.data[b.offsets[k]:b.offsets[k + 1]]) == cat.source_path(i).read_bytes()
            assert loader.stats()["skipped"] == 2
        assert idx == expected_delivery(len(cat), bad, 4, seed=5, epoch=0)


def test_npy_truncated_after_its_header_is_replaced_by_one_of_its_shape(tmp_path):
    root = tmp_path / "npy"
    (root / "a").mkdir(parents=True)
    for i in range(12):
        np.save(root / "a" / f"{i:02d}.npy", np.full((3, 4), i, dtype=np.int32))
    cat = prestage.Catalog.from_folder(root, extensions=[".npy"])
    # Its header is whole, its data cut: it fails only once the batch is laid out.
    truncated = cat.source_path(4)
    truncated.write_bytes(truncated.read_bytes()[:-10])
    cat.source_path(7).write_bytes(b"not an npy file")
    with prestage.Loader(cat, batch_size=4, decode="npy", shuffle=False, on_error="skip") as loader:
        batches = [(b.indices.copy(), b.arrays.copy()) for b in loader]
        stats = loader.stats()
    idx = np.concatenate([i for i, _ in batches]).tolist()
    assert idx == [0, 1, 2, 3, 5, 5, 6, 8, 8, 9, 10, 11]
    for i, arrays in batches:
        assert arrays.shape == (4, 3, 4)
        for k, sample in enumerate(i.tolist()):
            np.testing.assert_array_equal(arrays[k], np.full((3, 4), sample, dtype=np.int32))
    assert stats["skipped"] == 2
    assert [s["sample"] for s in stats["skipped_samples"]] == [4, 7]


def _named_and_delivered(loader, dtype, message):
    """One epoch of `loader` with on_error="raise": (the names of the files the failed batches named,
    the indices of the batches delivered, each of `dtype`). Each error must say `message`."""
    named, delivered = [], []
    it = iter(loader)
    while True:
        try:
            batch = next(it)
        except StopIteration:
            return named, delivered
        except prestage.DecodeError as e:
            assert message in str(e)
            named.append(e.path.rsplit("/", 1)[-1])
            continue
        assert batch.dtype == dtype
        delivered += batch.indices.tolist()


@pytest.mark.parametrize("batch_size", [1, 2, 3, 4])
def test_an_npy_of_another_dtype_is_the_one_named_or_skipped_wherever_it_lies_in_its_batch(
        tmp_path, batch_size):
    # The batch's dtype was its own samples' (the majority, ties to the first): an odd file first in
    # a batch of 2, or two odd files in a batch of 3, made the good files fail ("raise") or be
    # replaced ("skip"). The dtype is the data set's: most of a few samples spread over the catalog.
    root = tmp_path / "npy"
    root.mkdir()
    odd = {0, 1, 6}  # 0 and 1 fill most of the first batch of 3; 6 is first in a batch of 2 and 3
    for i in range(12):
        np.save(root / f"{i:02d}.npy", np.full(3, i, dtype=np.int32 if i in odd else np.float64))
    cat = prestage.Catalog.from_folder(root, extensions=[".npy"])
    # "raise": each batch raises the error of its first odd file, naming it; good batches are whole.
    with prestage.Loader(cat, batch_size=batch_size, decode="npy", shuffle=False) as loader:
        named, delivered = _named_and_delivered(loader, np.float64,
                                                "its dtype <i4 differs from the data set's <f8")
    batches = [list(range(b, min(b + batch_size, 12))) for b in range(0, 12, batch_size)]
    assert [int(name[:2]) for name in named] == [min(odd & set(b)) for b in batches if odd & set(b)]
    assert delivered == [i for b in batches if not odd & set(b) for i in b]
    # "skip": exactly the odd files are replaced, every good file is delivered with its values.
    with prestage.Loader(cat, batch_size=batch_size, decode="npy", shuffle=False,
                         on_error="skip") as loader:
        got = []
        for batch in loader:
            assert batch.dtype == np.float64
            for k, i in enumerate(batch.indices.tolist()):
                np.testing.assert_array_equal(batch.arrays[k], np.load(cat.source_path(i)))
                got.append(i)
        stats = loader.stats()
    assert sorted(s["sample"] for s in stats["skipped_samples"]) == sorted(odd)
    assert set(got) == set(range(12)) - odd


def test_rows_of_another_dtype_are_named_by_the_catalogs_dtype_not_by_a_few_probed(tmp_path):
    # The rows of 4 .npy files (from_arrays): 11 samples, 6 of them float64. The loader used to take
    # the data set's dtype from 5 samples spread over the catalog (ids 0, 2, 4, 6, 8), 3 of which
    # are int32 rows here: the good rows would have been the ones named. The catalog reads every
    # file's header anyway and records the dtype most samples have.
    root = tmp_path / "rows"
    root.mkdir()
    layout = [(np.int32, 3), (np.float64, 1), (np.int32, 2), (np.float64, 5)]
    for f, (dtype, rows) in enumerate(layout):
        np.save(root / f"{f}.npy", np.full((rows, 3), f, dtype=dtype))
    cat = prestage.Catalog.from_arrays(sorted(root.glob("*.npy")))
    assert len(cat) == 11 and cat.dtype == "<f8"
    odd_files = {f for f, (dtype, _) in enumerate(layout) if dtype == np.int32}
    odd = {i for i in range(len(cat)) if int(cat.path(i)[0]) in odd_files}
    assert odd == {0, 1, 2, 4, 5}
    with prestage.Loader(cat, batch_size=1, decode="npy", shuffle=False) as loader:
        named, delivered = _named_and_delivered(loader, np.float64,
                                                "its dtype <i4 differs from the data set's <f8")
    with prestage.Loader(cat, batch_size=1, decode="npy", shuffle=False, on_error="skip") as loader:
        for batch in loader:  # the good rows, with their values
            np.testing.assert_array_equal(batch.arrays[0], np.full(3, float(cat.path(batch.indices[0])[0])))
    assert sorted(int(name[0]) for name in named) == sorted(int(cat.path(i)[0]) for i in odd)
    assert delivered == sorted(set(range(11)) - odd)
    # Saved and loaded, the catalog keeps it.
    cat.save(tmp_path / "rows.catalog")
    assert prestage.Catalog.load(tmp_path / "rows.catalog").dtype == "<f8"
    assert prestage.Catalog.from_folder(root, extensions=[".npy"]).dtype is None
