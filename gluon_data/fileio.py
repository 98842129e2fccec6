"""Reading local files: descriptors, the regular-file rule and read-ahead hints.

The containers (:mod:`gluon_data.recordio`, :mod:`gluon_data.lmdbio`) and the metadata
reader (:mod:`gluon_data.meta`) share these, so each lives once, below all of them: this
module imports nothing of ours but :mod:`gluon_data.errors`, and no MXNet.
"""
from __future__ import annotations

import errno
import os
import stat
import threading
from typing import Callable, Optional, Tuple

import numpy as np

from .errors import FormatError, ResourceError

__all__ = ["open_or_explain", "require_regular", "advise_willneed", "ProcessDescriptor"]


def open_or_explain(path: str, flags: int = os.O_RDONLY) -> int:
    """``os.open`` whose running out of descriptors is a :class:`ResourceError` saying so
    (with the limit and the fix) instead of a bare ``EMFILE``."""
    try:
        return os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        if e.errno not in (errno.EMFILE, errno.ENFILE):
            raise
        try:
            import resource
            limit = "the limit is %d" % resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        except (ImportError, OSError, ValueError):
            limit = "limit unknown"
        raise ResourceError("cannot open: too many open files (%s%s); close datasets you no "
                            "longer read, or raise the limit (ulimit -n)"
                            % ("system-wide, " if e.errno == errno.ENFILE else "", limit),
                            path) from None


class ProcessDescriptor:
    """One read-only descriptor of ``path`` per process, opened on first use.

    A reader is pickled into DataLoader workers and forked with its parent's state, and a
    descriptor must not be shared across processes (the parent may close it; readahead
    state is per open file): :meth:`get` opens a descriptor in each process that asks,
    leaves one inherited from the parent alone, and :meth:`close` closes only the calling
    process's own. ``on_open(fd)`` runs once per descriptor, under the lock, before anyone
    reads through it; what it returns comes back beside the descriptor (the file's size as
    opened, say), and an exception it raises closes the descriptor and propagates (a file
    replaced since the reader opened it). Pickles without the descriptor.
    """

    __slots__ = ("path", "_on_open", "_cur", "_lock")

    def __init__(self, path: str, on_open: Optional[Callable[[int], object]] = None):
        self.path, self._on_open = path, on_open
        self._cur: Optional[Tuple[int, int, object]] = None  # (fd, pid, on_open's value)
        self._lock = threading.Lock()

    def get(self) -> Tuple[int, object]:
        """``(descriptor, on_open's value)`` for this process."""
        cur, pid = self._cur, os.getpid()
        if cur is not None and cur[1] == pid:
            return cur[0], cur[2]
        with self._lock:
            cur = self._cur
            if cur is None or cur[1] != pid:
                fd = open_or_explain(self.path)
                try:
                    value = self._on_open(fd) if self._on_open is not None else None
                except BaseException:
                    os.close(fd)
                    raise
                cur = self._cur = (fd, pid, value)
            return cur[0], cur[2]

    def fd(self) -> int:
        """This process's descriptor."""
        cur = self._cur
        if cur is not None and cur[1] == os.getpid():
            return cur[0]
        return self.get()[0]

    def close(self) -> None:
        """Close this process's descriptor, if it opened one; the next :meth:`get` opens
        again."""
        cur, self._cur = self._cur, None
        if cur is not None and cur[1] == os.getpid():
            os.close(cur[0])

    def __getstate__(self):
        return {"path": self.path, "_on_open": self._on_open}

    def __setstate__(self, state):
        self.__init__(state["path"], state["_on_open"])


def require_regular(path: str) -> None:
    """Refuse a FIFO, device or socket before opening it (a FIFO would block forever, a
    device be read without end); a missing file is left to the caller's own message."""
    try:
        st = os.stat(path)
    except OSError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise FormatError("not a regular file (%s); datasets are read from regular files only"
                          % ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a directory"
                             if stat.S_ISDIR(st.st_mode) else "a device or socket"), path)


_FADV_WILLNEED = getattr(os, "POSIX_FADV_WILLNEED", None)
# One WILLNEED call asks for at most this much: Linux silently cuts a call at
# max(read_ahead_kb, max_sectors_kb) of the device, never below its default 128 KB.
_WILLNEED_CHUNK = 128 << 10


def advise_willneed(fd: int, starts, ends) -> None:
    """Start reading the byte ranges ``[starts[k], ends[k])`` of ``fd`` into the page cache
    asynchronously (``posix_fadvise(POSIX_FADV_WILLNEED)``) and return at once: ranges that
    touch are merged, so adjacent records go as one request, and each call asks for at most
    128 KB. Pages already cached cost a lookup, no I/O. Does nothing where the OS has no
    ``posix_fadvise``; an OS error is ignored (a hint, not a read)."""
    if _FADV_WILLNEED is None or not len(starts):
        return
    starts = np.asarray(starts, np.int64)
    ends = np.asarray(ends, np.int64)
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    if len(starts) > 1:  # merge runs whose next range starts where the last one ends
        ends = np.maximum.accumulate(ends)
        breaks = np.flatnonzero(starts[1:] > ends[:-1]) + 1
        first = np.concatenate(([0], breaks))
        last = np.concatenate((breaks - 1, [len(starts) - 1]))
        starts, ends = starts[first], ends[last]
    advise = os.posix_fadvise
    try:
        for lo, hi in zip(starts.tolist(), ends.tolist()):
            while lo < hi:
                n = min(hi - lo, _WILLNEED_CHUNK)
                advise(fd, lo, n, _FADV_WILLNEED)
                lo += n
    except OSError:
        pass
