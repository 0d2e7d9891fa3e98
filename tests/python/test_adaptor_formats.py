"""Every decode mode through prestage.torch.Loader, each sample read against an independent oracle: NumPy
for .npy/.npz, h5py for HDF5, the bytes written for raw samples. The tensors must view the batch buffer.
(prestage.tf.dataset's formats: test_tf_formats.py.)"""

import h5py
import numpy as np
import pytest

import prestage

torch = pytest.importorskip("torch")
import prestage.torch as pt  # noqa: E402  (after the importorskip)
from prestage.plan import epoch_batches  # noqa: E402

pytestmark = pytest.mark.torch


def _inside(tensor, buffers):
    """Whether ``tensor``'s data lie inside one of ``buffers`` ((address, size) pairs)."""
    start, size = tensor.data_ptr(), tensor.numel() * tensor.element_size()
    return any(a <= start and start + size <= a + n for a, n in buffers)


def _record_buffers(monkeypatch):
    """Records the (address, size) of each batch buffer the torch adaptor turns into tensors."""
    buffers = []
    real = pt._tensors

    def spy(batch, jpeg):
        buffers.append((batch.data.ctypes.data, batch.data.nbytes))
        buffers.append((batch.labels.ctypes.data, batch.labels.nbytes))
        return real(batch, jpeg)

    monkeypatch.setattr(pt, "_tensors", spy)
    return buffers


def _write_npy(root, shapes, dtype, order="C", rng=None):
    rng = rng or np.random.default_rng(0)
    (root / "c").mkdir(parents=True)
    for i, shape in enumerate(shapes):
        a = np.array(rng.integers(0, 100, size=shape).astype(dtype), order=order)
        np.save(root / "c" / f"{i:03d}.npy", a)
    return prestage.Catalog.from_folder(root, extensions=[".npy"])


@pytest.mark.parametrize("dtype,order", [(np.float32, "C"), (">f8", "C"), (np.int16, "F"), (np.uint16, "C"),
                                         (np.bool_, "C"), (np.complex64, "F")])
def test_torch_npy_of_one_shape_is_one_tensor_equal_to_numpy(tmp_path, dtype, order):
    cat = _write_npy(tmp_path, [(3, 4, 2)] * 7, dtype, order)
    seen = set()
    with pt.Loader(cat, batch_size=3, decode="npy", seed=4) as loader:
        assert len(loader) == 3
        for arrays, labels in loader:
            assert isinstance(arrays, torch.Tensor) and arrays.shape[1:] == (3, 4, 2)
            assert labels.dtype == torch.int64 and labels.tolist() == [0] * len(labels)
            for k in range(len(arrays)):
                # The padded last batch repeats samples: find each by value among the files.
                got = arrays[k].numpy()
                assert got.dtype == np.dtype(dtype).newbyteorder("=")
                matches = [i for i in range(len(cat)) if np.array_equal(got, np.load(cat.source_path(i)))]
                assert matches
                seen.update(matches)
    assert seen == set(range(len(cat)))


def test_torch_arrays_share_memory_with_the_batch_buffer(tmp_path, monkeypatch):
    cat = _write_npy(tmp_path, [(5, 2)] * 4 + [(3, 2)] * 2, np.float32)
    with prestage.Loader(cat, batch_size=6, decode="npy", shuffle=False) as loader:
        batch = next(iter(loader))
        arrays, labels = pt.as_tensors(batch)
        assert isinstance(arrays, list) and len(arrays) == 6
        for k, t in enumerate(arrays):
            assert np.shares_memory(t.numpy(), batch.data)
            np.testing.assert_array_equal(t.numpy(), np.load(cat.source_path(int(batch.indices[k]))))
        assert np.shares_memory(labels.numpy(), batch.labels)
    buffers = _record_buffers(monkeypatch)
    with pt.Loader(cat, batch_size=2, decode="npy", shuffle=False) as loader:
        for arrays, labels in loader:
            assert all(_inside(t, buffers) for t in pt._each(arrays)) and _inside(labels, buffers)


def test_torch_ragged_npy_is_a_list_of_views(tmp_path, monkeypatch):
    buffers = _record_buffers(monkeypatch)
    shapes = [(i + 1, 3) for i in range(8)]
    cat = _write_npy(tmp_path, shapes, np.int32)
    order = epoch_batches(len(cat), 3, seed=9, epoch=0)
    with pt.Loader(cat, batch_size=3, decode="npy", seed=9) as loader:
        for b, (arrays, _) in enumerate(loader):
            assert isinstance(arrays, list) and len(arrays) == len(order[b])
            for t, i in zip(arrays, order[b]):
                np.testing.assert_array_equal(t.numpy(), np.load(cat.source_path(i)))
                assert _inside(t, buffers)


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_torch_npz_member_equals_numpy(tmp_path, save):
    rng = np.random.default_rng(2)
    (tmp_path / "x").mkdir()
    for i in range(5):
        save(tmp_path / "x" / f"{i}.npz", image=rng.normal(size=(2, 3)), mask=rng.integers(0, 9, (2, 3)))
    cat = prestage.Catalog.from_folder(tmp_path, extensions=[".npz"])
    order = epoch_batches(len(cat), 2, seed=0, epoch=0)
    with pt.Loader(cat, batch_size=2, decode="npz", array_name="mask") as loader:
        for b, (arrays, _) in enumerate(loader):
            for t, i in zip(arrays, order[b]):
                with np.load(cat.source_path(i)) as npz:
                    np.testing.assert_array_equal(t.numpy(), npz["mask"])


def test_torch_hdf5_rows_and_labels_equal_h5py_from_a_saved_catalog(tmp_path):
    rng = np.random.default_rng(3)
    path = tmp_path / "d.h5"
    with h5py.File(path, "w") as h5:
        h5["x"] = rng.normal(size=(9, 4, 4)).astype(">f4")
        h5["y"] = np.arange(9, dtype=np.int64) * 3 - 5
    prestage.Catalog.from_hdf5([path], "x", labels="y").save(tmp_path / "cat.bin")
    with h5py.File(path, "r") as h5:
        x, y = h5["x"][()], h5["y"][()]
    order = epoch_batches(9, 4, seed=1, epoch=0)
    with pt.Loader(tmp_path / "cat.bin", batch_size=4, seed=1) as loader:  # decode="hdf5" inferred
        for b, (arrays, labels) in enumerate(loader):
            np.testing.assert_array_equal(arrays.numpy(), x[order[b]])
            np.testing.assert_array_equal(labels.numpy(), y[order[b]])


def test_torch_raw_bytes_of_different_lengths_are_a_list(tmp_path):
    (tmp_path / "c").mkdir()
    blobs = [bytes(range(i, i + 3 * i + 1)) for i in range(6)]
    for i, blob in enumerate(blobs):
        (tmp_path / "c" / f"{i}.bin").write_bytes(blob)
    cat = prestage.Catalog.from_folder(tmp_path, extensions=[".bin"])
    order = epoch_batches(6, 4, seed=0, epoch=0, shuffle=False)
    with pt.Loader(cat, batch_size=4, decode="raw", shuffle=False) as loader:
        for b, (data, _) in enumerate(loader):
            assert [bytes(t.numpy()) for t in data] == [blobs[int(cat.path(i)[2:-4])] for i in order[b]]


def test_torch_image_options_are_for_jpeg_only(tmp_path):
    cat = _write_npy(tmp_path, [(2,)] * 3, np.float32)
    for options in ({"layout": "NHWC"}, {"dtype": torch.float32}, {"mean": 0.5}):
        with pytest.raises(prestage.ConfigError, match="decode='jpeg' only"):
            pt.Loader(cat, batch_size=2, decode="npy", **options)
    with pytest.raises(prestage.ConfigError):
        pt.Loader(cat, batch_size=2, decode="png")
    with pytest.raises(prestage.IoError):  # a catalog path that is not there
        pt.Loader(tmp_path / "missing.catalog", batch_size=2, decode="npy")


def test_torch_device_copies_each_tensor_of_a_ragged_batch(tmp_path, monkeypatch):
    class Done:  # a copy's event, complete at once
        def query(self):
            return True

        def synchronize(self):
            pass

    class ListCopier:  # the CUDA side of device=, on the CPU: a copy is a clone
        def __init__(self):
            self.handed = 0

        def copy(self, host):
            samples = [t.clone() for t in host[0]] if isinstance(host[0], list) else host[0].clone()
            return (samples, host[1].clone()), Done()

        def hand_over(self, tensors, event):
            self.handed += 1

    monkeypatch.setattr(pt, "_resolve_device", lambda device: torch.device("cuda", 0))
    monkeypatch.setattr(pt, "_make_copier", lambda device, normalize, layout: ListCopier())
    cat = _write_npy(tmp_path, [(i + 1,) for i in range(5)], np.int64)
    order = epoch_batches(5, 2, seed=0, epoch=0)
    with pt.Loader(cat, batch_size=2, decode="npy", device="cuda") as loader:
        for b, (arrays, _) in enumerate(loader):
            assert [t.tolist() for t in arrays] == [np.load(cat.source_path(i)).tolist() for i in order[b]]


@pytest.mark.gpu
def test_torch_device_batches_of_ragged_arrays_equal_the_files(tmp_path):
    cat = _write_npy(tmp_path, [(i + 1, 2) for i in range(6)], ">f4")
    order = epoch_batches(6, 4, seed=0, epoch=0)
    with pt.Loader(cat, batch_size=4, decode="npy", device="cuda") as loader:
        for b, (arrays, labels) in enumerate(loader):
            assert all(t.device.type == "cuda" for t in arrays) and labels.device.type == "cuda"
            for t, i in zip(arrays, order[b]):
                np.testing.assert_array_equal(t.cpu().numpy(), np.load(cat.source_path(i)))
