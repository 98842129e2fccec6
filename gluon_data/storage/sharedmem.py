"""Shared memory that a worker process makes once and the training process maps once.

A loader's worker hands each batch to the training process in shared memory. Making a new
segment per batch costs the worker freshly zeroed pages and the training process a
descriptor handed over a socket, a mapping, its page faults and an unmapping, per batch.
Here a worker makes a :class:`SharedFile` (``memfd_create``: anonymous, so nothing is left
in ``/dev/shm`` when a worker is killed, and no container's ``/dev/shm`` size limits it) and
reuses it for batch after batch. The first batch it sends from a file carries the file's
descriptor (:meth:`SharedFile.place`); the training process maps the file then
(:func:`mapped`) and finds that mapping again for every later batch by the file's token.

The training process keeps a file mapped until its worker says it is gone (the next
:meth:`~SharedFile.place` of that worker names it), its worker has ended, or the group it
belongs to is let go (:func:`let_go`, a loader collected); its memory then stays only while
arrays over it live. Files of ended workers are let go before every fork, so that a new
worker does not inherit their mappings.

Two users: :class:`gluon_data.arrays.BatchRing` (slots of a ring, for PyTorch) and the
Gluon layer's segment pool (``gluon_data/gluon/buffers.py``). Each keeps its own record of
which part of a file is free, in the file itself.
"""
from __future__ import annotations

import mmap
import os
from multiprocessing.reduction import DupFd
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

from ..errors import GluonDataError
from .perprocess import PerProcess, ProcessMark

__all__ = ["SharedFile", "Mapped", "mapped", "mapped_count", "let_go", "AVAILABLE", "Place"]

#: Whether this system can make them (Linux's ``memfd_create``).
AVAILABLE = hasattr(os, "memfd_create")

#: What ``multiprocessing.reduction.DupFd`` returns: pickled, it hands a descriptor over to
#: the process that unpickles it, whose ``detach()`` returns it there (the standard library
#: does not type it).
Handle = Any
#: What a batch sent from a file carries of it (:meth:`SharedFile.place`): ``(group, token,
#: owner, size, handle, gone)``.
Place = Tuple[str, str, ProcessMark, int, Optional[Handle], Tuple[str, ...]]


class SharedFile:
    """A worker's shared-memory file of ``size`` bytes, mapped here (:attr:`map`), handed to
    the training process with the first batch sent from it."""

    def __init__(self, size: int, name: str = "gluon-data-batches"):
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            self.map = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        self.size = size
        self._fd: Optional[int] = fd  # until it is handed over
        self.token = os.urandom(8).hex()
        self.owner = ProcessMark()

    def place(self, group: str, gone: Sequence[str] = ()) -> Place:
        """What a batch sent from this file carries: the file's descriptor the first time
        only (the training process maps it then), and the tokens of this worker's files that
        are ``gone`` (closed or replaced: the training process forgets them)."""
        handle = None
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                handle = DupFd(fd)
            finally:
                os.close(fd)
        return group, self.token, self.owner, self.size, handle, tuple(gone)

    @property
    def handed(self) -> bool:
        """Whether a batch sent from the file has handed it over already."""
        return self._fd is None

    def address(self, offset: int = 0) -> int:
        """Where byte ``offset`` of the file lies in this process."""
        return np.frombuffer(self.map, np.uint8, 1, offset).ctypes.data

    def close(self) -> bool:
        """Unmap it and close its descriptor; False (and still open) while a view of it
        lives."""
        try:
            self.map.close()
        except BufferError:
            return False
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        return True

    def __del__(self):
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)


class Mapped:
    """A worker's file as the training process (:attr:`mapper`) maps it."""

    __slots__ = ("map", "address", "owner", "mapper")

    def __init__(self, mm: mmap.mmap, owner: ProcessMark):
        self.map, self.owner, self.mapper = mm, owner, ProcessMark()
        self.address: int = np.frombuffer(mm, np.uint8, 1).ctypes.data


#: The files this process has mapped: group -> token -> file. A forked child starts with none.
_MAPPED: PerProcess[Dict[str, Dict[str, Mapped]]] = PerProcess()


def _prune(files: Dict[str, Dict[str, Mapped]], group: Optional[str],
           gone: Sequence[str]) -> None:
    """Forget ``group``'s files, the files ``gone`` and every file whose worker has ended.
    The caller holds ``_MAPPED``'s lock."""
    if group is not None:
        files.pop(group, None)
    for mine in files.values():
        for t in [t for t, f in mine.items() if t in gone or not f.owner.alive()]:
            del mine[t]


def let_go(group: Optional[str] = None) -> None:
    """Forget ``group``'s files (with none, only those of ended workers), unless another
    thread is at them (the next time will do): their memory stays only while arrays over it
    live. Run before every fork, and when a user of a group is collected."""
    files = _MAPPED.peek()
    if not files:  # (before most forks: nothing to do, no lock made)
        return
    lock = _MAPPED.lock()
    if lock.acquire(blocking=False):
        try:
            _prune(files, group, ())
        finally:
            lock.release()


if hasattr(os, "register_at_fork"):  # a worker forked now does not inherit ended files
    os.register_at_fork(before=let_go)


def mapped(place: Place) -> Mapped:
    """In the training process: the file a batch was sent from, mapped at the first batch
    that carried its descriptor. Raises :class:`~gluon_data.errors.GluonDataError` for a
    file this process never mapped (its first batch was unpickled elsewhere) or no longer
    maps (its worker was killed with the batch on its way)."""
    group, token, owner, size, handle, gone = place
    files = _MAPPED.get(dict)
    if handle is not None or gone:
        mm = None
        if handle is not None:
            fd = handle.detach()
            try:
                mm = mmap.mmap(fd, size)
            finally:
                os.close(fd)
        with _MAPPED.lock():
            _prune(files, None, gone)
            if mm is not None:
                files.setdefault(group, {})[token] = Mapped(mm, owner)
    got = files.get(group, {}).get(token)
    if got is None:
        why = ("which ended before the batch was received (its memory was let go with it)"
               if not owner.alive() else
               "which this process never mapped (its batches are unpickled only by the "
               "process that received its first)")
        raise GluonDataError("a batch arrived in shared memory %s of worker process %d, %s"
                             % (token, owner.pid, why))
    return got


def mapped_count(group: Optional[str] = None) -> int:
    """How many files this process keeps mapped (of ``group``; of all groups without one)."""
    files = _MAPPED.peek() or {}
    return sum(len(v) for g, v in files.items() if group is None or g == group)
