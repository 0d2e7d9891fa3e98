"""Pinned batch buffers: registration with the CUDA driver through a test double of the runtime library
(PRESTAGE_CUDART, read once per process: each case runs in a subprocess), and the fallbacks."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

import prestage

_RUN = textwrap.dedent("""
    import gc, json, sys
    import prestage
    root, depth, with_torch = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "torch"
    cat = prestage.Catalog.from_folder(root)
    out = {}
    with prestage.Loader(cat, batch_size=4, depth=depth, image_size=(16, 16)) as loader:
        out["batch_pinning"] = sorted({b.pinning for b in loader})
        out["batch_pinned"] = sorted({b.pinned for b in loader})
        s = loader.stats()
    out["pinned"], out["pinned_why"] = s["pinned"], s["pinned_why"]
    if with_torch:
        import prestage.torch
        try:
            with prestage.torch.Loader(cat, batch_size=4, image_size=(16, 16), pin_memory=True) as tl:
                out["torch_batches"] = sum(1 for _ in tl)
        except prestage.ConfigError as e:
            out["torch_error"] = type(e).__name__
    del loader
    gc.collect()  # the ring and its buffers go now: each is unregistered
    print(json.dumps(out))
""")


def run(folder, tmp_path, cudart, depth=3, with_torch=False, **fake):
    """Runs a loader over `folder` in a subprocess with PRESTAGE_CUDART=`cudart` and the double's controls
    `fake` (FAKE_CUDART_*); returns what it reported and the double's log, one tuple per call."""
    log = tmp_path / "cudart.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PRESTAGE_", "FAKE_CUDART_"))}
    env.update({"PRESTAGE_CUDART": str(cudart), "FAKE_CUDART_LOG": str(log)})
    env.update({f"FAKE_CUDART_{k.upper()}": str(v) for k, v in fake.items()})
    done = subprocess.run([sys.executable, "-c", _RUN, str(folder), str(depth),
                           "torch" if with_torch else "numpy"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    calls = []
    if log.exists():
        for line in log.read_text().splitlines():
            op, pointer, size, device, result = line.split()
            calls.append((op, int(pointer, 16), int(size), int(device), int(result)))
    return json.loads(done.stdout.splitlines()[-1]), calls


def assert_each_registered_once_then_unregistered(calls):
    registered = {}
    for op, pointer, size, _, result in calls:
        if result != 0:
            continue
        if op == "register":
            assert pointer not in registered
            registered[pointer] = size
        elif op == "unregister":
            assert registered.pop(pointer) == size
    assert registered == {}


def test_buffers_registered_with_the_runtime_report_cuda(folder, tmp_path, fake_cudart):
    out, calls = run(folder, tmp_path, fake_cudart, depth=3)
    assert out["pinned"] == "cuda" and out["pinned_why"]
    assert out["batch_pinning"] == ["cuda"] and out["batch_pinned"] == [True]
    registers = [c for c in calls if c[0] == "register"]
    assert len(registers) == 3 and all(c[4] == 0 for c in registers)  # one per buffer, once
    assert all(c[2] % os.sysconf("SC_PAGE_SIZE") == 0 for c in registers)
    assert_each_registered_once_then_unregistered(calls)
    assert sum(1 for c in calls if c[0] == "unregister") == 3


def test_a_failing_registration_falls_back_to_mlock_and_says_why(folder, tmp_path, fake_cudart):
    out, calls = run(folder, tmp_path, fake_cudart, register_error=2)  # cudaErrorMemoryAllocation
    assert out["pinned"] in ("mlock", "none")  # "none" where RLIMIT_MEMLOCK refuses mlock as well
    assert "cudaHostRegister" in out["pinned_why"]
    assert out["batch_pinning"] == [out["pinned"]]
    assert [c for c in calls if c[0] == "register"] and not [c for c in calls if c[0] == "unregister"]


@pytest.mark.parametrize("fake", [{"devices": 0}, {"count_error": 100}])  # none; cudaErrorNoDevice
def test_no_device_means_no_registration(folder, tmp_path, fake_cudart, fake):
    out, calls = run(folder, tmp_path, fake_cudart, **fake)
    assert out["pinned"] in ("mlock", "none") and out["pinned_why"]
    assert [c[0] for c in calls] == ["count"]  # asked once, then left alone


def test_prestage_cudart_none_or_missing_turns_registration_off(folder, tmp_path):
    off, calls = run(folder, tmp_path, "none")
    missing, _ = run(folder, tmp_path, tmp_path / "no-such-libcudart.so")
    assert off["pinned"] in ("mlock", "none") and missing["pinned"] in ("mlock", "none")
    assert off["pinned_why"] and missing["pinned_why"] and off["pinned_why"] != missing["pinned_why"]
    assert calls == []


@pytest.mark.torch
def test_torch_pin_memory_is_accepted_when_the_buffers_are_registered(folder, tmp_path, fake_cudart):
    out, _ = run(folder, tmp_path, fake_cudart, with_torch=True)
    assert out.get("torch_batches") == 6, out
    out, _ = run(folder, tmp_path, fake_cudart, with_torch=True, register_error=2)
    assert out.get("torch_error") == "ConfigError", out


@pytest.mark.torch
def test_torch_pin_memory_is_refused_unless_the_buffers_are_registered(folder):
    import prestage.torch as pt

    cat = prestage.Catalog.from_folder(folder)
    with prestage.Loader(cat, batch_size=4) as loader:
        pinned = loader.stats()["pinned"]
    if pinned == "cuda":  # a GPU machine: accepted, and the tensors are pinned
        with pt.Loader(cat, batch_size=4, pin_memory=True) as loader:
            images, _ = next(iter(loader))
            assert images.is_pinned()
    else:
        with pytest.raises(prestage.ConfigError):
            pt.Loader(cat, batch_size=4, pin_memory=True)
    with pt.Loader(cat, batch_size=4, pin_memory=False) as loader:  # False: nothing asked
        assert len(loader) == 6
    with pytest.raises(prestage.ConfigError):
        pt.Loader(cat, batch_size=4, pin_memory="yes")
