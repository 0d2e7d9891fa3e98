"""Staging for users' own decoding (prestage.torch.StagedSampler, StagedDataset): the plan's batches in
DataLoader workers under fork, spawn and forkserver, exact resume, no wrong byte under a bounded stage
directory, flat worker memory, and the failure paths (a copy evicted under a worker, a missing source, an
unusable stage directory)."""

import hashlib
import os
import pickle
import resource
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

# Four workers on a machine of fewer cores is what the test asks for: torch's advice is not a failure.
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

import prestage  # noqa: E402
import prestage.torch  # noqa: E402
from prestage import pack as packing  # noqa: E402


def make_files(root: Path, n: int = 96, classes: int = 4, seed: int = 0,
               sizes: tuple = (500, 3000)) -> prestage.Catalog:
    rng = np.random.default_rng(seed)
    for i in range(n):
        folder = root / f"c{i % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{i:04d}.bin").write_bytes(rng.bytes(int(rng.integers(*sizes))))
    return prestage.Catalog.from_folder(root, [])


# Module-level, so that spawn and forkserver workers can unpickle them.
def digest(sample, label):
    return hashlib.sha256(bytes(sample.bytes())).hexdigest(), label, sample.index


def keep(items):
    return items


def reference_batches(catalog, epoch=0, **plan):
    with prestage.Loader(catalog, decode="raw", **plan) as loader:
        loader.set_epoch(epoch)
        return [b.indices.tolist() for b in loader]


def source_digest(catalog, i):
    return hashlib.sha256(Path(catalog.source_path(i)).read_bytes()).hexdigest()


@pytest.mark.parametrize("workers,context", [(0, None), (2, "fork"), (4, "fork"), (2, "spawn"),
                                             (4, "spawn"), (2, "forkserver"), (4, "forkserver")])
def test_the_plans_batches_in_workers_then_an_exact_resume(tmp_path, workers, context):
    catalog = make_files(tmp_path / "src")
    plan = dict(batch_size=8, seed=7, rank=1, world_size=2)
    expected = reference_batches(catalog, epoch=1, **plan)
    stage = tmp_path / "stage"
    extra = {"multiprocessing_context": context} if context else {}
    with prestage.torch.StagedSampler(catalog, stage_dir=stage, num_workers=workers, **plan) as sampler:
        sampler.set_epoch(1)
        dataset = prestage.torch.StagedDataset(sampler, read=digest)
        got = []
        for k, items in enumerate(sampler.data_loader(dataset, collate_fn=keep, **extra)):
            got.append([index for _, _, index in items])
            for sha, label, index in items:
                assert sha == source_digest(catalog, index) and label == catalog.label(index)
            if k == 2:
                break
        state = sampler.state_dict()
    assert got == expected[:3]
    assert (state["epoch"], state["batch"]) == (1, 3)
    # Resumed by another job with other workers: exactly the batches not taken.
    with prestage.torch.StagedSampler(catalog, stage_dir=stage, num_workers=2 if workers != 2 else 0,
                                      **plan) as again:
        again.load_state_dict(state)
        rest = [[index for _, _, index in items]
                for items in again.data_loader(prestage.torch.StagedDataset(again, read=digest),
                                               collate_fn=keep)]
        assert rest == expected[3:]
        assert again.state_dict()["epoch"] == 2 and again.state_dict()["batch"] == 0


def test_a_quarter_cache_serves_no_wrong_byte_and_the_workers_say_where_they_read(tmp_path):
    catalog = make_files(tmp_path / "src", n=120)
    total = sum(os.path.getsize(catalog.source_path(i)) for i in range(len(catalog)))
    with prestage.torch.StagedSampler(catalog, batch_size=10, stage_dir=tmp_path / "stage", num_workers=2,
                                      cache_bytes=total // 4, stage_patience=None) as sampler:
        dataset = prestage.torch.StagedDataset(sampler, read=digest)
        loader = sampler.data_loader(dataset, collate_fn=keep)
        seen = 0
        for epoch in range(3):
            sampler.set_epoch(epoch)
            for items in loader:
                for sha, _, index in items:
                    assert sha == source_digest(catalog, index)
                    seen += 1
        stats = sampler.stats()
    assert seen == 3 * len(catalog)
    assert sampler.stats()["worker_staged"] == stats["worker_staged"]  # kept after close()
    assert not list((tmp_path / "stage").glob("prestage-*/workers-*.counts"))  # removed by close()
    assert stats["worker_staged"] + stats["worker_source"] == seen
    assert stats["worker_staged"] > 0 and stats["worker_source"] > 0  # a quarter fits
    assert stats["misses"] > 0 and stats["stage_bytes_peak"] <= total // 4


def rss_kb(sample, label):
    data = bytes(sample.bytes())
    usage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return len(data), usage


def test_worker_memory_stays_flat_and_only_indices_cross(tmp_path):
    catalog = make_files(tmp_path / "src", n=240, sizes=(96_000, 160_000))  # about 30 MB
    with prestage.torch.StagedSampler(catalog, batch_size=16, stage_dir=tmp_path / "stage",
                                      num_workers=2) as sampler:
        dataset = prestage.torch.StagedDataset(sampler, read=rss_kb)
        assert len(pickle.dumps(dataset)) < 1024  # three paths and a function's name: no catalog, no bytes
        batches = list(iter(sampler))
        assert all(isinstance(i, int) for batch in batches for i in batch)
        sampler.set_epoch(1)
        peaks = [max(r for _, r in items)
                 for items in sampler.data_loader(dataset, multiprocessing_context="spawn", collate_fn=keep)]
    # The peak RSS of the workers after the first batches against the epoch's end: flat. Each worker
    # reads about 15 MB in the epoch: kept (pickled in, or held by the wrapper), they would show.
    assert peaks[-1] - peaks[2] < 4096, peaks


def unlink_then_read(sample, label):
    if sample.tier == "stage" and sample.index % 3 == 0:
        os.unlink(sample.path)  # as an eviction between the look and the read
    return digest(sample, label)


def test_a_copy_evicted_under_a_worker_is_read_from_the_source(tmp_path):
    catalog = make_files(tmp_path / "src", n=48)
    with prestage.torch.StagedSampler(catalog, batch_size=8, stage_dir=tmp_path / "stage",
                                      stage_patience=None) as sampler:
        list(iter(sampler))  # the whole set staged
        sampler.set_epoch(1)
        dataset = prestage.torch.StagedDataset(sampler, read=unlink_then_read)
        for items in sampler.data_loader(dataset, collate_fn=keep):
            for sha, _, index in items:
                assert sha == source_digest(catalog, index)
        stats = sampler.stats()
    assert stats["worker_gone"] == len(range(0, 48, 3))


def test_a_missing_source_file_is_the_users_error_naming_it(tmp_path):
    catalog = make_files(tmp_path / "src", n=16)
    missing = Path(catalog.source_path(5))
    missing.unlink()
    with prestage.torch.StagedSampler(catalog, batch_size=4, stage_dir=tmp_path / "stage",
                                      shuffle=False) as sampler:
        dataset = prestage.torch.StagedDataset(sampler, read=digest)
        with pytest.raises(FileNotFoundError, match="f0005.bin"):
            for _ in sampler.data_loader(dataset, collate_fn=keep):
                pass


def test_an_unusable_stage_directory_means_source_reads_not_a_failure(tmp_path):
    catalog = make_files(tmp_path / "src", n=24)
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(OSError):  # the area cannot be made under a file
        prestage.torch.StagedSampler(catalog, batch_size=4, stage_dir=not_a_dir)
    ro = tmp_path / "ro"
    ro.mkdir()
    with prestage.torch.StagedSampler(catalog, batch_size=4, stage_dir=ro, cache_bytes=1) as sampler:
        # A bound of one byte: nothing fits, every sample is read from the source.
        dataset = prestage.torch.StagedDataset(sampler, read=digest)
        n = 0
        for items in sampler.data_loader(dataset, collate_fn=keep):
            for sha, _, index in items:
                assert sha == source_digest(catalog, index)
                n += 1
        stats = sampler.stats()
    assert stats["worker_source"] == n == len(catalog)


def test_packed_samples_are_byte_ranges_of_the_staged_shard(tmp_path):
    make_files(tmp_path / "src", n=40)
    packing.pack(tmp_path / "src", tmp_path / "packed", shard_bytes=20_000)
    packed = prestage.Catalog.from_shards(tmp_path / "packed")
    source = prestage.Catalog.from_folder(tmp_path / "src", [])
    with prestage.torch.StagedSampler(packed, batch_size=8, stage_dir=tmp_path / "stage",
                                      stage_patience=None) as sampler:
        dataset = prestage.torch.StagedDataset(sampler, read=digest)
        list(iter(sampler))
        for i in range(len(packed)):
            sample = dataset.locate(i)
            assert sample.tier == "stage" and sample.length is not None
            assert sample.path == sampler._loader._loader.staged_path(i)  # the workers' naming is the core's
            view = sample.bytes()
            assert view.readonly
            assert hashlib.sha256(view).hexdigest() == source_digest(source, i)


def test_the_workers_find_copies_by_the_stage_directorys_own_names(tmp_path):
    """The stage directory's layout is named in C++ alone: prestage.staging takes the area and each
    copy's path from the core, so a worker looks where stage 2 wrote. 300 files: ids past the 256
    shard folders."""
    catalog = make_files(tmp_path / "src", n=300, sizes=(10, 50))
    stage = tmp_path / "stage"
    area = prestage._core.stage_area(stage, catalog)
    assert area == str(stage / f"prestage-{catalog.fingerprint:016x}")  # tiers/stage_directory.hpp's layout
    with prestage.torch.StagedSampler(catalog, batch_size=50, stage_dir=stage,
                                      stage_patience=None) as sampler:
        dataset = prestage.torch.StagedDataset(sampler, read=digest)
        list(iter(sampler))
        for i in range(len(catalog)):
            file = catalog.locator(i)[0]
            path = prestage._core.staged_copy_path(area, file)
            assert path == os.path.join(area, f"{file % 256:02x}", f"{file:x}")
            assert path == sampler._loader._loader.staged_path(i)  # where stage 2 wrote it
            sample = dataset.locate(i)
            assert (sample.tier, sample.path) == ("stage", path)
            assert hashlib.sha256(sample.bytes()).hexdigest() == source_digest(catalog, i)


def test_bad_arguments(tmp_path):
    catalog = make_files(tmp_path / "src", n=8)
    with pytest.raises(prestage.ConfigError, match="stage_dir"):
        prestage.torch.StagedSampler(catalog, batch_size=4, stage_dir="")
    with pytest.raises(TypeError, match="decode"):
        prestage.torch.StagedSampler(catalog, batch_size=4, stage_dir=tmp_path / "s", decode="jpeg")
    with pytest.raises(prestage.ConfigError, match="num_workers"):
        prestage.torch.StagedSampler(catalog, batch_size=4, stage_dir=tmp_path / "s", num_workers=-1)
    with prestage.torch.StagedSampler(catalog, batch_size=4, stage_dir=tmp_path / "s") as sampler:
        with pytest.raises(prestage.ConfigError, match="read= or dataset="):
            prestage.torch.StagedDataset(sampler)
        with pytest.raises(prestage.ConfigError, match="loader"):
            prestage.torch.StagedDataset(sampler, dataset=[1, 2, 3])
        with pytest.raises(TypeError, match="batch_sampler"):
            sampler.data_loader([], batch_sampler=None)
        with pytest.raises(IndexError):
            prestage.torch.StagedDataset(sampler, read=digest)[len(catalog)]


# ---------------------------------------------------------------- an ImageFolder through the wrapper

class FolderOfImages:
    """What torchvision's ImageFolder is to the wrapper: `samples` of (path, target), a `loader(path)`
    attribute, a transform; built here from PIL so that the test runs without torchvision."""

    def __init__(self, root):
        from PIL import Image

        self.root = str(root)
        self.classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
        self.samples = [(os.path.join(root, c, f), k) for k, c in enumerate(self.classes)
                        for f in sorted(os.listdir(os.path.join(root, c)))]
        self.opened = []
        self.loader = self._open
        self._image = Image

    def _open(self, path):
        self.opened.append(path)
        with open(path, "rb") as f:
            return self._image.open(f).convert("RGB")

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, target = self.samples[i]
        image = self.loader(path).resize((32, 24))
        return torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1), target


def test_an_imagefolder_like_dataset_reads_the_staged_copies_and_gives_the_same_tensors(tmp_path):
    from prestage.synth import make_synthetic_set

    make_synthetic_set(tmp_path / "src", images=24, classes=3, seed=1, workers=1, progress=False)
    folder = FolderOfImages(tmp_path / "src")
    catalog = prestage.torch.catalog_of(folder)
    assert [catalog.label(i) for i in range(len(catalog))] == [t for _, t in folder.samples]
    with prestage.torch.StagedSampler(catalog, batch_size=6, stage_dir=tmp_path / "stage",
                                      stage_patience=None) as sampler:
        list(iter(sampler))
        sampler.set_epoch(1)
        staged = prestage.torch.StagedDataset(sampler, dataset=folder)
        for batch in sampler.data_loader(staged):
            images, targets = batch
            assert images.shape == (6, 3, 24, 32)
        for i in range(len(folder)):
            image, target = staged[i]
            direct, direct_target = FolderOfImages(tmp_path / "src")[i]
            assert torch.equal(image, direct) and target == direct_target
    assert folder.opened and all(str(tmp_path / "stage") in p for p in folder.opened)
    assert folder.loader == folder._open  # given back


def test_torchvision_imagefolder_with_a_v2_pipeline(tmp_path):
    datasets = pytest.importorskip("torchvision.datasets")
    v2 = pytest.importorskip("torchvision.transforms.v2")
    from prestage.synth import make_synthetic_set

    make_synthetic_set(tmp_path / "src", images=20, classes=2, seed=2, workers=1, progress=False)
    transform = v2.Compose([v2.PILToTensor(), v2.Resize((40, 40), antialias=True), v2.CenterCrop(32),
                            v2.ToDtype(torch.float32, scale=True)])
    folder = datasets.ImageFolder(tmp_path / "src", transform=transform)
    catalog = prestage.torch.catalog_of(folder)
    with prestage.torch.StagedSampler(catalog, batch_size=5, stage_dir=tmp_path / "stage", num_workers=2,
                                      stage_patience=None) as sampler:
        staged = prestage.torch.StagedDataset(sampler, dataset=folder)
        for epoch in range(2):
            sampler.set_epoch(epoch)
            for images, targets in sampler.data_loader(staged):
                assert images.shape == (5, 3, 32, 32)
        for i in range(len(folder)):
            image, target = staged[i]
            assert staged.locate(i).tier == "stage"
            direct, direct_target = datasets.ImageFolder(tmp_path / "src", transform=transform)[i]
            assert torch.equal(image, direct) and target == direct_target
        assert sampler.stats()["worker_staged"] > 0


def test_a_saved_catalogs_path_is_taken_as_the_catalog(tmp_path):
    """As prestage.Loader and the adaptors take it: the same batches as the catalog object gives."""
    catalog = make_files(tmp_path / "src", n=24)
    catalog.save(tmp_path / "train.catalog")
    plan = dict(batch_size=5, seed=3)
    for given in (str(tmp_path / "train.catalog"), tmp_path / "train.catalog"):
        with prestage.torch.StagedSampler(given, stage_dir=tmp_path / "stage", **plan) as sampler:
            assert list(sampler) == reference_batches(catalog, **plan)
