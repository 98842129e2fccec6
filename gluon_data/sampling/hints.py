"""The one driver of read-ahead hints: :class:`HintAhead` hints records before they are read.

The hint is :func:`gluon_data.stores.base.will_need` (a store's or a dataset's
``will_need(indices)``: local reads advise the kernel, remote ones start downloads). What
to hint, and how far ahead, is decided here only: the Gluon ``DataLoader`` hints each batch
through :class:`HintAhead`, and :class:`~gluon_data.sampling.remote.PrefetchSampler` the
sampler's next indices.
"""
from __future__ import annotations

from collections import deque
from itertools import islice
from typing import Any, Iterator, Protocol, Sequence, Union

import numpy as np

from ..errors import GluonDataError
from ..stores.base import will_need

__all__ = ["HintAhead", "hint"]


def hint(target: Any, indices: Union[np.ndarray, Sequence[int]]) -> None:
    """Hand ``indices`` to ``target``'s ``will_need`` (a store or a dataset; one without is
    left alone). A hint that fails (a damaged or replaced file, a position that is no key)
    is dropped: the read of the record, in whichever process reads it, raises the typed
    error naming the file and record."""
    if len(indices):
        try:
            will_need(target, indices)
        except (GluonDataError, OSError, LookupError):
            pass


class SizedIterable(Protocol):
    """What :class:`HintAhead` drives: a sampler or a list, iterated and sized."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator: ...


class HintAhead:
    """The items of ``source`` (batches of indices, or single indices), unchanged and in
    order, each one's indices hinted (:func:`hint`) before the item is yielded.

    Items are drawn from ``source`` ``ahead`` items before they are yielded (0: each is
    hinted as it is drawn), ``window`` items at a time, each window hinted by one call;
    so when an item is yielded, at least the ``ahead`` items after it are on their way.

    Parameters
    ----------
    source : iterable
        Batches (sequences of indices), or with ``single=True`` indices.
    target : object
        What is hinted: a store or a dataset with ``will_need(indices)``.
    ahead : int
        Items drawn and hinted beyond the one being yielded.
    window : int
        Items hinted together (one ``will_need`` call per window).
    single : bool
        The items are indices (a sampler), not batches.

    Examples
    --------
    >>> class Store:
    ...     def will_need(self, indices):
    ...         print("hint", list(indices))
    >>> for batch in HintAhead([[3, 1], [0, 2], [4]], Store(), ahead=1):
    ...     print("read", batch)
    hint [3, 1]
    hint [0, 2]
    read [3, 1]
    hint [4]
    read [0, 2]
    read [4]
    """

    def __init__(self, source: "SizedIterable", target: Any, ahead: int = 0, *, window: int = 1,
                 single: bool = False):
        self.source, self.target = source, target
        self.ahead, self.window = max(0, int(ahead)), max(1, int(window))
        self.single = single

    def __len__(self) -> int:
        return len(self.source)

    def __iter__(self) -> Iterator:
        pending: deque = deque()  # drawn and hinted, not yet yielded
        it = iter(self.source)
        more = True
        while True:
            while more and len(pending) <= self.ahead:
                drawn = list(islice(it, self.window))
                more = len(drawn) == self.window
                if drawn:
                    indices = ([int(k) for k in drawn] if self.single
                               else [k for item in drawn for k in item])
                    hint(self.target, indices)
                    pending.extend(drawn)
            if not pending:
                return
            yield pending.popleft()
