"""prestage.torch.Loader(device="cuda", decode_device="cuda"): the option checks (anywhere torch is) and,
where a GPU is, device tensors viewing the decoded batches against the CPU path's."""

import numpy as np
import pytest

import prestage

torch = pytest.importorskip("torch")
import prestage.torch as pt  # noqa: E402  (after the importorskip)

pytestmark = pytest.mark.torch


def test_decode_device_cuda_needs_a_cuda_device(folder):
    with pytest.raises(prestage.ConfigError, match="decode_device='cuda' needs a CUDA device"):
        pt.Loader(prestage.Catalog.from_folder(folder), batch_size=4, image_size=(16, 16), decode_device="cuda")


def test_an_unknown_decode_device_is_a_config_error(folder):
    with pytest.raises(prestage.ConfigError, match="decode_device"):
        pt.Loader(prestage.Catalog.from_folder(folder), batch_size=4, image_size=(16, 16), decode_device="gpu")


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_device_decoded_batches_are_cuda_tensors_close_to_the_cpu_paths(make_folder, layout):
    """The real nvJPEG and NPP: the same samples in the same order as the CPU path, on the device,
    NCHW as a channels_last view; pixels within a tolerance (NPP's filters are not the CPU path's:
    the mean difference per image stays under 6 levels; another crop box or a missed flip gives
    tens)."""
    root = prestage.Catalog.from_folder(make_folder(3, 6, size=None))
    common = dict(batch_size=4, image_size=(24, 32), transform="random-resized-crop", seed=7,
                  layout=layout)
    with pt.Loader(root, **common) as cpu_loader:
        cpu = [(images.clone(), labels.clone()) for images, labels in cpu_loader]
    with pt.Loader(root, device="cuda", decode_device="cuda", gpu_cpu_share=0.25, **common) as loader:
        got = []
        for images, labels in loader:
            assert images.is_cuda and labels.is_cuda and images.dtype == torch.uint8
            if layout == "NCHW":
                assert images.shape[1] == 3
                assert images.is_contiguous(memory_format=torch.channels_last)
            got.append((images.cpu(), labels.cpu()))
        stats = loader.stats()["gpu_decode"]
    assert stats["on"] and stats["batches"] >= 5 and stats["cpu_share"] >= 5
    assert len(got) == len(cpu)
    for (g, gl), (c, cl) in zip(got, cpu):
        assert torch.equal(gl, cl)
        diff = (g.to(torch.int16) - c.to(torch.int16)).abs().float()
        assert diff.flatten(1).mean(dim=1).max().item() < 6.0


@pytest.mark.gpu
def test_device_decoded_batches_normalised_on_the_device(make_folder):
    root = prestage.Catalog.from_folder(make_folder(2, 4))
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    with pt.Loader(root, batch_size=4, image_size=(24, 32), device="cuda", decode_device="cuda",
                   dtype=torch.float32, mean=mean, std=std, shuffle=False) as loader:
        images, _ = next(iter(loader))
    with pt.Loader(root, batch_size=4, image_size=(24, 32), device="cuda", decode_device="cuda",
                   shuffle=False) as loader:
        raw, _ = next(iter(loader))
        raw = raw.clone()
    expected = (raw.float() / 255 - torch.tensor(mean, device="cuda").view(1, 3, 1, 1)) \
        / torch.tensor(std, device="cuda").view(1, 3, 1, 1)
    assert images.dtype == torch.float32 and images.is_cuda
    assert np.allclose(images.cpu().numpy(), expected.cpu().numpy(), atol=1e-5)


def test_gpu_crop_reaches_the_core(folder):
    """The torch adaptor takes gpu_crop as prestage.Loader does: the core's checks apply to it."""
    catalog = prestage.Catalog.from_folder(folder)
    with pytest.raises(prestage.ConfigError, match="gpu_crop"):
        pt.Loader(catalog, batch_size=4, image_size=(16, 16), gpu_crop="crop")
    with pt.Loader(catalog, batch_size=4, image_size=(16, 16), gpu_crop="resize") as loader:
        assert loader._loader.options.gpu_crop.name == "resize"
