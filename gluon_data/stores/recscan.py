"""The sequential scan of a ``.rec``: every payload in index order, fetched in large chunks
where records lie back to back (:meth:`~gluon_data.stores.recordio.RecordFile.scan`)."""
from __future__ import annotations

from typing import Iterator, Optional, Protocol, Union

from ..format import codec

__all__ = ["scan_payloads", "Scannable"]


class Scannable(Protocol):
    """What a scan reads: a ``.rec``'s path and size, its extents (``_off``, ``_endv``: one
    int per record, ``_endv`` ``None`` where records end where the next begins) and reads
    (``read``, ``_readinto``, ``key``): :class:`~gluon_data.stores.recordio.RecordFile`."""

    path: str
    file_size: int
    _off: memoryview
    _endv: Optional[memoryview]

    def _readinto(self, view: memoryview, offset: int) -> int: ...

    def __len__(self) -> int: ...

    def key(self, i: int) -> int: ...

    def read(self, i: int) -> bytes: ...


def scan_payloads(rf: Scannable,
                  chunk_bytes: int = 1 << 20) -> Iterator[Union[memoryview, bytes]]:
    """Every payload of ``rf`` in index order, zero-copy: each is a ``memoryview`` into a
    chunk buffer, valid until the next one is produced (copy it to keep it). Records back to
    back in the file are fetched ``chunk_bytes`` at a time; scattered ones one by one; a
    multi-part or damaged record goes through :func:`~gluon_data.format.codec.unframe`."""
    buf = bytearray(chunk_bytes)
    mv = memoryview(buf)
    offsets, ends, file_end = rf._off, rf._endv, rf.file_size
    frame, magic_word = codec.FRAME_HEADER.unpack_from, codec.RECORDIO_MAGIC
    mask = codec.LENGTH_MASK
    n = len(rf)
    i = 0
    while i < n:
        start = offsets[i]
        end = ends[i] if ends is not None else offsets[i + 1] if i + 1 < n else file_end
        if end - start > chunk_bytes:  # a copy: the shared scratch is not ours to lend
            yield memoryview(rf.read(i))
            i += 1
            continue
        sequential = i + 1 < n and offsets[i + 1] == end
        lo = start
        hi = start + rf._readinto(mv[:chunk_bytes if sequential else end - start], start)
        # every record lying wholly in this chunk; a multi-part or damaged one goes
        # through unframe(), which reassembles it or names what is wrong
        while True:
            r = start - lo
            if end - start >= 8 and end <= hi:
                magic, lrec = frame(mv, r)
                size = lrec & mask
                if magic == magic_word and not lrec >> 29 and r + 8 + size <= end - lo:
                    yield mv[r + 8:r + 8 + size]
                else:
                    yield codec.unframe(mv[:end - lo], r, path=rf.path, key=rf.key(i),
                                        base_offset=lo, copy=False)[0]
            else:
                yield codec.unframe(mv[:hi - lo], r, path=rf.path, key=rf.key(i),
                                    base_offset=lo, copy=False)[0]
            i += 1
            if i >= n:
                break
            start = offsets[i]
            end = ends[i] if ends is not None else offsets[i + 1] if i + 1 < n else file_end
            if start < lo or end > hi:
                break
