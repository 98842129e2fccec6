"""Reusable memory for samples and batches: no page faults in the per-sample loop.

A DataLoader worker holds a batch of samples (16 x 1.6 MB for 320 x 320 float images and
int32 masks) until the batchify has copied them, then frees them all; the allocator gives
that memory back to the kernel and the next batch faults every page in again (~0.3 ms per
sample here, more than the arithmetic that fills it). :class:`SamplePool` keeps such
buffers: a sample NDArray wraps a pooled numpy buffer without copying it, and the buffer
returns to the pool when MXNet frees the NDArray (after every operation on it finished).

Batches crossing from a worker to the main process have the same problem, worse. Gluon's
worker batchify allocates every batch in a new ``cpu_shared`` segment: the kernel
allocates and zeroes each of its pages on first touch, and the main process maps it afresh.
For a 16 x 3 x 320 x 320 float32 batch that costs about 20 ms on a 2-core machine, ten times
the copy of the samples into it, and more than decoding three of its JPEGs.

Here each worker keeps a few anonymous shared-memory segments sized for its batches and
reuses one once the main process has released the batch built in it (each a
:class:`~gluon_data.storage.sharedmem.SharedFile`, as ``BatchRing``'s rings for PyTorch are):

* the worker builds the batch in a free segment and returns an NDArray over it;
* pickling that NDArray (Gluon's worker-to-main transport) counts the batch as *sent* and
  names its segment; the first batch of a segment also passes its file descriptor;
* the main process maps the segment at its first batch and keeps it mapped
  (:func:`~gluon_data.storage.sharedmem.mapped`), and wraps each batch in an NDArray without
  copying; when MXNet frees that NDArray (after every operation on it has finished) the
  batch counts as *returned*. A segment the worker closes is named to the main process
  with its next batch, which then lets it go;
* a segment is free again when all batches sent from it have been returned and the worker
  no longer holds its own NDArray over it.

Each counter has one writer (``sent``: the worker, ``returned``: the main process), so no
lock spans processes. A worker holds at most ``SEGMENTS_PER_SIZE`` of its largest batch in
segments (free ones of other sizes are evicted to make room); when none is free and there is no
room (say the training loop keeps batches alive), the batch falls back to a plain
``cpu_shared`` allocation: slower, never wrong. Segments have no name, so nothing is left behind in ``/dev/shm`` when a worker is
killed.

Staged batches go one step further. Once a worker's batchify has seen a batch of some sample
shape, :meth:`SamplePool.take` hands the next samples of that shape out as consecutive slots of
one segment (the dataset writes each sample there), and :func:`stack_staged` sends that
segment as the batch instead of copying the samples into another one (16 x 1.2 MB for
320 x 320 float images). It does so only when the samples are exactly its slots ``0..n-1`` in
order; otherwise the batch is copied as before. Every live slot, and the cursor that fills the
segment, holds it: a segment is reused only when no slot, no local batch and no sent batch
refers to it any more. A staged sample's NDArray is a row (``_at``) of one NDArray over the
segment's slots, made once per segment, not a new ``from_numpy`` per sample (5 us, not 50).

Small batches (labels: at most :data:`BY_VALUE_BYTES`) are not worth a segment: copying 128
bytes into the pickle is nothing, and a loop that keeps them then keeps no segment. They
live in plain memory and pickle by value, arriving as the same plain CPU NDArray a
segment's batch arrives as.
"""
from __future__ import annotations

import ctypes
import multiprocessing
import os
import threading
import weakref
from multiprocessing import reduction
from typing import Dict, List, Optional, Tuple, cast

import mxnet as mx
import numpy as np
from mxnet.ndarray.sparse import BaseSparseNDArray

from ..storage import sharedmem
from ..storage.perprocess import PerProcess
from ..storage.sharedmem import Place, SharedFile

__all__ = ["batch_buffer", "stack_staged", "host_view", "SamplePool", "samples"]

#: A worker keeps at most this many segments' worth of its largest batch: the batches it can
#: have in flight (Gluon prefetches ``2 * num_workers``), the one being built and the one
#: being consumed. Batches of varying sizes (``testval`` padding) share segments big enough.
SEGMENTS_PER_SIZE = 6
_HEADER = 64  # int64 counters [sent, returned], padded to a cache line
#: A worker's batch of at most this many bytes (labels, sizes) travels inside the pickle, by
#: value: copying it costs less than a segment's bookkeeping, and keeping it keeps no segment.
BY_VALUE_BYTES = 1 << 10


class _Segment:
    """A batch-sized shared file of a worker (:class:`~gluon_data.storage.sharedmem.
    SharedFile`: mapped once in the main process), its header counting the batches sent from
    it and returned."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.file = SharedFile(_HEADER + capacity, "gluon_data-batch")
        self.map = self.file.map
        # [sent, returned]; None while close() tries to unmap, and once it has
        self.counts: Optional[np.ndarray] = np.frombuffer(self.map, np.int64, 2)
        self.local = False   # the worker still holds its own NDArray over the segment
        self.holds = 0       # staged sample slots (and the staging cursor) still alive

    def free(self) -> bool:
        counts = cast(np.ndarray, self.counts)  # open: a closed segment leaves the pool
        return not self.local and not self.holds and counts[0] == counts[1]

    def address(self) -> int:
        """Where the data (after the header) starts in this process."""
        return self.file.address(_HEADER)

    def close(self) -> bool:
        """Unmap and close a free segment; False if a view of it is still alive."""
        counts, self.counts = self.counts, None
        del counts
        if not self.file.close():
            self.counts = np.frombuffer(self.map, np.int64, 2)
            return False
        return True


class _Pool:
    def __init__(self):
        self.segments = []
        self.largest = 0
        self.fallbacks = 0   # batches that found no free segment and no room for a new one
        self.lock = threading.RLock()
        self.plans = {}      # (shape, dtype str) -> samples per batch, set by the batchify
        self.staging = {}    # (shape, dtype str) -> [segment, next slot]
        self.adopted = 0     # batches sent without a copy (their samples were staged)
        self.gone: List[str] = []  # segments closed since the last batch sent

    def acquire(self, nbytes: int) -> Optional[_Segment]:
        with self.lock:
            fits = [s for s in self.segments
                    if s.free() and nbytes <= s.capacity <= 2 * nbytes]
            if fits:
                seg = min(fits, key=lambda s: s.capacity)
                seg.local = True
                return seg
            self.largest = max(self.largest, nbytes)
            budget = SEGMENTS_PER_SIZE * self.largest
            total = sum(s.capacity for s in self.segments)
            for s in sorted((s for s in self.segments if s.free()), key=lambda s: s.capacity):
                if total + nbytes <= budget:
                    break
                if s.close():  # evict free segments of other sizes to make room
                    self.segments.remove(s)
                    total -= s.capacity
                    if s.file.handed:  # the main process forgets it with the next batch
                        self.gone.append(s.file.token)
            if total + nbytes > budget:
                self.fallbacks += 1
                return None
            seg = _Segment(nbytes)
            seg.local = True
            self.segments.append(seg)
            return seg

    def stage(self, key) -> Optional[np.ndarray]:
        """The next slot of the staging segment planned for samples of ``key``, or ``None``
        (no plan: the first batch of a shape, or no segment free)."""
        with self.lock:
            per_batch = self.plans.get(key)
            if not per_batch:
                return None
            cur = self.staging.get(key)
            if cur is None or cur[1] >= per_batch:
                self.unstage(key)
                seg = self.acquire(_nbytes(key) * per_batch)
                if seg is None:
                    return None
                seg.local = False
                seg.holds += 1  # the cursor's own hold, until the batch is adopted or given up
                cur = self.staging[key] = [seg, 0] + _rows(seg, key, per_batch, self.lock)
            k = cur[1]
            cur[1] += 1
        return cur[2][k]

    def unstage(self, key) -> None:
        """Stop filling ``key``'s staging segment (its live slots keep it held)."""
        with self.lock:
            cur = self.staging.pop(key, None)
            if cur is not None:
                cur[0].holds -= 1

    def slot_array(self, buf: np.ndarray) -> Optional[mx.nd.NDArray]:
        """The NDArray of ``buf`` when it is a slot of the segment being staged: a row of
        the NDArray over all its slots (``_at``, no new wrapping); else ``None``."""
        cur = self.staging.get((buf.shape, buf.dtype.str))
        if cur is None or buf.base is not cur[2].base:
            return None
        return cur[3]._at((buf.ctypes.data - cur[4]) // buf.nbytes)

    def adopt(self, arrays) -> Optional[mx.nd.NDArray]:
        """The batch of ``arrays`` (equal shapes and dtypes) as an NDArray over the staging
        segment they were written into, when they are its slots 0..n-1 in order; else
        ``None``. Either way it plans the next batch: ``len(arrays)`` samples of this shape
        go into one segment's slots."""
        first = arrays[0]
        key = (tuple(int(d) for d in first.shape), first.dtype.str)
        with self.lock:
            cur = self.staging.get(key)
            self.plans[key] = len(arrays)
            seg = cur[0] if cur is not None else None
            ok = seg is not None and cur[1] == len(arrays)
            if ok:
                base, slot = cast(_Segment, seg).address(), first.nbytes  # ok: not None
                ok = all(a.shape == first.shape and a.dtype == first.dtype
                         and a.ctypes.data == base + k * slot for k, a in enumerate(arrays))
            self.unstage(key)
            if not ok:
                return None
            seg = cast(_Segment, seg)  # ok: not None
            seg.local = True
            self.adopted += 1
        n = len(arrays) * first.size
        view = np.frombuffer(seg.map, first.dtype, n, _HEADER).reshape(
            (len(arrays),) + first.shape)
        weakref.finalize(view, _released_locally, seg)
        out = mx.nd.from_numpy(view, zero_copy=True, array_cls=_PooledArray)
        out._gd_segment = seg
        return out


def _nbytes(key) -> int:
    """Bytes of one sample of ``key`` = (shape, dtype str)."""
    return int(np.prod(key[0], dtype=np.int64)) * np.dtype(key[1]).itemsize


def _rows(seg: _Segment, key, n: int, lock) -> list:
    """``[rows, nd, address]``: ``n`` slots of ``key`` at the start of ``seg``'s data, as one
    writable numpy array (each slot a row of it) and one NDArray over the same memory. The
    segment is held until the array they all view is collected: after every slot view,
    every row of ``nd`` and the staging cursor are gone (MXNet keeps ``nd``'s source alive
    while any row of it lives)."""
    shape, dtype = key[0], np.dtype(key[1])
    flat = np.frombuffer(seg.map, dtype, n * _nbytes(key) // dtype.itemsize, _HEADER)
    rows = flat.reshape((n,) + shape)
    # numpy gives every view of `rows` (slots, rows.view()) `flat` as its base, so `flat`
    # is what lives exactly as long as any of them: it holds the segment
    seg.holds += 1
    weakref.finalize(flat, _unhold, seg, lock)
    nd = mx.nd.from_numpy(rows.view(), zero_copy=True)  # the view goes read-only, not rows
    return [rows, nd, rows.ctypes.data]


def _unhold(segment: _Segment, lock) -> None:
    with lock:
        segment.holds -= 1


#: This process's segments (a forked child starts its own: the parent's are the parent's).
_POOL: PerProcess[_Pool] = PerProcess()


def _get_pool() -> _Pool:
    return _POOL.get(_Pool)


class SamplePool:
    """Free numpy buffers by (shape, dtype), handed out by :meth:`take` and returned when
    the NDArray made by :meth:`wrap` is freed. Thread-safe (the GIL orders the list ops)."""

    def __init__(self, max_bytes: int = 256 << 20):
        self.max_bytes = max_bytes
        self.held = 0   # bytes of free buffers kept
        self._free: Dict[Tuple[Tuple[int, ...], str], List[np.ndarray]] = {}

    def take(self, shape, dtype) -> np.ndarray:
        """A writable, C-contiguous, uninitialised buffer.

        In a worker process whose batchify planned batches of this shape (see
        :func:`stack_staged`), the buffer is the next slot of a shared batch segment, so the
        batch of these samples is sent without copying them again."""
        key = (tuple(int(d) for d in shape), np.dtype(dtype).str)
        if multiprocessing.parent_process() is not None:
            pool = _get_pool()
            if pool.plans:
                slot = pool.stage(key)
                if slot is not None:
                    return slot
        free = self._free.get(key)
        if free:
            try:
                buf = free.pop()
            except IndexError:  # another thread took the last one
                pass
            else:
                self.held -= buf.nbytes
                return buf
        return np.empty(key[0], key[1])

    def wrap(self, buf: np.ndarray) -> mx.nd.NDArray:
        """A CPU NDArray over ``buf`` (from :meth:`take`) without copying; ``buf`` must not
        be touched again: it comes back to the pool when MXNet frees the NDArray."""
        if buf.base is not None and multiprocessing.parent_process() is not None:
            nd = _get_pool().slot_array(buf)  # a staged slot: a row of its segment's NDArray
            if nd is not None:
                return nd
        view = buf.view()  # from_numpy makes it read-only and holds it while MXNet does
        weakref.finalize(view, self._give_back, buf)
        return mx.nd.from_numpy(view, zero_copy=True)

    def _give_back(self, buf: np.ndarray) -> None:
        # Bounded by bytes, not per shape: samples of ever-new sizes (full images in
        # ``testval``) are simply not kept once the budget is used. Staged slots (views of
        # a shared segment) go back to their segment, not here.
        if buf.base is None and self.held + buf.nbytes <= self.max_bytes:
            self._free.setdefault((buf.shape, buf.dtype.str), []).append(buf)
            self.held += buf.nbytes


#: The process-wide pool the datasets use for sample outputs.
samples = SamplePool()


class _PooledArray(mx.nd.NDArray):
    """A worker-side NDArray over a pooled segment; pickles as a file descriptor."""

    __slots__ = ("_gd_segment",)


def _released_locally(segment: _Segment) -> None:
    segment.local = False


def _returned(counts: np.ndarray) -> None:
    counts[1] += 1


#: The main process's group of the Gluon workers' segments (:func:`sharedmem.mapped`).
_GROUP = "gluon"


def _reduce_pooled(arr: _PooledArray):
    seg = arr._gd_segment
    arr.wait_to_read()
    seg.counts[0] += 1
    pool = _get_pool()
    with pool.lock:
        gone, pool.gone = pool.gone, []
    return _rebuild, (seg.file.place(_GROUP, gone), arr.shape, np.dtype(arr.dtype).str)


class _ValueArray(mx.nd.NDArray):
    """A worker-side NDArray of a small batch over its own numpy memory; pickles by value."""

    __slots__ = ("_gd_host",)


def _reduce_value(arr: _ValueArray):
    arr.wait_to_read()  # operations still writing it have finished
    return _rebuild_value, (arr._gd_host,)


def _rebuild_value(host: np.ndarray) -> mx.nd.NDArray:
    if not (host.flags.writeable and host.flags.c_contiguous):
        host = np.array(host, order="C")
    return mx.nd.from_numpy(host, zero_copy=True)


reduction.ForkingPickler.register(_ValueArray, _reduce_value)


def _rebuild(place: Place, shape: Tuple[int, ...], dtype: str) -> mx.nd.NDArray:
    m = sharedmem.mapped(place).map  # (mapped at the segment's first batch)
    counts = np.frombuffer(m, np.int64, 2)
    view = np.frombuffer(m, np.dtype(dtype), int(np.prod(shape, dtype=np.int64)),
                         _HEADER).reshape(shape)
    weakref.finalize(view, _returned, counts)
    return mx.nd.from_numpy(view, zero_copy=True)


reduction.ForkingPickler.register(_PooledArray, _reduce_pooled)


class _HostMemory:
    """What ``np.asarray`` reads an NDArray's CPU memory through (no copy, no ctypes type)."""

    __slots__ = ("__array_interface__",)

    def __init__(self, ptr: int, shape, typestr: str):
        self.__array_interface__ = {"data": (ptr, False), "shape": shape,
                                    "typestr": typestr, "version": 3}


_HOST_DEVICES = (1, 3, 5)  # cpu, cpu_pinned, cpu_shared (mx.Context.devtype2str)


def host_view(x) -> np.ndarray:
    """A numpy array over a CPU NDArray's memory (no copy, writable; ``x`` must outlive
    it), a copy of any other NDArray, or ``x`` itself when it is array-like already."""
    if not isinstance(x, mx.nd.NDArray):
        return np.asarray(x)
    dev_type, dev_id = ctypes.c_int(), ctypes.c_int()
    mx.base.check_call(mx.base._LIB.MXNDArrayGetContext(
        x.handle, ctypes.byref(dev_type), ctypes.byref(dev_id)))
    if dev_type.value not in _HOST_DEVICES or isinstance(x, BaseSparseNDArray):
        return x.asnumpy()
    x.wait_to_read()
    ptr = ctypes.c_void_p()
    mx.base.check_call(mx.base._LIB.MXNDArrayGetData(x.handle, ctypes.byref(ptr)))
    dtype, shape = np.dtype(x.dtype), x.shape
    if not ptr.value or 0 in shape:
        return np.empty(shape, dtype)
    return np.asarray(_HostMemory(ptr.value, shape, dtype.str))


def stack_staged(arrays) -> Optional[mx.nd.NDArray]:
    """The batch stacking ``arrays`` (host views of samples of one shape and dtype), without
    a copy when a worker's samples were written into consecutive slots of one shared
    segment (:meth:`SamplePool.take` stages them once a batch of this shape was seen);
    ``None`` otherwise (the caller copies them into :func:`batch_buffer`). Only in worker
    processes, where the batch is pickled to the main process."""
    if multiprocessing.parent_process() is None or not arrays or not sharedmem.AVAILABLE:
        return None
    return _get_pool().adopt(arrays)


_DL = ("u1", "i4", "f4", "i8", "f8")  # the dtypes batches wrap without a copy


def batch_buffer(shape, dtype) -> Tuple[mx.nd.NDArray, np.ndarray]:
    """An uninitialised batch NDArray and a writable numpy view of its memory.

    In a worker process (where Gluon pickles the batch to the main process) it lives in a
    pooled shared segment, or a fresh ``cpu_shared`` one when the pool is busy; elsewhere
    in plain CPU memory. Write the batch through the view, then drop the view.
    """
    dtype = np.dtype(dtype)
    shape = tuple(int(d) for d in shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    in_worker = multiprocessing.parent_process() is not None
    if in_worker and 0 < nbytes <= BY_VALUE_BYTES and dtype.isnative and dtype.str[1:] in _DL:
        host = np.empty(shape, dtype)
        out = mx.nd.from_numpy(host.view(), zero_copy=True, array_cls=_ValueArray)
        out._gd_host = host  # what the pickle copies (host.view() went read-only)
        return out, host
    seg = (_get_pool().acquire(nbytes) if in_worker and nbytes and sharedmem.AVAILABLE
           and dtype.str[1:] in _DL else None)
    if seg is None:
        ctx = mx.Context("cpu_shared", 0) if in_worker else mx.cpu()
        out = mx.nd.empty(shape, ctx=ctx, dtype=dtype)
        view = host_view(out)
        return out, view
    view = np.frombuffer(seg.map, dtype, nbytes // dtype.itemsize, _HEADER).reshape(shape)
    writable = view.view()  # from_numpy makes `view` read-only; the caller writes here
    weakref.finalize(view, _released_locally, seg)
    out = mx.nd.from_numpy(view, zero_copy=True, array_cls=_PooledArray)
    out._gd_segment = seg
    return out, writable
