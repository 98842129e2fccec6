"""``mxnet.recordio`` without MXNet: the same classes and functions, on numpy and OpenCV only.

Change one import and code written for ``mxnet.recordio`` (InsightFace's ``MXFaceDataset``,
im2rec-style scripts, your own loaders) runs on any Python with numpy 1 or 2, with or without
MXNet installed:

>>> from gluon_data import mx_recordio as recordio   # was: from mxnet import recordio
>>> record = recordio.MXIndexedRecordIO("train.idx", "train.rec", "r")
>>> header, img = recordio.unpack_img(record.read_idx(record.keys[0]))
>>> img.dtype, img.ndim
(dtype('uint8'), 3)
>>> record.close()

What it shares with ``mxnet.recordio`` 1.9.1: names, signatures, defaults and results.
:class:`MXRecordIO` and :class:`MXIndexedRecordIO` write files byte for byte like stock's
(dmlc-core framing, split records around the magic word, 4-byte padding, the ``key<TAB>offset``
index) and read stock's files identically; :func:`pack`, :func:`unpack`, :func:`pack_img` and
:func:`unpack_img` produce and accept the same bytes. The framing is
:func:`gluon_data.format.codec.frame` / :func:`~gluon_data.format.codec.unframe`, the index
parser :mod:`gluon_data.format.recindex`'s.

Where it differs, on purpose:

* Readers are safe to share. Every read is an ``os.pread`` at the record's offset on a
  descriptor opened in the calling process, so ``read_idx`` from many threads at once returns
  the right records, and a reader inherited through ``fork`` (or unpickled in a worker) reads
  correctly there, without the shared file position of stock's ``seek`` + ``read``.
  ``read()`` works in a forked child too (stock raises ``RuntimeError``); writing from a
  process other than the one that opened the writer still raises it.
* ``read_idx`` always returns its record. (Stock returns ``None`` for every ``read_idx`` once a
  sequential ``read()`` has reached the end of the file.)
* Bad input raises a typed error naming the file, the key and the offset, never garbage nor
  ``None``: :class:`~gluon_data.errors.CorruptRecordError` (a ``ValueError``) for a damaged or
  truncated ``.rec`` or an index entry that points past the data or inside a record,
  :class:`~gluon_data.errors.FormatError` for a bad ``.idx`` line, :class:`MissingKeyError` (a
  ``KeyError``, as stock raises) for an unknown key, :class:`~gluon_data.errors.DecodeError` where
  ``unpack_img`` would return ``None`` or a truncated image, and a payload whose IRHeader
  carries gluon_data's CRC-32 (in ``id2``) is checked by :func:`unpack`.
* ``tell()`` also works on readers (the position the next ``read()`` reads from), and on
  :class:`MXRecordIO` (stock has it on the indexed class only, for writers).
* Pickling a reader leaves it open and usable (stock closes it); the copy reopens the file, as
  stock's does. An open writer refuses to be pickled: stock's copy would reopen the file for
  writing and truncate it.
* ``uri`` is the path as a ``str`` (stock: a ``ctypes.c_char_p``); there is no ``handle``.
"""
from __future__ import annotations

import numbers
import os
import threading
from collections import namedtuple
from typing import Optional, Tuple

import cv2
import numpy as np

from .errors import CorruptRecordError, DecodeError, FormatError, GluonDataError
from .format import codec
from .format.recindex import _parse_index
from .storage.fileio import ProcessDescriptor, require_regular

__all__ = ["MXRecordIO", "MXIndexedRecordIO", "IRHeader", "pack", "unpack", "pack_img",
           "unpack_img", "MissingKeyError"]

# stock's module-level names, for code that reaches for them (``s[recordio._IR_SIZE:]``)
_IR_FORMAT = codec._IR.format
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

    def __str__(self):
        return self._message


def _as_bytes(buf, what: str) -> bytes:
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


def _write_all(f, data) -> None:
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
    >>> path = os.path.join(tempfile.mkdtemp(), "tmp.rec")
    >>> record = MXRecordIO(path, "w")
    >>> for i in range(3):
    ...     record.write(b"record_%d" % i)
    >>> record.close()
    >>> record = MXRecordIO(path, "r")
    >>> record.read(), record.read(), record.read(), record.read()
    (b'record_0', b'record_1', b'record_2', None)
    >>> record.close()
    """

    def __init__(self, uri, flag):
        self.is_open = False
        self.uri = os.fspath(uri)
        self.flag = flag
        self.pid = None
        self.writable = flag == "w"
        self._init_transient()
        self.open()

    def _init_transient(self) -> None:
        self._lock = threading.RLock()
        self._lock_pid = os.getpid()
        self._fd: Optional[ProcessDescriptor] = None
        self._stamp: Optional[Tuple[int, int]] = None
        self._out = None
        self._wbuf = bytearray()
        self._pos = 0
        self._ahead: Optional[Tuple[int, bytes]] = None
        self._sparse = False

    def _process_lock(self) -> threading.RLock:
        """The lock of this process (one held by another thread at a fork is not inherited)."""
        if self._lock_pid != os.getpid():
            self._lock, self._lock_pid = threading.RLock(), os.getpid()
        return self._lock

    # ------------------------------------------------------------------ open / close
    def open(self):
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
            self.pid = os.getpid()
            self.is_open = True

    def _check_opened(self, fd: int) -> None:
        """Each process's descriptor must be the file the reader opened first (a forked or
        pickled reader must not read a replacement through the old index)."""
        st = os.fstat(fd)
        if self._stamp is None:
            self._stamp = (st.st_dev, st.st_ino)
        elif self._stamp != (st.st_dev, st.st_ino):
            raise FormatError("the file was replaced after the reader opened it; open a new "
                              "reader to read the new file", self.uri)

    def close(self):
        """Closes the record file; a writer's buffered records are written first."""
        if not self.is_open:
            return
        with self._process_lock():
            if not self.is_open:
                return
            try:
                if self.writable:
                    try:
                        if self.pid == os.getpid():  # a forked copy never writes its parent's data
                            self._flush()
                    finally:
                        self._out.close()
                        self._out = None
                else:
                    self._fd.close()
            finally:
                self.is_open = False
                self.pid = None

    def __del__(self):
        if getattr(self, "is_open", False):
            self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def reset(self):
        """Resets the pointer to the first record; a writer truncates the file to empty.

        Examples
        --------
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "tmp.rec")
        >>> with MXRecordIO(path, "w") as w:
        ...     w.write(b"record_0"); w.write(b"record_1")
        >>> record = MXRecordIO(path, "r")
        >>> record.read(), record.read()
        (b'record_0', b'record_1')
        >>> record.reset()
        >>> record.read()
        b'record_0'
        """
        self.close()
        self.open()

    _TRANSIENT = ("_lock", "_lock_pid", "_fd", "_stamp", "_out", "_wbuf", "_pos", "_ahead",
                  "_sparse")

    def __getstate__(self):
        """Pickles the path and flag; the copy reopens the file (a reader from its start)."""
        if self.is_open and self.writable:
            raise TypeError("cannot pickle %s %r opened for writing: its copy would reopen the "
                            "file for writing and truncate it (mxnet.recordio does); close it "
                            "first" % (type(self).__name__, self.uri))
        return {k: v for k, v in self.__dict__.items() if k not in self._TRANSIENT}

    def __setstate__(self, d):
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
        if writing and self.pid != os.getpid():
            raise RuntimeError("Forbidden operation in multiple processes: %s was opened for "
                               "writing in process %s, write() was called in process %d "
                               "(a forked copy would interleave records)"
                               % (self.uri, self.pid, os.getpid()))

    # ------------------------------------------------------------------ writing
    def write(self, buf):
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
        data = _as_bytes(buf, "write()")
        try:
            return codec.frame(data)
        except FormatError as e:  # too big for RecordIO's 29-bit length
            raise FormatError(e.reason, self.uri, key, self._pos) from None

    def _flush(self) -> None:
        if self._wbuf:
            _write_all(self._out, self._wbuf)
            self._wbuf = bytearray()

    def tell(self):
        """The current position: a writer's size so far (where the next record goes), a
        reader's offset of the next :meth:`read`."""
        if not self.is_open:
            raise RuntimeError("tell() on %s, which is closed" % self.uri)
        return self._pos

    # ------------------------------------------------------------------ reading
    def read(self):
        """Returns the next record as ``bytes``, or ``None`` at the end of the file.

        Raises :class:`~gluon_data.errors.CorruptRecordError` (naming the file and the
        offset) where the bytes there are not a whole record.
        """
        self._require(False, "read")
        with self._process_lock():
            pos = self._pos
            fd = self._fd.fd()
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
            magic, lrec = codec._FRAME.unpack(head)
            if magic != codec.RECORDIO_MAGIC:
                target = min(a + 8, limit)  # unframe() reports the bad magic
                break
            length = lrec & codec._LEN_MASK
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

    def __repr__(self):
        return "<%s %r %r %s>" % (type(self).__name__, self.uri, self.flag,
                                  "open" if self.is_open else "closed")


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
    >>> d = tempfile.mkdtemp()
    >>> record = MXIndexedRecordIO(os.path.join(d, "tmp.idx"), os.path.join(d, "tmp.rec"), "w")
    >>> for i in range(5):
    ...     record.write_idx(i, b"record_%d" % i)
    >>> record.tell()
    80
    >>> record.close()
    >>> record = MXIndexedRecordIO(os.path.join(d, "tmp.idx"), os.path.join(d, "tmp.rec"), "r")
    >>> record.keys[:3], record.read_idx(3)
    ([0, 1, 2], b'record_3')
    """

    def __init__(self, idx_path, uri, flag, key_type=int):
        self.idx_path = os.fspath(idx_path)
        self.idx = {}
        self.keys = []
        self.key_type = key_type
        super().__init__(uri, flag)

    def _init_transient(self) -> None:
        super()._init_transient()
        self._fidx = None
        self._ibuf = []
        self._bounds: Optional[np.ndarray] = None
        self._offsets: Optional[np.ndarray] = None

    _TRANSIENT = MXRecordIO._TRANSIENT + ("_fidx", "_ibuf", "_bounds", "_offsets")

    def open(self):
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
            with open(self.idx_path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            raise FileNotFoundError("index file %s not found (the .idx of %s)"
                                    % (self.idx_path, self.uri)) from None
        if not raw.strip():
            return
        if self.key_type is int:
            keys, offsets = _parse_index(raw, self.idx_path)
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

    def close(self):
        """Closes the record file; a writer writes its buffered records and the ``.idx``."""
        if not self.is_open:
            return
        with self._process_lock():
            if not self.is_open:
                return
            mine = self.pid == os.getpid()
            try:
                super().close()  # the .rec first: the .idx never lists data that is not there
                if self._fidx is not None and mine:
                    self._flush_index()
            finally:
                if self._fidx is not None:
                    self._fidx.close()
                    self._fidx = None

    def __getstate__(self):
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
            _write_all(self._fidx, "".join(self._ibuf).encode("utf-8"))
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

    def seek(self, idx):
        """Sets the position of the next :meth:`read` to the record of key ``idx``."""
        self._require_reader("seek")
        self._pos = self._offset(idx, "seek")

    def _require_reader(self, what: str) -> None:
        if not self.is_open and not self.writable:
            self.reset()  # as stock does: a closed reader reopens to seek
        self._require(False, what)

    def tell(self):
        """The current position: a writer's size so far (the offset the next
        :meth:`write_idx` records), a reader's offset of the next :meth:`read`.

        Examples
        --------
        >>> import os, tempfile
        >>> d = tempfile.mkdtemp()
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
        """
        return super().tell()

    def read_idx(self, idx):
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
        fd = self._fd.fd()
        payload, used, _ = self._read_at(fd, pos, os.fstat(fd).st_size, idx)
        self._pos = pos + used
        return payload

    def write_idx(self, idx, buf):
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


IRHeader = namedtuple("HEADER", ["flag", "label", "id", "id2"])
"""The header of an image record (stock's ``IRHeader``, a namedtuple named ``HEADER``).

Parameters
----------
flag : int
    0 for a scalar label; the label vector's length otherwise (set by :func:`pack`).
label : float or numpy.ndarray
    The label: a number, or a 1-D float32 array.
id : int
    Usually the record's unique id.
id2 : int
    Higher bits of the id (0 in most cases; gluon_data's own records keep a CRC-32 here).
"""


def pack(header, s):
    """Packs a header and a byte string into an image record, as ``mx.recordio.pack``.

    Parameters
    ----------
    header : IRHeader
        ``header.label`` is a number (``flag`` becomes 0) or an array (``flag`` becomes its
        size and the float32 values follow the header).
    s : bytes
        The payload, usually encoded image bytes.

    Returns
    -------
    bytes
        The record.

    Examples
    --------
    >>> len(pack(IRHeader(0, 3, 7, 0), b"jpg"))          # 24-byte header, payload
    27
    >>> len(pack(IRHeader(0, [1, 2], 7, 0), b"jpg"))     # header, 2 float32 labels, payload
    35
    """
    header = IRHeader(*header)
    s = _as_bytes(s, "pack()")
    if isinstance(header.label, numbers.Number):
        header = header._replace(flag=0)
    else:
        label = np.asarray(header.label, dtype="<f4")
        header = header._replace(flag=label.size, label=0)
        s = label.tobytes() + s
    return codec._IR.pack(*header) + s


def unpack(s):
    """Splits an image record into its header and payload, as ``mx.recordio.unpack``.

    Parameters
    ----------
    s : bytes
        A record from :meth:`MXRecordIO.read` or :meth:`MXIndexedRecordIO.read_idx`.

    Returns
    -------
    header : IRHeader
        ``label`` is a float32 array of ``flag`` values when ``flag > 0``, else a float.
    s : bytes
        The payload after the header (and label vector).

    Raises
    ------
    gluon_data.errors.CorruptRecordError
        ``s`` is shorter than its header and label vector, or carries gluon_data's CRC-32 and
        does not match it.

    Examples
    --------
    >>> unpack(pack(IRHeader(0, 3, 7, 0), b"jpg"))
    (HEADER(flag=0, label=3.0, id=7, id2=0), b'jpg')
    >>> unpack(pack(IRHeader(0, [1, 2], 7, 0), b"jpg"))[0].label
    array([1., 2.], dtype=float32)
    """
    rec = codec.unpack(s, segmentation=False, verify=True)
    return IRHeader(rec.flag, rec.label, rec.id, rec.id2), rec.image


def _check_image_bytes(buf: bytes) -> None:
    """Bytes OpenCV would decode into garbage (or ``None``) without a word."""
    if not buf:
        raise DecodeError("empty image data")
    if buf[:2] == b"\xff\xd8":
        eoi = buf.rfind(b"\xff\xd9")
        if eoi < 0 or buf.find(b"\xff\xda", eoi) >= 0:
            raise DecodeError("truncated JPEG (%d bytes, no end-of-image marker after the last "
                              "scan)" % len(buf))
    elif buf[:8] == b"\x89PNG\r\n\x1a\n" and b"IEND" not in buf[-16:]:
        raise DecodeError("truncated PNG (%d bytes, no IEND chunk at the end)" % len(buf))


def unpack_img(s, iscolor=-1):
    """Unpacks an image record into its header and the decoded image, as
    ``mx.recordio.unpack_img``.

    Parameters
    ----------
    s : bytes
        A record.
    iscolor : int
        ``cv2.imdecode``'s flag: -1 as stored, 0 grey, 1 colour (BGR).

    Returns
    -------
    header : IRHeader
    img : numpy.ndarray
        The image, as ``cv2.imdecode`` returns it (BGR channel order).

    Raises
    ------
    gluon_data.errors.DecodeError
        The payload is empty, a truncated JPEG or PNG, or not an image (stock returns
        ``None`` or a partly grey image).
    """
    header, s = unpack(s)
    _check_image_bytes(s)
    img = cv2.imdecode(np.frombuffer(s, dtype=np.uint8), iscolor)
    if img is None:
        raise DecodeError("%d bytes (starting %r) are not an image OpenCV can decode"
                          % (len(s), s[:8]))
    return header, img


def pack_img(header, img, quality=95, img_fmt=".jpg"):
    """Encodes an image with OpenCV and packs it into a record, as ``mx.recordio.pack_img``.

    Parameters
    ----------
    header : IRHeader
    img : numpy.ndarray
        The image (BGR, as OpenCV reads it).
    quality : int
        JPEG quality (1-100) or PNG compression (0-9).
    img_fmt : str
        ``'.jpg'``/``'.jpeg'``, ``'.png'`` or another extension OpenCV encodes.

    Returns
    -------
    bytes
        The record.

    Examples
    --------
    >>> img = np.zeros((4, 4, 3), np.uint8)
    >>> header, out = unpack_img(pack_img(IRHeader(0, 1, 0, 0), img, img_fmt=".png"))
    >>> out.shape, header.label
    ((4, 4, 3), 1.0)
    """
    encode_params = None
    if img_fmt.upper() in (".JPG", ".JPEG"):
        encode_params = [cv2.IMWRITE_JPEG_QUALITY, quality]
    elif img_fmt.upper() == ".PNG":
        encode_params = [cv2.IMWRITE_PNG_COMPRESSION, quality]
    ret, buf = cv2.imencode(img_fmt, img, encode_params)
    if not ret:
        raise ValueError("failed to encode image as %s" % img_fmt)
    return pack(header, buf.tobytes())
