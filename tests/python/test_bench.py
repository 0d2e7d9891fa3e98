"""prestage bench and prestage tune: every mode and baseline runs and is reported, the grid gives figures,
tune writes what prestage.Loader reads, and the emulated PFS never outlives the command (errors,
Ctrl+C, SIGTERM)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Tuple

import pytest

import prestage
from prestage.bench import report
from prestage.bench.emulator import find_emulator, is_mounted, unavailable_reason
from prestage.bench.grid import counts
from prestage.cli import main

FUSE_REASON = unavailable_reason(find_emulator())
needs_fuse = pytest.mark.skipif(FUSE_REASON is not None, reason=f"cannot mount FUSE here: {FUSE_REASON}")

# Small and quick: 32x32 outputs, batches of 4, caches evicted file by file (not the whole machine's).
QUICK = ["--batch-size", "4", "--image-size", "32", "--cold", "fadvise", "--quiet"]


@pytest.fixture
def data(make_folder) -> Path:
    """3 classes x 10 images: 30 images, 8 batches of 4 (the last one of 2)."""
    return make_folder(3, 10, size=(48, 64))


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Temporary files of the command (the emulator's mount point among them) go here."""
    path = tmp_path / "tmp"
    path.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    return path


def run_cli(capsys: pytest.CaptureFixture, *args: str) -> Tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def mounts_under(path: Path) -> List[str]:
    prefix = os.path.realpath(path) + "/"
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(prefix)]


def subcommand(name: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    from prestage.cli import bench, tune

    sub = parser.add_subparsers()
    return {"bench": bench, "tune": tune}[name].add_parser(sub)


# ----------------------------------------------------------------------------------------------------
# Pieces


def test_counts_are_sorted_positive_integers() -> None:
    assert counts("4,1,2,2") == [1, 2, 4]
    for bad in ("", "0,1", "a,2", "-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            counts(bad)


def test_ratios_compare_pipelined_with_each_mode() -> None:
    by_mode = {
        "pipelined": {"seconds": 10.0, "images_per_s": 700.0},
        "direct": {"seconds": 100.0, "images_per_s": 100.0},
        "ideal": {"seconds": 9.0, "images_per_s": 800.0},
        "stage-all": {"seconds": 20.0, "images_per_s": 350.0},
        "torch": {"seconds": 40.0, "images_per_s": 200.0},
    }
    got = {r["denominator"]: r for r in report.ratios(by_mode)}
    assert got["direct"]["value"] == pytest.approx(7.0) and got["direct"]["met"]
    assert got["ideal"]["value"] == pytest.approx(0.875) and not got["ideal"]["met"]
    assert got["stage-all"]["value"] == pytest.approx(0.5) and got["stage-all"]["met"]
    assert got["torch"]["value"] == pytest.approx(3.5) and got["torch"]["met"]
    assert "tf" not in got  # not measured: not reported


@pytest.mark.parametrize("name", ["bench", "tune"])
def test_every_option_is_explained_with_its_unit(name: str) -> None:
    parser = subcommand(name)
    for action in parser._actions:
        assert action.help, f"{name}: {action.option_strings or action.dest} has no help"
    helps = {opt: a.help for a in parser._actions for opt in a.option_strings}
    units = {"--latency-ms": "milliseconds", "--bandwidth-mbs": "MB/s", "--compute-ms": "milliseconds",
             "--batch-size": "images", "--image-size": "pixels", "--max-ops": "operations",
             "--batches": "batches", "--depth": "buffers", "--stage-dir": "directory"}
    for option, unit in units.items():
        assert unit in helps[option], f"{name} {option}: no unit ({unit})"
    lookahead = helps["--lookahead"]
    assert "batches" in lookahead and "threads" in helps["--prefetchers"] and "threads" in helps["--readers"]


# ----------------------------------------------------------------------------------------------------
# prestage bench


def test_bench_runs_every_prestage_mode_and_cleans_up(data: Path, tmp_path: Path, capsys) -> None:
    stage = tmp_path / "stage"
    rc, out, err = run_cli(capsys, "bench", str(data), "--stage-dir", str(stage), *QUICK,
                           "--modes", "direct,stage-all,pipelined,ideal", "--repeat", "2", "--json")
    assert rc == 0, err
    result = json.loads(out)
    modes = {s["mode"]: s for s in result["headline"]}
    assert list(modes) == ["direct", "stage-all", "pipelined", "ideal"]
    for s in modes.values():
        assert s["images"] == 30 and s["repeats"] == 2 and s["images_per_s"] > 0
        assert s["seconds"] >= s["stall_s"] >= 0
    assert modes["stage-all"]["copy_s"] > 0
    assert modes["stage-all"]["seconds"] == pytest.approx(modes["stage-all"]["copy_s"]
                                                          + modes["stage-all"]["epoch_s"])
    assert modes["pipelined"]["stages"]["stage"]["busy_s"] > 0
    assert modes["ideal"]["cache"] == "warm" and modes["direct"]["cache"] == "fadvise"
    assert result["session"]["cache_method"] == "fadvise"
    assert {r["denominator"] for r in result["ratios"]} == {"direct", "ideal", "stage-all"}
    assert len(result["runs"]) == 8
    assert list(stage.iterdir()) == []  # the benchmark's own directory is gone


def test_bench_prints_a_table_and_the_ratios(data: Path, tmp_path: Path, capsys) -> None:
    rc, out, err = run_cli(capsys, "bench", str(data), "--stage-dir", str(tmp_path), *QUICK,
                           "--modes", "direct,pipelined", "--repeat", "1", "--compute-ms", "2")
    assert rc == 0, err
    assert "images/s" in out and "stall s" in out and "stage2 busy/idle s" in out
    assert "pipelined / direct (speed-up)" in out
    assert "cold runs by fadvise" in out


def test_bench_with_no_thread_option_runs_the_loader_as_set_up_by_nobody_and_names_its_values(
        data: Path, tmp_path: Path, capsys) -> None:
    rc, out, err = run_cli(capsys, "bench", str(data), "--stage-dir", str(tmp_path), *QUICK,
                           "--modes", "direct,pipelined", "--repeat", "2", "--out", str(tmp_path / "out"))
    assert rc == 0, err
    result = json.loads((tmp_path / "out" / "results.json").read_text())
    # The oracle: what a Loader given no thread option chooses on this machine, and why.
    catalog = prestage.Catalog.from_folder(data)
    with prestage.Loader(catalog, batch_size=4, image_size=(32, 32)) as loader:
        o = loader.options
        why = loader.stats(epochs="all")["threads_why"]
    assert why
    modes = {s["mode"]: s for s in result["headline"]}
    for s in modes.values():
        assert s["options"]["readers"] is None  # nothing was given
        assert [t["on"] for t in s["tuning"]] == [True, True]  # self-tuning on, as by default
        assert (s["chosen"]["readers"], s["chosen"]["lookahead"]) == (o.readers, o.lookahead)
    # direct runs with one stage 2 thread (it has no stage directory); pipelined sets nothing.
    s = modes["pipelined"]
    assert s["chosen"] == {"readers": o.readers, "prefetchers": o.prefetchers, "lookahead": o.lookahead}
    assert s["threads_why"] == why
    assert f"pipelined: readers={o.readers} prefetchers={o.prefetchers} lookahead={o.lookahead} ({why})" in out
    tuning = {s["mode"]: s["tuning"] for s in result["headline"]}["pipelined"]
    for i, t in enumerate(tuning):
        assert (f"run {i + 1}: self-tuned to readers={t['readers']} reads_in_flight={t['reads_in_flight']} "
                f"lookahead={t['lookahead']}") in out


def test_bench_keeps_given_thread_options_fixed(data: Path, tmp_path: Path, capsys) -> None:
    rc, out, err = run_cli(capsys, "bench", str(data), "--stage-dir", str(tmp_path), *QUICK,
                           "--modes", "pipelined", "--repeat", "1", "--readers", "1", "--prefetchers", "3",
                           "--lookahead", "2", "--json")
    assert rc == 0, err
    (s,) = json.loads(out)["headline"]
    assert s["chosen"] == {"readers": 1, "prefetchers": 3, "lookahead": 2}
    (t,) = s["tuning"]
    assert (t["readers"], t["lookahead"], t["steps_kept"]) == (1, 2, 0)


def test_demo_prints_the_values_it_chose_and_the_self_tuning(data: Path, tmp_path: Path) -> None:
    from prestage.cli.demo import format_report, run_demo

    result = run_demo(data, tmp_path / "stage", batch_size=4, image_size=(16, 16), cold=False,
                      show_progress=False)
    text = format_report(result)
    t = result["stats"]["tuning"]
    o = result["options"]
    assert t["on"] and o["threads_why"]
    assert (f"threads          {o['readers']} readers, {o['prefetchers']} prefetchers, "
            f"lookahead {o['lookahead']} ({o['threads_why']})") in text
    assert (f"self-tuning      on: {t['readers']} readers, {t['reads_in_flight']} reads in flight, "
            f"lookahead {t['lookahead']} at the end") in text


def test_bench_reads_the_plain_directory_when_it_cannot_emulate(data: Path, tmp_path: Path, capsys) -> None:
    rc, out, err = run_cli(capsys, "bench", str(data), "--stage-dir", str(tmp_path), *QUICK,
                           "--modes", "direct", "--repeat", "1", "--json", "--emulate",
                           "--emulator", str(tmp_path / "no-such-binary"))
    assert rc == 0, err
    assert "cannot emulate a PFS" in err
    result = json.loads(out)
    assert result["session"]["emulated"] is False and "emulator_error" in result["session"]
    assert result["headline"][0]["images"] == 30


def test_bench_says_why_it_cannot_emulate_without_root_or_dev_fuse(
        data: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    from prestage.bench import emulator

    real_exists, real_access = os.path.exists, os.access
    monkeypatch.setattr(emulator.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(emulator.os, "access",
                        lambda path, mode: False if path == "/dev/fuse" else real_access(path, mode))
    assert "not root" in (emulator.unavailable_reason(Path(sys.executable)) or "")
    monkeypatch.setattr(emulator.os.path, "exists",
                        lambda path: False if path == "/dev/fuse" else real_exists(path))
    rc, out, err = run_cli(capsys, "bench", str(data), "--stage-dir", str(tmp_path), *QUICK,
                           "--modes", "pipelined", "--repeat", "1", "--json", "--emulate",
                           "--emulator", sys.executable)  # an executable; never run: no /dev/fuse
    assert rc == 0, err
    assert "cannot emulate a PFS (no /dev/fuse" in err
    assert json.loads(out)["headline"][0]["images"] == 30


@pytest.mark.slow
def test_bench_grid_writes_json_and_figures(data: Path, tmp_path: Path, capsys) -> None:
    pytest.importorskip("matplotlib")
    out_dir = tmp_path / "out"
    rc, out, err = run_cli(capsys, "bench", str(data), "--stage-dir", str(tmp_path), *QUICK,
                           "--modes", "direct,stage-all,pipelined,ideal", "--repeat", "1", "--grid",
                           "--grid-prefetchers", "1,4", "--grid-readers", "1,2", "--grid-lookahead", "2",
                           "--grid-batches", "3", "--out", str(out_dir))
    assert rc == 0, err
    result = json.loads((out_dir / "results.json").read_text())
    pipelined = [s for s in result["grid"] if s["mode"] == "pipelined"]
    assert len(pipelined) == 4 and all(s["images"] == 12 for s in pipelined)
    best = max(pipelined, key=lambda s: s["images_per_s"])
    assert {k: result["chosen"][k] for k in ("prefetchers", "readers", "lookahead")} == {
        k: best[k] for k in ("prefetchers", "readers", "lookahead")}
    stage_all = {s["mode"]: s for s in result["headline"]}["stage-all"]
    assert stage_all["options"]["prefetchers"] == result["chosen"]["stage_all_prefetchers"]
    assert {g["readers"] for g in result["grid_ratios"]} == {1, 2}
    for name in ("elapsed_vs_prefetchers.png", "elapsed_vs_decode_threads.png", "modes.png"):
        png = out_dir / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert png.stat().st_size < 200_000


@needs_fuse
@pytest.mark.slow
def test_emulated_bench_reads_through_the_pfs_and_unmounts(data: Path, tmp_path: Path, private_tmp: Path,
                                                           capsys) -> None:
    rc, out, err = run_cli(capsys, "bench", str(data), "--stage-dir", str(tmp_path / "stage"), *QUICK,
                           "--modes", "direct,pipelined", "--repeat", "1", "--json", "--emulate",
                           "--latency-ms", "1", "--bandwidth-mbs", "100")
    assert rc == 0, err
    result = json.loads(out)
    assert result["session"]["emulated"] is True
    for s in result["headline"]:
        assert s["pfs"]["ops"]["open"] >= 30 and s["pfs"]["bytes_read"] > 0
    assert mounts_under(private_tmp) == [] and list(private_tmp.iterdir()) == []


@needs_fuse
def test_an_error_after_mounting_unmounts(tmp_path: Path, private_tmp: Path, capsys) -> None:
    empty = tmp_path / "empty" / "class_0"
    empty.mkdir(parents=True)
    (empty / "notes.txt").write_text("no images here")
    rc, out, err = run_cli(capsys, "bench", str(empty.parent), "--stage-dir", str(tmp_path), *QUICK,
                           "--emulate")
    assert rc == 2
    assert "holds no JPEG" in err
    assert mounts_under(private_tmp) == []


@needs_fuse
@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 128 + signal.SIGTERM)])
def test_interrupting_the_bench_unmounts(data: Path, tmp_path: Path, sig: int, code: int) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    # -X faulthandler: if it does not end, SIGABRT makes it print where each thread is.
    cmd = [sys.executable, "-X", "faulthandler", "-m", "prestage", "bench", str(data), "--stage-dir",
           str(tmp_path / "stage"), *QUICK, "--modes", "direct", "--repeat", "1000", "--emulate",
           "--latency-ms", "5"]
    # SIGINT at its default in the child (ignored where the tests run as a background job, and an
    # ignored SIGINT stays ignored across exec): Python then turns it into KeyboardInterrupt.
    process = subprocess.Popen(cmd, env=dict(os.environ, TMPDIR=str(tmp)), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 30
        while not mounts_under(tmp) and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
        assert mounts_under(tmp), "the emulator never mounted"
        time.sleep(1.0)  # well into the runs
        process.send_signal(sig)
        try:
            status = process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)
            process.wait(timeout=10)
            pytest.fail(f"still running 30 s after signal {sig}:\n{process.stderr.read().decode()}")
        assert status == code
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        stderr = process.stderr.read().decode() if process.stderr else ""
        if process.stderr:
            process.stderr.close()
    assert mounts_under(tmp) == [], stderr
    assert list(tmp.iterdir()) == []
    assert list((tmp_path / "stage").iterdir()) == []


@pytest.mark.slow
@pytest.mark.torch
def test_bench_pytorch_baseline(data: Path, tmp_path: Path, capsys) -> None:
    pytest.importorskip("torchvision")
    rc, out, err = run_cli(capsys, "bench", str(data), "--stage-dir", str(tmp_path), *QUICK,
                           "--modes", "pipelined,torch", "--repeat", "1", "--workers", "2", "--json")
    assert rc == 0, err
    torch_run = {s["mode"]: s for s in json.loads(out)["headline"]}["torch"]
    assert torch_run["images"] == 30 and torch_run["options"] == {"workers": 2}
    assert "torchvision" in torch_run["version"]


@pytest.mark.slow
@pytest.mark.tf
def test_bench_tf_data_baseline(data: Path, tmp_path: Path, capsys) -> None:
    rc, out, err = run_cli(capsys, "bench", str(data), "--stage-dir", str(tmp_path), *QUICK,
                           "--modes", "pipelined,tf", "--repeat", "1", "--json")
    assert rc == 0, err
    tf_run = {s["mode"]: s for s in json.loads(out)["headline"]}["tf"]
    assert tf_run["images"] == 30 and tf_run["options"] == {"workers": "AUTOTUNE"}


# ----------------------------------------------------------------------------------------------------
# prestage tune


def test_tune_writes_the_options_that_the_loader_reads(data: Path, tmp_path: Path, capsys) -> None:
    tuned = tmp_path / "tuned.json"
    rc, out, err = run_cli(capsys, "tune", str(data), "--stage-dir", str(tmp_path / "stage"), *QUICK,
                           "--prefetchers", "1,3", "--readers", "1,2", "--lookahead", "2",
                           "--batches", "2", "--depth", "3", "--write", str(tuned))
    assert rc == 0, err
    assert "best: prefetchers=" in out and "images/s" in out
    written = json.loads(tuned.read_text())
    options = written["options"]
    assert options["prefetchers"] in (1, 3) and options["readers"] in (1, 2)
    assert options["lookahead"] == 2 and options["depth"] == 3
    assert len(written["grid"]) == 4 and written["images_per_s"] == max(
        g["images_per_s"] for g in written["grid"])
    catalog = prestage.Catalog.from_folder(data)
    with prestage.Loader(catalog, batch_size=4, image_size=(32, 32), tuned=tuned) as loader:
        o = loader._options
        assert (o.prefetchers, o.readers, o.lookahead, o.depth) == (
            options["prefetchers"], options["readers"], options["lookahead"], options["depth"])


def test_tune_rejects_a_missing_source(tmp_path: Path, capsys) -> None:
    rc, out, err = run_cli(capsys, "tune", str(tmp_path / "missing"), "--stage-dir", str(tmp_path), *QUICK)
    assert rc == 2 and "is not a directory" in err


def test_bench_cache_bytes_reports_each_epoch_of_each_policy(data: Path, tmp_path: Path, capsys) -> None:
    set_bytes = sum(p.stat().st_size for p in data.rglob("*.jpg"))
    out_dir = tmp_path / "out"
    rc, out, err = run_cli(capsys, "bench", str(data), "--stage-dir", str(tmp_path / "stage"), *QUICK,
                           "--cache-bytes", "30%", "--epochs", "3", "--cache-only", "--json",
                           "--out", str(out_dir))
    assert rc == 0, err
    result = json.loads(out)
    assert result["headline"] == []  # --cache-only
    study = result["cache_study"]
    assert study["set_bytes"] == set_bytes and study["cache_bytes"] == int(0.3 * set_bytes)
    assert [p["eviction"] for p in study["policies"]] == ["clairvoyant", "lru"]
    for p in study["policies"]:
        epochs = p["epochs"]
        assert [e["epoch"] for e in epochs] == [0, 1, 2]
        assert all(e["images"] == 30 and e["hits"] + e["misses"] == 30 for e in epochs)
        assert epochs[0]["misses"] == 30 and epochs[0]["bytes_from_source"] == set_bytes  # cold
        assert all(e["hits"] > 0 and e["bytes_from_source"] < set_bytes for e in epochs[1:])
        assert 0 < p["peak_stage_bytes"] <= study["cache_bytes"]
    by = {p["eviction"]: p for p in study["policies"]}
    assert by["clairvoyant"]["later_source_fraction"] <= by["lru"]["later_source_fraction"]
    if result.get("plots"):  # matplotlib installed
        assert (out_dir / "cache_bytes_per_epoch.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args, message", [
    (["--cache-bytes", "0"], "is not a size"),
    (["--cache-bytes", "150%"], "between 0 and 100"),
    (["--cache-bytes", "lots"], "is not a size"),
    (["--cache-bytes", "1G", "--eviction", "fifo"], "unknown eviction policy 'fifo'"),
])
def test_bench_refuses_a_bad_cache_size_or_policy(data: Path, capsys, args: List[str], message: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["bench", str(data), *QUICK, *args])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_bench_cache_only_needs_cache_bytes(data: Path, tmp_path: Path, capsys) -> None:
    rc, _, err = run_cli(capsys, "bench", str(data), "--stage-dir", str(tmp_path), *QUICK, "--cache-only")
    assert rc == 2 and "--cache-only needs --cache-bytes" in err


def test_cache_sizes_take_units_and_percentages() -> None:
    from prestage.bench.cache_study import resolve_size

    assert resolve_size("1.5M", 10) == 1572864 and resolve_size("2k", 10) == 2048
    assert resolve_size("300", 10) == 300 and resolve_size("1GiB", 10) == 1 << 30
    assert resolve_size("25%", 1000) == 250


@pytest.mark.parametrize("command", ["bench", "tune"])
def test_the_machines_page_cache_is_dropped_only_when_asked(command, capsys):
    """Writing /proc/sys/vm/drop_caches empties every other job's page cache too: the default evicts
    only the benchmark's own files (fadvise), --cold drop asks for the rest, and --help says so."""
    import argparse

    from prestage.cli import bench as bench_cli, tune as tune_cli

    parser = argparse.ArgumentParser(prog="prestage")
    module = bench_cli if command == "bench" else tune_cli
    module.add_parser(parser.add_subparsers(dest="command"))
    assert parser.parse_args([command, "SRC"]).cold == "fadvise"
    assert parser.parse_args([command, "SRC", "--cold", "drop"]).cold == "drop"
    with pytest.raises(SystemExit):
        parser.parse_args([command, "--help"])
    assert "WHOLE machine" in " ".join(capsys.readouterr().out.split())
