"""The per-process rule, once: a handle belongs to the process that opened it.

A descriptor, an LMDB environment, a thread pool, a lock, an open reader: each is valid only
in the process that made it. A reader is forked into DataLoader workers with its parent's
state, and pickled into spawned ones; a child must never use what it inherited (the parent
may close it, LMDB forbids it, a lock held by a parent's thread at the fork is never released
in the child, a pool's threads do not exist there). :class:`PerProcess` holds such a value
with the process that made it; any other process sees an empty holder and makes its own on
first use. It pickles empty. Every module that keeps a process's handle keeps it here: this
module is the only one that compares process ids.

A worker process's set-up lives here too: :func:`reuse_freed_memory`, which a loader's and a
conversion's workers run once, and :func:`one_thread_per_library`, which a conversion's
workers run before they import numpy.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from typing import Callable, Generic, List, Optional, Tuple, TypeVar

__all__ = ["PerProcess", "ProcessMark", "reuse_freed_memory", "MALLOC_ENV",
           "one_thread_per_library", "LIBRARY_THREADS_ENV", "end_with_parent"]

T = TypeVar("T")

# Guards the making of each holder's per-process lock; replaced in a forked child (a thread
# of the parent may have held it at the fork).
_GUARD = threading.Lock()


def _reset_guard() -> None:
    global _GUARD
    _GUARD = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_guard)


class PerProcess(Generic[T]):
    """This process's value: made on first use in each process, never handed to another.

    :meth:`get` returns the value this process made, making it with ``factory()`` (under this
    holder's lock, so once per process however many threads ask) when there is none: on first
    use, after :meth:`clear`, and in a forked child, where the parent's value is inherited but
    never returned. A value inherited from another process is dropped when this process makes
    its own (or clears or sets the holder); ``release``, where given, is called with it then
    (an LMDB environment the child must close), otherwise it is left alone (a descriptor the
    parent still reads through). A pickled holder is empty: the value stays in its process.

    Parameters
    ----------
    release : callable, optional
        Called with a value inherited from another process when this process drops it (a
        module-level function, if the holder is pickled).

    Examples
    --------
    >>> import os
    >>> fd = PerProcess()
    >>> mine = fd.get(lambda: os.open(os.devnull, os.O_RDONLY))  # opened here, once
    >>> fd.get(lambda: -1) == mine and fd.mine()
    True
    >>> os.close(fd.clear())                                     # this process's, to close
    >>> fd.peek() is None
    True
    """

    __slots__ = ("_cur", "_lock", "release")

    def __init__(self, release: Optional[Callable[[T], None]] = None):
        self.release = release
        self._cur: Optional[Tuple[int, T]] = None     # (pid of its maker, value)
        self._lock: Optional[Tuple[int, threading.RLock]] = None

    def get(self, factory: Callable[[], T]) -> T:
        """This process's value; ``factory()`` makes it if this process has none (an
        exception of the factory propagates and leaves the holder empty)."""
        cur = self._cur
        if cur is not None and cur[0] == os.getpid():
            return cur[1]
        with self.lock():
            cur = self._cur
            pid = os.getpid()
            if cur is not None and cur[0] == pid:
                return cur[1]
            if cur is not None:  # inherited: dropped before this process makes its own
                self._cur = None
                self._drop(cur, pid)
            value = factory()
            self._cur = (pid, value)
            return value

    def peek(self) -> Optional[T]:
        """This process's value, or ``None`` when this process has made none (never makes
        one)."""
        cur = self._cur
        return cur[1] if cur is not None and cur[0] == os.getpid() else None

    def mine(self) -> bool:
        """Whether the holder has a value made by this process."""
        cur = self._cur
        return cur is not None and cur[0] == os.getpid()

    @property
    def owner(self) -> Optional[int]:
        """The process id of the process whose value the holder has (this one or, after a
        fork, the parent); ``None`` when it is empty."""
        cur = self._cur
        return None if cur is None else cur[0]

    def set(self, value: T) -> None:
        """Make ``value`` this process's value (a value this process had is replaced and
        not released: the caller had it)."""
        with self.lock():
            pid = os.getpid()
            self._drop(self._cur, pid)
            self._cur = (pid, value)

    def clear(self) -> Optional[T]:
        """Empty the holder; return this process's value (``None`` if it had none), which the
        caller closes if it must. A value inherited from another process is dropped (and
        released, with ``release``); the next :meth:`get` makes a new one."""
        with self.lock():
            cur, self._cur = self._cur, None
            pid = os.getpid()
            if cur is not None and cur[0] == pid:
                return cur[1]
            self._drop(cur, pid)
            return None

    def lock(self) -> threading.RLock:
        """This process's lock of the holder (re-entrant; a forked child gets a new one, so a
        lock held by a parent's thread at the fork never blocks it). Callers may hold it
        around work on the value."""
        cur = self._lock
        pid = os.getpid()
        if cur is None or cur[0] != pid:
            with _GUARD:
                cur = self._lock
                if cur is None or cur[0] != pid:
                    cur = self._lock = (pid, threading.RLock())
        return cur[1]

    def _drop(self, cur: Optional[Tuple[int, T]], pid: int) -> None:
        if cur is not None and cur[0] != pid and self.release is not None:
            self.release(cur[1])

    def __reduce__(self):
        return PerProcess, (self.release,)

    def __repr__(self) -> str:
        cur = self._cur
        if cur is None:
            return "PerProcess(empty)"
        return "PerProcess(%s of process %d)" % (
            "value" if cur[0] == os.getpid() else "inherited value", cur[0])


class ProcessMark:
    """Which process made something: the one other per-process fact, for what must know
    after a pickle whether it is back in the process that made it (a seeded stream that the
    making process draws as ``seed`` and every other process as ``(seed, pid)``; the command
    line's SIGTERM handler, which raises only in the process that installed it).

    Unlike a :class:`PerProcess` value, a mark travels with a pickle (it is a process id, no
    handle). No module compares ``os.getpid()`` itself: it asks a holder or a mark.

    >>> mark = ProcessMark()
    >>> mark.here(), ProcessMark(mark.pid + 1).here()
    (True, False)
    """

    __slots__ = ("pid",)

    def __init__(self, pid: Optional[int] = None):
        #: the process id of the process it marks (this one by default)
        self.pid: int = os.getpid() if pid is None else pid

    def here(self) -> bool:
        """Whether the calling process is the marked one."""
        return self.pid == os.getpid()

    def alive(self) -> bool:
        """Whether the marked process still exists (a process that ended and was reaped
        does not; its id may in time be another process's, which then reads as alive)."""
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # (another user's process now has the id)
            return True
        return True

    def __reduce__(self):
        return ProcessMark, (self.pid,)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProcessMark) and other.pid == self.pid

    def __hash__(self) -> int:
        return hash(self.pid)

    def __repr__(self) -> str:
        return "ProcessMark(%d%s)" % (self.pid, ", this process" if self.here() else "")


#: ``GLUON_DATA_WORKER_MALLOC=0`` leaves a worker's allocator as it was
#: (:func:`reuse_freed_memory`).
MALLOC_ENV = "GLUON_DATA_WORKER_MALLOC"
#: glibc's ``mallopt`` parameters
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def reuse_freed_memory(mmap_threshold: int = 32 << 20, trim_threshold: int = 64 << 20) -> bool:
    """Let glibc's ``malloc`` in this process serve blocks under ``mmap_threshold`` bytes
    from its heap and keep up to ``trim_threshold`` bytes of it freed, instead of mapping
    each large block afresh and unmapping it when freed. A worker allocates and frees a few
    buffers of about a megabyte per sample (the decoded image, the crop, the mask); with
    glibc's default policy their sizes vary, many are mapped anew, and touching a new
    mapping costs a page fault per 4 KiB: 250 faults, a sixth of the CPU of a VOC-size
    ``train`` sample, measured on 2 cores (``python benchmarks/bench_seg.py``). Kept, the
    pages are reused: about 2 faults per sample. The cost is memory a worker holds on to:
    at most ``trim_threshold`` above what it uses.

    Returns whether the setting took: not off glibc (no ``mallopt``), nor with
    ``GLUON_DATA_WORKER_MALLOC=0``."""
    if os.environ.get(MALLOC_ENV, "1").strip() == "0":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (macOS, Windows)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, int(mmap_threshold))) and \
        bool(mallopt(_M_TRIM_THRESHOLD, int(trim_threshold)))


#: The variables that size the thread pools of numerical libraries (OpenBLAS, OpenMP, MKL),
#: read when the library loads: numpy's OpenBLAS starts one thread per core at import.
LIBRARY_THREADS_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def one_thread_per_library() -> List[str]:
    """Run this process's numerical libraries in one thread each: every variable of
    :data:`LIBRARY_THREADS_ENV` that the environment leaves unset is set to ``"1"`` (one the
    user set stays as set). Only a library loaded afterwards reads it, so a worker calls it
    first, before anything imports numpy. A conversion runs one worker process per core;
    left to their defaults, N workers would start N threads each, N x N threads competing
    with each other at every start. Returns the variables it set."""
    unset = [name for name in LIBRARY_THREADS_ENV if name not in os.environ]
    for name in unset:
        os.environ[name] = "1"
    return unset


#: Linux's ``prctl`` option that signals a process when its parent ends (None elsewhere).
_PR_SET_PDEATHSIG = 1 if sys.platform.startswith("linux") else None


def end_with_parent(parent: ProcessMark) -> bool:
    """Have the kernel kill this process (SIGKILL) when ``parent``, the process that forked
    it, ends: Linux's ``prctl(PR_SET_PDEATHSIG)``. A process forked to serve another is not
    left running when that one is killed from outside. If ``parent`` ended already (before
    the call took), this process exits at once. Returns whether the setting took: False
    where the system has no such call (macOS), the caller's other way to end then applies."""
    if _PR_SET_PDEATHSIG is None:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent.pid:
        os._exit(1)
    return True
