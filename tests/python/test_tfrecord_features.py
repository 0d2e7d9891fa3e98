"""decode="raw" with raw_dtype and raw_shape: TFRecord features (bytes_list of raw pixels, float_list,
int64_list) and raw files as typed arrays, through prestage.Loader, prestage.torch and prestage.tf.
Records are written by TensorFlow's own tf.io.TFRecordWriter and tf.train.Example (the write_tf_examples
fixture); NumPy (np.frombuffer, np.fromfile) and TensorFlow's parse_example + decode_raw are the oracles."""

import numpy as np
import pytest

import prestage

H, W = 6, 5


def _dlio_records(write_tf_examples, path, count=7, seed=0):
    """Records as DLIO's TFRecord generator writes them: raw uint8 pixels (H, W) in the bytes feature
    'image' and their byte count in the int64 feature 'size' (here the sample's number, so that the
    label names the array)."""
    rng = np.random.default_rng(seed)
    images = [rng.integers(0, 256, size=(H, W), dtype=np.uint8) for _ in range(count)]
    write_tf_examples(path, [{"image": im.tobytes(), "size": i} for i, im in enumerate(images)])
    return images


def _samples(loader):
    """{catalog index: (array, label)} over one epoch of a prestage.Loader."""
    out = {}
    for batch in loader:
        arrays = batch.arrays
        for k, index in enumerate(batch.indices):
            out[int(index)] = (np.array(arrays[k]), int(batch.labels[k]))
    return out


def _raw_files(tmp_path, arrays, suffix=".bin"):
    """A from_paths catalog of raw files written with ndarray.tofile, in the order of `arrays`."""
    names = []
    for i, a in enumerate(arrays):
        a.tofile(tmp_path / f"{i:02d}{suffix}")
        names.append(f"{i:02d}{suffix}")
    return prestage.Catalog.from_paths(tmp_path, names, list(range(len(arrays))))


# ------------------------------------------------------------------------------- DLIO-style records

@pytest.mark.tf
def test_dlio_records_are_uint8_images_through_the_loader(tmp_path, write_tf_examples):
    images = _dlio_records(write_tf_examples, tmp_path / "dlio.tfrecord")
    cat = prestage.Catalog.from_tfrecord([tmp_path / "dlio.tfrecord"],
                                         features={"data": "image", "label": "size"})
    with prestage.Loader(cat, batch_size=3, decode="raw", raw_dtype=np.uint8, raw_shape=(H, -1),
                         seed=5) as loader:
        first = next(iter(loader))
        assert first.arrays.shape == (3, H, W) and first.arrays.dtype == np.uint8 and not first.ragged
        assert cat.dtype == "|u1"  # a bytes feature, as decode="raw" reads it
        del first
        got = _samples(loader)
    assert sorted(got) == list(range(len(images)))
    for index, (array, label) in got.items():
        assert label == index
        np.testing.assert_array_equal(array, images[index])


@pytest.mark.tf
@pytest.mark.torch
def test_dlio_records_through_torch_equal_the_written_arrays(tmp_path, write_tf_examples):
    import torch
    import prestage.torch as pt

    images = _dlio_records(write_tf_examples, tmp_path / "dlio.tfrecord", count=8)
    cat = prestage.Catalog.from_tfrecord([tmp_path / "dlio.tfrecord"],
                                         features={"image": "image", "label": "size"})
    with pt.Loader(cat, batch_size=4, decode="raw", raw_dtype="|u1", raw_shape=[H, W],
                   seed=1) as loader:
        seen = []
        for data, labels in loader:
            assert data.shape == (4, H, W) and data.dtype == torch.uint8
            for k, label in enumerate(labels.tolist()):
                np.testing.assert_array_equal(data[k].numpy(), images[label])
                seen.append(label)
    assert sorted(seen) == list(range(8))


@pytest.mark.tf
def test_dlio_records_through_tf_equal_parse_example_and_decode_raw(tmp_path, write_tf_examples):
    import tensorflow as tf
    import prestage.tf

    path = str(tmp_path / "dlio.tfrecord")
    _dlio_records(write_tf_examples, path, count=6)
    # TensorFlow's own reading of the same file, by label.
    spec = {"image": tf.io.FixedLenFeature([], tf.string), "size": tf.io.FixedLenFeature([], tf.int64)}
    oracle = {}
    for serialized in tf.data.TFRecordDataset(path).batch(6):
        parsed = tf.io.parse_example(serialized, spec)
        pixels = tf.reshape(tf.io.decode_raw(parsed["image"], tf.uint8), (-1, H, W)).numpy()
        oracle.update(zip(parsed["size"].numpy().tolist(), pixels))

    cat = prestage.Catalog.from_tfrecord([path], features={"data": "image", "label": "size"})
    ds = prestage.tf.dataset(cat, batch_size=3, decode="raw", raw_dtype="uint8", raw_shape=(H, W),
                             seed=2)
    images_spec, labels_spec = ds.element_spec
    assert images_spec.shape.as_list() == [3, H, W] and images_spec.dtype == tf.uint8
    seen = []
    for data, labels in ds:
        for k, label in enumerate(labels.numpy().tolist()):
            np.testing.assert_array_equal(data[k].numpy(), oracle[label])
            seen.append(label)
    assert sorted(seen) == sorted(oracle) == list(range(6))


@pytest.mark.tf
def test_tf_ragged_rows_of_raw_uint8_features_equal_parse_example_and_decode_raw(tmp_path, write_tf_examples):
    """cosmoflow-like records: a raw uint8 'image' feature of a different length in each record, as
    1-D ragged rows (int64 row splits, as the spec says), checked record by record against
    TensorFlow's own reading."""
    import tensorflow as tf
    import prestage.tf

    rng = np.random.default_rng(4)
    pixels = [rng.integers(0, 256, size=n, dtype=np.uint8) for n in (7, 3, 12, 12, 5, 9, 1)]
    path = write_tf_examples(tmp_path / "v.tfrecord",
                             [{"image": p.tobytes(), "label": k} for k, p in enumerate(pixels)])
    spec = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}
    oracle = {}
    for serialized in tf.data.TFRecordDataset(path):
        parsed = tf.io.parse_single_example(serialized, spec)
        oracle[int(parsed["label"])] = tf.io.decode_raw(parsed["image"], tf.uint8).numpy().tolist()

    cat = prestage.Catalog.from_tfrecord([path], features={"data": "image", "label": "label"})
    ds = prestage.tf.dataset(cat, batch_size=2, decode="raw", raw_dtype="uint8", ragged=True, seed=1)
    rows_spec = ds.element_spec[0]
    assert rows_spec.shape.as_list() == [None, None] and rows_spec.dtype == tf.uint8
    assert rows_spec.row_splits_dtype == tf.int64
    seen = []
    for data, labels in ds:
        for row, label in zip(data, labels.numpy().tolist()):
            assert row.numpy().tolist() == oracle[label]
            seen.append(label)
    assert sorted(seen) == sorted(oracle) == list(range(len(pixels)))


# ------------------------------------------------------------------ typed bytes, float and int64 lists

@pytest.mark.tf
def test_float32_bytes_with_an_inferred_dimension(tmp_path, write_tf_examples):
    rng = np.random.default_rng(3)
    rows = [2, 2, 3, 1, 2]  # the -1: dense batches where rows agree, lists where they do not
    arrays = [rng.standard_normal((r, 8)).astype("<f4") for r in rows]
    path = write_tf_examples(tmp_path / "f.tfrecord",
                             [{"x": a.tobytes(), "label": i} for i, a in enumerate(arrays)])
    cat = prestage.Catalog.from_tfrecord([path], features={"data": "x", "label": "label"})
    with prestage.Loader(cat, batch_size=2, decode="raw", raw_dtype="<f4", raw_shape=(-1, 8),
                         shuffle=False) as loader:
        batches = [(b.ragged, b.dtype, b.shapes) for b in loader]
        got = _samples(loader)
    assert batches[0] == (False, np.dtype("<f4"), [(2, 8), (2, 8)])
    assert batches[1][0] and batches[1][2] == [(3, 8), (1, 8)]
    for index, (array, label) in got.items():
        assert array.dtype == np.float32
        np.testing.assert_array_equal(array, arrays[label])


@pytest.mark.tf
def test_float_list_and_int64_list_features_are_float32_and_int64_arrays(tmp_path, write_tf_examples):
    rng = np.random.default_rng(7)
    floats = [rng.standard_normal(12).astype(np.float32) for _ in range(5)]
    ints = [rng.integers(-2**62, 2**62, size=12) for _ in range(5)]
    path = write_tf_examples(tmp_path / "lists.tfrecord", [
        {"f": f, "i": n, "label": k} for k, (f, n) in enumerate(zip(floats, ints))])

    def read(feature, **options):
        cat = prestage.Catalog.from_tfrecord([path], features={"data": feature, "label": "label"})
        with prestage.Loader(cat, batch_size=2, decode="raw", seed=4, **options) as loader:
            return _samples(loader)

    # The catalog records each feature's type as decode="raw" reads it (the loader probes nothing).
    for feature, dtype in (("f", "<f4"), ("i", "<i8")):
        assert prestage.Catalog.from_tfrecord([path], features={"data": feature}).dtype == dtype
    for index, (array, label) in read("f").items():  # no raw_dtype: the list's own type, 1-D
        assert array.dtype == np.float32 and array.shape == (12,)
        np.testing.assert_array_equal(array, floats[label])
    for index, (array, label) in read("i").items():
        assert array.dtype == np.int64
        np.testing.assert_array_equal(array, ints[label])
    for index, (array, label) in read("f", raw_dtype=np.float32, raw_shape=(3, 4)).items():
        np.testing.assert_array_equal(array, floats[label].reshape(3, 4))
    for index, (array, label) in read("i", raw_dtype="<i8", raw_shape=(-1, 2)).items():
        np.testing.assert_array_equal(array, ints[label].reshape(6, 2))
    # A raw_dtype that is not the list's type would reinterpret its values: refused, naming the file.
    with pytest.raises(prestage.DecodeError, match=r"lists\.tfrecord.*'<f4'.*'<f8'"):
        read("f", raw_dtype="<f8")
    with pytest.raises(prestage.DecodeError, match="do not fit raw_shape"):
        read("i", raw_dtype="<i8", raw_shape=(5, -1))


@pytest.mark.tf
def test_tf_dataset_of_a_float_list_feature(tmp_path, write_tf_examples):
    import tensorflow as tf
    import prestage.tf

    floats = [np.arange(6, dtype=np.float32) * (k + 1) for k in range(4)]
    path = write_tf_examples(tmp_path / "f.tfrecord", [{"f": f, "label": k} for k, f in enumerate(floats)])
    cat = prestage.Catalog.from_tfrecord([path], features={"data": "f", "label": "label"})
    ds = prestage.tf.dataset(cat, batch_size=2, decode="raw", raw_dtype="float32", raw_shape=(2, 3),
                             shuffle=False)
    assert ds.element_spec[0].shape.as_list() == [2, 2, 3] and ds.element_spec[0].dtype == tf.float32
    for data, labels in ds:
        for k, label in enumerate(labels.numpy().tolist()):
            np.testing.assert_array_equal(data[k].numpy(), floats[label].reshape(2, 3))


# ---------------------------------------------------------------------------------------- raw files

def test_big_endian_raw_files_equal_numpy_fromfile(tmp_path):
    rng = np.random.default_rng(9)
    arrays = [rng.integers(-30000, 30000, size=(4, 3)).astype(">i2") for _ in range(5)]
    cat = _raw_files(tmp_path, arrays)
    with prestage.Loader(cat, batch_size=5, decode="raw", raw_dtype=">i2", raw_shape=(4, 3),
                         shuffle=False) as loader:
        batch = next(iter(loader))
        assert batch.dtype == np.dtype(">i2")  # the stored byte order, as the batch's dtype
        for k, index in enumerate(batch.indices):
            oracle = np.fromfile(tmp_path / f"{int(index):02d}.bin", dtype=">i2").reshape(4, 3)
            np.testing.assert_array_equal(batch.arrays[k], oracle)
            assert batch.arrays[k].tobytes() == oracle.tobytes()  # byte for byte: not swapped
        del batch
    # Without a shape: 1-D, as np.fromfile.
    with prestage.Loader(cat, batch_size=5, decode="raw", raw_dtype=">i2", shuffle=False) as loader:
        batch = next(iter(loader))
        assert batch.arrays.shape == (5, 12)
        for k, index in enumerate(batch.indices):
            np.testing.assert_array_equal(batch.arrays[k],
                                          np.fromfile(tmp_path / f"{int(index):02d}.bin", dtype=">i2"))


@pytest.mark.torch
def test_big_endian_raw_files_through_torch_are_native_values(tmp_path):
    import prestage.torch as pt

    arrays = [(np.arange(6).reshape(2, 3) * (k - 2)).astype(">i2") for k in range(4)]
    cat = _raw_files(tmp_path, arrays)
    with pt.Loader(cat, batch_size=4, decode="raw", raw_dtype=">i2", raw_shape=(2, 3),
                   shuffle=False) as loader:
        data, labels = next(iter(loader))
        for k, label in enumerate(labels.tolist()):
            np.testing.assert_array_equal(data[k].numpy(), arrays[label])


def test_byte_ranges_of_packed_shards_are_typed_as_the_files_were(tmp_path):
    from prestage import pack as packing

    rng = np.random.default_rng(11)
    arrays = [rng.standard_normal((3, 4)).astype("<f8") for _ in range(9)]
    (tmp_path / "src").mkdir()
    _raw_files(tmp_path / "src", arrays)
    source = prestage.Catalog.from_folder(tmp_path / "src", extensions=[".bin"])
    packing.pack(source, tmp_path / "shards", shard_bytes=300, workers=1)
    cat = prestage.Catalog.from_shards(tmp_path / "shards")
    assert len({cat.locator(i)[0] for i in range(len(cat))}) > 1  # several shards, byte ranges
    with prestage.Loader(cat, batch_size=4, decode="raw", raw_dtype=np.float64, raw_shape=(3, 4),
                         seed=3) as loader:
        got = _samples(loader)
    assert sorted(got) == list(range(9))
    for index, (array, _) in got.items():
        _, offset, length = cat.locator(index)
        in_shard = np.fromfile(cat.source_path(index), dtype="<f8", count=length // 8, offset=offset)
        np.testing.assert_array_equal(array, in_shard.reshape(3, 4))
        np.testing.assert_array_equal(array, arrays[int(source.path(index)[:2])])  # pack keeps the order


def test_a_size_that_does_not_fit_raises_naming_the_path_and_skip_replaces_it(tmp_path):
    good = [np.full((2, 4), k, dtype="<f4") for k in range(6)]
    cat = _raw_files(tmp_path, good)
    # Sample 3: 30 bytes, not a whole number of float32; sample 4: 3 floats, not (2, 4).
    (tmp_path / "03.bin").write_bytes(bytes(30))
    np.arange(3, dtype="<f4").tofile(tmp_path / "04.bin")
    options = dict(batch_size=2, decode="raw", raw_dtype="<f4", raw_shape=(2, 4), shuffle=False)
    with prestage.Loader(cat, **options) as loader:
        batches = iter(loader)
        next(batches)
        with pytest.raises(prestage.DecodeError, match=r"03\.bin.*30 bytes.*'<f4'"):
            next(batches)
    cat4 = prestage.Catalog.from_paths(tmp_path, ["04.bin"])
    with prestage.Loader(cat4, **options) as loader:
        with pytest.raises(prestage.DecodeError, match=r"04\.bin.*3 items.*\(2, 4\)"):
            next(iter(loader))
    with prestage.Loader(cat, on_error="skip", **options) as loader:
        got = _samples(loader)
        skipped = loader.stats()["skipped"]
    assert skipped == 2
    for index, (array, label) in got.items():
        assert index not in (3, 4)
        np.testing.assert_array_equal(array, good[index])


def test_without_raw_dtype_raw_samples_are_their_bytes(tmp_path):
    arrays = [np.arange(k + 1, dtype="<f4") for k in range(3)]
    cat = _raw_files(tmp_path, arrays)
    with prestage.Loader(cat, batch_size=3, decode="raw", shuffle=False) as loader:
        batch = next(iter(loader))
        assert batch.dtype == np.uint8 and batch.ragged
        assert [a.tobytes() for a in batch.arrays] == [a.tobytes() for a in arrays]


# ------------------------------------------------------------------------------------ bad arguments

@pytest.mark.parametrize("options, match", [
    ({"raw_dtype": "S4"}, "raw_dtype"),                 # np.dtype takes it; the decoder does not
    ({"raw_dtype": "not a dtype"}, "raw_dtype"),
    ({"raw_dtype": "<f4", "raw_shape": (-1, -1)}, "raw_shape"),
    ({"raw_dtype": "<f4", "raw_shape": (2, -3)}, "raw_shape"),
    ({"raw_dtype": "<f4", "raw_shape": (0, -1)}, "raw_shape"),
    ({"raw_dtype": "<f4", "raw_shape": "ab"}, "raw_shape"),
    ({"raw_dtype": "<f4", "raw_shape": (2.5,)}, "raw_shape"),
    ({"raw_dtype": "<f4", "raw_shape": (2**40, 2**40)}, "max_sample_bytes"),
    ({"raw_dtype": "<f4", "raw_shape": (1,) * 33}, "raw_shape"),
    ({"raw_shape": (2, 2)}, "raw_dtype"),                # a shape needs the type of its items
    ({"raw_dtype": "<f4", "decode": "npy"}, "decode=raw only"),
])
def test_bad_raw_options_are_config_errors(tmp_path, options, match):
    cat = _raw_files(tmp_path, [np.zeros(4, dtype="<f4")])
    options = {"decode": "raw", **options}
    with pytest.raises(prestage.ConfigError, match=match):
        prestage.Loader(cat, batch_size=1, **options)


def test_an_integer_raw_shape_is_one_dimension(tmp_path):
    cat = _raw_files(tmp_path, [np.arange(4, dtype="<u2")])
    with prestage.Loader(cat, batch_size=1, decode="raw", raw_dtype=np.uint16, raw_shape=4) as loader:
        assert next(iter(loader)).arrays.shape == (1, 4)
    assert loader.options.raw_shape == [4] and loader.options.raw_dtype == "<u2"


# ------------------------------------------------------------------------------------------ features=

def test_features_take_data_or_image_not_both_nor_unknown_keys(tmp_path, write_tfrecord):
    path = write_tfrecord(tmp_path / "r.tfrecord", [{"px": b"abcd", "y": 3}, {"px": b"efgh", "y": 4}])
    cat = prestage.Catalog.from_tfrecord([path], features={"data": "px", "label": "y"})
    assert len(cat) == 2 and [cat.label(i) for i in range(2)] == [3, 4]
    with prestage.Loader(cat, batch_size=2, decode="raw", raw_dtype="<u2", shuffle=False) as loader:
        batch = next(iter(loader))
        np.testing.assert_array_equal(batch.arrays, np.frombuffer(b"abcdefgh", "<u2").reshape(2, 2))
    with pytest.raises(prestage.ConfigError, match="'image' or 'data'"):
        prestage.Catalog.from_tfrecord([path], features={"image": "px", "data": "px"})
    with pytest.raises(prestage.ConfigError, match="'image' or 'data'"):
        prestage.Catalog.from_tfrecord([path], features={"label": "y"})
    with pytest.raises(prestage.ConfigError, match="'image' or 'data', and 'label', got 'pixels'"):
        prestage.Catalog.from_tfrecord([path], features={"pixels": "px"})
