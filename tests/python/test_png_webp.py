"""PNG and WebP images beside JPEG (decode="image"): each codec chosen by the bytes' signature, the
pixels equal to Pillow's (the oracle: Image.open(...).convert("RGB")), the resize and crops equal to
Pillow's on those pixels, and hostile files refused with an error naming the file, or skipped."""

import io
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import prestage


def pil_rgb(path):
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_16bit(array: np.ndarray) -> bytes:
    """A 16-bit PNG of `array` (h x w grey or h x w x 3 RGB, uint16), written by hand: Pillow writes
    16-bit grey only."""
    h, w = array.shape[:2]
    colour = 0 if array.ndim == 2 else 2
    rows = array.astype(">u2").reshape(h, -1).tobytes()
    stride = len(rows) // h
    raw = b"".join(b"\0" + rows[y * stride:(y + 1) * stride] for y in range(h))
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, colour, 0, 0, 0))
            + png_chunk(b"IDAT", zlib.compress(raw)) + png_chunk(b"IEND", b""))


def encoded(image: Image.Image, fmt: str, **args) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **args)
    return out.getvalue()


def photo(rng, h, w):
    small = rng.random((max(2, h // 8), max(2, w // 8), 3))
    img = np.asarray(Image.fromarray((small * 255).astype(np.uint8)).resize((w, h), Image.BICUBIC),
                     dtype=np.float64)
    yy, xx = np.mgrid[0:h, 0:w]
    img[..., 0] += 40 * np.sin(xx / 7.0)
    img[..., 1] += 40 * np.cos(yy / 5.0)
    return np.clip(img, 0, 255).astype(np.uint8)


# Each kind of file: its bytes from an RGB array, and the extension it is saved under (a wrong one
# on purpose for some: the codec is chosen by signature).
KINDS = {
    "jpeg": (lambda a: encoded(Image.fromarray(a), "JPEG", quality=90), ".jpg"),
    "png_rgb": (lambda a: encoded(Image.fromarray(a), "PNG"), ".png"),
    "png_grey": (lambda a: encoded(Image.fromarray(a).convert("L"), "PNG"), ".png"),
    "png_grey_2bit": (lambda a: encoded(Image.fromarray(a).convert("L").point(lambda v: v & 0xC0)
                                        .convert("P", palette=Image.Palette.ADAPTIVE, colors=4),
                                        "PNG", bits=2), ".png"),
    "png_palette": (lambda a: encoded(Image.fromarray(a).convert("P", palette=Image.Palette.ADAPTIVE,
                                                                 colors=64), "PNG"), ".png"),
    "png_palette_trns": (lambda a: encoded(Image.fromarray(a).convert(
        "P", palette=Image.Palette.ADAPTIVE, colors=16), "PNG", transparency=3), ".png"),
    "png_rgba": (lambda a: encoded(Image.fromarray(np.dstack([a, a[..., 0]])), "PNG"), ".png"),
    "png_grey_alpha": (lambda a: encoded(Image.fromarray(np.dstack([a[..., 1], a[..., 2]]), "LA"),
                                         "PNG"), ".png"),
    "png_rgb_16": (lambda a: png_16bit(a.astype(np.uint16) * 257 + 100), ".png"),
    "png_optimized": (lambda a: encoded(Image.fromarray(a), "PNG", optimize=True), ".jpg"),
    "webp_lossless": (lambda a: encoded(Image.fromarray(a), "WEBP", lossless=True), ".webp"),
    "webp_lossy": (lambda a: encoded(Image.fromarray(a), "WEBP", quality=80), ".webp"),
    "webp_lossy_alpha": (lambda a: encoded(Image.fromarray(np.dstack([a, a[..., 2]])), "WEBP",
                                           quality=70), ".png"),
    "webp_lossless_alpha": (lambda a: encoded(Image.fromarray(np.dstack([a, a[..., 0]])), "WEBP",
                                              lossless=True, exact=True), ".webp"),
}


def write_set(root: Path, kinds, size=(32, 48), per_kind=2, seed=0):
    """An ImageFolder with one class per kind; returns {file name: kind}."""
    rng = np.random.default_rng(seed)
    names = {}
    for kind in kinds:
        make, ext = KINDS[kind]
        (root / kind).mkdir(parents=True)
        for i in range(per_kind):
            h, w = size if size else (int(rng.integers(30, 90)), int(rng.integers(30, 90)))
            path = root / kind / f"{i}{ext}"
            path.write_bytes(make(photo(rng, h, w)))
            names[str(path)] = kind
    return names


def oracle(path):
    """The pixels the loader must give: Pillow's convert("RGB"), but for 16-bit grey, which Pillow
    opens as I;16 and clips when converting: the high byte, replicated."""
    with Image.open(path) as im:
        if im.mode in ("I;16", "I;16B", "I"):
            high = (np.asarray(im).astype(np.uint32) >> 8).astype(np.uint8)
            return np.repeat(high[..., None], 3, axis=2)
        return np.asarray(im.convert("RGB"))


def batches(loader):
    for b in loader:
        yield b.indices.copy(), b.images.copy()


def test_every_kind_decodes_to_pillows_pixels(tmp_path):
    names = write_set(tmp_path / "set", KINDS)
    cat = prestage.Catalog.from_folder(tmp_path / "set", extensions=[])
    seen = set()
    with prestage.Loader(cat, batch_size=5, decode="image", readers=2) as loader:
        for idx, img in batches(loader):
            for k, i in enumerate(idx):
                path = str(cat.source_path(int(i)))
                np.testing.assert_array_equal(img[k], oracle(path), err_msg=names[path])
                seen.add(names[path])
    assert seen == set(KINDS)


def test_sixteen_bit_grey_keeps_the_high_byte(tmp_path):
    grey = (np.arange(24 * 40, dtype=np.uint32).reshape(24, 40) * 67 % 65536).astype(np.uint16)
    (tmp_path / "set" / "a").mkdir(parents=True)
    (tmp_path / "set" / "a" / "g.png").write_bytes(png_16bit(grey))
    cat = prestage.Catalog.from_folder(tmp_path / "set", extensions=[])
    with prestage.Loader(cat, batch_size=1, decode="image") as loader:
        (img,) = [b.images.copy() for b in loader]
    np.testing.assert_array_equal(img[0], np.repeat((grey >> 8).astype(np.uint8)[..., None], 3, 2))


def pil_resize_center_crop(path, height, width):
    img = Image.fromarray(oracle(path))
    w, h = img.size
    if height * w >= width * h:
        rh, rw = height, max(width, height * w // h)
    else:
        rh, rw = max(height, width * h // w), width
    img = img.resize((rw, rh), Image.BILINEAR)
    top, left = int(round((rh - height) / 2.0)), int(round((rw - width) / 2.0))
    return np.asarray(img.crop((left, top, left + width, top + height)))


def pil_resized_crop(path, box, size):
    top, left, h, w, flip = box
    img = Image.fromarray(oracle(path)).crop((left, top, left + w, top + h))
    img = img.resize((size[1], size[0]), Image.BILINEAR)
    if flip:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(img)


OTHERS = [k for k in KINDS if k != "jpeg"]


@pytest.mark.parametrize("size", [(24, 24), (16, 40), (50, 30)])
def test_resize_and_center_crop_equal_pillows(tmp_path, size):
    names = write_set(tmp_path / "set", OTHERS, size=None)
    cat = prestage.Catalog.from_folder(tmp_path / "set", extensions=[])
    with prestage.Loader(cat, batch_size=4, decode="image", image_size=size) as loader:
        for idx, img in batches(loader):
            for k, i in enumerate(idx):
                path = str(cat.source_path(int(i)))
                # Within 1, as the JPEG path's full-scale decode: Pillow resizes the whole image,
                # then crops; the resampler here resamples the crop's box in one pass.
                diff = np.abs(img[k].astype(int) - pil_resize_center_crop(path, *size).astype(int))
                assert diff.max() <= 1, names[path]


def test_random_resized_crop_equals_pillow_on_the_same_box(tmp_path):
    names = write_set(tmp_path / "set", OTHERS, size=None, per_kind=3)
    cat = prestage.Catalog.from_folder(tmp_path / "set", extensions=[])
    size = (24, 20)
    for epoch in range(2):
        with prestage.Loader(cat, batch_size=5, decode="image", image_size=size,
                             transform="random-resized-crop", seed=4) as loader:
            loader.set_epoch(epoch)
            for idx, img in batches(loader):
                for k, i in enumerate(idx):
                    path = str(cat.source_path(int(i)))
                    h, w = oracle(path).shape[:2]
                    box = prestage.transforms.random_resized_crop_params(4, epoch, int(i), h, w)
                    np.testing.assert_array_equal(img[k], pil_resized_crop(path, box, size),
                                                  err_msg=names[path])


def test_a_png_of_a_jpegs_pixels_gives_the_jpeg_paths_batches(tmp_path):
    """The same pixels as JPEG (decode="jpeg") and as PNG (decode="image"): the same batches, for
    every transform, where the JPEG path decodes at full scale (boxes under twice the output)."""
    rng = np.random.default_rng(3)
    for sub in ("jpeg", "png"):
        (tmp_path / sub / "a").mkdir(parents=True)
    for i in range(6):
        jpeg = tmp_path / "jpeg" / "a" / f"{i}.jpg"
        jpeg.write_bytes(KINDS["jpeg"][0](photo(rng, 45, 61)))
        Image.fromarray(pil_rgb(jpeg)).save(tmp_path / "png" / "a" / f"{i}.png")
    for options in ({}, {"image_size": (32, 40)},
                    {"image_size": (30, 28), "transform": "random-resized-crop", "seed": 2},
                    {"image_size": (30, 28), "dtype": "float32", "layout": "NCHW",
                     "mean": (0.5, 0.4, 0.3), "std": (0.2, 0.25, 0.3)}):
        runs = []
        for sub, decode in (("jpeg", "jpeg"), ("png", "image")):
            cat = prestage.Catalog.from_folder(tmp_path / sub, extensions=[])
            with prestage.Loader(cat, batch_size=4, decode=decode, **{"seed": 5, **options}) as loader:
                runs.append(list(batches(loader)))
        for (ia, a), (ib, b) in zip(*runs):
            np.testing.assert_array_equal(ia, ib)
            np.testing.assert_array_equal(a, b, err_msg=str(options))


def test_decode_jpeg_refuses_png_and_webp_naming_the_file(tmp_path):
    write_set(tmp_path / "set", ["jpeg", "png_rgb", "webp_lossless"], per_kind=1)
    cat = prestage.Catalog.from_folder(tmp_path / "set", extensions=[])
    others = {str(cat.source_path(i)) for i in range(len(cat)) if "jpeg" not in str(cat.source_path(i))}
    with prestage.Loader(cat, batch_size=1, shuffle=False) as loader:  # decode="jpeg", the default
        failed = set()
        it = iter(loader)
        for _ in range(len(cat)):
            try:
                next(it)
            except prestage.DecodeError as e:
                failed.update(p for p in others if p in str(e))
                assert "decode=image" in str(e)
    assert failed == others
    with prestage.Loader(cat, batch_size=1, decode="image") as loader:
        assert sum(len(b.indices) for b in loader) == 3


# ------------------------------------------------------------------------------------ hostile files


def good_png(rng):
    return KINDS["png_rgb"][0](photo(rng, 32, 48))


def truncated_png(rng):
    data = good_png(rng)
    return data[:len(data) * 2 // 3]


def png_without_iend(rng):
    return good_png(rng)[:-12]


def png_bad_idat_crc(rng):
    data = bytearray(good_png(rng))
    at = data.index(b"IDAT")
    length = struct.unpack(">I", data[at - 4:at])[0]
    data[at + 4 + length] ^= 1
    return bytes(data)


def png_bad_pixel_data(rng):
    """Damaged zlib data whose chunk CRC is correct (recomputed): zlib or Adler-32 must catch it."""
    data = bytearray(good_png(rng))
    at = data.index(b"IDAT")
    length = struct.unpack(">I", data[at - 4:at])[0]
    body = bytearray(data[at + 4:at + 4 + length])
    body[len(body) // 2] ^= 0xFF
    return bytes(data[:at - 4]) + png_chunk(b"IDAT", bytes(body)) + bytes(data[at + 8 + length:])


def png_huge(rng):
    """A valid header (CRC correct) declaring 50000 x 50000 pixels, and little data."""
    data = good_png(rng)
    ihdr = struct.pack(">IIBBBBB", 50000, 50000, 8, 2, 0, 0, 0)
    return data[:8] + png_chunk(b"IHDR", ihdr) + data[33:]


def truncated_webp(rng):
    data = KINDS["webp_lossy"][0](photo(rng, 32, 48))
    return data[:len(data) // 2]


def truncated_lossless_webp(rng):
    data = KINDS["webp_lossless"][0](photo(rng, 32, 48))
    return data[:len(data) - 10]


def webp_huge(rng):
    """A lossless WebP whose header declares 16384 x 16384 pixels (VP8L's largest)."""
    data = bytearray(KINDS["webp_lossless"][0](photo(rng, 32, 48)))
    at = data.index(b"VP8L") + 8  # the signature byte 0x2f, then 14 bits width - 1, height - 1
    bits = int.from_bytes(data[at + 1:at + 5], "little")
    bits = (bits & ~((1 << 28) - 1)) | (16383 << 14) | 16383
    data[at + 1:at + 5] = bits.to_bytes(4, "little")
    return bytes(data)


def gif(rng):
    return encoded(Image.fromarray(photo(rng, 32, 48)), "GIF")


HOSTILE = [truncated_png, png_without_iend, png_bad_idat_crc, png_bad_pixel_data, png_huge,
           truncated_webp, truncated_lossless_webp, webp_huge, gif]


@pytest.mark.parametrize("make_bad", HOSTILE, ids=lambda f: f.__name__)
def test_a_hostile_image_raises_naming_it_or_is_skipped(tmp_path, make_bad):
    rng = np.random.default_rng(7)
    root = tmp_path / "set" / "a"
    root.mkdir(parents=True)
    for i in range(7):
        (root / f"{i}.png").write_bytes(good_png(rng))
    bad = root / "bad.img"
    bad.write_bytes(make_bad(rng))
    cat = prestage.Catalog.from_folder(tmp_path / "set", extensions=[])
    bad_index = [i for i in range(len(cat)) if cat.source_path(i).name == "bad.img"]
    for options in ({}, {"image_size": (20, 20)},
                    {"image_size": (20, 20), "transform": "random-resized-crop"}):
        with prestage.Loader(cat, batch_size=4, decode="image", shuffle=False, **options) as loader:
            with pytest.raises(prestage.DecodeError, match="bad.img"):
                for _ in loader:
                    pass
        with prestage.Loader(cat, batch_size=4, decode="image", on_error="skip", **options) as loader:
            delivered = [int(i) for b in loader for i in b.indices]
            stats = loader.stats()
        assert sorted(set(delivered)) == [i for i in range(len(cat)) if i not in bad_index]
        assert stats["skipped"] == 1
        assert "bad.img" in stats["skipped_samples"][0]["error"]


def test_pillow_refuses_the_same_hostile_images_but_two_the_loader_is_stricter_about():
    """The oracle agrees that each hostile file is damaged or past its own pixel limit, but for a
    PNG whose image data fails its CRC and one cut before its IEND chunk, which Pillow decodes (it
    does not check the image data's CRC, and stops at the data's end) and the loader refuses (libpng
    checks every critical chunk's CRC; a file must be whole, as a JPEG must end with its EOI)."""
    rng = np.random.default_rng(7)
    accepted = set()
    for make_bad in HOSTILE:
        if make_bad is gif:
            continue
        try:
            with Image.open(io.BytesIO(make_bad(rng))) as im:
                im.load()
            accepted.add(make_bad.__name__)
        except (OSError, Image.DecompressionBombError):
            pass
    assert accepted == {"png_without_iend", "png_bad_idat_crc"}


def test_mixed_formats_give_the_same_batches_for_1_2_and_4_readers(tmp_path):
    write_set(tmp_path / "set", KINDS, size=None, per_kind=1)
    cat = prestage.Catalog.from_folder(tmp_path / "set", extensions=[])
    runs = []
    for readers in (1, 2, 4):
        with prestage.Loader(cat, batch_size=6, decode="image", image_size=(20, 24), seed=8,
                             transform="random-resized-crop", readers=readers,
                             prefetchers=readers) as loader:
            runs.append([(i.tolist(), img) for i, img in batches(loader)])
    for other in runs[1:]:
        assert [i for i, _ in other] == [i for i, _ in runs[0]]
        for (_, a), (_, b) in zip(other, runs[0]):
            np.testing.assert_array_equal(a, b)


def test_decode_image_is_refused_on_the_gpu_path(tmp_path):
    write_set(tmp_path / "set", ["png_rgb"], per_kind=1)
    cat = prestage.Catalog.from_folder(tmp_path / "set", extensions=[])
    with pytest.raises(prestage.ConfigError, match="JPEG"):
        prestage.Loader(cat, batch_size=1, decode="image", image_size=(8, 8), decode_device="cuda")


@pytest.mark.tf
def test_tf_dataset_takes_png_and_webp(tmp_path):
    """Not resized: the signature's size comes from the first image, decoded as the loader decodes."""
    import prestage.tf

    write_set(tmp_path / "set", ["png_rgb", "webp_lossy", "png_palette"], per_kind=2)
    cat = prestage.Catalog.from_folder(tmp_path / "set", extensions=[])
    ds = prestage.tf.dataset(cat, batch_size=3, decode="image", shuffle=False)
    images = np.concatenate([x.numpy() for x, _ in ds])
    expected = np.stack([oracle(cat.source_path(i)) for i in range(len(cat))])
    np.testing.assert_array_equal(images, expected)
    ds.loader.close()


@pytest.mark.torch
def test_torch_loader_takes_png_and_webp(tmp_path):
    import prestage.torch

    write_set(tmp_path / "set", ["png_rgba", "webp_lossless"], per_kind=2)
    cat = prestage.Catalog.from_folder(tmp_path / "set", extensions=[])
    with prestage.torch.Loader(cat, batch_size=2, decode="image", shuffle=False) as loader:
        images = np.concatenate([x.numpy().transpose(0, 2, 3, 1) for x, _ in loader])  # NCHW
    expected = np.stack([oracle(cat.source_path(i)) for i in range(len(cat))])
    np.testing.assert_array_equal(images, expected)
