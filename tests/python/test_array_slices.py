"""Samples inside array files: slices along any axis of .npy, .npz and HDF5 arrays, with labels from a
member or a dataset beside the data (Catalog.from_arrays, Catalog.from_hdf5(axis=)). NumPy's np.save /
np.savez / np.savez_compressed and h5py write every file; np.take is the oracle."""

import h5py
import numpy as np
import pytest

import prestage


def samples(catalog, **options):
    """{catalog index: (array, label)} of one epoch, copied out of the batches."""
    found = {}
    with prestage.Loader(catalog, batch_size=options.pop("batch_size", 3), seed=4, **options) as loader:
        for b in loader:
            arrays = b.arrays
            for k, i in enumerate(b.indices):
                found[int(i)] = (np.array(arrays[k]), int(b.labels[k]))
    return found


def expected(arrays, axis):
    """The catalog's samples, in order: each file's slices along `axis`."""
    return [np.take(a, i, axis=axis) for a in arrays for i in range(a.shape[axis])]


def check(catalog, arrays, axis, labels=None, **options):
    want = expected(arrays, axis)
    got = samples(catalog, **options)
    assert sorted(got) == list(range(len(want)))
    for i, w in enumerate(want):
        array, label = got[i]
        assert array.dtype == w.dtype and array.shape == w.shape, i
        np.testing.assert_array_equal(array, w)
        assert label == (-1 if labels is None else labels[i])


def test_dlio_style_npz_samples_along_the_last_axis_with_labels(tmp_path):
    # As DLIO's npz generator writes them: x of shape (dim, dim, samples), y one label per sample.
    rng = np.random.default_rng(0)
    arrays, labels = [], []
    for f in range(3):
        x = rng.integers(0, 255, size=(6, 5, 4 + f), dtype=np.uint8)
        y = rng.integers(0, 10, size=x.shape[-1])
        np.savez(tmp_path / f"img_{f}.npz", x=x, y=y)
        arrays.append(x)
        labels.extend(y.tolist())
    files = [tmp_path / f"img_{f}.npz" for f in range(3)]
    cat = prestage.Catalog.from_arrays(files, axis=-1, member="x", labels="y")
    assert len(cat) == 4 + 5 + 6 and cat.kind == "arrays" and cat.axis == -1 and cat.field == "x"
    check(cat, arrays, -1, labels)
    check(cat, arrays, -1, labels, stage_dir=str(tmp_path / "stage"), readers=2)


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_npy_slices_along_any_axis_in_either_order(tmp_path, order, axis):
    rng = np.random.default_rng(1)
    arrays = []
    for f in range(2):
        a = np.array(rng.standard_normal((3 + f, 4, 5)).astype(np.float32), order=order)
        np.save(tmp_path / f"{f}.npy", a)
        arrays.append(a)
    cat = prestage.Catalog.from_arrays([tmp_path / f"{f}.npy" for f in range(2)], axis=axis)
    check(cat, arrays, axis)


@pytest.mark.parametrize("dtype", [">i4", "<u2", np.bool_, np.complex64])
def test_byte_order_and_dtypes_are_kept_as_stored(tmp_path, dtype):
    rng = np.random.default_rng(2)
    a = rng.integers(0, 2, size=(2, 7, 3)).astype(dtype)
    np.save(tmp_path / "a.npy", a)
    cat = prestage.Catalog.from_arrays([tmp_path / "a.npy"], axis=1)
    check(cat, [a], 1)


@pytest.mark.parametrize("order", ["C", "F"])
def test_deflated_npz_members_slice_like_stored_ones(tmp_path, order):
    rng = np.random.default_rng(3)
    x = np.array(rng.integers(-1000, 1000, size=(5, 6, 3)), dtype=np.int64, order=order)
    y = np.arange(6, dtype=np.uint8) * 3
    np.savez_compressed(tmp_path / "c.npz", data=x, labels=y)
    cat = prestage.Catalog.from_arrays([tmp_path / "c.npz"], axis=1, member="data", labels="labels")
    check(cat, [x], 1, y.tolist(), decode="npz")
    # A member is inflated whole for each slice: it counts against max_sample_bytes.
    with pytest.raises(prestage.DecodeError, match="inflated whole"):
        samples(cat, max_sample_bytes=x.nbytes - 1)


def test_large_runs_and_small_strides_read_the_same(tmp_path):
    # Axis 1 of (2, 3, 70000) bytes: two runs of 70000 bytes each (read one by one); axis 2: 6 runs of
    # one byte (read as the span they cover).
    a = np.random.default_rng(4).integers(0, 255, size=(2, 3, 70000), dtype=np.uint8)
    np.save(tmp_path / "big.npy", a)
    check(prestage.Catalog.from_arrays([tmp_path / "big.npy"], axis=1), [a], 1)
    cat = prestage.Catalog.from_arrays([tmp_path / "big.npy"], axis=2)
    got = samples(cat, batch_size=1000)
    for i in (0, 1, 69999, 12345):
        np.testing.assert_array_equal(got[i][0], a[:, :, i])


def test_a_one_dimensional_array_gives_scalar_samples(tmp_path):
    a = np.arange(10, dtype=np.float64) / 4
    np.save(tmp_path / "v.npy", a)
    cat = prestage.Catalog.from_arrays([tmp_path / "v.npy"])
    with prestage.Loader(cat, batch_size=10, shuffle=False) as loader:
        b = next(iter(loader))
        np.testing.assert_array_equal(b.arrays, a)


def test_a_saved_catalog_keeps_its_kind_axis_and_member(tmp_path):
    x = np.arange(24, dtype=np.int16).reshape(2, 3, 4)
    np.savez(tmp_path / "a.npz", x=x, y=np.array([7, 8, 9, 10]))
    cat = prestage.Catalog.from_arrays([tmp_path / "a.npz"], axis=2, member="x", labels="y")
    cat.save(tmp_path / "cat.bin")
    back = prestage.Catalog.load(tmp_path / "cat.bin")
    assert (back.kind, back.axis, back.field, len(back)) == ("arrays", 2, "x", 4)
    check(back, [x], 2, [7, 8, 9, 10])


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("chunked", [False, True])
def test_hdf5_slices_along_any_axis_with_labels_beside_them(tmp_path, axis, chunked):
    rng = np.random.default_rng(5)
    arrays, labels, files = [], [], []
    for f in range(2):
        data = rng.integers(0, 1 << 20, size=(4, 5, 6 + f)).astype(">i4")
        n = data.shape[axis]
        y = rng.integers(0, 100, size=n)
        path = tmp_path / f"{f}.h5"
        with h5py.File(path, "w") as h5:
            if chunked:
                h5.create_dataset("records", data=data, chunks=(2, 3, 4), compression="gzip")
            else:
                h5.create_dataset("records", data=data)
            h5.create_dataset("labels", data=y)
        arrays.append(data)
        labels.extend(y.tolist())
        files.append(path)
    cat = prestage.Catalog.from_hdf5(files, "records", labels="labels", axis=axis)
    assert (cat.kind, cat.axis, len(cat)) == ("hdf5", axis, sum(a.shape[axis] for a in arrays))
    # HDF5 gives little-endian arrays: the values, not the byte order, are what must match.
    want = expected(arrays, axis)
    got = samples(cat, stage_dir=str(tmp_path / "stage"))
    for i, w in enumerate(want):
        np.testing.assert_array_equal(got[i][0], w)
        assert got[i][1] == labels[i]


def test_adaptors_take_slices_too(tmp_path):
    torch = pytest.importorskip("torch")
    import prestage.torch

    x = np.random.default_rng(6).standard_normal((3, 4, 8)).astype(np.float32)
    np.savez(tmp_path / "a.npz", x=x, y=np.arange(8))
    cat = prestage.Catalog.from_arrays([tmp_path / "a.npz"], axis=-1, member="x", labels="y")
    seen = 0
    for arrays, labels in prestage.torch.Loader(cat, batch_size=3, shuffle=False):
        for k, label in enumerate(labels.tolist()):
            assert torch.equal(arrays[k], torch.from_numpy(x[:, :, label]))
            seen += 1
    assert seen == 8


@pytest.mark.tf
def test_tf_dataset_of_slices(tmp_path):
    import prestage.tf

    x = np.random.default_rng(7).integers(0, 9, size=(5, 2, 3), dtype=np.int32)
    np.save(tmp_path / "a.npy", x)
    cat = prestage.Catalog.from_arrays([tmp_path / "a.npy"], axis=1)
    ds = prestage.tf.dataset(cat, batch_size=3, shuffle=False)
    assert tuple(ds.element_spec[0].shape) == (None, 5, 3)
    got = np.concatenate([a.numpy() for a, _ in ds])
    np.testing.assert_array_equal(got, np.moveaxis(x, 1, 0))


# ------------------------------------------------------------------------------------------ bad input


def test_an_axis_the_array_lacks_is_a_config_error_naming_the_file(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((2, 3)))
    with pytest.raises(prestage.ConfigError, match=r"a\.npy.*no axis 2"):
        prestage.Catalog.from_arrays([tmp_path / "a.npy"], axis=2)
    with pytest.raises(prestage.ConfigError, match="no axis -3"):
        prestage.Catalog.from_arrays([tmp_path / "a.npy"], axis=-3)
    with h5py.File(tmp_path / "a.h5", "w") as h5:
        h5["x"] = np.zeros((2, 3))
    with pytest.raises(prestage.ConfigError, match="no axis 5"):
        prestage.Catalog.from_hdf5([tmp_path / "a.h5"], "x", axis=5)


def test_labels_that_do_not_fit_are_refused(tmp_path):
    x = np.zeros((2, 3, 4), dtype=np.uint8)
    np.savez(tmp_path / "a.npz", x=x, short=np.arange(3), floats=np.ones(4), flat=np.zeros((2, 2), int))
    np.save(tmp_path / "a.npy", x)
    with pytest.raises(prestage.DecodeError, match="3 entries, for 4 samples"):
        prestage.Catalog.from_arrays([tmp_path / "a.npz"], axis=-1, member="x", labels="short")
    with pytest.raises(prestage.DecodeError, match="integer"):
        prestage.Catalog.from_arrays([tmp_path / "a.npz"], axis=-1, member="x", labels="floats")
    with pytest.raises(prestage.DecodeError, match="integer"):
        prestage.Catalog.from_arrays([tmp_path / "a.npz"], axis=0, member="x", labels="flat")
    with pytest.raises(prestage.DecodeError, match="missing"):
        prestage.Catalog.from_arrays([tmp_path / "a.npz"], member="x", labels="missing")
    with pytest.raises(prestage.ConfigError, match="one array"):
        prestage.Catalog.from_arrays([tmp_path / "a.npy"], labels="y")
    with h5py.File(tmp_path / "a.h5", "w") as h5:
        h5["x"] = x
        h5["labels"] = np.arange(3)
    with pytest.raises(prestage.DecodeError, match="3 entries, for 4 samples"):
        prestage.Catalog.from_hdf5([tmp_path / "a.h5"], "x", labels="labels", axis=2)


def test_other_files_and_options_are_refused(tmp_path):
    (tmp_path / "a.txt").write_text("not an array")
    with pytest.raises(prestage.DecodeError, match="neither a .npy file nor a .npz"):
        prestage.Catalog.from_arrays([tmp_path / "a.txt"])
    with pytest.raises(prestage.IoError):
        prestage.Catalog.from_arrays([tmp_path / "missing.npy"])
    np.savez(tmp_path / "two.npz", a=np.zeros(3), b=np.zeros(3))
    with pytest.raises(prestage.DecodeError):
        prestage.Catalog.from_arrays([tmp_path / "two.npz"])  # which member?
    np.save(tmp_path / "a.npy", np.zeros((3, 2)))
    cat = prestage.Catalog.from_arrays([tmp_path / "a.npy"])
    with pytest.raises(prestage.ConfigError, match="decode=npy"):
        prestage.Loader(cat, batch_size=2, decode="jpeg")
    with pytest.raises(prestage.ConfigError, match="array_name"):
        prestage.Loader(cat, batch_size=2, array_name="x")


def test_a_file_cut_after_the_catalog_was_built_fails_its_samples_or_skips_them(tmp_path):
    arrays = [np.arange(4 * 6, dtype=np.int32).reshape(4, 6) + 100 * f for f in range(3)]
    for f, a in enumerate(arrays):
        np.save(tmp_path / f"{f}.npy", a)
    files = [tmp_path / f"{f}.npy" for f in range(3)]
    cat = prestage.Catalog.from_arrays(files, axis=1)
    data = (tmp_path / "1.npy").read_bytes()
    (tmp_path / "1.npy").write_bytes(data[:-10])
    with pytest.raises(prestage.DecodeError, match=r"1\.npy"):
        samples(cat, batch_size=18, shuffle=False)
    got = samples(cat, batch_size=6, shuffle=False, on_error="skip")
    for i, (array, _) in got.items():
        f, k = divmod(i, 6)
        assert f != 1, "a sample of the cut file was served"
        np.testing.assert_array_equal(array, arrays[f][:, k])


def test_staged_dataset_gives_the_whole_file_and_the_slice_index(tmp_path):
    from prestage.staging import StagedDataset, StagedSampler

    x = np.arange(2 * 3 * 5, dtype=np.int16).reshape(2, 3, 5)
    np.savez(tmp_path / "a.npz", x=x, y=np.arange(5) + 10)
    cat = prestage.Catalog.from_arrays([tmp_path / "a.npz"], axis=-1, member="x", labels="y")

    def read(sample, label):
        assert (sample.offset, sample.length) == (0, None)
        with np.load(sample.path) as archive:
            return archive["x"][..., cat.locator(sample.index)[1]], label

    seen = set()
    with StagedSampler(cat, 2, stage_dir=tmp_path / "stage", num_workers=0) as sampler:
        dataset = StagedDataset(sampler, read=read)
        for batch in sampler:
            for i in batch:
                array, label = dataset[i]
                np.testing.assert_array_equal(array, x[..., i])
                assert label == 10 + i
                seen.add(i)
        assert sampler.stats()["worker_staged"] > 0
    assert seen == set(range(5))


def test_prestage_catalog_saves_slices_the_loaders_take(tmp_path, capsys):
    import json

    from prestage.cli import main

    src = tmp_path / "src"
    src.mkdir()
    arrays, labels = [], []
    for f in range(3):
        x = np.full((2, 2, 3 + f), f, dtype=np.uint8) + np.arange(3 + f, dtype=np.uint8)
        np.savez(src / f"{f}.npz", x=x, y=np.arange(3 + f) + 10 * f)
        arrays.append(x)
        labels.extend((np.arange(3 + f) + 10 * f).tolist())
    out = tmp_path / "slices.catalog"
    assert main(["catalog", str(src), str(out), "--axis", "-1", "--member", "x", "--labels", "y",
                 "--json", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["files"], report["samples"], report["sizes_unknown"]) == (3, 12, 0)
    assert report["dtype"] == "|u1" == prestage.Catalog.load(out).dtype
    check(out, arrays, -1, labels)

    with h5py.File(src / "a.h5", "w") as h5:
        h5["records"] = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    assert main(["catalog", str(src), str(tmp_path / "h5.catalog"), "--dataset", "records", "--axis", "2",
                 "--quiet"]) == 0
    assert len(prestage.Catalog.load(tmp_path / "h5.catalog")) == 4
    assert "samples of dtype <f4" in capsys.readouterr().out
    assert main(["catalog", str(src), str(tmp_path / "bad"), "--dataset", "records", "--member", "x",
                 "--quiet"]) == 2
    assert "--member" in capsys.readouterr().err
    assert main(["catalog", str(src), str(tmp_path / "bad"), "--axis", "5", "--member", "x",
                 "--quiet"]) == 2
    assert "no axis 5" in capsys.readouterr().err


def test_the_source_is_opened_once_per_read_step_or_once_per_file_when_staged(tmp_path, pfs):
    # On the emulated parallel file system, where opens are metadata operations: without a stage
    # directory a sample costs one open to read its headers and one to read its slice (however many
    # reads each takes: the zip directory, the member's header); with one, each file is opened once.
    src = tmp_path / "src"
    src.mkdir()
    for f in range(4):
        np.savez(src / f"{f}.npz", x=np.full((8, 8, 16), f, np.uint8), y=np.arange(16))
    emulator = pfs(src)
    files = [emulator.mountpoint / f"{f}.npz" for f in range(4)]
    cat = prestage.Catalog.from_arrays(files, axis=-1, member="x", labels="y")
    for stage in (None, tmp_path / "stage"):
        before = emulator.stats()["ops"]["open"]
        # Stage 3 waits for the copies however long they take (stage_patience=None): on a loaded
        # machine a copy may outlast the default patience, and stage 3 would then read that sample
        # from the source itself, an open more (by design: stats()["stage_expedited"]).
        with prestage.Loader(cat, batch_size=8, depth=2, stage_dir=stage and str(stage),
                             stage_patience=None) as loader:
            assert sum(len(b) for b in loader) == 64
        opens = emulator.stats()["ops"]["open"] - before
        # The data set's dtype is the catalog's (read with the headers it reads anyway): the
        # loader reads no sample to learn it.
        assert cat.dtype == "|u1"
        if stage is None:
            # The loader may have started the next epoch's first batches (depth 2) before it closed.
            assert 2 * 64 <= opens <= 2 * (64 + 2 * 8), opens
        else:
            assert opens == 4, opens  # each file once
