"""Seeded randomness for transforms: each sample's draws depend on ``(seed, epoch, index)``.

A random transform holds a :class:`SeededRandom` and draws its parameters through
``self.rng.draw(fn)``. Inside :class:`sample_context` ``(epoch, index)`` (what the datasets
enter around their transforms), a seeded transform draws from ``sample_rng(seed, epoch,
index)`` (:func:`gluon_data.sampling.sampler.sample_rng`), one generator per transform and sample;
outside one, from its own stream (the seed in the process that built it, the seed and the
pid in another, fresh entropy without a seed). Nothing here reads or advances the global
``random`` / ``numpy`` state that DataLoader workers inherit identically through ``fork``.
The rules in full: :mod:`gluon_data.arrays.transforms`. This module imports no MXNet.
"""
from __future__ import annotations

import sys
import threading
from typing import Callable, Optional, TypeVar

import numpy as np

from ..storage.perprocess import PerProcess, ProcessMark
from .sampler import sample_rng

__all__ = ["sample_context", "SeededRandom", "RandomTransform", "loader_round"]

T = TypeVar("T")

_SAMPLE = threading.local()


def loader_round() -> int:
    """What tells one epoch's loader workers from the next where each epoch has new ones:
    in a worker of PyTorch's ``DataLoader`` (``persistent_workers=False``, its default, starts
    new worker processes for every epoch, in which each request is a first), a number made
    of the base seed its iterator drew for the epoch (the same in every worker of it;
    repeatable when torch's generator is seeded); 0 elsewhere. torch is not imported here:
    only asked, where a worker of it runs this."""
    data = sys.modules.get("torch.utils.data")
    info = data.get_worker_info() if data is not None else None
    return 0 if info is None else ((int(info.seed) - int(info.id)) % (1 << 48) + 1) << 16


class sample_context:
    """Within ``with sample_context(epoch, index):`` every seeded random transform called by
    this thread draws from ``sample_rng(seed, epoch, index)`` (one generator per transform
    and sample), so the sample's draws depend on nothing else. Datasets enter it around their
    transforms; contexts nest (the innermost wins).

    >>> import numpy as np
    >>> from gluon_data.arrays.transforms import RandomCrop
    >>> t = RandomCrop(4, seed=7)
    >>> img, mask = np.arange(64, dtype=np.uint8).reshape(8, 8, 1), np.zeros((8, 8), np.int32)
    >>> with sample_context(epoch=2, index=5):
    ...     a = t(img, mask)[0]
    >>> with sample_context(epoch=2, index=5):
    ...     b = t(img, mask)[0]
    >>> bool((a == b).all())
    True
    """

    __slots__ = ("epoch", "index", "generators", "_prev")

    def __init__(self, epoch: Optional[int], index: int):
        self.epoch, self.index = epoch, int(index)
        self.generators: dict = {}
        self._prev = None

    def __enter__(self) -> "sample_context":
        self._prev = getattr(_SAMPLE, "ctx", None)
        _SAMPLE.ctx = self
        return self

    def __exit__(self, *exc) -> None:
        _SAMPLE.ctx = self._prev


class SeededRandom:
    """A process-aware ``numpy.random.Generator`` that follows :func:`sample_context`
    (see the module docstring)."""

    def __init__(self, seed: Optional[int] = None):
        self.seed = seed
        self._owner = ProcessMark()  # the process drawing the stream seeded with ``seed``
        self._gen: PerProcess[np.random.Generator] = PerProcess()
        self._lock = threading.Lock()

    def generator(self) -> np.random.Generator:
        """This process's generator of the stream (made on first use in each process)."""
        return self._gen.get(self._new_generator)

    def _new_generator(self) -> np.random.Generator:
        if self.seed is None:
            return np.random.default_rng()
        if self._owner.here():
            return np.random.default_rng(self.seed)
        return np.random.default_rng([self.seed, ProcessMark().pid])  # (this process's id)

    def draw(self, fn: Callable[[np.random.Generator], T]) -> T:
        """Run ``fn(generator)``: the sample's own generator inside a :class:`sample_context`
        (seeded transforms), else this transform's stream under a lock (threads of a
        thread-pool loader share it)."""
        ctx = getattr(_SAMPLE, "ctx", None)
        if ctx is not None and self.seed is not None:
            g = ctx.generators.get(id(self))
            if g is None:
                g = ctx.generators[id(self)] = sample_rng(self.seed, ctx.epoch, ctx.index)
            return fn(g)
        with self._lock:
            return fn(self.generator())

    def __getstate__(self):
        return {"seed": self.seed, "_owner": self._owner}

    def __setstate__(self, d):
        self.__init__(d["seed"])
        owner = d["_owner"]  # a process id in older pickles
        self._owner = owner if isinstance(owner, ProcessMark) else ProcessMark(owner)


class RandomTransform:
    """Base of random transforms (the joint transforms of :mod:`gluon_data.arrays.transforms`
    and the fast paths of :mod:`gluon_data.arrays.tensorize`): ``self.rng``, a
    :class:`SeededRandom` of ``seed``, and ``reseed``.

    >>> class Flip(RandomTransform):
    ...     def __call__(self, x):
    ...         return x[::-1] if self.rng.draw(lambda g: g.random()) < 0.5 else x
    >>> flip = Flip(seed=7)
    >>> with sample_context(epoch=0, index=3):
    ...     a = flip([1, 2, 3])
    >>> with sample_context(epoch=0, index=3):
    ...     b = flip([1, 2, 3])
    >>> a == b
    True
    """

    def __init__(self, seed: Optional[int] = None):
        self.rng = SeededRandom(seed)

    def reseed(self, seed: Optional[int]) -> None:
        self.rng = SeededRandom(seed)

