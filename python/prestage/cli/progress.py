"""A small terminal progress bar for the ``prestage`` subcommands.

``progress(...)`` returns a bar that is used the same way whether or not tqdm is installed::

    with progress(total, desc="synth", unit="img", enabled=not args.quiet) as bar:
        for done in work():
            bar.update(done)

    for item in progress(items, desc="pack", unit="file", enabled=True):
        ...

The bar is drawn on stderr, and only when it is enabled and stderr is a terminal, so logs and pipes
never receive control characters. tqdm is used when it can be imported (imported here, lazily); otherwise a
minimal bar of our own is drawn at most ten times a second.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator, Sized
from typing import Any, TextIO

__all__ = ["progress"]


class _NullBar:
    """A bar that draws nothing: used when disabled or when stderr is not a terminal."""

    def __init__(self, iterable: Iterable[Any] | None) -> None:
        self._iterable = iterable

    def __iter__(self) -> Iterator[Any]:
        if self._iterable is None:
            raise TypeError("this progress bar was created from a total, not an iterable")
        return iter(self._iterable)

    def update(self, n: int = 1) -> None:
        """Count ``n`` more units done (ignored)."""

    def close(self) -> None:
        """Finish the bar (nothing to do)."""

    def __enter__(self) -> _NullBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _TextBar(_NullBar):
    """A one-line bar redrawn in place with a carriage return; the fallback when tqdm is missing."""

    _WIDTH = 30
    _INTERVAL_S = 0.1

    def __init__(
        self, iterable: Iterable[Any] | None, total: int | None, desc: str, unit: str, stream: TextIO
    ) -> None:
        super().__init__(iterable)
        self._total = total
        self._desc = desc
        self._unit = unit
        self._stream = stream
        self._done = 0
        self._start = time.monotonic()
        self._last_draw = 0.0
        self._closed = False
        self._draw()

    def __iter__(self) -> Iterator[Any]:
        try:
            for item in super().__iter__():
                yield item
                self.update(1)
        finally:
            self.close()

    def update(self, n: int = 1) -> None:
        """Count ``n`` more units done and redraw if the last draw is old enough."""
        self._done += n
        now = time.monotonic()
        if now - self._last_draw >= self._INTERVAL_S:
            self._draw(now)

    def close(self) -> None:
        """Draw the final state and end the line; idempotent."""
        if not self._closed:
            self._closed = True
            self._draw()
            self._stream.write("\n")
            self._stream.flush()

    def _draw(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._last_draw = now
        elapsed = now - self._start
        rate = self._done / elapsed if elapsed > 0 else 0.0
        if self._total:
            fraction = min(self._done / self._total, 1.0)
            filled = int(fraction * self._WIDTH)
            bar = "#" * filled + "-" * (self._WIDTH - filled)
            text = f"{self._desc}: {fraction:4.0%} |{bar}| {self._done}/{self._total} {self._unit}"
        else:
            text = f"{self._desc}: {self._done} {self._unit}"
        self._stream.write(f"\r{text} [{elapsed:.0f}s, {rate:.1f} {self._unit}/s]")
        self._stream.flush()


def progress(iterable_or_total: Iterable[Any] | int, desc: str, unit: str, enabled: bool = True) -> Any:
    """Return a progress bar over an iterable, or over a count of units to ``update()`` by hand.

    Args:
        iterable_or_total: an iterable to wrap (iterating the bar yields its items and counts them), or an
            ``int`` total for a bar advanced with ``bar.update(n)``.
        desc: a short label printed before the bar.
        unit: the name of one unit of work, e.g. ``"img"``.
        enabled: draw nothing when false (e.g. ``--quiet``). The bar is also off when stderr is not a
            terminal.

    Returns:
        An object with ``update(n)``, ``close()``, iteration (when built from an iterable) and the context
        manager protocol: a ``tqdm`` bar when tqdm is installed, else a minimal stand-in.
    """
    iterable: Iterable[Any] | None
    total: int | None
    if isinstance(iterable_or_total, int):
        iterable, total = None, iterable_or_total
    else:
        iterable = iterable_or_total
        total = len(iterable_or_total) if isinstance(iterable_or_total, Sized) else None
    stream = sys.stderr
    if not enabled or stream is None or not stream.isatty():
        return _NullBar(iterable)
    try:
        from tqdm import tqdm
    except ImportError:
        return _TextBar(iterable, total, desc, unit, stream)
    return tqdm(iterable, total=total, desc=desc, unit=unit, file=stream, dynamic_ncols=True)
