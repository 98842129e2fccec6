"""``MXRecordIO``: stock MXNet's sequential RecordIO reader and writer API over
gluon_data's one framing (:mod:`gluon_data.format.codec`) and per-process descriptors
(:class:`~gluon_data.storage.fileio.ProcessDescriptor`): byte-identical files, ``pread`` per
record, safe under threads and forked workers. Imported by users as
:mod:`gluon_data.mx_recordio` (which adds ``pack``/``unpack`` and the image helpers).
"""
from __future__ import annotations

import os
import threading
from typing import Any, BinaryIO, Dict, Optional, Tuple, Union, cast


from ..errors import CorruptRecordError, FormatError, GluonDataError
from ..format import codec
from ..format.headers import BytesLike
from ..storage.fileio import FILE_ID, ProcessDescriptor, require_regular, stat_stamp
from ..storage.perprocess import PerProcess

__all__ = ["MXRecordIO", "MissingKeyError", "as_bytes"]

# stock's module-level names, for code that reaches for them (``s[recordio._IR_SIZE:]``)
_IR_FORMAT = codec.IR_HEADER.format
_IR_SIZE = codec.IR_SIZE

#: Records whose extent (known from the index) is at most this big are read with one pread.
_EXACT_READ_MAX = 8 << 20
#: Otherwise the first read takes this much, and the rest of the record follows its headers.
_FIRST_READ = 64 << 10
#: Sequential ``read()`` fetches this much at a time.
_READ_AHEAD = 1 << 20
#: The writer hands the file this much at a time (and the index lines with it).
_WRITE_BUFFER = 1 << 20


class MissingKeyError(GluonDataError, KeyError):
    """A key that is not in the index: the ``KeyError`` stock raises (``args == (key,)``), with
    a message naming the key and the ``.idx``."""

    def __init__(self, reason: str, path: Optional[str] = None, key=None,
                 offset: Optional[int] = None):
        super().__init__(reason, path, key, offset)
        self._message = self.args[0]
        self.args = (key,)

    def __str__(self) -> str:
        return self._message


def as_bytes(buf: Any, what: str) -> bytes:
    """``buf`` as ``bytes``; a ``str`` or a non-buffer (an int would be taken as a size by
    ``bytes()``) is a ``TypeError``."""
    if isinstance(buf, bytes):
        return buf
    if isinstance(buf, str):
        raise TypeError("%s takes bytes, not str: encode the text first (buf.encode())" % what)
    try:
        return memoryview(buf).tobytes()
    except TypeError:
        raise TypeError("%s takes bytes or another buffer, not %s" % (what, type(buf).__name__)) \
            from None


def _pread_full(fd: int, n: int, offset: int) -> bytes:
    """``n`` bytes at ``offset``, fewer only where the file ends."""
    out = os.pread(fd, n, offset)
    if len(out) == n or not out:
        return out
    parts = [out]
    got = len(out)
    while got < n:
        more = os.pread(fd, n - got, offset + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def write_all(f: Any, data: BytesLike) -> None:
    mv = memoryview(data)
    while mv:
        mv = mv[f.write(mv):]


class MXRecordIO:
    """Reads/writes a RecordIO file sequentially; ``mxnet.recordio.MXRecordIO`` without MXNet.

    Parameters
    ----------
    uri : str or os.PathLike
        Path to the record file.
    flag : str
        ``'w'`` for write (the file is created or truncated) or ``'r'`` for read.

    Notes
    -----
    Writes are buffered and reach the file by :meth:`close` (or every megabyte). A reader
    reads with ``os.pread`` on a descriptor of its own process: share it between threads,
    fork it, pickle it.

    Examples
    --------
    >>> import os, tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = os.path.join(tmp.name, "tmp.rec")
    >>> record = MXRecordIO(path, "w")
    >>> for i in range(3):
    ...     record.write(b"record_%d" % i)
    >>> record.close()
    >>> record = MXRecordIO(path, "r")
    >>> record.read(), record.read(), record.read(), record.read()
    (b'record_0', b'record_1', b'record_2', None)
    >>> record.close()
    >>> tmp.cleanup()
    """

    def __init__(self, uri: Union[str, "os.PathLike[str]"], flag: str) -> None:
        self.is_open = False
        self.uri = os.fspath(uri)
        self.flag = flag
        self.writable = flag == "w"
        self._init_transient()
        self.open()

    def _init_transient(self) -> None:
        # opened by this process: holds the flag it was opened with (a forked copy is not)
        self._opened: PerProcess[str] = PerProcess()
        self._fd: Optional[ProcessDescriptor] = None
        self._stamp: Optional[Tuple[int, ...]] = None
        self._out: Optional[BinaryIO] = None
        self._wbuf = bytearray()
        self._pos = 0
        self._ahead: Optional[Tuple[int, bytes]] = None
        self._sparse = False

    def _process_lock(self) -> threading.RLock:
        """The lock of this process (one held by another thread at a fork is not inherited)."""
        return self._opened.lock()

    @property
    def pid(self) -> Optional[int]:
        """The id of the process that opened the file (stock's attribute); ``None`` when
        closed."""
        return self._opened.owner if self.is_open else None

    # ------------------------------------------------------------------ open / close
    def open(self) -> None:
        """Opens the record file (``'w'``: creates or truncates it)."""
        if self.flag not in ("r", "w"):
            raise ValueError("Invalid flag %s" % self.flag)
        if self.is_open:
            self.close()
        with self._process_lock():
            self._pos, self._ahead, self._sparse = 0, None, False
            if self.flag == "w":
                self._wbuf = bytearray()
                self._out = open(self.uri, "wb", buffering=0)
                self.writable = True
            else:
                require_regular(self.uri)
                self._stamp = None
                self._fd = ProcessDescriptor(self.uri, self._check_opened)
                self._fd.get()  # a missing file fails here, as stock's open does
                self.writable = False
            self._opened.set(self.flag)
            self.is_open = True

    def _check_opened(self, fd: int) -> None:
        """Each process's descriptor must be the file the reader opened first (a forked or
        pickled reader must not read a replacement through the old index)."""
        st = os.fstat(fd)
        if self._stamp is None:
            self._stamp = stat_stamp(st, FILE_ID)
        elif self._stamp != stat_stamp(st, FILE_ID):
            raise FormatError("the file was replaced after the reader opened it; open a new "
                              "reader to read the new file", self.uri)

    def close(self) -> None:
        """Closes the record file; a writer's buffered records are written first."""
        if not self.is_open:
            return
        with self._process_lock():
            if not self.is_open:
                return
            try:
                if self.writable:
                    try:
                        if self._opened.mine():  # a forked copy never writes its parent's data
                            self._flush()
                    finally:
                        cast(BinaryIO, self._out).close()  # (open for writing: a file)
                        self._out = None
                else:
                    cast(ProcessDescriptor, self._fd).close()  # (open for reading)
            finally:
                self.is_open = False
                self._opened.clear()

    def __del__(self) -> None:
        if getattr(self, "is_open", False):
            self.close()

    def __enter__(self) -> "MXRecordIO":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def reset(self) -> None:
        """Resets the pointer to the first record; a writer truncates the file to empty.

        Examples
        --------
        >>> import os, tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> path = os.path.join(tmp.name, "tmp.rec")
        >>> with MXRecordIO(path, "w") as w:
        ...     w.write(b"record_0"); w.write(b"record_1")
        >>> record = MXRecordIO(path, "r")
        >>> record.read(), record.read()
        (b'record_0', b'record_1')
        >>> record.reset()
        >>> record.read()
        b'record_0'
        >>> record.close()
        >>> tmp.cleanup()
        """
        self.close()
        self.open()

    _TRANSIENT: Tuple[str, ...] = ("_opened", "_fd", "_stamp", "_out", "_wbuf", "_pos",
                                   "_ahead", "_sparse")

    def __getstate__(self) -> Dict[str, Any]:
        """Pickles the path and flag; the copy reopens the file (a reader from its start)."""
        if self.is_open and self.writable:
            raise TypeError("cannot pickle %s %r opened for writing: its copy would reopen the "
                            "file for writing and truncate it (mxnet.recordio does); close it "
                            "first" % (type(self).__name__, self.uri))
        return {k: v for k, v in self.__dict__.items() if k not in self._TRANSIENT}

    def __setstate__(self, d: Dict[str, Any]) -> None:
        d = {k: v for k, v in d.items()
             if k not in ("pid", "_lock", "_lock_pid")}  # (pickled by an older version)
        self.__dict__.update(d)
        self._init_transient()
        is_open, self.is_open = d["is_open"], False
        if is_open:
            self.open()

    # ------------------------------------------------------------------ checks
    def _require(self, writing: bool, what: str) -> None:
        if writing != self.writable:
            raise AssertionError("%s() on %s, which was opened for %s" % (
                what, self.uri, "writing" if self.writable else "reading"))
        if not self.is_open:
            raise RuntimeError("%s() on %s, which is closed: call open() or reset() first"
                               % (what, self.uri))
        if writing and not self._opened.mine():
            raise RuntimeError("Forbidden operation in multiple processes: %s was opened for "
                               "writing in process %s, write() was called in another process "
                               "(a forked copy would interleave records)"
                               % (self.uri, self.pid))

    # ------------------------------------------------------------------ writing
    def write(self, buf: BytesLike) -> None:
        """Appends ``buf`` as one record.

        Parameters
        ----------
        buf : bytes
            The payload (any object with the buffer protocol; not ``str``).
        """
        self._require(True, "write")
        chunks = self._frame(buf)
        with self._process_lock():
            for c in chunks:
                self._wbuf += c
                self._pos += len(c)
            if len(self._wbuf) >= _WRITE_BUFFER:
                self._flush()

    def _frame(self, buf, key=None):
        data = as_bytes(buf, "write()")
        try:
            return codec.frame(data)
        except FormatError as e:  # too big for RecordIO's 29-bit length
            raise FormatError(e.reason, self.uri, key, self._pos) from None

    def _flush(self) -> None:
        if self._wbuf:
            write_all(self._out, self._wbuf)
            self._wbuf = bytearray()

    def tell(self) -> int:
        """The current position: a writer's size so far (where the next record goes), a
        reader's offset of the next :meth:`read`."""
        if not self.is_open:
            raise RuntimeError("tell() on %s, which is closed" % self.uri)
        return self._pos

    # ------------------------------------------------------------------ reading
    def read(self) -> Optional[bytes]:
        """Returns the next record as ``bytes``, or ``None`` at the end of the file.

        Raises :class:`~gluon_data.errors.CorruptRecordError` (naming the file and the
        offset) where the bytes there are not a whole record.
        """
        self._require(False, "read")
        with self._process_lock():
            pos = self._pos
            fd = cast(ProcessDescriptor, self._fd).fd()  # (a reader: _require said so)
            size = os.fstat(fd).st_size
            if pos == size:
                return None
            ahead = None
            if self._ahead is not None:  # what the last read() fetched beyond its record
                off, chunk = self._ahead
                if off <= pos < off + len(chunk):
                    ahead = memoryview(chunk)[pos - off:]
            try:
                payload, used, chunk = self._read_at(fd, pos, size, None, ahead, _READ_AHEAD)
            except CorruptRecordError as e:  # name the key, if the index has one here
                key = self._key_at(pos)
                if key is None:
                    raise
                raise CorruptRecordError(e.reason, e.path, key, e.offset) from None
            self._ahead = (pos, chunk)
            self._pos = pos + used
        return payload

    def _limit(self, pos: int, size: int) -> Tuple[int, bool]:
        """``(where the record at pos must end at the latest, whether it likely ends there)``."""
        return size, False

    def _key_at(self, pos: int):
        """The key of the record at ``pos``, for messages (``None``: not indexed)."""
        return None

    def _read_at(self, fd: int, pos: int, size: int, key, buf=None, first=None):
        """``(payload, bytes used, bytes read from pos)`` of the record framed at ``pos``.

        Its bytes are fetched with as few preads as its extent allows (``buf``: bytes from
        ``pos`` known already; ``first``: how much to read ahead when there are none), then
        unframed by :func:`codec.unframe`, which names what is wrong with them.
        """
        if not 0 <= pos < size:
            raise CorruptRecordError(
                "offset lies %s (the file holds %d bytes): the index points %s (the .rec cut "
                "short, or the index of another file?)"
                % ("before the start of the file" if pos < 0 else "at or past its end", size,
                   "before the data" if pos < 0 else "past the data"), self.uri, key, pos)
        limit, exact = self._limit(pos, size)
        if buf is None:
            if first is not None:
                want = min(size - pos, max(first, limit - pos if exact and
                                           limit - pos <= _EXACT_READ_MAX else 0))
            elif exact and limit - pos <= _EXACT_READ_MAX and not self._sparse:
                want = limit - pos
            else:
                want = min(limit - pos, _FIRST_READ)
            buf = _pread_full(fd, want, pos)
        # follow the part headers to the record's end, reading what the first read missed
        a, target = pos, None
        while target is None:
            r = a - pos
            head = buf[r:r + 8] if r + 8 <= len(buf) else _pread_full(fd, 8, a)
            if len(head) < 8:
                target = min(a + len(head), limit)  # unframe() reports the truncated header
                break
            magic, lrec = codec.FRAME_HEADER.unpack(head)
            if magic != codec.RECORDIO_MAGIC:
                target = min(a + 8, limit)  # unframe() reports the bad magic
                break
            length = lrec & codec.LENGTH_MASK
            if a + 8 + length > limit:
                if limit < size:
                    raise CorruptRecordError(
                        "the record's length field announces %d bytes, which run past the "
                        "next indexed record at offset %d: a damaged length field, or an "
                        "index entry pointing inside a record" % (length, limit),
                        self.uri, key, a)
                raise CorruptRecordError(
                    "truncated record: %d payload bytes announced, %d present (the file cut "
                    "short?)" % (length, size - a - 8), self.uri, key, a)
            a += 8 + length + (-length) % 4
            if lrec >> 29 not in (1, 2):
                target = min(a, limit)
        if target > pos + len(buf):
            buf = bytes(buf) + _pread_full(fd, target - pos - len(buf), pos + len(buf))
        payload, used = codec.unframe(buf, 0, path=self.uri, key=key, base_offset=pos)
        if first is None and exact and len(buf) > _FIRST_READ and 2 * used < len(buf):
            self._sparse = True  # the index lists a subset: stop reading up to the next entry
        return payload, used, buf

    def __repr__(self) -> str:
        return "<%s %r %r %s>" % (type(self).__name__, self.uri, self.flag,
                                  "open" if self.is_open else "closed")
