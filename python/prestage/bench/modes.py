"""One timed run of each mode of the paper (Serizawa & Tatebe, BDCAT'19), and of the baselines.

- ``direct``: stage 3 decodes straight from the PFS; no stage directory.
- ``stage-all``: first copy every file the run needs from the PFS to the stage directory (``prefetchers``
  threads), then read the copy; both times are reported (``copy_s``, ``epoch_s``), and the copy counts
  as stall time (training cannot start before it ends).
- ``pipelined``: prestage: stage 2 copies the next ``lookahead`` batches while stage 3 decodes.
- ``ideal``: the data already on local disk and in the page cache: no I/O at all, so this is also the
  decode-only limit of the machine.
- ``torch``, ``tf``: the baselines (:mod:`prestage.bench.baselines`), reading the PFS.

Every run starts from cold caches (except ``ideal``, which starts warm by definition), with a new, empty
stage directory, and reads ``batches`` batches of ``epoch`` (``None``: the whole epoch). After each batch
the consumer sleeps ``compute_ms`` (a training step on an accelerator, which leaves the CPU to the
loader); the time it spends waiting for the next batch is its stall time.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from prestage.bench import cache
from prestage.cli.progress import progress

__all__ = ["MODES", "PRESTAGE_MODES", "BASELINES", "Setup", "run_mode"]

PRESTAGE_MODES = ("direct", "stage-all", "pipelined", "ideal")
BASELINES = ("torch", "tf")
MODES = PRESTAGE_MODES + BASELINES


@dataclasses.dataclass
class Setup:
    """What every run of one benchmark shares.

    ``source`` holds the data set at full speed (the emulator's backing directory, or the PFS itself
    when nothing is emulated); ``pfs_root`` is what the loaders read (the emulator's mount point, or
    ``source``); ``work_dir`` is the benchmark's own directory on the local disk (stage directories,
    copies), removed at the end.
    """

    source: Path
    pfs_root: Path
    work_dir: Path
    paths: List[str]
    labels: List[int]
    classes: List[str]
    mean_file_bytes: float
    batch_size: int = 64
    image_size: Optional[Tuple[int, int]] = (224, 224)
    transform: str = "center-crop"
    depth: int = 4
    seed: int = 0
    compute_ms: float = 0.0
    cold: str = cache.DEFAULT
    emulator: Any = None  # a running PfsEmulator, or None
    show_progress: bool = True
    _catalogs: Dict[str, Any] = dataclasses.field(default_factory=dict)
    _runs: int = 0

    @property
    def num_samples(self) -> int:
        return len(self.paths)

    @property
    def local_copy(self) -> Path:
        """Where ``ideal`` finds the data set on local disk."""
        return self.work_dir / "local-copy"

    def catalog(self, root: Path, keep: bool = True) -> Any:
        """The benchmark's catalog rooted at ``root`` (same samples, same order, so the same plan);
        kept for the next call unless ``keep`` is false (a directory of one run)."""
        import prestage

        key = os.fspath(root)
        if key in self._catalogs:
            return self._catalogs[key]
        catalog = prestage.Catalog.from_paths(root, self.paths, self.labels, self.classes)
        if keep:
            self._catalogs[key] = catalog
        return catalog

    def keep_catalog(self, root: Path, catalog: Any) -> None:
        """Makes ``catalog`` (the same samples in the same order) the one used for ``root``."""
        self._catalogs[os.fspath(root)] = catalog

    def batches_of(self, epoch: int, batches: Optional[int]) -> List[List[int]]:
        import prestage

        plan = prestage.plan.epoch_batches(self.num_samples, self.batch_size, self.seed, epoch)
        return plan if batches is None else plan[:batches]

    def fresh_dir(self, name: str) -> Path:
        self._runs += 1
        path = self.work_dir / f"{name}-{self._runs}"
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    def make_cold(self) -> str:
        return cache.make_cold(self.cold, [self.source, self.work_dir])

    def pfs_counters(self) -> Optional[Dict[str, Any]]:
        if self.emulator is None:
            return None
        try:
            return self.emulator.stats()
        except OSError:
            return None


def _pfs_delta(before: Optional[Dict[str, Any]], after: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    if before is None or after is None:
        return None
    ops = {k: after["ops"][k] - before["ops"].get(k, 0) for k in after["ops"]}
    return {"ops": ops, "bytes_read": after["bytes_read"] - before["bytes_read"],
            "queued_s": round(after["queued_s"] - before["queued_s"], 6)}


def _cpu_seconds(emulator: Any) -> Tuple[float, float]:
    """(CPU-seconds the whole machine has been busy, CPU-seconds of this benchmark: this process, its
    waited-for children, the emulator), so that a run can report what other processes used."""
    tick = os.sysconf("SC_CLK_TCK")
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        # user nice system idle iowait irq softirq steal ...: busy is all but idle and iowait.
        busy = (sum(fields[:8]) - fields[3] - fields[4]) / tick
    except (OSError, ValueError, IndexError):
        return 0.0, 0.0
    t = os.times()
    ours = t.user + t.system + t.children_user + t.children_system
    pid = getattr(getattr(emulator, "_process", None), "pid", None)
    if pid is not None:
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read().rsplit(")", 1)[1].split()
            ours += (int(stat[11]) + int(stat[12])) / tick  # utime, stime
        except (OSError, ValueError, IndexError):
            pass
    return busy, ours


def _loader_kwargs(setup: Setup) -> Dict[str, Any]:
    kwargs: Dict[str, Any] = {"batch_size": setup.batch_size, "image_size": setup.image_size,
                              "seed": setup.seed, "depth": setup.depth}
    if setup.transform != "center-crop":
        kwargs["transform"] = setup.transform
    return kwargs


def _consume(batches: Iterator[Any], count: int, compute_s: float, size_of: Any,
             desc: str, show_progress: bool) -> Tuple[int, float, float]:
    """Takes ``count`` batches as a training loop would; returns (images, seconds, stall seconds)."""
    images = 0
    stall = 0.0
    start = time.perf_counter()
    with progress(count, desc=desc, unit="batch", enabled=show_progress) as bar:
        for _ in range(count):
            t = time.perf_counter()
            try:
                batch = next(batches)
            except StopIteration:
                break
            stall += time.perf_counter() - t
            images += size_of(batch)
            del batch
            if compute_s > 0:
                time.sleep(compute_s)
            bar.update(1)
    return images, time.perf_counter() - start, stall


def _run_loader(setup: Setup, catalog: Any, stage_dir: Optional[Path], prefetchers: Optional[int],
                readers: Optional[int], lookahead: Optional[int], epoch: int, batches: Optional[int],
                desc: str, autotune: Optional[bool] = None) -> Dict[str, Any]:
    """One loader run; a thread count or ``autotune`` of None is left out (the loader's own default)."""
    import prestage

    given: Dict[str, Any] = {"prefetchers": prefetchers, "readers": readers, "lookahead": lookahead,
                             "autotune": autotune}
    options: Dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    with prestage.Loader(catalog, stage_dir=stage_dir, **options, **_loader_kwargs(setup)) as loader:
        loader.set_epoch(epoch)
        count = len(loader) if batches is None else min(batches, len(loader))
        images, seconds, stall = _consume(iter(loader), count, setup.compute_ms / 1e3, len, desc,
                                          setup.show_progress)
        stats = loader.stats()
        used = loader.options
    tuning = stats.get("tuning") or {}
    return {
        "images": images,
        "epoch_s": seconds,
        "stall_s": stall,
        "bytes": stats["missed_bytes"] + stats["bytes_from_stage"],
        "stages": {name: {"busy_s": stats[name]["busy_s"], "idle_s": stats[name]["idle_s"]}
                   for name in ("plan", "stage", "decode")},
        "hits": stats["hits"],
        "misses": stats["misses"],
        "staged_files": stats["staged_files"],
        "stage_dir_error": stats["stage_dir_error"] if stats["stage_dir_disabled"] else None,
        "pinned": stats["pinned"],
        "pinned_why": stats["pinned_why"],
        # The values the loader started with (the machine-sized defaults where none was given), why,
        # and what the self-tuning did (its values at the end, settle time, latest decisions).
        "chosen": {"readers": used.readers, "prefetchers": used.prefetchers, "lookahead": used.lookahead},
        "threads_why": stats.get("threads_why", ""),
        "tuning": {k: tuning[k] for k in ("on", "readers", "reads_in_flight", "lookahead", "steps_kept",
                                          "steps_undone", "settled_s", "log") if k in tuning},
    }


def _copy_files(pairs: Sequence[Tuple[Path, Path]], threads: int, desc: str, show_progress: bool) -> int:
    """Copies (source, destination) pairs with ``threads`` threads (whole-file read, then write, as
    stage 2 does); returns the bytes copied."""

    def copy(pair: Tuple[Path, Path]) -> int:
        src, dst = pair
        with open(src, "rb") as f:
            data = f.read()
        tmp = dst.with_name(dst.name + ".part")
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, dst)
        return len(data)

    for parent in {dst.parent for _, dst in pairs}:
        parent.mkdir(parents=True, exist_ok=True)
    total = 0
    with progress(len(pairs), desc=desc, unit="file", enabled=show_progress) as bar:
        with concurrent.futures.ThreadPoolExecutor(max_workers=threads) as pool:
            futures = [pool.submit(copy, pair) for pair in pairs]
            try:
                for future in concurrent.futures.as_completed(futures):
                    total += future.result()
                    bar.update(1)
            except BaseException:
                for future in futures:
                    future.cancel()
                raise
    return total


def _files_of(setup: Setup, epoch: int, batches: Optional[int]) -> List[str]:
    if batches is None:
        return list(setup.paths)
    seen = sorted({i for batch in setup.batches_of(epoch, batches) for i in batch})
    return [setup.paths[i] for i in seen]


def _ensure_local_copy(setup: Setup, files: Sequence[str]) -> None:
    """Copies (untimed, from the full-speed source) the files ``ideal`` needs that are not there yet."""
    missing = [(setup.source / p, setup.local_copy / p) for p in files
               if not (setup.local_copy / p).exists()]
    if missing:
        _copy_files(missing, 8, "copy for ideal", setup.show_progress)


def run_mode(setup: Setup, mode: str, prefetchers: Optional[int], readers: Optional[int],
             lookahead: Optional[int], epoch: int = 0, batches: Optional[int] = None,
             workers: Optional[int] = None, autotune: Optional[bool] = None) -> Dict[str, Any]:
    """One timed run of ``mode``; returns its figures (see :mod:`prestage.bench.report` for the keys).

    ``workers`` is the baselines' parallelism (DataLoader workers, tf.data map calls; ``None``: the
    number of cores for PyTorch, AUTOTUNE for tf.data); prestage modes use ``readers``. A thread count
    of None, and ``autotune`` None, are not given to prestage's loader: it runs as a user who sets
    nothing would run it (sized to the machine, self-tuning on); stage-all copies with ``prefetchers``
    threads (None: 8).
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; one of {', '.join(MODES)}")
    options: Dict[str, Any] = {"prefetchers": prefetchers, "readers": readers, "lookahead": lookahead,
                               "depth": setup.depth}
    if autotune is not None:
        options["autotune"] = autotune
    copy_s = None
    if mode == "ideal":
        files = _files_of(setup, epoch, batches)
        _ensure_local_copy(setup, files)
        cache.warm(setup.local_copy / p for p in files)
        cache_state = "warm"
    else:
        cache_state = setup.make_cold()
    before = setup.pfs_counters()
    cpu_before = _cpu_seconds(setup.emulator)
    window_start = time.perf_counter()
    if mode == "direct":
        options = {"readers": readers, "depth": setup.depth}
        result = _run_loader(setup, setup.catalog(setup.pfs_root), None, 1, readers, lookahead, epoch,
                             batches, "direct", autotune)
    elif mode == "pipelined":
        stage_dir = setup.fresh_dir("stage")
        try:
            result = _run_loader(setup, setup.catalog(setup.pfs_root), stage_dir, prefetchers, readers,
                                 lookahead, epoch, batches, "pipelined", autotune)
        finally:
            shutil.rmtree(stage_dir, ignore_errors=True)
    elif mode == "stage-all":
        options = {"prefetchers": prefetchers, "readers": readers, "depth": setup.depth}
        copy_dir = setup.fresh_dir("copy")
        try:
            files = _files_of(setup, epoch, batches)
            start = time.perf_counter()
            _copy_files([(setup.pfs_root / p, copy_dir / p) for p in files], prefetchers or 8,
                        "stage-all copy", setup.show_progress)
            copy_s = time.perf_counter() - start
            result = _run_loader(setup, setup.catalog(copy_dir, keep=False), None, 1, readers,
                                 lookahead, epoch, batches, "stage-all read", autotune)
            result["stall_s"] += copy_s  # the trainer cannot start before the copy is done
        finally:
            shutil.rmtree(copy_dir, ignore_errors=True)
    elif mode == "ideal":
        options = {"readers": readers, "depth": setup.depth}
        result = _run_loader(setup, setup.catalog(setup.local_copy), None, 1, readers, lookahead, epoch,
                             batches, "ideal", autotune)
    else:
        result = _run_baseline(setup, mode, workers, epoch, batches)
        options = {"workers": result.pop("workers")}
    after = setup.pfs_counters()
    cpu_after = _cpu_seconds(setup.emulator)
    window_s = time.perf_counter() - window_start
    seconds = result["epoch_s"] + (copy_s or 0.0)
    images = result["images"]
    nbytes = result.pop("bytes", None)
    if nbytes is None:
        nbytes = images * setup.mean_file_bytes
    return {
        "mode": mode,
        "options": options,
        "epoch": epoch,
        "batches": batches,
        "images": images,
        "seconds": seconds,
        "copy_s": copy_s,
        "images_per_s": images / seconds if seconds > 0 else 0.0,
        "mb_per_s": nbytes / seconds / 1e6 if seconds > 0 else 0.0,
        "cache": cache_state,
        "pfs": _pfs_delta(before, after),
        # CPU-seconds that other processes of the machine used during the run (a shared machine's
        # noise): the machine's busy time less this benchmark's (loader, baselines, emulator).
        "other_cpu_s": max(0.0, (cpu_after[0] - cpu_before[0]) - (cpu_after[1] - cpu_before[1])),
        "window_s": window_s,  # the wall time other_cpu_s was counted over (a baseline's includes its start)
        **result,
    }


def _run_baseline(setup: Setup, framework: str, workers: Optional[int], epoch: int,
                  batches: Optional[int]) -> Dict[str, Any]:
    """Runs a baseline in a process of its own (no fork of this threaded process; a clean import)."""
    with tempfile.NamedTemporaryFile(prefix="prestage-baseline-", suffix=".json", delete=False) as f:
        out = Path(f.name)
    cmd = [sys.executable, "-m", "prestage.bench.baselines", framework, os.fspath(setup.pfs_root),
           "--batch-size", str(setup.batch_size), "--seed", str(setup.seed + epoch),
           "--compute-ms", f"{setup.compute_ms:g}", "--out", os.fspath(out)]
    if setup.image_size is not None:
        cmd += ["--image-size", f"{setup.image_size[0]}x{setup.image_size[1]}"]
    if setup.transform != "center-crop":
        cmd += ["--transform", setup.transform]
    if workers is not None:
        cmd += ["--workers", str(workers)]
    if batches is not None:
        cmd += ["--batches", str(batches)]
    if not setup.show_progress:
        cmd.append("--quiet")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONWARNINGS="ignore")
    try:
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=None, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"the {framework} baseline failed (exit status {proc.returncode}): "
                               f"{proc.stdout.decode(errors='replace').strip()[-2000:]}")
        result = json.loads(out.read_text())
    finally:
        out.unlink(missing_ok=True)
    return result
