"""Reading local files: descriptors, the regular-file rule and read-ahead hints.

The containers (:mod:`gluon_data.stores.recordio`, :mod:`gluon_data.stores.lmdbio`) and the metadata
reader (:mod:`gluon_data.format.meta`) share these, so each lives once, below all of them: this
module imports nothing of ours but :mod:`gluon_data.errors` and the per-process rule
(:mod:`gluon_data.storage.perprocess`), no MXNet, and numpy only where a read-ahead hint
needs it.
"""
from __future__ import annotations

import errno
import operator
import os
import stat
import warnings
from typing import IO, TYPE_CHECKING, Any, Callable, Dict, Optional, Sequence, Tuple, Union

if TYPE_CHECKING:
    import numpy as np

from ..errors import FormatError, ResourceError
from .perprocess import PerProcess

__all__ = ["open_or_explain", "open_regular", "read_input", "require_regular", "input_kind",
           "advise_willneed", "ProcessDescriptor",
           "replaced_error", "STAMP_FIELDS", "FILE_ID", "stat_stamp", "path_stamp"]

#: A file's stamp: these fields of its ``stat`` (``st_dev``...), what changes when the file is
#: replaced or rewritten, read without reading the file. Each caller records a fixed subset,
#: in a fixed order (its stored stamps compare equal only in that order).
STAMP_FIELDS = ("dev", "ino", "size", "mtime_ns", "ctime_ns")
#: Which file it is: the subset a replacement changes and a rewrite in place does not.
FILE_ID = ("dev", "ino")


def stat_stamp(st: os.stat_result, fields: Sequence[str] = STAMP_FIELDS) -> Tuple[int, ...]:
    """The one way a file's stamp is made: ``fields`` (of :data:`STAMP_FIELDS`) of the stat
    result ``st``, in that order.

    >>> st = os.stat(os.devnull)
    >>> stat_stamp(st, FILE_ID) == (st.st_dev, st.st_ino)
    True
    """
    key = tuple(fields)
    if not key:
        return ()
    get = _GETTERS.get(key)
    if get is None:  # (one getter per subset: a conversion stamps every file of its source)
        get = _GETTERS[key] = operator.attrgetter(*("st_" + name for name in key))
    got = get(st)
    return got if len(key) > 1 else (got,)


_GETTERS: Dict[Tuple[str, ...], Callable[[os.stat_result], Any]] = {}


def path_stamp(path: str, fields: Sequence[str] = STAMP_FIELDS) -> Optional[Tuple[int, ...]]:
    """:func:`stat_stamp` of what ``path`` leads to now (links followed), or ``None`` where
    nothing is (or it cannot be stat'ed)."""
    try:
        return stat_stamp(os.stat(path), fields)
    except OSError:
        return None


def open_or_explain(path: str, flags: int = os.O_RDONLY, *, directory: bool = False) -> int:
    """``os.open`` of an input, under the one input-kind rule (:func:`require_regular`).

    ``path`` must lead to a regular file (``directory``: or a directory): anything else (a
    FIFO, a device, a socket, or a symbolic link to one) is refused before it is opened, a
    :class:`FormatError` naming it; the open itself is non-blocking and what it opened is
    checked again (a file swapped for a FIFO between the two cannot block the caller), and
    the descriptor handed back is blocking as usual. Running out of descriptors is a
    :class:`ResourceError` saying so (with the limit and the fix) instead of a bare
    ``EMFILE``. An open that creates (``O_CREAT``) is an output's: only the descriptor
    limit is explained."""
    check = not flags & os.O_CREAT
    if check:
        require_regular(path, directory=directory)
    nonblock = getattr(os, "O_NONBLOCK", 0) if check and not flags & getattr(
        os, "O_NONBLOCK", 0) else 0
    try:
        fd = os.open(path, flags | nonblock | getattr(os, "O_CLOEXEC", 0))
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
    if check:
        try:
            _check_kind(path, os.fstat(fd), directory)
            if nonblock:
                import fcntl
                fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~nonblock)
        except BaseException:
            os.close(fd)
            raise
    return fd


def open_regular(path: str, mode: str = "rb", **kwargs: Any) -> IO[Any]:
    """A file object reading the input ``path`` (:func:`open_or_explain`'s rule and checks:
    a FIFO, device or socket is refused, never opened nor waited on). ``mode`` is a reading
    mode (``"rb"``, ``"r"``...; ``"r+b"`` opens for reading and writing)."""
    flags = os.O_RDWR if "+" in mode else os.O_RDONLY
    # opened through ``opener``: the file object owns the descriptor from the start (as
    # fsutil.open_new: an interrupt is never turned into a second close)
    return open(path, mode, opener=lambda p, _: open_or_explain(p, flags), **kwargs)


def read_input(path: str) -> bytes:
    """The bytes of the input ``path``, read whole under :func:`open_or_explain`'s rule (a
    source file read with a size cap is
    :func:`gluon_data.convert.source_files.read_regular`)."""
    with open_regular(path) as f:
        return f.read()


def __getattr__(name: str) -> Callable[[str], bytes]:
    if name == "read_regular":  # its name until it was told apart from the source reader's
        warnings.warn("gluon_data.storage.fileio.read_regular is now read_input (read_regular "
                      "is gluon_data.convert.source_files'); the old name will be removed",
                      DeprecationWarning, stacklevel=2)
        return read_input
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


class ProcessDescriptor:
    """One read-only descriptor of ``path`` per process, opened on first use.

    A reader is pickled into DataLoader workers and forked with its parent's state, and a
    descriptor must not be shared across processes (the parent may close it; readahead
    state is per open file): it is held by a
    :class:`~gluon_data.storage.perprocess.PerProcess`, so :meth:`get` opens a descriptor
    in each process that asks, leaves one inherited from the parent alone, and :meth:`close`
    closes only the calling process's own. ``on_open(fd)`` runs once per descriptor, under the lock, before anyone
    reads through it; what it returns comes back beside the descriptor (the file's size as
    opened, say), and an exception it raises closes the descriptor and propagates (a file
    replaced since the reader opened it). Pickles without the descriptor.

    This is how a reader stays bound to the file it opened (the rule of every local reader,
    RecordIO and LMDB alike): it stamps the file when the dataset is opened, and its
    ``on_open`` compares ``os.fstat(fd)`` with that stamp and raises
    :func:`replaced_error` on a difference. Each process's descriptor is so checked once,
    when opened, and then names that file (inode) for as long as it is open, whatever the
    path is made to name meanwhile.
    """

    __slots__ = ("path", "_on_open", "_cur")

    def __init__(self, path: str, on_open: Optional[Callable[[int], object]] = None):
        self.path, self._on_open = path, on_open
        self._cur: PerProcess[Tuple[int, object]] = PerProcess()  # (fd, on_open's value)

    def _open(self) -> Tuple[int, object]:
        fd = open_or_explain(self.path)
        try:
            value = self._on_open(fd) if self._on_open is not None else None
        except BaseException:
            os.close(fd)
            raise
        return fd, value

    def get(self) -> Tuple[int, object]:
        """``(descriptor, on_open's value)`` for this process."""
        return self._cur.get(self._open)

    def fd(self) -> int:
        """This process's descriptor."""
        return self._cur.get(self._open)[0]

    def close(self) -> None:
        """Close this process's descriptor, if it opened one; the next :meth:`get` opens
        again."""
        cur = self._cur.clear()
        if cur is not None:
            os.close(cur[0])

    def __getstate__(self):
        return {"path": self.path, "_on_open": self._on_open}

    def __setstate__(self, state):
        self.__init__(state["path"], state["_on_open"])


def replaced_error(path: str, then: tuple, now: tuple, *,
                   fields: str = "device:inode:size:mtime",
                   consequence: str = "its index no longer describes it") -> FormatError:
    """The :class:`FormatError` of a reader whose file was replaced or rewritten after the
    dataset was opened: ``then`` is the stamp taken when it was opened, ``now`` the one found
    (tuples of ints named by ``fields``), ``consequence`` what the reader can no longer
    vouch for. The message every local reader gives (RecordIO's and LMDB's)."""
    fmt = ":".join(["%d"] * len(then))
    return FormatError("the file was replaced or rewritten after this dataset was opened "
                       "(%s %s, now %s): %s; open the dataset again"
                       % (fields, fmt % tuple(then), ":".join(["%d"] * len(now)) % tuple(now),
                          consequence), path)


def require_regular(path: str, *, directory: bool = False) -> Optional[os.stat_result]:
    """The one input-kind rule: every path a command reads is checked here before it is
    opened. ``path`` (symbolic links followed) must be a regular file, or with
    ``directory`` a directory; a FIFO (an open would block forever), a device (read without
    end), a socket, or a link to one, raises :class:`FormatError` naming ``path``, saying
    what it is and that a regular file is needed; so does a symbolic link that loops (it
    leads to no file, and is not missing either). Returns the file's ``stat``; ``None``
    where there is nothing to check (a missing file, left to the caller's own message)."""
    try:
        st = os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise FormatError("not a regular file (a symbolic link that loops, or a chain of "
                              "more links than the system follows); a regular file%s is "
                              "needed, so it was not opened"
                              % (" (or a dataset's directory)" if directory else ""),
                              path) from None
        return None
    _check_kind(path, st, directory)
    return st


#: What a file that is not regular is, in the words of the refusal (S_IFMT -> words).
_KIND_WORDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
               (stat.S_ISDIR, "a directory"))


def input_kind(st: os.stat_result) -> str:
    """What a ``stat`` result describes, in words: ``"a regular file"``, ``"a FIFO"``, ``"a
    character device"``, ``"a block device"``, ``"a socket"``, ``"a directory"``."""
    if stat.S_ISREG(st.st_mode):
        return "a regular file"
    for test, words in _KIND_WORDS:
        if test(st.st_mode):
            return words
    return "a special file"


def _check_kind(path: str, st: os.stat_result, directory: bool) -> None:
    if stat.S_ISREG(st.st_mode) or (directory and stat.S_ISDIR(st.st_mode)):
        return
    what = input_kind(st)
    try:
        link = os.readlink(path)
    except (OSError, ValueError, TypeError):
        link = None
    via = "" if link is None else ", reached through a symbolic link to %s" % link
    raise FormatError("not a regular file (%s%s); a regular file%s is needed, so it was not "
                      "opened" % (what, via, " (or a dataset's directory)" if directory else ""),
                      path)


_FADV_WILLNEED = getattr(os, "POSIX_FADV_WILLNEED", None)
# One WILLNEED call asks for at most this much: Linux silently cuts a call at
# max(read_ahead_kb, max_sectors_kb) of the device, never below its default 128 KB.
_WILLNEED_CHUNK = 128 << 10


def advise_willneed(fd: int, starts: Union[np.ndarray, Sequence[int]],
                    ends: Union[np.ndarray, Sequence[int]]) -> None:
    """Start reading the byte ranges ``[starts[k], ends[k])`` of ``fd`` into the page cache
    asynchronously (``posix_fadvise(POSIX_FADV_WILLNEED)``) and return at once: ranges that
    touch are merged, so adjacent records go as one request, and each call asks for at most
    128 KB. Pages already cached cost a lookup, no I/O. Does nothing where the OS has no
    ``posix_fadvise``; an OS error is ignored (a hint, not a read)."""
    if _FADV_WILLNEED is None or not len(starts):
        return
    # numpy here only: the rest of this module runs without it, so a conversion's worker
    # starter imports it (its outputs' digests) before it limits numpy's threads
    import numpy as np
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
