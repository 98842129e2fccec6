"""Samplers and sample keys: which record a DataLoader asks for, in which epoch, on which rank.

Every gluon_data dataset accepts a :class:`SampleKey` wherever it accepts an ``int``: the key
carries the epoch (and whether the sample pads out a distributed shard) from the sampler,
which runs in the main process, to the dataset in a DataLoader worker, which never sees a
``set_epoch`` made in the main process. Random transforms draw from a generator derived from
``(seed, epoch, index)`` only (:func:`sample_rng`), so a sample is bit-identical with any
number of workers, threads or ranks, and after a resume.

Nothing here imports MXNet.
"""
from __future__ import annotations

import sys
import operator
import warnings
from typing import (Any, Dict, Iterator, List, Optional, Sequence, SupportsIndex, Tuple,
                    cast)

import numpy as np

from .orders import (block_order, checked_count, epoch_order, merged_ranges, range_pieces,
                     range_positions)

__all__ = ["SampleKey", "split_key", "sample_rng", "epoch_order", "block_order",
           "DistributedSampler", "DistributedBatchSampler", "BlockShuffleSampler"]
#: The Horovod bindings :meth:`DistributedSampler.from_horovod` reads a rank from.
_HOROVOD_BINDINGS = ("horovod.mxnet", "horovod.torch", "horovod.tensorflow")


class SampleKey(int):
    """A dataset index with the epoch it is drawn in and a padding flag.

    It *is* an ``int`` (its ``index``), so every dataset accepts it — stock Gluon datasets,
    lists and numpy- or NDArray-backed datasets (``ArrayDataset``) index with it exactly as
    with the plain number — while gluon_data datasets also read its ``epoch`` (and
    evaluation helpers its ``pad`` flag). Arithmetic on it gives plain ints. Two keys are
    equal when index, epoch and pad all are; a key equals the plain int of its index.

    Examples
    --------
    >>> key = SampleKey(7, epoch=2)
    >>> int(key), key.index, key.epoch, key.pad
    (7, 7, 2, False)
    >>> [10, 11, 12, 13, 14, 15, 16, 17][key]
    17
    >>> import numpy as np
    >>> np.arange(100).reshape(10, 10)[key].tolist()[:3]
    [70, 71, 72]
    """

    epoch: int
    pad: bool

    def __new__(cls, index, epoch: int = 0, pad: bool = False) -> "SampleKey":
        self = super().__new__(cls, operator.index(index))
        self.epoch = operator.index(epoch)
        self.pad = bool(pad)
        return self

    @property
    def index(self) -> int:
        return int(self)

    def __reduce__(self):
        return SampleKey, (int(self), self.epoch, self.pad)

    def __eq__(self, other) -> bool:
        if isinstance(other, SampleKey):
            return (int(self), self.epoch, self.pad) == (int(other), other.epoch, other.pad)
        return int.__eq__(self, other)

    def __ne__(self, other) -> bool:
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    __hash__ = int.__hash__  # keys equal as SampleKeys are equal as ints

    def __repr__(self) -> str:
        return "SampleKey(index=%d, epoch=%d, pad=%r)" % (int(self), self.epoch, self.pad)


def split_key(idx: SupportsIndex) -> Tuple[int, Optional[int]]:
    """``(index, epoch)`` of a :class:`SampleKey`, or ``(idx, None)`` for a plain integer."""
    if isinstance(idx, SampleKey):
        return int(idx.index), int(idx.epoch)
    return operator.index(idx), None


def sample_rng(seed: int, epoch: Optional[int], index: int) -> np.random.Generator:
    """The generator of sample ``index`` in ``epoch`` for a transform seeded with ``seed``:
    a pure function of the three numbers (``epoch=None``, a plain-int index, counts as 0)."""
    return np.random.default_rng([int(seed) & 0xFFFFFFFFFFFFFFFF, int(epoch or 0),
                                  int(index)])


_STATE_VERSION = 1
_BLOCK_STATE = ("part_sizes", "parts_per_block")  # in the states of a block-local order only


class DistributedSampler:
    """Equal, seeded, resumable shards of one dataset for ``num_replicas`` data-parallel ranks.

    **Order.** Epoch ``e`` visits the samples in one seeded permutation ``P`` of
    ``range(length)`` (:func:`epoch_order`) that does not depend on the number of replicas.
    It is consumed in *global steps* of ``G = num_replicas * batch_size`` samples: global step
    ``t`` takes exactly ``P[c + t*G : c + (t+1)*G]`` (``c``: samples consumed before this pass,
    0 unless resumed), and rank ``r`` gets the ``r``-th contiguous slice of ``batch_size``
    samples of it, ``P[c + t*G + r*B : c + t*G + (r+1)*B]`` -- the same split that
    ``gluon.utils.split_and_load`` makes of one process's batch of ``G``.

    **Equal shards.** When fewer than ``G`` samples are left for the last global step, they
    are padded by repetition (``P[0], P[1], ...``, keys flagged ``pad=True``) to
    ``num_replicas * b`` samples, ``b = ceil(left / num_replicas)``, and every rank gets a last
    batch of ``b`` samples (the padding lands on the last ranks). So every rank yields the same
    number of samples and batches, and no collective ever waits on a rank that finished.
    With ``drop_last=True`` the incomplete global step is dropped instead (every batch is
    full; those samples are skipped this epoch).

    **Block-local order** (``part_sizes``: records per part, e.g. ``store.parts()`` of a
    sharded or remote store). ``P`` is then :func:`block_order`: the parts in a seeded order,
    ``parts_per_block`` at a time shuffled together, block after block. The samples left in
    the pass are cut into ``num_replicas`` contiguous runs of ``P``, one per rank (the sizes
    the steps above give each rank), which each rank reads in order, in batches of
    ``batch_size``: a rank reads whole parts one after another (a part is split only where a
    run ends), so it downloads only its own shards, each once, and holds one block at a time.
    Pads (the same count, in the last batch) repeat the rank's own last samples backwards.
    A batch then mixes at most two blocks: convert with ``--shuffle`` and raise
    ``parts_per_block`` for more mixing.

    **Resume.** The state is one number, the global samples consumed (plus the epoch and what
    identifies the order; with ``part_sizes`` also the ranges of ``P`` not yet read). ``state_dict(batches_done=k)`` after ``k`` batches of a pass,
    restored with ``load_state_dict`` -- also into a sampler with another ``num_replicas`` or
    ``batch_size`` -- continues with exactly the samples not yet seen.

    The sampler is a pure function of its state: iterating it does not advance it (a
    ``DataLoader`` prefetches ahead of the training loop), so iterate once per epoch after
    ``set_epoch(epoch)``, as with PyTorch's ``DistributedSampler``.

    Parameters
    ----------
    length : int
        Number of samples in the dataset.
    num_replicas : int, default 1
        Number of data-parallel ranks (``kv.num_workers``, ``hvd.size()``).
    rank : int, default 0
        This rank, ``0 <= rank < num_replicas``.
    shuffle : bool, default True
        Visit a seeded permutation (else ``0, 1, ..., length - 1``).
    seed : int, default 0
        Seed of the order; must be the same on every rank.
    batch_size : int, default 1
        The per-rank batch size (what each rank's ``DataLoader`` is given).
    drop_last : bool, default False
        Drop the last, incomplete global step instead of padding it.
    keys : bool, default True
        Yield :class:`SampleKey` (an ``int`` carrying the epoch and pad flag), which every
        dataset accepts as an index. ``False`` yields plain ``int`` indexes (datasets then
        cannot tell epochs apart; use :meth:`batch_sampler` keys for the pad flags).
    part_sizes : sequence of int, optional
        Records per part in store order (summing to ``length``): block-local order.
    parts_per_block : int, default 1
        Parts shuffled together in the block-local order.

    Examples
    --------
    >>> s = DistributedSampler(11, num_replicas=2, rank=1, batch_size=2, seed=0)
    >>> s.set_epoch(3)
    >>> len(s), s.num_batches
    (6, 3)
    >>> keys = list(s)
    >>> [k.pad for k in keys]
    [False, False, False, False, False, True]
    >>> state = s.state_dict(batches_done=1)          # 4 global samples consumed
    >>> t = DistributedSampler(11, num_replicas=3, rank=0, batch_size=2, seed=0)
    >>> t.load_state_dict(state)                     # 7 left: one step of 6, then 1 + 2 pads
    >>> len(t), t.num_batches, t.epoch
    (3, 2, 3)
    >>> b = DistributedSampler(10, num_replicas=2, rank=1, part_sizes=[4, 4, 2], seed=0)
    >>> [int(k) for k in b] == b.order()[5:].tolist()   # rank 1: the second half of P
    True
    """

    def __init__(self, length: int, num_replicas: int = 1, rank: int = 0,
                 shuffle: bool = True, seed: int = 0, batch_size: int = 1,
                 drop_last: bool = False, keys: bool = True,
                 part_sizes: Optional[Sequence[int]] = None, parts_per_block: int = 1):
        self.length = checked_count("length", length, 0)
        self.num_replicas = checked_count("num_replicas", num_replicas, 1)
        self.rank = checked_count("rank", rank, 0)
        if self.rank >= self.num_replicas:
            raise ValueError("rank must be in [0, num_replicas=%d), got %d"
                             % (self.num_replicas, self.rank))
        self.batch_size = checked_count("batch_size", batch_size, 1)
        self.seed = checked_count("seed", seed, -(1 << 63))
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.keys = bool(keys)
        self.epoch = 0
        self.consumed = 0
        self._order: Optional[Tuple[int, np.ndarray]] = None
        self.parts_per_block = checked_count("parts_per_block", parts_per_block, 1)
        self.part_sizes: Optional[List[int]] = None
        if part_sizes is not None:
            self.part_sizes = [checked_count("part size", n, 0) for n in part_sizes]
            if sum(self.part_sizes) != self.length:
                raise ValueError("part_sizes sum to %d records, but length is %d"
                                 % (sum(self.part_sizes), self.length))
        self._remaining = [[0, self.length]]  # block-local order: the ranges of P not read

    # -- constructors -----------------------------------------------------------------------
    @classmethod
    def from_kvstore(cls, kv: Any, length: int, **options: Any) -> "DistributedSampler":
        """The sampler of this worker of an MXNet kvstore job (``kv.num_workers``,
        ``kv.rank``; 1 and 0 for ``local``/``device`` stores). ``options`` as for the class.

        >>> kv = mx.kv.create("dist_sync")                                # doctest: +SKIP
        >>> sampler = DistributedSampler.from_kvstore(kv, len(trainset), batch_size=8)  # doctest: +SKIP
        """
        _no_world(options)
        return cls(length, num_replicas=kv.num_workers, rank=kv.rank, **options)

    @classmethod
    def from_horovod(cls, length: int, **options: Any) -> "DistributedSampler":
        """The sampler of this Horovod rank (``hvd.size()``, ``hvd.rank()``), from the Horovod
        binding the training script imported and initialised (``horovod.mxnet``,
        ``horovod.torch`` or ``horovod.tensorflow``; call ``hvd.init()`` first). Nothing is
        imported here: the sampler knows no framework."""
        _no_world(options)
        hvd = next((sys.modules[name] for name in _HOROVOD_BINDINGS if name in sys.modules),
                   None)
        if hvd is None:
            raise ImportError(
                "DistributedSampler.from_horovod reads the rank from the Horovod binding your "
                "script uses, and none is imported: `import horovod.mxnet as hvd; hvd.init()` "
                "(or horovod.torch) first. Horovod with MXNet support installs with: "
                "HOROVOD_WITH_MXNET=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 pip install "
                "--no-build-isolation horovod==0.28.1")
        return cls(length, num_replicas=hvd.size(), rank=hvd.rank(), **options)

    # -- epoch and state --------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch``. A new epoch starts at its first sample; the epoch a state
        was loaded for keeps the loaded position (so ``for e in range(start, n):
        sampler.set_epoch(e)`` resumes)."""
        epoch = checked_count("epoch", epoch, 0)
        if epoch != self.epoch:
            self.epoch, self.consumed = epoch, 0
            self._remaining = [[0, self.length]]

    def state_dict(self, batches_done: int = 0) -> dict:
        """The position after this rank (and so every rank) finished ``batches_done`` batches
        of the current pass: ``{'epoch', 'consumed', ...}``, JSON-serialisable.

        ``consumed`` counts global samples: ``batches_done * num_replicas * batch_size`` more
        than at the start of the pass (capped at ``length``; a finished pass counts as the
        whole epoch consumed, dropped samples included)."""
        batches_done = checked_count("batches_done", batches_done, 0)
        total = self.num_batches
        if batches_done > total:
            raise ValueError("batches_done=%d, but this pass has only %d batches per rank"
                             % (batches_done, total))
        consumed = (self.length if batches_done == total else
                    self.consumed + batches_done * self.num_replicas * self.batch_size)
        state: Dict[str, Any] = {
            "version": _STATE_VERSION, "epoch": self.epoch, "consumed": consumed,
            "length": self.length, "seed": self.seed, "shuffle": self.shuffle}
        if self.part_sizes is not None:
            left = [] if batches_done == total else self._left_after(batches_done)
            state.update(part_sizes=list(self.part_sizes), parts_per_block=self.parts_per_block,
                         remaining=left)
        return state

    def _left_after(self, batches_done: int) -> List[List[int]]:
        """The ranges of ``P`` no rank has read after ``batches_done`` batches of this pass
        (the block-local order), the dropped tail of ``drop_last`` included."""
        starts, counts, _ = self._runs()
        done, left = batches_done * self.batch_size, []
        for a, m in zip(starts.tolist(), counts.tolist()):
            left += range_pieces(self._remaining, a + min(done, m), a + m)
        left += range_pieces(self._remaining, int(starts[-1] + counts[-1]),
                        self.length - self.consumed)
        return merged_ranges(left)

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` (from :meth:`state_dict`, possibly of a job with another
        number of replicas or batch size). The order must be the same one: a state of
        another ``length``, ``seed`` or ``shuffle`` is refused with a ``ValueError``."""
        if not isinstance(state, dict):
            raise TypeError("a sampler state is a dict from state_dict(), got %r"
                            % type(state).__name__)
        missing = [k for k in ("version", "epoch", "consumed", "length", "seed", "shuffle")
                   if k not in state]
        if missing:
            raise ValueError("sampler state lacks %s: %r" % (", ".join(missing), state))
        if state["version"] != _STATE_VERSION:
            raise ValueError("sampler state version %r is not supported (supported: %d)"
                             % (state["version"], _STATE_VERSION))
        blocks = self.part_sizes is not None
        for name in ("length", "seed", "shuffle", "part_sizes", "parts_per_block"):
            want = getattr(self, name) if blocks or name not in _BLOCK_STATE else None
            if state.get(name) != want:
                raise ValueError(
                    "sampler state is for %s=%r but this sampler has %s=%r: the sample "
                    "order would differ, so the run could not continue with exactly the "
                    "unseen samples" % (name, state.get(name), name, want))
        consumed = checked_count("consumed", state["consumed"], 0)
        if consumed > self.length:
            raise ValueError("sampler state consumed %d samples of a dataset of %d"
                             % (consumed, self.length))
        remaining = [[0, self.length]]
        if self.part_sizes is not None:
            remaining = self._check_remaining(state.get("remaining"), consumed)
        self.epoch = checked_count("epoch", state["epoch"], 0)
        self.consumed = consumed
        self._remaining = remaining

    def _check_remaining(self, ranges, consumed: int) -> List[List[int]]:
        """The ``remaining`` ranges of a block-local state, checked: sorted, disjoint, inside
        the order, ``length - consumed`` positions in all."""
        try:
            out = [[operator.index(a), operator.index(b)] for a, b in ranges]
        except (TypeError, ValueError):
            raise ValueError("sampler state: remaining must be a list of [start, end] "
                             "ranges, got %r" % (ranges,)) from None
        ends = [0] + [b for _, b in out]
        if any(not e <= a < b <= self.length for (a, b), e in zip(out, ends)) \
                or sum(b - a for a, b in out) != self.length - consumed:
            raise ValueError("sampler state: remaining %r is not %d unread positions of an "
                             "order of %d" % (out, self.length - consumed, self.length))
        return out

    # -- the plan ---------------------------------------------------------------------------
    def order(self) -> np.ndarray:
        """The global order ``P`` of the current epoch (cached)."""
        if self._order is None or self._order[0] != self.epoch:
            if self.part_sizes is None:
                order = epoch_order(self.length, self.seed, self.epoch, self.shuffle)
            else:
                order = block_order(self.part_sizes, self.seed, self.epoch, self.shuffle,
                                    self.parts_per_block)[0]
            self._order = (self.epoch, order)
        return self._order[1]

    def _shape(self) -> Tuple[int, int]:
        """(full global steps left, size of this rank's last, padded batch or 0)."""
        left = self.length - self.consumed
        step = self.num_replicas * self.batch_size
        full, rest = divmod(left, step)
        if rest == 0 or self.drop_last:
            return full, 0
        return full, -(-rest // self.num_replicas)

    @property
    def num_batches(self) -> int:
        """Batches every rank yields in this pass."""
        full, tail = self._shape()
        return full + (1 if tail else 0)

    def __len__(self) -> int:
        full, tail = self._shape()
        return full * self.batch_size + tail

    def _runs(self) -> Tuple[np.ndarray, np.ndarray, int]:
        """Block-local order: (where each rank's run starts among the samples left, its
        samples, samples per rank with pads): every rank reads the samples the steps above
        would give it, but as one contiguous run."""
        full, tail = self._shape()
        counts = np.full(self.num_replicas, full * self.batch_size, dtype=np.int64)
        if tail:
            rest = self.length - self.consumed - full * self.num_replicas * self.batch_size
            counts += np.clip(rest - np.arange(self.num_replicas) * tail, 0, tail)
        starts = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
        return starts, counts, full * self.batch_size + tail

    def _block_positions(self) -> Tuple[np.ndarray, np.ndarray]:
        starts, counts, n = self._runs()
        a, m = int(starts[self.rank]), int(counts[self.rank])
        real = range_positions(self._remaining, a, a + m)
        pad = n - m
        if pad:  # the rank's own samples backwards (before its run: a rank with none)
            left = self.length - self.consumed
            source = real if m else range_positions(self._remaining, max(0, left - pad), left)
            real = np.concatenate([real, source[::-1][np.arange(pad) % len(source)]])
        return self.order()[real], np.arange(n) >= m

    def positions(self) -> Tuple[np.ndarray, np.ndarray]:
        """This rank's pass as ``(indexes, pad)`` arrays (dataset indexes, pad flags)."""
        if self.part_sizes is not None:
            return self._block_positions()
        order = self.order()
        full, tail = self._shape()
        step, b, r = self.num_replicas * self.batch_size, self.batch_size, self.rank
        start = self.consumed + r * b
        pos = (start + np.arange(full, dtype=np.int64)[:, None] * step
               + np.arange(b, dtype=np.int64)[None, :]).ravel()
        indexes, pads = order[pos], np.zeros(len(pos), bool)
        if tail:
            first = self.consumed + full * step          # the last global step's samples
            slot = first + r * tail + np.arange(tail, dtype=np.int64)
            pad = slot >= self.length
            slot[pad] = (slot[pad] - self.length) % self.length   # repeat P[0], P[1], ...
            indexes = np.concatenate([indexes, order[slot]])
            pads = np.concatenate([pads, pad])
        return indexes, pads

    def __iter__(self) -> Iterator:
        indexes, pads = self.positions()
        if not self.keys:
            return iter(indexes.tolist())
        epoch = self.epoch
        return iter([SampleKey(i, epoch, p) for i, p in zip(indexes.tolist(), pads.tolist())])

    def batch_sampler(self) -> "DistributedBatchSampler":
        """This rank's batches as lists of keys: ``DataLoader(dataset,
        batch_sampler=sampler.batch_sampler())`` needs no ``batch_size`` or ``last_batch``,
        and iterating it again beside the loader gives each batch's pad flags."""
        return DistributedBatchSampler(self)

    def __repr__(self) -> str:
        parts = "" if self.part_sizes is None else ", parts=%d, parts_per_block=%d" % (
            len(self.part_sizes), self.parts_per_block)
        return ("%s(length=%d, num_replicas=%d, rank=%d, batch_size=%d, "
                "shuffle=%s, seed=%d, drop_last=%s, epoch=%d, consumed=%d%s)"
                % (type(self).__name__, self.length, self.num_replicas, self.rank,
                   self.batch_size, self.shuffle, self.seed, self.drop_last, self.epoch,
                   self.consumed, parts))


class DistributedBatchSampler:
    """The batches of a :class:`DistributedSampler` (lists of its keys), for a Gluon
    ``DataLoader(batch_sampler=...)``; follows the sampler's epoch and state.

    Examples
    --------
    >>> s = DistributedSampler(5, num_replicas=2, rank=0, batch_size=2, shuffle=False)
    >>> [[int(k) for k in batch] for batch in s.batch_sampler()]
    [[0, 1], [4]]
    """

    def __init__(self, sampler: DistributedSampler):
        self.sampler = sampler

    def __iter__(self) -> Iterator[list]:
        keys, b = list(self.sampler), self.sampler.batch_size
        return iter([keys[i:i + b] for i in range(0, len(keys), b)])

    def __len__(self) -> int:
        return self.sampler.num_batches


def _no_world(options: dict) -> None:
    clash = sorted({"num_replicas", "rank"} & set(options))
    if clash:
        raise TypeError("%s come from the launcher here; do not pass %s"
                        % (" and ".join(clash), ", ".join(clash)))


class BlockShuffleSampler(DistributedSampler):
    """Deprecated: ``DistributedSampler(sum(part_sizes), part_sizes=part_sizes,
    parts_per_block=k, seed=seed)``, which this is with one rank (and which also takes
    ``num_replicas``, ``rank``, ``batch_size`` and resumes from ``state_dict``).

    A seeded, shard-local order: the parts (shards) in a seeded permutation, the records of
    each block of ``parts_per_block`` parts shuffled together, block after block, so an
    epoch needs ``parts_per_block`` shards at a time, each read once; a pure function of
    ``(seed, epoch, part sizes)`` (see :func:`block_order`).

    Examples
    --------
    >>> import warnings
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore", DeprecationWarning)
    ...     s = BlockShuffleSampler([3, 3, 2], seed=0)
    >>> s.set_epoch(1)
    >>> sorted(int(k) for k in s) == list(range(8)), len(s), len(s.blocks())
    (True, 8, 3)
    """

    def __init__(self, part_sizes: Sequence[int], shuffle: bool = True, seed: int = 0,
                 parts_per_block: int = 1):
        warnings.warn("BlockShuffleSampler is deprecated: use gluon_data.DistributedSampler("
                      "sum(part_sizes), part_sizes=part_sizes, parts_per_block=k), which is "
                      "also rank-aware and resumable", DeprecationWarning, stacklevel=2)
        sizes = [checked_count("part size", n, 0) for n in part_sizes]
        super().__init__(sum(sizes), shuffle=shuffle, seed=seed, part_sizes=sizes,
                         parts_per_block=parts_per_block)

    def blocks(self) -> List[np.ndarray]:
        """This epoch's order, block by block (arrays of record indexes)."""
        order, bounds = block_order(cast(List[int], self.part_sizes), self.seed, self.epoch,
                                    self.shuffle, self.parts_per_block)
        return [order[a:b] for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist())]
