"""An ImageNet-like synthetic JPEG data set, written as class folders: ``make_synthetic_set`` (the
library behind ``prestage synth``).

The layout is the one torchvision's ``ImageFolder`` and ``prestage.Catalog.from_folder`` read::

    OUT/class_000/img_000000.jpg        image i goes to class i % K
    OUT/class_001/img_000001.jpg
    ...
    OUT/SYNTH.json                      parameters, count and total bytes; written last

Content. Every image is cut from a real photograph: the sample photos that scikit-image ships inside its
wheel (``skimage/data``, found without importing scikit-image, which is slow). For image ``i``: take the
source photo of its class, a random crop (random position around a class-specific anchor, 25-100 % of the
photo's area, aspect ratio within +/-15 % of the output's), resize it to the drawn output size (Pillow,
Lanczos), apply the class colour transform and a mild per-image jitter (hue, saturation, contrast,
brightness), flip it horizontally with probability 1/2, add a luminance grain like a camera sensor's (std 9
to 15 levels; it gives upscaled crops the fine texture and the file size of camera photos), and encode it
with Pillow: baseline JPEG, 4:2:0 chroma subsampling, quality drawn uniformly in ``quality`` +/- 2 (88-92
by default). 3 % of the images are one-channel greyscale JPEGs, as in ImageNet; the others are RGB.

Labels are learnable. Class ``k`` always draws from the same source photo (``k mod S`` for the ``S`` = 14
photos), around the same region of it (an anchor that depends on ``k``), with the same hue rotation and
colour tint (a hue that depends on ``k`` only). So a small CNN has something to learn in an epoch or two,
and two sets generated with different seeds (train and validation, say) share the same class looks: a
nearest-centroid classifier on 8x8 thumbnails, fitted on a seed-0 set, labels a seed-1 set with 94 %
accuracy for 10 classes and 58 % for 100 classes (chance: 10 % and 1 %).

Sizes follow ImageNet's training set (typically 500x375 or 375x500; widths mostly 300-640 px with a long
tail):

- orientation: 75 % landscape, 20 % portrait, 5 % square;
- aspect ratio (long side / short side): 4:3 with p = 0.72, 3:2 with p = 0.15, uniform in [1.1, 2] otherwise;
- long side: exactly 500 px with p = 0.52 (the size of most ImageNet photos); log-normal with median
  330 px and sigma 0.22, clipped to [200, 499], with p = 0.42; a tail ``500 * exp(|N(0, 0.8)|)``, clipped to
  [501, 2500], with p = 0.06.

Over 100,000 draws: mean 438x368 px, median 449x375, 28 % exactly 500x375 and 8 % 375x500, 77 % of the
widths in 300-640 px, 2.3 % with a side above 1000 px, sides from 101 to 2500 px.

File size, measured on 5,000 images in 100 classes at the default quality: mean 99 KB (ImageNet: about
110 KB), median 81 KB, 5th-95th percentiles 25-148 KB; about 500 MB in all. The tail of large images
carries a good part of the bytes, as in ImageNet.

Determinism: image ``i`` is a pure function of ``(seed, i)`` (``numpy.random.default_rng((seed, i))``), so
the same seed gives the same bytes whatever the number of workers, as long as the scikit-image photos,
numpy and Pillow (and its libjpeg) are the same versions.

Interruption: each file is written under a temporary name (``.img_<i>.jpg.part``) and renamed, and
``SYNTH.json`` is written last, so an interrupted run leaves no truncated JPEG and no ``SYNTH.json``.
Running again into a folder whose ``SYNTH.json`` has the same parameters does nothing ("already there");
any other non-empty folder is refused unless ``overwrite`` is set, and even then only a folder that holds
nothing but an earlier set is cleared.
"""

from __future__ import annotations

import colorsys
import concurrent.futures
import dataclasses
import functools
import importlib.util
import io
import json
import math
import multiprocessing
import os
import re
import shutil
import signal
import time
from collections.abc import Sequence
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

#: What to install for ``prestage synth``, ``prestage demo`` without a source and the examples: the one
#: piece of advice every message about their missing dependencies gives (pyproject's ``synth`` extra).
INSTALL_SYNTH = "pip install 'prestage[synth]'"

try:
    from PIL import Image, ImageChops, ImageOps
except ModuleNotFoundError as _missing:
    raise ModuleNotFoundError(
        f"writing a synthetic set needs Pillow (PIL), which is not installed: {INSTALL_SYNTH}",
        name=_missing.name,
    ) from None

from prestage.cli.progress import progress as progress_bar

__all__ = ["INSTALL_SYNTH", "make_synthetic_set", "render_image"]

#: Bumped whenever a change of the recipe changes the bytes written for a given seed.
RECIPE_VERSION = 1

#: The file that marks a complete set; written last.
SUMMARY_NAME = "SYNTH.json"

#: Sample photos used as sources, in class order. Missing files are skipped, so the list may name photos
#: that some scikit-image version lacks. Left out: retina.jpg and cell.png (mostly smooth: the grain would
#: dominate), and the drawings, charts and text pages.
_SOURCES: tuple[str, ...] = (
    "astronaut.png",
    "chelsea.png",
    "coffee.png",
    "motorcycle_left.png",
    "rocket.jpg",
    "hubble_deep_field.jpg",
    "ihc.png",
    "camera.png",
    "coins.png",
    "grass.png",
    "brick.png",
    "gravel.png",
    "moon.png",
    # The other half of a stereo pair: last, so that it shares a look with another class only when there
    # are more classes than photos anyway.
    "motorcycle_right.png",
)
_MIN_SOURCES = 4

#: Fraction of images written as one-channel greyscale JPEGs.
GREYSCALE_FRACTION = 0.03

#: Largest side an image may have; the size distribution is clipped to it.
MAX_SIDE = 2500

#: Smallest long side; with aspect ratios up to 2, no side is under half of it.
MIN_LONG_SIDE = 200

_LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float64)
_GOLDEN = 0.6180339887498949
#: Standard normal quantiles at the centres of 256 equal-probability bins: a byte-to-Gaussian table.
_GAUSS_QUANTILES = tuple(NormalDist().inv_cdf((i + 0.5) / 256.0) for i in range(256))
_FILE_RE = re.compile(r"^\.?img_\d+\.jpg(\.part)?$")
_CLASS_RE = re.compile(r"^class_\d+$")


# ----------------------------------------------------------------------------------------------------------
# Sources


def _source_dir() -> Path:
    """Return scikit-image's ``data`` folder without importing scikit-image."""
    try:
        spec = importlib.util.find_spec("skimage")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "prestage synth cuts its images from the sample photos shipped with scikit-image, which is not "
            f"installed: {INSTALL_SYNTH}",
            name="skimage",
        )
    for location in spec.submodule_search_locations:
        data = Path(location) / "data"
        if data.is_dir():
            return data
    raise FileNotFoundError(
        "scikit-image is installed but its sample photos (skimage/data) were not found; reinstall it: "
        "pip install --force-reinstall scikit-image"
    )


@functools.lru_cache(maxsize=4)
def _load_sources(data_dir: str) -> tuple[Image.Image, ...]:
    """Decode the available sample photos once per process, as RGB or L images.

    Each photo's contrast is stretched (0.5 % of the pixels clipped at each end, tones kept), so that dim
    photos such as the moon still look like photographs once the grain is added.
    """
    sources = []
    for name in _SOURCES:
        path = Path(data_dir) / name
        if not path.is_file():
            continue
        with Image.open(path) as im:
            im.load()
            image = im.convert("L") if im.mode in ("L", "I", "I;16", "1") else im.convert("RGB")
        sources.append(ImageOps.autocontrast(image, cutoff=0.5, preserve_tone=True))
    if len(sources) < _MIN_SOURCES:
        raise FileNotFoundError(
            f"found only {len(sources)} of scikit-image's sample photos in {data_dir} "
            f"(need at least {_MIN_SOURCES}); reinstall it: pip install --force-reinstall scikit-image"
        )
    return tuple(sources)


def _available_source_names(data_dir: Path) -> list[str]:
    return [name for name in _SOURCES if (data_dir / name).is_file()]


# ----------------------------------------------------------------------------------------------------------
# The recipe of one image


def _draw_size(rng: np.random.Generator) -> tuple[int, int]:
    """Draw an output (width, height) from the ImageNet-like distribution of the module docstring."""
    u = rng.random()
    if u < 0.52:
        long_side = 500
    elif u < 0.94:
        long_side = int(np.clip(round(rng.lognormal(math.log(330.0), 0.22)), MIN_LONG_SIDE, 499))
    else:
        long_side = int(np.clip(round(500.0 * math.exp(abs(rng.normal(0.0, 0.8)))), 501, MAX_SIDE))
    orientation = rng.random()
    kind = rng.random()
    aspect_draw = rng.uniform(1.1, 2.0)
    if orientation < 0.05:
        return long_side, long_side
    aspect = 4.0 / 3.0 if kind < 0.72 else 1.5 if kind < 0.87 else aspect_draw
    short_side = max(1, round(long_side / aspect))
    return (long_side, short_side) if orientation < 0.80 else (short_side, long_side)


def _hue_rotation(angle: float) -> np.ndarray:
    """3x3 matrix rotating hue by ``angle`` radians about the grey axis (keeps grey grey)."""
    c, s = math.cos(angle), math.sin(angle)
    one_third, root = 1.0 / 3.0, math.sqrt(1.0 / 3.0)
    a = c + (1.0 - c) * one_third
    b = one_third * (1.0 - c) - root * s
    d = one_third * (1.0 - c) + root * s
    return np.array([[a, b, d], [d, a, b], [b, d, a]])


def _class_colour(k: int) -> tuple[np.ndarray, float]:
    """Class ``k``'s tint (an RGB colour with the luminance of white) and hue in [0, 1), from ``k`` only.

    Hues step by the golden ratio, so consecutive classes get well separated colours for any class count.
    """
    hue = (k * _GOLDEN) % 1.0
    tint = np.array(colorsys.hsv_to_rgb(hue, 0.6, 1.0))
    tint = tint / float(tint @ _LUMA)  # same luminance as white
    return tint, hue


def _class_anchor(k: int, n_sources: int) -> tuple[float, float]:
    """Where in its source photo class ``k`` crops around (fractions of width and height), from ``k`` only."""
    cycle = k // n_sources
    if cycle == 0:
        return 0.5, 0.5
    return 0.5 + 0.3 * math.cos(cycle * 2.399963), 0.5 + 0.3 * math.sin(cycle * 2.399963)


def _colour_matrix(k: int, greyscale_source: bool, rng: np.random.Generator) -> tuple[float, ...]:
    """Pillow ``convert`` matrix (12 floats): class hue rotation and tint, then the image's own jitter."""
    tint, hue = _class_colour(k)
    hue_jitter = rng.normal(0.0, 0.08)
    saturation = rng.uniform(0.8, 1.2)
    contrast = rng.uniform(0.85, 1.15)
    brightness = rng.uniform(0.88, 1.12)
    # Tint strength: a grey source gets its colour from the tint alone.
    strength = 0.55 if greyscale_source else 0.3
    rotate = _hue_rotation(2.0 * math.pi * (hue + hue_jitter))
    tint_m = (1.0 - strength) * np.eye(3) + strength * np.outer(tint, _LUMA)
    sat_m = saturation * np.eye(3) + (1.0 - saturation) * np.outer(np.ones(3), _LUMA)
    m = brightness * contrast * (sat_m @ tint_m @ rotate)
    offset = brightness * 128.0 * (1.0 - contrast)  # contrast pivots around mid-grey
    return tuple(float(x) for row in m for x in (*row, offset))


def _crop_box(
    src: Image.Image, out_w: int, out_h: int, anchor: tuple[float, float], rng: np.random.Generator
) -> tuple[float, float, float, float]:
    """A random crop of ``src`` near ``anchor``: 25-100 % of its area, aspect ratio near the output's."""
    sw, sh = src.size
    area = sw * sh * rng.uniform(0.25, 1.0)
    aspect = (out_w / out_h) * math.exp(rng.uniform(-0.15, 0.15))
    cw = min(math.sqrt(area * aspect), sw)
    ch = min(math.sqrt(area / aspect), sh)
    cx = sw * (anchor[0] + rng.normal(0.0, 0.12))
    cy = sh * (anchor[1] + rng.normal(0.0, 0.12))
    x0 = float(np.clip(cx - cw / 2.0, 0.0, sw - cw))
    y0 = float(np.clip(cy - ch / 2.0, 0.0, sh - ch))
    return x0, y0, x0 + cw, y0 + ch


def _grain_table(sigma: float) -> list[int]:
    """Lookup table turning a uniform byte into mid-grey plus Gaussian grain of std ``sigma``."""
    return [min(255, max(0, round(128.0 + q * sigma))) for q in _GAUSS_QUANTILES]


def render_image(index: int, classes: int, seed: int, quality: int, sources: Sequence[Image.Image]) -> bytes:
    """Return the JPEG bytes of image ``index``: a pure function of its arguments and of ``sources``."""
    rng = np.random.default_rng((seed, index))
    k = index % classes
    src = sources[k % len(sources)]
    width, height = _draw_size(rng)
    q = int(np.clip(quality + rng.integers(-2, 3), 1, 100))
    greyscale = bool(rng.random() < GREYSCALE_FRACTION)
    flip = bool(rng.random() < 0.5)
    grain = float(rng.uniform(9.0, 15.0))
    box = _crop_box(src, width, height, _class_anchor(k, len(sources)), rng)
    matrix = _colour_matrix(k, src.mode == "L", rng)
    noise = Image.frombytes("L", (width, height), rng.bytes(width * height)).point(_grain_table(grain))

    # Lanczos keeps upscaled crops about as crisp as a camera photo; a separate sharpening pass would cost
    # more than the resize itself.
    image = src.resize((width, height), Image.Resampling.LANCZOS, box=box)
    if image.mode == "L":
        image = image.convert("RGB")
    image = image.convert("RGB", matrix=matrix)
    if greyscale:
        image = image.convert("L")
    else:
        noise = noise.convert("RGB")  # the same grain on R, G and B: luminance grain, like a sensor's
    if flip:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    image = ImageChops.add(image, noise, scale=1.0, offset=-128)
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=q, subsampling=2, optimize=False, progressive=False)
    return out.getvalue()


# ----------------------------------------------------------------------------------------------------------
# Writing the set


@dataclasses.dataclass(frozen=True)
class _Job:
    """What every worker needs to render and write its images."""

    out: str
    images: int
    classes: int
    seed: int
    quality: int
    data_dir: str

    @property
    def class_width(self) -> int:
        return max(3, len(str(self.classes - 1)))

    @property
    def image_width(self) -> int:
        return max(6, len(str(self.images - 1)))

    def path(self, index: int) -> Path:
        k = index % self.classes
        return Path(self.out) / f"class_{k:0{self.class_width}d}" / f"img_{index:0{self.image_width}d}.jpg"


def _write_range(job: _Job, start: int, stop: int) -> tuple[int, int]:
    """Render and write images ``start..stop-1``; return (count, bytes). Each file appears atomically."""
    sources = _load_sources(job.data_dir)
    total = 0
    for index in range(start, stop):
        data = render_image(index, job.classes, job.seed, job.quality, sources)
        final = job.path(index)
        temp = final.with_name(f".{final.name}.part")
        with open(temp, "wb") as f:
            f.write(data)
        os.replace(temp, final)
        total += len(data)
    return stop - start, total


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return int(value)


def _parameters(images: int, classes: int, seed: int, quality: int) -> dict[str, int]:
    return {
        "images": images,
        "classes": classes,
        "seed": seed,
        "quality": quality,
        "recipe": RECIPE_VERSION,
    }


def _read_summary(out: Path) -> dict[str, Any] | None:
    try:
        with open(out / SUMMARY_NAME, encoding="utf-8") as f:
            summary = json.load(f)
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


def _clear_previous(out: Path) -> None:
    """Remove what an earlier synth run wrote in ``out``; refuse if anything else is there."""
    strangers: list[str] = []
    for entry in out.iterdir():
        if entry.name in (SUMMARY_NAME, f".{SUMMARY_NAME}.part") and entry.is_file():
            continue
        if _CLASS_RE.match(entry.name) and entry.is_dir() and not entry.is_symlink():
            strangers += [str(p) for p in entry.iterdir() if not (_FILE_RE.match(p.name) and p.is_file())]
            continue
        strangers.append(str(entry))
    if strangers:
        shown = ", ".join(sorted(strangers)[:3]) + (", ..." if len(strangers) > 3 else "")
        raise ValueError(
            f"{out} holds {len(strangers)} entries that prestage synth did not write ({shown}); "
            "refusing to overwrite it: remove them or choose another folder"
        )
    # The summary goes first, so that a set interrupted from here on is visibly incomplete.
    (out / SUMMARY_NAME).unlink(missing_ok=True)
    for entry in out.iterdir():
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _make(
    out: str | os.PathLike[str],
    images: int,
    classes: int,
    seed: int,
    quality: int,
    workers: int | None,
    progress: bool,
    overwrite: bool,
) -> tuple[dict[str, Any], bool]:
    """Implementation of :func:`make_synthetic_set`; also says whether the set was already there."""
    images = _check_int("images", images, 1)
    classes = _check_int("classes", classes, 1)
    seed = _check_int("seed", seed, 0)
    quality = _check_int("quality", quality, 1)
    if quality > 100:
        raise ValueError(f"quality must be at most 100, got {quality}")
    if classes > images:
        raise ValueError(f"classes ({classes}) must not exceed images ({images}): every class needs an image")
    if workers is None:
        workers = os.cpu_count() or 1
    workers = _check_int("workers", workers, 1)

    out_path = Path(out)
    parameters = _parameters(images, classes, seed, quality)
    if out_path.exists() and not out_path.is_dir():
        raise ValueError(f"{out_path} exists and is not a directory")
    if out_path.is_dir() and any(out_path.iterdir()):
        previous = _read_summary(out_path)
        if previous is not None and previous.get("parameters") == parameters:
            return previous, True
        if not overwrite:
            reason = "a set made with other parameters" if previous else "not an empty directory"
            raise ValueError(
                f"{out_path} is {reason}; choose another folder, or pass overwrite (--overwrite) to "
                "replace it"
            )

    # Find the photos before touching ``out``, so that a missing dependency never costs an existing set.
    data_dir = _source_dir()
    source_names = _available_source_names(data_dir)
    if len(source_names) < _MIN_SOURCES:
        raise FileNotFoundError(
            f"found only {len(source_names)} of scikit-image's sample photos in {data_dir} "
            f"(need at least {_MIN_SOURCES}); reinstall it: pip install --force-reinstall scikit-image"
        )
    if out_path.is_dir() and any(out_path.iterdir()):
        _clear_previous(out_path)
    job = _Job(str(out_path), images, classes, seed, quality, str(data_dir))
    out_path.mkdir(parents=True, exist_ok=True)
    for k in range(classes):
        job.path(k).parent.mkdir(exist_ok=True)

    start = time.monotonic()
    count, total_bytes = _generate(job, workers, progress)
    summary: dict[str, Any] = {
        "generator": "prestage synth",
        "parameters": parameters,
        "count": count,
        "total_bytes": total_bytes,
        "mean_bytes": round(total_bytes / count, 1),
        "sources": source_names,
        "layout": "OUT/class_<k>/img_<i>.jpg, image i in class i % classes",
    }
    temp = out_path / f".{SUMMARY_NAME}.part"
    temp.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    os.replace(temp, out_path / SUMMARY_NAME)
    summary = dict(summary, seconds=round(time.monotonic() - start, 3))
    return summary, False


def _ignore_sigint() -> None:
    """Let Ctrl+C reach only the parent, which cancels the queued chunks; workers finish their current one."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _generate(job: _Job, workers: int, show_progress: bool) -> tuple[int, int]:
    """Write all images, in this process (``workers == 1``) or in worker processes; return (count, bytes).

    Processes rather than threads: Pillow holds the GIL in some of the steps (the colour matrix, the channel
    arithmetic), which would cap the speed-up of threads on a many-core node. They are started by
    ``forkserver`` (``spawn`` where it is missing), never forked from this process, which may run threads
    (OpenBLAS's, a loader's, the progress bar's): forking a threaded process can deadlock the child.
    """
    # Chunks small enough for a smooth bar and for load balance, big enough to amortise the dispatch.
    chunk = max(1, min(32, job.images // (workers * 8)))
    ranges = [(s, min(s + chunk, job.images)) for s in range(0, job.images, chunk)]
    workers = min(workers, len(ranges))
    count = total = 0
    with progress_bar(job.images, desc="synth", unit="img", enabled=show_progress) as bar:
        if workers == 1:
            for start, stop in ranges:
                n, size = _write_range(job, start, stop)
                count, total = count + n, total + size
                bar.update(n)
            return count, total

        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        pool = concurrent.futures.ProcessPoolExecutor(
            max_workers=workers, mp_context=context, initializer=_ignore_sigint
        )
        try:
            futures = [pool.submit(_write_range, job, start, stop) for start, stop in ranges]
            for future in concurrent.futures.as_completed(futures):
                n, size = future.result()
                count, total = count + n, total + size
                bar.update(n)
        except BrokenProcessPool as error:
            pool.shutdown(wait=True, cancel_futures=True)
            raise RuntimeError(
                "a worker process of prestage synth died: killed, out of memory, or unable to start (a "
                "script that calls make_synthetic_set must do so under 'if __name__ == \"__main__\":', "
                "and the script cannot come from stdin); workers=1 works without worker processes"
            ) from error
        except BaseException:
            # Ctrl+C or a failed chunk: drop the queued chunks instead of finishing them.
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
    return count, total


def make_synthetic_set(
    out: str | os.PathLike[str],
    images: int,
    classes: int,
    seed: int = 0,
    quality: int = 90,
    workers: int | None = None,
    progress: bool = True,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Write ``images`` synthetic ImageNet-like JPEGs in ``classes`` class folders under ``out``.

    Args:
        out: the folder to create (or an empty one). Image ``i`` is ``out/class_<i % classes>/img_<i>.jpg``.
        images: number of images, at least 1.
        classes: number of classes, between 1 and ``images``; images are spread evenly (``i % classes``).
        seed: non-negative; the same seed gives the same bytes, whatever ``workers``.
        quality: JPEG quality at the centre of the per-image draw (+/- 2), 1 to 100.
        workers: number of worker processes; ``None`` means ``os.cpu_count()``; 1 works in this process.
        progress: draw a progress bar on stderr (only when stderr is a terminal).
        overwrite: replace a set made with other parameters, or an interrupted one, in ``out``.

    Returns:
        The summary written to ``out/SYNTH.json`` (``parameters``, ``count``, ``total_bytes``, ...), plus the
        run's wall time in ``seconds`` when the set was written now. When ``out`` already holds a set with the
        same parameters, nothing is written and its summary is returned.

    Raises:
        ValueError: a bad argument, or ``out`` is not an empty directory (and not the same set), unless
            ``overwrite``; ``out`` holds files that this function did not write.
        ModuleNotFoundError: scikit-image (the source photos) is not installed.
        RuntimeError: a worker process died. Worker processes are started afresh (not forked), so a script
            that calls this with ``workers > 1`` must guard the call with ``if __name__ == "__main__":``.
    """
    summary, _ = _make(out, images, classes, seed, quality, workers, progress, overwrite)
    return summary
