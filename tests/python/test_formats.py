"""Stage 3's formats, each read against an independent oracle: NumPy for .npy/.npz, h5py for HDF5, Pillow
for JPEG, TensorFlow's TFRecordWriter (tf-marked) for TFRecord, the zstandard package for zstd frames."""

import math

import h5py
import numpy as np
import pytest
import zstandard
from PIL import Image

import prestage


def all_batches(loader):
    """[(indices, arrays or images, labels)] of one epoch, copied out."""
    out = []
    for b in loader:
        data = b.images.copy() if loader._options.decode == prestage._core.DecodeMode.jpeg else (
            [a.copy() for a in b.arrays] if b.ragged else b.arrays.copy())
        out.append((b.indices.copy(), data, b.labels.copy()))
    return out


def by_index(loader):
    """{catalog index: sample array} of one epoch."""
    found = {}
    for idx, data, _ in all_batches(loader):
        for k, i in enumerate(idx):
            found[int(i)] = data[k]
    return found


# ------------------------------------------------------------------------------------------------ npy


NPY_CASES = [
    (np.uint8, (4, 5)), (np.int16, (3,)), (np.int64, (2, 3, 4)), (">f8", (5, 2)), (np.float32, ()),
    (np.float16, (7,)), (np.complex64, (2, 2)), (np.bool_, (3, 3)), ("<u4", (1, 1, 1, 6)),
]


@pytest.mark.parametrize("dtype,shape", NPY_CASES)
@pytest.mark.parametrize("order", ["C", "F"])
def test_npy_any_dtype_shape_and_order_equals_numpy(tmp_path, dtype, shape, order):
    rng = np.random.default_rng(1)
    root = tmp_path / "set"
    (root / "a").mkdir(parents=True)
    arrays = []
    for i in range(7):
        a = np.array(np.asarray(rng.integers(0, 100, size=shape)).astype(dtype), order=order)
        np.save(root / "a" / f"{i}.npy", a)
        arrays.append(a)
    cat = prestage.Catalog.from_folder(root, extensions=[".npy"])
    with prestage.Loader(cat, batch_size=3, decode="npy", seed=2) as loader:
        for b in loader:
            assert not b.ragged
            assert b.arrays.shape == (len(b), *shape) and b.dtype == np.dtype(dtype)
            for k, i in enumerate(b.indices):
                np.testing.assert_array_equal(b.arrays[k], np.load(cat.source_path(int(i))))


def test_npy_of_different_shapes_is_ragged(tmp_path):
    (tmp_path / "c").mkdir()
    for i in range(6):
        np.save(tmp_path / "c" / f"{i}.npy", np.arange(i * 3 + 1, dtype=np.int32).reshape(-1, 1) * (i + 1))
    cat = prestage.Catalog.from_folder(tmp_path, extensions=[".npy"])
    with prestage.Loader(cat, batch_size=4, decode="npy", shuffle=False) as loader:
        batches = list(loader)
        first = batches[0]
        assert first.ragged and isinstance(first.arrays, list)
        assert first.shapes == [(i * 3 + 1, 1) for i in range(4)]
        assert list(first.offsets) == [0, 4, 20, 48, 88]
        for k, i in enumerate(first.indices):
            expected = np.load(cat.source_path(int(i)))
            np.testing.assert_array_equal(first.arrays[k], expected)
            assert not first.arrays[k].flags.owndata  # a view of the batch buffer


# ------------------------------------------------------------------------------------------------ npz


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
@pytest.mark.parametrize("order", ["C", "F"])
def test_npz_stored_and_deflated_equal_numpy(tmp_path, save, order):
    rng = np.random.default_rng(3)
    (tmp_path / "x").mkdir()
    for i in range(5):
        image = rng.normal(size=(4, 6, 5)).astype(np.float32)
        mask = rng.integers(0, 3, size=(4, 6, 5), dtype=np.uint8)
        if order == "F":
            image, mask = np.asfortranarray(image), np.asfortranarray(mask)
        save(tmp_path / "x" / f"case_{i}.npz", x=image, y=mask)
    cat = prestage.Catalog.from_folder(tmp_path, extensions=[".npz"])
    for name in ("x", "y"):
        with prestage.Loader(cat, batch_size=2, decode="npz", array_name=name) as loader:
            found = by_index(loader)
        assert sorted(found) == list(range(5))
        for i, a in found.items():
            with np.load(cat.source_path(i)) as npz:
                np.testing.assert_array_equal(a, npz[name])


def test_npz_with_one_array_needs_no_name_and_with_two_does(tmp_path):
    (tmp_path / "c").mkdir()
    np.savez(tmp_path / "c" / "one.npz", np.arange(10.0))
    cat = prestage.Catalog.from_folder(tmp_path, extensions=[".npz"])
    with prestage.Loader(cat, batch_size=1, decode="npz") as loader:
        np.testing.assert_array_equal(next(iter(loader)).arrays[0], np.arange(10.0))
    np.savez(tmp_path / "c" / "one.npz", a=np.arange(3), b=np.arange(4))
    with prestage.Loader(cat, batch_size=1, decode="npz") as loader:
        with pytest.raises(prestage.DecodeError, match="array_name"):
            next(iter(loader))


# ----------------------------------------------------------------------------------------------- zstd


def test_zstd_frames_of_npy_npz_and_jpeg_are_decompressed_first(tmp_path, encode_jpeg):
    rng = np.random.default_rng(4)
    compressor = zstandard.ZstdCompressor(level=3)
    streaming = zstandard.ZstdCompressor(level=1, write_content_size=False)
    (tmp_path / "npy").mkdir()
    (tmp_path / "npz").mkdir()
    (tmp_path / "jpg").mkdir()
    arrays = []
    for i in range(6):
        a = rng.normal(size=(5, 7)).astype(np.float64)
        a = np.asfortranarray(a) if i % 2 else a
        arrays.append(a)
        path = tmp_path / "npy" / f"{i}.npy"
        np.save(path, a)
        # Frames with and without the content size in their header.
        data = (compressor if i % 3 else streaming).compress(path.read_bytes())
        path.with_suffix(".npy.zst").write_bytes(data)
        path.unlink()
        np.savez_compressed(tmp_path / "npz" / f"{i}.npz", a=a)
        z = tmp_path / "npz" / f"{i}.npz"
        z.with_suffix(".npz.zst").write_bytes(compressor.compress(z.read_bytes()))
        z.unlink()
        img = rng.integers(0, 255, size=(16, 24, 3), dtype=np.uint8)
        (tmp_path / "jpg" / f"{i}.jpg.zst").write_bytes(compressor.compress(encode_jpeg(img, quality=95)))
        (tmp_path / "plain").mkdir(exist_ok=True)
        (tmp_path / "plain" / f"{i}.jpg").write_bytes(encode_jpeg(img, quality=95))

    def load(sub, ext, **kw):
        cat = prestage.Catalog.from_paths(tmp_path, [f"{sub}/{i}{ext}" for i in range(6)])
        with prestage.Loader(cat, batch_size=4, **kw) as loader:
            return by_index(loader)

    for i, a in load("npy", ".npy.zst", decode="npy").items():
        np.testing.assert_array_equal(a, arrays[i])
    for i, a in load("npz", ".npz.zst", decode="npz").items():
        np.testing.assert_array_equal(a, arrays[i])
    zst, plain = load("jpg", ".jpg.zst"), load("plain", ".jpg")
    for i in range(6):
        np.testing.assert_array_equal(zst[i], plain[i])
        with Image.open(tmp_path / "plain" / f"{i}.jpg") as im:
            np.testing.assert_array_equal(zst[i], np.asarray(im.convert("RGB")))


# ----------------------------------------------------------------------------------------------- HDF5


@pytest.mark.parametrize("dtype", [np.float32, np.int16, np.uint8, ">f8"])
def test_hdf5_rows_of_one_or_many_files_equal_h5py(tmp_path, dtype):
    rng = np.random.default_rng(5)
    paths = []
    for f, rows in enumerate([4, 1, 6]):  # a file of one row is a file of one sample
        path = tmp_path / f"part_{f}.h5"
        with h5py.File(path, "w") as h5:
            h5.create_dataset("fields", data=rng.integers(0, 100, size=(rows, 3, 8, 5)).astype(dtype),
                              chunks=(1, 3, 8, 5) if f == 2 else None)
            h5.create_dataset("labels", data=np.arange(rows, dtype=np.int32) + 10 * f)
        paths.append(path)
    cat = prestage.Catalog.from_hdf5(paths, "fields", labels="labels")
    assert len(cat) == 11 and cat.kind == "hdf5" and cat.field == "fields"
    cat.save(tmp_path / "cat.bin")
    cat = prestage.Catalog.load(tmp_path / "cat.bin")
    expected, labels = [], []
    for p in paths:
        with h5py.File(p, "r") as h5:
            expected.extend(h5["fields"][()])
            labels.extend(h5["labels"][()])
            # The data set's, as h5py reads it, in the byte order the loader delivers (native).
            assert cat.dtype == h5["fields"].dtype.newbyteorder("<").str
    with prestage.Loader(cat, batch_size=4, readers=2, seed=1) as loader:  # decode="hdf5" inferred
        for idx, data, lab in all_batches(loader):
            assert data.dtype == np.dtype(dtype).newbyteorder("<") or data.dtype == np.dtype(dtype)
            for k, i in enumerate(idx):
                np.testing.assert_array_equal(data[k], expected[i])
                assert lab[k] == labels[i]


def test_hdf5_catalog_needs_hdf5_decode_and_vice_versa(tmp_path, folder):
    with h5py.File(tmp_path / "a.h5", "w") as h5:
        h5["x"] = np.zeros((3, 2))
    cat = prestage.Catalog.from_hdf5([tmp_path / "a.h5"], "x")
    with pytest.raises(prestage.ConfigError):
        prestage.Loader(cat, batch_size=2, decode="npy")
    with pytest.raises(prestage.ConfigError):
        prestage.Loader(prestage.Catalog.from_folder(folder), batch_size=2, decode="hdf5")


# ------------------------------------------------------------------------------------------- TFRecord


def test_tfrecord_jpeg_raw_and_npy_features(tmp_path, write_tfrecord, encode_jpeg):
    rng = np.random.default_rng(6)
    images = [rng.integers(0, 255, size=(20, 30, 3), dtype=np.uint8) for _ in range(9)]
    encoded = [encode_jpeg(im, quality=92) for im in images]
    arrays = [rng.normal(size=(i + 1,)).astype(np.float32) for i in range(9)]
    npy = []
    for a in arrays:
        import io
        buf = io.BytesIO()
        np.save(buf, a)
        npy.append(buf.getvalue())
    examples = [{"image/encoded": encoded[i], "label": 100 + i, "blob": npy[i]} for i in range(9)]
    files = [write_tfrecord(tmp_path / "a.tfrecord", examples[:5]),
             write_tfrecord(tmp_path / "b.tfrecord", examples[5:])]
    cat = prestage.Catalog.from_tfrecord(files, features={"image": "image/encoded", "label": "label"})
    assert len(cat) == 9 and [cat.label(i) for i in range(9)] == list(range(100, 109))
    cat.save(tmp_path / "cat.bin")
    cat = prestage.Catalog.load(tmp_path / "cat.bin")  # the index is kept
    with prestage.Loader(cat, batch_size=4) as loader:
        for idx, data, lab in all_batches(loader):
            for k, i in enumerate(idx):
                with Image.open(__import__("io").BytesIO(encoded[i])) as im:
                    np.testing.assert_array_equal(data[k], np.asarray(im.convert("RGB")))
                assert lab[k] == 100 + i
    with prestage.Loader(cat, batch_size=4, decode="raw") as loader:
        for i, raw in by_index(loader).items():
            assert raw.tobytes() == encoded[i]
    blobs = prestage.Catalog.from_tfrecord(files, features={"image": "blob"})
    with prestage.Loader(blobs, batch_size=4, decode="npy") as loader:
        for i, a in by_index(loader).items():
            np.testing.assert_array_equal(a, arrays[i])


@pytest.mark.tf
def test_tfrecords_written_by_tensorflow(tmp_path, tfrecord_format, encode_jpeg):
    import tensorflow as tf

    serialize_example, frame_record = tfrecord_format
    rng = np.random.default_rng(7)
    images = [rng.integers(0, 255, size=(12, 16, 3), dtype=np.uint8) for _ in range(6)]
    path = tmp_path / "tf.tfrecord"
    payloads = []
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i, im in enumerate(images):
            example = tf.train.Example(features=tf.train.Features(feature={
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[encode_jpeg(im, quality=90)])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i * 7 - 3])),
            }))
            payload = example.SerializeToString()
            payloads.append(payload)
            writer.write(payload)
    # Our fixture writer frames records byte for byte as TensorFlow does.
    assert path.read_bytes() == b"".join(frame_record(p) for p in payloads)
    # And our Example encoder's bytes parse back in TensorFlow to the same features.
    parsed = tf.train.Example.FromString(serialize_example({"image": b"xyz", "label": [5, -2]}))
    assert parsed.features.feature["image"].bytes_list.value == [b"xyz"]
    assert list(parsed.features.feature["label"].int64_list.value) == [5, -2]

    cat = prestage.Catalog.from_tfrecord([path], features={"image": "image", "label": "label"})
    assert [cat.label(i) for i in range(6)] == [i * 7 - 3 for i in range(6)]
    with prestage.Loader(cat, batch_size=4, shuffle=False) as loader:
        got = np.concatenate([b.images.copy() for b in loader])
    for i, payload in enumerate(payloads):
        data = tf.train.Example.FromString(payload).features.feature["image"].bytes_list.value[0]
        # TensorFlow's default DCT is the fast one; Pillow's and ours the accurate one.
        np.testing.assert_array_equal(got[i], tf.io.decode_jpeg(data, dct_method="INTEGER_ACCURATE").numpy())


# ---------------------------------------------------------------------------- JPEG, the training path


def torchvision_get_params(draws, height, width, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision.transforms.RandomResizedCrop.get_params (v0.29), then RandomHorizontalFlip(0.5), with
    its random numbers taken from `draws`: torch's uniform_(a, b) is a + (b - a) * u, randint(0, n) is
    floor(u * n), rand(1) < p is u < p."""
    draws = iter(draws)
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * (scale[0] + (scale[1] - scale[0]) * next(draws))
        aspect_ratio = math.exp(log_ratio[0] + (log_ratio[1] - log_ratio[0]) * next(draws))
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = int(next(draws) * (height - h + 1))
            j = int(next(draws) * (width - w + 1))
            return i, j, h, w, next(draws) < 0.5
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w, next(draws) < 0.5


def test_random_resized_crop_boxes_equal_torchvisions_for_the_same_draws():
    fallbacks = 0
    for index in range(400):
        h, w = [(375, 500), (500, 375), (64, 64), (7, 900), (900, 5), (1, 1), (33, 250)][index % 7]
        draws = prestage.transforms.crop_draws(seed=11, epoch=index // 50, index=index, count=23)
        expected = torchvision_get_params(draws, h, w)
        got = prestage.transforms.random_resized_crop_params(11, index // 50, index, h, w)
        assert got == expected, (index, h, w)
        fallbacks += got[2:4] == expected[2:4] and index % 7 in (3, 4)
    assert fallbacks > 0
    # Seeded: the same draw again, a different one for another epoch or seed.
    a = prestage.transforms.random_resized_crop_params(1, 0, 5, 375, 500)
    assert a == prestage.transforms.random_resized_crop_params(1, 0, 5, 375, 500)
    assert a != prestage.transforms.random_resized_crop_params(1, 1, 5, 375, 500)
    assert a != prestage.transforms.random_resized_crop_params(2, 0, 5, 375, 500)


def pil_resized_crop(path, box, size):
    """torchvision's resized_crop on a PIL image (crop, then BILINEAR resize), then the flip."""
    top, left, h, w, flip = box
    with Image.open(path) as im:
        img = im.convert("RGB").crop((left, top, left + w, top + h)).resize((size[1], size[0]), Image.BILINEAR)
    if flip:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(img)


def test_random_resized_crop_pixels_agree_with_pil_on_the_same_box(make_folder):
    root = make_folder(3, 12, size=None)  # 40..120 px images
    cat = prestage.Catalog.from_folder(root)
    size = (24, 24)
    exact, scaled = [], []
    for epoch in range(2):
        with prestage.Loader(cat, batch_size=5, image_size=size, transform="random-resized-crop",
                             seed=4) as loader:
            loader.set_epoch(epoch)
            for idx, data, _ in all_batches(loader):
                for k, i in enumerate(idx):
                    path = cat.source_path(int(i))
                    with Image.open(path) as im:
                        w, h = im.size
                    box = prestage.transforms.random_resized_crop_params(4, epoch, int(i), h, w)
                    diff = np.abs(data[k].astype(int) - pil_resized_crop(path, box, size).astype(int))
                    (exact if box[2] < 2 * size[0] or box[3] < 2 * size[1] else scaled).append(diff)
    assert exact and scaled
    # Without DCT scaling, decoding only the crop's rows and columns (plus a margin for the chroma
    # upsampling) gives a full decode's pixels, and the resampler is Pillow's: equal.
    assert max(d.max() for d in exact) == 0
    # DCT scaling (decode at 1/2, 1/4, 1/8) is sharper than Pillow's filter: close, not equal.
    assert max(d.mean() for d in scaled) < 4.0


def test_random_resized_crop_is_reproducible_and_thread_count_independent(make_folder):
    cat = prestage.Catalog.from_folder(make_folder(2, 10, size=(60, 80)))
    runs = []
    for readers in (1, 2, 4):
        with prestage.Loader(cat, batch_size=4, image_size=(16, 16), transform="random-resized-crop",
                             readers=readers, seed=3) as loader:
            runs.append(by_index(loader))
    for other in runs[1:]:
        for i in runs[0]:
            np.testing.assert_array_equal(runs[0][i], other[i])
    with prestage.Loader(cat, batch_size=4, image_size=(16, 16), transform="random-resized-crop",
                         seed=3) as loader:
        loader.set_epoch(1)
        later = by_index(loader)
    assert any(not np.array_equal(later[i], runs[0][i]) for i in later)


@pytest.mark.parametrize("transform", ["center-crop", "random-resized-crop"])
def test_float32_nchw_is_the_normalised_uint8(make_folder, transform):
    cat = prestage.Catalog.from_folder(make_folder(2, 4, size=None))
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    common = dict(batch_size=3, image_size=(20, 28), transform=transform, seed=8)
    with prestage.Loader(cat, **common) as loader:
        u8 = by_index(loader)
    with prestage.Loader(cat, layout="NCHW", dtype="float32", mean=mean, std=std, **common) as loader:
        for b in loader:
            assert b.images.dtype == np.float32 and b.images.shape == (len(b), 3, 20, 28)
            for k, i in enumerate(b.indices):
                expected = (u8[int(i)].astype(np.float64) / 255 - mean) / std
                np.testing.assert_allclose(b.images[k], expected.transpose(2, 0, 1), rtol=1e-5, atol=1e-5)
    with prestage.Loader(cat, layout="NCHW", **common) as loader:
        for i, a in by_index(loader).items():
            np.testing.assert_array_equal(a, u8[i].transpose(2, 0, 1))


@pytest.mark.parametrize("mode", ["L", "CMYK", "progressive"])
def test_greyscale_cmyk_and_progressive_jpegs_come_out_as_rgb(tmp_path, mode):
    rng = np.random.default_rng(9)
    (tmp_path / "c").mkdir()
    for i in range(4):
        rgb = Image.fromarray(rng.integers(0, 255, size=(6, 8, 3), dtype=np.uint8)).resize((64, 48), Image.BICUBIC)
        path = tmp_path / "c" / f"{i}.jpg"
        if mode == "progressive":
            rgb.save(path, quality=90, progressive=True)
        else:
            rgb.convert(mode).save(path, quality=90)
    cat = prestage.Catalog.from_folder(tmp_path)
    with prestage.Loader(cat, batch_size=4) as loader:
        for i, a in by_index(loader).items():
            with Image.open(cat.source_path(i)) as im:
                np.testing.assert_array_equal(a, np.asarray(im.convert("RGB")))
    with prestage.Loader(cat, batch_size=4, image_size=(16, 16), transform="random-resized-crop") as loader:
        for i, a in by_index(loader).items():
            box = prestage.transforms.random_resized_crop_params(0, 0, i, 48, 64)
            diff = np.abs(a.astype(int) - pil_resized_crop(cat.source_path(i), box, (16, 16)).astype(int))
            assert diff.mean() < 4.0


# -------------------------------------------------------------------------------------------- bad input


def test_every_bad_input_is_a_decode_error_naming_its_file(tmp_path, encode_jpeg, write_tfrecord):
    rng = np.random.default_rng(10)
    good = encode_jpeg(rng.integers(0, 255, size=(64, 96, 3), dtype=np.uint8), quality=90)
    jpeg_dir = tmp_path / "jpeg" / "c"
    jpeg_dir.mkdir(parents=True)
    bad_jpegs = {}
    bad_jpegs["truncated.jpg"] = good[: len(good) // 2]
    corrupt = bytearray(good)
    sos = corrupt.index(b"\xff\xda")
    for k in range(sos + 20, len(corrupt) - 2):
        corrupt[k] ^= 0xFF
    bad_jpegs["corrupt.jpg"] = bytes(corrupt)
    bomb = bytearray(good)
    sof = bomb.index(b"\xff\xc0")
    bomb[sof + 5:sof + 9] = (60000).to_bytes(2, "big") * 2  # height, width
    bad_jpegs["bomb_60000x60000.jpg"] = bytes(bomb)
    bad_jpegs["not_a_jpeg.jpg"] = b"\x89PNG\r\n\x1a\n" + bytes(100)
    for name, data in bad_jpegs.items():
        (jpeg_dir / name).write_bytes(data)

    arrays = tmp_path / "arrays" / "c"
    arrays.mkdir(parents=True)
    np.save(arrays / "liar.npy", np.zeros((10, 10), np.float32))
    liar = (arrays / "liar.npy").read_bytes().replace(b"(10, 10)", b"(99, 10)")
    (arrays / "liar.npy").write_bytes(liar)
    np.save(arrays / "frame.npy", np.arange(1000.0))
    frame = bytearray(zstandard.ZstdCompressor().compress((arrays / "frame.npy").read_bytes()))
    (arrays / "frame.npy").unlink()
    frame[len(frame) // 2:] = bytes(len(frame) - len(frame) // 2)  # zeroed second half
    (arrays / "corrupt.npy.zst").write_bytes(bytes(frame))

    example = {"image": good, "label": 1}
    crc = write_tfrecord(tmp_path / "bad_crc.tfrecord", [example, example])
    data = bytearray(crc.read_bytes())
    data[40] ^= 0x01  # inside the first record's data
    crc.write_bytes(bytes(data))
    cut = write_tfrecord(tmp_path / "truncated.tfrecord", [example, example])
    cut.write_bytes(cut.read_bytes()[:-30])
    with h5py.File(tmp_path / "strings.h5", "w") as h5:
        h5["names"] = np.array([b"a", b"b"], dtype="S4")

    failures = {}

    def expect(path, call):
        with pytest.raises(prestage.DecodeError) as info:
            call()
        assert info.value.path == str(path) and str(path) in str(info.value)
        failures[path.name] = info.value.reason

    for name in bad_jpegs:
        for transform in ("center-crop", "random-resized-crop"):
            cat = prestage.Catalog.from_paths(tmp_path / "jpeg", [f"c/{name}"])
            loader = prestage.Loader(cat, batch_size=1, image_size=(32, 32), transform=transform)
            expect(jpeg_dir / name, lambda: next(iter(loader)))
            loader.close()
    for name, mode in (("liar.npy", "npy"), ("corrupt.npy.zst", "npy")):
        cat = prestage.Catalog.from_paths(tmp_path / "arrays", [f"c/{name}"])
        with prestage.Loader(cat, batch_size=1, decode=mode) as loader:
            expect(arrays / name, lambda: next(iter(loader)))
    expect(crc, lambda: prestage.Catalog.from_tfrecord([crc], features={"image": "image"}))
    expect(cut, lambda: prestage.Catalog.from_tfrecord([cut], features={"image": "image"}))
    expect(tmp_path / "strings.h5",
           lambda: prestage.Catalog.from_hdf5([tmp_path / "strings.h5"], "names"))
    assert len(failures) == 9, failures


def test_a_record_corrupted_after_indexing_is_a_decode_error(tmp_path, encode_jpeg, write_tfrecord):
    good = encode_jpeg(np.full((8, 8, 3), 100, np.uint8))
    path = write_tfrecord(tmp_path / "r.tfrecord", [{"image": good}] * 3)
    cat = prestage.Catalog.from_tfrecord([path], features={"image": "image"})
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10  # inside the second record
    path.write_bytes(bytes(data))
    with prestage.Loader(cat, batch_size=1, shuffle=False) as loader:
        it = iter(loader)
        next(it)
        with pytest.raises(prestage.DecodeError, match="CRC") as info:
            next(it)
        assert info.value.path == str(path)
        assert len(next(it)) == 1  # the loader goes on
