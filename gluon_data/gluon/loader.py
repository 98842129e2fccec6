"""A Gluon ``DataLoader`` that notices a dead worker within seconds instead of hanging.

When a worker process of ``mx.gluon.data.DataLoader`` dies (the kernel's OOM killer, a crash
in a native decoder, ``kill -9``), ``multiprocessing.Pool`` quietly starts a replacement and
the batch it was loading is never delivered: the training loop blocks for the loader's
``timeout`` (120 s by default) and then fails with a message about slow transforms. This
subclass waits for each batch in short slices and checks the worker processes in between.

It also hands every batch's indices to the dataset's ``will_need`` before the batch is
read, so a cold batch's records are fetched from the device together (see
:class:`HintedBatches`).
"""
from __future__ import annotations

import pickle
import signal
import time
import weakref
from multiprocessing import util as mp_util
from typing import Optional

from mxnet.gluon.data import dataloader as _dl

from ..convert.engines import stop_pool
from ..errors import GluonDataError
from ..sampling.hints import HintAhead, hint

__all__ = ["DataLoader", "WorkerDiedError", "HintedBatches", "prefetch_batch"]


class WorkerDiedError(GluonDataError, RuntimeError):
    """A DataLoader worker process died while batches were being loaded."""


def _describe(code: int) -> str:
    if code is not None and code < 0:
        try:
            return "killed by signal %s" % signal.Signals(-code).name
        except ValueError:
            return "killed by signal %d" % -code
    return "exit code %s" % code


#: Batches still in flight when their iterator was dropped (a loop that breaks early).
_abandoned: list = []


def _drain_abandoned() -> None:
    """Unpickle (and so release) the finished batches of dropped iterators: a batch left
    pickled would keep its worker's reusable shared segment reserved for good."""
    keep = []
    for ret in _abandoned:
        if not ret.ready():
            keep.append(ret)
            continue
        try:
            pickle.loads(ret.get(0))
        except Exception:  # a failed or lost batch: nothing left to release
            pass
    _abandoned[:] = keep


def _hint_target(dataset):
    """``dataset``, or the dataset a Gluon ``.transform()`` wraps (as ``._data``), that has
    ``will_need``; ``None`` if none has."""
    for _ in range(8):  # Gluon's lazy transforms wrap the dataset as ._data
        if getattr(dataset, "will_need", None) is not None:
            return dataset
        dataset = getattr(dataset, "_data", None)
        if dataset is None:
            return None
    return None


def prefetch_batch(dataset, samples) -> None:
    """Ask ``dataset`` (or the dataset a Gluon ``.transform()`` wraps) to start fetching the
    records of ``samples`` from the device (its ``will_need``, see
    :func:`gluon_data.stores.base.will_need`); a dataset without ``will_need`` is left alone.
    A hint that fails (a damaged or replaced file) is dropped
    (:func:`gluon_data.sampling.hints.hint`): the read of the sample, in whichever process
    reads it, raises the typed error naming the file and record."""
    target = _hint_target(dataset)
    if target is not None:
        hint(target, samples)


class HintedBatches(HintAhead):
    """The batches of ``batch_sampler``, each handed to the dataset's ``will_need``
    (:func:`prefetch_batch`) ``ahead`` batches before it is yielded (0: as it is drawn), so
    its records are on their way from the device while earlier batches are read: the one
    driver of hints (:class:`~gluon_data.sampling.hints.HintAhead`) over a Gluon dataset.
    The page cache is shared, so a hint from the main process serves the worker that reads
    the batch.

    Examples
    --------
    >>> from gluon_data import SegmentationRecordDataset
    >>> ds = SegmentationRecordDataset("voc_train.rec")
    >>> for batch in HintedBatches([[3, 1], [0, 2]], ds, ahead=1):
    ...     samples = [ds[i] for i in batch]        # batch [0, 2] is being fetched meanwhile
    """

    def __init__(self, batch_sampler, dataset, ahead: int = 0):
        super().__init__(batch_sampler, _hint_target(dataset), ahead)


#: batches hinted ahead of the one being read when ``num_workers=0`` (with workers, a batch
#: is hinted as it is handed to a worker: ``prefetch`` batches ahead)
SAME_PROCESS_AHEAD = 2


class _WatchedIter(_dl._MultiWorkerIter):
    def __init__(self, *args, pool_workers: list, poll: float = 0.2, **kwargs):
        self._pool_workers = pool_workers
        self._poll = poll
        _drain_abandoned()
        super().__init__(*args, **kwargs)

    def __del__(self):
        if getattr(self, "_dataset", True) is None:  # results are pickled batches
            _abandoned.extend(getattr(self, "_data_buffer", {}).values())
            _drain_abandoned()

    def _check_workers(self) -> None:
        """Raise :class:`WorkerDiedError` if a worker the loader's pool started with has
        ended. A dead worker's replacements are never looked at: any batch lost is lost by
        one of these or by a replacement of one of them, so one of these has ended."""
        for p in self._pool_workers:
            code = p.exitcode
            if code is not None:
                # bounded: a worker killed while it waited for its next task held the task
                # queue's lock, and Pool.terminate() waits for that lock forever (stop_pool
                # kills the workers and lets go of the dead one's lock after 0.2 s)
                stop_pool(self._worker_pool, timeout=0.2)
                raise WorkerDiedError(
                    "DataLoader worker (pid %d) died, %s: the batch it was loading, if any, "
                    "is lost, and its pool is stopped. Common causes: out of memory (the OOM "
                    "killer), a crash in native code, or the process was killed"
                    % (p.pid, _describe(code)))

    def __next__(self):
        if _abandoned:
            _drain_abandoned()
        ret = self._data_buffer.get(self._rcvd_idx)
        if ret is not None:
            deadline = time.monotonic() + self._timeout
            while not ret.ready() and time.monotonic() < deadline:
                ret.wait(self._poll)
                if not ret.ready():
                    self._check_workers()
        try:
            return self._next_batch()
        except (OSError, EOFError):
            # A worker killed after finishing a batch but before the main process fetched
            # its shared-memory descriptor: the fetch fails with a connection error.
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                self._check_workers()
                time.sleep(0.05)
            raise
        except StopIteration:  # the epoch's end: every batch arrived
            raise
        except Exception:
            # a batch of a worker killed since it sent it (its shared memory let go when the
            # pool forked the replacement) is the death, not the batch's fault
            self._check_workers()
            raise


    def _next_batch(self):
        """Gluon's ``_MultiWorkerIter.__next__`` without its ``Pool.terminate()`` when a
        batch raised: the worker is alive (the exception came back as its result), and
        terminating the pool can deadlock (a worker killed while it holds the result queue's
        lock leaves the pool's handler thread waiting for it forever). The error reaches the
        loop; the batches still in flight are released as they finish, as a loop that breaks
        early leaves them; the loader's workers stay usable for the next epoch."""
        self._push_next()
        if self._rcvd_idx == self._sent_idx:
            raise StopIteration
        ret = self._data_buffer.pop(self._rcvd_idx)
        try:
            batch = pickle.loads(ret.get(self._timeout))
        except _dl.multiprocessing.context.TimeoutError:
            raise
        except Exception:
            # this iterator is finished: hand what is in flight to the release list, send
            # nothing more
            _abandoned.extend(self._data_buffer.values())
            self._data_buffer.clear()
            self._iter = iter(())
            self._sent_idx = self._rcvd_idx
            raise
        if self._pin_memory:
            batch = _dl._as_in_context(batch, _dl.context.cpu_pinned(self._pin_device_id))
        self._rcvd_idx += 1
        return batch


#: The live loaders that have a worker pool, which :func:`_stop_pools_at_exit` stops.
_WITH_POOLS: "weakref.WeakSet[DataLoader]" = weakref.WeakSet()


def _stop_pools_at_exit() -> None:
    """Stop the pools of the loaders still alive (those not stopped yet: ``detach``)."""
    for loader in list(_WITH_POOLS):
        if loader._stop is not None and loader._stop.detach() is not None:
            stop_pool(loader._worker_pool)


# Run by multiprocessing's own exit handler, before each pool's Pool.terminate() (exit
# priority 15), which waits forever for a queue lock that a killed worker held; in this
# process only (a forked child skips it).
mp_util.Finalize(None, _stop_pools_at_exit, exitpriority=100)


class DataLoader(_dl.DataLoader):
    """``mx.gluon.data.DataLoader`` with dead-worker detection and batch prefetching; same
    arguments.

    With ``num_workers > 0`` (processes), a worker that dies raises :class:`WorkerDiedError`
    within a second or two (``poll``, then at most a second to stop the pool) instead of
    blocking for ``timeout`` seconds, also when it died between epochs and the pool replaced
    it. The pool is stopped within seconds when the loader is collected or the interpreter
    exits. The batches a loop leaves unread when it breaks early are released as they
    finish, so their workers can reuse the shared memory they were built in (see
    :mod:`gluon_data.gluon.buffers`).

    Every batch's indices go to the dataset's ``will_need`` (:func:`prefetch_batch`) in
    the main process as the batch is handed to a worker (``prefetch`` batches before it is
    consumed; two batches ahead with ``num_workers=0``), so on a cold page cache the device
    fetches the records of several batches at once instead of one synchronous read per
    sample; warm, a hint costs a page-cache lookup per record (~3 us), in the main process.

    Examples
    --------
    >>> from gluon_data import DataLoader, SegmentationRecordDataset
    >>> loader = DataLoader(SegmentationRecordDataset("voc_train.rec", mode="train"),
    ...                     batch_size=16, shuffle=True, num_workers=4)
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._started_workers()
        # the pool stopped within seconds (once) when the loader is collected or the program
        # exits (_stop_pools_at_exit), never by Gluon's __del__ (whose Pool.terminate() can
        # wait forever for a queue lock that a killed worker held)
        self._stop: Optional[weakref.finalize] = None
        if self._worker_pool is not None:
            self._stop = weakref.finalize(self, stop_pool, self._worker_pool)
            self._stop.atexit = False
            _WITH_POOLS.add(self)

    def __del__(self):
        if getattr(self, "_stop", None) is not None:
            self._stop()

    def _started_workers(self) -> list:
        """The pool's workers as it started them, taken once (``Pool()`` starts all before
        it returns; Gluon's ``auto_reload`` makes the first iterator before ``__init__``
        returns): an iterator's own look at the pool could come while a dead worker is
        dropped from it and its replacement not yet listed, and then miss the death."""
        if getattr(self, "_pool_workers", None) is None:
            self._pool_workers = list(getattr(self._worker_pool, "_pool", None) or [])
        return self._pool_workers

    def _prefetch_iter(self):
        if self._num_workers == 0:
            return self._same_process_iter()
        batches = HintedBatches(self._batch_sampler, self._dataset)
        if self._thread_pool:
            return _dl._MultiWorkerIter(
                self._worker_pool, self._batchify_fn, batches, pin_memory=self._pin_memory,
                pin_device_id=self._pin_device_id, worker_fn=_dl._thread_worker_fn,
                prefetch=self._prefetch, dataset=self._dataset, data_loader=self,
                timeout=self._timeout)
        return _WatchedIter(self._worker_pool, self._batchify_fn, batches,
                            pool_workers=self._started_workers(), pin_memory=self._pin_memory,
                            pin_device_id=self._pin_device_id, worker_fn=_dl._worker_fn,
                            prefetch=self._prefetch, dataset=None, data_loader=self,
                            timeout=self._timeout)

    def _same_process_iter(self):
        """Gluon's ``num_workers=0`` loop over :class:`HintedBatches`."""
        for batch in HintedBatches(self._batch_sampler, self._dataset, SAME_PROCESS_AHEAD):
            ret = self._batchify_fn([self._dataset[idx] for idx in batch])
            if self._pin_memory:
                ret = _dl._as_in_context(ret, _dl.context.cpu_pinned(self._pin_device_id))
            yield ret
