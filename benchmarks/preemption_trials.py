"""Preemption trials: kill -9 every rank of a job at random moments, restart it on another number of
ranks from its last saved state, and count what the whole run delivered against what it should.

Each trial runs one job of `--epochs` epochs over a small synthetic set (`--samples` files of 1 to 3
pages of random bytes) with a bounded stage directory (`--bound` of the set's bytes) on a tmpfs of
its own, the node's SSD here, and the source behind the emulated PFS (`--pfs-ms` per operation, so
that kills find copies under way). The job is a number of segments: each starts W rank processes (plain
``prestage.Loader`` with ``world_size=W``, ``rank=r``, one stage directory for all: one node), from
the job's last checkpoint, with a batch size drawn anew; W is drawn from 1..4, never the previous
segment's. At a random moment (after a random number of the job's remaining samples were delivered,
plus a random delay of up to 3 ms; before the first batch too) every rank is killed with SIGKILL, up
to `--kills` times per trial; the last segment runs the job to its end.

What a rank does, the README's loop with a checkpoint every few batches:

    loader.load_state_dict(checkpoint)       # the merged state of the segment before (if any)
    for epoch in range(checkpoint["epoch"], EPOCHS):
        loader.set_epoch(epoch)
        for batch in loader:
            log(epoch, batch)                    # each sample's index and a digest of its bytes
            sleep(step_ms)                       # the training step
            if batches % save_every == 0:
                save(loader.state_dict())        # per rank, atomically (write, then rename)

The ranks save apart, as independent processes do (no collective), so a kill finds them at
different batches; the job's checkpoint is then ``prestage.state.merge_states`` of every rank's last
saved state. A segment killed before every rank saved once leaves the checkpoint as it was.

What is counted, and against what: the checkpoint is the record of what the job consumed. A batch
a rank delivered counts as consumed when the checkpoint the job restarted from (or, at the end, its
final one) includes it: it was delivered before that rank's saved state, and is of an epoch the
merge keeps (a rank an epoch ahead of the others is counted at the end of the earliest epoch:
``merge_states``). Batches delivered after the last save are delivered again after the restart, by
design: at-least-once from the model's view, exactly-once from the checkpoint's; they are counted
as ``replayed``, not as repeated.

- lost: samples of an epoch that no consumed batch of the run holds;
- repeated: samples that consumed batches hold more than once in an epoch, less the padding a
  resume on W ranks adds by design when W does not divide the R samples left (up to W - 1 of the
  epoch order's first samples, once more: README, "Preemption and elastic restarts"), counted
  apart as ``padding``; the set has a multiple of 12 samples, so whole epochs are never padded;
- wrong: delivered samples (consumed or replayed) whose digest differs from the source file's,
  computed here from the files, apart from the loader;
- bound: the bytes the stage directory's copies (partial ones included) take on its tmpfs, sampled
  every millisecond through the whole trial, kills and restarts included, less its index and node
  table; the peak must not pass the bound.

    python benchmarks/preemption_trials.py --trials 20 --json preemption.json

Needs root (it mounts a tmpfs) unless given --stage-mount, an empty tmpfs mounted already.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

SEED = 3
PAGE = 4096
WORLD_SIZES = (1, 2, 3, 4)
BATCH_SIZES = (2, 3, 4, 5)
OWN_FILES = ("index.log", "index.log.compact", "node.table", "start.lock")


def digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=8).hexdigest()


# ---- a rank ----


def worker(spec: Dict[str, Any]) -> None:
    import prestage

    catalog = prestage.Catalog.from_folder(spec["source"], [".bin"])
    loader = prestage.Loader(catalog, spec["batch_size"], decode="raw", seed=SEED, rank=spec["rank"],
                             world_size=spec["world_size"], stage_dir=spec["stage"],
                             cache_bytes=spec["bound"], readers=1, prefetchers=2, lookahead=2,
                             autotune=False)
    start = 0
    if spec["state"] is not None:
        state = json.loads(Path(spec["state"]).read_text())
        loader.load_state_dict(state)
        start = state["epoch"]
    ckpt = Path(spec["ckpt"])
    lines = 0

    def save() -> None:
        tmp = ckpt.with_suffix(".tmp")
        tmp.write_text(json.dumps({"state": loader.state_dict(), "log_lines": lines}))
        os.replace(tmp, ckpt)

    save()
    with open(spec["log"], "a") as log:
        for epoch in range(start, spec["epochs"]):
            loader.set_epoch(epoch)
            for batch in loader:
                data, offsets = batch.data, batch.offsets
                parts = [f"{int(i)}:{digest(data[offsets[k]:offsets[k + 1]].tobytes())}"
                         for k, i in enumerate(batch.indices)]
                del batch, data, offsets
                log.write(f"{epoch} {' '.join(parts)}\n")
                log.flush()  # in the page cache: a kill -9 keeps it
                lines += 1
                time.sleep(spec["step_ms"] * 1e-3)  # the training step
                if lines % spec["save_every"] == 0:
                    save()
    save()
    loader.close()


# ---- the accounting ----


Delivered = List[Tuple[int, List[Tuple[int, str]]]]  # per batch: epoch, (sample, digest) per sample


def read_log(path: Path) -> Delivered:
    """A rank's log; a last line cut short by the kill is left out (never delivered whole)."""
    if not path.exists():
        return []
    out: Delivered = []
    for line in path.read_text().split("\n")[:-1]:  # the text after the last newline is partial
        epoch, *parts = line.split(" ")
        out.append((int(epoch), [(int(p.split(":")[0]), p.split(":")[1]) for p in parts]))
    return out


def consumed_batches(logs: List[Delivered], saved: List[Dict[str, Any]]) -> Tuple[Delivered, Delivered]:
    """(consumed, replayed) of one segment whose every rank saved: a rank's batch is consumed if it
    was logged before the rank's saved state and is of an epoch the merge keeps (at most the
    earliest epoch of the saved states)."""
    keep = min(s["state"]["epoch"] for s in saved)
    consumed: Delivered = []
    replayed: Delivered = []
    for log, s in zip(logs, saved):
        for j, (epoch, samples) in enumerate(log):
            (consumed if j < s["log_lines"] and epoch <= keep else replayed).append((epoch, samples))
    return consumed, replayed


def account(consumed: Delivered, replayed: Delivered, truth: Dict[int, str], epochs: int,
            padding: Dict[int, collections.Counter]) -> Dict[str, int]:
    """Lost, repeated (past the allowed `padding` per epoch), padding repeats, replayed and wrong
    samples of a whole run, against the source's digests `truth` (sample -> digest)."""
    counts = {e: collections.Counter() for e in range(epochs)}
    wrong = checked = 0
    for epoch, samples in consumed:
        for sample, d in samples:
            counts[epoch][sample] += 1
    for epoch, samples in consumed + replayed:
        for sample, d in samples:
            checked += 1
            wrong += truth.get(sample) != d
    lost = repeated = padded = 0
    for e in range(epochs):
        allowed = padding.get(e, collections.Counter())
        for sample in truth:
            seen = counts[e][sample]
            lost += seen == 0
            extra = max(0, seen - 1)
            padded += min(extra, allowed[sample])
            repeated += max(0, extra - allowed[sample])
        repeated += sum(n for s, n in counts[e].items() if s not in truth)
    return {"lost": lost, "repeated": repeated, "padding": padded,
            "replayed": sum(len(s) for _, s in replayed), "checked": checked, "wrong": wrong}


def padding_of(state: Optional[Dict[str, Any]], world_size: int, samples: int) -> Tuple[int, List[int]]:
    """The samples a segment resuming from `state` on `world_size` ranks may deliver once more: the
    epoch order's first (W - R % W) % W of the R left (README); (epoch, samples)."""
    import prestage
    from prestage.state import consumed_of

    if state is None:
        return 0, []
    left = samples - sum(e - b for b, e in consumed_of(state))
    pad = (world_size - left % world_size) % world_size
    order = [int(i) for i in prestage.plan.epoch_order(samples, SEED, state["epoch"])]
    return state["epoch"], order[:pad]


# ---- the stage directory's bound ----


class BoundWatch:
    """Samples the bytes the copies take on the tmpfs `mount` every millisecond: the file system's
    used blocks, less those of the directory's own files. A sample is kept only when the own files
    took the same blocks just before and just after the disk was read (the index grows, a
    restart makes the node's table anew: either, between two reads, would pass for a copy or hide
    one)."""

    def __init__(self, mount: Path) -> None:
        self.mount = mount
        self.baseline = self.used()
        self.peak = 0
        self.samples = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def used(self) -> int:
        st = os.statvfs(self.mount)
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    def own(self) -> int:
        total = 0
        for area in self.mount.glob("stage/prestage-*"):
            for name in OWN_FILES:
                try:
                    total += (area / name).stat().st_blocks * 512
                except FileNotFoundError:
                    pass
        return total

    def _run(self) -> None:
        while not self._done.is_set():
            before = self.own()
            used = self.used()
            if self.own() == before:
                self.peak = max(self.peak, used - self.baseline - before)
                self.samples += 1
            time.sleep(0.001)

    def __enter__(self) -> "BoundWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


# ---- a trial ----


def make_set(root: Path, samples: int) -> Dict[int, str]:
    """`samples` files of 1 to 3 pages of random bytes (whole pages: the tmpfs's blocks are then the
    bytes the bound counts), in 3 folders; the digest of each sample, by catalog index."""
    import prestage

    rng = random.Random(11)
    for i in range(samples):
        folder = root / f"c{i % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"s{i:04d}.bin").write_bytes(rng.randbytes(PAGE * rng.randint(1, 3)))
    catalog = prestage.Catalog.from_folder(root, [".bin"])
    return {i: digest(catalog.source_path(i).read_bytes()) for i in range(len(catalog))}


def delivered_samples(logs: List[Path]) -> int:
    total = 0
    for path in logs:
        try:
            with open(path, "rb") as f:
                text = f.read()
        except FileNotFoundError:
            continue
        total += text.count(b":")
    return total


def run_trial(trial: int, rng: random.Random, args: argparse.Namespace, source: Path, mount: Path,
              truth: Dict[int, str], bound: int) -> Dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"trial{trial}-", dir=args.work))
    stage = mount / "stage"
    shutil.rmtree(stage, ignore_errors=True)
    state: Optional[Dict[str, Any]] = None
    consumed: Delivered = []
    replayed: Delivered = []
    padding: Dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    layouts: List[Tuple[int, int]] = []
    delivered: List[int] = []  # samples each segment delivered
    targets: List[Optional[int]] = []  # the samples after which each segment was killed
    kills = 0
    world_size = 0
    save_every = rng.randint(1, 4)
    with BoundWatch(mount) as watch:
        for segment in range(args.kills + 1):
            world_size = rng.choice([w for w in WORLD_SIZES if w != world_size])
            batch_size = rng.choice(BATCH_SIZES)
            layouts.append((world_size, batch_size))
            state_path = None
            if state is not None:
                state_path = work / f"state{segment}.json"
                state_path.write_text(json.dumps(state))
            logs = [work / f"seg{segment}-rank{r}.log" for r in range(world_size)]
            ckpts = [work / f"seg{segment}-rank{r}.json" for r in range(world_size)]
            procs = []
            for r in range(world_size):
                spec = {"source": str(source), "stage": str(stage), "bound": bound, "rank": r,
                        "world_size": world_size, "batch_size": batch_size, "epochs": args.epochs,
                        "save_every": save_every, "step_ms": args.step_ms,
                        "state": str(state_path) if state_path else None, "log": str(logs[r]),
                        "ckpt": str(ckpts[r])}
                procs.append(subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(spec)]))
            done_so_far = sum(len(s) for _, s in consumed)
            left = args.epochs * len(truth) - done_so_far
            last = segment == args.kills
            target = None if last else rng.randrange(0, max(1, left))
            targets.append(target)
            while any(p.poll() is None for p in procs):
                if target is not None and delivered_samples(logs) >= target:
                    time.sleep(rng.uniform(0, 0.003))
                    for p in procs:
                        if p.poll() is None:
                            os.kill(p.pid, signal.SIGKILL)
                    kills += 1
                    break
                time.sleep(0.001)
            codes = [p.wait() for p in procs]
            delivered.append(delivered_samples(logs))
            finished = all(c == 0 for c in codes)
            if not finished and not any(c == -signal.SIGKILL for c in codes):
                raise RuntimeError(f"trial {trial}: a rank failed with {codes}")
            epoch, pad = padding_of(state, world_size, len(truth))
            if not all(p.exists() for p in ckpts):
                # Killed before every rank saved: the checkpoint stays as it was, and what was
                # delivered is delivered again.
                replayed += [batch for p in logs for batch in read_log(p)]
                continue
            saved = [json.loads(p.read_text()) for p in ckpts]
            seg_consumed, seg_replayed = consumed_batches([read_log(p) for p in logs], saved)
            consumed += seg_consumed
            replayed += seg_replayed
            padding[epoch].update(pad)
            from prestage.state import merge_states

            state = merge_states([s["state"] for s in saved])
            if finished:
                break
        if not finished:
            raise RuntimeError(f"trial {trial}: the job did not finish")  # the last segment runs to its end
    # The final checkpoint says the job consumed every epoch.
    assert state is not None and state["epoch"] == args.epochs and state["position"] == 0, state
    result = account(consumed, replayed, truth, args.epochs, padding)
    result.update(trial=trial, kills=kills, layouts=layouts, delivered=delivered, kill_after=targets,
                  save_every=save_every, peak_bytes=watch.peak, bound=bound, bound_samples=watch.samples)
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(stage, ignore_errors=True)
    return result


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--kills", type=int, default=3, help="kills per trial at most (default 3)")
    parser.add_argument("--samples", type=int, default=72, help="a multiple of 12 (default 72)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--bound", type=float, default=0.4, help="the stage directory's bound, a "
                        "fraction of the set's bytes (default 0.4)")
    parser.add_argument("--step-ms", type=float, default=2.0, help="the training step each rank "
                        "takes per batch, in ms (default 2)")
    parser.add_argument("--pfs-ms", type=float, default=1.0, help="the source behind the emulated "
                        "PFS with this latency per operation, so that kills find copies under way "
                        "(default 1; 0, or no FUSE here: the source directly)")
    parser.add_argument("--seed", type=int, default=0, help="of the trials' random draws")
    parser.add_argument("--stage-mount", type=Path, help="an empty tmpfs (default: one mounted here)")
    parser.add_argument("--json", type=Path, help="write the results there")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        worker(json.loads(args.worker))
        return 0
    if args.trials < 1 or args.kills < 0 or args.epochs < 1 or args.samples < 12 or args.samples % 12:
        parser.error("--trials and --epochs must be >= 1, --kills >= 0, --samples a multiple of 12")
    if not 0 < args.bound <= 1:
        parser.error("--bound must be in (0, 1]")
    with tempfile.TemporaryDirectory(prefix="preemption-") as tmp:
        args.work = Path(tmp)
        source = args.work / "source"
        truth = make_set(source, args.samples)
        set_bytes = sum(p.stat().st_size for p in source.rglob("*.bin"))
        pfs = None
        if args.pfs_ms > 0:
            from prestage.bench.emulator import PfsEmulator, find_emulator, unavailable_reason

            reason = unavailable_reason(find_emulator())
            if reason is None:
                pfs = PfsEmulator(source, latency_ms=args.pfs_ms, bandwidth_mbs=0, max_ops=0)
            else:
                print(f"preemption_trials: the source read directly ({reason})", file=sys.stderr)
        bound = int(set_bytes * args.bound) // PAGE * PAGE
        mount = args.stage_mount
        mounted = None
        if mount is None:
            mounted = args.work / "tmpfs"
            mounted.mkdir()
            size_kb = (set_bytes * 2) // 1024 + 1024
            r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(mounted)],
                               capture_output=True, text=True)
            if r.returncode != 0:
                print(f"preemption_trials: cannot mount a tmpfs ({r.stderr.strip()}); give "
                      "--stage-mount", file=sys.stderr)
                return 2
            mount = mounted
        try:
            served = pfs.start() if pfs is not None else source
            rng = random.Random(args.seed)
            results = []
            start = time.perf_counter()
            for trial in range(args.trials):
                results.append(run_trial(trial, rng, args, served, mount, truth, bound))
                r = results[-1]
                print(f"trial {trial + 1}/{args.trials}: {r['kills']} kills, ranks x batch "
                      f"{' -> '.join(f'{w}x{b}' for w, b in r['layouts'])} delivering "
                      f"{'+'.join(map(str, r['delivered']))}, lost {r['lost']}, "
                      f"repeated {r['repeated']} (+{r['padding']} padding), replayed {r['replayed']}, "
                      f"wrong {r['wrong']} of {r['checked']}, peak {r['peak_bytes']} of {bound} B",
                      flush=True)
        finally:
            if pfs is not None:
                pfs.stop()
            if mounted is not None:
                subprocess.run(["umount", "-l", str(mounted)], capture_output=True)
    totals = {key: sum(r[key] for r in results)
              for key in ("kills", "lost", "repeated", "padding", "replayed", "checked", "wrong")}
    summary = {"trials": args.trials, "samples": args.samples, "epochs": args.epochs,
               "source": f"emulated PFS, {args.pfs_ms:g} ms per operation" if pfs else "direct",
               "set_bytes": set_bytes, "bound": bound, "peak_bytes": max(r["peak_bytes"] for r in results),
               "seconds": round(time.perf_counter() - start, 1), **totals, "results": results}
    print(f"{args.trials} trials, {totals['kills']} kills: lost {totals['lost']}, repeated "
          f"{totals['repeated']} (+{totals['padding']} padding by design), replayed "
          f"{totals['replayed']}, wrong {totals['wrong']} of {totals['checked']} checked, stage "
          f"directory peak {summary['peak_bytes']} of {bound} B, {summary['seconds']} s")
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=1))
    ok = (totals["lost"] == totals["repeated"] == totals["wrong"] == 0 and summary["peak_bytes"] <= bound)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
