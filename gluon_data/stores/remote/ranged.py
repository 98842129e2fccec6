"""Ranged reads of a remote ``.rec`` (inspection reads fetch only the bytes they need)."""
from __future__ import annotations

import threading
from typing import Optional


from ...errors import FormatError
from ..recordio import RecordFile, read_index
from ...storage.remotefs import CHUNK_BYTES, _Remote


# --------------------------------------------------------------------------- reading
class _RangedRecordFile(RecordFile):
    """A :class:`RecordFile` whose data bytes come from ranged GETs of a remote ``.rec``:
    one GET per record read, growing read-ahead (up to :data:`CHUNK_BYTES`) while reads
    are sequential, as in ``verify``'s scan."""

    def __init__(self, uri: str, remote: _Remote, size: int, keys, offsets,
                 expected_count: Optional[int], idx_uri: str):
        self.path, self.idx_path = uri, idx_uri
        self._remote = remote
        self._meta, self._stamp = None, (0, 0, int(size), 0)  # (the store holds both)
        self._init_index(keys, offsets, size, expected_count)
        self._ahead = threading.local()

    def __getstate__(self):
        state = super().__getstate__()
        state["_ahead"] = None
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self._ahead = threading.local()

    def _fd(self) -> int:  # pragma: no cover - every read is overridden below
        raise RuntimeError("a remote record file has no descriptor")

    def close(self) -> None:
        pass

    def _get(self, n: int, offset: int) -> bytes:
        n = max(0, min(n, self.file_size - offset))
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


def _load_index(local_idx: str, uri: str):
    try:
        return read_index(local_idx)
    except FormatError as e:  # name the object, not the cache file
        raise FormatError(e.reason, uri, e.key, e.offset) from None
