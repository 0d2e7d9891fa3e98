"""prestage catalog SRC OUT (walk once, save, report) and what takes its file; flat folders. The report is
checked against os.walk and os.stat, the decoded images against Pillow."""

import json
import math
import os

import numpy as np
import pytest
from PIL import Image

import prestage
from prestage.cli import main
from prestage.cli.demo import run_demo


def _walk_sizes(root):
    """{relative path: size} of the JPEG files under root, by os.walk and os.stat."""
    found = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            if name.lower().endswith((".jpg", ".jpeg")):
                path = os.path.join(dirpath, name)
                found[os.path.relpath(path, root)] = os.stat(path).st_size
    return found


def _run(capsys, *argv):
    rc = main(["catalog", *map(str, argv), "--quiet"])
    out, err = capsys.readouterr()
    return rc, out, err


def test_catalog_walks_saves_and_reports_what_os_walk_finds(make_folder, tmp_path, capsys):
    root = make_folder(3, 5, size=None)  # mixed sizes: several histogram bins
    (root / "class_1" / "extra.jpeg").write_bytes(b"\xff\xd8" + b"\0" * 3000)
    out = tmp_path / "cats" / "train.catalog"
    rc, text, _ = _run(capsys, root, out, "--json")
    assert rc == 0
    report = json.loads(text)
    sizes = _walk_sizes(root)
    assert report["files"] == report["samples"] == len(sizes) == 16
    assert report["bytes"] == sum(sizes.values()) and report["sizes_unknown"] == 0
    assert report["classes"] == 3 and report["unlabelled"] == 0
    assert report["per_class"] == {f"class_{c}": sum(p.startswith(f"class_{c}/") for p in sizes)
                                   for c in range(3)}
    bins = report["size_histogram"]
    assert sum(b["files"] for b in bins) == len(sizes)
    for size in sizes.values():
        k = int(math.log2(max(size, 1)))
        (b,) = [b for b in bins if b["to_bytes"] == 2 ** (k + 1)]
        assert b["from_bytes"] <= size < b["to_bytes"]
    assert [b["files"] for b in bins] == [sum(1 for s in sizes.values() if int(math.log2(max(s, 1))) == k)
                                          for k in range(int(math.log2(min(sizes.values()))),
                                                         int(math.log2(max(sizes.values()))) + 1)]
    saved = prestage.Catalog.load(out)
    walked = prestage.Catalog.from_folder(root)
    assert [saved.path(i) for i in range(len(saved))] == [walked.path(i) for i in range(len(walked))]
    assert [saved.label(i) for i in range(len(saved))] == [walked.label(i) for i in range(len(walked))]
    assert list(saved.file_sizes()) == [sizes[saved.path(i)] for i in range(len(saved))]
    rc, text, _ = _run(capsys, root, tmp_path / "again.catalog")  # the text report
    assert rc == 0 and "16 files, 16 samples, 3 classes" in text and "file sizes:" in text
    # The counts per class, as the README promises, in the text report too (not only --json).
    listed = ", ".join(f"class_{c} {sum(p.startswith(f'class_{c}/') for p in sizes)}" for c in range(3))
    assert listed in text


def test_the_loaders_and_demo_take_the_saved_file(folder, tmp_path, capsys):
    out = tmp_path / "train.catalog"
    assert _run(capsys, folder, out)[0] == 0
    catalog = prestage.Catalog.from_folder(folder)
    options = dict(batch_size=4, image_size=(16, 16), seed=3)
    with prestage.Loader(catalog, **options) as a, prestage.Loader(out, **options) as b:
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x.indices, y.indices)
            np.testing.assert_array_equal(x.images, y.images)
            np.testing.assert_array_equal(x.labels, y.labels)
    result = run_demo(out, tmp_path / "stage", batch_size=4, image_size=(16, 16), cold=False,
                      show_progress=False)
    assert result["images"] == len(catalog)
    # No thread option: the loader sized them, and the demo says what it chose.
    assert result["options"]["readers"] >= 1 and "readers" in result["options"]["threads_why"]


def test_catalog_failures_are_reported_with_what_is_wrong(folder, tmp_path, capsys):
    rc, _, err = _run(capsys, tmp_path / "missing", tmp_path / "a.catalog")
    assert rc == 2 and "missing" in err and "not a directory" in err
    (tmp_path / "empty" / "class_0").mkdir(parents=True)
    rc, _, err = _run(capsys, tmp_path / "empty", tmp_path / "b.catalog")
    assert rc == 2 and "no files" in err and not (tmp_path / "b.catalog").exists()
    (tmp_path / "taken").mkdir()  # OUT is a directory: the save fails, naming it
    rc, _, err = _run(capsys, folder, tmp_path / "taken")
    assert rc == 2 and "taken" in err
    good = tmp_path / "good.catalog"
    assert _run(capsys, folder, good)[0] == 0
    truncated = tmp_path / "truncated.catalog"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(prestage.Error, match="truncated.catalog"):
        prestage.Loader(truncated, batch_size=2)


def test_a_flat_folder_is_a_catalog_without_classes(tmp_path, encode_jpeg, capsys):
    rng = np.random.default_rng(8)
    images = {f"{i:02d}.jpg": rng.integers(0, 255, size=(8, 12, 3), dtype=np.uint8) for i in range(5)}
    for name, image in images.items():
        (tmp_path / name).write_bytes(encode_jpeg(image, quality=95))
    (tmp_path / "readme.txt").write_text("not a sample")
    cat = prestage.Catalog.from_folder(tmp_path)
    assert len(cat) == 5 and list(cat.classes) == []
    assert [cat.path(i) for i in range(5)] == sorted(images)
    assert [cat.label(i) for i in range(5)] == [-1] * 5
    with prestage.Loader(cat, batch_size=2, shuffle=False) as loader:
        for batch in loader:
            assert batch.labels.tolist() == [-1] * len(batch)
            for k, i in enumerate(batch.indices):
                with Image.open(cat.source_path(int(i))) as im:
                    np.testing.assert_array_equal(batch.images[k], np.asarray(im.convert("RGB")))
    rc, text, _ = _run(capsys, tmp_path, tmp_path / "out" / "flat.catalog", "--json")
    assert rc == 0
    assert {k: json.loads(text)[k] for k in ("classes", "files", "unlabelled")} == \
        {"classes": 0, "files": 5, "unlabelled": 5}
    (tmp_path / "readme.txt").unlink()
    for name in images:
        (tmp_path / name).unlink()
    (tmp_path / "out" / "flat.catalog").unlink()
    (tmp_path / "out").rmdir()
    with pytest.raises(prestage.ConfigError, match="no class folders and no files"):
        prestage.Catalog.from_folder(tmp_path)


HDF5_SESSION = """
import sys
import prestage
cat = prestage.Catalog.load(sys.argv[1]) if sys.argv[2] == "load" else \\
    prestage.Catalog.from_hdf5(sorted(__import__("glob").glob(sys.argv[1] + "/*.h5")), "data", labels="labels")
with prestage.Loader(cat, batch_size=4, seed=1) as loader:
    rows = sum(len(b) for b in loader)
print(rows)
"""


def test_hdf5_catalogs_and_loaders_print_no_hdf5_diagnostics_at_exit(tmp_path):
    """libhdf5 prints its error stack ("HDF5-DIAG: Error detected ...") when a handle is closed twice or
    after the library shut down (at exit): none may reach stderr, from the CLI or from a loader over a
    saved HDF5 catalog or a walked one. The rows are those h5py wrote."""
    import subprocess
    import sys

    h5py = pytest.importorskip("h5py")
    h5dir = tmp_path / "h5"
    h5dir.mkdir()
    for k in range(3):
        with h5py.File(h5dir / f"part{k}.h5", "w") as f:
            f["data"] = np.arange(10 * 6, dtype=np.float32).reshape(10, 6) + k
            f["labels"] = np.arange(10) % 3
    bin_dir = os.path.dirname(sys.executable)
    cli = subprocess.run([os.path.join(bin_dir, "prestage"), "catalog", str(h5dir), str(tmp_path / "h5.catalog"),
                          "--dataset", "data", "--labels", "labels", "--quiet"],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0 and "30 samples" in cli.stdout, cli.stdout + cli.stderr
    assert "HDF5-DIAG" not in cli.stderr and "HDF5" not in cli.stderr, cli.stderr
    for source, how in ((tmp_path / "h5.catalog", "load"), (h5dir, "walk")):
        run = subprocess.run([sys.executable, "-c", HDF5_SESSION, str(source), how],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0 and run.stdout.split() == ["30"], run.stdout + run.stderr
        assert "HDF5-DIAG" not in run.stderr and "HDF5" not in run.stderr, (how, run.stderr)


def test_webdataset_and_mds_shards_are_scanned_once_and_saved(tmp_path, encode_jpeg, mds_writer, capsys):
    wds = pytest.importorskip("webdataset")
    images = [np.full((8, 10, 3), 20 * i, np.uint8) for i in range(6)]
    with wds.ShardWriter(str(tmp_path / "train-%06d.tar"), maxcount=3, verbose=0) as sink:
        for i, image in enumerate(images):
            sink.write({"__key__": f"k{i}", "jpg": encode_jpeg(image), "cls": str(i % 2).encode()})
    pattern = tmp_path / "train-{000000..000001}.tar"
    rc, out, err = _run(capsys, pattern, tmp_path / "wds.catalog", "--webdataset")
    assert rc == 0, err
    assert "2 files, 6 samples" in out
    saved = prestage.Catalog.load(tmp_path / "wds.catalog")
    assert [saved.label(i) for i in range(6)] == [0, 1, 0, 1, 0, 1]

    mds_writer(tmp_path / "mds", {"jpg": "jpeg", "cls": "int"},
               [{"jpg": encode_jpeg(image), "cls": 5 + i} for i, image in enumerate(images)])
    rc, out, err = _run(capsys, tmp_path / "mds", tmp_path / "mds.catalog", "--mds", "--image", "jpg",
                        "--labels", "cls", "--json")
    assert rc == 0, err
    assert json.loads(out)["samples"] == 6 and json.loads(out)["damaged"] == 0
    assert prestage.Catalog.load(tmp_path / "mds.catalog").label(5) == 10

    rc, out, err = _run(capsys, tmp_path / "nothing-*.tar", tmp_path / "x.catalog", "--webdataset")
    assert rc == 2 and "no shard matches" in err
