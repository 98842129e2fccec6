"""Batches handed to the training process in memory each worker reuses: :class:`BatchRing`,
a ``collate_fn`` for ``torch.utils.data.DataLoader``.

PyTorch's default collation puts every batch a worker makes into a new shared-memory segment.
Each costs the worker the segment's pages afresh (the kernel zeroes each page before the batch
is copied into it) and the training process a descriptor handed over a socket per tensor, the
segment mapped, its pages faulted in as they are read, and unmapped when the batch is freed:
about 6 ms of the training process's time per batch of sixteen 480x480 images and masks
(14.7 MB) on the machine the benchmarks ran on, in the thread that also runs the training step.

:class:`BatchRing` collates instead into one of a few *slots* of a shared-memory file that
each worker makes once (``memfd_create``: not ``/dev/shm``, so a container's small
``/dev/shm`` does not limit it). The training process maps each worker's file once, at its
first batch, and afterwards receives a slot number: the batch's tensors are views of that
slot. The slot goes back to its worker when the last of them is freed (every tensor of the
batch and every view of one), never before; a worker whose slots are all held (a training
loop that keeps its batches) collates the next batch the default way. The tensors are those
``default_collate`` makes, value for value, type for type.
"""
from __future__ import annotations

import mmap
import os
import weakref
from multiprocessing.reduction import DupFd
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import GluonDataError
from ..storage.perprocess import PerProcess, ProcessMark

__all__ = ["BatchRing", "RING_AVAILABLE"]

#: Whether this system has what a ring needs (Linux's ``memfd_create``); elsewhere
#: :class:`BatchRing` collates every batch as ``default_collate`` does.
RING_AVAILABLE = hasattr(os, "memfd_create")

_PAGE = mmap.PAGESIZE
_ALIGN = 64  # each field starts on a cache line
_FREE, _TAKEN = 0, 1
#: The element types a slot holds: those ``torch.from_numpy`` takes (bool, signed integers,
#: uint8, floats, complex); anything else is collated the default way.
_KINDS = {"b": (1,), "i": (1, 2, 4, 8), "u": (1,), "f": (2, 4, 8), "c": (8, 16)}
#: The Python scalars ``default_collate`` makes a tensor of, with the dtype it gives them.
_SCALARS = {bool: np.dtype(np.bool_), int: np.dtype(np.int64), float: np.dtype(np.float64)}

#: (numpy dtype string, shape, offset in the slot, bytes) of one field of a batch
Field = Tuple[str, Tuple[int, ...], int, int]
#: what ``multiprocessing.reduction.DupFd`` returns: pickled, it hands a descriptor over to
#: the process that unpickles it, whose ``detach()`` returns it there (the standard library
#: does not type it)
Handle = Any


def _torch():
    try:
        import torch
    except ImportError:
        raise ImportError("BatchRing is a collate_fn for torch.utils.data.DataLoader: it needs "
                          "PyTorch (pip install torch)") from None
    return torch


def _slot_dtype(dtype: np.dtype) -> bool:
    return dtype.isnative and dtype.itemsize in _KINDS.get(dtype.kind, ())


def _column_field(column: Sequence[Any]) -> Optional[Tuple[np.dtype, Tuple[int, ...]]]:
    """``(dtype, shape)`` of one field stacked over the batch, as ``default_collate`` stacks
    it; ``None`` where it would not make one tensor of it that a slot can hold."""
    first = column[0]
    if isinstance(first, np.ndarray):
        dtype, shape = first.dtype, first.shape
        if not _slot_dtype(dtype) or any(
                not isinstance(a, np.ndarray) or a.dtype != dtype or a.shape != shape
                or min(a.strides, default=0) < 0  # (torch refuses these: so does collate)
                for a in column):
            return None
        return dtype, (len(column),) + shape
    kind = type(first)
    if kind in _SCALARS:  # exactly bool, int or float in every sample (as default_collate)
        if any(type(v) is not kind for v in column):
            return None
        if kind is int and any(not -2 ** 63 <= v < 2 ** 63 for v in column):
            return None
        return _SCALARS[kind], (len(column),)
    if isinstance(first, np.generic) and _slot_dtype(first.dtype):
        if any(not isinstance(v, np.generic) or v.dtype != first.dtype for v in column):
            return None
        return first.dtype, (len(column),)
    return None


def layout(samples: Sequence[Any]) -> Optional[Tuple[bool, List[Sequence[Any]], List[Field]]]:
    """How a batch of ``samples`` lies in a slot: ``(one, columns, fields)``, ``one`` when
    each sample is one array (the batch is one tensor) rather than a tuple or list of fields
    (the batch is a list of tensors, as ``default_collate`` makes it); ``None`` when it is
    anything else, which is then collated the default way."""
    if not samples:
        return None
    first = samples[0]
    if isinstance(first, np.ndarray):
        one, columns = True, [samples]
    elif type(first) in (tuple, list) and first and all(
            type(s) is type(first) and len(s) == len(first) for s in samples):
        one, columns = False, [list(c) for c in zip(*samples)]
    else:
        return None
    fields, offset = [], 0
    for column in columns:
        got = _column_field(column)
        if got is None:
            return None
        dtype, shape = got
        nbytes = int(np.prod(shape)) * dtype.itemsize
        fields.append((dtype.str, shape, offset, nbytes))
        offset += -(-nbytes // _ALIGN) * _ALIGN
    return one, columns, fields


class _Ring:
    """One worker's slots: ``slots`` of ``slot_bytes`` each in one shared-memory file, after
    a first page that holds a flag per slot (taken by the worker, freed by the training
    process)."""

    def __init__(self, slots: int, slot_bytes: int, replaces: Optional[str]):
        self.slots, self.slot_bytes, self.replaces = slots, slot_bytes, replaces
        self.size = _PAGE + slots * slot_bytes
        fd = os.memfd_create("gluon-data-batches", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, self.size)
            self.mm = mmap.mmap(fd, self.size)
        except BaseException:
            os.close(fd)
            raise
        self.fd: Optional[int] = fd
        self.flags = np.frombuffer(self.mm, np.uint8, slots)
        self.token = os.urandom(8).hex()
        self.owner = ProcessMark()

    def take(self) -> Optional[int]:
        """A free slot, now taken (the lowest: its pages are the warmest), or ``None``."""
        free = np.flatnonzero(self.flags == _FREE)
        if not len(free):
            return None
        slot = int(free[0])
        self.flags[slot] = _TAKEN
        return slot

    def handle(self) -> Optional[Handle]:
        """The file, for the first batch sent only: the training process maps it then."""
        if self.fd is None:
            return None
        fd, self.fd = self.fd, None
        try:
            return DupFd(fd)
        finally:
            os.close(fd)

    def __del__(self):
        if getattr(self, "fd", None) is not None:
            os.close(self.fd)


class _Sent:
    """A batch in a slot, as a worker sends it: pickled as its place (the ring's file too,
    the first time), unpickled in the training process as its tensors (:func:`_received`)."""

    __slots__ = ("ring", "slot", "fields", "one")

    def __init__(self, ring: _Ring, slot: int, fields: List[Field], one: bool):
        self.ring, self.slot, self.fields, self.one = ring, slot, fields, one

    def __reduce__(self):
        r = self.ring
        return _received, (r.token, r.owner, r.size, r.slots, r.handle(), r.replaces,
                           _PAGE + self.slot * r.slot_bytes, self.slot, self.fields, self.one)


class _Mapped:
    """A worker's ring as the training process maps it."""

    __slots__ = ("mm", "flags", "address", "owner")

    def __init__(self, mm: mmap.mmap, slots: int, owner: ProcessMark):
        self.mm, self.owner = mm, owner
        self.flags = np.frombuffer(mm, np.uint8, slots)
        self.address: int = self.flags.ctypes.data


class _Slot:
    """The memory of one received batch: every array of the batch is a view of it (numpy
    keeps it as their base), and the slot is freed for its worker when it is collected,
    once the last of them is (a memoryview would not do: numpy keeps the buffer it exports,
    not the view, and would free the slot too soon)."""

    __slots__ = ("__array_interface__", "ring", "__weakref__")

    def __init__(self, ring: _Mapped, slot: int, offset: int, nbytes: int):
        self.ring = ring
        self.__array_interface__ = {"data": (ring.address + offset, False), "shape": (nbytes,),
                                    "typestr": "|u1", "version": 3}
        weakref.finalize(self, _free, ring.flags, slot)


#: The rings this process has mapped, by token (a forked child starts with none).
_MAPPED: PerProcess[Dict[str, _Mapped]] = PerProcess()


def _map(token: str, owner: ProcessMark, size: int, slots: int, handle: Handle,
         replaces: Optional[str]) -> None:
    fd = handle.detach()
    try:
        mm = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    rings = _MAPPED.get(dict)
    with _MAPPED.lock():
        # a ring its worker replaced, or whose worker has ended (a loader's workers of a
        # past epoch), gets no batch any more: its memory stays only while its tensors do
        for gone in [t for t, r in rings.items() if t == replaces or not r.owner.alive()]:
            del rings[gone]
        rings[token] = _Mapped(mm, slots, owner)


def _free(flags: np.ndarray, slot: int) -> None:
    flags[slot] = _FREE


def _received(token: str, owner: ProcessMark, size: int, slots: int, handle: Optional[Handle],
              replaces: Optional[str], offset: int, slot: int, fields: List[Field],
              one: bool) -> Any:
    """A batch in a slot, in the training process: its tensors, views of the slot, which
    goes back to its worker once the last of them is freed."""
    if handle is not None:
        _map(token, owner, size, slots, handle, replaces)
    ring = _MAPPED.get(dict).get(token)
    if ring is None:
        raise GluonDataError("a batch arrived in batch ring %s of worker process %d, which "
                             "this process never mapped (a batch ring's batches are unpickled "
                             "only by the process that received its first)" % (token, owner.pid))
    memory = np.asarray(_Slot(ring, slot, offset, fields[-1][2] + fields[-1][3]))
    torch = _torch()
    tensors = [torch.from_numpy(memory[off:off + nbytes].view(np.dtype(dt)).reshape(shape))
               for dt, shape, off, nbytes in fields]
    return tensors[0] if one else tensors


class BatchRing:
    """A ``collate_fn`` for ``torch.utils.data.DataLoader`` that hands each batch to the
    training process in shared memory its worker reuses, not a new segment per batch.

    >>> loader = torch.utils.data.DataLoader(train, batch_size=16, num_workers=8,
    ...                                      collate_fn=BatchRing())          # doctest: +SKIP

    The batches are what ``default_collate`` makes: a tensor where each sample is a numpy
    array, a list of tensors where it is a tuple or list of arrays and numbers (as
    :class:`~gluon_data.arrays.SegmentationDataset` and
    :class:`~gluon_data.arrays.ClassificationDataset` return), same values, dtypes and
    shapes. Any other batch (strings, dicts, samples of different shapes, a dtype a slot does
    not hold), a batch collated in the training process itself (``num_workers=0``), and every
    batch on a system without ``memfd_create`` (not Linux) is collated by ``default_collate``.

    Parameters
    ----------
    slots : int
        Batches each worker may have in the training process's hands at once, in flight
        (``prefetch_factor``) or kept by it, before it collates the default way. Slots cost
        memory only once used: at most ``slots`` batches per worker.

    Notes
    -----
    A batch's slot is reused once every tensor of that batch, and every view of one, is
    freed: keeping a batch (or a view of it) keeps its slot, and writing into it is safe.
    ``pin_memory=True`` copies each batch out of its slot, which is then free at once.
    """

    def __init__(self, slots: int = 8):
        if isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= 255:
            raise ValueError("slots must be an integer from 1 to 255, got %r" % (slots,))
        self.slots = slots
        self._ring: PerProcess[_Ring] = PerProcess()

    def __call__(self, samples: Sequence[Any]) -> Any:
        torch = _torch()
        planned = (layout(samples) if RING_AVAILABLE and torch.utils.data.get_worker_info()
                   is not None else None)
        if planned is None:
            return torch.utils.data.default_collate(samples)
        one, columns, fields = planned
        ring = self._ring_for(fields[-1][2] + fields[-1][3])
        slot = ring.take()
        if slot is None:  # every slot in the training process's hands
            return torch.utils.data.default_collate(samples)
        base = _PAGE + slot * ring.slot_bytes
        for column, (dt, shape, off, _) in zip(columns, fields):
            out = np.frombuffer(ring.mm, np.dtype(dt), int(np.prod(shape)),
                                base + off).reshape(shape)
            if isinstance(column[0], np.ndarray):
                np.stack(column, out=out)
            else:
                out[...] = column
        return _Sent(ring, slot, fields, one)

    def _ring_for(self, nbytes: int) -> _Ring:
        """This worker's ring, a new one with larger slots where a batch of ``nbytes`` does
        not fit (the old one is then left to the batches in it)."""
        ring = self._ring.peek()
        if ring is None or ring.slot_bytes < nbytes:
            ring = _Ring(self.slots, -(-nbytes // _PAGE) * _PAGE,
                         ring.token if ring is not None else None)
            self._ring.set(ring)
        return ring

    def __repr__(self) -> str:
        return "BatchRing(slots=%d)" % self.slots
