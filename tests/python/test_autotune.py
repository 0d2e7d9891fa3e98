"""The online self-tuning (autotune) on a real pipeline: an I/O-bound stage 2 over the emulated parallel
file system (prestage-pfs, 10 ms per open and per read) gets more reads in flight, each decision logged at INFO
and recorded in the I/O trace; values given and autotune=False are never changed."""

import logging

import pytest

import prestage

FILES = 1600
BATCH = 8


@pytest.fixture
def slow_source(tmp_path, pfs):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(FILES):
        (src / f"{i:04d}.bin").write_bytes(i.to_bytes(4, "little") * 4)
    # Opens and reads take 10 ms; lookups none, so that the catalog is made at once.
    emulator = pfs(src, latency_ms=0, open_ms=10, read_ms=10, getattr_ms=0)
    return prestage.Catalog.from_folder(emulator.mountpoint, extensions=(".bin",)), tmp_path


def run_epoch(catalog, tmp_path, **options):
    stage = tmp_path / f"stage-{len(list(tmp_path.glob('stage-*')))}"
    trace = tmp_path / "run.trace"
    seen = 0
    with prestage.Loader(catalog, batch_size=BATCH, decode="raw", stage_dir=str(stage),
                         trace=str(trace), **options) as loader:
        start = loader.options  # the values it starts from (given or sized to the machine)
        for batch in loader:
            for k in range(len(batch)):
                # Every sample's bytes are its file's index, four times: nothing lost or mixed up.
                index = int(batch.indices[k])
                data = bytes(batch.data[batch.offsets[k]:batch.offsets[k + 1]])
                assert data == int(catalog.source_path(index).stem).to_bytes(4, "little") * 4
            seen += len(batch)
        stats = loader.stats()
    assert seen == FILES
    stats["start"] = {"reads_in_flight": start.prefetchers, "lookahead": start.lookahead}
    return stats, trace


def test_an_io_bound_stage_2_gets_more_reads_in_flight_logged_and_traced(slow_source, caplog):
    catalog, tmp_path = slow_source
    with caplog.at_level(logging.INFO, logger="prestage"):
        stats, trace = run_epoch(catalog, tmp_path)
    tuning = stats["tuning"]
    assert tuning["on"] is True
    # 16 reads in flight (the machine-sized start) at 10 ms per open and per read cap stage 2 at
    # about 800 files/s (2 s for the epoch of 1,600), where the consumer takes raw bytes at many
    # times that; doubling them doubles the rate, a step the tuner keeps.
    start = stats["start"]["reads_in_flight"]
    assert start >= 16
    step = f"reads_in_flight {start} -> {2 * start}"
    assert tuning["reads_in_flight"] > start, tuning["log"]
    assert tuning["steps_kept"] >= 1
    assert 0 < tuning["settled_s"] < stats["wall_s"]
    assert any(step in line for line in tuning["log"])
    logged = [r.getMessage() for r in caplog.records if r.name == "prestage"]
    assert any(step in m for m in logged)
    assert len(logged) == len(tuning["log"])  # one line per decision
    header, records = prestage.trace.read(trace)
    changes = [(c["knob"], c["from"], c["to"]) for c in header["tuning"]]
    assert ("reads_in_flight", start, 2 * start) in changes
    assert len(changes) == len(tuning["log"])
    assert (records["kind"] != prestage.trace.TUNE_KIND).all()  # reads only


@pytest.mark.parametrize("options", [{"autotune": False}, {"prefetchers": 4, "readers": 2,
                                                           "lookahead": 4}],
                         ids=["autotune-off", "all-given"])
def test_values_given_or_autotune_off_are_never_changed(slow_source, options):
    catalog, tmp_path = slow_source
    stats, trace = run_epoch(catalog, tmp_path, **options)
    tuning = stats["tuning"]
    assert tuning["on"] is False
    assert tuning["log"] == [] and tuning["steps_kept"] == 0
    assert tuning["reads_in_flight"] == stats["start"]["reads_in_flight"]
    assert tuning["lookahead"] == stats["start"]["lookahead"]
    if "prefetchers" in options:
        assert tuning["reads_in_flight"] == 4 and tuning["lookahead"] == 4
    header, _ = prestage.trace.read(trace)
    assert header["tuning"] == []


def test_a_value_given_stays_while_the_others_are_tuned(slow_source):
    catalog, tmp_path = slow_source
    stats, _ = run_epoch(catalog, tmp_path, prefetchers=4)
    tuning = stats["tuning"]
    assert tuning["on"] is True
    assert tuning["reads_in_flight"] == 4
    assert not any(line.split(": ", 1)[1].startswith("reads_in_flight") for line in tuning["log"])


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "1G"])
def test_a_bad_memory_budget_is_a_config_error(folder, value):
    with pytest.raises(prestage.ConfigError, match="memory_budget"):
        prestage.Loader(prestage.Catalog.from_folder(folder), batch_size=4, memory_budget=value)


def test_memory_budget_is_reported(folder):
    with prestage.Loader(prestage.Catalog.from_folder(folder), batch_size=4,
                         memory_budget=1 << 30) as loader:
        assert loader.stats()["tuning"]["memory_budget"] == 1 << 30
    with prestage.Loader(prestage.Catalog.from_folder(folder), batch_size=4) as loader:
        assert loader.stats()["tuning"]["memory_budget"] > 0


def test_a_small_memory_budget_lowers_the_machine_sized_reads_in_flight(tmp_path):
    src = tmp_path / "big"
    src.mkdir()
    for i in range(8):
        (src / f"{i}.bin").write_bytes(bytes([i]) * (1 << 20))
    catalog = prestage.Catalog.from_folder(src, extensions=(".bin",))
    # Half of 6 MiB holds 3 files of 1 MiB: the 16 reads in flight sized to the machine drop to the
    # floor of 4 (a given value would stay).
    with prestage.Loader(catalog, batch_size=2, decode="raw", memory_budget=6 << 20) as loader:
        assert loader.options.prefetchers == 4
        why = loader.stats()["threads_why"]
        assert "prefetchers lowered from 16 to 4" in why
        # 8 batches of 2 MiB read ahead do not fit in 3 MiB either.
        assert loader.options.lookahead == 4 and "lookahead lowered from 8 to 4" in why
        assert sum(len(b) for b in loader) == 8
    with prestage.Loader(catalog, batch_size=2, decode="raw", memory_budget=6 << 20,
                         prefetchers=12) as loader:
        assert loader.options.prefetchers == 12
        assert "prefetchers lowered" not in loader.stats()["threads_why"]
    with prestage.Loader(catalog, batch_size=2, decode="raw", memory_budget=1 << 30) as loader:
        assert loader.options.prefetchers >= 16
        assert "lowered" not in loader.stats()["threads_why"]
