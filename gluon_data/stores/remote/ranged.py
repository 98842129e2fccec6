"""Ranged reads of a remote ``.rec`` (inspection reads fetch only the bytes they need)."""
from __future__ import annotations

import os
import threading
from typing import Callable, Optional


from ...errors import FormatError
from ..recordio import RecordFile, read_index
from ...storage.perprocess import PerProcess
from ...storage.remotefs import CHUNK_BYTES, RangesIgnoredError, Remote


# --------------------------------------------------------------------------- reading
class RangedRecordFile(RecordFile):
    """A :class:`RecordFile` whose data bytes come from ranged GETs of a remote ``.rec``:
    one GET per record read, growing read-ahead (up to :data:`CHUNK_BYTES`) while reads
    are sequential, as in ``verify``'s scan.

    From a server that ignores ``Range`` (:class:`RangesIgnoredError`: said once, never
    retried) the ``.rec`` is read whole instead, through the cache: ``whole()`` (the store's
    fetch of the ``.rec``, pinned by the store) gives the path of its local copy, and every
    read is a ``pread`` of it."""

    def __init__(self, uri: str, remote: Remote, size: int, keys, offsets,
                 expected_count: Optional[int], idx_uri: str,
                 whole: Optional[Callable[[], str]] = None):
        self.path, self.idx_path = uri, idx_uri
        self._remote = remote
        self._whole = whole
        self._meta, self._stamp = None, (0, 0, int(size), 0)  # (the store holds both)
        self._init_index(keys, offsets, size, expected_count)
        self._ahead = threading.local()
        self._copy: PerProcess = PerProcess()  # the open local copy, once read whole

    def __getstate__(self):
        state = super().__getstate__()
        state["_ahead"] = None
        state["_copy"] = PerProcess()
        return state

    def __setstate__(self, state):
        state.pop("_copy_lock", None)  # (pickled by an older version)
        super().__setstate__(state)
        self._ahead = threading.local()
        if not isinstance(self._copy, PerProcess):  # (pickled by an older version)
            self._copy = PerProcess()

    def _fd(self) -> int:  # pragma: no cover - every read is overridden below
        raise RuntimeError("a remote record file has no descriptor")

    def close(self) -> None:
        copy = self._copy.clear()
        if copy is not None:
            copy.close()

    def _local_copy(self) -> int:
        """The descriptor of this process's local copy of the whole ``.rec`` (fetched into
        the cache on first use)."""
        return self._copy.get(self._open_copy).fileno()

    def _open_copy(self):
        if self._whole is None:
            raise RangesIgnoredError("the server ignores HTTP Range requests, and this "
                                     "reader has no cache to read the object whole through",
                                     self.path)
        return open(self._whole(), "rb")

    def _get(self, n: int, offset: int) -> bytes:
        n = max(0, min(n, self.file_size - offset))
        # (a copy opened in any process, this one or a parent: the server ignores ranges)
        if self._copy.owner is not None or self._remote.ranges_ignored(self.path):
            return os.pread(self._local_copy(), n, offset)
        try:
            return self._ranged(n, offset)
        except RangesIgnoredError:
            return os.pread(self._local_copy(), n, offset)

    def _ranged(self, n: int, offset: int) -> bytes:
        st = self._ahead
        buf, start = getattr(st, "buf", b""), getattr(st, "start", -1)
        if start <= offset and offset + n <= start + len(buf):
            return buf[offset - start:offset - start + n]
        sequential = start <= offset <= start + len(buf)
        ahead = min(CHUNK_BYTES, max(n, 2 * getattr(st, "ahead", 0))) if sequential else n
        end = min(self.file_size, offset + max(n, ahead))
        have = buf[offset - start:] if sequential else b""  # never fetch a byte twice
        data = have + (self._remote.cat(self.path, offset + len(have), end)
                       if end > offset + len(have) else b"")
        st.buf, st.start, st.ahead = data, offset, ahead
        return data[:n]

    def _pread(self, n: int, offset: int) -> bytes:
        return self._get(n, offset)

    def _readinto(self, view: memoryview, offset: int) -> int:
        data = self._get(len(view), offset)
        view[:len(data)] = data
        return len(data)


def load_remote_index(local_idx: str, uri: str):
    try:
        return read_index(local_idx)
    except FormatError as e:  # name the object, not the cache file
        raise FormatError(e.reason, uri, e.key, e.offset) from None


# the old layout's names (gluon_data.remote._RangedRecordFile, ._load_index: gluon_data/_moved.py)
_RangedRecordFile = RangedRecordFile
_load_index = load_remote_index
