"""A Gluon ``DataLoader`` that notices a dead worker within a second instead of hanging.

When a worker process of ``mx.gluon.data.DataLoader`` dies (the kernel's OOM killer, a crash
in a native decoder, ``kill -9``), ``multiprocessing.Pool`` quietly starts a replacement and
the batch it was loading is never delivered: the training loop blocks for the loader's
``timeout`` (120 s by default) and then fails with a message about slow transforms. This
subclass waits for each batch in short slices and checks the worker processes in between.
"""
from __future__ import annotations

import signal
import time

from mxnet.gluon.data import dataloader as _dl

from .errors import GluonDataError

__all__ = ["DataLoader", "WorkerDiedError"]


class WorkerDiedError(GluonDataError, RuntimeError):
    """A DataLoader worker process died while batches were being loaded."""


def _describe(code: int) -> str:
    if code is not None and code < 0:
        try:
            return "killed by signal %s" % signal.Signals(-code).name
        except ValueError:
            return "killed by signal %d" % -code
    return "exit code %s" % code


class _WatchedIter(_dl._MultiWorkerIter):
    def __init__(self, *args, poll: float = 0.2, **kwargs):
        self._procs = list(getattr(kwargs.get("worker_pool") or args[0], "_pool", []))
        self._poll = poll
        super().__init__(*args, **kwargs)

    def _check_workers(self) -> None:
        for p in self._procs:
            code = p.exitcode
            if code is not None:
                self._worker_pool.terminate()
                raise WorkerDiedError(
                    "DataLoader worker (pid %d) died, %s, while batches were loading; its "
                    "batch is lost. Common causes: out of memory (the OOM killer), a crash "
                    "in native code, or the process was killed" % (p.pid, _describe(code)))

    def __next__(self):
        ret = self._data_buffer.get(self._rcvd_idx)
        if ret is not None:
            deadline = time.monotonic() + self._timeout
            while not ret.ready() and time.monotonic() < deadline:
                ret.wait(self._poll)
                if not ret.ready():
                    self._check_workers()
        try:
            return super().__next__()
        except (OSError, EOFError):
            # A worker killed after finishing a batch but before the main process fetched
            # its shared-memory descriptor: the fetch fails with a connection error.
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                self._check_workers()
                time.sleep(0.05)
            raise


class DataLoader(_dl.DataLoader):
    """``mx.gluon.data.DataLoader`` with dead-worker detection; same arguments.

    With ``num_workers > 0`` (processes), a worker that dies raises :class:`WorkerDiedError`
    within about ``poll`` seconds instead of blocking for ``timeout`` seconds.

    Examples
    --------
    >>> from gluon_data import DataLoader, SegmentationRecordDataset   # doctest: +SKIP
    >>> loader = DataLoader(SegmentationRecordDataset("voc_train.rec", mode="train"),
    ...                     batch_size=16, shuffle=True, num_workers=4)
    """

    def _prefetch_iter(self):
        if self._num_workers == 0 or self._thread_pool:
            return super()._prefetch_iter()
        return _WatchedIter(self._worker_pool, self._batchify_fn, self._batch_sampler,
                            pin_memory=self._pin_memory, pin_device_id=self._pin_device_id,
                            worker_fn=_dl._worker_fn, prefetch=self._prefetch, dataset=None,
                            data_loader=self, timeout=self._timeout)
