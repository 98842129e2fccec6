"""Samplers and sample keys: which record a DataLoader asks for, in which epoch.

Every gluon_data dataset accepts a :class:`SampleKey` wherever it accepts an ``int``: the key
carries the epoch (and whether the sample pads out a distributed shard) from the sampler,
which runs in the main process, to the dataset in a DataLoader worker, which never sees a
``set_epoch`` made in the main process. Random transforms draw from a generator derived from
``(seed, epoch, index)`` only (:func:`sample_rng`), so a sample is bit-identical with any
number of workers, threads or ranks, and after a resume.

Nothing here imports MXNet.
"""
from __future__ import annotations

import operator
from typing import NamedTuple, Optional, Tuple

import numpy as np

__all__ = ["SampleKey", "split_key", "sample_rng"]


class SampleKey(NamedTuple):
    """A dataset index with the epoch it is drawn in and a padding flag.

    It behaves as its ``index`` wherever Python wants an integer (``int(key)``,
    ``operator.index(key)``, ``list[key]``), so stock Gluon datasets accept it too.

    Examples
    --------
    >>> key = SampleKey(7, epoch=2)
    >>> int(key), key.epoch, key.pad
    (7, 2, False)
    >>> [10, 11, 12, 13, 14, 15, 16, 17][key]
    17
    """

    index: int
    epoch: int = 0
    pad: bool = False

    def __index__(self) -> int:
        return int(self.index)

    def __int__(self) -> int:
        return int(self.index)


def split_key(idx) -> Tuple[int, Optional[int]]:
    """``(index, epoch)`` of a :class:`SampleKey`, or ``(idx, None)`` for a plain integer."""
    if isinstance(idx, SampleKey):
        return int(idx.index), int(idx.epoch)
    return operator.index(idx), None


def sample_rng(seed: int, epoch: Optional[int], index: int) -> np.random.Generator:
    """The generator of sample ``index`` in ``epoch`` for a transform seeded with ``seed``:
    a pure function of the three numbers (``epoch=None``, a plain-int index, counts as 0)."""
    return np.random.default_rng([int(seed) & 0xFFFFFFFFFFFFFFFF, int(epoch or 0),
                                  int(index)])
