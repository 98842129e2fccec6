"""Fetching ahead of the sampler: :class:`PrefetchSampler`. (Shard-local order is an option
of :class:`gluon_data.DistributedSampler`: ``part_sizes=store.parts()``.)"""
from __future__ import annotations

from typing import Any

from .hints import HintAhead, SizedIterable
from .sampler import BlockShuffleSampler  # noqa: F401  (here before it joined the sampler)


class PrefetchSampler:
    """Wraps a sampler and hints the store with the next ``lookahead`` indices before
    yielding each one (:func:`gluon_data.stores.base.will_need`, through the one driver of
    hints, :class:`~gluon_data.sampling.hints.HintAhead`, which ``gluon_data.DataLoader``
    hints each batch through), so downloads run ahead of the DataLoader in the sampler's
    order. The indices are hinted in windows of a quarter of ``lookahead`` (one call each).
    The store's cache is shared on the node, so workers find the files the main process
    prefetched.

    Examples
    --------
    >>> store = RemoteStore("s3://bucket/train.rec")                         # doctest: +SKIP
    >>> order = DistributedSampler(len(store), part_sizes=store.parts(), seed=1)  # doctest: +SKIP
    >>> sampler = PrefetchSampler(order, store)                               # doctest: +SKIP
    >>> loader = DataLoader(dataset, batch_size=32, sampler=sampler, num_workers=4)  # doctest: +SKIP
    """

    def __init__(self, sampler: SizedIterable, store: Any, lookahead: int = 256):
        self.sampler, self.store, self.lookahead = sampler, store, max(1, int(lookahead))

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self):
        return iter(HintAhead(self.sampler, self.store, self.lookahead - 1,
                              window=max(1, self.lookahead // 4), single=True))
