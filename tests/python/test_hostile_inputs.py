"""Hostile inputs that used to get past a clean refusal: a damaged TFRecord shard (it made the whole
catalog unbuildable), a file that became shorter than its catalog says (reported as a bare EIO; a
whole file rewritten shorter or longer was served as it is now), and
symbolic links that lead out of the data set's root (followed, with no way to refuse them)."""

import errno
import io
import os

import numpy as np
import pytest
from PIL import Image

import prestage


def all_samples(loader):
    """{catalog index: raw bytes} of one epoch of a decode="raw" loader."""
    out = {}
    for batch in loader:
        for k, i in enumerate(batch.indices):
            out[int(i)] = bytes(batch.data[batch.offsets[k]:batch.offsets[k + 1]])
    return out


# ---------------------------------------------------------------------------------- damaged TFRecord


def write_shard_with_tensorflow(path, labels):
    """A TFRecord shard written by TensorFlow's own writer; returns each record's byte offset and
    its serialized Example (the oracle for what a good record holds)."""
    import tensorflow as tf

    offsets, payloads = [], []
    with tf.io.TFRecordWriter(str(path)) as writer:
        for label in labels:
            data = f"sample {label}".encode()
            example = tf.train.Example(features=tf.train.Features(feature={
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            }))
            payload = example.SerializeToString()
            offsets.append(sum(len(p) + 16 for p in payloads))
            payloads.append(payload)
            writer.write(payload)
    return offsets, payloads


def flip(path, at):
    data = bytearray(path.read_bytes())
    data[at] ^= 0x40
    path.write_bytes(bytes(data))


def records_tensorflow_reads(path):
    """How many records TensorFlow reads from `path` before it reports damage, and whether it did."""
    import tensorflow as tf

    count = 0
    try:
        for _ in tf.data.TFRecordDataset(str(path)):
            count += 1
    except tf.errors.DataLossError:
        return count, True
    return count, False


@pytest.mark.tf
def test_a_damaged_shard_raises_by_default_and_skip_keeps_every_good_record(tmp_path):
    good = tmp_path / "a.tfrecord"
    bad_data = tmp_path / "b.tfrecord"
    bad_length = tmp_path / "c.tfrecord"
    write_shard_with_tensorflow(good, [0, 1, 2])
    data_offsets, _ = write_shard_with_tensorflow(bad_data, [10, 11, 12, 13, 14])
    length_offsets, _ = write_shard_with_tensorflow(bad_length, [20, 21, 22, 23])
    flip(bad_data, data_offsets[2] + 12 + 5)  # record 2's data: its length is intact
    flip(bad_length, length_offsets[1] + 2)  # record 1's length: nothing after it can be located
    # TensorFlow's reader agrees that both shards are damaged, where.
    assert records_tensorflow_reads(bad_data) == (2, True)
    assert records_tensorflow_reads(bad_length) == (1, True)
    assert records_tensorflow_reads(good) == (3, False)

    shards = [good, bad_data, bad_length]
    features = {"image": "image", "label": "label"}
    with pytest.raises(prestage.DecodeError) as info:
        prestage.Catalog.from_tfrecord(shards, features=features)
    assert info.value.path == str(bad_data)

    with pytest.warns(RuntimeWarning, match="2 damaged records in 2 files"):
        cat = prestage.Catalog.from_tfrecord(shards, features=features, on_error="skip")
    expected = [0, 1, 2, 10, 11, 13, 14, 20]
    assert [cat.label(i) for i in range(len(cat))] == expected
    assert [(d["path"], d["offset"], d["rest_of_file"]) for d in cat.damage] == [
        (str(bad_data), data_offsets[2], False),
        (str(bad_length), length_offsets[1], True),
    ]
    assert all("CRC" in d["reason"] for d in cat.damage)

    cat.save(tmp_path / "cat.bin")
    back = prestage.Catalog.load(tmp_path / "cat.bin")  # no warning: reported when it was built
    assert back.damage == cat.damage
    with prestage.Loader(back, batch_size=3, decode="raw", shuffle=False) as loader:
        got = all_samples(loader)
    assert [got[i] for i in range(len(expected))] == [f"sample {v}".encode() for v in expected]


def test_on_error_of_from_tfrecord_takes_raise_or_skip(tmp_path, write_tfrecord):
    path = write_tfrecord(tmp_path / "a.tfrecord", [{"image": b"x"}])
    with pytest.raises(prestage.ConfigError):
        prestage.Catalog.from_tfrecord([path], features={"image": "image"}, on_error="ignore")
    assert prestage.Catalog.from_tfrecord([path], features={"image": "image"}).damage == []


def test_a_shard_with_no_usable_record_is_an_error_even_with_skip(tmp_path, write_tfrecord):
    path = write_tfrecord(tmp_path / "a.tfrecord", [{"image": b"x"}, {"image": b"y"}])
    flip(path, 2)  # the first record's length
    with pytest.raises(prestage.ConfigError, match="no usable record"):
        prestage.Catalog.from_tfrecord([path], features={"image": "image"}, on_error="skip")


# --------------------------------------------------------------------------------------- short files


def test_a_file_shorter_than_its_catalog_says_is_an_io_error_saying_so(tmp_path, write_tfrecord):
    path = write_tfrecord(tmp_path / "a.tfrecord", [{"image": bytes(50)}, {"image": bytes(50)}])
    cat = prestage.Catalog.from_tfrecord([path], features={"image": "image"})
    size = path.stat().st_size
    os.truncate(path, size - 30)  # the second record loses its end
    with prestage.Loader(cat, batch_size=1, decode="raw", shuffle=False) as loader:
        it = iter(loader)
        assert len(next(it)) == 1
        with pytest.raises(prestage.IoError) as info:
            next(it)
    assert info.value.errno == errno.EIO and info.value.filename == str(path)
    assert f"is {size - 30} bytes, the catalog expected at least {size}" in str(info.value)
    # The message says what happened (the Python OSError carries errno and filename; the C++ message
    # is what on_error="skip" records).
    with prestage.Loader(cat, batch_size=2, decode="raw", shuffle=False, on_error="skip") as loader:
        list(loader)
        skipped = loader.stats()["skipped_samples"]
    assert len(skipped) == 1 and skipped[0]["path"] == str(path)
    assert f"is {size - 30} bytes, the catalog expected at least {size}" in skipped[0]["error"]
    assert "changed since the catalog was built" in skipped[0]["error"]


def rewrite_jpeg(path, size):
    Image.fromarray(np.full((size, size, 3), 90, np.uint8)).save(path, quality=90)


@pytest.mark.parametrize("kind", ["raw", "jpeg", "jpeg-resized"])
@pytest.mark.parametrize("when", ["before the first epoch", "between epochs"])
@pytest.mark.parametrize("change", ["shorter", "longer"])
def test_a_file_that_changed_size_since_its_catalog_is_an_io_error_naming_both_sizes(
        tmp_path, kind, when, change):
    # Whole files (raw and JPEG), read directly (no stage directory): the file's size now was used,
    # so a file rewritten shorter (or longer) was served as it is now, with no error.
    root = tmp_path / "data"
    root.mkdir()
    names = [f"{i}.bin" if kind == "raw" else f"{i}.jpg" for i in range(4)]
    for name in names:
        if kind == "raw":
            (root / name).write_bytes(bytes(1000))
        else:
            rewrite_jpeg(root / name, 64)
    cat = prestage.Catalog.from_folder(root, extensions=[".bin" if kind == "raw" else ".jpg"])
    recorded = (root / names[1]).stat().st_size
    options = {"decode": "raw"} if kind == "raw" else {"image_size": (32, 32)} if kind == "jpeg-resized" else {}

    def rewrite():
        if kind == "raw":
            (root / names[1]).write_bytes(bytes(10 if change == "shorter" else 2000))
        else:
            rewrite_jpeg(root / names[1], 16 if change == "shorter" else 256)
        return (root / names[1]).stat().st_size

    with prestage.Loader(cat, batch_size=4, shuffle=False, depth=2, **options) as loader:
        if when == "between epochs":
            assert len(next(iter(loader))) == 4  # the one batch of epoch 0
            # An epoch past the next, which the pipeline may have read already (and would keep):
            # it starts again, and reads the file as it is now.
            loader.set_epoch(10)
        now = rewrite()
        assert (now < recorded) == (change == "shorter")
        with pytest.raises(prestage.IoError) as info:
            next(iter(loader))
    assert info.value.errno == errno.EIO and info.value.filename == str(root / names[1])
    assert f"is {now} bytes, its catalog says {recorded}" in str(info.value)
    assert "changed since the catalog was built" in str(info.value)


# ----------------------------------------------------------------------------------- symbolic links


def decoded(path):
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def test_links_out_of_the_root_are_followed_by_default_and_refused_with_symlinks_inside(
        make_folder, tmp_path):
    root = make_folder(2, 2, size=(16, 16))
    outside = make_folder(1, 1, size=(16, 16), name="outside") / "class_0" / "img_000.jpg"
    inside_target = root / "class_0" / "img_000.jpg"
    os.symlink(outside, root / "class_1" / "zz_out.jpg")
    os.symlink("../class_0/img_000.jpg", root / "class_1" / "zz_in.jpg")

    # The default, as torchvision's ImageFolder: the link is followed, what it leads to is served.
    cat = prestage.Catalog.from_folder(root)
    assert cat.symlinks == "follow"
    index = {cat.path(i): i for i in range(len(cat))}
    with prestage.Loader(cat, batch_size=3, shuffle=False) as loader:
        images = np.concatenate([b.images.copy() for b in loader])
    np.testing.assert_array_equal(images[index["class_1/zz_out.jpg"]], decoded(outside))

    with pytest.raises(prestage.IoError) as info:
        prestage.Catalog.from_folder(root, symlinks="inside")
    assert info.value.errno == errno.EXDEV
    assert info.value.filename == str(root / "class_1" / "zz_out.jpg")

    # A link that stays inside the root is served with the option, and the option is saved.
    os.unlink(root / "class_1" / "zz_out.jpg")
    cat = prestage.Catalog.from_folder(root, symlinks="inside")
    cat.save(tmp_path / "cat.bin")
    cat = prestage.Catalog.load(tmp_path / "cat.bin")
    assert cat.symlinks == "inside"
    index = {cat.path(i): i for i in range(len(cat))}
    with prestage.Loader(cat, batch_size=3, shuffle=False) as loader:
        images = np.concatenate([b.images.copy() for b in loader])
    np.testing.assert_array_equal(images[index["class_1/zz_in.jpg"]], decoded(inside_target))

    with pytest.raises(prestage.ConfigError):
        prestage.Catalog.from_folder(root, symlinks="never")


def test_a_listed_file_that_leads_out_of_the_root_is_refused_with_symlinks_inside(tmp_path):
    (tmp_path / "root").mkdir()
    (tmp_path / "secret").write_bytes(b"secret")
    (tmp_path / "root" / "a.bin").write_bytes(b"a")
    os.symlink(tmp_path / "secret", tmp_path / "root" / "b.bin")
    (tmp_path / "list.txt").write_text("a.bin,0\nb.bin,1\n")
    assert len(prestage.Catalog.from_list(tmp_path / "list.txt", tmp_path / "root")) == 2
    with pytest.raises(prestage.IoError) as info:
        prestage.Catalog.from_list(tmp_path / "list.txt", tmp_path / "root", symlinks="inside")
    assert info.value.errno == errno.EXDEV
    assert info.value.filename == str(tmp_path / "root" / "b.bin")


@pytest.mark.parametrize("staged", [False, True], ids=["direct", "staged"])
def test_a_link_planted_after_the_catalog_was_built_is_refused_at_its_batch(tmp_path, staged):
    (tmp_path / "root").mkdir()
    (tmp_path / "secret").write_bytes(b"secret")
    (tmp_path / "root" / "a.bin").write_bytes(b"a")
    cat = prestage.Catalog.from_paths(tmp_path / "root", ["a.bin", "b.bin"], symlinks="inside")
    os.symlink(tmp_path / "secret", tmp_path / "root" / "b.bin")
    # Staged, stage 2's copy and stage 3's fallback to the source both refuse it.
    stage_dir = tmp_path / "stage" if staged else None
    with prestage.Loader(cat, batch_size=1, decode="raw", shuffle=False,
                         stage_dir=stage_dir) as loader:
        it = iter(loader)
        assert bytes(next(it).data) == b"a"
        with pytest.raises(prestage.IoError) as info:
            next(it)
    assert info.value.errno == errno.EXDEV
    assert info.value.filename == str(tmp_path / "root" / "b.bin")
