"""Fetching ahead of the sampler: :class:`PrefetchSampler`. (Shard-local order is an option
of :class:`gluon_data.DistributedSampler`: ``part_sizes=store.parts()``.)"""
from __future__ import annotations

from typing import List

from .sampler import BlockShuffleSampler  # noqa: F401  (here before it joined the sampler)
from ..stores.base import will_need


class PrefetchSampler:
    """Wraps a sampler and hints the store with the next ``lookahead`` indices before
    yielding each one (:func:`gluon_data.stores.base.will_need`, the hint ``gluon_data.DataLoader``
    gives each batch), so downloads run ahead of the DataLoader in the sampler's order.
    The store's cache is shared on the node, so workers find the files the main process
    prefetched.

    Examples
    --------
    >>> store = RemoteStore("s3://bucket/train.rec")                         # doctest: +SKIP
    >>> order = DistributedSampler(len(store), part_sizes=store.parts(), seed=1)  # doctest: +SKIP
    >>> sampler = PrefetchSampler(order, store)                               # doctest: +SKIP
    >>> loader = DataLoader(dataset, batch_size=32, sampler=sampler, num_workers=4)  # doctest: +SKIP
    """

    def __init__(self, sampler, store, lookahead: int = 256):
        self.sampler, self.store, self.lookahead = sampler, store, max(1, int(lookahead))

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self):
        window: List = []
        it = iter(self.sampler)
        done = False
        while True:
            while not done and len(window) < self.lookahead:
                try:
                    window.append(next(it))
                except StopIteration:
                    done = True
            if not window:
                return
            will_need(self.store, [int(k) for k in window])
            yield window.pop(0)
