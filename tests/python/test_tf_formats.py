"""Every decode mode through prestage.tf.dataset, against independent oracles: NumPy (.npy), h5py (HDF5)
and TensorFlow's own TFRecordWriter and tf.io.decode_raw (raw pixel features). TensorFlow is slow to
import, so these tests are few."""

import h5py
import numpy as np
import pytest

import prestage
from prestage.plan import epoch_batches

tf = pytest.importorskip("tensorflow")
import prestage.tf  # noqa: E402  (after the importorskip)

pytestmark = pytest.mark.tf


def _npy_set(root, shapes, dtype):
    (root / "c").mkdir(parents=True)
    rng = np.random.default_rng(1)
    for i, shape in enumerate(shapes):
        np.save(root / "c" / f"{i:02d}.npy", rng.integers(-50, 50, size=shape).astype(dtype))
    return prestage.Catalog.from_folder(root, extensions=[".npy"])


def test_tf_npy_batches_are_dense_with_the_first_samples_shape(tmp_path):
    cat = _npy_set(tmp_path, [(3, 2)] * 7, ">i4")
    ds = prestage.tf.dataset(cat, batch_size=3, decode="npy", seed=2, drop_last=True)
    spec, labels_spec = ds.element_spec
    assert spec.shape.as_list() == [3, 3, 2] and spec.dtype == tf.int32
    order = epoch_batches(7, 3, seed=2, epoch=0, drop_last=True)
    got = [(a.numpy(), y.numpy()) for a, y in ds]
    assert len(got) == len(order) == 2
    for (arrays, labels), idx in zip(got, order):
        np.testing.assert_array_equal(arrays, np.stack([np.load(cat.source_path(i)) for i in idx]))
        assert labels.tolist() == [0] * 3


def test_tf_an_odd_first_npy_gives_neither_the_signature_nor_the_batches_their_dtype(tmp_path):
    # The signature was the first sample's: an int32 file first made every float64 batch int32.
    root = tmp_path / "c"
    root.mkdir()
    for i in range(6):
        np.save(root / f"{i}.npy", np.full((2, 2), i + 0.5) if i else np.zeros((3,), np.int32))
    cat = prestage.Catalog.from_folder(tmp_path, extensions=[".npy"])
    ds = prestage.tf.dataset(cat, batch_size=2, decode="npy", shuffle=False, on_error="skip")
    assert ds.element_spec[0].dtype == tf.float64 and ds.element_spec[0].shape.as_list() == [2, 2, 2]
    got = np.concatenate([a.numpy() for a, _ in ds])
    np.testing.assert_array_equal(got, np.stack([np.full((2, 2), i + 0.5) for i in (1, 1, 2, 3, 4, 5)]))
    it = iter(prestage.tf.dataset(cat, batch_size=2, decode="npy", shuffle=False))
    with pytest.raises(Exception, match=r"/c/0\.npy"):  # the odd file is the one named
        next(it)


def test_tf_ragged_arrays_need_ragged_true(tmp_path):
    cat = _npy_set(tmp_path, [(i + 1, 2) for i in range(5)], np.float32)
    with pytest.raises(Exception, match="ragged=True"):
        list(prestage.tf.dataset(cat, batch_size=2, decode="npy"))
    ds = prestage.tf.dataset(cat, batch_size=2, decode="npy", ragged=True)
    assert isinstance(ds.element_spec[0], tf.RaggedTensorSpec)
    order = epoch_batches(5, 2, seed=0, epoch=0)
    for (arrays, _), idx in zip(ds, order):
        assert [np.asarray(r).tolist() for r in arrays.to_list()] == \
            [np.load(cat.source_path(i)).tolist() for i in idx]
    with pytest.raises(prestage.ConfigError):
        prestage.tf.dataset(cat, batch_size=2, decode="npy", ragged="yes")


@pytest.mark.parametrize("dtype", [np.uint8, "<f8"])
def test_tf_ragged_vectors(tmp_path, dtype):
    """1-D samples of mixed lengths (a batch of equal lengths included) as ragged rows: the values,
    and the row splits of the spec (int64)."""
    lengths = [3, 5, 4, 4, 1, 6, 2]
    cat = _npy_set(tmp_path, [(n,) for n in lengths], dtype)
    ds = prestage.tf.dataset(cat, batch_size=2, decode="npy", ragged=True, shuffle=False)
    spec = ds.element_spec[0]
    assert spec.shape.as_list() == [None, None] and spec.ragged_rank == 1
    assert spec.row_splits_dtype == tf.int64 and spec.dtype == tf.as_dtype(np.dtype(dtype).newbyteorder("="))
    rows = [r.numpy().tolist() for arrays, _ in ds for r in arrays]
    assert rows == [np.load(cat.source_path(i)).tolist() for i in range(len(lengths))]


def test_tf_hdf5_rows_equal_h5py(tmp_path):
    with h5py.File(tmp_path / "d.h5", "w") as h5:
        h5["x"] = np.arange(40, dtype=">f8").reshape(10, 4) / 3
        h5["y"] = np.arange(10) + 7
    cat = prestage.Catalog.from_hdf5([tmp_path / "d.h5"], "x", labels="y")
    cat.save(tmp_path / "cat.bin")
    ds = prestage.tf.dataset(tmp_path / "cat.bin", batch_size=5, seed=3)  # a saved catalog's path
    order = epoch_batches(10, 5, seed=3, epoch=0)
    with h5py.File(tmp_path / "d.h5", "r") as h5:
        x, y = h5["x"][()], h5["y"][()]
    for (arrays, labels), idx in zip(ds, order):
        np.testing.assert_array_equal(arrays.numpy(), x[idx])
        np.testing.assert_array_equal(labels.numpy(), y[idx])


def test_tf_raw_pixel_features_written_by_tensorflow_decode_as_tf_decode_raw(tmp_path):
    rng = np.random.default_rng(4)
    images = [rng.integers(0, 255, size=(4, 5, 3), dtype=np.uint8) for _ in range(6)]
    path = str(tmp_path / "px.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for i, im in enumerate(images):
            writer.write(tf.train.Example(features=tf.train.Features(feature={
                "pixels": tf.train.Feature(bytes_list=tf.train.BytesList(value=[im.tobytes()])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
            })).SerializeToString())
    cat = prestage.Catalog.from_tfrecord([path], features={"image": "pixels", "label": "label"})
    ds = prestage.tf.dataset(cat, batch_size=4, decode="raw", shuffle=False)
    assert ds.element_spec[0].dtype == tf.string
    seen = []
    for data, labels in ds:
        pixels = tf.reshape(tf.io.decode_raw(data, tf.uint8), (-1, 4, 5, 3)).numpy()
        for k, label in enumerate(labels.numpy()):
            np.testing.assert_array_equal(pixels[k], images[label])
            seen.append(int(label))
    assert sorted(set(seen)) == list(range(6))
