"""JPEGs of mixed sizes without image_size: each image keeps its own size, and a batch of mixed sizes is
ragged (a list of per-image arrays), as arrays of different shapes are. Pillow is the oracle."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import pytest
from PIL import Image

import prestage

# (height, width) of each image, in catalog order: with shuffle=False and batch_size=2, batch 0 has one
# size, batches 1 and 2 mix sizes (odd sizes too: partial MCUs), batch 3 holds one image.
SIZES = [(24, 40), (24, 40), (40, 24), (33, 17), (16, 16), (24, 40), (9, 31)]


def _pixels(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A smooth image with some noise: compresses like a photo."""
    yy, xx = np.mgrid[0:height, 0:width]
    base = np.stack([xx * 255 / max(1, width - 1), yy * 255 / max(1, height - 1), (xx + yy) * 3.0], -1)
    return np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)


def _write(root: Path, sizes: List[Tuple[int, int]], seed: int = 0) -> prestage.Catalog:
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    names = []
    for i, (h, w) in enumerate(sizes):
        names.append(f"{i:02d}_{h}x{w}.jpg")
        Image.fromarray(_pixels(rng, h, w)).save(root / names[-1], quality=90)
    return prestage.Catalog.from_paths(root, names, labels=list(range(len(names))))  # label: index


@pytest.fixture
def mixed(tmp_path: Path) -> prestage.Catalog:
    """Seven JPEGs of five sizes, written by Pillow."""
    return _write(tmp_path / "mixed", SIZES)


def pil(source) -> np.ndarray:
    """Pillow's RGB pixels of a JPEG file (a path) or of its bytes."""
    with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as im:
        return np.asarray(im.convert("RGB"))


def as_layout(rgb: np.ndarray, layout: str) -> np.ndarray:
    return rgb.transpose(2, 0, 1) if layout == "NCHW" else rgb


def images_of(batch) -> List[np.ndarray]:
    """The batch's images one by one, checking that a ragged batch is a list and any other one array."""
    images = batch.images
    assert isinstance(images, list) == batch.ragged
    if batch.ragged:
        assert len(images) == len(batch)
        assert len({im.shape for im in images}) > 1
        return images
    assert isinstance(images, np.ndarray) and images.shape[0] == len(batch)
    return list(images)


def each_image(loader) -> Dict[int, np.ndarray]:
    """Every image of an epoch of `loader`, copied, by catalog index; checks each batch's form."""
    out = {}
    for batch in loader:
        images = images_of(batch)
        assert [tuple(s) for s in batch.shapes] == [im.shape for im in images]
        for index, image in zip(batch.indices.tolist(), images):
            out[index] = image.copy()
    return out


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("staged", [False, True])
def test_every_image_keeps_its_size_and_equals_pils_decode(mixed, tmp_path, layout, staged):
    stage = {"stage_dir": str(tmp_path / "stage")} if staged else {}
    with prestage.Loader(mixed, batch_size=3, seed=4, layout=layout, **stage) as loader:
        assert loader.image_size is None
        for _ in range(2):  # with a stage directory, the second epoch reads the staged copies
            ragged = 0
            for batch in loader:
                ragged += batch.ragged
                assert batch.dtype == np.uint8
                for index, image in zip(batch.indices.tolist(), images_of(batch)):
                    np.testing.assert_array_equal(image, as_layout(pil(mixed.source_path(index)), layout))
            assert ragged > 0


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_float32_images_of_mixed_sizes_are_normalised_as_numpy_does(mixed, layout):
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    with prestage.Loader(mixed, batch_size=2, shuffle=False, layout=layout, dtype="float32", mean=mean,
                         std=std) as loader:
        got = each_image(loader)
    assert sorted(got) == list(range(len(SIZES)))
    for index, image in got.items():
        assert image.dtype == np.float32
        want = (pil(mixed.source_path(index)) / 255.0 - np.array(mean)) / np.array(std)
        np.testing.assert_allclose(image, as_layout(want, layout), rtol=0, atol=1e-6)


def test_a_batch_of_one_size_is_one_array(mixed, make_folder):
    with prestage.Loader(mixed, batch_size=2, shuffle=False) as loader:
        batches = [(b.ragged, b.images.shape if not b.ragged else None) for b in loader]
    # Batch 0 holds two 24x40 images; batches 1 and 2 mix sizes; batch 3 is one 9x31 image.
    assert batches == [(False, (2, 24, 40, 3)), (True, None), (True, None), (False, (1, 9, 31, 3))]
    same = prestage.Catalog.from_folder(make_folder(2, 5, size=(20, 36)))
    with prestage.Loader(same, batch_size=4, seed=1, layout="NCHW") as loader:
        for batch in loader:
            assert not batch.ragged and isinstance(batch.images, np.ndarray)
            assert batch.images.shape == (len(batch), 3, 20, 36)
            for index, image in zip(batch.indices.tolist(), batch.images):
                np.testing.assert_array_equal(image, as_layout(pil(same.source_path(index)), "NCHW"))


def test_zstd_frames_of_jpegs_of_mixed_sizes(mixed, tmp_path):
    zstandard = pytest.importorskip("zstandard")
    (tmp_path / "z").mkdir()
    names = []
    for i in range(len(mixed)):
        names.append(f"{i}.jpg.zst")
        data = zstandard.ZstdCompressor().compress(mixed.source_path(i).read_bytes())
        (tmp_path / "z" / names[-1]).write_bytes(data)
    cat = prestage.Catalog.from_paths(tmp_path / "z", names)
    with prestage.Loader(cat, batch_size=3, seed=2) as loader:
        got = each_image(loader)
    assert sorted(got) == list(range(len(SIZES)))
    for index, image in got.items():
        np.testing.assert_array_equal(image, pil(mixed.source_path(index)))


@pytest.mark.tf
def test_tfrecord_jpegs_of_mixed_sizes_written_by_tensorflow(mixed, tmp_path):
    tf = pytest.importorskip("tensorflow")
    path = str(tmp_path / "mixed.tfrecord")
    encoded = [mixed.source_path(i).read_bytes() for i in range(len(mixed))]
    with tf.io.TFRecordWriter(path) as writer:
        for i, data in enumerate(encoded):
            writer.write(tf.train.Example(features=tf.train.Features(feature={
                "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
            })).SerializeToString())
    cat = prestage.Catalog.from_tfrecord([path], features={"image": "image/encoded", "label": "label"})
    with prestage.Loader(cat, batch_size=3, seed=3, layout="NCHW") as loader:
        seen = 0
        for batch in loader:
            for label, image in zip(batch.labels.tolist(), images_of(batch)):
                np.testing.assert_array_equal(image, as_layout(pil(encoded[label]), "NCHW"))
                seen += 1
    assert seen == len(SIZES)


def _damaged(root: Path) -> prestage.Catalog:
    """0: 24x40; 1: not a JPEG; 2: 40x24; 3: 24x40 cut short (its header intact); 4: 33x17; 5: 24x40."""
    cat = _write(root, [(24, 40), (24, 40), (40, 24), (24, 40), (33, 17), (24, 40)], seed=5)
    cat.source_path(1).write_bytes(b"not a jpeg at all")
    whole = cat.source_path(3).read_bytes()
    cat.source_path(3).write_bytes(whole[:len(whole) * 2 // 3])
    return cat


def test_a_corrupt_or_truncated_image_raises_naming_its_path(tmp_path):
    cat = _damaged(tmp_path / "d")
    with prestage.Loader(cat, batch_size=2, shuffle=False) as loader:
        outcomes = []
        it = iter(loader)
        while True:
            try:
                batch = next(it)
            except prestage.DecodeError as e:
                outcomes.append(e.path)
                continue
            except StopIteration:
                break
            outcomes.append(batch.indices.tolist())
    # Sample 1 fails on its header (step 1), sample 3 when decoded (step 3).
    assert outcomes == [str(cat.source_path(1)), str(cat.source_path(3)), [4, 5]]


def test_skip_replaces_a_bad_image_and_a_laid_out_one_by_an_image_of_its_size(tmp_path):
    cat = _damaged(tmp_path / "d")
    with prestage.Loader(cat, batch_size=2, shuffle=False, on_error="skip") as loader:
        got = [(b.indices.tolist(), [im.copy() for im in images_of(b)]) for b in loader]
        stats = loader.stats()
    # Sample 1, whose size was never known, takes the next good image whatever its size (2: 40x24).
    # Sample 3 fails once the batch is laid out: 4 (33x17) does not fit its place, 5 (24x40) does.
    assert [indices for indices, _ in got] == [[0, 2], [2, 5], [4, 5]]
    for indices, images in got:
        for index, image in zip(indices, images):
            np.testing.assert_array_equal(image, pil(cat.source_path(index)))
    assert stats["skipped"] == 2
    assert [s["sample"] for s in stats["skipped_samples"]] == [1, 3]


def test_an_image_over_max_pixels_is_refused(tmp_path):
    cat = _write(tmp_path / "big", [(24, 40), (40, 33), (20, 20)])  # 960, 1320 and 400 pixels
    with prestage.Loader(cat, batch_size=1, shuffle=False, max_pixels=1000) as loader:
        it = iter(loader)
        assert next(it).images.shape == (1, 24, 40, 3)
        with pytest.raises(prestage.DecodeError, match="max_pixels") as error:
            next(it)
        assert error.value.path == str(cat.source_path(1))
        assert next(it).images.shape == (1, 20, 20, 3)


@pytest.mark.torch
def test_torch_gives_a_list_of_tensors_for_a_ragged_batch(mixed):
    torch = pytest.importorskip("torch")
    import prestage.torch

    with prestage.torch.Loader(mixed, batch_size=2, shuffle=False) as loader:  # NCHW, uint8
        batches = list(loader)
    assert [isinstance(images, list) for images, _ in batches] == [False, True, True, False]
    index = 0
    for images, labels in batches:
        for image in (images if isinstance(images, list) else list(images)):
            assert image.dtype == torch.uint8
            np.testing.assert_array_equal(image.numpy(), as_layout(pil(mixed.source_path(index)), "NCHW"))
            index += 1
    assert index == len(SIZES)

    with prestage.Loader(mixed, batch_size=3, shuffle=False) as numpy_loader:
        batch = next(iter(numpy_loader))
        samples, labels = prestage.torch.as_tensors(batch)
        assert isinstance(samples, list) and [tuple(t.shape) for t in samples] == batch.shapes


@pytest.mark.tf
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_tf_ragged_true_gives_a_ragged_tensor_of_pils_pixels(mixed, layout):
    tf = pytest.importorskip("tensorflow")
    import prestage.tf

    ds = prestage.tf.dataset(mixed, batch_size=3, seed=6, layout=layout, ragged=True)
    spec = ds.element_spec[0]
    assert isinstance(spec, tf.RaggedTensorSpec) and spec.dtype == tf.uint8
    seen = 0
    for images, labels in ds:
        assert isinstance(images, tf.RaggedTensor)
        for k, label in enumerate(labels.numpy().tolist()):
            image = images[k].to_tensor().numpy()
            np.testing.assert_array_equal(image, as_layout(pil(mixed.source_path(label)), layout))
            seen += 1
    assert seen == len(SIZES)


@pytest.mark.tf
def test_tf_without_ragged_a_batch_of_mixed_sizes_raises(mixed):
    pytest.importorskip("tensorflow")
    import prestage.tf

    # Told before TensorFlow gets the generator (which would wrap the error in its own
    # InvalidArgumentError): a prestage.ConfigError, as documented.
    with pytest.raises(prestage.ConfigError, match="ragged=True"):
        prestage.tf.dataset(mixed, batch_size=2, shuffle=False)


@pytest.mark.torch
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_torch_device_normalisation_of_a_ragged_batch_is_the_cores(mixed, layout):
    # What normalize_on_device applies to each image of a ragged batch on the GPU, here on the CPU.
    torch = pytest.importorskip("torch")
    import prestage.torch as pt

    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    affine = pt._affine(pt._mean_std(mean, std), layout)
    with pt.Loader(mixed, batch_size=3, shuffle=False, layout=layout) as u8, \
            pt.Loader(mixed, batch_size=3, shuffle=False, layout=layout, dtype=torch.float32, mean=mean,
                      std=std) as f32:
        for (images, _), (want, _) in zip(u8, f32):
            ragged = isinstance(images, list)
            got = pt._normalized(images if ragged else [images], affine, ragged)
            for g, w in zip(got, want if ragged else [want]):
                torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
