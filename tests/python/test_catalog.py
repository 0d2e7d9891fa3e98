import os
from pathlib import Path

import pytest

import prestage


def walk_like_image_folder(root: Path):
    """torchvision ImageFolder's order and labels, computed independently with os.walk."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    samples = []
    for label, cls in enumerate(classes):
        for dirpath, _, names in sorted(os.walk(root / cls, followlinks=True)):
            for name in sorted(names):
                if name.lower().endswith((".jpg", ".jpeg")):
                    samples.append((os.path.relpath(os.path.join(dirpath, name), root), label))
    return classes, samples


def test_from_folder_matches_image_folder_order(folder):
    (folder / "class_1" / "nested").mkdir()
    (folder / "class_1" / "nested" / "z.JPG").write_bytes(b"x")
    (folder / "class_2" / "readme.txt").write_text("not an image")
    cat = prestage.Catalog.from_folder(folder)
    classes, samples = walk_like_image_folder(folder)
    assert cat.classes == classes
    assert [(cat.path(i), cat.label(i)) for i in range(len(cat))] == samples
    assert cat.source_path(0) == folder / samples[0][0]


def test_from_list_and_labels(tmp_path):
    lst = tmp_path / "list.txt"
    lst.write_text("a/1.jpg,4\n# comment\n\nb/2.jpg\n")
    cat = prestage.Catalog.from_list(lst, tmp_path)
    assert len(cat) == 2
    assert (cat.path(0), cat.label(0)) == ("a/1.jpg", 4)
    assert (cat.path(1), cat.label(1)) == ("b/2.jpg", -1)


@pytest.mark.parametrize("bad", ["../x.jpg", "/etc/passwd", "a/../../x.jpg"])
def test_path_escaping_root_is_refused(tmp_path, bad):
    lst = tmp_path / "list.txt"
    lst.write_text(f"ok.jpg\n{bad}\n")
    with pytest.raises(prestage.ConfigError):
        prestage.Catalog.from_list(lst, tmp_path)
    with pytest.raises(ValueError):  # ConfigError is a ValueError
        prestage.Catalog.from_paths(tmp_path, [bad])


def test_missing_root_is_an_os_error(tmp_path):
    with pytest.raises(prestage.IoError) as info:
        prestage.Catalog.from_folder(tmp_path / "missing")
    assert isinstance(info.value, OSError)


def test_save_load_roundtrip_and_corruption(folder, tmp_path):
    cat = prestage.Catalog.from_folder(folder)
    cat.save(tmp_path / "cat.bin")
    back = prestage.Catalog.load(tmp_path / "cat.bin")
    assert [back.path(i) for i in range(len(back))] == [cat.path(i) for i in range(len(cat))]
    assert [back.label(i) for i in range(len(back))] == [cat.label(i) for i in range(len(cat))]
    assert back.classes == cat.classes and back.root == cat.root
    data = bytearray((tmp_path / "cat.bin").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (tmp_path / "bad.bin").write_bytes(bytes(data))
    with pytest.raises(prestage.DecodeError):
        prestage.Catalog.load(tmp_path / "bad.bin")
    (tmp_path / "cut.bin").write_bytes(bytes(data[:20]))
    with pytest.raises(prestage.DecodeError):
        prestage.Catalog.load(tmp_path / "cut.bin")
