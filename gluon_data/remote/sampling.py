"""Samplers that keep remote reads shard-local and fetch ahead."""
from __future__ import annotations

from typing import Iterator, List, Sequence

import numpy as np

from ..sampler import SampleKey
from ..store import will_need



# --------------------------------------------------------------------------- sampling
class BlockShuffleSampler:
    """Seeded shuffle that keeps each epoch's reads shard-local.

    Each epoch draws one permutation of the parts (shards) and, for every block of
    ``parts_per_block`` consecutive parts in that order, one permutation of the records of
    the block; it yields the blocks one after the other. Only ``parts_per_block`` parts are
    needed at a time, so a cache holding a few shards serves the whole epoch with each shard
    downloaded once, and the next block can be prefetched while this one is read.

    **Shuffle quality.** A full shuffle makes any two records equally likely to meet in a
    batch. Here a batch holds records from at most ``parts_per_block`` parts (two, at a
    block boundary), so a shard with skewed content (e.g. written in class order) gives
    skewed batches. Shuffle the items when converting (``convert --shuffle``) so every shard
    is a random sample, and raise ``parts_per_block`` (at the cost of that many shards in
    the cache) for more mixing; with one block covering every part this is a full shuffle.
    The order is a pure function of ``(seed, epoch, part sizes)``.

    Parameters
    ----------
    part_sizes : sequence of int
        Records per part, in store order (``store.parts()``).
    shuffle : bool
        ``False``: parts and records in store order.
    seed : int
    parts_per_block : int

    Examples
    --------
    >>> s = BlockShuffleSampler([3, 3, 2], seed=0)
    >>> s.set_epoch(1)
    >>> sorted(int(k) for k in s) == list(range(8)), len(s)
    (True, 8)
    """

    def __init__(self, part_sizes: Sequence[int], shuffle: bool = True, seed: int = 0,
                 parts_per_block: int = 1):
        self.part_sizes = [int(n) for n in part_sizes]
        if any(n < 0 for n in self.part_sizes) or int(parts_per_block) < 1:
            raise ValueError("part sizes must be >= 0 and parts_per_block >= 1")
        self._starts = np.concatenate(([0], np.cumsum(self.part_sizes)))
        self.shuffle, self.seed = shuffle, int(seed)
        self.parts_per_block = int(parts_per_block)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return int(self._starts[-1])

    def blocks(self) -> List[np.ndarray]:
        """This epoch's order, block by block (arrays of record indices)."""
        rng = np.random.default_rng([self.seed & 0xFFFFFFFFFFFFFFFF, self.epoch, 0x42534850])
        nparts = len(self.part_sizes)
        order = rng.permutation(nparts) if self.shuffle else np.arange(nparts)
        out = []
        for b in range(0, nparts, self.parts_per_block):
            idx = np.concatenate([np.arange(self._starts[p], self._starts[p + 1])
                                  for p in order[b:b + self.parts_per_block]] or [[]])
            if self.shuffle:
                rng.shuffle(idx)
            out.append(idx.astype(np.int64))
        return out

    def __iter__(self) -> Iterator[SampleKey]:
        epoch = self.epoch
        for block in self.blocks():
            for i in block:
                yield SampleKey(int(i), epoch)


class PrefetchSampler:
    """Wraps a sampler and hints the store with the next ``lookahead`` indices before
    yielding each one (:func:`gluon_data.store.will_need`, the hint ``gluon_data.DataLoader``
    gives each batch), so downloads run ahead of the DataLoader in the sampler's order.
    The store's cache is shared on the node, so workers find the files the main process
    prefetched.

    Examples
    --------
    >>> store = RemoteStore("s3://bucket/train.rec")                         # doctest: +SKIP
    >>> sampler = PrefetchSampler(BlockShuffleSampler(store.parts(), seed=1), store)  # doctest: +SKIP
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
