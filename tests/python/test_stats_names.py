"""The names of stats(), in their order, are those the loader has always given: the bindings make
the dict from the table each struct of stats.hpp keeps (tests/cpp/stats_test.cpp checks that the
tables list every field), and these lists, taken from a loader with every feature on before the
tables moved there, are the oracle a renamed, lost or reordered key fails against."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import prestage

STAGE = ["busy_s", "idle_s", "items", "bytes"]
TUNING = ["on", "readers", "reads_in_flight", "lookahead", "steps_kept", "steps_undone",
          "settled_s", "memory_budget", "log"]
MEMORY = ["batch_buffers", "read_ahead", "decode_scratch"]
SKIPPED = ["path", "error", "sample", "replacement", "epoch", "batch"]
EPOCH = ["epoch", "hits", "misses", "evictions", "source_reads", "bytes_from_source",
         "copies_made", "copies_adopted", "peer_reads", "bytes_from_peers", "decoded_from_stage",
         "decoded_from_memory", "decoded_from_peers", "decoded_from_source"]
GPU_DECODE = ["on", "why", "batches", "hardware", "gpu", "cpu_share", "cpu_unsupported",
              "cpu_gpu_failed", "cpu_replacements", "buffer_growths", "decoders", "share",
              "share_auto", "share_why", "share_moves", "gpu_ms_per_image", "cpu_ms_per_image",
              "crop", "crop_why", "roi"]
SOURCE = ["name", "reads", "bytes", "samples", "latency_ms", "mbs", "down", "probes"]
STATS = ["wall_s", "batches", "samples", "consumer_stall_s", "plan", "stage", "decode",
         "threads_why", "usable_cpus", "local_ranks", "stage_patience", "tuning", "memory",
         "staged_files", "adopted_files", "already_staged", "stage_failures", "stage_corrupt",
         "stage_expedited", "read_ahead", "read_ahead_bytes", "stage_dir_disabled",
         "stage_dir_error", "hits", "misses", "misses_read_ahead", "misses_staged",
         "missed_bytes", "bytes_from_source", "bytes_from_stage", "source_reads", "source_bytes", "skipped",
         "skipped_samples", "pinned", "pinned_why", "cache_bytes", "stage_bytes",
         "stage_bytes_peak", "epochs", "peer_tier", "peer_tier_why", "peer_reads", "peer_bytes",
         "peer_probes", "peer_probe_bytes", "peer_fallbacks", "peer_corrupt", "beyond_budget",
         "peer_served", "peer_served_bytes", "peers_down", "peers_closed", "peer_reads_to_pfs",
         "peer_home_first", "sources", "gpu_decode"]


def test_stats_keeps_its_names_and_their_order_with_every_feature_on(make_folder, tmp_path):
    # A stage directory too small for the set (read-ahead, evictions), a sample that fails
    # (skipped), the self-tuning, a trace, two epochs listed.
    data = make_folder(2, 8, size=(24, 32))
    (data / "class_0" / "img_000.jpg").write_bytes(b"not a jpeg")
    cat = prestage.Catalog.from_folder(data)
    with prestage.Loader(cat, batch_size=4, stage_dir=tmp_path / "stage", cache_bytes=4000,
                         on_error="skip", autotune=True, trace=tmp_path / "run.trace") as loader:
        for _ in range(2):
            for _batch in loader:
                pass
        s = loader.stats(epochs="all")
    assert list(s) == STATS
    for name in ("plan", "stage", "decode"):
        assert list(s[name]) == STAGE, name
    assert list(s["tuning"]) == TUNING
    assert list(s["memory"]) == MEMORY
    assert list(s["gpu_decode"]) == GPU_DECODE
    assert s["skipped"] >= 1 and s["read_ahead"] >= 1  # the features the lists below need ran
    assert [list(k) for k in s["skipped_samples"]] == [SKIPPED] * len(s["skipped_samples"])
    assert len(s["epochs"]) >= 2 and [list(e) for e in s["epochs"]] == [EPOCH] * len(s["epochs"])
    assert s["bytes_from_source"] == s["missed_bytes"]  # the former name, kept for scripts
    assert s["sources"] == []  # the peer tier's: in the test below


MPIRUN = shutil.which("mpirun")
PLUGIN = Path(prestage.__file__).parent / "libprestage_mpi.so"

# One of two ranks, each an emulated node of its own with the peer tier on: prints rank 0's figures.
RANK = textwrap.dedent("""
    import json, os, sys
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    os.environ["PRESTAGE_NODE"] = str(rank)
    import prestage
    cat = prestage.Catalog.load(sys.argv[1])
    with prestage.Loader(cat, batch_size=4, rank=rank, world_size=2, peers=True, decode="raw",
                         stage_dir=os.path.join(sys.argv[2], f"node{rank}")) as loader:
        for _batch in loader:
            pass
        stats = loader.stats()
    if rank == 0:
        print(json.dumps(stats))
""")


@pytest.mark.skipif(MPIRUN is None, reason="mpirun not found (install openmpi-bin)")
@pytest.mark.skipif(not PLUGIN.exists(), reason="libprestage_mpi.so not built (MPI not found)")
def test_the_peer_tiers_sources_keep_their_names(make_folder, tmp_path):
    catalog = tmp_path / "set.catalog"
    prestage.Catalog.from_folder(make_folder(2, 4, size=(24, 32))).save(catalog)
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none")
    r = subprocess.run([MPIRUN, "--oversubscribe", "--allow-run-as-root", "-np", "2",
                        sys.executable, str(script), str(catalog), str(tmp_path / "stage")],
                       env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    s = json.loads(r.stdout.strip().splitlines()[-1])
    assert s["peer_tier"], s["peer_tier_why"]
    assert list(s) == STATS
    assert s["sources"] and [list(x) for x in s["sources"]] == [SOURCE] * len(s["sources"])
