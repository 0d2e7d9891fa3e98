"""The peer tier over MPI: 4 ranks under mpirun on one host, as 2 emulated nodes of 2 ranks
(PRESTAGE_NODE), one stage directory per node, reading through the emulated PFS. Over 3 epochs every
file is opened on the PFS once, the batches are those of a run without peers, each node fetches
from the other what the plan predicts (computed here from prestage.plan alone), once per file: a
fetched sample stays on the node's SSD and is read there next time; a bounded node reads the PFS no
more than without the tier; a record read from a peer moves the record's bytes, not its shard; a rank
that closes says goodbye and one that stalls costs the others one peer_timeout (both are then marked
down and their files read from the source at once), no close waits on a closed peer, a corrupted home copy
is caught by its CRC and read again, and a launch without mpirun reports the tier off."""

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import prestage
from prestage.plan import epoch_batches

MPIRUN = shutil.which("mpirun")
PLUGIN = Path(prestage.__file__).parent / "libprestage_mpi.so"
pytestmark = [
    pytest.mark.skipif(MPIRUN is None, reason="mpirun not found (install openmpi-bin)"),
    pytest.mark.skipif(not PLUGIN.exists(), reason="libprestage_mpi.so not built (MPI not found)"),
]

WORLD, BATCH, SEED = 4, 5, 3
RANKS_PER_NODE = 2

# One rank. Node = rank // 2 (PRESTAGE_NODE), stage directory per node (cache_bytes: one for all, or
# a list of one per node). Runs `epochs` epochs with a barrier after each (as a training step's
# all-reduce makes); its batches in flight (lookahead 1, depth 2) are fewer than an epoch's. Writes per batch the indices and a digest of the bytes, the
# samples whose bytes differ from the backing file (decode="raw" of whole files), and its figures. `stop_rank` closes its loader
# after epoch 0 (a peer that stops answering); `corrupt` = [rank, file id]: that rank flips a byte
# of its node's copy of the file after epoch 0, in place; [rank, "all"]: the first 64 bytes of every
# copy of its node (the other ranks wait until it is done). `stall_rank` stops itself (SIGSTOP: its
# progress thread too, as a hung node) after epoch 0 until the other ranks have their batches; then it
# goes on to close. Each rank's close() is timed.
RANK = textwrap.dedent("""
    import glob, hashlib, json, os, signal, sys, time
    from pathlib import Path
    cfg = json.loads(sys.argv[1])
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    node = rank // cfg["per_node"]
    os.environ["PRESTAGE_NODE"] = str(node)
    import prestage
    cat = prestage.Catalog.load(cfg["catalog"])
    stage = os.path.join(cfg["stage"], f"node{node}")
    barrier = cfg["barrier"]
    live = [r for r in range(cfg["world"]) if r not in (cfg["stop_rank"], cfg["stall_rank"])]

    def wait(name, ranks):
        Path(barrier, f"{name}-{rank}").touch()
        while not all(Path(barrier, f"{name}-{r}").exists() for r in ranks):
            time.sleep(0.005)

    batches, wrong, ended = [], [], []
    cache_bytes = cfg["cache_bytes"]
    cache_bytes = cache_bytes[node] if isinstance(cache_bytes, list) else cache_bytes
    loader = prestage.Loader(cat, batch_size=cfg["batch"], stage_dir=stage, rank=rank,
                             world_size=cfg["world"], seed=cfg["seed"], prefetchers=3, lookahead=1,
                             depth=2, cache_bytes=cache_bytes, peers=cfg["peers"],
                             peer_timeout=cfg["peer_timeout"], **cfg["loader"])
    for epoch in range(cfg["epochs"]):
        if rank in (cfg["stop_rank"], cfg["stall_rank"]) and epoch > 0:
            break
        for b in loader:
            data = b.data.tobytes()
            batches.append([epoch, [int(i) for i in b.indices], hashlib.sha256(data).hexdigest()])
            for k, i in enumerate(b.indices if cfg["loader"]["decode"] == "raw" else []):
                got = b.data[b.offsets[k]:b.offsets[k + 1]].tobytes()
                if got != (Path(cfg["backing"]) / cat.path(int(i))).read_bytes():
                    wrong.append(int(i))
        wait(f"e{epoch}", live if epoch > 0 else range(cfg["world"]))
        ended.append(time.monotonic())
        if epoch == 0 and cfg["corrupt"] and cfg["corrupt"][0] == rank:
            f = cfg["corrupt"][1]
            if f == "all":  # the first 64 bytes of every copy of the node, in place
                copies = glob.glob(os.path.join(stage, "prestage-*", "[0-9a-f][0-9a-f]", "*"))
            else:
                copies = glob.glob(os.path.join(stage, "prestage-*", f"{f % 256:02x}", f"{f:x}"))
                assert len(copies) == 1
            for copy in copies:
                if copy.endswith(".part"):
                    continue
                raw = bytearray(Path(copy).read_bytes())
                span = range(min(64, len(raw))) if f == "all" else [len(raw) // 2]
                for k in span:
                    raw[k] ^= 0xFF
                with open(copy, "r+b") as out:
                    out.write(bytes(raw))
            wait("corrupted", range(cfg["world"]))
        elif epoch == 0 and cfg["corrupt"]:
            wait("corrupted", range(cfg["world"]))
        if epoch == 0 and cfg["stop_rank"] >= 0:
            if rank == cfg["stop_rank"]:
                loader.close()  # answers no more
            wait("ready", range(cfg["world"]))
        if epoch == 0 and rank == cfg["stall_rank"]:
            Path(barrier, "stalled-pid").write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGSTOP)  # until rank 0 sends SIGCONT
    if cfg["stall_rank"] >= 0 and rank == 0:
        wait("lived", live)
        os.kill(int(Path(barrier, "stalled-pid").read_text()), signal.SIGCONT)
    elif cfg["stall_rank"] >= 0 and rank in live:
        wait("lived", live)
    wait("done", range(cfg["world"]))  # every rank answers until all have their batches
    closing = time.monotonic()
    loader.close()
    close_s = time.monotonic() - closing
    Path(cfg["out"], f"{rank}.json").write_text(json.dumps({
        "stats": loader.stats(epochs="all"), "close_s": close_s, "ended": ended, "batches": batches,
        "wrong": wrong, "stage": cfg["stage"]}))
    wait("closed", range(cfg["world"]))
""")


@pytest.fixture
def job(make_folder, pfs, tmp_path):
    """(run(**config) -> per-rank results, catalog, emulator, backing): mpirun jobs over one data set
    of 120 files served by the PFS emulator."""
    backing = make_folder(4, 30, size=(24, 32))
    # A PFS slower than the peers (20 ms per operation; peers on one host answer within a few ms):
    # each read goes to the source expected to finish it first, here the home copy.
    emulator = pfs(backing, latency_ms=20)
    cat = prestage.Catalog.from_folder(emulator.mountpoint)
    return mpi_jobs(tmp_path, cat, backing), cat, emulator, backing


def mpi_jobs(tmp_path, cat, backing, loader=None):
    """run(**config) -> per-rank results: mpirun jobs over catalog `cat` (of files under `backing`,
    served by a PFS emulator), each rank's loader made with `loader` (default decode="raw")."""
    catalog = tmp_path / "set.catalog"
    cat.save(catalog)
    loader = loader or dict(decode="raw")
    runs = []

    # A fetch waits for its owner's home copy while the owner is still in epoch 0 (it is coming); on a
    # loaded machine that took more than 10 s once (a CI check: one fallback), so the jobs that count
    # on no fallback give it a minute. The stalled-peer test passes its own, short timeout.
    # `stage`: the stage directories' parent (default: a new one), e.g. an earlier run's.
    def run(peers=True, epochs=3, cache_bytes=0, peer_timeout=60.0, stop_rank=-1, corrupt=None,
            env=None, stall_rank=-1, stage=None, world=WORLD, per_node=RANKS_PER_NODE):
        n = len(runs)
        runs.append(n)
        base = tmp_path / f"run{n}"
        for d in ("stage", "barrier", "out"):
            (base / d).mkdir(parents=True)
        cfg = dict(catalog=str(catalog), backing=str(backing), stage=str(stage or base / "stage"),
                   barrier=str(base / "barrier"), out=str(base / "out"), world=world, batch=BATCH,
                   seed=SEED, epochs=epochs, cache_bytes=cache_bytes, peers=peers,
                   peer_timeout=peer_timeout, stop_rank=stop_rank, corrupt=corrupt,
                   stall_rank=stall_rank, loader=loader, per_node=per_node)
        script = base / "rank.py"
        script.write_text(RANK)
        environment = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none",
                           **(env or {}))
        r = subprocess.run([MPIRUN, "--oversubscribe", "--allow-run-as-root", "-np", str(world),
                            sys.executable, str(script), json.dumps(cfg)],
                           env=environment, capture_output=True, text=True, timeout=240)
        assert r.returncode == 0, r.stdout + r.stderr
        return [json.loads((base / "out" / f"{rank}.json").read_text()) for rank in range(world)]

    return run


def ownership(cat, backing, budget=0):
    """The rule, from prestage.plan alone: per file, its owner rank (the first to use it in epoch 0:
    lowest batch, then lowest rank) and whether it is within its owner node's home budget (the
    node's files in order of first use while they fit; 0: no budget)."""
    plans = [epoch_batches(len(cat), BATCH, SEED, 0, rank=r, world_size=WORLD) for r in range(WORLD)]
    owner, order = {}, {}
    for b in range(len(plans[0])):
        for r in range(WORLD):
            for i in plans[r][b]:
                if i not in owner:
                    owner[i] = r
                    order.setdefault(r // RANKS_PER_NODE, []).append(i)
    home = set()
    for files in order.values():
        used = 0
        for i in files:
            size = (backing / cat.path(i)).stat().st_size
            if budget and used + size > budget:
                break
            used += size
            home.add(i)
    return owner, home


def node_uses(cat, node, epoch):
    """The samples the ranks of node `node` use in `epoch`."""
    return {i for r in range(node * RANKS_PER_NODE, (node + 1) * RANKS_PER_NODE)
            for batch in epoch_batches(len(cat), BATCH, SEED, epoch, rank=r, world_size=WORLD)
            for i in batch}


def test_each_file_is_read_from_the_pfs_once_and_peers_serve_what_the_plan_predicts(job):
    run, cat, emulator, backing = job
    plain = run(peers=False)
    before = emulator.stats()["paths"]
    ranks = run(peers=True)
    after = emulator.stats()["paths"]

    # Every file opened on the PFS once over the 3 epochs, but for two kinds of reads. Past them, a
    # rank still reads ahead into epoch 3 (which no one consumes) until it closes; a peer that
    # closed first has said goodbye, so such a read goes to the PFS: a second open, counted in epoch
    # 3's source_reads. And a rank's first reads of the other node's home copies, made before its
    # source model has learned the link, go to the PFS (counted in peer_reads_to_pfs): the link is
    # probed beside them, on a thread of its own, so that no read waits on a link that may be
    # slower than the PFS. So the opens are the set's files plus those reads, never more.
    opened = {p: c["opens"] - before.get(p, {"opens": 0})["opens"] for p, c in after.items()}
    assert sorted(p for p, n in opened.items() if n) == sorted(cat.path(i) for i in range(len(cat)))
    past_the_end = sum(e["source_reads"] for r in ranks for e in r["stats"]["epochs"] if e["epoch"] >= 3)
    to_pfs = [r["stats"]["peer_reads_to_pfs"] for r in ranks]
    keys = ("source_reads", "peer_reads", "peer_reads_to_pfs", "peer_fallbacks", "peer_corrupt",
            "stage_corrupt", "misses", "stage_expedited", "stage_failures", "peers_down")
    extra = sum(opened.values()) - len(cat) - past_the_end
    assert 0 <= extra <= sum(to_pfs), json.dumps(
        [{p: n for p, n in opened.items() if n > 1}, [{k: r["stats"][k] for k in keys} for r in ranks],
         [r["stats"]["epochs"] for r in ranks]])
    # Those are a few per rank: once the link is learned (faster than the PFS here), its reads go to it.
    assert sum(to_pfs) <= sum(r["stats"]["peer_reads"] for r in ranks) // 4, to_pfs
    for r in ranks:
        s = r["stats"]
        assert s["peer_tier"] and s["peer_tier_why"] == ""
        assert s["peer_fallbacks"] == 0 and s["peer_corrupt"] == 0 and s["beyond_budget"] == 0
        assert r["wrong"] == []
    assert len(cat) <= sum(e["source_reads"] for r in ranks for e in r["stats"]["epochs"]
                           if e["epoch"] < 3) <= len(cat) + sum(to_pfs)
    # The batches are those of the run without peers, byte for byte.
    assert [r["batches"] for r in ranks] == [r["batches"] for r in plain]
    assert all(r["wrong"] == [] for r in plain)
    # Peer reads per node: what the plan says. Epoch 0 is all home copies. From then on each file of
    # the other node that a node uses is fetched once, at its first use, onto the node's SSD, and
    # read there at every later use (fetched samples stay: the stage directory has room for all);
    # but those its ranks read from the PFS while they learned the link.
    # Which rank of the node fetches it, and so in which epoch's figures, depends on timing: a rank
    # plans the next epoch's first batches before its neighbour has finished this one, and epoch 3
    # is what the ranks read ahead before they closed.
    owner, home = ownership(cat, backing)
    assert len(home) == len(cat)
    size = {i: (backing / cat.path(i)).stat().st_size for i in range(len(cat))}
    for r in ranks:
        epochs = {e["epoch"]: e for e in r["stats"]["epochs"]}
        assert epochs[0]["bytes_from_peers"] == 0
        for epoch in (1, 2):
            # Every read of these epochs is a copy to the node's SSD: from a peer, or from the PFS
            # (epoch 1 is planned while the neighbour is still in epoch 0: a home copy it had not
            # made yet is made by this rank instead, the node's one read of that file).
            assert epochs[epoch]["source_reads"] + epochs[epoch]["peer_reads"] == \
                epochs[epoch]["copies_made"], (epoch, epochs)
        assert epochs[2]["source_reads"] == 0
    for node in range(WORLD // RANKS_PER_NODE):
        mine = ranks[node * RANKS_PER_NODE:(node + 1) * RANKS_PER_NODE]

        def total(key, epochs):
            return sum(e[key] for r in mine for e in r["stats"]["epochs"] if e["epoch"] in epochs)

        uses = {e: node_uses(cat, node, e) for e in (1, 2, 3)}
        theirs = {e: {i for i in uses[e] if owner[i] // RANKS_PER_NODE != node} for e in uses}
        needed = theirs[1] | theirs[2]  # fetched by the end of epoch 2
        at_most = needed | theirs[3]
        learning = sum(to_pfs[node * RANKS_PER_NODE:(node + 1) * RANKS_PER_NODE])
        assert len(needed) - learning <= total("peer_reads", (1, 2, 3)) <= len(at_most), \
            (node, len(needed), learning)
        least = sorted(size[i] for i in needed)[:max(len(needed) - learning, 0)]
        assert sum(least) <= total("bytes_from_peers", (1, 2, 3)) <= sum(size[i] for i in at_most)
        # Epoch 2 reads from the node's SSD the samples it fetched in epoch 1: every use in epochs 1
        # and 2 is a hit but each fetched file's first (a neighbour's copy counts as a hit).
        assert theirs[1] & uses[2]
        assert total("hits", (1, 2)) >= len(uses[1]) + len(uses[2]) - len(needed), node
    # What one node served is what the other fetched, but for answers that reached a rank after it
    # had closed (its reads ahead into epoch 3, above).
    assert sum(r["stats"]["peer_served_bytes"] for r in ranks) >= \
        sum(r["stats"]["peer_bytes"] for r in ranks)
    # The model's view: the peers faster than the PFS, so no read went to the PFS instead but while
    # the link was learned (bounded above, for the job); the link was probed to learn it, and its
    # reads are those the tier served and its probes.
    for r in ranks:
        s = r["stats"]
        sources = {row["name"]: row for row in s["sources"]}
        peers = [row for name, row in sources.items() if name.startswith("node ")]
        assert s["peer_reads_to_pfs"] == 0 or sum(row["probes"] for row in peers) >= 1, s["sources"]
        # A link read under way when its peer closed at the job's end is counted by the model (a
        # read sent, SourceModel::done) and is no peer read (none was served): one at most per
        # thread that reads (stage 2's 3, stage 3's readers) per peer closed.
        in_flight = s["peers_closed"] * (3 + s["tuning"]["readers"])
        link_reads = sum(row["reads"] - row["probes"] for row in peers)
        assert s["peer_reads"] <= link_reads <= s["peer_reads"] + in_flight, (link_reads, s["peer_reads"])
        assert sources["pfs"]["samples"] > 0 and sources["pfs"]["mbs"] > 0
    # Ending: a rank that closes says goodbye, so no close waits on a peer that has closed (the
    # read-ahead of the next epoch asks peers too): far below the 60 s peer_timeout.
    assert max(r["close_s"] for r in ranks) < 10
    assert all(r["stats"]["peers_down"] == 0 for r in ranks)  # none stopped answering
    assert all(r["stats"]["peers_closed"] <= WORLD - 1 for r in ranks)


def format_set(kind, root, make_folder, write_tfrecord):
    """A data set of 120 samples in format `kind` under `root`: (catalog builder over a root, loader
    options). Arrays are small and of one shape, so every batch is one array."""
    rng = np.random.default_rng(7)
    root.mkdir()
    if kind == "jpeg":
        images = make_folder(4, 30, size=(24, 32), name="jpeg")
        for d in images.iterdir():
            shutil.move(str(d), root / d.name)
        return lambda top: prestage.Catalog.from_folder(top), dict(decode="jpeg", image_size=(16, 16))
    if kind in ("npy", "npz"):  # one sample per file
        for c in range(4):
            (root / f"c{c}").mkdir()
            for k in range(30):
                a = rng.standard_normal((6, 5)).astype(np.float32)
                if kind == "npy":
                    np.save(root / f"c{c}" / f"{k}.npy", a)
                else:
                    np.savez(root / f"c{c}" / f"{k}.npz", x=a, y=a[0])
        options = dict(decode="npy") if kind == "npy" else dict(decode="npz", array_name="x")
        return (lambda top: prestage.Catalog.from_folder(top, extensions=[f".{kind}"])), options
    names = [f"part{f}" for f in range(6)]  # 20 samples per file
    if kind in SHARD_KINDS:  # JPEGs at byte ranges of another library's shards
        return shard_set(kind, root, rng), dict(decode="jpeg", image_size=(16, 16))
    if kind == "npy rows":
        for n in names:
            np.save(root / f"{n}.npy", rng.standard_normal((20, 7, 3)).astype(np.float32))
        return (lambda top: prestage.Catalog.from_arrays(sorted(Path(top).glob("*.npy")))), \
            dict(decode="npy")
    if kind == "hdf5 rows":
        import h5py
        for n in names:
            with h5py.File(root / f"{n}.h5", "w") as f:
                f["x"] = rng.standard_normal((20, 7, 3)).astype(np.float32)
        return (lambda top: prestage.Catalog.from_hdf5(sorted(Path(top).glob("*.h5")), "x")), \
            dict(decode="hdf5")
    assert kind == "tfrecord"
    for n in names:
        write_tfrecord(root / f"{n}.tfrecord",
                       [{"data": rng.integers(0, 256, 40, dtype=np.uint8).tobytes()} for _ in range(20)])
    return (lambda top: prestage.Catalog.from_tfrecord(sorted(Path(top).glob("*.tfrecord")),
                                                       features={"image": "data"})), dict(decode="raw")


# Other libraries' shards, written by their own writers (MDS as conftest's write_mds writes it).
SHARD_KINDS = ("webdataset", "mds", "hf-arrow")


def shard_set(kind, root, rng):
    """120 JPEGs in 6 shards of `kind` under `root`: the catalog builder over a root."""
    import io

    from PIL import Image

    from conftest import write_mds

    def jpeg():
        out = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)).save(out, format="JPEG")
        return out.getvalue()

    images = [jpeg() for _ in range(120)]
    if kind == "webdataset":
        wds = pytest.importorskip("webdataset")
        with wds.ShardWriter(str(root / "train-%06d.tar"), maxcount=20, verbose=0) as sink:
            for i, image in enumerate(images):
                sink.write({"__key__": f"s{i:05d}", "jpg": image, "cls": str(i % 4).encode()})
        return lambda top: prestage.Catalog.from_webdataset(sorted(Path(top).glob("*.tar")))
    if kind == "mds":
        write_mds(root, {"image": "jpeg", "label": "int"},
                  [{"image": image, "label": i % 4} for i, image in enumerate(images)], per_shard=20)
        return lambda top: prestage.Catalog.from_mds(top)
    datasets = pytest.importorskip("datasets")
    pytest.importorskip("pyarrow")
    datasets.disable_progress_bars()
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    ds = datasets.Dataset.from_dict({"image": [{"bytes": b, "path": None} for b in images],
                                     "label": [i % 4 for i in range(120)]}, features=features)
    ds.save_to_disk(str(root), num_shards=6)
    return lambda top: prestage.Catalog.from_hf(top)


@pytest.mark.parametrize("kind", ["npy", "npz", "npy rows", "hdf5 rows", "tfrecord", "jpeg", *SHARD_KINDS])
def test_every_format_reads_each_file_from_the_pfs_once_and_reaches_the_peers(
        kind, make_folder, write_tfrecord, pfs, tmp_path):
    # Arrays read whole or in slices, TFRecord records, JPEGs: stage 3 reads them through the same
    # tiers as stage 2 (memory, the node's copy, a peer's home copy, the PFS), so over 3 epochs each
    # file is opened on the PFS once, whatever its format.
    backing = tmp_path / "set"
    build, options = format_set(kind, backing, make_folder, write_tfrecord)
    emulator = pfs(backing, latency_ms=20)
    cat = build(emulator.mountpoint)
    assert len(cat) == 120
    run = mpi_jobs(tmp_path, cat, backing, options)
    plain = run(peers=False)
    before = emulator.stats()["paths"]
    ranks = run(peers=True)
    after = emulator.stats()["paths"]
    # The catalog's files (an MDS index.json, a save_to_disk folder's JSON files were read when it
    # was built, before).
    named = {cat.path(i) for i in range(len(cat))}
    files = {p for p in after if (backing / p).is_file() and p in named}
    opened = {p: after[p]["opens"] - before.get(p, {"opens": 0})["opens"] for p in files}
    # Past the 3 epochs a rank still reads ahead into epoch 3 until it closes; a peer that closed
    # first has said goodbye, so such a read goes to the PFS (counted in epoch 3's source_reads).
    past_the_end = sum(e["source_reads"] for r in ranks for e in r["stats"]["epochs"] if e["epoch"] >= 3)
    assert all(n >= 1 for n in opened.values()) and len(opened) == len(named)
    # Arrays of one sample per file (npy, npz): each loader also reads, once, the headers of 5
    # samples spread over the catalog (the data set's dtype: BatchDecoder::kDataSetProbes) where
    # they are when its first batch is laid out: the node's copy, or the PFS (a peer's home copy of
    # them may not be made before late in epoch 0). Rows (from_arrays, from_hdf5) and records have it
    # from their catalog, which reads every file's headers anyway: no probe. No other file is opened
    # twice, but for the reads past the end: stage 3 reads an array's header and then its data each
    # through an open of its own, counted as one read.
    probes = {cat.path(j * len(cat) // 5) for j in range(5)} if kind in ("npy", "npz") else set()
    assert (cat.dtype is None) == (kind in ("npy", "npz", "jpeg", *SHARD_KINDS))
    opens_per_read = 1 if kind in ("jpeg", *SHARD_KINDS) else 2
    extra = {p: n - 1 for p, n in opened.items() if n > 1}
    served = sum(r["stats"]["peer_served_bytes"] for r in ranks)
    taken = sum(r["stats"]["peer_bytes"] for r in ranks)
    late = sum(r["stats"]["peer_served"] for r in ranks) - sum(r["stats"]["peer_reads"] for r in ranks)
    # The figures benchmarks/notes/peer-tier.md quotes in "A peer sends the sample's byte range, not
    # its file" (shown with pytest -s).
    print(json.dumps(dict(kind=kind, files=len(files), pfs_opens=sum(opened.values()),
                          opens_of_probes_or_past_the_end=sum(extra.values()),
                          pfs_bytes=sum(after[p]["bytes"] - before.get(p, {"bytes": 0})["bytes"]
                                        for p in files),
                          peer_reads=sum(r["stats"]["peer_reads"] for r in ranks), peer_bytes=taken,
                          peer_served_bytes=served,
                          reads_to_pfs=sum(r["stats"]["peer_reads_to_pfs"] for r in ranks))))
    # And a rank's first reads of the other node's home copies, made before its source model has
    # learned the link (the link is probed beside them), go to the PFS (peer_reads_to_pfs: how
    # many depends on how long the probes take, 0-5 per rank here). A peer sends only the sample's
    # bytes, so once the link is learned (faster than the PFS of 20 ms per operation) no read of a
    # home copy goes to the PFS: every other file is opened once.
    why = (extra, [(r["stats"]["peer_reads_to_pfs"], r["stats"]["sources"],
                    [(e["epoch"], e["source_reads"]) for e in r["stats"]["epochs"]]) for r in ranks])
    to_pfs = sum(r["stats"]["peer_reads_to_pfs"] for r in ranks)
    assert sum(n for p, n in extra.items() if p not in probes) <= \
        opens_per_read * (past_the_end + to_pfs), why
    assert sum(n for p, n in extra.items()) <= \
        opens_per_read * (past_the_end + to_pfs) + WORLD * len(probes), why
    assert [r["batches"] for r in ranks] == [r["batches"] for r in plain]
    assert sum(r["stats"]["peer_reads"] for r in ranks) > 0
    for r in ranks:
        assert r["stats"]["peer_fallbacks"] == 0 and r["stats"]["peer_corrupt"] == 0
        assert r["stats"]["bytes_from_source"] == r["stats"]["missed_bytes"]  # the former name
    # What the owners sent is what the askers took (a sample's bytes, or a file copied whole), but
    # for answers that reached a rank after it had stopped waiting (past the end): no reply carries
    # a whole file for a sample's range.
    largest = max((backing / p).stat().st_size for p in files)
    assert taken <= served <= taken + late * largest, (served, taken, late)
    # A file a node fetched from the other stays on its SSD (the directory has room for every file),
    # so each node fetches each file at most once, however many of its samples (rows, records) it
    # uses over the 3 epochs.
    for node in range(WORLD // RANKS_PER_NODE):
        mine = ranks[node * RANKS_PER_NODE:(node + 1) * RANKS_PER_NODE]
        assert sum(r["stats"]["peer_reads"] for r in mine) <= len(opened), node


@pytest.mark.parametrize("kind", ["npy", "npz", "npy rows", "hdf5 rows", "tfrecord", "jpeg"])
def test_fewest_pfs_reads_open_each_file_on_a_fast_pfs_once_for_every_format(
        kind, make_folder, write_tfrecord, pfs, tmp_path):
    # A PFS far faster than the links (0.2 ms per operation): with pfs_reads="fastest" the tier reads
    # it again rather than wait for a link. With "fewest" a read of another node's home copy waits
    # for the link, no link is probed, and each file is opened on the PFS once over 3 epochs, but
    # for the reads past the end and the dtype probes of arrays of one sample per file (see
    # test_every_format_reads_each_file_from_the_pfs_once_and_reaches_the_peers).
    backing = tmp_path / "set"
    build, options = format_set(kind, backing, make_folder, write_tfrecord)
    emulator = pfs(backing, latency_ms=0.2)
    cat = build(emulator.mountpoint)
    (tmp_path / "plain").mkdir()
    plain = mpi_jobs(tmp_path / "plain", cat, backing, options)(peers=False)
    run = mpi_jobs(tmp_path, cat, backing, dict(options, pfs_reads="fewest"))
    before = emulator.stats()["paths"]
    ranks = run(peers=True)
    after = emulator.stats()["paths"]
    assert [r["batches"] for r in ranks] == [r["batches"] for r in plain]  # byte for byte
    files = {p for p in after if (backing / p).is_file()}
    opened = {p: after[p]["opens"] - before.get(p, {"opens": 0})["opens"] for p in files}
    past_the_end = sum(e["source_reads"] for r in ranks for e in r["stats"]["epochs"] if e["epoch"] >= 3)
    probes = {cat.path(j * len(cat) // 5) for j in range(5)} if kind in ("npy", "npz") else set()
    opens_per_read = 1 if kind == "jpeg" else 2
    extra = {p: n - 1 for p, n in opened.items() if n > 1}
    print(json.dumps(dict(kind=kind, files=len(files), pfs_opens=sum(opened.values()),
                          past_the_end=past_the_end,
                          peer_reads=sum(r["stats"]["peer_reads"] for r in ranks))))
    assert all(n >= 1 for n in opened.values())
    assert sum(n for p, n in extra.items() if p not in probes) <= opens_per_read * past_the_end, extra
    assert sum(r["stats"]["peer_reads"] for r in ranks) > 0
    for r in ranks:
        s = r["stats"]
        assert s["sources"] == [] and s["peer_reads_to_pfs"] == 0 and s["peer_probes"] == 0
        assert s["peer_fallbacks"] == 0


@pytest.mark.parametrize("kind", ["npy", "npz", "npy rows", "hdf5 rows", "tfrecord", "jpeg"])
def test_the_tier_reads_the_pfs_no_more_than_the_same_job_without_it_for_every_format(
        kind, make_folder, write_tfrecord, pfs, tmp_path):
    # Half the set in the nodes' caches together, a fast PFS (0.2 ms per operation). Two nodes of
    # one rank each, and stage 3 waiting for stage 2 in the job without the tier as it does with it
    # (stage_patience=None): no neighbour's timing then changes what a job reads, so the job without
    # the tier reads the same bytes at every run and a comparison of one run of each is exact.
    # With pfs_reads="fastest" and the link slower than the PFS (emulated: 200 ms per fetch), the
    # node's stage directory is run as with the tier off from the start, while the links are still
    # being learned too (it once kept room for home copies to come, declining in the first epoch
    # files the job without the tier copies once: a row or record file was then read from the PFS
    # a sample at a time, 1.02-1.10x the PFS bytes of the job without the tier); with "fewest" home
    # copies come first and the other node reads them. Either way the job reads the PFS no more
    # than without the tier, whatever the format.
    backing = tmp_path / "set"
    build, options = format_set(kind, backing, make_folder, write_tfrecord)
    # Past the kernel's page cache: a read that the other rank's read of the same file, at the same
    # moment, put in the cache would reach the emulator only once (1 in 3 runs on a loaded machine:
    # "seen" 870 bytes below "counted" for JPEG files).
    emulator = pfs(backing, latency_ms=0.2, extra_args=["--direct-io"])
    cat = build(emulator.mountpoint)
    set_bytes = sum(f.stat().st_size for f in backing.rglob("*") if f.is_file())
    budget = set_bytes // 4  # per node

    def job(name, peers, env=None, **extra):
        (tmp_path / name).mkdir()
        run = mpi_jobs(tmp_path / name, cat, backing, dict(options, **extra))
        before = emulator.stats()["paths"]
        ranks = run(peers=peers, cache_bytes=budget, world=2, per_node=1, env=env)
        after = emulator.stats()["paths"]
        # The job's 3 epochs; the reads past its end (stage 2 reading ahead into epoch 3 until the
        # loader closes) are counted apart, by the loaders as by the emulator.
        epochs = sum(e["bytes_from_source"] for r in ranks for e in r["stats"]["epochs"] if e["epoch"] < 3)
        past = sum(e["bytes_from_source"] for r in ranks for e in r["stats"]["epochs"] if e["epoch"] >= 3)
        seen = sum(after[p]["bytes"] - before.get(p, {"bytes": 0})["bytes"] for p in after)
        return ranks, epochs, past, seen

    plain, without, plain_past, plain_seen = job("plain", False, stage_patience=None)
    slower, fastest, fastest_past, fastest_seen = job("fastest", True, {"PRESTAGE_PEER_LINK": "200,1"},
                                                     pfs_reads="fastest")
    homed, fewest, fewest_past, fewest_seen = job("fewest", True, pfs_reads="fewest")
    # The figures benchmarks/notes/peer-tier.md quotes in "The peer tier reads the PFS no more than
    # the same job without it" (shown with pytest -s).
    print(json.dumps(dict(kind=kind, set_bytes=set_bytes, without=without, fastest=fastest,
                          fewest=fewest, past_the_end=[plain_past, fastest_past, fewest_past],
                          emulator=[plain_seen, fastest_seen, fewest_seen])))
    for ranks in (slower, homed):
        assert [r["batches"] for r in ranks] == [r["batches"] for r in plain]  # byte for byte
        assert all(r["stats"]["peer_tier"] and r["stats"]["peer_fallbacks"] == 0 for r in ranks)
    assert not any(r["stats"]["peer_home_first"] for r in slower)
    assert all(r["stats"]["peer_home_first"] for r in homed)
    # The emulator saw every byte the loaders counted, and no more than a read past the end each
    # (a whole file: the kernel's read of a small file through FUSE is the file) beyond them.
    for seen, counted in ((plain_seen, without + plain_past), (fastest_seen, fastest + fastest_past),
                          (fewest_seen, fewest + fewest_past)):
        assert seen >= counted > 0
    assert fastest <= without, (fastest, without)
    assert fewest <= without, (fewest, without)


def test_fewest_pfs_reads_keep_home_copies_first_on_a_bounded_node(make_folder, pfs, tmp_path):
    # 60% of the set per node over a fast PFS (0.2 ms per operation): each node keeps its home
    # copies ahead of the other node's files (peer_home_first from the start, whatever the links),
    # so every file with a home copy is opened on the PFS once over 3 epochs, but for the reads past
    # the end; a file beyond its owner's budget (none if the split of owners fits) is read each use.
    backing = make_folder(4, 30, size=(24, 32))
    emulator = pfs(backing, latency_ms=0.2)
    cat = prestage.Catalog.from_folder(emulator.mountpoint)
    set_bytes = sum((backing / cat.path(i)).stat().st_size for i in range(len(cat)))
    budget = set_bytes * 6 // 10
    owner, home = ownership(cat, backing, budget)
    run = mpi_jobs(tmp_path, cat, backing, dict(decode="raw", pfs_reads="fewest"))
    before = emulator.stats()["paths"]
    ranks = run(peers=True, epochs=3, cache_bytes=budget)
    after = emulator.stats()["paths"]
    opened = {p: after[p]["opens"] - before.get(p, {"opens": 0})["opens"] for p in after
              if (backing / p).is_file()}
    past_the_end = sum(e["source_reads"] for r in ranks for e in r["stats"]["epochs"] if e["epoch"] >= 3)
    homed = {cat.path(i) for i in home}
    extra = {p: n - 1 for p, n in opened.items() if n > 1 and p in homed}
    assert len(homed) >= len(cat) * 9 // 10
    assert all(opened[p] >= 1 for p in homed)
    assert sum(extra.values()) <= past_the_end, (extra, past_the_end)
    for r in ranks:
        s = r["stats"]
        assert r["wrong"] == [] and s["peer_home_first"] is True and s["peer_probes"] == 0
    assert sum(r["stats"]["peer_reads"] for r in ranks) > 0


def test_a_record_read_from_a_peer_moves_the_record_not_its_shard(make_folder, write_tfrecord, pfs,
                                                                    tmp_path):
    # Node 0 keeps every shard; node 1 has room for none, so it reads a record at a time (stage 2's
    # read-ahead, stage 3): those of node 0's home shards from their owner, which sends that
    # record's bytes alone, the others from the PFS (node 1's own shards have no home copy).
    backing = tmp_path / "set"
    build, options = format_set("tfrecord", backing, make_folder, write_tfrecord)
    emulator = pfs(backing, latency_ms=20)
    cat = build(emulator.mountpoint)
    shard = min(p.stat().st_size for p in backing.iterdir())
    run = mpi_jobs(tmp_path, cat, backing, options)
    cache = [0, shard // 2]
    plain = run(peers=False, cache_bytes=cache)
    ranks = run(peers=True, cache_bytes=cache)
    assert [r["batches"] for r in ranks] == [r["batches"] for r in plain]
    assert all(r["stats"]["peer_corrupt"] == 0 and r["stats"]["peers_down"] == 0 for r in ranks)
    node0, node1 = ranks[:RANKS_PER_NODE], ranks[RANKS_PER_NODE:]

    def total(rs, key):
        return sum(r["stats"][key] for r in rs)

    reads = total(node1, "peer_reads")
    served, taken = total(node0, "peer_served_bytes"), total(node1, "peer_bytes")
    late = total(node0, "peer_served") - reads
    # The figures benchmarks/notes/peer-tier.md quotes in "A peer sends the sample's byte range, not
    # its file" (shown with pytest -s).
    print(json.dumps(dict(records_from_peers=reads, bytes_taken=taken, bytes_served=served,
                          node1_pfs_bytes=total(node1, "source_bytes"),
                          node1_pfs_bytes_without_peers=total(plain[RANKS_PER_NODE:], "source_bytes"))))
    # Node 1 made no copy: each of its reads from node 0 is a record, of a record's bytes (tens of
    # bytes; a shard is 20 records).
    assert sum(e["copies_made"] for r in node1 for e in r["stats"]["epochs"]) == 0
    assert reads > 2 * len(cat) // WORLD, reads
    assert total(node1, "peer_bytes") <= reads * shard // 10
    # And node 0 sent what node 1 took, but for answers that came after an asker had closed: a
    # record's bytes each, not its shard.
    assert taken <= served <= taken + late * shard, (served, taken, late)


def test_a_jobs_answers_served_are_the_answers_its_ranks_used_probed_or_found_corrupt(job):
    # Every answer a rank sends with bytes is counted by its asker: used (peer_reads, peer_bytes),
    # fetched only to measure the link (peer_probes, peer_probe_bytes: the link is new, so each rank
    # probes it), or failed its check (peer_corrupt, none here); but for answers that reach a rank
    # no longer waiting for them, here only those of its read-ahead into epoch 2 when it closes.
    # The ranks stop reading before they close (their look-ahead is full), so that is none.
    run, cat, emulator, backing = job
    ranks = run(peers=True, epochs=2)

    def total(key):
        return sum(r["stats"][key] for r in ranks)

    print(json.dumps({k: total(k) for k in ("peer_served", "peer_served_bytes", "peer_reads", "peer_bytes",
                                             "peer_probes", "peer_probe_bytes", "peer_corrupt")}))
    assert total("peer_corrupt") == 0 and total("peer_probes") >= WORLD and total("peer_reads") > 0
    assert total("peer_served") == total("peer_reads") + total("peer_probes")
    assert total("peer_served_bytes") == total("peer_bytes") + total("peer_probe_bytes")


def test_a_peer_link_slower_than_the_pfs_leaves_the_reads_to_the_pfs(job):
    run, cat, emulator, backing = job
    plain = run(peers=False)
    # The peer link emulated at 200 ms per fetch and 1 MB/s, against the PFS's 20 ms per operation.
    ranks = run(peers=True, env={"PRESTAGE_PEER_LINK": "200,1"})
    assert [r["batches"] for r in ranks] == [r["batches"] for r in plain]
    assert all(r["wrong"] == [] for r in ranks)
    for rank, r in enumerate(ranks):
        s = r["stats"]
        assert s["peer_fallbacks"] == 0 and s["peer_corrupt"] == 0
        sources = {row["name"]: row for row in s["sources"]}
        peers = {name: row for name, row in sources.items() if name.startswith("node ")}
        # The other node's link, named by its lowest rank, is probed until its estimate stands (2
        # probes), then ever more rarely, each on a thread of its own beside a read: every read of
        # its home copies goes to the PFS, none waits on the link.
        assert set(peers) == {f"node {(1 - rank // RANKS_PER_NODE) * RANKS_PER_NODE}"}
        assert s["peer_reads"] == 0
        assert all(row["reads"] == row["probes"] for row in peers.values())
        assert sum(row["probes"] for row in peers.values()) >= 1
        assert s["peer_reads_to_pfs"] > 0
        # Their estimates say why: a file's read expected to take longer there than on the PFS.
        size = sum((backing / cat.path(i)).stat().st_size for i in range(len(cat))) / len(cat)
        ms = {name: row["latency_ms"] + size / (row["mbs"] * 1e3) for name, row in sources.items()
              if row["samples"] and row["mbs"] > 0}
        assert all(ms[name] > ms["pfs"] for name in peers if name in ms) and len(ms) > 1


def test_the_link_is_learned_in_the_start_epoch_where_no_read_crosses_nodes(job):
    # In epoch 0 each file is used by its owner alone: no read asks the other node. The link is
    # probed with the first sample the other node stages, so that its estimate (and with it the
    # layout of the node's stage directory) stands before epoch 1's reads of its copies are planned.
    run, cat, emulator, backing = job
    ranks = run(peers=True, epochs=1)
    assert all(r["wrong"] == [] for r in ranks)
    for rank, r in enumerate(ranks):
        s = r["stats"]
        e0 = [e for e in s["epochs"] if e["epoch"] == 0][0]
        assert e0["peer_reads"] == 0
        link = {row["name"]: row for row in s["sources"]}[
            f"node {(1 - rank // RANKS_PER_NODE) * RANKS_PER_NODE}"]
        assert link["probes"] >= 2 and link["samples"] >= 2 and link["mbs"] > 0, s["sources"]


@pytest.mark.parametrize("link", ["slower", "faster"])
def test_a_bounded_node_reads_the_pfs_no_more_than_without_the_tier(job, link):
    """Half the set per node. With the link slower than the PFS (emulated: 200 ms per fetch) each
    node's stage directory is run as with the tier off; with it faster (MPI on one host against the
    PFS's 20 ms), the node keeps its home copies first, and the other node reads them over the link."""
    run, cat, emulator, backing = job
    set_bytes = sum((backing / cat.path(i)).stat().st_size for i in range(len(cat)))
    budget = set_bytes // 4  # per node: the two nodes hold half the set
    plain = run(peers=False, epochs=3, cache_bytes=budget)
    env = {"PRESTAGE_PEER_LINK": "200,1"} if link == "slower" else None
    ranks = run(peers=True, epochs=3, cache_bytes=budget, env=env)
    assert [r["batches"] for r in ranks] == [r["batches"] for r in plain]
    assert all(r["wrong"] == [] for r in ranks + plain)
    for r in ranks:
        s = r["stats"]
        assert s["peer_tier"] and s["peer_corrupt"] == 0 and s["peers_down"] == 0
        # A home copy its node evicted or declined is answered "absent" at once: the asker reads
        # the PFS, never waiting out peer_timeout.
        assert s["peers_closed"] <= WORLD - 1

    # The layout follows each rank's view of the link (learned in epoch 0 from the first sample the
    # other node stages: before epoch 1's reads of its copies are planned). At 200 ms a fetch the
    # link is never faster; on one host it is, though a loaded host can make a rank's estimate of it
    # waver (the figure is the rank's layout at its last batch).
    layouts = [r["stats"]["peer_home_first"] for r in ranks]
    assert any(layouts) if link == "faster" else not any(layouts), [r["stats"]["sources"] for r in ranks]

    def per_epoch(job_ranks, key):
        return [sum(e[key] for r in job_ranks for e in r["stats"]["epochs"] if e["epoch"] == epoch)
                for epoch in range(3)]

    with_tier, without = per_epoch(ranks, "source_reads"), per_epoch(plain, "source_reads")
    hits_on, hits_off = per_epoch(ranks, "hits"), per_epoch(plain, "hits")
    why = (with_tier, without, hits_on, hits_off, per_epoch(ranks, "peer_reads"))
    # The link was reached: reads the tier served, or probes of it.
    assert sum(row["reads"] for r in ranks for row in r["stats"]["sources"]
               if row["name"].startswith("node ")) > 0
    if link == "slower":
        # Run as with the tier off (its own next uses decide what it keeps), the tier only ever
        # replaces a read of the PFS by a read from a peer: no epoch reads the PFS more than the job
        # without peers does, but for the hits one run has and the other not. Which rank of a node
        # copies a file first (a neighbour's copy is a hit), and so the hits, differ by a few with
        # timing; each hit lost is a read of the PFS.
        assert all(a - b <= max(0, h_off - h_on) for a, b, h_on, h_off in
                   zip(with_tier, without, hits_on, hits_off)), why
        # And the nodes' own hits are those of the tier off (home copies first made 0.65x of them).
        assert sum(hits_on[1:]) >= 0.9 * sum(hits_off[1:]), why
    else:
        # Home first, a node gives up some of its own hits, and the other node reads those copies
        # over the link: epochs 1 and 2 read the PFS less than without the tier, each of them.
        assert all(a < b for a, b in zip(with_tier[1:], without[1:])), why
        assert sum(per_epoch(ranks, "peer_reads")[1:]) > 0, why


def test_a_closed_peer_and_a_corrupted_home_copy_cost_reads_of_the_pfs_not_a_hang(job):
    run, cat, emulator, backing = job
    owner, home = ownership(cat, backing)
    # A file of rank 2's that rank 0 uses in the last batch of epoch 1 (planned after the barrier).
    last = epoch_batches(len(cat), BATCH, SEED, 1, rank=0, world_size=WORLD)[-1]
    victim = next(i for i in last if owner[i] == 2)
    before = emulator.stats()["paths"]
    # No fetch here waits out peer_timeout (rank 3 says goodbye, rank 2 answers at once), so a
    # generous one keeps a loaded machine from taking a slow rank 2 for a stalled one.
    ranks = run(peers=True, epochs=2, peer_timeout=5.0, stop_rank=3, corrupt=[2, victim])
    after = emulator.stats()["paths"]

    for rank in (0, 1, 2):
        assert ranks[rank]["wrong"] == []  # every byte delivered is right
    s0, s1 = ranks[0]["stats"], ranks[1]["stats"]
    # The owner checks its copy before it sends it, finds it changed, removes it and answers that
    # it has none: rank 0 reads the PFS (a fallback; a reply that is corrupt on the way would be
    # counted in its peer_corrupt).
    assert ranks[2]["stats"]["stage_corrupt"] == 1
    assert s0["peer_corrupt"] == 0 and s1["peer_corrupt"] == 0
    victim_path = cat.path(victim)
    assert after[victim_path]["opens"] - before.get(victim_path, {"opens": 0})["opens"] == 2
    for rank, s in ((0, s0), (1, s1)):
        epoch1 = {e["epoch"]: e for e in s["epochs"]}[1]
        # Every read of epoch 1 is a copy to the node's SSD: from a peer or, failing that, the PFS.
        assert epoch1["peer_reads"] + epoch1["source_reads"] == epoch1["copies_made"]
        assert s["peers_down"] == 0
        assert 1 <= s["peers_closed"] <= 2
        refused = int(rank == 0)  # the victim
        assert s["peer_fallbacks"] >= refused + s["peer_corrupt"]
    # Node 0's epoch-1 samples homed on node 1, by their opens on the PFS: rank 3 closed and said
    # goodbye, so its files (but those fetched before it stopped) were read from the PFS at once (a
    # second open; it is counted as closed, not down: a peer that left on purpose, not a fallback);
    # rank 2's were fetched from it (no second open) but the victim.
    uses = {i for r in (0, 1) for b in epoch_batches(len(cat), BATCH, SEED, 1, rank=r, world_size=WORLD)
            for i in b if owner[i] // RANKS_PER_NODE == 1}

    def opens(i):
        return after[cat.path(i)]["opens"] - before.get(cat.path(i), {"opens": 0})["opens"]

    of_rank3 = [i for i in uses if owner[i] == 3]
    assert all(opens(i) in (1, 2) for i in of_rank3) and any(opens(i) == 2 for i in of_rank3)
    # (But the reads made while a rank learned the link: sent to the PFS, see the first test.)
    learning = s0["peer_reads_to_pfs"] + s1["peer_reads_to_pfs"]
    of_rank2 = [i for i in uses if owner[i] == 2 and i != victim]
    assert all(opens(i) in (1, 2) for i in of_rank2)
    assert sum(opens(i) - 1 for i in of_rank2) <= learning


def test_a_copy_changed_before_the_run_is_never_served_by_its_node_or_its_peers(job):
    run, cat, emulator, backing = job
    owner, home = ownership(cat, backing)
    plain = run(peers=False, epochs=2)
    first = tmp_path_of(run(peers=True, epochs=1))
    # Between the runs, a byte of node 0's copies changes on the SSD (their records stay): each is
    # a copy left by an earlier run, which no reader may use before it is checked against its record.
    node0 = sorted(p for p in first.glob("node0/prestage-*/[0-9a-f][0-9a-f]/*") if p.suffix != ".part")
    # Its home copies, and the samples of node 1 it fetched for epoch 1 before the run closed (they
    # stay on its SSD).
    assert len(node0) >= sum(owner[i] // RANKS_PER_NODE == 0 for i in home)
    for copy in node0:
        raw = bytearray(copy.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        copy.write_bytes(bytes(raw))
    ranks = run(peers=True, epochs=2, stage=first)
    assert all(r["wrong"] == [] for r in ranks)
    assert [r["batches"] for r in ranks] == [r["batches"] for r in plain]
    # Each changed copy found and removed once on its node, by whichever reader met it first (its
    # node's stage 2, a neighbour's read, an answer to a peer); no asker got a changed byte.
    assert sum(r["stats"]["stage_corrupt"] for r in ranks[:RANKS_PER_NODE]) == len(node0)
    assert all(r["stats"]["peer_corrupt"] == 0 for r in ranks)


def tmp_path_of(ranks):
    """The stage directories' parent of the run whose results are `ranks`."""
    return Path(ranks[0]["stage"])


PLAIN = textwrap.dedent("""
    import json, sys, prestage
    cat = prestage.Catalog.load(sys.argv[1])
    with prestage.Loader(cat, batch_size=5, decode="raw", stage_dir=sys.argv[2], rank=0, world_size=4,
                         peers=True) as loader:
        n = sum(len(b.indices) for b in loader)
        s = loader.stats(epochs="all")
    print(json.dumps({"n": n, "on": s["peer_tier"], "why": s["peer_tier_why"]}))
""")


@pytest.mark.parametrize("plugin, why", [(None, "MPI world of 1 does not match world_size 4"),
                                          ("missing", "plugin missing: libprestage_mpi.so")])
def test_without_mpirun_or_plugin_the_tier_is_off_and_says_why(make_folder, tmp_path, plugin, why):
    cat = prestage.Catalog.from_folder(make_folder(2, 10))
    catalog = tmp_path / "set.catalog"
    cat.save(catalog)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI", "PMIX"))}
    if plugin:
        env["PRESTAGE_MPI_PLUGIN"] = str(tmp_path / "absent" / "libprestage_mpi.so")
    r = subprocess.run([sys.executable, "-c", PLAIN, str(catalog), str(tmp_path / "stage")], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out == {"n": 5, "on": False, "why": out["why"]}  # rank 0 of 4: 5 of the 20 samples
    assert out["why"].startswith(why)


FORKED = textwrap.dedent("""
    import json, os, sys, time, prestage
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    os.environ["PRESTAGE_NODE"] = str(rank)
    cat = prestage.Catalog.load(sys.argv[1])
    with prestage.Loader(cat, batch_size=5, decode="raw", stage_dir=f"{sys.argv[2]}/{rank}", rank=rank,
                         world_size=2, peers=True) as loader:
        before = sum(len(b.indices) for b in loader)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # a DataLoader worker's place: it must not touch MPI, even at exit
            os.close(r)
            try:
                next(iter(loader))
                os.write(w, b"served")
            except prestage.Error as e:
                os.write(w, str(e).encode())
            sys.exit(0)  # the interpreter's exit hooks run: the loader's, the MPI plugin's
        os.close(w)
        said = os.read(r, 4096).decode()
        assert os.waitpid(pid, 0)[1] == 0
        after = sum(len(b.indices) for b in loader)  # the parent's tier still works
        s = loader.stats(epochs="all")
        # Each answers the other's fetches until both have their batches (a rank that closed early
        # would turn the other's fetches into reads of the source).
        open(f"{sys.argv[2]}/done-{rank}", "w").close()
        while not all(os.path.exists(f"{sys.argv[2]}/done-{r}") for r in (0, 1)):
            time.sleep(0.005)
    # The link reached: reads the peer tier served, or probes of the link (the PFS here is a local
    # folder, faster than the link: the model may leave every read to it).
    reached = sum(row["reads"] for row in s["sources"] if row["name"].startswith("node "))
    print(json.dumps({"child": said, "parent": [before, after, s["peer_tier"], reached]}))
""")


def test_a_process_forked_after_mpi_started_keeps_off_mpi(make_folder, tmp_path):
    for out in two_ranks(make_folder, tmp_path, FORKED):
        assert "fork" in out["child"]  # refused with a clear error, then a clean exit
        before, after, on, reached = out["parent"]
        assert (before, after, on) == (10, 10, True) and reached > 0


# A rank forks before it iterates (a DataLoader's workers start so) and the child iterates the
# parent's loader: by os.fork, then by multiprocessing's fork. The child must get prestage.Error (the
# peer tier's MPI transport lives in the parent), not a batch read around the tier nor a hang, and
# exit cleanly through the interpreter's exit hooks; the parent's loader goes on.
FORKED_BEFORE = textwrap.dedent("""
    import json, multiprocessing, os, select, sys, time, prestage
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    os.environ["PRESTAGE_NODE"] = str(rank)
    cat = prestage.Catalog.load(sys.argv[1])

    def child(w):
        start = time.monotonic()
        try:
            next(iter(loader))
            said = "served"
        except prestage.Error as e:
            said = f"{type(e).__name__}: {e}"
        os.write(w, json.dumps([said, time.monotonic() - start]).encode())

    def answer(r, pid_or_process):
        # Bounded, so that a child that hangs fails the test instead of stalling it.
        ready, _, _ = select.select([r], [], [], 60)
        said = json.loads(os.read(r, 4096).decode()) if ready else ["no answer in 60 s", None]
        if isinstance(pid_or_process, int):
            if not ready:
                os.kill(pid_or_process, 9)
            status = os.waitpid(pid_or_process, 0)[1]
            code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
        else:
            pid_or_process.join(60)
            if pid_or_process.exitcode is None:
                pid_or_process.kill()
                pid_or_process.join()
            code = pid_or_process.exitcode
        return said + [code]

    with prestage.Loader(cat, batch_size=5, decode="raw", stage_dir=f"{sys.argv[2]}/{rank}", rank=rank,
                         world_size=2, peers=True) as loader:
        out = {}
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            child(w)
            sys.exit(0)  # the interpreter's exit hooks run: the loader's, the MPI plugin's
        os.close(w)
        out["os.fork"] = answer(r, pid)
        r, w = os.pipe()
        process = multiprocessing.get_context("fork").Process(target=child, args=(w,))
        process.start()
        os.close(w)
        out["multiprocessing"] = answer(r, process)
        out["parent"] = [sum(len(b.indices) for b in loader), loader.stats(epochs="all")["peer_tier"]]
    print(json.dumps(out))
""")


def two_ranks(make_folder, tmp_path, source: str) -> list:
    """Runs `source` under `mpirun -np 2` with a catalog of 20 images and a stage directory as its
    arguments; each rank prints one JSON line: their values, by rank."""
    return mpi_ranks(make_folder, tmp_path, source, 2)


def mpi_ranks(make_folder, tmp_path, source: str, ranks: int) -> list:
    """Runs `source` under `mpirun -np RANKS` with a catalog of 20 images and a stage directory as
    its arguments; each rank prints one JSON line: their values, by rank."""
    cat = prestage.Catalog.from_folder(make_folder(2, 10))
    catalog = tmp_path / "set.catalog"
    cat.save(catalog)
    script = tmp_path / "ranks.py"
    script.write_text(source)
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none")
    r = subprocess.run([MPIRUN, "--oversubscribe", "--allow-run-as-root", "-np", str(ranks),
                        sys.executable, str(script), str(catalog), str(tmp_path / "stage")], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    # One JSON object per rank; mpirun may join two ranks' lines into one.
    decoder, text, out = json.JSONDecoder(), r.stdout.strip(), []
    while text:
        value, end = decoder.raw_decode(text)
        out.append(value)
        text = text[end:].lstrip()
    assert len(out) == ranks, r.stdout + r.stderr
    return out


def test_a_process_forked_before_the_loader_started_refuses_it_at_once(make_folder, tmp_path):
    for out in two_ranks(make_folder, tmp_path, FORKED_BEFORE):
        for how in ("os.fork", "multiprocessing"):
            said, seconds, exit_code = out[how]
            # Refused, saying what to do, then a clean exit.
            assert said.startswith("Error: ") and "forked" in said and "new loader" in said, (how, said, seconds)
            assert exit_code == 0, (how, out[how])
        assert out["parent"] == [10, True]  # rank's half of 20 samples; its tier still on


# A rank of 2 nodes of 2 ranks forks children as a DataLoader's workers start, by os.fork, then by
# multiprocessing's fork, each making a loader of its own with the rank's options and a stage directory
# of its own. Before the rank's loader has run, the child's loader is a plain loader (the peer tier off:
# MPI is the parent's; peer_tier_why says so) that runs an epoch of the rank's plan. Once the rank's
# loader has run, its threads' pool (oneTBB) is in the child without its threads: the child's loader is
# refused at construction with prestage.Error, never left to wait for threads that do not exist.
FORKED_NEW = textwrap.dedent("""
    import json, multiprocessing, os, select, sys, time
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    os.environ["PRESTAGE_NODE"] = str(rank // 2)
    import prestage
    cat = prestage.Catalog.load(sys.argv[1])
    base = sys.argv[2]
    options = dict(batch_size=5, decode="raw", rank=rank, world_size=4, seed=3, peers=True)

    def child(w, name):
        start = time.monotonic()
        try:
            with prestage.Loader(cat, stage_dir=f"{base}/child-{rank}-{name}", **options) as own:
                s = own.stats()
                said = ["epoch", [[int(i) for i in b.indices] for b in own], s["peer_tier"],
                        s["peer_tier_why"]]
        except prestage.Error as e:
            said = ["refused", type(e).__name__, str(e)]
        os.write(w, json.dumps(said + [time.monotonic() - start]).encode())

    def forked(name, kind):
        r, w = os.pipe()
        if kind == "os.fork":
            pid = os.fork()
            if pid == 0:
                os.close(r)
                child(w, name)
                sys.exit(0)  # the interpreter's exit hooks run: the loaders', the MPI plugin's
        else:
            process = multiprocessing.get_context("fork").Process(target=child, args=(w, name))
            process.start()
        os.close(w)
        # Bounded, so that a child that hangs fails the test instead of stalling it.
        ready, _, _ = select.select([r], [], [], 60)
        said = json.loads(os.read(r, 1 << 20).decode()) if ready else ["no answer in 60 s"]
        if kind == "os.fork":
            if not ready:
                os.kill(pid, 9)
            status = os.waitpid(pid, 0)[1]
            code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
        else:
            process.join(60)
            if process.exitcode is None:
                process.kill()
                process.join()
            code = process.exitcode
        return said + [code]

    out = {"rank": rank}
    with prestage.Loader(cat, stage_dir=f"{base}/node{rank // 2}", **options) as loader:
        for kind in ("os.fork", "multiprocessing"):
            out["before " + kind] = forked("before-" + kind, kind)
        out["parent"] = [[int(i) for i in b.indices] for b in loader]
        for kind in ("os.fork", "multiprocessing"):
            out["after " + kind] = forked("after-" + kind, kind)
        out["peer_tier"] = loader.stats()["peer_tier"]
        # Each rank answers the others' fetches until all have their batches.
        open(f"{base}/done-{rank}", "w").close()
        while not all(os.path.exists(f"{base}/done-{r}") for r in range(4)):
            time.sleep(0.005)
    print(json.dumps(out))
""")


def test_a_process_forked_from_a_rank_makes_its_own_loader_or_is_refused_at_once(make_folder, tmp_path):
    outs = mpi_ranks(make_folder, tmp_path, FORKED_NEW, WORLD)
    assert sorted(out["rank"] for out in outs) == list(range(WORLD))
    for out in outs:
        rank = out["rank"]
        plan = [[int(i) for i in b] for b in epoch_batches(20, 5, 3, 0, rank=rank, world_size=WORLD)]
        assert out["parent"] == plan and out["peer_tier"] is True
        for kind in ("os.fork", "multiprocessing"):
            said = out["before " + kind]
            assert said[0] == "epoch", (rank, kind, said)
            batches, on, why, seconds, code = said[1:]
            assert batches == plan and on is False and "forked" in why, (rank, kind, said)
            assert seconds < 30 and code == 0, (rank, kind, said)
            said = out["after " + kind]
            assert said[0] == "refused", (rank, kind, said)
            name, message, seconds, code = said[1:]
            assert name == "Error" and "forked" in message and "spawn" in message, (rank, kind, said)
            assert seconds < 5 and code == 0, (rank, kind, said)


# What the loader is given as comm= under mpirun, by mpi4py's own objects: each non-communicator
# (whose Fortran handles name some communicator: REQUEST_NULL's 0 is MPI_COMM_WORLD's) and
# COMM_NULL is refused before anything collective; a duplicate of the world is taken.
COMMS = textwrap.dedent("""
    import json, os, sys
    from mpi4py import MPI
    import prestage
    rank = MPI.COMM_WORLD.Get_rank()
    cat = prestage.Catalog.load(sys.argv[1])
    bad = {"MPI.INT": MPI.INT, "group": MPI.COMM_WORLD.Get_group(), "MPI.REQUEST_NULL": MPI.REQUEST_NULL,
           "MPI.COMM_NULL": MPI.COMM_NULL}
    out = {}
    for name, comm in bad.items():
        try:
            with prestage.Loader(cat, batch_size=5, decode="raw", stage_dir=f"{sys.argv[2]}/{rank}",
                                 rank=rank, world_size=2, peers=True, comm=comm) as loader:
                out[name] = ["accepted", loader.stats(epochs="all")["peer_tier"]]
        except prestage.ConfigError as e:
            out[name] = ["ConfigError", str(e)]
    comm = MPI.COMM_WORLD.Dup()
    with prestage.Loader(cat, batch_size=5, decode="raw", stage_dir=f"{sys.argv[2]}/{rank}", rank=rank,
                         world_size=2, peers=True, comm=comm) as loader:
        out["dup"] = [sum(len(b.indices) for b in loader), loader.stats(epochs="all")["peer_tier"]]
    comm.Free()
    print(json.dumps(out))
""")


@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None, reason="needs mpi4py")
def test_comm_must_be_an_intra_communicator(make_folder, tmp_path):
    for out in two_ranks(make_folder, tmp_path, COMMS):
        for name in ("MPI.INT", "group", "MPI.REQUEST_NULL", "MPI.COMM_NULL"):
            kind, message = out[name]
            assert kind == "ConfigError" and message.startswith("comm "), (name, out[name])
        assert out["dup"] == [10, True]


def test_peer_options_are_checked():
    from prestage.options import to_core

    cat = prestage.Catalog.from_paths("/", ["a"], [0])

    class Comm:  # what prestage takes from an mpi4py intra-communicator
        def py2f(self):
            return 5

        def Is_intra(self):
            return True

    class Handle:  # any other mpi4py handle (a datatype, a group, a request)
        def py2f(self):
            return 0

    class Intercomm(Comm):
        def Is_intra(self):
            return False

    class NullComm(Comm):  # COMM_NULL: mpi4py raises MPI.Exception (MPI_ERR_COMM)
        def Is_intra(self):
            raise RuntimeError("MPI_ERR_COMM: invalid communicator")

    options = to_core(cat, 1, None, {"peers": True, "peer_timeout": 0.25, "comm": Comm()})
    assert (options.peers, options.peer_timeout_ms, options.peer_comm_fortran) == (True, 250, 5)
    assert to_core(cat, 1, None, {}).peer_comm_fortran == -1
    assert to_core(cat, 1, None, {}).pfs_reads == prestage._core.PfsReads.fastest
    assert to_core(cat, 1, None, {"pfs_reads": "fewest"}).pfs_reads == prestage._core.PfsReads.fewest
    for bad in ({"peer_timeout": 0}, {"peer_timeout": -1}, {"peer_timeout": True},
                {"comm": object()}, {"comm": Handle()}, {"comm": Intercomm()}, {"comm": NullComm()},
                {"pfs_reads": "least"}, {"pfs_reads": None}):
        with pytest.raises(prestage.ConfigError, match=next(iter(bad))):
            to_core(cat, 1, None, bad)


def test_copies_changed_on_a_nodes_ssd_are_never_served_by_its_own_ranks_nor_its_peers(job):
    run, cat, emulator, backing = job
    # After epoch 0 every copy on node 1 is overwritten in part (a failing disk, a stray job). Its
    # own ranks check each copy they read (stage 3, and their neighbour's copies for read-ahead), and
    # node 0's ranks check what node 1 sends: not one wrong sample, the changes counted.
    ranks = run(peers=True, epochs=3, corrupt=[2, "all"])
    assert all(r["wrong"] == [] for r in ranks), json.dumps(
        [(r["wrong"], {k: r["stats"][k] for k in ("stage_corrupt", "peer_corrupt", "peer_reads", "peer_fallbacks")},
          r["stats"]["epochs"]) for r in ranks])
    node1 = [r["stats"] for r in ranks[2:]]
    caught = sum(s["stage_corrupt"] for s in node1)
    assert caught > 0
    reference = run(peers=False, epochs=3)
    for r, ref in zip(ranks, reference):
        assert [b[:2] for b in r["batches"]] == [b[:2] for b in ref["batches"]]
        assert [b[2] for b in r["batches"]] == [b[2] for b in ref["batches"]]


def test_a_stalled_peer_costs_each_rank_one_peer_timeout_then_is_skipped(job):
    """Rank 3 stops dead (SIGSTOP, its progress thread too) after epoch 0. Ranks 0 and 1 (the other
    node) wait peer_timeout for it once (the fetches under way then), mark it down and read its files from the PFS at once from
    then on; every byte delivered is right. (Open MPI 4 aborts the whole job when a rank dies, so a
    stalled rank is what can be tested; a dead one is marked down the same way where the MPI lets
    the job go on.)"""
    run, cat, emulator, backing = job
    owner, home = ownership(cat, backing)
    # 4 s: a live peer's early "absent" answer then has 1 s to come back (with 2 s, 0.5 s, and on a
    # loaded 2-core machine rank 2 was once marked down too).
    timeout = 4.0
    ranks = run(peers=True, epochs=3, peer_timeout=timeout, stall_rank=3)
    for rank in (0, 1, 2):
        assert ranks[rank]["wrong"] == []
    for rank in (0, 1):
        s = ranks[rank]["stats"]
        # Only rank 3 went down (no answer); rank 2 answered all along (its goodbye at the job's
        # end, heard by a read-ahead of the epoch after the last, counts in peers_closed).
        assert s["peers_down"] == 1
        uses = [i for e in (1, 2) for b in epoch_batches(len(cat), BATCH, SEED, e, rank=rank,
                                                          world_size=WORLD)
                for i in b if owner[i] == 3]
        assert uses
        # Each of rank 3's files it used was read from the PFS instead (fallbacks, or reads the
        # source model sent there while a probe of the link waited on rank 3: no read waits on a
        # probe), but those fetched before it stopped (the read-ahead of epoch 1 starts during
        # epoch 0).
        fetched = sum(e["peer_reads"] for e in s["epochs"] if e["epoch"] > 0)
        assert s["peer_fallbacks"] >= 1 or s["peer_reads_to_pfs"] >= 1
        assert s["peer_fallbacks"] + s["peer_reads_to_pfs"] + fetched >= len(uses), s
        # One wait of peer_timeout, not one per use (at least 12 of them without marking down).
        assert ranks[rank]["ended"][-1] - ranks[rank]["ended"][0] < 3 * timeout + 4
    assert ranks[2]["stats"]["peers_down"] == 0
    # Rank 3, resumed after the others finished, closes without waiting on them.
    assert ranks[3]["close_s"] < 10

