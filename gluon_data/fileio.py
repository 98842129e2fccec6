"""Reading local files: descriptors, the regular-file rule and read-ahead hints.

The containers (:mod:`gluon_data.recordio`, :mod:`gluon_data.lmdbio`) and the metadata
reader (:mod:`gluon_data.meta`) share these, so each lives once, below all of them: this
module imports nothing of ours but :mod:`gluon_data.errors`, and no MXNet.
"""
from __future__ import annotations

import errno
import os
import stat

import numpy as np

from .errors import FormatError, ResourceError

__all__ = ["open_or_explain", "require_regular", "advise_willneed"]


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
