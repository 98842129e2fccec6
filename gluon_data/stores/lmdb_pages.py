"""LMDB's on-disk layout as gluon_data reads it: our keys and sub-databases, and direct value
reads from ``data.mdb`` that bypass LMDB's map for values in overflow pages.

Cold reads: a record bigger than about half a page lives in LMDB "overflow" pages, and
py-lmdb touches every 4 KB page of a value it returns; with ``readahead=False`` each touch is
one device read (~19 per 75 KB record). :class:`PageReader` reads such values itself, with
one ``pread`` of the value's pages (see :class:`_ValueLocations`), and hints a batch's values
with one ``posix_fadvise(WILLNEED)`` per run of adjacent overflow pages.

It parses structures of LMDB 0.9 (``lmdb.h`` / ``mdb.c``: ``MDB_meta``, ``MDB_page``,
``MDB_node``), so it is used only where :func:`direct_reads_refused` finds nothing against
it: the meta pages of ``data.mdb`` carry the data version it knows
(:data:`KNOWN_DATA_VERSIONS`), the py-lmdb in use runs a liblmdb series it knows
(:data:`KNOWN_LIBRARIES`), the host is little-endian, and the user did not switch it off
(``GLUON_DATA_LMDB_PAGES=0``, or ``LMDBFile(..., pages=False)``). Otherwise every read goes
through py-lmdb, which returns the same bytes.

This module imports nothing of :mod:`gluon_data.stores.lmdbio`: the reader is handed a
:class:`~gluon_data.stores.lmdbio.ProcessEnv` (its ``run`` and ``check``) for the lookups that learn
where values lie.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import struct
import sys
import threading
from typing import Optional, Tuple, cast

import lmdb
import numpy as np

from ..errors import CorruptRecordError, FormatError
from ..storage.fileio import (ProcessDescriptor, advise_willneed, open_regular, replaced_error,
                              require_regular)
from ..storage.fsutil import LMDB_DATA
from ..format.recindex import file_stamp
from .base import valid_positions

__all__ = ["META_DB", "MAX_DBS", "LMDB_MAGIC", "KNOWN_DATA_VERSIONS", "KNOWN_LIBRARIES",
           "PAGES_ENV", "record_key", "check_data_file", "direct_reads_refused", "PageReader"]

META_DB = b"__meta__"   # sub-database: split name -> the split's metadata JSON
MAX_DBS = 64
LMDB_MAGIC = 0xBEEFC0DE
#: ``mm_version`` of the meta pages this reader parses (``MDB_DATA_VERSION`` of LMDB 0.9).
KNOWN_DATA_VERSIONS = (1,)
#: ``lmdb.version()[:2]`` of the liblmdb series whose page layout this reader parses.
KNOWN_LIBRARIES = ((0, 9),)
#: Environment switch: ``0`` turns direct reads off (every read through py-lmdb).
PAGES_ENV = "GLUON_DATA_LMDB_PAGES"


def record_key(position: int) -> bytes:
    """LMDB key of the record at ``position``: zero-padded so byte order is numeric order."""
    return b"%010d" % position


# LMDB 0.9 on-disk structures (lmdb.h / mdb.c: MDB_meta, MDB_page, MDB_node).
_PAGEHDRSZ = 16            # pgno u64, pad u16, flags u16, lower u16, upper u16 (or pages u32)
_META_MAGIC_AT, _META_VERSION_AT, _META_PSIZE_AT = 16, 20, 40
_P_LEAF, _P_OVERFLOW = 0x02, 0x04
_F_BIGDATA = 0x01          # node data is the u64 number of the value's first overflow page
_NODE = struct.Struct("<HHHH")  # mn_lo, mn_hi (data size), mn_flags, mn_ksize (little endian)
_PGNO = struct.Struct("<Q")
_OVERFLOW_HEAD = struct.Struct("<QHHI")  # pgno, pad, flags, number of pages


def _read_head(data: str, fd: Optional[int] = None) -> bytes:
    """The first 128 KB of ``data.mdb`` (through ``fd`` where one is given): both meta pages
    at any page size LMDB allows."""
    if fd is not None:
        return os.pread(fd, 2 * 65536, 0)
    with open_regular(data) as f:
        return f.read(2 * 65536)


def check_data_file(path: str, fd: Optional[int] = None) -> int:
    """Refuse a missing, empty or truncated ``data.mdb`` before LMDB maps it (SIGBUS);
    return the size in bytes its newest meta page needs. ``fd``: a descriptor already open on
    the ``data.mdb`` to check (the one the caller will map), read instead of the path."""
    if not os.path.isdir(path):
        raise FormatError("not an LMDB environment: %s" % ("no such directory"
                          if not os.path.exists(path) else "not a directory"), path)
    data = os.path.join(path, LMDB_DATA)
    if fd is None and require_regular(data) is None:  # (a FIFO there: refused, named)
        if os.path.islink(data):
            raise FormatError("data.mdb is a symbolic link to %s, which does not exist"
                              % os.readlink(data), data)
        raise FormatError("not an LMDB environment: no data.mdb in it", path)
    size = os.path.getsize(data) if fd is None else os.fstat(fd).st_size
    head = _read_head(data, fd)
    if len(head) < 160:
        raise FormatError("data.mdb is empty or truncated (%d bytes)" % size, data)
    magic, = struct.unpack_from("<I", head, _META_MAGIC_AT)
    if magic != LMDB_MAGIC:
        raise FormatError("data.mdb has no LMDB meta page (magic 0x%08x)" % magic, data)
    psize, = struct.unpack_from("<I", head, _META_PSIZE_AT)
    metas = []
    for base in (0, psize):
        at = base + _META_MAGIC_AT
        if base + 152 <= len(head) and struct.unpack_from("<I", head, at)[0] == LMDB_MAGIC:
            last_pg, txnid = struct.unpack_from("<QQ", head, base + 136)
            metas.append((txnid, last_pg))
    if not metas:
        raise FormatError("data.mdb meta pages unreadable", data)
    txnid, last_pg = max(metas)
    need = (last_pg + 1) * psize
    if size < need:
        raise FormatError("data.mdb is truncated: %d bytes, its meta page needs %d; the copy is "
                          "incomplete" % (size, need), data)
    return need


def direct_reads_refused(path: str, pages: Optional[bool] = None) -> Optional[str]:
    """Why the environment directory ``path`` must be read through py-lmdb only, or
    ``None`` where :class:`PageReader` may read its values: ``pages=False`` or
    ``$GLUON_DATA_LMDB_PAGES=0`` (when ``pages`` is ``None``), a liblmdb series or meta-page
    data version not in :data:`KNOWN_LIBRARIES` / :data:`KNOWN_DATA_VERSIONS`, a big-endian
    host or a page size the memory page size is no multiple of."""
    if pages is False or (pages is None and os.environ.get(PAGES_ENV, "1") == "0"):
        return "switched off"
    if tuple(lmdb.version()[:2]) not in KNOWN_LIBRARIES:
        return "liblmdb %s" % ".".join(map(str, lmdb.version()))
    if sys.byteorder != "little":
        return "big-endian host"
    try:
        head = _read_head(os.path.join(path, LMDB_DATA))
    except OSError as e:
        return "data.mdb unreadable (%s)" % e.strerror
    psize = struct.unpack_from("<I", head, _META_PSIZE_AT)[0] if len(head) >= 44 else 0
    for base in (0, psize):
        page = head[base:base + 24] if psize else b""
        if len(page) < 24 or struct.unpack_from("<I", page, _META_MAGIC_AT)[0] != LMDB_MAGIC:
            return "no LMDB meta page"
        version, = struct.unpack_from("<I", page, _META_VERSION_AT)
        if version not in KNOWN_DATA_VERSIONS:
            return "data version %d" % version
    if mmap.PAGESIZE % psize:  # a leaf page is found from a node's address in the map
        return "page size %d" % psize
    return None


def _address(buf) -> int:
    """Address of a (read-only) buffer's first byte."""
    return np.frombuffer(buf, np.uint8).ctypes.data


class _ValueLocations:
    """Where each record's value lies in ``data.mdb``, learnt a leaf page at a time, so a
    cold value costs one ``pread`` (one device read) instead of a page fault per 4 KB.

    A lookup through LMDB positions a cursor on the key; the leaf page holding it is then in
    memory, and every node on it names its value's overflow page and size. Those are kept in
    one ``uint64`` per record (``pgno << 32 | size``, 0 = not known yet), filled lazily, so
    the ~150 records sharing a leaf cost one lookup together. Values stored inline in the
    leaf (small records) and anything that does not parse as expected keep the plain
    ``txn.get`` path. Every ``pread`` checks the overflow page's own header (its page
    number, flag and page count) and that the file holds the whole value, so a stale or
    damaged location is a typed error, never another record's bytes.
    """

    def __init__(self, n: int, psize: int):
        self.n, self.psize = n, psize
        self.table = np.zeros(n, np.uint64)  # untouched pages cost no memory
        self.usable = True

    def learn(self, txn, key: bytes) -> bool:
        """Position on ``key`` in ``txn`` (``buffers=True``) and record the locations of
        every value on its leaf page; False if the key is absent."""
        cur = txn.cursor()
        if not cur.set_key(key):
            return False
        if not self.usable:
            return True
        node = _address(cur.key()) - 8
        psize = self.psize
        start = node - node % psize
        page = ctypes.string_at(start, psize)  # resident: LMDB just searched it
        _, _, flags, lower, _ = struct.unpack_from("<QHHHH", page)
        count = (lower - _PAGEHDRSZ) // 2
        if not flags & _P_LEAF or count <= 0 or _PAGEHDRSZ + 2 * count > psize:
            self.usable = False
            return True
        ptrs = struct.unpack_from("<%dH" % count, page, _PAGEHDRSZ)
        if node - start not in ptrs:  # not the page we think (e.g. map alignment differs)
            self.usable = False
            return True
        self._fill(page, ptrs)
        return True

    def _fill(self, page: bytes, ptrs) -> None:
        """Record the location of every overflow value the leaf ``page`` names."""
        table, psize = self.table, self.psize
        for ptr in ptrs:
            if ptr + 8 > psize:
                continue
            lo, hi, nflags, ksize = _NODE.unpack_from(page, ptr)
            if nflags != _F_BIGDATA or ksize != 10 or ptr + 8 + ksize + 8 > psize:
                continue
            k = page[ptr + 8:ptr + 18]
            if not k.isdigit():
                continue
            j = int(k)
            pgno, = _PGNO.unpack_from(page, ptr + 18)
            if j < self.n and 0 < pgno < (1 << 32):
                table[j] = (pgno << 32) | (lo | hi << 16)

    def extents(self, loc: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """``(starts, ends)`` in bytes of the overflow runs at the known locations ``loc``:
        whole pages, so the runs of values stored one after the other touch (and a hint
        over them merges into one request)."""
        starts = (loc >> np.uint64(32)).astype(np.int64) * self.psize
        sizes = (loc & np.uint64(0xFFFFFFFF)).astype(np.int64) + _PAGEHDRSZ
        return starts, starts + -(-sizes // self.psize) * self.psize

    def read(self, fd: int, loc: int, scratch, where: str, record: int,
             file_size: int) -> memoryview:
        """The value at ``loc`` read with one ``pread`` into ``scratch`` (a view of it; a
        value larger than the buffer: its overflow page's header checked first). The size
        a leaf node claims is bounded by what the file (``file_size`` bytes) holds from the
        value's page and by the page count its overflow header gives, before any buffer is
        allocated for it."""
        pgno, size = loc >> 32, loc & 0xFFFFFFFF
        start, need = pgno * self.psize, _PAGEHDRSZ + size
        if start + need > file_size:
            raise CorruptRecordError(
                "the leaf node of key %s claims a %d-byte value at page %d, but data.mdb (%d "
                "bytes) holds at most %d bytes from there: the file is damaged or truncated"
                % (record_key(record).decode(), size, pgno, file_size,
                   max(0, file_size - start - _PAGEHDRSZ)), where, record)
        view = memoryview(scratch.buf)[:need]
        got = os.preadv(fd, [view], start)
        head_pgno, _, flags, pages = _OVERFLOW_HEAD.unpack_from(view) if got >= 16 else (
            None, 0, 0, 0)
        if got < len(view):
            raise CorruptRecordError("data.mdb is truncated: the value of this record needs "
                                     "bytes %d..%d, the file ends at %d"
                                     % (start, start + need, start + got), where, record)
        if head_pgno != pgno or not flags & _P_OVERFLOW or pages * self.psize < need:
            raise CorruptRecordError("overflow page %d does not hold key %s's value of %d "
                                     "bytes (page header: number %s, flags 0x%x, %d pages "
                                     "of %d bytes)" % (pgno, record_key(record).decode(), size,
                                                       head_pgno, flags, pages, self.psize),
                                     where, record)
        if len(view) < need:  # bigger than the buffer: grown now that the header agrees
            first = len(view)
            scratch.buf = bytearray(need)
            scratch.buf[:first] = view
            view = memoryview(scratch.buf)
            got = first + os.preadv(fd, [view[first:]], start + first)
            if got < need:
                raise CorruptRecordError("data.mdb is truncated: the value of this record "
                                         "needs bytes %d..%d, the file ends at %d"
                                         % (start, start + need, start + got), where, record)
        return view[_PAGEHDRSZ:]


class _Opened:
    """``on_open`` of a page reader's descriptor: it must name the ``data.mdb`` the dataset
    was opened on (``stamp``: device, inode, size, mtime; ``None``: not checked), it reads
    only the pages asked for (``POSIX_FADV_RANDOM``), and the size of ``data.mdb`` as opened
    bounds every read."""

    __slots__ = ("path", "stamp")

    def __init__(self, path: str, stamp: Optional[tuple]):
        self.path, self.stamp = path, stamp

    def __call__(self, fd: int) -> int:
        st = os.fstat(fd)
        if self.stamp is not None and file_stamp(st) != self.stamp:
            raise replaced_error(self.path, self.stamp, file_stamp(st),
                                 consequence="its records are not the ones this dataset "
                                 "was opened on")
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        return st.st_size


class PageReader:
    """Direct reads of the overflow values of one split (``n`` records, pages of ``psize``
    bytes) of the environment at ``path``; ``env`` is the split's
    :class:`~gluon_data.stores.lmdbio.ProcessEnv`. Per process: one descriptor of ``data.mdb``
    (advised ``POSIX_FADV_RANDOM``, so a read fetches the value's pages and no more), the
    location table, one scratch buffer per thread. Pickles without them.

    ``stamp`` (:func:`~gluon_data.format.recindex.file_stamp` of ``data.mdb`` when the dataset was
    opened) binds the descriptor to that file, as a RecordIO reader's is bound to its
    ``.rec``: each process's descriptor is checked against it when opened (a path that now
    names another file, or the file rewritten, is :class:`FormatError` "replaced"), so no
    value is ever read from a file other than the one the environment maps."""

    def __init__(self, path: str, split: str, n: int, psize: int, env,
                 stamp: Optional[tuple] = None):
        self.path, self.split, self.n, self.psize, self._env = path, split, n, psize, env
        self.stamp = stamp
        self._init_process()

    def _init_process(self) -> None:
        self._locations: Optional[_ValueLocations] = None
        self._file = ProcessDescriptor(os.path.join(self.path, LMDB_DATA),
                                       _Opened(self.path, self.stamp))
        self._scratch = threading.local()

    def open(self) -> None:
        """Open (and check) this process's descriptor now, if it is not open yet."""
        self._file.get()

    @property
    def locations(self) -> _ValueLocations:
        """This process's location table (made on first use)."""
        locs = self._locations
        if locs is None:
            locs = self._locations = _ValueLocations(self.n, self.psize)
        return locs

    def _fd_size(self) -> Tuple[int, int]:
        """``(descriptor, size of data.mdb when it was opened)`` for this process."""
        return cast(Tuple[int, int], self._file.get())  # on_open is _Opened: returns the size

    def view(self, i: int) -> Optional[memoryview]:
        """The value of record ``i`` (``0 <= i < n``) read directly, in this thread's
        scratch buffer; ``None`` for a value this reader leaves to py-lmdb (stored inline in
        its leaf, or a leaf page that did not parse as expected)."""
        locs = self.locations
        loc = int(locs.table[i])
        if not loc and locs.usable:
            loc = self._learn(locs, i)
        if not loc:
            return None
        if getattr(self._scratch, "buf", None) is None:
            self._scratch.buf = bytearray(1 << 20)
        fd, size = self._fd_size()
        try:
            return locs.read(fd, loc, self._scratch, self.path, i, size)
        except CorruptRecordError:
            self._env.check()  # shrunk under us: say so
            raise

    def will_need(self, indices) -> None:
        """``posix_fadvise(WILLNEED)`` on the overflow pages of the values of ``indices``
        (positions out of range ignored), learning unknown locations first (one leaf page
        per ~150 records); whole page runs, so the values of adjacent records go as one
        request (see :func:`~gluon_data.storage.fileio.advise_willneed`). Inline values are left to
        the read."""
        pos = valid_positions(indices, self.n)
        locs = self.locations
        if not pos.size or not locs.usable:
            return
        table = locs.table
        for i in pos[table[pos] == 0].tolist():
            if not table[i] and locs.usable:
                self._learn(locs, i)
        loc = table[pos]
        loc = loc[loc != 0]
        if loc.size:
            advise_willneed(self._fd_size()[0], *locs.extents(loc))

    def _learn(self, locs: _ValueLocations, i: int) -> int:
        k = record_key(i)
        if not self._env.run(self.split, lambda txn: locs.learn(txn, k), buffers=True,
                             record=i):
            raise FormatError("record key %r missing from split %r" % (k.decode(), self.split),
                              self.path, i)
        return int(locs.table[i])

    def close(self, env=None) -> None:
        """Close this process's descriptor (the table stays); later lookups go through
        ``env`` where one is given."""
        if env is not None:
            self._env = env
        self._file.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __getstate__(self):
        return {k: self.__dict__[k] for k in ("path", "split", "n", "psize", "_env", "stamp")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.__dict__.setdefault("stamp", None)  # pickled by an older version
        self._init_process()
