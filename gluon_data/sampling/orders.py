"""Sample orders: which permutation of a dataset an epoch visits, a pure function of
``(seed, epoch)`` (and the part sizes), never of the number of replicas.

:func:`epoch_order` is a full shuffle; :func:`block_order` a block-local one, for stores read
part by part (shards, remote objects): parts in a seeded order, records shuffled within
blocks of parts. :class:`~gluon_data.sampling.sampler.DistributedSampler` cuts either among ranks.
Nothing here imports MXNet.

Examples
--------
>>> order, bounds = block_order([3, 3, 2], seed=0, epoch=1)
>>> sorted(order.tolist()) == list(range(8)), len(bounds)
(True, 4)
>>> sorted(sorted(order[a:b].tolist()) for a, b in zip(bounds[:-1], bounds[1:]))
[[0, 1, 2], [3, 4, 5], [6, 7]]
"""
from __future__ import annotations

import operator
from typing import Any, List, Sequence, Tuple

import numpy as np

__all__ = ["epoch_order", "block_order", "checked_count", "range_pieces", "range_positions",
           "merged_ranges"]


def checked_count(name: str, value: Any, minimum: int) -> int:
    """``value`` as an int >= ``minimum``, or a ValueError naming the parameter."""
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError("%s must be an integer, got %r" % (name, value)) from None
    if number < minimum:
        raise ValueError("%s must be >= %d, got %d" % (name, minimum, number))
    return number


def epoch_order(length: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """The global sample order of ``epoch``: a permutation of ``range(length)`` that depends on
    ``(seed, epoch)`` only, never on the number of replicas (``shuffle=False``: ``arange``).

    It draws from its own stream (``SeedSequence([seed, epoch], spawn_key=(1,))``), distinct
    from every sample's :func:`~gluon_data.sampling.sampler.sample_rng` stream."""
    if not shuffle:
        return np.arange(length, dtype=np.int64)
    sequence = np.random.SeedSequence([int(seed) & 0xFFFFFFFFFFFFFFFF, int(epoch)],
                                      spawn_key=(1,))
    return np.random.default_rng(sequence).permutation(length).astype(np.int64, copy=False)


def block_order(part_sizes: Sequence[int], seed: int, epoch: int, shuffle: bool = True,
                parts_per_block: int = 1) -> Tuple[np.ndarray, np.ndarray]:
    """The block-local order of ``epoch`` over parts (shards) of ``part_sizes`` records, in
    store order (part ``p`` holds the indexes after those of parts ``0..p-1``): ``(order,
    bounds)``. The parts are drawn in one seeded permutation and taken ``parts_per_block`` at
    a time as blocks; ``order`` lists block after block, each block's records in a seeded
    shuffle, and block ``j`` is ``order[bounds[j]:bounds[j + 1]]``. A pure function of its
    arguments (never of the number of replicas), from its own stream
    (``SeedSequence([seed, epoch], spawn_key=(2,))``); ``shuffle=False``: ``arange``, the
    parts in store order."""
    sizes = np.asarray([checked_count("part size", n, 0) for n in part_sizes], dtype=np.int64)
    per_block = checked_count("parts_per_block", parts_per_block, 1)
    nparts, total = len(sizes), int(sizes.sum())
    firsts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
    rng = None
    parts = np.arange(nparts)
    if shuffle:
        sequence = np.random.SeedSequence([int(seed) & 0xFFFFFFFFFFFFFFFF, int(epoch)],
                                          spawn_key=(2,))
        rng = np.random.default_rng(sequence)
        parts = rng.permutation(nparts)
    lens = sizes[parts]
    runs = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)  # where each part starts
    bounds = runs[np.append(np.arange(0, nparts, per_block), nparts)]
    if rng is None:
        return np.arange(total, dtype=np.int64), bounds
    order = np.arange(total, dtype=np.int64) + np.repeat(firsts[parts] - runs[:-1], lens)
    block_of = np.repeat(np.arange(nparts) // per_block, lens)
    return order[np.lexsort((rng.random(total), block_of))], bounds


def range_pieces(ranges: Sequence[Sequence[int]], lo: int, hi: int) -> List[Tuple[int, int]]:
    """The ranges of order positions that items ``lo:hi`` of ``ranges`` laid end to end are."""
    out, base = [], 0
    for a, b in ranges:
        s, e = max(lo - base, 0), min(hi - base, b - a)
        if s < e:
            out.append((a + s, a + e))
        base += b - a
        if base >= hi:
            break
    return out


def range_positions(ranges: Sequence[Sequence[int]], lo: int, hi: int) -> np.ndarray:
    """Items ``lo:hi`` of ``ranges`` laid end to end, as an array of order positions."""
    got = [np.arange(a, b, dtype=np.int64) for a, b in range_pieces(ranges, lo, hi)]
    return np.concatenate(got) if got else np.zeros(0, np.int64)


def merged_ranges(ranges: Sequence[Sequence[int]]) -> List[List[int]]:
    out: List[List[int]] = []
    for a, b in ranges:
        if out and out[-1][1] == a:
            out[-1][1] = int(b)
        else:
            out.append([int(a), int(b)])
    return out
