"""Cold page caches between benchmark runs.

``drop`` writes ``3`` to ``/proc/sys/vm/drop_caches`` after a ``sync``: the whole machine's clean page
cache, dentries and inodes go (root only, and not in every container). ``fadvise`` asks the kernel to
drop the cached pages of each file under the given directories (``posix_fadvise(POSIX_FADV_DONTNEED)``,
any user, only the files named). ``auto`` tries ``drop`` and falls back to ``fadvise``. Each call says
which was done, so that a report can say it.

The default is ``fadvise``: ``drop`` (and ``auto`` as root) empties every other job's page cache too, a
side effect only an explicit ``--cold drop`` may have.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Union

__all__ = ["DEFAULT", "METHODS", "make_cold", "warm"]

METHODS = ("fadvise", "drop", "auto", "none")
DEFAULT = "fadvise"
DROP_CACHES = "/proc/sys/vm/drop_caches"


def _drop_caches() -> bool:
    os.sync()  # drop_caches drops clean pages only
    try:
        with open(DROP_CACHES, "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def make_cold(method: str, paths: Iterable[Union[str, "os.PathLike[str]"]]) -> str:
    """Drops cached data before a run; returns what was done: ``"drop_caches"``, ``"fadvise"`` or
    ``"none"``.

    Raises:
        PermissionError: ``method="drop"`` where ``/proc/sys/vm/drop_caches`` cannot be written.
        ValueError: an unknown method.
    """
    from prestage.cli.demo import evict_from_page_cache

    if method not in METHODS:
        raise ValueError(f"cold-cache method must be one of {', '.join(METHODS)}, got {method!r}")
    if method == "none":
        return "none"
    if method in ("auto", "drop"):
        if _drop_caches():
            return "drop_caches"
        if method == "drop":
            raise PermissionError(f"cannot write {DROP_CACHES} (needs root, outside a restricted "
                                  f"container); use --cold fadvise")
    os.sync()  # dirty pages cannot be dropped either way
    for path in paths:
        if Path(path).exists():
            evict_from_page_cache(Path(path))
    return "fadvise"


def warm(files: Iterable[Union[str, "os.PathLike[str]"]], chunk: int = 1 << 20) -> int:
    """Reads every file once so that it sits in the page cache; returns the bytes read."""
    total = 0
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while True:
                data = f.read(chunk)
                if not data:
                    break
                total += len(data)
    return total
