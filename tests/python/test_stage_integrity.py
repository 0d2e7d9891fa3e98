"""Never a wrong byte from the node's own stage directory: copies changed on the SSD after they were
written (a failing disk, a stray job, a user) are caught on every read, counted in
stats()["stage_corrupt"], removed, and the source is read instead; the batches stay those of a run
without a stage directory."""

import time
from pathlib import Path
from typing import List

import numpy as np
import pytest

import prestage
from prestage import pack as packing


def staged_copies(stage: Path) -> List[Path]:
    """The copies in a stage directory (the index, the node table and partial copies left out)."""
    return [p for p in stage.glob("prestage-*/[0-9a-f][0-9a-f]/*") if p.is_file() and p.suffix != ".part"]


def overwrite_heads(stage: Path, n: int = 64) -> int:
    """Overwrites the first n bytes of every copy in place (same size), as a failing disk would."""
    copies = staged_copies(stage)
    for p in copies:
        with open(p, "r+b") as f:
            head = f.read(n)
            f.seek(0)
            f.write(bytes(b ^ 0x5A for b in head))
    return len(copies)


def epoch_batches(loader, epoch, key):
    loader.set_epoch(epoch)
    return [(b.indices.tolist(), key(b)) for b in loader]


def raw_key(b):
    return [bytes(b.data[b.offsets[i]:b.offsets[i + 1]]) for i in range(len(b.indices))]


def image_key(b):
    return np.asarray(b.images).tobytes()


def write_raw(root: Path, n: int = 48) -> prestage.Catalog:
    rng = np.random.default_rng(1)
    for i in range(n):
        (root / f"c{i % 3}").mkdir(parents=True, exist_ok=True)
        (root / f"c{i % 3}" / f"{i:03d}.bin").write_bytes(rng.bytes(int(rng.integers(200, 3000))))
    return prestage.Catalog.from_folder(root, [".bin"])


def settle(loader, quiet_s: float = 0.2, limit_s: float = 10.0) -> None:
    """Waits until the pipeline's run-ahead into the next epoch is over (its figures stop moving): a
    copy it read, found corrupt and made again while the test overwrote copies would be overwritten
    and caught twice."""
    def figures():
        s = loader.stats()
        return (s["stage"]["items"], s["decode"]["items"], s["staged_files"], s["stage_corrupt"],
                s["hits"], s["misses"])
    deadline = time.monotonic() + limit_s
    last = figures()
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = figures()
        if now == last:
            return
        last = now


def check_caught(tmp_path, catalog, key, **options):
    """Epoch 0 stages every file, then every copy is overwritten in part. Epoch 5 (not the one the
    pipeline ran ahead into: it starts afresh) reads every file after the change, and epoch 7 again:
    both must equal a run without a stage directory, each changed copy caught once, and copied again."""
    with prestage.Loader(catalog, batch_size=8, seed=3, **options) as plain:
        want = {e: epoch_batches(plain, e, key) for e in (0, 5, 7)}
    stage = tmp_path / "stage"
    with prestage.Loader(catalog, batch_size=8, seed=3, stage_dir=str(stage), stage_patience=None,
                         **options) as loader:
        assert epoch_batches(loader, 0, key) == want[0]
        settle(loader)
        changed = overwrite_heads(stage)
        assert changed == catalog.num_files
        assert epoch_batches(loader, 5, key) == want[5]
        s = loader.stats()
        assert s["stage_corrupt"] == changed
        assert epoch_batches(loader, 7, key) == want[7]
        s = loader.stats()
        assert s["stage_corrupt"] == changed  # none found since: the copies made again are whole
        assert s["staged_files"] > catalog.num_files  # epoch 0's, then copies of the removed ones
    return s


def test_raw_files_changed_on_the_ssd_are_caught_by_their_crc(tmp_path):
    check_caught(tmp_path, write_raw(tmp_path / "src"), raw_key, decode="raw")


def test_jpegs_changed_on_the_ssd_are_caught_by_their_crc(tmp_path, make_folder):
    catalog = prestage.Catalog.from_folder(make_folder(classes=4, per_class=8))
    check_caught(tmp_path, catalog, image_key, image_size=(32, 32))


def test_npy_files_read_in_parts_are_checked_whole_when_they_change(tmp_path):
    rng = np.random.default_rng(2)
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    for i in range(24):
        np.save(src / "a" / f"{i:03d}.npy", rng.standard_normal((6, 5)).astype(np.float32))
    catalog = prestage.Catalog.from_folder(src, [".npy"])
    check_caught(tmp_path, catalog, lambda b: np.asarray(b.data).tobytes(), decode="npy")


def test_samples_of_a_packed_shard_are_caught_when_the_shard_changes(tmp_path):
    write_raw(tmp_path / "src", n=60)
    packing.pack(tmp_path / "src", tmp_path / "packed", shard_bytes=20_000)
    packed = prestage.Catalog.from_shards(tmp_path / "packed")
    assert packed.num_files > 1
    check_caught(tmp_path, packed, raw_key, decode="raw")
