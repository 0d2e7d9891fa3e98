"""Tests of ``prestage synth`` (the library, prestage.synth, and the command): layout, JPEG properties, content,
determinism, argument checks and the CLI."""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image, JpegImagePlugin
from prestage import synth
from prestage.cli import synth as synth_cli
from prestage.cli.progress import progress

IMAGES = 24
CLASSES = 3


def _jpegs(root: Path) -> list[Path]:
    return sorted(root.glob("class_*/*.jpg"))


def _luma(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("L"), dtype=np.float64)


def _tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in _jpegs(root)}


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="prestage")
    synth_cli.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


@pytest.fixture(scope="module")
def small_set(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """24 images in 3 classes, seed 0, generated once for the tests that only read it."""
    out = tmp_path_factory.mktemp("synth") / "set"
    summary = synth.make_synthetic_set(out, IMAGES, CLASSES, seed=0, workers=1, progress=False)
    return out, summary


def test_layout_is_one_folder_per_class_with_images_spread_evenly(
    small_set: tuple[Path, dict[str, Any]],
) -> None:
    out, _ = small_set
    folders = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert folders == ["class_000", "class_001", "class_002"]
    for k, folder in enumerate(folders):
        names = sorted(p.name for p in (out / folder).iterdir())
        assert names == [f"img_{i:06d}.jpg" for i in range(k, IMAGES, CLASSES)]


def test_summary_records_parameters_count_and_bytes(small_set: tuple[Path, dict[str, Any]]) -> None:
    out, summary = small_set
    on_disk = json.loads((out / synth.SUMMARY_NAME).read_text(encoding="utf-8"))
    assert on_disk["parameters"] == {
        "images": IMAGES,
        "classes": CLASSES,
        "seed": 0,
        "quality": 90,
        "recipe": synth.RECIPE_VERSION,
    }
    assert on_disk["count"] == IMAGES
    assert on_disk["total_bytes"] == sum(p.stat().st_size for p in _jpegs(out))
    assert {k: v for k, v in summary.items() if k != "seconds"} == on_disk


def test_files_are_baseline_jpegs_of_imagenet_like_size(small_set: tuple[Path, dict[str, Any]]) -> None:
    out, _ = small_set
    files = _jpegs(out)
    modes = []
    for path in files:
        with Image.open(path) as im:
            assert im.format == "JPEG"
            assert not im.info.get("progressive")
            assert 100 <= im.width <= 1000 and 100 <= im.height <= 1000
            modes.append(im.mode)
            if im.mode == "RGB":
                assert JpegImagePlugin.get_sampling(im) == 2  # 4:2:0
    assert set(modes) <= {"RGB", "L"}
    assert modes.count("RGB") >= 0.8 * len(files)
    mean_bytes = np.mean([p.stat().st_size for p in files])
    assert 40e3 < mean_bytes < 200e3


def test_size_distribution_is_imagenet_like() -> None:
    sizes = np.array([synth._draw_size(np.random.default_rng((0, i))) for i in range(4000)])
    widths, heights = sizes[:, 0], sizes[:, 1]
    assert 380 < widths.mean() < 480 and 320 < heights.mean() < 420
    assert 0.7 < np.mean(widths > heights) < 0.8
    assert np.mean((widths >= 300) & (widths <= 640)) > 0.7
    assert np.mean((widths == 500) & (heights == 375)) > 0.2
    assert sizes.min() >= 100 and sizes.max() <= synth.MAX_SIDE


def test_images_are_photographic_not_flat_and_not_noise(small_set: tuple[Path, dict[str, Any]]) -> None:
    out, _ = small_set
    for path in _jpegs(out):
        luma = _luma(path)
        assert luma.std() > 15.0, path  # not a flat colour
        right = np.corrcoef(luma[:, :-1].ravel(), luma[:, 1:].ravel())[0, 1]
        assert right > 0.5, path  # neighbouring pixels agree: not noise (noise gives ~0)


def test_classes_have_a_learnable_look(small_set: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    """A nearest-centroid classifier on 8x8 thumbnails, fitted on seed 0, labels a seed-1 set."""

    def features(root: Path) -> tuple[np.ndarray, np.ndarray]:
        xs, ys = [], []
        for path in _jpegs(root):
            with Image.open(path) as im:
                thumb = im.convert("RGB").resize((8, 8), Image.Resampling.BOX)
            xs.append(np.asarray(thumb, dtype=np.float64).ravel() / 255.0)
            ys.append(int(path.parent.name.split("_")[1]))
        return np.array(xs), np.array(ys)

    train_x, train_y = features(small_set[0])
    synth.make_synthetic_set(tmp_path / "val", 12, CLASSES, seed=1, workers=1, progress=False)
    val_x, val_y = features(tmp_path / "val")
    centroids = np.stack([train_x[train_y == k].mean(axis=0) for k in range(CLASSES)])
    predicted = np.argmin(((val_x[:, None, :] - centroids[None]) ** 2).sum(axis=2), axis=1)
    assert np.mean(predicted == val_y) >= 0.75


def test_same_seed_gives_same_bytes_whatever_the_workers(tmp_path: Path) -> None:
    synth.make_synthetic_set(tmp_path / "a", 8, 2, seed=3, workers=1, progress=False)
    synth.make_synthetic_set(tmp_path / "b", 8, 2, seed=3, workers=2, progress=False)
    a, b = _tree_bytes(tmp_path / "a"), _tree_bytes(tmp_path / "b")
    assert len(a) == 8 and a == b


def test_different_seed_gives_different_bytes(tmp_path: Path) -> None:
    synth.make_synthetic_set(tmp_path / "a", 4, 2, seed=3, workers=1, progress=False)
    synth.make_synthetic_set(tmp_path / "b", 4, 2, seed=4, workers=1, progress=False)
    a, b = _tree_bytes(tmp_path / "a"), _tree_bytes(tmp_path / "b")
    assert a.keys() == b.keys()
    assert all(a[name] != b[name] for name in a)


def test_render_is_a_pure_function_of_seed_and_index() -> None:
    sources = synth._load_sources(str(synth._source_dir()))
    first = synth.render_image(5, 3, 0, 90, sources)
    assert synth.render_image(5, 3, 0, 90, sources) == first
    assert synth.render_image(6, 3, 0, 90, sources) != first
    with Image.open(io.BytesIO(first)) as im:
        im.verify()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"images": 0, "classes": 1},
        {"images": 5, "classes": 0},
        {"images": 2, "classes": 3},
        {"images": 5, "classes": 1, "seed": -1},
        {"images": 5, "classes": 1, "quality": 0},
        {"images": 5, "classes": 1, "quality": 101},
        {"images": 5, "classes": 1, "workers": 0},
        {"images": 2.5, "classes": 1},
        {"images": True, "classes": 1},
    ],
)
def test_bad_arguments_raise_value_error(tmp_path: Path, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        synth.make_synthetic_set(tmp_path / "out", progress=False, **kwargs)
    assert not (tmp_path / "out").exists()


def test_refuses_a_non_empty_folder_and_a_file(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("keep me", encoding="utf-8")
    with pytest.raises(ValueError, match="not an empty directory"):
        synth.make_synthetic_set(tmp_path, 2, 1, workers=1, progress=False)
    with pytest.raises(ValueError, match="did not write"):
        synth.make_synthetic_set(tmp_path, 2, 1, workers=1, progress=False, overwrite=True)
    with pytest.raises(ValueError, match="not a directory"):
        synth.make_synthetic_set(tmp_path / "notes.txt", 2, 1, workers=1, progress=False)
    assert (tmp_path / "notes.txt").read_text(encoding="utf-8") == "keep me"


def test_empty_existing_folder_is_used(tmp_path: Path) -> None:
    summary = synth.make_synthetic_set(tmp_path, 2, 1, workers=1, progress=False)
    assert summary["count"] == 2 and len(_jpegs(tmp_path)) == 2


def test_rerun_with_same_parameters_is_a_no_op_and_overwrite_replaces(tmp_path: Path) -> None:
    out = tmp_path / "set"
    first = synth.make_synthetic_set(out, 4, 2, seed=1, workers=1, progress=False)
    stamp = {p: p.stat().st_mtime_ns for p in _jpegs(out)}
    again = synth.make_synthetic_set(out, 4, 2, seed=1, workers=1, progress=False)
    assert again == {k: v for k, v in first.items() if k != "seconds"}
    assert {p: p.stat().st_mtime_ns for p in _jpegs(out)} == stamp

    with pytest.raises(ValueError, match="other parameters"):
        synth.make_synthetic_set(out, 6, 3, seed=1, workers=1, progress=False)
    replaced = synth.make_synthetic_set(out, 6, 3, seed=1, workers=1, progress=False, overwrite=True)
    assert replaced["parameters"]["images"] == 6
    assert sorted(p.name for p in out.iterdir()) == ["SYNTH.json", "class_000", "class_001", "class_002"]
    assert len(_jpegs(out)) == 6


def test_interrupted_set_is_visible_and_overwrite_repairs_it(tmp_path: Path) -> None:
    out = tmp_path / "set"
    synth.make_synthetic_set(out, 4, 2, workers=1, progress=False)
    (out / synth.SUMMARY_NAME).unlink()  # as if the run had stopped before its end
    (out / "class_000" / ".img_000004.jpg.part").write_bytes(b"\xff\xd8")
    with pytest.raises(ValueError):
        synth.make_synthetic_set(out, 4, 2, workers=1, progress=False)
    synth.make_synthetic_set(out, 4, 2, workers=1, progress=False, overwrite=True)
    assert not list(out.rglob("*.part"))
    assert len(_jpegs(out)) == 4 and (out / synth.SUMMARY_NAME).is_file()


def test_missing_scikit_image_is_reported_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> object:
        return None if name == "skimage" else real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(ModuleNotFoundError, match=re.escape(synth.INSTALL_SYNTH)):
        synth.make_synthetic_set(tmp_path / "out", 2, 1, workers=1, progress=False)
    assert synth_cli.run(_parse(["synth", str(tmp_path / "out"), "--images", "2", "--classes", "1"])) == 1
    assert synth.INSTALL_SYNTH in capsys.readouterr().err


@pytest.mark.parametrize("command", [["synth", "OUT", "--images", "2", "--classes", "1"],
                                     ["demo", "--images", "2", "--quiet"]])
def test_without_pillow_every_command_gives_the_one_fix(tmp_path: Path, command: list) -> None:
    """Without Pillow (its import blocked in a fresh interpreter), synth and demo end with one line
    that names the extra to install, as the README does, and no traceback."""
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in command]
    code = ("import sys; sys.modules['PIL'] = None; from prestage.cli import main; "
            f"sys.exit(main({argv!r}))")
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and "pip install 'prestage[synth]'" in done.stderr
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert "pip install 'prestage[synth]'" in readme and "pip install pillow" not in readme


@pytest.mark.parametrize(
    "argv",
    [
        ["--images", "0"],
        ["--images", "4", "--classes", "0"],
        ["--images", "2", "--classes", "3"],
        ["--images", "4", "--classes", "2", "--quality", "101"],
        ["--images", "4", "--classes", "2", "--workers", "0"],
    ],
)
def test_cli_returns_2_on_bad_arguments(
    tmp_path: Path, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert synth_cli.run(_parse(["synth", str(tmp_path / "out"), *argv])) == 2
    assert "error" in capsys.readouterr().err


def test_cli_writes_then_says_already_there(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "out")
    argv = ["synth", out, "--images", "4", "--classes", "2", "--workers", "1"]
    assert synth_cli.run(_parse(argv)) == 0
    assert "wrote 4 images in 2 classes" in capsys.readouterr().out
    assert synth_cli.run(_parse(argv)) == 0
    assert "already there" in capsys.readouterr().out
    assert synth_cli.run(_parse([*argv, "--quiet"])) == 0
    assert capsys.readouterr().out == ""
    other = ["synth", out, "--images", "4", "--classes", "1", "--workers", "1"]
    assert synth_cli.run(_parse(other)) == 2  # a different set is there: refused without --overwrite
    assert "--overwrite" in capsys.readouterr().err


def test_cli_help_states_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parse(["synth", "--help"])
    text = capsys.readouterr().out
    for option in ("--images", "--classes", "--seed", "--quality", "--workers", "--overwrite", "--quiet"):
        assert option in text


def test_progress_passes_items_through_when_off_or_not_a_terminal() -> None:
    assert list(progress(range(5), desc="t", unit="x", enabled=False)) == [0, 1, 2, 3, 4]
    assert list(progress(iter("ab"), desc="t", unit="x", enabled=True)) == ["a", "b"]  # stderr is captured
    with progress(10, desc="t", unit="x", enabled=True) as bar:
        bar.update(10)


def test_progress_fallback_draws_on_its_stream() -> None:
    from prestage.cli.progress import _TextBar

    stream = io.StringIO()
    with _TextBar(None, 4, "synth", "img", stream) as bar:
        bar.update(4)
    assert "synth" in stream.getvalue() and "4/4 img" in stream.getvalue()
