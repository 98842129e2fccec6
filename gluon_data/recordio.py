"""RecordIO container: ``.rec`` + ``.idx`` files in MXNet's format, bytes in and bytes out.

:class:`RecordFile` reads by offset with ``os.pread`` on a descriptor opened lazily in each
process, so one instance is safe to share between threads (``DataLoader(thread_pool=True)``),
to inherit across ``fork`` and to pickle (``spawn``). Its index is the binary copy beside the
``.idx`` (``.idx.gdx``) mapped read-only — one copy in the page cache for every process, nothing
per record derived: a record ends where the next begins — or, for a stock index, the text parsed
once into the user cache and mapped from there (small ones are parsed in memory); validated on
open against the data file, in O(1) when the copy recorded that the index is clean. Pickles carry
the location and stamps, never the index.

:class:`RecordWriter` writes the same bytes as ``mx.recordio.MXIndexedRecordIO`` under
temporary names and publishes them by rename only when complete.
"""
from __future__ import annotations

import operator
import os
import struct
import threading
import warnings
import zlib
from typing import Iterator, NamedTuple, Optional, Tuple

import numpy as np

from . import codec
from .cache import Cache
from .errors import CacheError, FormatError, OutputError
from .fileio import advise_willneed, open_or_explain
from .fileio import require_regular as _require_regular
from .fsutil import (atomic_write, check_replaceable, fsync_dir,
                     map_readonly, open_new)
from .meta import dumps_meta, meta_path, read_meta
from .store import is_uri, register_opener, valid_positions

__all__ = ["RecordFile", "RecordWriter", "read_index", "idx_path_for", "advise_willneed"]

_LARGE_EXTENT = 64 << 20  # read records bigger than this header-first, not in one pread
_SCRATCH_MAX = 8 << 20    # records up to this size are read into a reused per-thread buffer
# One scratch buffer per thread, shared by every RecordFile: a thousand open datasets cost a
# thousand small objects, not a thousand 1 MB buffers.
_SCRATCH = threading.local()


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


#: A binary copy of an ``.idx`` beside it (``NAME.idx.gdx``), mapped read-only instead of
#: parsed: every process that opens the dataset shares the page cache's one copy, and opening
#: costs a header check and a checksum pass over the body instead of parsing text. Used only
#: while it still describes the ``.idx`` (its size and mtime, or else its CRC-32, as recorded)
#: and its header and body match their CRC-32s; otherwise it is ignored and the text is parsed.
BINARY_INDEX_SUFFIX = ".gdx"
_GDX_HEAD_V2 = struct.Struct("<8sQQQQQ")  # magic, idx size, idx crc32, count, flags, body crc32
_GDX_MAGIC_V2 = b"GDIDX\x00\x02\x00"
# version 3: magic, idx size, idx mtime_ns (-1: none recorded), idx crc32, count, flags, largest
# offset, body crc32, crc32 of the header before this field (72 bytes: the body is 8-aligned)
_GDX_HEAD = struct.Struct("<8sQqQQQqQQ")
_GDX_MAGIC = b"GDIDX\x00\x03\x00"
_GDX_SEQUENTIAL_KEYS = 1  # keys are 0..count-1 and not stored
_GDX_FILE_ORDER = 2       # offsets strictly increase: records listed in file order
_GDX_KEYS_SORTED = 4      # keys strictly increase
_GDX_CLEAN = 8            # offsets >= 0 and multiples of 4, no offset nor key listed twice
#: An ``.idx`` modified less than this before its binary copy was taken could be rewritten
#: within the same file-system clock tick (same mtime): its mtime is not recorded.
_RACY_NS = 50_000_000
#: Text indexes at least this big (~10,000 records) are parsed once into a binary copy in the
#: user cache (``$GLUON_DATA_CACHE_DIR/index``) when they have none beside them.
_CACHE_MIN_BYTES = 128 << 10
_CHUNK = 1 << 20


class _Index(NamedTuple):
    """A loaded index: ``keys`` (``None``: ``0..n-1``), ``offsets``, the facts a version-3
    binary copy recorded (``flags``, ``max_offset``; ``None``: not known, scan the arrays)
    and the ``.idx``'s :func:`file_stamp` when it was read."""
    keys: Optional[np.ndarray]
    offsets: np.ndarray
    flags: Optional[int]
    max_offset: int
    stamp: Tuple[int, int, int, int]


def _index_facts(keys: np.ndarray, offsets: np.ndarray) -> Tuple[int, int]:
    """``(flags, largest offset)`` of an index, as a version-3 binary copy records them."""
    n = len(offsets)
    flags = 0
    if np.array_equal(keys, np.arange(n)):
        flags |= _GDX_SEQUENTIAL_KEYS | _GDX_KEYS_SORTED
    elif n <= 1 or bool((keys[1:] > keys[:-1]).all()):
        flags |= _GDX_KEYS_SORTED
    if n <= 1 or bool((offsets[1:] > offsets[:-1]).all()):
        flags |= _GDX_FILE_ORDER
    if n and int(offsets.min()) >= 0 and not (offsets % 4).any() \
            and (flags & _GDX_KEYS_SORTED or np.unique(keys).size == n) \
            and (flags & _GDX_FILE_ORDER or np.unique(offsets).size == n):
        flags |= _GDX_CLEAN
    return flags, int(offsets.max()) if n else 0


def _read_stamped(idx_path: str) -> Tuple[bytes, int]:
    """The ``.idx``'s bytes and the mtime a binary copy of them may record: ``-1`` when the
    file changed while it was read, or was modified so recently (``_RACY_NS``) that a rewrite
    of the same size could keep the same mtime (file-system clocks tick in milliseconds).
    For a big index (where checking its CRC at every open would cost) it waits that out."""
    import time
    with open(idx_path, "rb") as f:
        before = os.fstat(f.fileno())
        wait = before.st_mtime_ns + _RACY_NS - time.time_ns()
        if 0 < wait <= _RACY_NS and before.st_size >= _CACHE_MIN_BYTES:
            time.sleep(wait / 1e9)
            wait = before.st_mtime_ns + _RACY_NS - time.time_ns()
        text = f.read()
        after = os.fstat(f.fileno())
    same = (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns) \
        and len(text) == before.st_size
    return text, (before.st_mtime_ns if same and wait <= 0 else -1)


def _binary_index_parts(keys: np.ndarray, offsets: np.ndarray, text: bytes,
                        mtime_ns: int) -> Tuple[bytes, bytes]:
    """(header, body) of the version-3 binary copy of ``text`` (parsed into keys, offsets)."""
    flags, max_offset = _index_facts(keys, offsets)
    body = (b"" if flags & _GDX_SEQUENTIAL_KEYS else keys.astype("<i8").tobytes()) + \
        offsets.astype("<i8").tobytes()
    head = _GDX_HEAD.pack(_GDX_MAGIC, len(text), mtime_ns, zlib.crc32(text), len(offsets),
                          flags, max_offset, zlib.crc32(body), 0)[:-8]
    return head + struct.pack("<Q", zlib.crc32(head)), body


def write_binary_index(idx_path: str) -> str:
    """Write ``idx_path + '.gdx'`` from the ``.idx`` (atomically); returns its path. Our
    converters do this for every ``.rec`` they write; run it once on a stock im2rec index
    to have it open as fast (without it, a big index is parsed once into the user cache)."""
    text, mtime_ns = _read_stamped(idx_path)
    keys, offsets = _parse_index(text, idx_path)
    out = idx_path + BINARY_INDEX_SUFFIX
    check_replaceable(out, "gdx", True)
    head, body = _binary_index_parts(keys, offsets, text, mtime_ns)
    atomic_write(out, head + body)
    return out


def _file_crc(fd: int, start: int, end: int) -> Optional[int]:
    """CRC-32 of bytes ``[start, end)`` of ``fd``, read in chunks (no private copy of a big
    file, nothing mapped); ``None`` if the file is shorter."""
    buf = memoryview(bytearray(min(_CHUNK, max(end - start, 1))))
    crc, pos = 0, start
    while pos < end:
        got = os.preadv(fd, [buf[:min(len(buf), end - pos)]], pos)
        if got <= 0:
            return None
        crc = zlib.crc32(buf[:got], crc)
        pos += got
    return crc


def _open_regular(path: str) -> Optional[int]:
    """A read-only descriptor of ``path`` if it is a regular file (a FIFO is never waited on)."""
    import stat
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def _idx_matches(idx_path: str, size: int, mtime_ns: int, crc: int) -> Optional[os.stat_result]:
    """The ``.idx``'s stat when it is the one a binary copy describes: the recorded size and
    mtime (a rewrite changes the mtime; a copy made within ``_RACY_NS`` of a change records
    none), else the recorded CRC-32 of all its bytes; ``None`` when it is not."""
    fd = _open_regular(idx_path)
    if fd is None:
        return None
    try:
        st = os.fstat(fd)
        if st.st_size != size:
            return None
        if mtime_ns >= 0 and st.st_mtime_ns == mtime_ns:
            return st
        return st if _file_crc(fd, 0, size) == crc else None
    finally:
        os.close(fd)


def _map_binary_index(gdx_path: str, idx_path: str) -> Optional[_Index]:
    """The binary copy at ``gdx_path`` of ``idx_path``, if it still describes it: version 3
    mapped read-only (shared page cache, nothing private), version 2 read into arrays."""
    fd = _open_regular(gdx_path)
    if fd is None:
        return None
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, _GDX_HEAD.size, 0)
        if head[:8] == _GDX_MAGIC_V2:
            return _read_binary_index_v2(fd, size, idx_path)
        if len(head) != _GDX_HEAD.size or head[:8] != _GDX_MAGIC \
                or zlib.crc32(head[:-8]) != struct.unpack_from("<Q", head, 64)[0]:
            return None
        _, idx_size, mtime_ns, idx_crc, count, flags, max_offset, body_crc, _ = \
            _GDX_HEAD.unpack(head)
        arrays = 1 if flags & _GDX_SEQUENTIAL_KEYS else 2
        if count == 0 or size != _GDX_HEAD.size + 8 * count * arrays:
            return None
        # the body's CRC at every open: ~25 ms per 10 M records from the page cache, and a
        # damaged copy is never trusted (the header's own CRC covers the rest)
        if _file_crc(fd, _GDX_HEAD.size, size) != body_crc:
            return None
        st = _idx_matches(idx_path, idx_size, mtime_ns, idx_crc)
        if st is None:
            return None
        mapped = map_readonly(fd, size)
    except OSError:
        return None
    finally:
        os.close(fd)  # the mapping keeps the file, not the descriptor
    data = np.frombuffer(mapped, dtype="<i8", offset=_GDX_HEAD.size)
    data.flags.writeable = False
    if data.dtype != np.int64:  # a big-endian host: a private, native copy
        data = data.astype(np.int64)
    keys = None if arrays == 1 else data[:count]
    return _Index(keys, data[-count:], flags, max_offset, file_stamp(st))


def _read_binary_index_v2(fd: int, size: int, idx_path: str) -> Optional[_Index]:
    """A version-2 copy (no mtime, no facts): its ``.idx``'s CRC is checked at every open."""
    head = os.pread(fd, size, 0)
    if len(head) < _GDX_HEAD_V2.size:
        return None
    _, idx_size, crc, count, flags, body_crc = _GDX_HEAD_V2.unpack_from(head)
    body = head[_GDX_HEAD_V2.size:]
    arrays = 1 if flags & _GDX_SEQUENTIAL_KEYS else 2
    if zlib.crc32(body) != body_crc or len(body) != 8 * count * arrays or count == 0:
        return None
    st = _idx_matches(idx_path, idx_size, -1, crc)
    if st is None:
        return None
    data = np.frombuffer(body, dtype="<i8").astype(np.int64, copy=False)
    return _Index(None if arrays == 1 else data[:count], data[count:] if arrays == 2 else data,
                  None, 0, file_stamp(st))


def binary_index_problem(idx_path: str) -> Optional[str]:
    """Why the ``.gdx`` beside ``idx_path`` is not used (readers ignore it and parse the
    text instead, silently), or ``None``: there is none, or it is the one readers map."""
    gdx = idx_path + BINARY_INDEX_SUFFIX
    if not os.path.lexists(gdx) or _map_binary_index(gdx, idx_path) is not None:
        return None
    fd = _open_regular(gdx)
    if fd is None:
        return "is not a regular file"
    try:
        size, head = os.fstat(fd).st_size, os.pread(fd, _GDX_HEAD.size, 0)
        if head[:8] == _GDX_MAGIC_V2:
            return "(version 2) is damaged or describes another .idx"
        if len(head) != _GDX_HEAD.size or head[:8] != _GDX_MAGIC:
            return "has a damaged header (no binary index magic)"
        if zlib.crc32(head[:-8]) != struct.unpack_from("<Q", head, 64)[0]:
            return "has a damaged header (its CRC-32 does not match)"
        _, _, _, _, count, flags, _, body_crc, _ = _GDX_HEAD.unpack(head)
        want = _GDX_HEAD.size + 8 * count * (1 if flags & _GDX_SEQUENTIAL_KEYS else 2)
        if count == 0 or size != want:
            return "is %d bytes, its header promises %d" % (size, want)
        if _file_crc(fd, _GDX_HEAD.size, size) != body_crc:
            return "has a damaged body (its CRC-32 does not match the header's)"
        return "describes another .idx (the .idx changed after it was written)"
    finally:
        os.close(fd)


def _read_binary_index(idx_path: str) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """``(keys, offsets)`` from the ``.gdx`` beside ``idx_path`` if it exists and still
    describes that ``.idx``, else ``None``."""
    got = _map_binary_index(idx_path + BINARY_INDEX_SUFFIX, idx_path)
    if got is None:
        return None
    return (np.arange(len(got.offsets)) if got.keys is None else got.keys), got.offsets


def _index_key(idx_path: str) -> str:
    import hashlib
    real = os.path.realpath(idx_path).encode("utf-8", "surrogateescape")
    return hashlib.sha256(real).hexdigest()[:32]


def index_cache_path(idx_path: str) -> str:
    """Where a big text ``.idx`` without a binary copy beside it gets one, parsed once:
    ``$GLUON_DATA_CACHE_DIR/index/<sha256 of its real path>/index.gdx`` (one entry per
    index, replaced when the index changes; delete the folder at any time), or the same in
    the cache an ``.idx`` was downloaded into. The cache's trust rule and limit are
    :class:`~gluon_data.cache.Cache`'s."""
    return os.path.join(Cache.for_file(idx_path).cache_dir, "index", _index_key(idx_path),
                        "index.gdx")


def _cached_index(idx_path: str, size: int) -> Optional[_Index]:
    """A big text index's binary copy in the user cache, made by the first process to open
    it (under an ``flock``: eight workers opening at once parse it once) and mapped by every
    other, only while it is the copy the cache sealed (:meth:`Cache.verify`); ``None`` where
    there is no usable cache (``GLUON_DATA_INDEX_CACHE=0``; a cache folder or an entry the
    trust rule refuses, with a warning; a read-only or full disk; the limit): the caller
    parses the text itself."""
    import fcntl
    import hashlib
    if size < _CACHE_MIN_BYTES or os.environ.get("GLUON_DATA_INDEX_CACHE", "1") == "0":
        return None
    cache, key, path = Cache.for_file(idx_path), _index_key(idx_path), None
    try:
        path = os.path.join(cache.entry("index", key), "index.gdx")
        with cache.lock(key, "pin", fcntl.LOCK_SH):  # not evicted while made or checked
            got = cache.verify(key, path)[0] and _map_binary_index(path, idx_path)
            if got:
                os.utime(os.path.dirname(path))  # last use, for the cache's LRU
                return got
            with cache.lock(key, "get", fcntl.LOCK_EX):
                ok, replaceable, why = cache.verify(key, path, locked=True)
                got = ok and _map_binary_index(path, idx_path)  # made meanwhile?
                if got:
                    return got
                if not replaceable:
                    raise CacheError("%s; the index cache is not used for %s (the text is "
                                     "parsed), and the file was left untouched: remove it"
                                     % (why, idx_path), path)
                text, mtime_ns = _read_stamped(idx_path)
                keys, offsets = _parse_index(text, idx_path)
                head, body = _binary_index_parts(keys, offsets, text, mtime_ns)
                del keys, offsets, text
                with cache.room_lock():
                    cache.make_room(len(head) + len(body), keep=key, what=idx_path + " parsed")
                    with open_new(path + ".partial") as f:  # no fsync: a torn copy fails
                        f.write(head)                        # its seal and CRCs
                        f.write(body)
                os.replace(path + ".partial", path)
                cache.seal(key, path, hashlib.sha256(head + body).hexdigest())
                return _map_binary_index(path, idx_path)
    except FormatError:
        raise  # the .idx itself is bad
    except CacheError as e:
        warnings.warn(str(e), RuntimeWarning, stacklevel=2)
    except (OSError, ValueError, OutputError):  # read-only, full; over the limit; in the way
        try:
            if path is not None:
                cache.discard(path + ".partial")
        except (OSError, OutputError):
            pass
    return None


def _load_index(idx_path: str) -> _Index:
    """The index of ``idx_path``: its binary copy beside it, else (a big stock index) the
    one in the user cache, else the text parsed here."""
    try:
        st = os.stat(idx_path)
    except FileNotFoundError:
        raise FileNotFoundError("index file %s not found: a .rec needs its .idx beside it (same "
                                "name, .idx suffix) for random access" % idx_path) from None
    got = _map_binary_index(idx_path + BINARY_INDEX_SUFFIX, idx_path) or \
        _cached_index(idx_path, st.st_size)
    if got is not None:
        return got
    with open(idx_path, "rb") as f:
        st = os.fstat(f.fileno())
        raw = f.read()
    keys, offsets = _parse_index(raw, idx_path)
    return _Index(keys, offsets, None, 0, file_stamp(st))


def read_index(idx_path: str, binary: bool = True) -> Tuple[np.ndarray, np.ndarray]:
    """Parse an MXNet ``.idx`` (``key<TAB>offset`` lines) into ``(keys, offsets)`` int64 arrays.

    Blank lines and CRLF line ends are tolerated; anything else that is not two integers
    per line raises :class:`FormatError` naming the file and the line. With ``binary``, an
    up-to-date ``.gdx`` beside it (:func:`write_binary_index`) or in the user cache
    (:func:`index_cache_path`) is read instead of the text (read-only arrays).
    """
    if binary:
        got = _load_index(idx_path)
        return (np.arange(len(got.offsets)) if got.keys is None else got.keys), got.offsets
    try:
        with open(idx_path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise FileNotFoundError("index file %s not found: a .rec needs its .idx beside it (same "
                                "name, .idx suffix) for random access" % idx_path) from None
    return _parse_index(raw, idx_path)


def _parse_index(raw: bytes, idx_path: str) -> Tuple[np.ndarray, np.ndarray]:
    """The text of an ``.idx`` as ``(keys, offsets)``; :class:`FormatError` naming the line
    that is not two integers."""
    b = np.frombuffer(raw, dtype=np.uint8)
    # only digits, signs and white space: the C parser would stop quietly at "16x" and keep
    # 16 (all of these are <= "9"; those below "0" are checked where there are few of them)
    if not (b <= 57).all() or not _INDEX_BYTES[b[b < 48]].all():
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
        index = _load_index(self.idx_path)
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
        if flags is None or not flags & _GDX_CLEAN or max_offset + 8 > file_size:
            if keys is None:
                keys = np.arange(n)
            self._validate(keys, offsets, expected_count)
            flags = _index_facts(keys, offsets)[0]
        else:
            self._check_count(n, expected_count)
        self._keys = None if flags & _GDX_SEQUENTIAL_KEYS else keys
        self._keys_sorted = bool(flags & _GDX_KEYS_SORTED)
        self._offsets = offsets
        self._in_file_order = bool(flags & _GDX_FILE_ORDER)
        self._ends = None
        if not self._in_file_order:  # stock files only: one private array of record ends
            uniq = np.unique(offsets)
            bounds = np.append(uniq, self.file_size)
            self._ends = bounds[np.searchsorted(uniq, offsets, side="right")]
        self._key_order: Optional[np.ndarray] = None
        self._fd_pid: Optional[Tuple[int, int]] = None
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
                    raise self._replaced(self.path, self._stamp, stamp)
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
        """The location, stamps and metadata; the index only where it cannot be loaded
        again from ``idx_path`` (a remote reader's): a worker maps the binary index itself
        instead of unpickling a private copy of it."""
        state = self.__dict__.copy()
        state["_fd_pid"] = None
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
        index = _load_index(self.idx_path)
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

    def view(self, i: int):
        """Like :meth:`read`, but the payload may be a ``memoryview`` into a per-thread
        buffer (shared by every RecordFile) that the thread's next ``view`` of any file
        overwrites: parse it (or copy it) before that."""
        start, end = self.extent(i)
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

    def scan(self, chunk_bytes: int = 1 << 20) -> Iterator[memoryview]:
        """Every payload in index order, zero-copy: each is a ``memoryview`` into a chunk
        buffer, valid until the next one is produced (copy it to keep it).

        Where consecutive records lie back to back in the file (any file written in index
        order, ours and im2rec's alike) they are fetched ``chunk_bytes`` at a time, so a
        scan costs about what ``cat`` costs; scattered records are read one by one.
        """
        buf = bytearray(chunk_bytes)
        mv = memoryview(buf)
        offsets, ends, file_end = self._off, self._endv, self.file_size
        frame, magic_word, mask = codec._FRAME.unpack_from, codec.RECORDIO_MAGIC, codec._LEN_MASK
        n = len(self)
        i = 0
        while i < n:
            start = offsets[i]
            end = ends[i] if ends is not None else offsets[i + 1] if i + 1 < n else file_end
            if end - start > chunk_bytes:  # a copy: the shared scratch is not ours to lend
                yield memoryview(self.read(i))
                i += 1
                continue
            sequential = i + 1 < n and offsets[i + 1] == end
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
                start = offsets[i]
                end = ends[i] if ends is not None else offsets[i + 1] if i + 1 < n else file_end
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


def _int_view(a: np.ndarray) -> memoryview:
    """A flat ``memoryview`` of int64 ``a`` whose items are Python ints (no copy when ``a``
    is already contiguous int64, mapped or not)."""
    return memoryview(np.ascontiguousarray(a, dtype=np.int64)).cast("B").cast("q")
