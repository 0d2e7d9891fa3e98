"""The class folders' getattrs on the emulated PFS: whether a way of opening the files by name avoids them.

A set of ``--folders`` folders of ``--per-folder`` small files each is served by the emulated parallel
file system (``prestage-pfs``: a FUSE mount with ``default_permissions`` and a 1 s attribute and entry
timeout, as a PFS client caches them). Every file is opened, read and closed once, the opens spread
evenly over ``--seconds`` (on ``--threads`` threads), in one of two ways:

- ``path``: ``open(root/folder/file)``, as the loader opens a catalog's files: the kernel walks every
  component of the path;
- ``dirfd``: ``openat(fd, file)`` from a descriptor of the file's folder, opened once before the run and
  held: the kernel looks up only the last component.

Per way, the emulator's getattrs (the kernel's LOOKUPs and GETATTRs, which the emulator counts
together), split into those of the files themselves and the rest (the folders' and the root's). With
``default_permissions`` the kernel checks search permission on the folder for every name it looks up
in it (``fuse_permission``), and refreshes the folder's attributes with a GETATTR first once they are
older than the attribute timeout, whichever way the name was reached.

    python benchmarks/folder_getattrs_bench.py --folders 10 --per-folder 300 --seconds 5 --threads 8
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List

from prestage.bench.emulator import PfsEmulator


def _run(mount: Path, names: List[str], way: str, seconds: float, threads: int) -> float:
    folders = sorted({n.split("/")[0] for n in names})
    fds = {f: os.open(mount / f, os.O_RDONLY | os.O_DIRECTORY) for f in folders} if way == "dirfd" else {}
    start = time.perf_counter()
    step = seconds / len(names)

    def work(part: int) -> None:
        for i in range(part, len(names), threads):
            wait = start + i * step - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            folder, name = names[i].split("/")
            fd = os.open(name, os.O_RDONLY, dir_fd=fds[folder]) if way == "dirfd" else os.open(mount / names[i], os.O_RDONLY)
            try:
                os.read(fd, 1 << 16)
            finally:
                os.close(fd)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - start
    for fd in fds.values():
        os.close(fd)
    return elapsed


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--folders", type=int, default=10)
    p.add_argument("--per-folder", type=int, default=300)
    p.add_argument("--seconds", type=float, default=5.0, help="the opens spread over this long (default 5)")
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--out", type=Path, default=None, help="JSON of the runs")
    args = p.parse_args()
    results: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="prestage-folder-getattrs-") as tmp:
        src = Path(tmp) / "src"
        names = []
        for f in range(args.folders):
            (src / f"class{f:02d}").mkdir(parents=True)
            for i in range(args.per_folder):
                (src / f"class{f:02d}" / f"{i:05d}.bin").write_bytes(os.urandom(4096))
                names.append(f"class{f:02d}/{i:05d}.bin")
        # Interleaved over the folders, as a shuffled epoch visits them.
        names.sort(key=lambda n: (n.split("/")[1], n.split("/")[0]))
        for round_ in range(args.repeat):
            for way in ("path", "dirfd"):
                # A new mount per run: nothing cached from the one before.
                with PfsEmulator(src, latency_ms=0.2, bandwidth_mbs=0, max_ops=64) as emulator:
                    mount = emulator.mountpoint
                    time.sleep(1.2)  # the mount's own lookups expire: cold
                    before = emulator.stats()
                    elapsed = _run(mount, names, way, args.seconds, args.threads)
                    after = emulator.stats()
                ops = {k: after["ops"].get(k, 0) - before["ops"].get(k, 0) for k in ("open", "read", "getattr")}
                file_getattrs = sum(n - before["file_getattrs"].get(q, 0)
                                    for q, n in after["file_getattrs"].items())
                row = {"way": way, "round": round_, "files": len(names), "seconds": round(elapsed, 2),
                       "opens": ops["open"], "getattrs": ops["getattr"], "file_getattrs": file_getattrs,
                       "folder_getattrs": ops["getattr"] - file_getattrs,
                       "getattrs_per_file": round(ops["getattr"] / len(names), 4)}
                results.append(row)
                print(f"{way:6} round {round_}: {elapsed:5.2f} s, {ops['open']} opens, {ops['getattr']} getattrs "
                      f"({file_getattrs} of the files, {row['folder_getattrs']} of the folders and root): "
                      f"{row['getattrs_per_file']:.4f} per file", flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"command": "python benchmarks/folder_getattrs_bench.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out" and v is not None),
            "runs": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
