"""Processes that open one new stage directory at the same instant (the ranks of a node starting
together): every one of them starts, whatever the interleaving of their set-up."""

import multiprocessing
import os
from pathlib import Path

import numpy as np

import prestage
from prestage.staging import StagedSampler

PROCESSES = 8


def start_one(catalog_file, stages, barrier, results, rank):
    # One process of the node: at each trial, waits for the others, then creates a sampler over the
    # trial's new stage directory, takes one batch and closes it.
    catalog = prestage.Catalog.load(catalog_file)
    for stage in stages:
        barrier.wait()
        try:
            with StagedSampler(catalog, batch_size=4, stage_dir=stage, rank=rank,
                               world_size=PROCESSES, seed=3) as sampler:
                next(iter(sampler))
            results.put((stage, rank, None))
        except Exception as e:  # reported to the test, which names it
            results.put((stage, rank, f"{type(e).__name__}: {e}"))


def run_trials(tmp_path: Path, trials: int) -> list:
    rng = np.random.default_rng(0)
    data = tmp_path / "data"
    for i in range(64):
        (data / f"c{i % 4}").mkdir(parents=True, exist_ok=True)
        (data / f"c{i % 4}" / f"{i:03d}.bin").write_bytes(rng.bytes(int(rng.integers(200, 2000))))
    catalog_file = tmp_path / "set.catalog"
    prestage.Catalog.from_folder(data, extensions=[".bin"]).save(catalog_file)
    stages = [os.fspath(tmp_path / f"stage{t}") for t in range(trials)]
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(PROCESSES)
    results = context.Queue()
    procs = [context.Process(target=start_one, args=(os.fspath(catalog_file), stages, barrier, results, r))
             for r in range(PROCESSES)]
    for p in procs:
        p.start()
    try:
        outcomes = [results.get(timeout=120) for _ in range(trials * PROCESSES)]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    assert [p.exitcode for p in procs] == [0] * PROCESSES
    return [f"{stage} rank {rank}: {error}" for stage, rank, error in outcomes if error is not None]


def test_eight_processes_creating_samplers_over_one_new_stage_directory_at_once_all_start(tmp_path):
    assert run_trials(tmp_path, trials=10) == []


if __name__ == "__main__":  # the figure by hand: python tests/python/test_stage_start.py TRIALS
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        trials = int(sys.argv[1]) if len(sys.argv) > 1 else 50
        failures = run_trials(Path(d), trials)
        print(f"{trials} trials of {PROCESSES} processes: {len(failures)} failures")
        for f in failures:
            print(f)
