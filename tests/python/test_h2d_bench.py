"""benchmarks/h2d_bench.py: its arguments, its refusal without CUDA, and the parts that need no GPU."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "h2d_bench.py"
SMALL = ["--batch-size", "4", "--image-size", "32", "--readers", "1", "--workers", "1", "--model", "convnet",
         "--runs", "1", "--warmup", "0"]


def bench(*args, timeout=300):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout)


def test_help_and_bad_arguments():
    assert bench("--help").returncode == 0
    for bad in (["--runs", "0"], ["--batch-size", "-1"], ["--warmup", "-1"], ["--only", "nothing"],
                ["--data", "/nonexistent/folder"], ["--model", "vgg"]):
        done = bench(*bad)
        assert done.returncode == 2 and "usage:" in done.stderr, bad  # argparse's error


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_without_cuda_it_fails_clearly(tmp_path):
    for device in ("cuda", "cpu", "cuda:0"):
        done = bench("--device", device, "--json", str(tmp_path / "out.json"), *SMALL)
        assert done.returncode == 2
        assert done.stderr.startswith("h2d_bench:") and "--cpu-check" in done.stderr
        assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize("transform", ["random-resized-crop", "center-crop"])
def test_cpu_check_runs_both_input_pipelines_and_the_model(folder, tmp_path, transform):
    out = tmp_path / "h2d.json"
    done = bench("--cpu-check", "--data", str(folder), "--transform", transform, "--json", str(out), *SMALL)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    check = result["cpu_check"]
    assert check["prestage_batch"] == check["dataloader_batch"] == [4, 3, 32, 32]
    assert check["same_shape"] is True
    assert check["pinned"] in ("cuda", "mlock", "none") and check["pinned_why"]
    assert check["model"] == "convnet" and check["logits"] == [2, 10]
    assert result["args"]["transform"] == transform and "copy" not in result


def test_cpu_check_refuses_a_data_set_smaller_than_two_batches(make_folder, tmp_path):
    done = bench("--cpu-check", "--data", str(make_folder(1, 3)), *SMALL)
    assert done.returncode == 2 and done.stderr.startswith("h2d_bench:")


def test_cpu_check_synthesises_its_data_when_none_is_given():
    done = bench("--cpu-check", "--images", "12", *SMALL)
    assert done.returncode == 0, done.stderr
    check = json.loads(done.stdout)["cpu_check"]
    assert check["prestage_batch"] == [4, 3, 32, 32] and check["same_shape"] is True
