"""Preemption: every rank of a job killed with SIGKILL at random moments and restarted on another
number of ranks from the last saved state loses no sample, repeats none, delivers no wrong byte and
keeps the stage directory's bound (benchmarks/preemption_trials.py, a few trials of it); and that
script's accounting finds a lost, a repeated and a wrong sample when there is one."""

from __future__ import annotations

import collections
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "preemption_trials.py"


def trials_module():
    spec = importlib.util.spec_from_file_location("preemption_trials", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_jobs_killed_and_restarted_on_other_rank_counts_lose_and_repeat_nothing(tmp_path, tmpfs):
    mount = tmpfs(4 * 1024)
    out = tmp_path / "out.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--trials", "2", "--kills", "2", "--seed", "1",
                           "--stage-mount", str(mount), "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["lost"] == result["repeated"] == result["wrong"] == 0
    assert result["kills"] >= 2
    # Every sample of every epoch of both jobs was checked against its source, at least once.
    assert result["checked"] >= 2 * result["epochs"] * result["samples"]
    assert 0 < result["peak_bytes"] <= result["bound"] < result["set_bytes"]
    assert all(len(r["layouts"]) >= 2 for r in result["results"])  # restarted each time


def test_the_accounting_finds_a_lost_a_repeated_and_a_wrong_sample():
    pt = trials_module()
    truth = {0: "a", 1: "b", 2: "c", 3: "d"}
    whole = [(0, [(0, "a"), (1, "b")]), (0, [(2, "c"), (3, "d")])]
    clean = pt.account(whole, [], truth, 1, {})
    assert clean == {"lost": 0, "repeated": 0, "padding": 0, "replayed": 0, "checked": 4, "wrong": 0}
    assert pt.account(whole[:1], [], truth, 1, {})["lost"] == 2
    assert pt.account(whole + [(0, [(1, "b")])], [], truth, 1, {})["repeated"] == 1
    # Once more for a sample the resume pads with is by design; twice more is not.
    padded = {0: collections.Counter([1])}
    assert pt.account(whole + [(0, [(1, "b")])], [], truth, 1, padded)["repeated"] == 0
    assert pt.account(whole + [(0, [(1, "b"), (1, "b")])], [], truth, 1, padded)["repeated"] == 1
    # A wrong byte counts wherever it was delivered, replayed batches included.
    assert pt.account(whole, [(0, [(2, "x")])], truth, 1, {})["wrong"] == 1
    assert pt.account(whole, [(0, [(2, "c")])], truth, 1, {})["replayed"] == 1


def test_a_batch_counts_as_consumed_only_when_the_merged_checkpoint_keeps_it():
    pt = trials_module()
    b = [(0, [(0, "a")]), (0, [(1, "b")]), (1, [(2, "c")])]
    # Rank 0 saved after 3 batches, one of them of epoch 1; rank 1 after 1 batch, in epoch 0: the
    # merge keeps epoch 0 only, so rank 0's batch of epoch 1 is delivered again, as is what rank 1
    # delivered after its save.
    saved = [{"state": {"epoch": 1}, "log_lines": 3}, {"state": {"epoch": 0}, "log_lines": 1}]
    consumed, replayed = pt.consumed_batches([b, b[:2]], saved)
    assert consumed == [b[0], b[1], b[0]]
    assert replayed == [b[2], b[1]]


def test_a_log_line_cut_short_by_the_kill_is_not_delivered(tmp_path):
    pt = trials_module()
    log = tmp_path / "rank.log"
    log.write_text("0 1:aa 2:bb\n1 3:cc 4:d")
    assert pt.read_log(log) == [(0, [(1, "aa"), (2, "bb")])]
