"""prestage.tf: a tf.data.Dataset with the NumPy loader's batches, for model.fit. TensorFlow is slow to
import, so these tests are few."""

import numpy as np
import pytest

import prestage

tf = pytest.importorskip("tensorflow")
import prestage.tf  # noqa: E402  (after the importorskip)

pytestmark = pytest.mark.tf


def numpy_epochs(cat, epochs, **kwargs):
    """The NumPy loader's batches, copied: the oracle."""
    with prestage.Loader(cat, **kwargs) as loader:
        return [[(b.images.copy(), b.labels.copy()) for b in loader] for _ in range(epochs)]


def test_dataset_yields_the_numpy_loaders_batches_with_a_full_signature(make_folder):
    cat = prestage.Catalog.from_folder(make_folder(3, 7, size=(20, 30)))  # 21 samples
    kwargs = dict(batch_size=4, seed=5)
    expected = numpy_epochs(cat, 2, **kwargs)
    # depth=2, the least: TensorFlow holds every element below, so each buffer must be free again as
    # soon as its batch has been handed over.
    ds = prestage.tf.dataset(cat, depth=2, **kwargs)
    images_spec, labels_spec = ds.element_spec
    assert images_spec.shape.as_list() == [None, 20, 30, 3] and images_spec.dtype == tf.uint8
    assert labels_spec.shape.as_list() == [None] and labels_spec.dtype == tf.int64
    assert int(ds.cardinality()) == len(expected[0]) == 6
    for epoch in range(2):  # each pass is the next epoch
        got = list(ds.prefetch(8))
        assert len(got) == 6
        for (images, labels), (ei, el) in zip(got, expected[epoch]):
            np.testing.assert_array_equal(images.numpy(), ei)
            np.testing.assert_array_equal(labels.numpy(), el)

    kwargs = dict(batch_size=4, image_size=(8, 8), drop_last=True, rank=1, world_size=2, layout="NCHW",
                  dtype="float32", mean=(0.5, 0.4, 0.3), std=(0.2, 0.3, 0.4))
    fixed = prestage.tf.dataset(cat, **kwargs)
    assert [s.shape.as_list() for s in fixed.element_spec] == [[4, 3, 8, 8], [4]]
    assert fixed.element_spec[0].dtype == tf.float32
    assert int(fixed.cardinality()) == 21 // 8
    got, want = list(fixed), numpy_epochs(cat, 1, **kwargs)[0]
    assert len(got) == len(want)
    for (images, labels), (ei, el) in zip(got, want):
        np.testing.assert_array_equal(images.numpy(), ei)
        np.testing.assert_array_equal(labels.numpy(), el)
    with pytest.raises(prestage.ConfigError):
        prestage.tf.dataset(cat, batch_size=0)


def test_dataset_feeds_model_fit(make_folder):
    cat = prestage.Catalog.from_folder(make_folder(2, 8, size=(16, 16)))
    ds = prestage.tf.dataset(cat, batch_size=4, seed=1)
    keras = tf.keras
    model = keras.Sequential([
        keras.Input(shape=(16, 16, 3), dtype="uint8"),
        keras.layers.Rescaling(1 / 255),
        keras.layers.Conv2D(4, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(2),
    ])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    steps = []
    count = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: steps.append(batch))
    history = model.fit(ds, epochs=2, shuffle=False, verbose=0, callbacks=[count])  # prestage shuffles
    assert steps == [0, 1, 2, 3] * 2  # every batch of both epochs
    assert len(history.history["loss"]) == 2 and all(np.isfinite(history.history["loss"]))
    assert 0.0 <= model.evaluate(ds, verbose=0, return_dict=True)["accuracy"] <= 1.0


def test_decode_device_cpu_is_taken_as_the_loader_takes_it(make_folder):
    cat = prestage.Catalog.from_folder(make_folder(2, 5, size=(12, 18)))  # 10 samples
    kwargs = dict(batch_size=4, seed=3)
    want = numpy_epochs(cat, 1, **kwargs)[0]
    got = list(prestage.tf.dataset(cat, decode_device="cpu", **kwargs))
    assert len(got) == len(want) == 3
    for (images, labels), (ei, el) in zip(got, want):
        np.testing.assert_array_equal(images.numpy(), ei)
        np.testing.assert_array_equal(labels.numpy(), el)
    with pytest.raises(prestage.ConfigError):  # checked as the Loader checks it
        prestage.tf.dataset(cat, decode_device="tpu", **kwargs)


def test_decode_device_cuda_is_refused_as_tensorflow_takes_host_memory(make_folder):
    # Refused before any loader or device is opened: the same with or without a GPU.
    cat = prestage.Catalog.from_folder(make_folder(2, 2, size=(12, 18)))
    with pytest.raises(prestage.ConfigError, match="decode_device='cuda'"):
        prestage.tf.dataset(cat, batch_size=2, image_size=(8, 8), decode_device="cuda")


def test_on_error_skip_is_passed_through(make_folder):
    cat = prestage.Catalog.from_folder(make_folder(3, 8))  # 24 images of 32x48
    for i in (3, 11, 17):
        cat.source_path(i).write_bytes(b"not a jpeg")
    ds = prestage.tf.dataset(cat, batch_size=6, seed=2, on_error="skip")
    assert [tuple(images.shape) for images, _ in ds] == [(6, 32, 48, 3)] * 4


def test_io_timeout_is_passed_through(stalled_catalog):
    ds = prestage.tf.dataset(stalled_catalog, batch_size=1, image_size=(32, 32), io_timeout=0.3)
    with pytest.raises(Exception, match="io_timeout"):
        next(iter(ds))


def test_signature_has_the_image_size_of_tfrecord_and_zstd_catalogs(tmp_path, write_tfrecord, encode_jpeg):
    # The first sample's bytes are not a JPEG file of its own: a record of a TFRecord file, a zstd frame.
    zstandard = pytest.importorskip("zstandard")
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (20, 30, 3), dtype=np.uint8) for _ in range(4)]
    records = write_tfrecord(tmp_path / "a.tfrecord",
                             [{"image": encode_jpeg(a), "label": i} for i, a in enumerate(images)])
    tfrecord = prestage.Catalog.from_tfrecord([records], features={"image": "image", "label": "label"})
    (tmp_path / "z").mkdir()
    for i, a in enumerate(images):
        (tmp_path / "z" / f"{i}.jpg.zst").write_bytes(zstandard.ZstdCompressor().compress(encode_jpeg(a)))
    zstd = prestage.Catalog.from_paths(tmp_path / "z", [f"{i}.jpg.zst" for i in range(4)])
    for cat in (tfrecord, zstd):
        for layout, shape in (("NHWC", [4, 20, 30, 3]), ("NCHW", [4, 3, 20, 30])):
            ds = prestage.tf.dataset(cat, batch_size=4, layout=layout)
            assert ds.element_spec[0].shape.as_list() == shape
            assert [tuple(images.shape) for images, _ in ds] == [tuple(shape)]


def test_staged_paths_in_plan_order_for_the_users_own_parsing(tmp_path):
    import hashlib

    rng = np.random.default_rng(3)
    for i in range(30):
        folder = tmp_path / "src" / f"c{i % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{i:03d}.bin").write_bytes(rng.bytes(int(rng.integers(10, 500))))
    catalog = prestage.Catalog.from_folder(tmp_path / "src", [])
    plan = dict(batch_size=4, seed=9, rank=0, world_size=2)
    with prestage.Loader(catalog, decode="raw", **plan) as loader:
        expected = [[int(i) for i in b.indices] for e in range(2) for b in (loader.set_epoch(e) or loader)]
    expected = [i for batch in expected for i in batch]
    ds = prestage.tf.staged_paths(catalog, stage_dir=str(tmp_path / "stage"), epochs=2, stage_patience=None,
                                  **plan)
    parsed = ds.map(lambda path, offset, length, label: (tf.io.read_file(path), label),
                    num_parallel_calls=tf.data.AUTOTUNE)
    got = list(parsed.as_numpy_iterator())
    assert len(got) == len(expected)
    for (data, label), index in zip(got, expected):
        assert data == catalog.source_path(index).read_bytes()
        assert label == catalog.label(index)
    assert ds.sampler.stats()["worker_staged"] > 0
    ds.sampler.close()
    # read=True: the bytes themselves.
    ds = prestage.tf.staged_paths(catalog, stage_dir=str(tmp_path / "stage"), epochs=1, read=True, **plan)
    got = [(hashlib.sha256(d).hexdigest(), int(label)) for d, label in ds.as_numpy_iterator()]
    assert got == [(hashlib.sha256(catalog.source_path(i).read_bytes()).hexdigest(), catalog.label(i))
                   for i in expected[:len(got)]]
    ds.sampler.close()
    # A saved catalog's path, as prestage.Loader and prestage.tf.dataset take it: the same samples.
    catalog.save(tmp_path / "train.catalog")
    ds = prestage.tf.staged_paths(str(tmp_path / "train.catalog"), stage_dir=str(tmp_path / "stage"),
                                  epochs=1, read=True, **plan)
    assert [(hashlib.sha256(d).hexdigest(), int(label)) for d, label in ds.as_numpy_iterator()] == got
    ds.sampler.close()
