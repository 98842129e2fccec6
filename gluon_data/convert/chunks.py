"""A conversion worker's tasks: a chunk of items (as many as :func:`chunk_size` says)
encoded into a segment of framed records (:func:`encode_chunk`), and earlier chunks'
segments copied into the output at the offsets the writer reserved for them
(:func:`copy_segments`).

The ordered writing, the checkpoints and the index stay in the main process
(:mod:`.loop`); these functions are what a worker process unpickles with each task, so
this module imports only what they run: a worker starts without the store and output
modules the main process needs.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

from ..format import codec
from ..storage.fsutil import open_new
from ..storage.rangecopy import copy_segment

__all__ = ["encode_chunk", "copy_segments", "chunk_size", "CHUNK_ITEMS", "CHUNK_BYTES"]

#: Items per worker task: at least CHUNK_ITEMS[0] where the source allows, and as many more,
#: up to CHUNK_ITEMS[1], as CHUNK_BYTES of source files hold. Each task costs the parent the
#: same CPU whatever it carries (its message, its ordered result, its segment's place in the
#: output); its bytes are what the worker's segment holds until it is copied.
CHUNK_ITEMS = (16, 64)
CHUNK_BYTES = 4 << 20


def chunk_size(count: int, workers: int, item_bytes: Optional[float] = None) -> int:
    """Items per task message of a conversion of ``count`` items in ``workers`` workers:
    enough to amortise the per-message cost (more for small items, :data:`CHUNK_BYTES`),
    small enough that every worker still gets several chunks (the ordered results wait for
    the slowest). ``item_bytes``: the mean size of an item's source files, where known.

    >>> chunk_size(2400, 2), chunk_size(2400, 2, 70e3), chunk_size(2400, 2, 3e6)
    (16, 59, 16)
    >>> chunk_size(2400, 64, 1e3), chunk_size(5, 2, 1e3)
    (4, 1)
    """
    low, high = CHUNK_ITEMS
    cap = low if not item_bytes else max(low, min(high, int(CHUNK_BYTES // item_bytes)))
    return max(1, min(cap, count // (8 * workers)))


#: A segment copy: ``(segment, output, runs)``, runs ``(offset, nbytes, output offset)``.
Copy = Tuple[str, str, Sequence[Tuple[int, int, int]]]


def encode_chunk(fn: Callable[[Any], tuple], jobs: List[Any], segment: Optional[str],
                 copies: Sequence[Copy] = ()) -> Tuple[Optional[str], list]:
    """A worker's task: ``fn`` over ``jobs``, as ``(segment, results)``. With ``segment``
    (a path the writer gave), the framed records of the items that encoded are written
    there, in order, and each result carries the framed size in place of the payload; the
    segment is None when no item encoded. ``copies``: earlier segments to copy into the
    output first (:func:`copy_segments`)."""
    copy_segments(copies)
    results = [fn(j) for j in jobs]
    if segment is None or all(r[3] is not None for r in results):
        return None, results
    out = []
    with open_new(segment, "wb") as f:
        for pos, payload, info, err in results:
            if err is None:
                data = b"".join(codec.frame(payload))
                f.write(data)
                payload = len(data)
            out.append((pos, payload, info, err))
    return segment, out


def copy_segments(copies: Sequence[Copy]) -> None:
    """A worker's task (also run first by :func:`encode_chunk`): each ``(segment, dest,
    runs)`` of ``copies`` copied into its output
    (:func:`~gluon_data.storage.rangecopy.copy_segment`)."""
    for segment, dest, runs in copies:
        copy_segment(segment, dest, runs)
