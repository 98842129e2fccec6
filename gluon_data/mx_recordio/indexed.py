"""``MXIndexedRecordIO``: stock MXNet's indexed RecordIO (a ``.rec`` with its
``key<TAB>offset`` ``.idx``) over :class:`~gluon_data.mx_recordio.sequential.MXRecordIO`:
``read_idx`` is one ``pread`` at the indexed offset, safe from many threads and in forked
workers. Imported by users as :mod:`gluon_data.mx_recordio`.
"""
from __future__ import annotations

import os
from typing import Any, BinaryIO, Callable, Dict, List, Optional, Tuple, Union, cast

import numpy as np

from ..errors import FormatError
from ..format.headers import BytesLike
from ..format.textindex import parse_index
from ..storage.fileio import ProcessDescriptor, read_input
from .sequential import MissingKeyError, MXRecordIO, write_all

__all__ = ["MXIndexedRecordIO"]


class MXIndexedRecordIO(MXRecordIO):
    """Reads/writes a RecordIO file with its ``.idx``, for random access by key;
    ``mxnet.recordio.MXIndexedRecordIO`` without MXNet.

    Parameters
    ----------
    idx_path : str or os.PathLike
        Path to the index file (``key<TAB>offset`` lines); written on :meth:`close` in
        ``'w'`` mode.
    uri : str or os.PathLike
        Path to the record file.
    flag : str
        ``'w'`` for write or ``'r'`` for read.
    key_type : type
        Type of the keys (``int`` by default); ``key_type(text)`` parses one.

    Attributes
    ----------
    keys : list
        The keys in index order.
    idx : dict
        Key -> offset of its record in the ``.rec``.

    Examples
    --------
    >>> import os, tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> d = tmp.name
    >>> record = MXIndexedRecordIO(os.path.join(d, "tmp.idx"), os.path.join(d, "tmp.rec"), "w")
    >>> for i in range(5):
    ...     record.write_idx(i, b"record_%d" % i)
    >>> record.tell()
    80
    >>> record.close()
    >>> record = MXIndexedRecordIO(os.path.join(d, "tmp.idx"), os.path.join(d, "tmp.rec"), "r")
    >>> record.keys[:3], record.read_idx(3)
    ([0, 1, 2], b'record_3')
    >>> record.close()
    >>> tmp.cleanup()
    """

    def __init__(self, idx_path: Union[str, "os.PathLike[str]"],
                 uri: Union[str, "os.PathLike[str]"], flag: str,
                 key_type: Callable[[Any], Any] = int) -> None:
        self.idx_path = os.fspath(idx_path)
        self.idx: Dict[Any, int] = {}
        self.keys: List[Any] = []
        self.key_type = key_type
        super().__init__(uri, flag)

    def _init_transient(self) -> None:
        super()._init_transient()
        self._fidx: Optional[BinaryIO] = None
        self._ibuf: List[str] = []  # index lines not yet written
        self._bounds: Optional[np.ndarray] = None
        self._offsets: Optional[np.ndarray] = None

    _TRANSIENT = MXRecordIO._TRANSIENT + ("_fidx", "_ibuf", "_bounds", "_offsets")

    def open(self) -> None:
        super().open()
        with self._process_lock():
            self.idx = {}
            self.keys = []
            self._bounds = self._offsets = None
            try:
                if self.writable:
                    self._ibuf = []
                    self._fidx = open(self.idx_path, "wb", buffering=0)
                else:
                    self._read_index()
            except BaseException:
                super().close()
                raise

    def _read_index(self) -> None:
        try:
            raw = read_input(self.idx_path)
        except FileNotFoundError:
            raise FileNotFoundError("index file %s not found (the .idx of %s)"
                                    % (self.idx_path, self.uri)) from None
        if not raw.strip():
            return
        if self.key_type is int:
            keys, offsets = parse_index(raw, self.idx_path, wide_keys=True)
            self.keys = keys.tolist()
            self.idx = dict(zip(self.keys, offsets.tolist()))
            self._offsets = offsets
            return
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise FormatError("not UTF-8 text (%s)" % e, self.idx_path) from None
        for lineno, line in enumerate(text.splitlines(), 1):
            fields = line.strip().split("\t")
            if fields == [""]:
                continue
            try:
                if len(fields) != 2:
                    raise ValueError("expected 'key<TAB>offset', found %d fields" % len(fields))
                key = self.key_type(fields[0])
                self.idx[key] = int(fields[1])
            except ValueError as e:
                raise FormatError("line %d (%r): %s" % (lineno, line[:80], e),
                                  self.idx_path) from None
            self.keys.append(key)

    def close(self) -> None:
        """Closes the record file; a writer writes its buffered records and the ``.idx``."""
        if not self.is_open:
            return
        with self._process_lock():
            if not self.is_open:
                return
            mine = self._opened.mine()
            try:
                super().close()  # the .rec first: the .idx never lists data that is not there
                if self._fidx is not None and mine:
                    self._flush_index()
            finally:
                if self._fidx is not None:
                    self._fidx.close()
                    self._fidx = None

    def __getstate__(self) -> Dict[str, Any]:
        d = super().__getstate__()
        if self.is_open:  # the copy's open() reads the index again
            d["idx"], d["keys"] = {}, []
        return d

    def _flush(self) -> None:
        super()._flush()
        if self._fidx is not None:
            self._flush_index()

    def _flush_index(self) -> None:
        if self._ibuf:
            write_all(self._fidx, "".join(self._ibuf).encode("utf-8"))
            self._ibuf = []

    def _offset(self, idx, what: str) -> int:
        try:
            return self.idx[idx]
        except KeyError:
            raise MissingKeyError("%s(%r): no such key in the index (%d keys%s)"
                                  % (what, idx, len(self.keys), ", %r .. %r" % (
                                      self.keys[0], self.keys[-1]) if self.keys else ""),
                                  self.idx_path, idx) from None

    def _sorted_offsets(self) -> np.ndarray:
        bounds = self._bounds
        if bounds is None:
            offsets = self._offsets
            if offsets is None or len(offsets) != len(self.keys):
                offsets = np.fromiter(self.idx.values(), np.int64, len(self.idx))
            bounds = self._bounds = np.unique(offsets)
        return bounds

    def _limit(self, pos: int, size: int) -> Tuple[int, bool]:
        """The next indexed offset after ``pos`` (records never overlap one), else the end
        of the file; records written in index order end exactly there."""
        bounds = self._sorted_offsets()
        i = int(np.searchsorted(bounds, pos, side="right"))
        return (min(int(bounds[i]), size) if i < len(bounds) else size), True

    def _key_at(self, pos: int):  # only when an error is raised: a scan of the index
        for key, off in self.idx.items():
            if off == pos:
                return key
        return None

    def seek(self, idx: Any) -> None:
        """Sets the position of the next :meth:`read` to the record of key ``idx``."""
        self._require_reader("seek")
        self._pos = self._offset(idx, "seek")

    def _require_reader(self, what: str) -> None:
        if not self.is_open and not self.writable:
            self.reset()  # as stock does: a closed reader reopens to seek
        self._require(False, what)

    def tell(self) -> int:
        """The current position: a writer's size so far (the offset the next
        :meth:`write_idx` records), a reader's offset of the next :meth:`read`.

        Examples
        --------
        >>> import os, tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> d = tmp.name
        >>> record = MXIndexedRecordIO(os.path.join(d, "a.idx"), os.path.join(d, "a.rec"), "w")
        >>> record.tell()
        0
        >>> for i in range(3):
        ...     record.write_idx(i, b"record_%d" % i)
        ...     print(record.tell())
        16
        32
        48
        >>> record.close()
        >>> tmp.cleanup()
        """
        return super().tell()

    def read_idx(self, idx: Any) -> bytes:
        """Returns the record of key ``idx``.

        Safe to call from many threads at once, and in forked or spawned workers: one
        ``os.pread`` at the record's offset, no shared file position. A later :meth:`read`
        continues after this record, as stock's does.

        Raises
        ------
        MissingKeyError
            ``idx`` is not in the index (a ``KeyError``).
        gluon_data.errors.CorruptRecordError
            The bytes at the record's offset are not a whole record (names the ``.rec``, the
            key and the offset).
        """
        self._require_reader("read_idx")
        pos = self._offset(idx, "read_idx")
        fd = cast(ProcessDescriptor, self._fd).fd()  # (a reader: _require_reader said so)
        payload, used, _ = self._read_at(fd, pos, os.fstat(fd).st_size, idx)
        self._pos = pos + used
        return payload

    def write_idx(self, idx: Any, buf: BytesLike) -> None:
        """Appends ``buf`` as the record of key ``idx`` (``key_type(idx)``).

        Parameters
        ----------
        idx : int
            The record's key.
        buf : bytes
            The record.
        """
        key = self.key_type(idx)
        self._require(True, "write_idx")
        with self._process_lock():
            pos = self._pos
            self.write(buf)
            self._ibuf.append("%s\t%d\n" % (str(key), pos))
            self.idx[key] = pos
            self.keys.append(key)
