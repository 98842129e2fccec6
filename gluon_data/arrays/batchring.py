"""Batches handed to the training process in memory each worker reuses: :class:`BatchRing`,
a ``collate_fn`` for ``torch.utils.data.DataLoader``.

PyTorch's default collation puts every batch a worker makes into a new shared-memory segment.
Each costs the worker the segment's pages afresh (the kernel zeroes each page before the batch
is copied into it) and the training process a descriptor handed over a socket per tensor, the
segment mapped, its pages faulted in as they are read, and unmapped when the batch is freed:
about 6 ms of the training process's time per batch of sixteen 480x480 images and masks
(14.7 MB) on the machine the benchmarks ran on, in the thread that also runs the training step.

:class:`BatchRing` collates instead into one of a few *slots* of a shared-memory file that
each worker makes once (:class:`~gluon_data.storage.sharedmem.SharedFile`: ``memfd_create``,
not ``/dev/shm``, so a container's small ``/dev/shm`` does not limit it). The training
process maps each worker's file once, at its first batch
(:func:`~gluon_data.storage.sharedmem.mapped`), and afterwards receives a slot number: the
batch's tensors are views of that slot. The slot goes back to its worker when the last of them is freed (every tensor of the
batch and every view of one), never before; a worker whose slots are all held (a training
loop that keeps its batches) collates the next batch the default way. The tensors are those
``default_collate`` makes, value for value, type for type.
"""
from __future__ import annotations

import mmap
import os
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..storage import sharedmem
from ..storage.perprocess import PerProcess
from ..storage.sharedmem import Mapped, Place, SharedFile

__all__ = ["BatchRing", "BY_VALUE_BYTES", "layout"]

#: A field of a batch of at most this many bytes (labels, class ids) is sent inside the
#: message rather than in the slot: a training loop that keeps its labels (for a metric at
#: the end of the epoch) then keeps no slot, and copying it costs next to nothing.
BY_VALUE_BYTES = 64 << 10

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
    """How a batch of ``samples`` is sent: ``(one, columns, fields)``, ``one`` when each
    sample is one array (the batch is one tensor) rather than a tuple or list of fields (the
    batch is a list of tensors, as ``default_collate`` makes it); ``None`` when it is
    anything else, or too small to need a slot, and is then collated the default way. A
    field of at most :data:`BY_VALUE_BYTES` (labels) travels in the message itself, its
    offset ``-1``, so that keeping it keeps no slot."""
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
        if nbytes <= BY_VALUE_BYTES:
            fields.append((dtype.str, shape, -1, nbytes))
            continue
        fields.append((dtype.str, shape, offset, nbytes))
        offset += -(-nbytes // _ALIGN) * _ALIGN
    return (one, columns, fields) if offset else None


def _slot_bytes(fields: List[Field]) -> int:
    return max(off + nbytes for _, _, off, nbytes in fields)


class _Ring:
    """One worker's slots: ``slots`` of ``slot_bytes`` each in one shared file
    (:class:`~gluon_data.storage.sharedmem.SharedFile`), after a first page that holds a
    flag per slot (taken by the worker, freed by the training process)."""

    def __init__(self, slots: int, slot_bytes: int, replaces: Optional[str]):
        self.slot_bytes = slot_bytes
        self.file = SharedFile(_PAGE + slots * slot_bytes)
        self.flags = np.frombuffer(self.file.map, np.uint8, slots)
        self.gone = [replaces] if replaces else []  # told with the first batch

    def take(self) -> Optional[int]:
        """A free slot, now taken (the lowest: its pages are the warmest), or ``None``."""
        free = np.flatnonzero(self.flags == _FREE)
        if not len(free):
            return None
        slot = int(free[0])
        self.flags[slot] = _TAKEN
        return slot

    def place(self, key: str) -> Place:
        gone, self.gone = self.gone, []
        return self.file.place(key, gone)


class _Sent:
    """A batch in a slot, as a worker sends it: pickled as its place (the ring's file too,
    the first time) and its small fields' values, unpickled in the training process as its
    tensors (:func:`_received`). It is not the batch: a ``collate_fn`` that wraps
    :class:`BatchRing` gets this, not tensors, and is told so."""

    __slots__ = ("key", "ring", "slot", "fields", "values", "one")

    def __init__(self, key: str, ring: _Ring, slot: int, fields: List[Field],
                 values: Dict[int, np.ndarray], one: bool):
        self.key, self.ring, self.slot, self.fields = key, ring, slot, fields
        self.values, self.one = values, one

    def __reduce__(self):
        r = self.ring
        return _received, (r.place(self.key), _PAGE + self.slot * r.slot_bytes, self.slot,
                           self.fields, self.values, self.one)

    def _not_a_batch(self, *_):
        raise TypeError("a BatchRing batch becomes tensors only in the process that receives "
                        "it from the worker: give BatchRing itself to the DataLoader as its "
                        "collate_fn, and change batches after the loader")

    __iter__ = __len__ = __getitem__ = _not_a_batch


class _Held:
    """One received batch's hold on its slot: the slot goes back to its worker when this is
    collected, after every array and tensor of the batch that refers to it."""

    __slots__ = ("__weakref__",)

    def __init__(self, ring: Mapped, slot: int):
        done = weakref.finalize(self, _free, ring, slot)
        done.atexit = False  # (at exit the worker is going too; a forked child must not)


class _Slot:
    """The memory of one field of a received batch: numpy keeps it as the base of the
    field's array and every view of it (a memoryview would not do: numpy keeps the buffer
    it exports, not the view, and the slot would be freed too soon)."""

    __slots__ = ("__array_interface__", "held")

    def __init__(self, ring: Mapped, held: _Held, offset: int, nbytes: int):
        self.held = held
        self.__array_interface__ = {"data": (ring.address + offset, False), "shape": (nbytes,),
                                    "typestr": "|u1", "version": 3}


def _free(ring: Mapped, slot: int) -> None:
    if ring.mapper.here():
        ring.map[slot] = _FREE


def _received(place: Place, offset: int, slot: int, fields: List[Field],
              values: Dict[int, np.ndarray], one: bool) -> Any:
    """A batch in a slot, in the training process: its tensors, views of the slot (its
    small fields from ``values``); the slot goes back to its worker once the last of them,
    and the last view of one, is freed."""
    ring = sharedmem.mapped(place)
    torch = _torch()
    held = _Held(ring, slot)
    tensors = []
    for k, (dt, shape, off, nbytes) in enumerate(fields):
        if off < 0:
            tensors.append(torch.from_numpy(values[k]))
            continue
        memory = np.asarray(_Slot(ring, held, offset + off, nbytes))
        tensors.append(torch.from_numpy(memory.view(np.dtype(dt)).reshape(shape)))
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
    ``pin_memory=True`` copies each batch out of its slot, which is then free at once. A
    field of at most :data:`BY_VALUE_BYTES` (labels) is sent by value: keeping it keeps no
    slot.

    The tensors are not in torch's shared memory (``is_shared()`` is False, where
    ``default_collate``'s are). ``share_memory_()``, or a ``torch.multiprocessing`` queue,
    moves one into new shared memory and lets its slot go: a numpy array or DLPack capsule
    taken from it before then no longer follows it, and its memory may be refilled. Take
    them after, or ``clone()`` first.

    Give ``BatchRing`` to the loader as its ``collate_fn`` itself: in a worker it returns a
    placeholder that becomes the batch only where the loader receives it, so a function
    that calls it and indexes or unpacks the result gets a ``TypeError`` saying so; change
    batches after the loader.
    """

    def __init__(self, slots: int = 8):
        if isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= 255:
            raise ValueError("slots must be an integer from 1 to 255, got %r" % (slots,))
        self.slots = slots
        self.key = os.urandom(8).hex()  # its workers' rings, in the training process
        self._ring: PerProcess[_Ring] = PerProcess()
        weakref.finalize(self, sharedmem.let_go, self.key).atexit = False

    def __call__(self, samples: Sequence[Any]) -> Any:
        torch = _torch()
        planned = (layout(samples) if sharedmem.AVAILABLE
                   and torch.utils.data.get_worker_info() is not None else None)
        if planned is None:
            return torch.utils.data.default_collate(samples)
        one, columns, fields = planned
        ring = self._ring_for(_slot_bytes(fields))
        slot = ring.take()
        if slot is None:  # every slot in the training process's hands
            return torch.utils.data.default_collate(samples)
        base, values = _PAGE + slot * ring.slot_bytes, {}
        for k, (column, (dt, shape, off, _)) in enumerate(zip(columns, fields)):
            if off < 0:
                out = values[k] = np.empty(shape, np.dtype(dt))
            else:
                out = np.frombuffer(ring.file.map, np.dtype(dt), int(np.prod(shape)),
                                    base + off).reshape(shape)
            if isinstance(column[0], np.ndarray):
                np.stack(column, out=out)
            else:
                out[...] = column
        return _Sent(self.key, ring, slot, fields, values, one)

    def _ring_for(self, nbytes: int) -> _Ring:
        """This worker's ring, a new one with larger slots where a batch of ``nbytes`` does
        not fit (the old one is then left to the batches in it)."""
        ring = self._ring.peek()
        if ring is None or ring.slot_bytes < nbytes:
            ring = _Ring(self.slots, -(-nbytes // _PAGE) * _PAGE,
                         ring.file.token if ring is not None else None)
            self._ring.set(ring)
        return ring

    def __repr__(self) -> str:
        return "BatchRing(slots=%d)" % self.slots
