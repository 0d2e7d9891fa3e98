"""Mounting and unmounting ``prestage-pfs``, the emulated parallel file system (FUSE).

>>> with PfsEmulator("/data/set", latency_ms=2, bandwidth_mbs=200) as pfs:
...     run_something(pfs.mountpoint)      # every read meets the emulated latency and bandwidth
...     pfs.stats()                        # the emulator's counters (operations, bytes)

Faults, for reliability tests: reads or opens of chosen files fail with EIO or stall, from the start
(``eio_read=["class_0/*_003.jpg"]``) or from any moment on (``pfs.inject("eio-read class_0/*_003.jpg")``,
``pfs.clear()``); ``pfs.stats()["faults"]`` counts what was injected.

The emulator runs in a session of its own (a terminal's Ctrl+C reaches only this process, which then
unmounts in order) and with ``--exit-with-parent`` (if this process is killed outright, the emulator
still unmounts). :meth:`PfsEmulator.stop` sends SIGTERM, and falls back to a lazy unmount
(``fusermount3 -uz``) if the mount outlived the process.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

__all__ = ["EmulatorError", "PfsEmulator", "find_emulator", "is_mounted", "unavailable_reason"]

BINARY_NAME = "prestage-pfs"
STATS_NAME = ".prestage-pfs-stats"
FAULTS_NAME = ".prestage-pfs-faults"
ENV_BINARY = "PRESTAGE_PFS_EMULATOR"

PathLike = Union[str, "os.PathLike[str]"]


class EmulatorError(RuntimeError):
    """The emulator cannot be found, started or mounted; the message says why."""


def find_emulator(explicit: Optional[PathLike] = None) -> Optional[Path]:
    """The ``prestage-pfs`` executable: ``explicit``, else ``$PRESTAGE_PFS_EMULATOR``, else the one
    installed in the package (``prestage/bin``), else one on ``PATH``; ``None`` when there is none."""
    if explicit is not None:
        path = Path(explicit)
        return path if path.is_file() and os.access(path, os.X_OK) else None
    candidates = (
        os.environ.get(ENV_BINARY),
        str(Path(__file__).resolve().parent.parent / "bin" / BINARY_NAME),
        shutil.which(BINARY_NAME),
    )
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def unavailable_reason(binary: Optional[Path]) -> Optional[str]:
    """Why the emulator cannot be mounted here, or ``None`` if it may be (mounting is the real test)."""
    if binary is None:
        return (f"no {BINARY_NAME} executable (built with the package when libfuse3 and pkg-config are "
                f"found; or pass its path)")
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine"
    if os.geteuid() != 0:
        # libfuse opens /dev/fuse itself before it asks fusermount3 to mount.
        if not os.access("/dev/fuse", os.R_OK | os.W_OK):
            return "not root, and /dev/fuse is not readable and writable by this user"
        if shutil.which("fusermount3") is None:
            return "not root, and fusermount3 is not installed (Debian: apt-get install fuse3)"
    return None


def is_mounted(path: PathLike) -> bool:
    """Whether ``path`` is a mount point in this process's mount table."""
    target = os.path.realpath(os.fspath(path))
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 4 and _unescape(fields[4]) == target:
                    return True
    except OSError:
        return os.path.ismount(target)
    return False


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as octal escapes.
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def lazy_unmount(path: PathLike) -> bool:
    """Detaches a (possibly dead) FUSE mount; True if nothing is mounted there afterwards."""
    commands = [["fusermount3", "-u", "-z", os.fspath(path)]]
    if os.geteuid() == 0:
        commands.append(["umount", "-l", os.fspath(path)])
    for command in commands:
        if not is_mounted(path):
            break
        if shutil.which(command[0]) is None:
            continue
        subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return not is_mounted(path)


def _globs(globs: Union[str, Sequence[str]]) -> List[str]:
    return [globs] if isinstance(globs, str) else list(globs)


class PfsEmulator:
    """``source`` served read-only at a mount point, as slowly as a busy parallel file system.

    Args:
        source: the directory to serve.
        mountpoint: an empty directory to mount on; ``None``: a new temporary one, removed at stop.
        latency_ms: latency of every operation (open, read request, getattr/lookup, readdir), in ms.
        open_ms, read_ms, getattr_ms: per-operation overrides of ``latency_ms``, in ms.
        bandwidth_mbs: aggregate read bandwidth in MB/s (10^6 bytes/s); 0: no cap.
        max_ops: operations served at once (the others queue); 0: no cap.
        binary: the ``prestage-pfs`` executable (default: :func:`find_emulator`).
        mount_timeout_s: how long to wait for the mount.
        eio_open, eio_read: globs (shell patterns over the path relative to ``source``; ``*`` also
            matches ``/``) of files whose opens, or whose reads, fail with EIO.
        stall_open, stall_read: globs of files whose opens, or each of whose read requests, block for
            ``stall_ms`` first.
        stall_ms: how long those stalls last, in ms; 0: until :meth:`clear` or unmount (an unmount is
            never held up by a stall: the stalled operation fails).
        extra_args: more command-line arguments for ``prestage-pfs``.

    Thread-safety: start and stop from one thread; :meth:`stats` from any.
    """

    def __init__(
        self,
        source: PathLike,
        mountpoint: Optional[PathLike] = None,
        latency_ms: float = 2.0,
        bandwidth_mbs: float = 200.0,
        max_ops: int = 16,
        open_ms: Optional[float] = None,
        read_ms: Optional[float] = None,
        getattr_ms: Optional[float] = None,
        binary: Optional[PathLike] = None,
        mount_timeout_s: float = 10.0,
        extra_args: Optional[List[str]] = None,
        eio_open: Sequence[str] = (),
        eio_read: Sequence[str] = (),
        stall_open: Sequence[str] = (),
        stall_read: Sequence[str] = (),
        stall_ms: float = 0.0,
    ) -> None:
        self.source = Path(source)
        self._requested_mountpoint = Path(mountpoint) if mountpoint is not None else None
        self.mountpoint: Optional[Path] = None
        self.binary = find_emulator(binary)
        self.config = {
            "latency_ms": float(latency_ms),
            "open_ms": open_ms,
            "read_ms": read_ms,
            "getattr_ms": getattr_ms,
            "bandwidth_mbs": float(bandwidth_mbs),
            "max_ops": int(max_ops),
        }
        self.faults_at_start = {"eio-open": _globs(eio_open), "eio-read": _globs(eio_read),
                                "stall-open": _globs(stall_open), "stall-read": _globs(stall_read)}
        self.stall_ms = float(stall_ms)
        self._extra_args = list(extra_args or [])
        self._mount_timeout_s = mount_timeout_s
        self._process: Optional[subprocess.Popen] = None
        self._temporary_mountpoint = False

    def command(self, mountpoint: PathLike) -> List[str]:
        """The command line that mounts the emulator at ``mountpoint``."""
        c = self.config
        cmd = [os.fspath(self.binary or BINARY_NAME), "--exit-with-parent",
               "--latency-ms", f"{c['latency_ms']:g}", "--bandwidth-mbs", f"{c['bandwidth_mbs']:g}",
               "--max-ops", str(c["max_ops"])]
        for name in ("open_ms", "read_ms", "getattr_ms"):
            if c[name] is not None:
                cmd += [f"--{name.replace('_', '-')}", f"{c[name]:g}"]
        for option, globs in self.faults_at_start.items():
            for glob in globs:
                cmd += [f"--{option}", glob]
        if self.stall_ms:
            cmd += ["--stall-ms", f"{self.stall_ms:g}"]
        return cmd + self._extra_args + [os.fspath(self.source), os.fspath(mountpoint)]

    def start(self) -> Path:
        """Mounts and returns the mount point. Raises EmulatorError (nothing stays mounted then)."""
        if self._process is not None:
            raise EmulatorError("the emulator is already running")
        reason = unavailable_reason(self.binary)
        if reason is not None:
            raise EmulatorError(reason)
        if not self.source.is_dir():
            raise EmulatorError(f"{self.source} is not a directory")
        if self._requested_mountpoint is None:
            self.mountpoint = Path(tempfile.mkdtemp(prefix="prestage-pfs-"))
            self._temporary_mountpoint = True
        else:
            self.mountpoint = self._requested_mountpoint
            self.mountpoint.mkdir(parents=True, exist_ok=True)
        try:
            self._process = subprocess.Popen(
                self.command(self.mountpoint), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True)
            self._wait_mounted()
        except BaseException:
            self.stop()
            raise
        return self.mountpoint

    def _wait_mounted(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        deadline = time.monotonic() + self._mount_timeout_s
        line = b""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self._process.stdout], [], [], 0.1)
            if ready:
                line = self._process.stdout.readline()
                if line.startswith(b"mounted"):
                    return
            if self._process.poll() is not None:
                err = self._process.stderr.read().decode(errors="replace").strip() \
                    if self._process.stderr else ""
                raise EmulatorError(f"{BINARY_NAME} exited with status {self._process.returncode}"
                                    + (f": {err}" if err else ""))
        raise EmulatorError(f"{BINARY_NAME} did not mount within {self._mount_timeout_s:g} s")

    def stats(self) -> Dict[str, Any]:
        """The emulator's counters: ``ops`` per operation, ``bytes_read``, ``queued_s``, ..., and
        ``faults`` (``eio_open``, ``eio_read``: operations failed; ``stall_open``, ``stall_read``:
        operations stalled; ``stalled_now``), and ``paths``: per file opened (its path relative to
        ``source``), ``opens`` and ``bytes`` read; read from the mount's hidden stats file, without any
        emulated latency."""
        if self.mountpoint is None:
            raise EmulatorError("the emulator is not running")
        with open(self.mountpoint / STATS_NAME, "rb") as f:
            return json.loads(f.read().decode())

    def inject(self, *rules: str) -> None:
        """Adds fault rules, in force for every operation that starts after this returns:
        ``"eio-open GLOB"``, ``"eio-read GLOB"``, ``"stall-open GLOB [MS]"``, ``"stall-read GLOB [MS]"``
        (no MS: until cleared), or ``"clear [GLOB]"``. Raises EmulatorError for a rule not understood
        (then none of ``rules`` applies).

        >>> pfs.inject("eio-read class_0/img_003.jpg", "stall-open class_1/*")
        """
        text = "".join(rule.strip() + "\n" for rule in rules)
        if self.mountpoint is None:
            raise EmulatorError("the emulator is not running")
        fd = os.open(self.mountpoint / FAULTS_NAME, os.O_WRONLY)
        try:
            os.write(fd, text.encode())  # one write: the emulator takes all of it or none
        except OSError as e:
            raise EmulatorError(f"{BINARY_NAME} refused the fault rules {list(rules)!r}: {e}") from e
        finally:
            os.close(fd)

    def clear(self, glob: Optional[str] = None) -> None:
        """Removes every fault rule (or those of exactly ``glob``); what they stalled goes on."""
        self.inject("clear" if glob is None else f"clear {glob}")

    def faults(self) -> List[str]:
        """The fault rules in force, as :meth:`inject` takes them."""
        if self.mountpoint is None:
            raise EmulatorError("the emulator is not running")
        with open(self.mountpoint / FAULTS_NAME) as f:
            return f.read().splitlines()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Unmounts and waits for the emulator to exit. Idempotent; never raises for a lost mount."""
        process, self._process = self._process, None
        if process is not None:
            if process.poll() is None:
                try:
                    process.send_signal(signal.SIGTERM)
                    process.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            for stream in (process.stdout, process.stderr):
                if stream is not None:
                    stream.close()
        if self.mountpoint is not None:
            if is_mounted(self.mountpoint):
                lazy_unmount(self.mountpoint)
            if self._temporary_mountpoint and not is_mounted(self.mountpoint):
                try:
                    self.mountpoint.rmdir()
                except OSError:
                    pass
            self.mountpoint = None
            self._temporary_mountpoint = False

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def __enter__(self) -> "PfsEmulator":
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __del__(self) -> None:
        if getattr(self, "_process", None) is not None:
            self.stop()
