"""Exact evaluation across data-parallel ranks: gluoncv segmentation metrics summed over an
MXNet kvstore (``dist_sync``) or Horovod, counting each real sample once.

A :class:`~gluon_data.sampling.sampler.DistributedSampler` pads the last batch of some ranks with
repeated samples (keys flagged ``pad=True``) so that every rank runs the same number of
batches. :class:`DistributedSegmentationMetric` leaves those rows out and sums the metric's
integer state (correct and labelled pixels, per-class intersections and unions) over the
ranks, so the distributed pixAcc and mIoU are bit-identical to one process evaluating the
whole set: the state is additive per sample, and the sum travels as float64, exact for
counts below 2**53.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple

import mxnet as mx
import numpy as np

__all__ = ["allreduce_sum", "DistributedSegmentationMetric", "evaluate_segmentation"]

#: First kvstore key used for reductions (int keys: a kvstore cannot mix int and str keys,
#: and Gluon's Trainer uses 0 .. number of parameters - 1).
KEY_BASE = 0x47440000
_EXACT = float(2 ** 53)


_LIMB_BITS, _LIMBS = 16, 4  # 4 x 16 bits hold 2**53 + |v| < 2**54; each limb is exact in float32


def _kvstore_sum(payload: np.ndarray, kv) -> np.ndarray:
    """Each worker stores its vector under a key of its own, never used before, then all
    read all of them and add them up locally. A server takes the first push to a key as that
    key's initial value and hands it out as is: no merge, and no optimizer even when the
    servers run one (a Trainer's default ``update_on_kvstore=True``). Costs one key per
    worker and call on the servers (a few hundred bytes for a metric).

    The values travel as 16-bit limbs in float32, exact whatever dtype the server keeps:
    sent as float64, a server sometimes stored a fresh key as float32 and
    ``2**40 + 1`` came back as ``2**40``."""
    calls = kv.__dict__.get("_gluon_data_reductions", 0)
    kv.__dict__["_gluon_data_reductions"] = calls + 1
    first = KEY_BASE + calls * kv.num_workers
    biased = payload.astype(np.int64).astype(np.uint64) + np.uint64(2 ** 53)
    limbs = np.stack([(biased >> np.uint64(_LIMB_BITS * k)) & np.uint64(0xFFFF)
                      for k in range(_LIMBS)]).astype(np.float32)
    kv.push(first + kv.rank, mx.nd.array(limbs.ravel(), dtype="float32"))
    mx.nd.waitall()               # the server has it (a push completes on its reply)
    kv._barrier()                 # ... and so have every other worker's
    outs = [mx.nd.zeros(limbs.size, dtype="float32") for _ in range(kv.num_workers)]
    kv.pull([first + r for r in range(kv.num_workers)], out=outs)
    total = np.zeros(len(payload), dtype=np.int64)
    for out in outs:
        got = out.asnumpy().reshape(_LIMBS, -1).astype(np.int64)
        total += sum(got[k] << (_LIMB_BITS * k) for k in range(_LIMBS)) - 2 ** 53
    return total.astype(np.float64)


def allreduce_sum(values, kvstore=None, horovod: bool = False) -> np.ndarray:
    """The element-wise sum of ``values`` (integers) over every rank; a collective: every
    rank must call it, in the same order, with a vector of the same length.

    Parameters
    ----------
    values : array-like of integers
        Each must be a whole number below 2**53 in magnitude (sums travel as float64).
    kvstore : mxnet.kvstore.KVStore, optional
        A ``dist_sync`` / ``dist_device_sync`` store, whatever its Trainer's
        ``update_on_kvstore`` (``local``, ``device``, ``None``, or one worker: the values
        themselves).
    horovod : bool, default False
        Sum with ``horovod.mxnet.allreduce`` instead (after ``hvd.init()``).

    Returns
    -------
    numpy.ndarray of float64
    """
    vec = np.asarray(values, dtype=np.float64).ravel()
    if not np.all(np.isfinite(vec)) or np.any(np.abs(vec) >= _EXACT) or \
            np.any(vec != np.round(vec)):
        raise ValueError("allreduce_sum sums whole numbers below 2**53 exactly; got %r"
                         % (vec[:8],))
    payload = np.append(vec, 1.0)  # the last slot must come back as the number of ranks
    if horovod:
        import horovod.mxnet as hvd
        result = hvd.allreduce(mx.nd.array(payload, dtype="float64"), average=False,
                               name="gluon_data.allreduce_sum.%d" % len(payload)).asnumpy()
        ranks = hvd.size()
    elif kvstore is None or kvstore.num_workers == 1 or "dist" not in kvstore.type:
        return vec
    else:
        result, ranks = _kvstore_sum(payload, kvstore), kvstore.num_workers
    if result[-1] != ranks:
        raise RuntimeError("the all-reduce counted %r ranks, expected %d: a rank called it "
                           "with a vector of another length, or out of turn"
                           % (result[-1], ranks))
    return result[:-1].astype(np.float64)


class DistributedSegmentationMetric:
    """gluoncv's ``SegmentationMetric`` (pixAcc, mIoU) over all ranks, pad samples skipped.

    ``update`` accumulates this rank's batches (leaving out the rows whose key has
    ``pad=True``); ``get`` sums the state over the ranks -- a collective, every rank calls it
    -- and returns gluoncv's own formulas on the sum.

    Parameters
    ----------
    nclass : int
        Number of classes.
    kvstore : mxnet.kvstore.KVStore, optional
        The job's ``dist_sync`` kvstore (see :func:`allreduce_sum`); ``None``: this process
        only.
    horovod : bool, default False
        Reduce with Horovod instead.

    In a job, iterate the evaluation sampler's batches beside the loader for the keys:
    ``for keys, (data, target) in zip(batches, DataLoader(valset, batch_sampler=batches))``
    with ``batches = sampler.batch_sampler()`` (what :func:`evaluate_segmentation` does).

    Examples
    --------
    >>> from gluon_data.sampling.sampler import SampleKey
    >>> metric = DistributedSegmentationMetric(3)              # kvstore=kv in a dist job
    >>> target = mx.nd.array([[[0, 1], [2, 2]], [[1, 1], [1, 1]]])
    >>> scores = mx.nd.one_hot(target, 3).transpose((0, 3, 1, 2))
    >>> keys = [SampleKey(4), SampleKey(0, pad=True)]          # row 1 pads a shard
    >>> metric.update(target, scores, keys)
    >>> pix_acc, miou = metric.get()                           # the same on every rank
    >>> round(pix_acc, 6), round(miou, 6), metric.num_samples
    (1.0, 1.0, 1)
    """

    def __init__(self, nclass: int, kvstore=None, horovod: bool = False):
        from gluoncv.utils.metrics import SegmentationMetric
        self.nclass = int(nclass)
        self.kvstore, self.horovod = kvstore, bool(horovod)
        self.metric = SegmentationMetric(self.nclass)
        self.local_samples = 0
        self.num_samples = 0  # real samples over all ranks, set by get()

    def reset(self) -> None:
        self.metric.reset()
        self.local_samples = self.num_samples = 0

    def update(self, labels: mx.nd.NDArray, preds: mx.nd.NDArray,
               keys: Optional[Sequence] = None) -> None:
        """Add a batch: ``labels`` (N, H, W), ``preds`` (N, C, H, W) scores; ``keys``, the
        batch's sample keys, marks the rows to leave out (``pad=True``)."""
        rows = len(labels)
        if keys is not None:
            if len(keys) != rows or len(preds) != rows:
                raise ValueError("a batch of %d labels and %d predictions has %d keys"
                                 % (rows, len(preds), len(keys)))
            real = [i for i, k in enumerate(keys) if not getattr(k, "pad", False)]
            if not real:
                return
            if len(real) < rows:
                take = mx.nd.array(real, ctx=labels.context)
                labels = mx.nd.take(labels, take, axis=0)
                preds = mx.nd.take(preds, take.as_in_context(preds.context), axis=0)
            rows = len(real)
        self.metric.update(labels, preds)
        self.local_samples += rows

    def state(self) -> np.ndarray:
        """This rank's state: ``[samples, correct, labelled, inter[nclass], union[nclass]]``."""
        m, n = self.metric, self.nclass
        return np.concatenate([[self.local_samples, m.total_correct, m.total_label],
                               np.broadcast_to(m.total_inter, (n,)),
                               np.broadcast_to(m.total_union, (n,))]).astype(np.float64)

    def get(self) -> Tuple[float, float]:
        """(pixAcc, mIoU) over every rank's real samples (a collective)."""
        from gluoncv.utils.metrics import SegmentationMetric
        total = allreduce_sum(self.state(), self.kvstore, self.horovod).astype(np.int64)
        n = self.nclass
        summed = SegmentationMetric(n)
        summed.total_correct, summed.total_label = np.int64(total[1]), np.int64(total[2])
        summed.total_inter, summed.total_union = total[3:3 + n], total[3 + n:3 + 2 * n]
        self.num_samples = int(total[0])
        return summed.get()


def evaluate_segmentation(forward: Callable, dataset, sampler, *, kvstore=None,
                          horovod: bool = False, num_workers: int = 0,
                          batchify_fn: Optional[Callable] = None
                          ) -> Tuple[float, float, int]:
    """Evaluate ``forward`` (``data -> scores (N, C, H, W)``) on this rank's shard of
    ``dataset`` and return ``(pixAcc, mIoU, samples)`` over all ranks (a collective).

    ``sampler`` is this rank's :class:`~gluon_data.sampling.sampler.DistributedSampler` over the
    evaluation set, usually with ``shuffle=False``; its pad flags say which rows to skip, so
    each sample counts once and the result equals one process evaluating the whole set.
    """
    batches = sampler.batch_sampler()
    loader = mx.gluon.data.DataLoader(dataset, batch_sampler=batches, num_workers=num_workers,
                                      batchify_fn=batchify_fn)
    metric = DistributedSegmentationMetric(dataset.num_class, kvstore, horovod)
    for keys, (data, target) in zip(batches, loader):
        metric.update(target, forward(data), keys)
    pix_acc, miou = metric.get()
    return pix_acc, miou, metric.num_samples
