"""The one progress bar of the package (``tqdm``): conversions (:mod:`.convert.loop`, the
sharded converter) and the training recipe take theirs from :func:`progress_bar`.

A disabled bar is a no-op object with the same methods, so callers never branch on it.
"""
from __future__ import annotations

import os
import sys
from typing import Optional, Tuple

__all__ = ["progress_bar"]

#: The width a bar takes on a terminal that reports 0 columns (a pty whose size was never
#: set: some CI runners, ``docker exec -t``, serial consoles), where tqdm's
#: ``dynamic_ncols`` would draw nothing at all.
FALLBACK_COLUMNS = 80


def _terminal_size(fp) -> Tuple[Optional[int], Optional[int]]:
    """``(columns, lines)`` of the terminal ``fp`` writes to, asked at every redraw (what
    tqdm's ``dynamic_ncols`` does), with :data:`FALLBACK_COLUMNS` for a terminal reporting
    0 columns and ``None`` (tqdm's "unknown") for a size that cannot be asked; ``COLUMNS``
    / ``LINES`` from the environment where the stream is not a terminal."""
    try:
        size = os.get_terminal_size(fp.fileno())
        cols, rows = size.columns, size.lines
    except (AttributeError, OSError, ValueError):  # not a terminal, or no descriptor
        try:
            cols, rows = int(os.environ["COLUMNS"]) - 1, int(os.environ.get("LINES", 0))
        except (KeyError, ValueError):
            return None, None
    return (cols if cols > 0 else FALLBACK_COLUMNS), (rows if rows > 0 else None)


class _NoBar:
    """What :func:`progress_bar` returns when disabled: every call does nothing."""

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass

    def write(self, s: str) -> None:
        """A line printed above the bar: with no bar, on stdout."""
        print(s, flush=True)


def progress_bar(total: int, desc: str, unit: str = "img", enabled: bool = True,
                 stdout: bool = False, file=None):
    """A ``tqdm`` bar of ``total`` ``unit`` (on stderr, or stdout with ``stdout``, e.g. in
    order with a recipe's epoch lines), or a no-op one when not ``enabled``.

    >>> bar = progress_bar(3, "convert", enabled=False)
    >>> bar.update(1); bar.close()
    """
    if not enabled:
        return _NoBar()
    from tqdm import tqdm  # optional at import time: only a shown bar needs it
    out: Optional[object] = file if file is not None else (sys.stdout if stdout else None)
    # tqdm's own dynamic_ncols, but a terminal reporting 0x0 gets a fixed width, not an
    # invisible bar: the size is asked here, then at every redraw through the same query
    ncols, nrows = _terminal_size(out if out is not None else sys.stderr)
    bar = tqdm(total=total, desc=desc, unit=unit, ncols=ncols, nrows=nrows, file=out)
    bar.dynamic_ncols = _terminal_size
    return bar
