"""The one progress bar of the package (``tqdm``): conversions (:mod:`.convert.loop`, the
sharded converter) and the training recipe take theirs from :func:`progress_bar`.

A disabled bar is a no-op object with the same methods, so callers never branch on it.
"""
from __future__ import annotations

import sys
from typing import Optional

__all__ = ["progress_bar"]


class _NoBar:
    """What :func:`progress_bar` returns when disabled: every call does nothing."""

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass


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
    return tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, file=out)
