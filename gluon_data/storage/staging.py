"""Staging areas of the user cache (``<cache>/staging/<key>/``): a folder a conversion
writes into before uploading, pinned while in use so the cache's one limit never evicts it
then; made and counted by :meth:`gluon_data.storage.cache.Cache.staging`."""
from __future__ import annotations

import os
import shutil
import time
from typing import Optional

from .fsutil import CacheLock

__all__ = ["Staging"]


def tree_bytes(top: str) -> int:
    """Bytes of the regular files under ``top`` (links not followed)."""
    size, stack = 0, [top]
    while stack:
        for e in os.scandir(stack.pop()):
            if e.is_dir(follow_symlinks=False):
                stack.append(e.path)
            elif e.is_file(follow_symlinks=False):
                size += e.stat(follow_symlinks=False).st_size
    return size


def remove_tree_entry(e: "os.DirEntry") -> None:
    """Remove one entry of a staging area: a folder with what it holds (links inside it are
    removed, never followed), or a file or link."""
    if e.is_dir(follow_symlinks=False):
        shutil.rmtree(e.path)
    else:
        os.remove(e.path)


class Staging:
    """A staging area of a :class:`~gluon_data.storage.cache.Cache`, pinned while held
    (:meth:`Cache.staging <gluon_data.storage.cache.Cache.staging>`).

    Attributes
    ----------
    path : str
        The folder (``<cache>/staging/<key>``).

    Examples
    --------
    >>> from gluon_data.storage.cache import Cache
    >>> with Cache("/tmp/gd-cache").staging("abc123") as area:  # doctest: +SKIP
    ...     write_into(area.path)
    ...     area.claim()          # its bytes now counted: others evicted to fit the limit
    ...     area.remove()         # done: nothing kept
    """

    def __init__(self, cache, key: str, path: str, pin: CacheLock):
        self.cache, self.key, self.path = cache, key, path
        self._pin: Optional[CacheLock] = pin  # None once released

    def claim(self) -> None:
        """Make room for what the area holds now: least recently used entries not in use are
        evicted until the cache fits its limit (a ``RuntimeWarning`` when the entries in use,
        this one included, exceed it). Marks the area used now (its LRU time)."""
        now = time.time()
        os.utime(self.path, (now, now))
        with self.cache.room_lock():
            self.cache.make_room(0, keep=self.key, what="staging area " + self.path)

    def usage(self) -> int:
        """Bytes the area holds now."""
        return tree_bytes(self.path)

    def remove(self) -> None:
        """Delete the area and what it holds (the work it staged is done)."""
        shutil.rmtree(self.path, ignore_errors=True)

    def release(self) -> None:
        """Unpin the area: kept (for a resume) until removed or evicted."""
        if self._pin is not None:
            self._pin.release()
            self._pin = None

    def __enter__(self) -> "Staging":
        return self

    def __exit__(self, *exc) -> None:
        self.release()
