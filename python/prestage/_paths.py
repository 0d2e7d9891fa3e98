"""Writing where a path from outside points, on a node shared with other users: a folder written into
must be this user's (or root's) and not open to other users' writes (a sticky folder like ``/tmp``
is fine: others cannot replace what is in it), and a file is written to a new name (``O_EXCL``) and
renamed into place, so that a link planted under its name is replaced, never followed."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import Union

from prestage.errors import IoError

__all__ = ["check_folder", "write_replacing"]


def check_folder(folder: Union[str, os.PathLike]) -> None:
    """Raises prestage.IoError (EPERM) naming `folder`, its owner and mode, if another user (not root)
    owns it or others can write it without its sticky bit: then they could put links or files of
    their own where this process writes."""
    st = os.stat(folder)
    mine = st.st_uid in (os.geteuid(), 0)
    open_to_others = bool(st.st_mode & stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX
    if not mine or open_to_others:
        why = "another user owns it" if not mine else "any user can write it and its sticky bit is not set"
        raise IoError(errno.EPERM, f"refusing to write in '{folder}' (owned by uid {st.st_uid}, mode "
                      f"{stat.S_IMODE(st.st_mode):04o}): {why}; choose a folder of your own",
                      os.fspath(folder))


def write_replacing(path: Union[str, os.PathLike], data: bytes, mode: int = 0o644) -> None:
    """Writes `data` to `path` whole: to a new file beside it, then renamed over it (a link there is
    replaced, not followed; another user's file in a sticky folder cannot be, and the rename fails
    with EPERM)."""
    path = Path(path)
    check_folder(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode & ~_umask())
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
