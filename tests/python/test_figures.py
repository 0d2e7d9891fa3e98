"""The figures a user reads agree with each other: the demo's report and stats(), per epoch and in total,
against the oracle of how many samples an epoch has and what a fresh or a reused stage directory holds."""

import re

import pytest

import prestage
from prestage.cli.demo import epoch_figures, format_report, run_demo

TIERS = ("stage", "memory", "peers", "source")


def _numbers(line: str):
    return [int(n) for n in re.findall(r"\b\d+\b", line)]


def test_the_demos_figures_add_up_to_the_epoch_on_a_fresh_and_a_reused_stage_directory(make_folder, tmp_path):
    data = make_folder(3, 10, size=(32, 40))  # 30 images, 8 batches of 4
    for run, expect_hits in (("fresh", 0), ("reused", 30)):
        result = run_demo(data, tmp_path / "stage", batch_size=4, image_size=(16, 16), cold=False,
                          show_progress=False)
        s = result["stats"]
        assert [e["epoch"] for e in s["epochs"]] == [0], run  # the epoch run, not the next one begun
        e = epoch_figures(s)
        assert e["samples"] == result["images"] == 30, run
        assert e["hits"] + e["misses"] == 30 and e["hits"] == expect_hits, run
        # Fresh: every file copied once, and stage 3 finds each copy; reused: nothing copied again.
        assert e["copies_made"] == 30 - expect_hits, run
        assert e["decoded_from_stage"] == 30 and e["decoded_from_source"] == 0, run
        report = format_report(result)
        (epoch_line,) = [line for line in report.splitlines() if line.startswith("epoch 0:")]
        samples, hits, misses = _numbers(epoch_line)[1:]
        assert (samples, hits, misses) == (30, expect_hits, 30 - expect_hits), epoch_line
        (stage3,) = [line for line in report.splitlines() if line.strip().startswith("stage 3 ")]
        assert sum(_numbers(stage3)[1:]) == 30, stage3  # every sample read once, from one place
        assert "already staged" not in report  # the run-wide count that included the next epoch


def test_stats_lists_the_epochs_asked_for_and_its_totals_are_their_sums(make_folder, tmp_path):
    cat = prestage.Catalog.from_folder(make_folder(2, 6, size=(16, 16)))  # 12 images, 3 batches
    with prestage.Loader(cat, batch_size=4, stage_dir=tmp_path / "stage", seed=1) as loader:
        assert [e["epoch"] for e in loader.stats()["epochs"]] in ([], [0])
        for epoch in range(4):
            for _ in loader:
                pass
            # Bounded: the epoch delivered, however far the pipeline planned ahead.
            assert [e["epoch"] for e in loader.stats()["epochs"]] == [epoch]
        assert [e["epoch"] for e in loader.stats(epochs=[1, 2])["epochs"]] == [1, 2]
        assert [e["epoch"] for e in loader.stats(epochs=3)["epochs"]] == [3]
        with pytest.raises(prestage.ConfigError):
            loader.stats(epochs="some")
    every = loader.stats(epochs="all")
    assert [e["epoch"] for e in every["epochs"]][:4] == [0, 1, 2, 3]
    # The totals are the epochs' sums, planned-ahead epochs included.
    assert every["hits"] == sum(e["decoded_from_stage"] for e in every["epochs"])
    assert every["misses"] == sum(e[f"decoded_from_{t}"] for e in every["epochs"] for t in TIERS[1:])
    assert every["source_reads"] == sum(e["source_reads"] for e in every["epochs"])
    for e in every["epochs"][:4]:  # each whole epoch: every sample once, hits and misses alike
        assert e["hits"] + e["misses"] == 12
        assert sum(e[f"decoded_from_{t}"] for t in TIERS) == 12
