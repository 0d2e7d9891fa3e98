"""Elastic restarts in a DDP job: gloo ranks (processes on this machine) take part of an epoch, the job
stops, and restarts on another number of ranks (4 -> 2 -> 3, mid-epoch each time, another batch size
once) from the state that prestage.torch.gather_state merged. The samples seen over the run are each
epoch's samples exactly once; the order after each resume is the rest of the epoch's global
permutation, sliced over the new ranks (the oracle slices ``prestage.plan.epoch_order`` by hand)."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import pytest

import prestage

pytestmark = pytest.mark.torch

N = 72
SEED = 9

# One rank of one phase: the README's loop, stopped after `stop` batches of epoch `stop_epoch`, with
# the loader's state gathered over gloo and written by rank 0; each rank writes what it saw.
WORKER = r"""
import json, os, sys
import torch.distributed as dist
import prestage, prestage.torch as pt

cfg = json.loads(sys.argv[1])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method="file://" + cfg["rendezvous"], rank=rank, world_size=world)
catalog = prestage.Catalog.load(cfg["catalog"])
index_of = {catalog.source_path(i).read_bytes(): i for i in range(len(catalog))}
loader = pt.Loader(catalog, batch_size=cfg["batch_size"], decode="raw", seed=cfg["seed"],
                   stage_dir=cfg["stage_dir"], readers=1, prefetchers=2)
assert loader._loader.options.rank == rank and loader._loader.options.world_size == world
start = 0
if cfg["state"]:
    with open(cfg["state"]) as f:
        state = json.load(f)
    loader.load_state_dict(state)
    start = state["epoch"]
seen = []
stopped = False
for epoch in range(start, cfg["epochs"]):
    loader.set_epoch(epoch)
    for k, (arrays, labels) in enumerate(loader):
        seen.append([epoch, [index_of[a.numpy().tobytes()] for a in arrays]])
        if epoch == cfg["stop_epoch"] and k + 1 == cfg["stop"]:
            stopped = True
            break
    if stopped:
        break
mine = loader.state_dict()
state = pt.gather_state(loader)
if rank == 0 and cfg["state_out"]:
    with open(cfg["state_out"], "w") as f:
        json.dump(state, f)
with open(cfg["out"] % rank, "w") as f:
    json.dump({"seen": seen, "mine": mine, "gathered": state}, f)
loader.close()
dist.destroy_process_group()
"""


def make_raw(root: Path, n: int) -> Path:
    rng = np.random.default_rng(3)
    for i in range(n):
        folder = root / f"c{i % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{i:04d}.bin").write_bytes(rng.bytes(int(rng.integers(16, 64))))
    catalog = prestage.Catalog.from_folder(root, [])
    catalog.save(root.parent / "catalog.prestage")
    return root.parent / "catalog.prestage"


def run_phase(tmp: Path, name: str, world: int, batch_size: int, state: Optional[Path],
              epochs: int, stop_epoch: int = -1, stop: int = 0) -> List[Dict]:
    script = tmp / "worker.py"
    script.write_text(WORKER)
    cfg = {"rendezvous": str(tmp / f"rdv-{name}"), "catalog": str(tmp / "catalog.prestage"),
           "stage_dir": str(tmp / "stage"), "batch_size": batch_size, "seed": SEED,
           "state": str(state) if state else None, "state_out": str(tmp / f"state-{name}.json"),
           "epochs": epochs, "stop_epoch": stop_epoch, "stop": stop, "out": str(tmp / f"{name}-%d.json")}
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(script), json.dumps(cfg)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out.decode()
    return [json.loads((tmp / f"{name}-{r}.json").read_text()) for r in range(world)]


def rank_slices(order: List[int], batch_size: int, world_size: int, rank: int) -> List[List[int]]:
    assert len(order) % world_size == 0  # the steps below are sized so that nothing pads
    per_rank = len(order) // world_size
    out = []
    for g in range(-(-per_rank // batch_size)):
        size = min(batch_size, per_rank - g * batch_size)
        start = g * batch_size * world_size + rank * size
        out.append(order[start:start + size])
    return out


def test_4_then_2_then_3_ranks_see_each_sample_once_per_epoch_in_the_plan_order(tmp_path):
    make_raw(tmp_path / "data", N)
    order = [[int(i) for i in prestage.plan.epoch_order(N, SEED, e)] for e in range(2)]
    per_epoch: Dict[int, collections.Counter] = collections.defaultdict(collections.Counter)

    def count(results):
        for r in results:
            for epoch, batch in r["seen"]:
                per_epoch[epoch].update(batch)

    # 4 ranks of 3: 2 batches of epoch 0, 24 samples of 72.
    first = run_phase(tmp_path, "a", 4, 3, None, epochs=1, stop_epoch=0, stop=2)
    count(first)
    for r, result in enumerate(first):
        assert [b for _, b in result["seen"]] == rank_slices(order[0], 3, 4, r)[:2]
        assert result["mine"] == dict(result["gathered"], rank=r)  # lockstep: each rank's own is global
    state_a = json.loads((tmp_path / "state-a.json").read_text())
    assert state_a["epoch"] == 0 and state_a["position"] == 24

    # 2 ranks of 5 (another batch size): 3 of the 5 batches of the 48 left, 30 samples.
    second = run_phase(tmp_path, "b", 2, 5, tmp_path / "state-a.json", epochs=1, stop_epoch=0, stop=3)
    count(second)
    for r, result in enumerate(second):
        assert [b for _, b in result["seen"]] == rank_slices(order[0][24:], 5, 2, r)[:3]
    state_b = json.loads((tmp_path / "state-b.json").read_text())
    assert state_b["position"] == 54 and state_b["resumed_from"] == [[0, 24]]

    # 3 ranks of 3: the 18 left of epoch 0, then epoch 1 as a fresh 3-rank run.
    third = run_phase(tmp_path, "c", 3, 3, tmp_path / "state-b.json", epochs=2)
    count(third)
    for r, result in enumerate(third):
        got0 = [b for e, b in result["seen"] if e == 0]
        got1 = [b for e, b in result["seen"] if e == 1]
        assert got0 == rank_slices(order[0][54:], 3, 3, r)
        assert got1 == rank_slices(order[1], 3, 3, r)
        assert result["gathered"]["epoch"] == 2 and result["gathered"]["position"] == 0

    everything = collections.Counter(range(N))
    assert per_epoch[0] == everything  # no sample lost, none repeated, across three jobs
    assert per_epoch[1] == everything
