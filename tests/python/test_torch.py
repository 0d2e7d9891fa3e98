"""prestage.torch: zero-copy tensors, DataLoader interop, exact resume, and DDP sharding over gloo."""

import io
import json
import math
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import prestage

torch = pytest.importorskip("torch")
import prestage.torch as pt  # noqa: E402  (after the importorskip)

pytestmark = pytest.mark.torch


def numpy_epochs(cat, epochs, **kwargs):
    """The NumPy loader's batches (images NHWC, labels), copied: the oracle the tensors must equal."""
    out = []
    with prestage.Loader(cat, **kwargs) as loader:
        for _ in range(epochs):
            out.append([(b.images.copy(), b.labels.copy()) for b in loader])
    return out


def tensors_epoch(loader):
    """One epoch of a prestage.torch.Loader as NHWC uint8 NumPy copies and labels."""
    return [(images.permute(0, 2, 3, 1).numpy().copy(), labels.numpy().copy()) for images, labels in loader]


def locked_kib(address):
    """The page-locked kB of the mapping that holds `address`, as the kernel reports it (0 if none)."""
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if not head.endswith(":"):  # a mapping's first line: "start-end perms ..."
                start, end = (int(x, 16) for x in head.split("-"))
                inside = start <= address < end
            elif inside and head == "Locked:":
                return int(line.split()[1])
    return 0


def assert_pinned_as_reported(tensor, pinned):
    """The memory under `tensor` is pinned as stats()["pinned"] says: registered with CUDA (torch sees it
    as pinned), page-locked by mlock (the kernel counts it as locked), or neither."""
    if pinned == "cuda":
        assert tensor.is_pinned()
    elif pinned == "mlock":
        assert locked_kib(tensor.data_ptr()) > 0
    else:
        assert pinned == "none"


def assert_same_batches(got, expected):
    assert len(got) == len(expected)
    for (gi, gl), (ei, el) in zip(got, expected):
        np.testing.assert_array_equal(gl, el)
        np.testing.assert_array_equal(gi, ei)


def test_import_prestage_does_not_import_the_frameworks():
    code = "import sys, prestage; print(sorted({'torch', 'tensorflow'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("layout,dtype", [("NHWC", "uint8"), ("NCHW", "float32")])
def test_as_tensors_views_the_batch_buffer(folder, layout, dtype):
    cat = prestage.Catalog.from_folder(folder)
    with prestage.Loader(cat, batch_size=4, layout=layout, dtype=dtype) as loader:
        batch = next(iter(loader))
        images, labels = pt.as_tensors(batch)
        assert images.data_ptr() == batch.images.ctypes.data
        assert labels.data_ptr() == batch.labels.ctypes.data
        assert images.is_contiguous() and images.dtype == getattr(torch, dtype)
        assert images.shape == ((4, 32, 48, 3) if layout == "NHWC" else (4, 3, 32, 48))
        np.testing.assert_array_equal(images.numpy(), batch.images)
        np.testing.assert_array_equal(labels.numpy(), batch.labels)


def test_tensors_share_the_ring_and_stay_valid_while_referenced(folder):
    cat = prestage.Catalog.from_folder(folder)  # 21 samples: 6 batches of 4
    expected = numpy_epochs(cat, 1, batch_size=4, shuffle=False)[0]
    with pt.Loader(cat, batch_size=4, depth=2, shuffle=False, layout="NHWC") as loader:
        it = iter(loader)
        held, held_labels = next(it)
        snapshot = held.clone()
        pointers = set()
        # With `held` lent, every other batch must go through the ring's one other buffer: so each is
        # given back when its tensors are collected, and never copied. (No enumerate(): it would keep the
        # previous batch referenced while the next is asked for, and depth=2 leaves no room for that.)
        k = 0
        for images, labels in it:
            k += 1
            assert images.data_ptr() != held.data_ptr()
            pointers.add(images.data_ptr())
            np.testing.assert_array_equal(images.numpy(), expected[k][0])
            np.testing.assert_array_equal(labels.numpy(), expected[k][1])
            del images, labels
        assert k == 5 and len(pointers) == 1
        # The ring's buffers are page-aligned; a copy made by torch's allocator (64-byte aligned) would
        # not all be.
        page = os.sysconf("SC_PAGE_SIZE")
        assert held.data_ptr() % page == 0 and next(iter(pointers)) % page == 0
        pinned = loader.stats()["pinned"]  # the ring's buffers are pinned; a copy would not be
        assert_pinned_as_reported(held, pinned)
        if pinned == "mlock":  # the other buffer too (its tensors are gone: by address)
            assert locked_kib(next(iter(pointers))) > 0
        torch.testing.assert_close(held, snapshot, rtol=0, atol=0)
        np.testing.assert_array_equal(held.numpy(), expected[0][0])
        np.testing.assert_array_equal(held_labels.numpy(), expected[0][1])


def test_yields_the_numpy_loaders_batches_directly_and_through_a_dataloader(folder):
    cat = prestage.Catalog.from_folder(folder)
    kwargs = dict(batch_size=4, image_size=(16, 16), seed=7)
    expected = numpy_epochs(cat, 2, **kwargs)
    loader = pt.Loader(cat, **kwargs)
    assert len(loader) == len(expected[0]) == 6
    assert_same_batches(tensors_epoch(loader), expected[0])
    assert loader.epoch == 1
    loader.set_epoch(0)  # as DistributedSampler.set_epoch: the same order again
    data = torch.utils.data.DataLoader(loader, batch_size=None)
    assert len(data) == 6
    assert_same_batches(tensors_epoch(data), expected[0])
    assert_same_batches(tensors_epoch(data), expected[1])  # epochs advance through the DataLoader too
    loader.close()


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_float32_output_is_normalised_like_torchvision_without_a_copy(folder, layout):
    cat = prestage.Catalog.from_folder(folder)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    expected = numpy_epochs(cat, 1, batch_size=8, shuffle=False)[0]  # uint8 NHWC
    with pt.Loader(cat, batch_size=8, shuffle=False, layout=layout, dtype=torch.float32, mean=mean,
                   std=std) as loader:
        pinned = loader.stats()["pinned"]
        for (images, labels), (ei, el) in zip(loader, expected):
            assert images.dtype == torch.float32 and images.is_contiguous()
            assert_pinned_as_reported(images, pinned)  # decoded in place into the ring's buffer
            want = (ei.astype(np.float32) / 255 - np.float32(mean)) / np.float32(std)
            if layout == "NCHW":
                want = want.transpose(0, 3, 1, 2)
            np.testing.assert_allclose(images.numpy(), want, rtol=1e-5, atol=1e-5)
            np.testing.assert_array_equal(labels.numpy(), el)
    with pt.Loader(cat, batch_size=8, shuffle=False, dtype="float32", std=0.5) as loader:  # mean 0
        images, _ = next(iter(loader))
        want = expected[0][0].astype(np.float32).transpose(0, 3, 1, 2) / 255 / 0.5
        np.testing.assert_allclose(images.numpy(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("world_size,rank", [(1, 0), (2, 1)])
def test_resume_mid_epoch_gives_the_remaining_batches_with_other_thread_counts(make_folder, world_size,
                                                                             rank):
    cat = prestage.Catalog.from_folder(make_folder(3, 9))  # 27 samples
    plan = dict(batch_size=3, image_size=(8, 8), seed=11, rank=rank, world_size=world_size,
                transform="random-resized-crop")  # the augmentation is replayed too
    reference = pt.Loader(cat, **plan)
    epochs = [tensors_epoch(reference) for _ in range(3)]
    reference.close()
    per_epoch = len(epochs[0])
    assert per_epoch >= 4

    first = pt.Loader(cat, readers=1, prefetchers=1, depth=2, **plan)
    tensors_epoch(first)  # epoch 0
    taken = []
    for k, batch in enumerate(first):  # epoch 1, stopped mid-way as a checkpoint would be taken
        taken.append(tuple(t.numpy().copy() for t in batch))
        if k == 1:
            break
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)  # through a checkpoint file, as a trainer would
    first.close()
    del batch

    resumed = pt.Loader(cat, readers=3, prefetchers=5, lookahead=2, depth=5, **plan)
    resumed.load_state_dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))
    rest = tensors_epoch(resumed)
    assert len(rest) == per_epoch - 2
    assert_same_batches(rest, epochs[1][2:])
    assert_same_batches(tensors_epoch(resumed), epochs[2])  # and on into the next epoch
    resumed.close()


def test_resume_refuses_another_plan(folder):
    cat = prestage.Catalog.from_folder(folder)
    with pt.Loader(cat, batch_size=4, seed=1) as loader:
        state = loader.state_dict()
    with pt.Loader(cat, batch_size=4, seed=2) as other, pytest.raises(prestage.ConfigError, match="seed"):
        other.load_state_dict(state)


def test_rank_and_world_size_come_from_the_environment(folder, monkeypatch):
    cat = prestage.Catalog.from_folder(folder)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pt.Loader(cat, batch_size=2, image_size=(8, 8), shuffle=False) as loader:
        assert (loader.rank, loader.world_size) == (2, 3)
        labels = np.concatenate([lab.numpy() for _, lab in loader])
    expected = np.concatenate(prestage.plan.epoch_batches(len(cat), 2, seed=0, epoch=0, shuffle=False,
                                                          rank=2, world_size=3))
    np.testing.assert_array_equal(labels, [cat.label(int(i)) for i in expected])
    with pt.Loader(cat, batch_size=2, rank=0, world_size=1) as explicit:  # arguments win
        assert (explicit.rank, explicit.world_size) == (0, 1)
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(prestage.ConfigError, match="WORLD_SIZE"):
        pt.Loader(cat, batch_size=2)
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(prestage.ConfigError, match="WORLD_SIZE"):
        pt.Loader(cat, batch_size=2)


@pytest.mark.parametrize("kwargs", [
    {"layout": "CHW"}, {"dtype": torch.float16}, {"dtype": "int8"}, {"mean": 0.5},
    {"dtype": torch.float32, "std": 0}, {"dtype": torch.float32, "mean": (0.5, 0.5)},
    {"num_workers": 4}, {"sampler": None}, {"collate_fn": None}, {"pin_memory": True},
    {"batch_size": 0}, {"rank": 3, "world_size": 2}, {"transform": "flip"},
])
def test_bad_options_raise_config_error(folder, kwargs):
    cat = prestage.Catalog.from_folder(folder)
    with pytest.raises(prestage.ConfigError):
        pt.Loader(cat, **{"batch_size": 4, **kwargs})


def test_unknown_keyword_is_a_type_error_and_worker_processes_are_refused(folder, monkeypatch):
    cat = prestage.Catalog.from_folder(folder)
    with pytest.raises(TypeError, match="bogus"):
        pt.Loader(cat, batch_size=4, bogus=1)
    with pt.Loader(cat, batch_size=4) as loader:
        with pytest.raises(prestage.ConfigError, match="another process"):
            pickle.dumps(loader)
        monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())
        with pytest.raises(prestage.ConfigError, match="num_workers=0"):
            iter(loader)


def test_batches_stay_lent_until_device_copies_from_them_finish(make_folder, monkeypatch):
    """The CUDA path, with the stream events replaced by fakes that complete only when told to."""
    events = []

    class FakeEvent:
        def __init__(self):
            self.done = False
            self.waited = False
            events.append(self)

        def query(self):
            return self.done

        def synchronize(self):
            self.done = self.waited = True

    monkeypatch.setattr(pt, "_cuda_in_use", lambda: True)
    monkeypatch.setattr(pt, "_record_stream_event", FakeEvent)
    cat = prestage.Catalog.from_folder(make_folder(2, 12))  # 24 samples: 12 batches of 2
    depth = 3
    pointers = []
    with pt.Loader(cat, batch_size=2, depth=depth, image_size=(8, 8), shuffle=False) as loader:
        for k, (images, labels) in enumerate(loader):
            # events[i] was recorded when batch i + 1 was asked for: until it completes, batch i's
            # buffer may be under a copy and must not be refilled.
            assert len(events) == k
            busy = {pointers[i] for i, e in enumerate(events) if not e.done}
            assert images.data_ptr() not in busy
            pointers.append(images.data_ptr())
            if k == 5:
                events[3].done = events[4].done = True  # the device caught up
            del images, labels
        assert len(pointers) == len(loader) == 12
        assert len(set(pointers)) == depth  # zero copy: the ring's buffers and no others
        assert all(p % os.sysconf("SC_PAGE_SIZE") == 0 for p in pointers)  # page-aligned, as they are
        assert any(e.waited for e in events)  # held batches are bounded: the oldest was waited for
        assert not events[3].waited and not events[4].waited
    assert all(e.done for e in events)  # close() waits for every copy


# ------------------------------------------------------------------------------------------------
# Distributed: real processes, gloo over loopback.

_DDP_WORKER = textwrap.dedent("""
    import datetime, json, sys
    import torch, torch.distributed as dist
    import prestage, prestage.torch

    init_file, root, rank, world, batch_size, out = sys.argv[1:7]
    rank, world, batch_size = int(rank), int(world), int(batch_size)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    folder = prestage.Catalog.from_folder(root)
    n = len(folder)
    # Label = catalog index, so that the labels say which samples a rank got.
    cat = prestage.Catalog.from_paths(root, [folder.path(i) for i in range(n)], labels=list(range(n)))
    result = {}
    for drop_last in (False, True):
        loader = prestage.torch.Loader(cat, batch_size=batch_size, image_size=(8, 8), seed=3,
                                       drop_last=drop_last, readers=1, prefetchers=1)
        assert (loader.rank, loader.world_size) == (rank, world)  # from torch.distributed
        epochs = []
        for epoch in range(2):
            samples, steps = [], 0
            for images, labels in loader:
                step = torch.ones(1)
                dist.all_reduce(step)  # as DDP's gradient all-reduce: hangs if a rank runs short
                assert int(step.item()) == world
                assert images.shape[0] == labels.shape[0]
                samples += labels.tolist()
                steps += 1
            epochs.append({"samples": samples, "steps": steps, "len": len(loader)})
        result[str(drop_last)] = epochs
        loader.close()
    dist.barrier()
    dist.destroy_process_group()
    with open(out, "w") as f:
        json.dump(result, f)
""")


@pytest.mark.parametrize("world", [2, 3])
def test_ddp_over_gloo_gives_equal_batches_and_covers_every_sample(make_folder, tmp_path, world):
    n, batch_size = 23, 3  # 23 is prime: no number of ranks divides it
    root = make_folder(1, n, size=(8, 8))
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    outs = [tmp_path / f"rank{r}.json" for r in range(world)]
    procs = [subprocess.Popen([sys.executable, "-c", _DDP_WORKER, str(tmp_path / "store"), str(root), str(r),
                               str(world), str(batch_size), str(outs[r])], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=120)[0])
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0] * world, "\n".join(logs)
    results = [json.loads(o.read_text()) for o in outs]

    # The oracle for drop_last=False: torch's DistributedSampler, which pads the epoch to a multiple of
    # the ranks by repeating a few samples.
    samplers = [torch.utils.data.DistributedSampler(range(n), num_replicas=world, rank=r, shuffle=True,
                                                    seed=3) for r in range(world)]
    sampler_counts = np.bincount(np.concatenate([list(s) for s in samplers]), minlength=n)
    for epoch in range(2):
        padded = [res["False"][epoch] for res in results]
        steps = {p["steps"] for p in padded} | {p["len"] for p in padded}
        assert steps == {math.ceil(len(samplers[0]) / batch_size)}  # equal on every rank
        for r in range(world):
            assert len(padded[r]["samples"]) == len(samplers[r])
        counts = np.bincount(np.concatenate([p["samples"] for p in padded]), minlength=n)
        assert counts.min() == 1  # every sample
        assert sorted(counts) == sorted(sampler_counts)  # repeats: exactly as many as the sampler's

        dropped = [res["True"][epoch] for res in results]
        whole = n // (batch_size * world)  # whole global batches
        assert {d["steps"] for d in dropped} | {d["len"] for d in dropped} == {whole}
        seen = np.concatenate([d["samples"] for d in dropped])
        assert len(seen) == whole * batch_size * world and len(set(seen.tolist())) == len(seen)
    for r in range(world):  # a new shuffle each epoch
        assert results[r]["False"][0]["samples"] != results[r]["False"][1]["samples"]


@pytest.mark.gpu
def test_non_blocking_copies_to_cuda_get_the_batches(make_folder):
    cat = prestage.Catalog.from_folder(make_folder(4, 16, size=(64, 64)))
    expected = numpy_epochs(cat, 1, batch_size=4, seed=5)[0]
    on_device = []
    with pt.Loader(cat, batch_size=4, seed=5, depth=2) as loader:  # few buffers: reused quickly
        for images, labels in loader:
            on_device.append((images.to("cuda", non_blocking=True), labels.to("cuda", non_blocking=True)))
            del images, labels  # the loader keeps the buffer lent until the copy is done
    torch.cuda.synchronize()
    assert_same_batches([(i.permute(0, 2, 3, 1).cpu().numpy(), lab.cpu().numpy()) for i, lab in on_device],
                        expected)


def test_on_error_skip_is_passed_through(make_folder):
    root = make_folder(3, 8)
    cat = prestage.Catalog.from_folder(root)  # 24 images of 32x48
    bad = [3, 11, 17]
    for i in bad:
        cat.source_path(i).write_bytes(b"not a jpeg")
    cat = prestage.Catalog.from_folder(root)  # of their sizes now: a changed size is an IoError
    with pt.Loader(cat, batch_size=6, seed=2) as loader, pytest.raises(prestage.DecodeError):
        for _ in loader:
            pass
    with pt.Loader(cat, batch_size=6, seed=2, on_error="skip") as loader:
        batches = [(images.shape, labels.shape) for images, labels in loader]
        assert loader.stats()["skipped"] == len(bad)
    assert batches == [(torch.Size([6, 3, 32, 48]), torch.Size([6]))] * 4


def test_io_timeout_is_passed_through(stalled_catalog):
    with pt.Loader(stalled_catalog, batch_size=1, image_size=(32, 32), io_timeout=0.3) as loader:
        with pytest.raises(prestage.IoError, match="io_timeout"):
            next(iter(loader))


def test_tuned_file_fills_only_the_options_not_given(folder, tmp_path):
    tuned = tmp_path / "tuned.json"
    tuned.write_text(json.dumps({"options": {"readers": 1, "prefetchers": 9, "lookahead": 3, "depth": 5}}))
    cat = prestage.Catalog.from_folder(folder)
    with pt.Loader(cat, batch_size=4, readers=2, prefetchers=4, tuned=tuned) as loader:
        o = loader._loader.options
        assert (o.readers, o.prefetchers, o.lookahead, o.depth) == (2, 4, 3, 5)


def test_mean_and_std_with_uint8_are_refused_as_by_the_numpy_loader(folder):
    cat = prestage.Catalog.from_folder(folder)
    for make in (pt.Loader, prestage.Loader):
        with pytest.raises(prestage.ConfigError):
            make(cat, batch_size=4, mean=(0.5, 0.5, 0.5))


# ------------------------------------------------------------------------------------------------
# Device batches: device="cuda".

def test_device_arguments_are_checked(folder):
    cat = prestage.Catalog.from_folder(folder)
    for device in ("meta", "not-a-device", 3.5):
        with pytest.raises(prestage.ConfigError):
            pt.Loader(cat, batch_size=4, device=device)
    with pt.Loader(cat, batch_size=4, device="cpu") as loader:  # the host, as device=None
        assert loader.device is None
        images, _ = next(iter(loader))
        assert images.device.type == "cpu"
    with pytest.raises(prestage.ConfigError):  # normalising on the device needs one
        pt.Loader(cat, batch_size=4, dtype=torch.float32, normalize_on_device=True)
    with pytest.raises(prestage.ConfigError):
        pt.Loader(cat, batch_size=4, normalize_on_device=1)
    if not torch.cuda.is_available():
        with pytest.raises(prestage.ConfigError):  # said clearly, before any thread starts
            pt.Loader(cat, batch_size=4, device="cuda")
        with pytest.raises(prestage.ConfigError):
            pt.Loader(cat, batch_size=4, device=torch.device("cuda", 0), dtype=torch.float32,
                      normalize_on_device=True)


def test_normalize_on_device_arguments_are_checked(folder, monkeypatch):
    monkeypatch.setattr(pt, "_resolve_device", lambda device: torch.device("cuda", 0))
    monkeypatch.setattr(pt, "_make_copier", lambda device, normalize, layout: None)
    cat = prestage.Catalog.from_folder(folder)
    with pytest.raises(prestage.ConfigError):  # float32 out: it must be asked for
        pt.Loader(cat, batch_size=4, device="cuda", normalize_on_device=True)
    for mean, std in (((0.5, 0.5), 0.2), (0.5, 0.0), ("a", 1.0), (0.5, (0.1, -0.1, 0.1))):
        with pytest.raises(prestage.ConfigError):
            pt.Loader(cat, batch_size=4, device="cuda", dtype=torch.float32, normalize_on_device=True,
                      mean=mean, std=std)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_the_device_normalisation_is_the_cores(folder, layout):
    # What normalize_on_device applies on the GPU, computed here on the CPU from the uint8 batch, against
    # the core's own float32 output.
    cat = prestage.Catalog.from_folder(folder)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    scale, shift = pt._affine(pt._mean_std(mean, std), layout)
    with pt.Loader(cat, batch_size=8, shuffle=False, layout=layout) as u8, \
            pt.Loader(cat, batch_size=8, shuffle=False, layout=layout, dtype=torch.float32, mean=mean,
                      std=std) as f32:
        for (images, _), (want, _) in zip(u8, f32):
            torch.testing.assert_close(images.float().mul_(scale).add_(shift), want, rtol=1e-5, atol=1e-5)


class FakeCopier:
    """The CUDA side of device=, on the CPU: a copy is a clone, its event completes when the test says."""

    class Event:
        def __init__(self):
            self.done = self.waited = False

        def query(self):
            return self.done

        def synchronize(self):
            self.done = self.waited = True

    def __init__(self):
        self.copies = []  # (host images data_ptr, event), in order
        self.handed = []

    def copy(self, host):
        event = FakeCopier.Event()
        busy = {p for p, e in self.copies if not e.done}
        assert host[0].data_ptr() not in busy  # never refilled under a copy in flight
        self.copies.append((host[0].data_ptr(), event))
        return (host[0].clone(), host[1].clone()), event

    def hand_over(self, tensors, event):
        self.handed.append(event)


@pytest.mark.parametrize("depth", [2, 3, 4])
def test_device_batches_are_copied_one_ahead_and_host_buffers_held_until_copied(make_folder, monkeypatch,
                                                                              depth):
    copier = FakeCopier()
    monkeypatch.setattr(pt, "_resolve_device", lambda device: torch.device("cuda", 0))
    monkeypatch.setattr(pt, "_make_copier", lambda device, normalize, layout: copier)
    cat = prestage.Catalog.from_folder(make_folder(2, 12))  # 24 samples: 12 batches of 2
    expected = numpy_epochs(cat, 1, batch_size=2, image_size=(8, 8), shuffle=False)[0]
    got = []
    with pt.Loader(cat, batch_size=2, depth=depth, image_size=(8, 8), shuffle=False,
                   device="cuda") as loader:
        for k, (images, labels) in enumerate(loader):
            # Batch k + 1's copy is enqueued before batch k is handed over: it overlaps k's step.
            assert len(copier.copies) == min(k + 2, 12)
            assert copier.handed[-1] is copier.copies[k][1]
            assert len(loader._in_flight) <= depth - 1  # one buffer is always left to the ring
            got.append((images.permute(0, 2, 3, 1).numpy(), labels.numpy()))
            if k == 6:
                for _, event in copier.copies:
                    event.done = True  # the device caught up: nothing waited for after this
                waited = sum(e.waited for _, e in copier.copies)
        assert sum(e.waited for _, e in copier.copies[:8]) == waited
        assert len(set(p for p, _ in copier.copies)) <= depth
    assert_same_batches(got, expected)
    assert all(e.done for _, e in copier.copies) and len(loader._in_flight) == 0  # close() drained


def test_device_batches_raise_a_batchs_error_at_that_batch(make_folder, monkeypatch):
    copier = FakeCopier()
    monkeypatch.setattr(pt, "_resolve_device", lambda device: torch.device("cuda", 0))
    monkeypatch.setattr(pt, "_make_copier", lambda device, normalize, layout: copier)
    root = make_folder(1, 8)
    prestage.Catalog.from_folder(root).source_path(5).write_bytes(b"not a jpeg")  # batch 2 of 4
    cat = prestage.Catalog.from_folder(root)  # of its size now (batches of 2, no shuffle)
    with pt.Loader(cat, batch_size=2, depth=3, shuffle=False, device="cuda") as loader:
        it = iter(loader)
        next(it), next(it)
        with pytest.raises(prestage.DecodeError):
            next(it)
        images, labels = next(it)  # iteration goes on with the next batch
        assert labels.tolist() == [0, 0] and len(copier.handed) == 3
        with pytest.raises(StopIteration):
            next(it)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_device_batches_on_cuda_equal_the_host_batches(make_folder, layout):
    cat = prestage.Catalog.from_folder(make_folder(4, 16, size=(64, 64)))
    expected = numpy_epochs(cat, 1, batch_size=4, seed=5)[0]
    got = []
    with pt.Loader(cat, batch_size=4, seed=5, depth=2, layout=layout, device="cuda") as loader:
        assert loader.stats()["pinned"] == "cuda"
        for images, labels in loader:
            assert images.device.type == "cuda" and labels.device.type == "cuda"
            torch.cuda._sleep(1_000_000)  # a slow step on the current stream: copies run meanwhile
            nhwc = images.permute(0, 2, 3, 1) if layout == "NCHW" else images
            got.append((nhwc.cpu().numpy(), labels.cpu().numpy()))
    assert_same_batches(got, expected)


@pytest.mark.gpu
def test_normalize_on_device_on_cuda_equals_the_cores_float32(make_folder):
    cat = prestage.Catalog.from_folder(make_folder(2, 8, size=(32, 32)))
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    kwargs = dict(batch_size=4, seed=1, dtype=torch.float32, mean=mean, std=std)
    with pt.Loader(cat, **kwargs) as host:
        want = [images.clone() for images, _ in host]
    with pt.Loader(cat, device="cuda", normalize_on_device=True, **kwargs) as loader:
        got = [images for images, _ in loader]
    assert all(g.dtype == torch.float32 and g.device.type == "cuda" for g in got)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_registered_buffers_are_pinned_for_torch(folder):
    cat = prestage.Catalog.from_folder(folder)
    with pt.Loader(cat, batch_size=4, pin_memory=True) as loader:
        assert loader.stats()["pinned"] == "cuda"
        images, labels = next(iter(loader))
        assert images.is_pinned()
