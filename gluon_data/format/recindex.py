"""The index of a ``.rec``: the text ``.idx`` (MXNet's ``key<TAB>offset`` lines) and its
binary copy, the ``.gdx``.

:func:`read_index` parses an ``.idx`` strictly (vectorised; a bad line is named). The binary
copy beside it (``NAME.idx.gdx``, :func:`write_binary_index`) is mapped read-only instead of
parsed -- one copy in the page cache for every process -- while it still describes the
``.idx``; a big stock index without one is parsed once into the user cache
(:func:`index_cache_path`) and mapped from there. :func:`binary_index_problem` says why a
``.gdx`` is ignored. :class:`~gluon_data.stores.recordio.RecordFile` opens its index here
(:func:`load_index`, an :class:`Index` with the facts of :func:`index_facts`);
:class:`~gluon_data.mx_recordio.MXIndexedRecordIO` parses its text (:func:`parse_index`,
from :mod:`gluon_data.format.textindex`).
"""
from __future__ import annotations

import os
import struct
import warnings
import zlib
from typing import NamedTuple, Optional, Tuple

import numpy as np

from ..storage.cache import Cache
from ..errors import CacheError, FormatError, OutputError
from ..storage.fileio import open_or_explain, open_regular, require_regular, stat_stamp
from ..storage.fsutil import OutputLock, atomic_write, map_readonly, open_new
from ..format.ownership import check_replaceable
from .textindex import parse_index

__all__ = ["read_index", "idx_path_for", "write_binary_index", "binary_index_problem",
           "index_cache_path", "BINARY_INDEX_SUFFIX", "file_stamp", "load_index", "Index",
           "parse_index", "index_facts", "GDX_SEQUENTIAL_KEYS", "GDX_FILE_ORDER",
           "GDX_KEYS_SORTED", "GDX_CLEAN"]

def idx_path_for(rec_path: str) -> str:
    """``a/b.rec`` -> ``a/b.idx`` (the convention of ``ImageRecordDataset`` and im2rec)."""
    return os.path.splitext(rec_path)[0] + ".idx"


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
# The facts a version-3 copy records (``Index.flags``, :func:`index_facts`), one bit each:
GDX_SEQUENTIAL_KEYS = 1  # keys are 0..count-1 and not stored
GDX_FILE_ORDER = 2       # offsets strictly increase: records listed in file order
GDX_KEYS_SORTED = 4      # keys strictly increase
GDX_CLEAN = 8            # offsets >= 0 and multiples of 4, no offset nor key listed twice
#: An ``.idx`` modified less than this before its binary copy was taken could be rewritten
#: within the same file-system clock tick (same mtime): its mtime is not recorded.
_RACY_NS = 50_000_000
#: Text indexes at least this big (~10,000 records) are parsed once into a binary copy in the
#: user cache (``$GLUON_DATA_CACHE_DIR/index``) when they have none beside them.
_CACHE_MIN_BYTES = 128 << 10
_CHUNK = 1 << 20


class Index(NamedTuple):
    """A loaded index: ``keys`` (``None``: ``0..n-1``), ``offsets``, the facts a version-3
    binary copy recorded (``flags``, ``max_offset``; ``None``: not known, scan the arrays)
    and the ``.idx``'s :func:`file_stamp` when it was read (:func:`load_index`).

    >>> index = load_index("train.idx")
    >>> len(index.offsets) == len(read_index("train.idx")[1])
    True
    """
    keys: Optional[np.ndarray]
    offsets: np.ndarray
    flags: Optional[int]
    max_offset: int
    stamp: Tuple[int, ...]  # (device, inode, size, mtime_ns): file_stamp


def index_facts(keys: np.ndarray, offsets: np.ndarray) -> Tuple[int, int]:
    """``(flags, largest offset)`` of an index, as a version-3 binary copy records them."""
    n = len(offsets)
    flags = 0
    if np.array_equal(keys, np.arange(n)):
        flags |= GDX_SEQUENTIAL_KEYS | GDX_KEYS_SORTED
    elif n <= 1 or bool((keys[1:] > keys[:-1]).all()):
        flags |= GDX_KEYS_SORTED
    if n <= 1 or bool((offsets[1:] > offsets[:-1]).all()):
        flags |= GDX_FILE_ORDER
    if n and int(offsets.min()) >= 0 and not (offsets % 4).any() \
            and (flags & GDX_KEYS_SORTED or np.unique(keys).size == n) \
            and (flags & GDX_FILE_ORDER or np.unique(offsets).size == n):
        flags |= GDX_CLEAN
    return flags, int(offsets.max()) if n else 0


def _read_stamped(idx_path: str) -> Tuple[bytes, int]:
    """The ``.idx``'s bytes and the mtime a binary copy of them may record: ``-1`` when the
    file changed while it was read, or was modified so recently (``_RACY_NS``) that a rewrite
    of the same size could keep the same mtime (file-system clocks tick in milliseconds).
    For a big index (where checking its CRC at every open would cost) it waits that out."""
    import time
    with open_regular(idx_path) as f:
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
    flags, max_offset = index_facts(keys, offsets)
    body = (b"" if flags & GDX_SEQUENTIAL_KEYS else keys.astype("<i8").tobytes()) + \
        offsets.astype("<i8").tobytes()
    head = _GDX_HEAD.pack(_GDX_MAGIC, len(text), mtime_ns, zlib.crc32(text), len(offsets),
                          flags, max_offset, zlib.crc32(body), 0)[:-8]
    return head + struct.pack("<Q", zlib.crc32(head)), body


def write_binary_index(idx_path: str, lock_held: bool = False) -> str:
    """Write ``idx_path + '.gdx'`` from the ``.idx`` (atomically); returns its path. Our
    converters do this for every ``.rec`` they write; run it once on a stock im2rec index
    to have it open as fast (without it, a big index is parsed once into the user cache).

    It takes the output lock of the ``.rec`` the index belongs to
    (:class:`~gluon_data.storage.fsutil.OutputLock`), so it never writes beside a conversion
    or a salvage at work on that ``.rec`` (:class:`~gluon_data.errors.ConversionError`
    naming it); ``lock_held``: the caller is that writer and holds the lock already."""
    if not lock_held:
        rec = idx_path[:-len(".idx")] + ".rec" if idx_path.endswith(".idx") else idx_path
        with OutputLock([rec]):
            return write_binary_index(idx_path, lock_held=True)
    text, mtime_ns = _read_stamped(idx_path)
    keys, offsets = parse_index(text, idx_path)
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
    """A read-only descriptor of ``path`` if it is a regular file, else ``None`` (an
    optional file: a binary copy that is missing or not a regular file is ignored). The
    input-kind rule of :func:`~gluon_data.storage.fileio.open_or_explain`: a FIFO or device is never
    opened nor waited on."""
    try:
        return open_or_explain(path)
    except (OSError, FormatError):
        return None


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


def _map_binary_index(gdx_path: str, idx_path: str) -> Optional[Index]:
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
        arrays = 1 if flags & GDX_SEQUENTIAL_KEYS else 2
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
    return Index(keys, data[-count:], flags, max_offset, file_stamp(st))


def _read_binary_index_v2(fd: int, size: int, idx_path: str) -> Optional[Index]:
    """A version-2 copy (no mtime, no facts): its ``.idx``'s CRC is checked at every open."""
    head = os.pread(fd, size, 0)
    if len(head) < _GDX_HEAD_V2.size:
        return None
    _, idx_size, crc, count, flags, body_crc = _GDX_HEAD_V2.unpack_from(head)
    body = head[_GDX_HEAD_V2.size:]
    arrays = 1 if flags & GDX_SEQUENTIAL_KEYS else 2
    if zlib.crc32(body) != body_crc or len(body) != 8 * count * arrays or count == 0:
        return None
    st = _idx_matches(idx_path, idx_size, -1, crc)
    if st is None:
        return None
    data = np.frombuffer(body, dtype="<i8").astype(np.int64, copy=False)
    return Index(None if arrays == 1 else data[:count], data[count:] if arrays == 2 else data,
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
        want = _GDX_HEAD.size + 8 * count * (1 if flags & GDX_SEQUENTIAL_KEYS else 2)
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
    :class:`~gluon_data.storage.cache.Cache`'s."""
    return os.path.join(Cache.for_file(idx_path).cache_dir, "index", _index_key(idx_path),
                        "index.gdx")


def _cached_index(idx_path: str, size: int) -> Optional[Index]:
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
                keys, offsets = parse_index(text, idx_path)
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


#: A ``.rec`` opened without its ``.idx``: what is missing, and how to make it again.
_MISSING_INDEX = ("index file %s not found: a .rec needs its .idx beside it (same name, .idx "
                  "suffix) for random access; `gluon-data salvage` rebuilds it from the .rec")


def load_index(idx_path: str) -> Index:
    """The index of ``idx_path``: its binary copy beside it, else (a big stock index) the
    one in the user cache, else the text parsed here."""
    st = require_regular(idx_path)  # a FIFO or device: refused before anything is opened
    if st is None:  # nothing to check: missing, or not reachable (the OS error says why)
        try:
            st = os.stat(idx_path)
        except FileNotFoundError:
            raise FileNotFoundError(_MISSING_INDEX % idx_path) from None
    got = _map_binary_index(idx_path + BINARY_INDEX_SUFFIX, idx_path) or \
        _cached_index(idx_path, st.st_size)
    if got is not None:
        return got
    with open_regular(idx_path) as f:
        st = os.fstat(f.fileno())
        raw = f.read()
    keys, offsets = parse_index(raw, idx_path)
    return Index(keys, offsets, None, 0, file_stamp(st))


def read_index(idx_path: str, binary: bool = True) -> Tuple[np.ndarray, np.ndarray]:
    """Parse an MXNet ``.idx`` (``key<TAB>offset`` lines) into ``(keys, offsets)`` int64 arrays.

    Blank lines and CRLF line ends are tolerated; anything else that is not two integers
    per line raises :class:`FormatError` naming the file and the line. With ``binary``, an
    up-to-date ``.gdx`` beside it (:func:`write_binary_index`) or in the user cache
    (:func:`index_cache_path`) is read instead of the text (read-only arrays).
    """
    if binary:
        got = load_index(idx_path)
        return (np.arange(len(got.offsets)) if got.keys is None else got.keys), got.offsets
    try:
        with open_regular(idx_path) as f:
            raw = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(_MISSING_INDEX % idx_path) from None
    return parse_index(raw, idx_path)


def file_stamp(st: os.stat_result) -> Tuple[int, ...]:
    """``(device, inode, size, mtime_ns)``: what changes when a file is replaced or rewritten."""
    return stat_stamp(st, ("dev", "ino", "size", "mtime_ns"))
