"""RecordIO container: ``.rec`` + ``.idx`` files in MXNet's format, bytes in and bytes out.

:class:`RecordFile` reads by offset with ``os.pread`` on a descriptor opened lazily in each
process, so one instance is safe to share between threads (``DataLoader(thread_pool=True)``),
to inherit across ``fork`` and to pickle (``spawn``). Its index is a pair of numpy arrays
(16 bytes per record), validated on open against the data file.

:class:`RecordWriter` writes the same bytes as ``mx.recordio.MXIndexedRecordIO`` under
temporary names and publishes them by rename only when complete.
"""
from __future__ import annotations

import os
import struct
import threading
import warnings
import zlib
from typing import Dict, Iterator, Optional, Tuple

import numpy as np

from . import codec
from .errors import FormatError, OutputError, ResourceError
from .fsutil import atomic_write, check_replaceable, fsync_dir, open_new
from .meta import dumps_meta, meta_path, read_meta
from .store import is_uri, register_opener, valid_positions

__all__ = ["RecordFile", "RecordWriter", "read_index", "idx_path_for", "advise_willneed"]

_LARGE_EXTENT = 64 << 20  # read records bigger than this header-first, not in one pread
_SCRATCH_MAX = 8 << 20    # records up to this size are read into a reused per-thread buffer
# One scratch buffer per thread, shared by every RecordFile: a thousand open datasets cost a
# thousand small objects, not a thousand 1 MB buffers.
_SCRATCH = threading.local()


def open_or_explain(path: str, flags: int = os.O_RDONLY) -> int:
    """``os.open`` whose running out of descriptors is a :class:`ResourceError` saying so
    (with the limit and the fix) instead of a bare ``EMFILE``."""
    import errno
    try:
        return os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        if e.errno not in (errno.EMFILE, errno.ENFILE):
            raise
        try:
            import resource
            limit = "the limit is %d" % resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        except (ImportError, OSError, ValueError):
            limit = "limit unknown"
        raise ResourceError("cannot open: too many open files (%s%s); close datasets you no "
                            "longer read, or raise the limit (ulimit -n)"
                            % ("system-wide, " if e.errno == errno.ENFILE else "", limit),
                            path) from None


_FADV_WILLNEED = getattr(os, "POSIX_FADV_WILLNEED", None)
# One WILLNEED call asks for at most this much: Linux silently cuts a call at
# max(read_ahead_kb, max_sectors_kb) of the device, never below its default 128 KB.
_WILLNEED_CHUNK = 128 << 10


def advise_willneed(fd: int, starts, ends) -> None:
    """Start reading the byte ranges ``[starts[k], ends[k])`` of ``fd`` into the page cache
    asynchronously (``posix_fadvise(POSIX_FADV_WILLNEED)``) and return at once: ranges that
    touch are merged, so adjacent records go as one request, and each call asks for at most
    128 KB. Pages already cached cost a lookup, no I/O. Does nothing where the OS has no
    ``posix_fadvise``; an OS error is ignored (a hint, not a read)."""
    if _FADV_WILLNEED is None or not len(starts):
        return
    starts = np.asarray(starts, np.int64)
    ends = np.asarray(ends, np.int64)
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    if len(starts) > 1:  # merge runs whose next range starts where the last one ends
        ends = np.maximum.accumulate(ends)
        breaks = np.flatnonzero(starts[1:] > ends[:-1]) + 1
        first = np.concatenate(([0], breaks))
        last = np.concatenate((breaks - 1, [len(starts) - 1]))
        starts, ends = starts[first], ends[last]
    advise = os.posix_fadvise
    try:
        for lo, hi in zip(starts.tolist(), ends.tolist()):
            while lo < hi:
                n = min(hi - lo, _WILLNEED_CHUNK)
                advise(fd, lo, n, _FADV_WILLNEED)
                lo += n
    except OSError:
        pass


def idx_path_for(rec_path: str) -> str:
    """``a/b.rec`` -> ``a/b.idx`` (the convention of ``ImageRecordDataset`` and im2rec)."""
    return os.path.splitext(rec_path)[0] + ".idx"


def _bad_line(lines, path: str, reason_for) -> FormatError:
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        reason = reason_for(line)
        if reason:
            return FormatError("line %d (%r): %s" % (lineno, line[:80].decode("latin-1"), reason),
                               path)
    return FormatError("unparsable index", path)


def _line_problem(line: bytes) -> Optional[str]:
    fields = line.split()
    if len(fields) != 2:
        return "expected 'key<TAB>offset', found %d fields" % len(fields)
    for f in fields:
        try:
            int(f)
        except ValueError:
            return "%r is not an integer" % f.decode("latin-1")
    return None


_INDEX_BYTES = np.zeros(256, bool)
_INDEX_BYTES[list(b"0123456789+-\t\n\r ")] = True


def _int_tokens(raw: bytes) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return np.fromstring(raw, dtype=np.int64, sep=" ")


def _parse_strict_index(raw: bytes, b: np.ndarray) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """The common case, as MXNet and we write it (``key<TAB>offset<LF>`` on every line), in
    three vectorised passes; ``None`` for anything else (blank lines, CRLF, spaces, errors),
    which the general parser then accepts or blames on a line."""
    nl = np.flatnonzero(b == 10)
    tabs = np.flatnonzero(b == 9)
    n = nl.size
    if n == 0 or tabs.size != n or nl[-1] != b.size - 1:
        return None
    line_starts = np.concatenate(([0], nl[:-1] + 1))
    # one tab per line, with a digit (or sign) right after the line start and the tab...
    if not ((line_starts < tabs) & (tabs < nl - 1)).all():
        return None
    first = np.concatenate((b[line_starts], b[tabs + 1]))
    if not (((first >= 48) & (first <= 57)) | (first == 45)).all():
        return None
    # ...so each field holds >= 1 token; exactly 2n integers then means exactly one each.
    flat = _int_tokens(raw)
    if flat.size != 2 * n:
        return None
    values = flat.reshape(-1, 2)
    return values[:, 0].copy(), values[:, 1].copy()


#: A binary copy of an ``.idx`` beside it (``NAME.idx.gdx``): loads a million entries in tens
#: of milliseconds instead of parsing ~16 MB of text. Used only while the ``.idx`` has the
#: size and CRC-32 recorded in it, and its own body matches the CRC-32 in its header;
#: otherwise (stale, damaged, or an older version) it is ignored and the text is parsed.
BINARY_INDEX_SUFFIX = ".gdx"
_GDX_HEAD = struct.Struct("<8sQQQQQ")  # magic, idx size, idx crc32, count, flags, body crc32
_GDX_MAGIC = b"GDIDX\x00\x02\x00"     # version 2: the body is checksummed
_GDX_SEQUENTIAL_KEYS = 1  # flag: keys are 0..count-1 and not stored


def write_binary_index(idx_path: str) -> str:
    """Write ``idx_path + '.gdx'`` from the ``.idx`` (atomically); returns its path. Our
    converters do this for every ``.rec`` they write; run it once on a stock im2rec index
    to have it load as fast."""
    keys, offsets = read_index(idx_path, binary=False)
    with open(idx_path, "rb") as f:
        text = f.read()
    sequential = bool(np.array_equal(keys, np.arange(len(keys))))
    out = idx_path + BINARY_INDEX_SUFFIX
    check_replaceable(out, "gdx", True)
    body = (b"" if sequential else keys.astype("<i8").tobytes()) + \
        offsets.astype("<i8").tobytes()
    atomic_write(out, _GDX_HEAD.pack(_GDX_MAGIC, len(text), zlib.crc32(text), len(keys),
                                     _GDX_SEQUENTIAL_KEYS if sequential else 0,
                                     zlib.crc32(body)) + body)
    return out


def _read_binary_index(idx_path: str) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """The ``.gdx`` beside ``idx_path`` if it exists and still describes that ``.idx``."""
    try:
        with open(idx_path + BINARY_INDEX_SUFFIX, "rb") as f:
            head = f.read(_GDX_HEAD.size)
            if len(head) != _GDX_HEAD.size:
                return None
            magic, size, crc, count, flags, body_crc = _GDX_HEAD.unpack(head)
            if magic != _GDX_MAGIC or size != os.stat(idx_path).st_size:
                return None
            body = f.read()
            if zlib.crc32(body) != body_crc:  # damaged: the text index is the truth
                return None
        with open(idx_path, "rb") as f:
            if zlib.crc32(f.read()) != crc:
                return None
    except OSError:
        return None
    arrays = 1 if flags & _GDX_SEQUENTIAL_KEYS else 2
    if len(body) != 8 * count * arrays or count == 0:
        return None
    data = np.frombuffer(body, dtype="<i8").astype(np.int64, copy=False)
    if arrays == 1:
        return np.arange(count, dtype=np.int64), data
    return data[:count], data[count:]


def read_index(idx_path: str, binary: bool = True) -> Tuple[np.ndarray, np.ndarray]:
    """Parse an MXNet ``.idx`` (``key<TAB>offset`` lines) into ``(keys, offsets)`` int64 arrays.

    Blank lines and CRLF line ends are tolerated; anything else that is not two integers
    per line raises :class:`FormatError` naming the file and the line. With ``binary``, an
    up-to-date ``.gdx`` beside it (:func:`write_binary_index`) is read instead of the text.
    """
    if binary:
        loaded = _read_binary_index(idx_path)
        if loaded is not None:
            return loaded
    try:
        with open(idx_path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise FileNotFoundError("index file %s not found: a .rec needs its .idx beside it (same "
                                "name, .idx suffix) for random access" % idx_path) from None
    b = np.frombuffer(raw, dtype=np.uint8)
    if not _INDEX_BYTES[b].all():  # the C parser would stop quietly at "16x" and keep 16
        raise _bad_line(raw.splitlines(), idx_path, _line_problem)
    fast = _parse_strict_index(raw, b)
    if fast is not None:
        return fast
    # Vectorised and strict: every non-blank line must hold exactly two tokens, and the C
    # parser must consume every token as an integer; otherwise find the line to blame.
    ws = (b == 32) | (b == 9) | (b == 10) | (b == 13)
    starts = np.flatnonzero(~ws & np.concatenate(([True], ws[:-1])))
    if starts.size == 0:
        raise FormatError("index lists no records (empty file)", idx_path)
    line_of = np.searchsorted(np.flatnonzero(b == 10), starts)
    per_line = np.bincount(line_of)
    if np.any(per_line[per_line > 0] != 2):
        raise _bad_line(raw.splitlines(), idx_path, _line_problem)
    flat = _int_tokens(raw)
    if flat.size != starts.size:
        raise _bad_line(raw.splitlines(), idx_path, _line_problem)
    values = flat.reshape(-1, 2)
    return values[:, 0].copy(), values[:, 1].copy()


_UNREAD = object()


def file_stamp(st: os.stat_result) -> Tuple[int, int, int, int]:
    """``(device, inode, size, mtime_ns)``: what changes when a file is replaced or rewritten."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class RecordFile:
    """Random-access reader of one ``.rec``/``.idx`` pair; a
    :class:`~gluon_data.store.RecordStore` (``split`` is ``None``: a ``.rec`` holds one).

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

    split = None

    def __init__(self, path: str, idx_path: Optional[str] = None, *,
                 expected_count: Optional[int] = None, meta=_UNREAD):
        self.path = os.fspath(path)
        self.idx_path = os.fspath(idx_path) if idx_path else idx_path_for(self.path)
        if not os.path.exists(self.path):
            raise FileNotFoundError("record file %s not found" % self.path)
        self._meta = meta
        for p in (self.path, self.idx_path):
            _require_regular(p)
        keys, offsets = read_index(self.idx_path)
        st = os.stat(self.path)
        self._stamp = file_stamp(st)
        self._init_index(keys, offsets, st.st_size, expected_count)
        try:
            self._check_tail()
        finally:
            self.close()  # opened again on the first read: an idle reader holds no descriptor

    def _init_index(self, keys, offsets, file_size: int, expected_count) -> None:
        """Validate the index against a data file of ``file_size`` bytes and derive each
        record's extent (also used by readers of remote objects)."""
        self.file_size = file_size
        self._validate(keys, offsets, expected_count)
        n = len(offsets)
        self._keys = None if np.array_equal(keys, np.arange(n)) else keys
        self._offsets = offsets
        self._in_file_order = bool(n > 1 and (offsets[1:] > offsets[:-1]).all())
        if self._in_file_order:
            self._ends = np.append(offsets[1:], self.file_size)
        else:
            uniq = np.unique(offsets)
            bounds = np.append(uniq, self.file_size)
            self._ends = bounds[np.searchsorted(uniq, offsets, side="right")]
        self._key_pos: Optional[Dict[int, int]] = None
        self._fd_pid: Optional[Tuple[int, int]] = None
        self._lock = threading.Lock()

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
        if expected_count is not None and keys.size != expected_count:
            raise FormatError(
                "index lists %d records but the metadata promises %d: the conversion was "
                "interrupted or the files are mismatched; re-convert the dataset"
                % (keys.size, expected_count), self.idx_path)

    def _check_tail(self):
        """The record at the largest offset must end exactly at the end of the file."""
        last = int(np.argmax(self._offsets))
        start, end = int(self._offsets[last]), int(self._ends[last])
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
        return "%s/%d:%d:%d:%d" % ((cid,) + self._stamp)

    # -- process-local descriptor -----------------------------------------------------
    def _fd(self) -> int:
        pid = os.getpid()
        cur = self._fd_pid
        if cur is not None and cur[1] == pid:
            return cur[0]
        with self._lock:
            cur = self._fd_pid
            if cur is None or cur[1] != pid:
                fd = open_or_explain(self.path)
                stamp = file_stamp(os.fstat(fd))
                if stamp != self._stamp:
                    os.close(fd)
                    raise FormatError(
                        "the file was replaced or rewritten after this dataset was opened "
                        "(device:inode:size:mtime %d:%d:%d:%d, now %d:%d:%d:%d): its index no "
                        "longer describes it; open the dataset again" % (self._stamp + stamp),
                        self.path)
                self._fd_pid = (fd, pid)  # a descriptor inherited from the parent is left alone
            return self._fd_pid[0]

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
        cur, self._fd_pid = self._fd_pid, None
        if cur is not None and cur[1] == os.getpid():
            os.close(cur[0])

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_fd_pid"] = None
        state["_lock"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.__dict__.pop("_scratch", None)  # pickled by an older version
        self._lock = threading.Lock()

    # -- access -----------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._offsets)

    def key(self, i: int) -> int:
        """Key (first column of the ``.idx``) of the record at position ``i``."""
        return int(i) if self._keys is None else int(self._keys[i])

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
        return int(self._offsets[i])

    def read(self, i: int) -> bytes:
        """Payload of the record at position ``i`` (index order), unframed."""
        return bytes(self.view(i))

    def view(self, i: int):
        """Like :meth:`read`, but the payload may be a ``memoryview`` into a per-thread
        buffer (shared by every RecordFile) that the thread's next ``view`` of any file
        overwrites: parse it (or copy it) before that."""
        start, end = int(self._offsets[i]), int(self._ends[i])
        if end - start <= _SCRATCH_MAX:
            buf = self._pread_scratch(end - start, start)
            return codec.unframe(buf, 0, path=self.path, key=self.key(i), base_offset=start,
                                 copy=False)[0]
        if end - start <= _LARGE_EXTENT:
            buf = self._pread(end - start, start)
            return codec.unframe(buf, 0, path=self.path, key=self.key(i), base_offset=start)[0]
        return self._read_large(i, start)

    def will_need(self, indices) -> None:
        """Start fetching the records at positions ``indices`` (the batch about to be read)
        into the page cache and return at once (see :func:`advise_willneed`): the device
        then serves them together instead of one synchronous read at a time, and each
        :meth:`read` that follows finds its bytes cached (and verifies them, as always).
        Exactly the records' bytes are asked for, so a cold read costs ~1 device request per
        record. Positions out of range are ignored (their read raises)."""
        pos = valid_positions(indices, len(self))
        if pos.size:
            advise_willneed(self._fd(), self._offsets[pos], self._ends[pos])

    def _read_large(self, i: int, start: int) -> bytes:
        """Header-first read for records too big to fetch with one ``pread`` of the extent."""
        chunks, pos = [], start
        while True:
            head = self._pread(8, pos)
            if len(head) < 8:
                break  # unframe() below reports the truncation
            lrec = int.from_bytes(head[4:8], "little")
            length = lrec & codec.MAX_RECORD_BYTES
            want = 8 + length + (-length) % 4
            body = self._pread(want, pos)
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
        if self._key_pos is None:
            self._key_pos = {int(k): i for i, k in enumerate(self._keys)}
        return self.read(self._key_pos[int(key)])

    def __iter__(self) -> Iterator[bytes]:
        """Every payload in index order (as :meth:`read`), read in large sequential chunks."""
        for payload in self.scan():
            yield bytes(payload)

    def scan(self, chunk_bytes: int = 1 << 20) -> Iterator[memoryview]:
        """Every payload in index order, zero-copy: each is a ``memoryview`` into a chunk
        buffer, valid until the next one is produced (copy it to keep it).

        Where consecutive records lie back to back in the file (any file written in index
        order, ours and im2rec's alike) they are fetched ``chunk_bytes`` at a time, so a
        scan costs about what ``cat`` costs; scattered records are read one by one.
        """
        buf = bytearray(chunk_bytes)
        mv = memoryview(buf)
        offsets, ends = self._offsets, self._ends
        frame, magic_word, mask = codec._FRAME.unpack_from, codec.RECORDIO_MAGIC, codec._LEN_MASK
        n = len(self)
        i = 0
        while i < n:
            start, end = int(offsets[i]), int(ends[i])
            if end - start > chunk_bytes:  # a copy: the shared scratch is not ours to lend
                yield memoryview(self.read(i))
                i += 1
                continue
            sequential = i + 1 < n and int(offsets[i + 1]) == end
            lo = start
            hi = start + self._readinto(mv[:chunk_bytes if sequential else end - start], start)
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
                        yield codec.unframe(mv[:end - lo], r, path=self.path, key=self.key(i),
                                            base_offset=lo, copy=False)[0]
                else:
                    yield codec.unframe(mv[:hi - lo], r, path=self.path, key=self.key(i),
                                        base_offset=lo, copy=False)[0]
                i += 1
                if i >= n:
                    break
                start, end = int(offsets[i]), int(ends[i])
                if start < lo or end > hi:
                    break

    def __repr__(self):
        return "RecordFile(%r, %d records)" % (self.path, len(self))


def _open_record_file(location: str, split: Optional[str] = None, **options) -> RecordFile:
    """The :func:`~gluon_data.store.open_store` opener of a local ``.rec``: metadata read
    once, its record count enforced against the index."""
    if options:
        raise TypeError("a .rec store takes no options, got %s" % ", ".join(sorted(options)))
    if not os.path.exists(location):
        raise FileNotFoundError("record file %s not found" % location)
    meta = read_meta(location)
    if split is not None and (meta or {}).get("split", split) != split:
        raise ValueError("%s holds split %r, not %r: a .rec holds one split (the LMDB "
                         "container holds several)" % (location, meta["split"], split))
    f = RecordFile(location, expected_count=meta["num_records"] if meta else None, meta=meta)
    if meta is not None:  # ours: written in index order, so a reordered index is damage
        f.check_order()
    return f


def _names_rec(location: str) -> bool:
    return not is_uri(location) and not os.path.isdir(location) \
        and not location.rstrip("/").endswith(".lmdb")


register_opener(_names_rec, _open_record_file, priority=0)


class RecordWriter:
    """Write a ``.rec``/``.idx`` pair (plus optional metadata) atomically.

    Records go to ``NAME.partial`` files; :meth:`finish` flushes them to disk and
    :meth:`publish` renames them to their final names, metadata last. Until then nothing
    exists under the final names; :meth:`abort` removes the partial files. The bytes are
    identical to ``mx.recordio.MXIndexedRecordIO(idx, rec, 'w').write_idx(key, payload)``.

    Examples
    --------
    >>> with RecordWriter("out.rec", overwrite=True) as w:
    ...     offset = w.write(0, codec.pack_classification(1.0, b"image bytes"))
    ...     w.finish()                 # or w.finish(meta): the .meta.json document
    ...     w.publish()
    >>> len(RecordFile("out.rec")), codec.unpack(RecordFile("out.rec").read(0)).image
    (1, b'image bytes')
    """

    PARTIAL = ".partial"

    def __init__(self, path: str, idx_path: Optional[str] = None, *, overwrite: bool = False,
                 resume: Optional[Tuple[int, int, int]] = None):
        """``resume=(rec_bytes, idx_bytes, count)`` continues partial files from a checkpoint
        taken with :meth:`sync`: they are cut back to those sizes and appended to."""
        self.path = os.fspath(path)
        self.idx_path = os.fspath(idx_path) if idx_path else idx_path_for(self.path)
        self.meta_path = meta_path(self.path)
        self._finals = [self.path, self.idx_path, self.meta_path]
        # Only our own outputs may be replaced, and only with overwrite (fsutil's rule).
        # Sidecars without their .rec and .idx (left by a crash) are replaced when ours.
        data_exists = any(os.path.lexists(p) for p in self._finals[:2])
        for p, kind in ((self.path, "rec"), (self.idx_path, "idx"), (self.meta_path, "meta"),
                        (self.idx_path + BINARY_INDEX_SUFFIX, "gdx")):
            check_replaceable(p, kind, overwrite or (kind in ("meta", "gdx")
                                                     and not data_exists))
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self._tmp = [p + self.PARTIAL for p in self._finals]
        self._keys = set()
        if resume is None:
            self._rec = open_new(self._tmp[0], "wb")
            self._idx = open_new(self._tmp[1], "w", encoding="ascii", newline="\n")
            self._pos, self._idx_bytes, self.count = 0, 0, 0
        else:
            rec_bytes, idx_bytes, count = resume
            for p, n in ((self._tmp[0], rec_bytes), (self._tmp[1], idx_bytes)):
                if os.path.islink(p) or (os.path.exists(p) and not os.path.isfile(p)):
                    raise OutputError("cannot resume: the partial file is not a regular file "
                                      "(a link?); rerun without --resume", p)
                have = os.path.getsize(p) if os.path.exists(p) else -1
                if have < n:
                    raise FormatError("cannot resume: %s has %d bytes, its checkpoint promises "
                                      "%d; rerun without --resume" % (p, have, n), p)
                os.truncate(p, n)  # drop whatever was written after the checkpoint
            self._rec = open(self._tmp[0], "ab")
            self._idx = open(self._tmp[1], "a", encoding="ascii", newline="\n")
            self._pos, self._idx_bytes, self.count = rec_bytes, idx_bytes, count
            if count:
                self._keys.update(int(k) for k in read_index(self._tmp[1], binary=False)[0])
        self._state = "open"

    def write(self, key: int, payload: bytes) -> int:
        """Append one record under integer ``key``; return its offset."""
        if self._state != "open":
            raise RuntimeError("RecordWriter is %s" % self._state)
        key = int(key)
        if key in self._keys:  # readers refuse an index with a duplicate key
            raise FormatError("record key %d is used twice: every record needs its own key"
                              % key, self.path, key)
        self._keys.add(key)
        data = b"".join(codec.frame(payload))
        offset = self._pos
        self._rec.write(data)
        line = "%d\t%d\n" % (key, offset)
        self._idx.write(line)
        self._pos += len(data)
        self._idx_bytes += len(line)
        self.count += 1
        return offset

    keeps_progress = False  # a conversion's checkpoint goes to a file beside the output

    def sync(self) -> Tuple[int, int, int]:
        """Make everything written so far durable; return ``(rec_bytes, idx_bytes, count)``,
        the argument ``resume`` takes to continue from exactly here."""
        for f in (self._rec, self._idx):
            f.flush()
            os.fsync(f.fileno())
        return self._pos, self._idx_bytes, self.count

    @property
    def bytes_written(self) -> int:
        return self._pos

    def finish(self, meta: Optional[dict] = None) -> None:
        """Flush everything to stable storage under the partial names."""
        for f in (self._rec, self._idx):
            f.flush()
            os.fsync(f.fileno())
            f.close()
        if meta is not None:
            # Not fsutil.atomic_write: the .rec, .idx and metadata are published together
            # (complete_publish renames all three, metadata last, and finishes a publish a
            # crash interrupted), so each is only written and fsynced under its partial name.
            with open_new(self._tmp[2], "wb") as f:
                f.write(dumps_meta(meta))
                f.flush()
                os.fsync(f.fileno())
        self._has_meta = meta is not None
        self._state = "finished"

    def publish(self) -> None:
        """Rename the partial files to their final names (metadata last)."""
        if self._state != "finished":
            raise RuntimeError("call finish() before publish()")
        self.complete_publish(self.path, self.idx_path)
        self._state = "published"

    @classmethod
    def complete_publish(cls, path: str, idx_path: Optional[str] = None) -> None:
        """Rename whatever partial files of ``path`` remain (also after a crash mid-publish)."""
        idx_path = idx_path or idx_path_for(path)
        finals = [path, idx_path, meta_path(path)]
        tmps = [p + cls.PARTIAL for p in finals]
        if os.path.exists(tmps[0]) or os.path.exists(tmps[1]):
            for stale in (finals[2], idx_path + BINARY_INDEX_SUFFIX):
                if os.path.lexists(stale):  # a stale sidecar must never describe new data
                    os.remove(stale)  # (checked as ours, or a link, by the writer)
        for tmp, final in zip(tmps, finals):  # one directory fsync for the three renames
            if os.path.exists(tmp):
                os.replace(tmp, final)
        if os.path.exists(idx_path) and not os.path.exists(idx_path + BINARY_INDEX_SUFFIX):
            try:
                write_binary_index(idx_path)
            except (OSError, FormatError):  # an optimisation only: the .idx is what counts
                pass
        fsync_dir(os.path.dirname(os.path.abspath(path)))

    def suspend(self) -> None:
        """Close the partial files and keep them (a checkpoint describes a prefix of them:
        ``resume`` cuts them back to it)."""
        for f in (self._rec, self._idx):
            try:
                f.close()
            except OSError:  # a full disk fails the last flush: the checkpoint predates it
                pass
        self._state = "suspended"

    def abort(self) -> None:
        """Close and delete the partial files; the final names are untouched."""
        for f in (self._rec, self._idx):
            try:
                f.close()
            except OSError:
                pass
        for p in self._tmp:
            try:
                os.remove(p)
            except FileNotFoundError:
                pass
        self._state = "aborted"

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and self._state in ("open", "finished"):
            self.abort()
        return False


def _require_regular(path: str) -> None:
    """Refuse a FIFO, device or socket before opening it (a FIFO would block forever, a
    device be read without end); a missing file is left to the caller's own message."""
    import stat
    try:
        st = os.stat(path)
    except OSError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise FormatError("not a regular file (%s); datasets are read from regular files only"
                          % ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a directory"
                             if stat.S_ISDIR(st.st_mode) else "a device or socket"), path)

