"""RecordIO container: ``.rec`` + ``.idx`` files in MXNet's format, bytes in and bytes out.

:class:`RecordFile` reads by offset with ``os.pread`` on a descriptor opened lazily in each
process, so one instance is safe to share between threads (``DataLoader(thread_pool=True)``),
to inherit across ``fork`` and to pickle (``spawn``: the location and stamps, never the index).
Its index (:mod:`gluon_data.format.recindex`: the ``.gdx`` mapped read-only, or the text parsed) is
validated on open against the data file, in O(1) when the binary copy recorded it clean.
:class:`RecordWriter` (:mod:`gluon_data.stores.recwriter`) and the index functions stay importable
from here.
"""
from __future__ import annotations

import errno
import operator
import os
import threading
from typing import Any, Callable, Iterator, Optional, Sequence, Tuple, Union, cast

import numpy as np

from ..format import codec
from ..errors import FormatError
from ..storage.fileio import ProcessDescriptor, advise_willneed
from ..storage.fileio import require_regular as _require_regular
from ..format.layout import missing_rec_hint
from ..format.meta import read_meta
from ..format.recindex import (  # noqa: F401  (the index names stay importable from here)
    BINARY_INDEX_SUFFIX, GDX_CLEAN, GDX_FILE_ORDER, GDX_KEYS_SORTED, GDX_SEQUENTIAL_KEYS,
    binary_index_problem, file_stamp, idx_path_for, index_cache_path, index_facts, load_index,
    read_index, write_binary_index)
from .recwriter import RecordWriter
from .base import RecordStore, is_uri, register_opener, valid_positions
from .recscan import scan_payloads

__all__ = ["RecordFile", "RecordWriter", "read_index", "idx_path_for", "advise_willneed"]

_LARGE_EXTENT = 64 << 20  # read records bigger than this header-first, not in one pread
_SCRATCH_MAX = 8 << 20    # records up to this size are read into a reused per-thread buffer
# One scratch buffer per thread, shared by every RecordFile: a thousand open datasets cost a
# thousand small objects, not a thousand 1 MB buffers.
_SCRATCH = threading.local()
_UNREAD = object()


class RecordFile:
    """Random-access reader of one ``.rec``/``.idx`` pair; a
    :class:`~gluon_data.stores.base.RecordStore` (``split`` is ``None``: a ``.rec`` holds one).

    Parameters
    ----------
    path : str
        The ``.rec`` file.
    idx_path : str, optional
        Its index; by default the ``.rec`` path with an ``.idx`` suffix.
    expected_count : int, optional
        Record count promised by metadata; a shorter or longer index is an error
        (an interrupted writer leaves an index shorter than the data).
    meta : dict or None, optional
        The dataset's metadata if the caller has read it; by default the ``.meta.json``
        beside the file is read on first use of :attr:`meta`.

    The ``.rec`` is stamped when opened (device, inode, size, mtime): every later open of
    its descriptor (in a forked or spawned worker, after unpickling) compares the stamp and
    raises :class:`FormatError` if the file was replaced or rewritten meanwhile, instead of
    reading the new file's bytes through the old index.

    Examples
    --------
    >>> f = RecordFile("voc_train.rec")
    >>> payload = f.read(0)                        # bytes of record 0 in index order
    >>> payload == bytes(next(iter(f.scan()))), f.split, f.key(0)
    (True, None, 0)
    """

    split: Optional[str] = None

    def __init__(self, path: str, idx_path: Optional[str] = None, *,
                 expected_count: Optional[int] = None, meta: Any = _UNREAD) -> None:
        self.path = os.fspath(path)
        self.idx_path = os.fspath(idx_path) if idx_path else idx_path_for(self.path)
        # the input-kind rule, before anything is opened (a missing .rec: said so, with a hint)
        if _require_regular(self.path) is None:
            raise _not_found(self.path)
        self._meta = meta
        _require_regular(self.idx_path)
        index = load_index(self.idx_path)
        st = os.stat(self.path)
        self._stamp = file_stamp(st)
        self._idx_stamp = index.stamp
        self._init_index(index.keys, index.offsets, st.st_size, expected_count, index.flags,
                         index.max_offset)
        self._reload = True  # a pickle carries no index: the copy loads (maps) it again
        try:
            self._check_tail()
        finally:
            self.close()  # opened again on the first read: an idle reader holds no descriptor

    _reload = False  # whether pickles leave the index out (reloaded from ``idx_path``)
    _INDEX_STATE = ("_keys", "_offsets", "_ends", "_key_order")
    _VIEWS = ("_off", "_endv", "_keyv")  # memoryviews of the arrays: rebuilt, never pickled

    def _init_index(self, keys, offsets, file_size: int, expected_count,
                    flags: Optional[int] = None, max_offset: int = 0) -> None:
        """Validate the index against a data file of ``file_size`` bytes and derive what
        reading needs (also used by readers of remote objects). ``flags`` and ``max_offset``
        are what a version-3 binary copy recorded: a clean index is then checked in O(1)
        (its largest offset against the file size), not scanned; otherwise every entry is.

        Nothing per record is derived or copied for an index in file order (every one we
        write, and im2rec's): a record ends where the next begins (the last at the end of
        the file), so a mapped index stays the page cache's one shared copy."""
        self.file_size = file_size
        n = len(offsets)
        if flags is None or not flags & GDX_CLEAN or max_offset + 8 > file_size:
            if keys is None:
                keys = np.arange(n)
            self._validate(keys, offsets, expected_count)
            flags = index_facts(keys, offsets)[0]
        else:
            self._check_count(n, expected_count)
        self._keys = None if flags & GDX_SEQUENTIAL_KEYS else keys
        self._keys_sorted = bool(flags & GDX_KEYS_SORTED)
        self._offsets = offsets
        self._in_file_order = bool(flags & GDX_FILE_ORDER)
        self._ends = None
        if not self._in_file_order:  # stock files only: one private array of record ends
            uniq = np.unique(offsets)
            bounds = np.append(uniq, self.file_size)
            self._ends = bounds[np.searchsorted(uniq, offsets, side="right")]
        self._key_order: Optional[np.ndarray] = None
        self._file = ProcessDescriptor(self.path, self._check_opened)
        self._lock = threading.Lock()
        self._bind()

    def _bind(self) -> None:
        """Integer views of the index for the per-record path (indexing a ``memoryview``
        gives a Python int, without numpy's scalar boxing)."""
        self._n = len(self._offsets)
        self._off = _int_view(self._offsets)
        self._endv = None if self._ends is None else _int_view(self._ends)
        self._keyv = None if self._keys is None else _int_view(self._keys)

    # -- validation -------------------------------------------------------------------
    def _validate(self, keys, offsets, expected_count):
        def fail(i, reason):
            raise FormatError("%s (line %d of the index)" % (reason, i + 1), self.idx_path,
                              int(keys[i]), int(offsets[i]))

        bad = np.flatnonzero(offsets < 0)
        if bad.size:
            fail(bad[0], "negative offset")
        bad = np.flatnonzero(offsets % 4)
        if bad.size:
            fail(bad[0], "offset not a multiple of 4: records start on 4-byte boundaries")
        bad = np.flatnonzero(offsets + 8 > self.file_size)
        if bad.size:
            fail(bad[0], "offset past the end of %s (%d bytes): the .rec is truncated or the "
                 "index belongs to another file" % (self.path, self.file_size))
        if not (keys.size > 1 and (keys[1:] > keys[:-1]).all()):  # sorted: no duplicates
            uniq, counts = np.unique(keys, return_counts=True)
            if uniq.size != keys.size:
                dup = uniq[counts > 1][0]
                i = int(np.flatnonzero(keys == dup)[1])
                fail(i, "duplicate key %d" % dup)
        if not (offsets.size > 1 and (offsets[1:] > offsets[:-1]).all()):
            order = np.argsort(offsets, kind="stable")
            same = np.flatnonzero(offsets[order][1:] == offsets[order][:-1])
            if same.size:  # two keys, one record: one read twice, another lost
                a, b = int(order[same[0]]), int(order[same[0] + 1])
                fail(b, "offset %d is listed twice (keys %d and %d): the index is damaged; "
                     "rebuild it with gluon-data salvage" % (offsets[b], keys[a], keys[b]))
        self._check_count(keys.size, expected_count)

    def _check_count(self, n: int, expected_count: Optional[int]) -> None:
        if expected_count is not None and n != expected_count:
            raise FormatError(
                "index lists %d records but the metadata promises %d: the conversion was "
                "interrupted or the files are mismatched; re-convert the dataset"
                % (n, expected_count), self.idx_path)

    def _check_tail(self):
        """The record at the largest offset must end exactly at the end of the file."""
        last = len(self) - 1 if self._in_file_order else int(np.argmax(self._offsets))
        start, end = self.extent(last)
        if end - start > _LARGE_EXTENT:
            return
        buf = self._pread(end - start, start)
        _, used = codec.unframe(buf, 0, path=self.path, key=self.key(last), base_offset=start)
        if used != len(buf):
            raise FormatError(
                "%d bytes of data follow the last indexed record: the .idx is shorter than the "
                ".rec (an interrupted writer?); rebuild the index or re-convert"
                % (len(buf) - used), self.idx_path, self.key(last), start + used)

    # -- store protocol ---------------------------------------------------------------
    @property
    def location(self) -> str:
        return self.path

    @property
    def meta(self) -> Optional[dict]:
        """The ``.meta.json`` beside the file (``None`` for a stock im2rec file)."""
        if self._meta is _UNREAD:
            self._meta = read_meta(self.path)
        return self._meta

    def identity(self) -> str:
        """``conversion_id`` from the metadata (``-`` without one) and the stamp of the
        ``.rec`` when it was opened: ``id/device:inode:size:mtime_ns``."""
        meta = self.meta
        cid = (meta or {}).get("conversion_id") or "-"
        return "%s/%s" % (cid, "%d:%d:%d:%d" % self._stamp)

    # -- process-local descriptor -----------------------------------------------------
    def _check_opened(self, fd: int) -> None:
        """A descriptor opened in this process still names the file the index describes."""
        stamp = file_stamp(os.fstat(fd))
        if stamp != self._stamp:
            raise self._replaced(self.path, self._stamp, stamp)

    def _fd(self) -> int:
        return self._file.fd()

    def _pread(self, n: int, offset: int) -> bytes:
        return os.pread(self._fd(), n, offset)

    def _readinto(self, view: memoryview, offset: int) -> int:
        """Fill ``view`` from ``offset``; return the bytes read (fewer at the end of file).
        Every read of the data goes through here and :meth:`_pread`."""
        return os.preadv(self._fd(), [view], offset)

    def _pread_scratch(self, n: int, offset: int) -> memoryview:
        """``n`` bytes at ``offset`` in this thread's reused buffer (valid until its next
        read). A fresh ``bytes`` per read costs more than the copy: the allocator hands the
        memory back to the kernel between reads and every page faults in again."""
        buf = getattr(_SCRATCH, "buf", None)
        if buf is None or len(buf) < n:
            buf = _SCRATCH.buf = bytearray(max(n, 1 << 20))
        view = memoryview(buf)[:n]
        return view[:self._readinto(view, offset)]

    def close(self) -> None:
        self._file.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __getstate__(self):
        """The location, stamps and metadata; the index only where it cannot be loaded
        again from ``idx_path`` (a remote reader's): a worker maps the binary index itself
        instead of unpickling a private copy of it."""
        state = self.__dict__.copy()
        state["_lock"] = None
        for name in self._VIEWS:
            state.pop(name, None)
        if self._reload:
            for name in self._INDEX_STATE:
                state.pop(name, None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.__dict__.pop("_scratch", None)  # pickled by an older version
        self.__dict__.pop("_key_pos", None)
        self.__dict__.pop("_fd_pid", None)  # pickled by an older version
        if "_file" not in state:
            self._file = ProcessDescriptor(self.path, self._check_opened)
        self._lock = threading.Lock()
        if "_offsets" in state:  # a remote reader's index, or a pickle of an older version
            self.__dict__.setdefault("_keys_sorted", False)
            self.__dict__.setdefault("_key_order", None)
            self._bind()
        # else: loaded on first use (__getattr__), so a replaced file is reported by the read

    def __getattr__(self, name):
        """Load the index of an unpickled reader on first use (called only for attributes
        not set: once loaded, reads cost nothing extra)."""
        state = self.__dict__
        if name not in self._INDEX_STATE + self._VIEWS or not state.get("_reload") \
                or "_offsets" in state:
            raise AttributeError(name)
        with state["_lock"]:
            if "_offsets" not in state:
                self._reload_index()
        return state[name]

    @staticmethod
    def _replaced(path: str, then, now) -> FormatError:
        return FormatError("the file was replaced or rewritten after this dataset was opened "
                           "(device:inode:size:mtime %d:%d:%d:%d, now %d:%d:%d:%d): its index "
                           "no longer describes it; open the dataset again" % (then + now), path)

    def _reload_index(self) -> None:
        stamp = file_stamp(os.stat(self.path))
        if stamp != self._stamp:
            raise self._replaced(self.path, self._stamp, stamp)
        index = load_index(self.idx_path)
        if index.stamp != self._idx_stamp or len(index.offsets) != self._n:
            raise self._replaced(self.idx_path, self._idx_stamp, index.stamp)
        lock = self._lock
        self._init_index(index.keys, index.offsets, self.file_size, self._n, index.flags,
                         index.max_offset)
        self._lock = lock

    # -- access -----------------------------------------------------------------------
    def __len__(self) -> int:
        return self._n

    def key(self, i: int) -> int:
        """Key (first column of the ``.idx``) of the record at position ``i``."""
        return int(i) if self._keyv is None else self._keyv[i]

    def keys(self) -> np.ndarray:
        return np.arange(len(self)) if self._keys is None else self._keys.copy()

    def check_order(self) -> None:
        """Raise :class:`FormatError` unless the index lists the records in file order, as
        every gluon_data writer (and salvage) does: a reordered index would permute the
        dataset silently. (Stock files are not held to it.)"""
        if len(self) > 1 and not self._in_file_order:
            i = int(np.flatnonzero(self._offsets[1:] <= self._offsets[:-1])[0]) + 1
            raise FormatError("index line %d (key %d, offset %d) comes before line %d in the "
                              "file: the index was reordered or damaged; rebuild it with "
                              "gluon-data salvage" % (i + 1, self.key(i), self.offset(i), i),
                              self.idx_path, self.key(i), self.offset(i))

    def offset(self, i: int) -> int:
        return self._off[i]

    def extent(self, i: int) -> Tuple[int, int]:
        """``(start, end)``: the bytes of the ``.rec`` that record ``i`` (negative: from the
        end) occupies, framing included, up to where the next record begins."""
        n = self._n
        i = operator.index(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("record %d out of range for %d records" % (i, n))
        if self._endv is not None:
            return self._off[i], self._endv[i]
        return self._off[i], (self._off[i + 1] if i + 1 < n else self.file_size)

    def extents(self, positions: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """:meth:`extent` of many records at once: ``(starts, ends)`` arrays for the int64
        array ``positions`` (each ``0 <= i < len(self)``)."""
        starts = self._offsets[positions]
        if self._ends is not None:
            return starts, self._ends[positions]
        nxt = np.minimum(positions + 1, self._n - 1)
        return starts, np.where(positions + 1 < self._n, self._offsets[nxt], self.file_size)

    def extent_sizes(self) -> np.ndarray:
        """Every record's ``end - start`` (:meth:`extent`), in position order."""
        if self._ends is not None:
            return self._ends - self._offsets
        return np.diff(self._offsets, append=self.file_size)

    def read(self, i: int) -> bytes:
        """Payload of the record at position ``i`` (index order), unframed."""
        return bytes(self.view(i))

    def view(self, i: int) -> Union[bytes, memoryview]:
        """Like :meth:`read`, but the payload may be a ``memoryview`` into a per-thread
        buffer (shared by every RecordFile) that the thread's next ``view`` of any file
        overwrites: parse it (or copy it) before that."""
        start, end = self.extent(i)
        if end - start <= _SCRATCH_MAX:
            buf = self._pread_scratch(end - start, start)
            return codec.unframe(buf, 0, path=self.path, key=self.key(i), base_offset=start,
                                 copy=False)[0]
        if end - start <= _LARGE_EXTENT:
            data = self._pread(end - start, start)
            return codec.unframe(data, 0, path=self.path, key=self.key(i), base_offset=start)[0]
        return self._read_large(i, start)

    def will_need(self, indices: Union[np.ndarray, Sequence[int]], wait: bool = False) -> None:
        """Start fetching the records at positions ``indices`` (the batch about to be read)
        into the page cache and return at once (see :func:`advise_willneed`): the device
        then serves them together instead of one synchronous read at a time, and each
        :meth:`read` that follows finds its bytes cached (and verifies them, as always).
        Exactly the records' bytes are asked for, so a cold read costs ~1 device request per
        record. Positions out of range are ignored (their read raises); ``wait`` is ignored."""
        pos = valid_positions(indices, len(self))
        if pos.size:
            advise_willneed(self._fd(), *self.extents(pos))

    def _read_large(self, i: int, start: int) -> bytes:
        """Header-first read for records too big to fetch with one ``pread`` of the extent."""
        chunks, pos = [], start
        while True:
            head = self._pread(8, pos)
            if len(head) < 8:
                break  # unframe() below reports the truncation
            lrec = int.from_bytes(head[4:8], "little")
            length = lrec & codec.MAX_RECORD_BYTES
            want = min(8 + length + (-length) % 4, self.file_size - pos)  # no more than
            body = self._pread(want, pos)  # the file holds: unframe() reports the shortfall
            chunks.append(body)
            pos += len(body)
            if len(body) < want or (lrec >> 29) in (0, 3):
                break
        return codec.unframe(b"".join(chunks), 0, path=self.path, key=self.key(i),
                             base_offset=start)[0]

    def read_key(self, key: int) -> bytes:
        """Payload of the record with ``key`` (like ``MXIndexedRecordIO.read_idx``)."""
        if self._keys is None:
            if not 0 <= key < len(self):
                raise KeyError(key)
            return self.read(key)
        key = operator.index(key)
        keys, order = self._keys, None
        if not self._keys_sorted:  # a stock index with shuffled keys: sorted once, lazily
            if self._key_order is None:
                self._key_order = np.argsort(keys, kind="stable")
            order = self._key_order
        j = int(np.searchsorted(keys, key, sorter=order))
        if j < len(keys):
            i = j if order is None else int(order[j])
            if keys[i] == key:
                return self.read(i)
        raise KeyError(key)

    def __iter__(self) -> Iterator[bytes]:
        """Every payload in index order (as :meth:`read`), read in large sequential chunks."""
        for payload in self.scan():
            yield bytes(payload)

    def scan(self, chunk_bytes: int = 1 << 20) -> Iterator[Union[memoryview, bytes]]:
        """Every payload in index order, zero-copy: each is a ``memoryview`` into a chunk
        buffer, valid until the next one is produced (copy it to keep it).

        Where consecutive records lie back to back in the file (any file written in index
        order, ours and im2rec's alike) they are fetched ``chunk_bytes`` at a time, so a
        scan costs about what ``cat`` costs; scattered records are read one by one
        (:func:`~gluon_data.stores.recscan.scan_payloads`).
        """
        return scan_payloads(self, chunk_bytes)

    def __repr__(self):
        return "RecordFile(%r, %d records)" % (self.path, len(self))


def _not_found(path: str) -> FileNotFoundError:
    return FileNotFoundError(errno.ENOENT, "record file not found" + missing_rec_hint(path), path)


def _open_record_file(location: str, split: Optional[str] = None, **options) -> RecordFile:
    """The :func:`~gluon_data.stores.base.open_store` opener of a local ``.rec``: metadata read
    once, its record count enforced against the index."""
    if options:
        raise TypeError("a .rec store takes no options, got %s" % ", ".join(sorted(options)))
    # the .rec itself first: a FIFO, a device or a looping link is refused as such
    if _require_regular(location) is None:
        raise _not_found(location)
    meta = read_meta(location)
    if split is not None and (meta or {}).get("split", split) != split:  # so meta is a dict
        raise ValueError("%s holds split %r, not %r: a .rec holds one split (the LMDB "
                         "container holds several)" % (location, cast(dict, meta)["split"], split))
    f = RecordFile(location, expected_count=meta["num_records"] if meta else None, meta=meta)
    if meta is not None:  # ours: written in index order, so a reordered index is damage
        f.check_order()
    return f


def _names_rec(location: str) -> bool:
    return not is_uri(location) and not os.path.isdir(location) \
        and not location.rstrip("/").endswith(".lmdb")


# (cast: RecordStore declares location and meta settable; RecordFile's are read-only properties)
register_opener(_names_rec, cast(Callable[..., RecordStore], _open_record_file), priority=0)


def _int_view(a: np.ndarray) -> memoryview:
    """A flat ``memoryview`` of int64 ``a`` whose items are Python ints (no copy when ``a``
    is already contiguous int64, mapped or not)."""
    return memoryview(np.ascontiguousarray(a, dtype=np.int64)).cast("B").cast("q")
