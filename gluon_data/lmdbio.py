"""LMDB container: the same record payloads as RecordIO, one named sub-database per split.

Layout of ``NAME.lmdb/`` (an LMDB environment directory):

* sub-database ``<split>``: key ``b"%010d" % position`` -> record payload (the exact bytes a
  ``.rec`` holds for that record, checksum included), so key order is record order;
* sub-database ``__meta__``: key ``<split>`` -> the split's metadata JSON (same schema as a
  ``.meta.json`` sidecar).

Readers open the environment lazily in each process, read-only and without the lock file
(``lock=False``: datasets are immutable once published, it works on read-only mounts, and no
reader slot can leak), with one short read transaction per read. Before mapping, the file
size is checked against the newest meta page so a truncated ``data.mdb`` raises
:class:`FormatError` instead of killing the process with SIGBUS.

Cold reads: a record bigger than about half a page lives in LMDB "overflow" pages, and
py-lmdb touches every 4 KB page of a value it returns; with ``readahead=False`` each touch is
one device read (~19 per 75 KB record). :class:`LMDBFile` therefore reads such values itself,
with one ``pread`` of the value's pages from ``data.mdb`` (see :class:`_ValueLocations`).
"""
from __future__ import annotations

import ctypes
import json
import mmap
import os
import shutil
import struct
import sys
import threading
from typing import Callable, Dict, List, Optional, Tuple

import lmdb
import numpy as np

from .documents import load_document
from .errors import CorruptRecordError, FormatError, OutputError
from .fileio import advise_willneed, open_or_explain
from .fsutil import (check_replaceable, exchange_dirs, fsync_dir, register_sniffer,
                     remove_partial_dir)
from .meta import dumps_meta
from .store import is_uri, register_opener, valid_positions

__all__ = ["LMDBFile", "LMDBWriter", "ProcessEnv", "read_lmdb_meta", "is_lmdb",
           "record_key", "shared_env"]

META_DB = b"__meta__"
_MAX_DBS = 64
_LMDB_MAGIC = 0xBEEFC0DE


def record_key(position: int) -> bytes:
    """LMDB key of the record at ``position``: zero-padded so byte order is numeric order."""
    return b"%010d" % position


def is_lmdb(path: str) -> bool:
    """Whether ``path`` is an LMDB environment directory (holds a ``data.mdb``)."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "data.mdb"))


def names_lmdb(path: str) -> bool:
    """Whether ``path`` is, or by its ``.lmdb`` suffix is meant to be, an LMDB dataset."""
    path = os.fspath(path)
    return is_lmdb(path) or path.rstrip("/").endswith(".lmdb")


def _check_data_file(path: str) -> int:
    """Refuse a missing, empty or truncated ``data.mdb`` before LMDB maps it (SIGBUS);
    return the size in bytes its newest meta page needs."""
    if not os.path.isdir(path):
        raise FormatError("not an LMDB environment: %s" % ("no such directory"
                          if not os.path.exists(path) else "not a directory"), path)
    data = os.path.join(path, "data.mdb")
    if not os.path.isfile(data):
        raise FormatError("not an LMDB environment: no data.mdb in it", path)
    size = os.path.getsize(data)
    with open(data, "rb") as f:
        head = f.read(2 * 65536)
    if len(head) < 160:
        raise FormatError("data.mdb is empty or truncated (%d bytes)" % size, data)
    magic, = struct.unpack_from("<I", head, 16)
    if magic != _LMDB_MAGIC:
        raise FormatError("data.mdb has no LMDB meta page (magic 0x%08x)" % magic, data)
    psize, = struct.unpack_from("<I", head, 40)
    metas = []
    for base in (0, psize):
        if base + 152 <= len(head) and struct.unpack_from("<I", head, base + 16)[0] == _LMDB_MAGIC:
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


# A read-only environment's data.mdb can shrink under it (truncated, rewritten in place);
# touching a mapped page past the new end is SIGBUS. Each open environment keeps a
# descriptor on the file it mapped and the size it needs; every read transaction first
# compares them (one fstat).
_GUARDS: Dict[int, Tuple[int, int, str]] = {}  # id(env) -> (fd on data.mdb, bytes needed, path)


def _forget_guard(env) -> None:
    g = _GUARDS.pop(id(env), None)
    if g is not None:
        try:
            os.close(g[0])
        except OSError:
            pass


def check_mapped(env: lmdb.Environment) -> None:
    """Raise :class:`FormatError` if the ``data.mdb`` behind an open read-only ``env`` is now
    shorter than when it was opened (reading it would kill the process with SIGBUS)."""
    g = _GUARDS.get(id(env))
    if g is None:
        return
    size = os.fstat(g[0]).st_size
    if size < g[1]:
        raise FormatError("data.mdb shrank to %d bytes under an open dataset (it needs %d): "
                          "the file was truncated or is being rewritten in place; reopen the "
                          "dataset once it is complete" % (size, g[1]), g[2])


def _open_env(path: str) -> lmdb.Environment:
    data = os.path.join(path, "data.mdb")
    need = _check_data_file(path)
    fd = open_or_explain(data)
    try:
        env = lmdb.open(path, readonly=True, lock=False, readahead=False, meminit=False,
                        max_dbs=_MAX_DBS, subdir=True, create=False)
    except lmdb.Error as e:
        os.close(fd)
        raise FormatError("cannot open LMDB environment: %s" % e, path) from None
    except BaseException:
        os.close(fd)
        raise
    _GUARDS[id(env)] = (fd, need, data)
    return env


# One read-only environment per (file, process). LMDB forbids opening an environment twice
# in a process (py-lmdb refuses it), and forbids using one inherited across fork: a child
# closes what it inherited (which leaves the parent's untouched) and opens its own.
_ENVS: Dict[tuple, Tuple[int, lmdb.Environment]] = {}
_ENVS_LOCK = threading.Lock()


def _reset_lock_after_fork():
    global _ENVS_LOCK
    _ENVS_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_lock_after_fork)


def shared_env(path: str) -> lmdb.Environment:
    """The process's read-only environment for ``path`` (opened on first use)."""
    data = os.path.join(path, "data.mdb")
    try:
        st = os.stat(data)
        key = (os.path.realpath(path), st.st_dev, st.st_ino)
    except OSError:
        key = (os.path.realpath(path), 0, 0)
    pid = os.getpid()
    with _ENVS_LOCK:
        ent = _ENVS.get(key)
        if ent is not None and ent[0] == pid:
            return ent[1]
        for k in [k for k, (p, _) in _ENVS.items() if p != pid]:
            try:
                old = _ENVS.pop(k)[1]
                _forget_guard(old)
                old.close()  # inherited across fork: release this process's copy
            except Exception:
                pass
        env = _open_env(path)
        _ENVS[key] = (pid, env)
        return env


class ProcessEnv:
    """Picklable handle to :func:`shared_env` that re-resolves after fork or unpickling."""

    def __init__(self, path: str):
        self.path = path
        self._state: Optional[Tuple[int, lmdb.Environment, dict]] = None
        self._lock = threading.Lock()

    def get(self, db_name: Optional[str] = None):
        """``(env, db)`` for this process; ``db`` is the named sub-database (or main)."""
        pid = os.getpid()
        st = self._state
        if st is None or st[0] != pid:
            with self._lock:
                st = self._state
                if st is None or st[0] != pid:
                    st = self._state = (pid, shared_env(self.path), {})
        dbs = st[2]
        if db_name not in dbs:
            dbs[db_name] = (st[1].open_db(db_name.encode(), create=False)
                            if db_name is not None else None)
        return st[1], dbs[db_name]

    def get_value(self, key: bytes, db_name: Optional[str] = None, *, where=None,
                  record=None) -> Optional[bytes]:
        """One short read transaction; handles a map grown by another process."""
        env, db = self.get(db_name)
        check_mapped(env)
        try:
            try:
                with env.begin(db=db) as txn:
                    return txn.get(key)
            except lmdb.MapResizedError:  # another process grew the map: adopt its size
                env.set_mapsize(0)
                with env.begin(db=db) as txn:
                    return txn.get(key)
        except lmdb.Error as e:
            raise CorruptRecordError("LMDB could not read the value (%s: %s)"
                                     % (type(e).__name__, e), where or self.path,
                                     record) from None

    def __getstate__(self):
        return {"path": self.path}

    def __setstate__(self, d):
        self.__init__(d["path"])


def _read_all_meta(env: lmdb.Environment, path: str) -> Dict[str, dict]:
    check_mapped(env)
    try:
        mdb = env.open_db(META_DB, create=False)
    except lmdb.NotFoundError:
        raise FormatError("LMDB environment has no gluon_data metadata (%r sub-database); "
                          "legacy layouts need `gluon-data convert --layout raw-lmdb`"
                          % META_DB.decode(), path) from None
    out = {}
    with env.begin(db=mdb) as txn:
        for k, v in txn.cursor():
            where = "%s [split %s]" % (path, k.decode("utf-8", "replace"))
            out[k.decode()] = load_document(bytes(v), "meta", where)
    return out


def read_lmdb_meta(path: str) -> Dict[str, dict]:
    """Metadata of every split of an LMDB dataset: ``{split: meta}``."""
    return _read_all_meta(shared_env(path), path)


register_sniffer("lmdb", read_lmdb_meta)  # what fsutil.is_ours(path, "lmdb") asks


# LMDB 0.9 on-disk structures read by _ValueLocations (lmdb.h / mdb.c: MDB_page, MDB_node).
_PAGEHDRSZ = 16            # pgno u64, pad u16, flags u16, lower u16, upper u16 (or pages u32)
_P_LEAF, _P_OVERFLOW = 0x02, 0x04
_F_BIGDATA = 0x01          # node data is the u64 number of the value's first overflow page
_NODE = struct.Struct("<HHHH")  # mn_lo, mn_hi (data size), mn_flags, mn_ksize (little endian)
_PGNO = struct.Struct("<Q")
_OVERFLOW_HEAD = struct.Struct("<QHHI")  # pgno, pad, flags, number of pages


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
    leaf (small records), big-endian hosts and anything that does not parse as expected keep
    the plain ``txn.get`` path. Every ``pread`` checks the overflow page's own header (its
    page number, flag and page count) and that the file holds the whole value, so a stale
    or damaged location is a typed error, never another record's bytes.
    """

    def __init__(self, n: int, psize: int):
        self.n, self.psize = n, psize
        self.table = np.zeros(n, np.uint64)  # untouched pages cost no memory
        # a leaf page is found from a node's address, which needs the map aligned to psize
        self.usable = sys.byteorder == "little" and mmap.PAGESIZE % psize == 0

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
        table = self.table
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
        return True

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

#: The fewest bytes an entry takes in a leaf page: its node header (8), key (10 digits) and
#: slot (2). A split claiming more entries than ``data.mdb`` can hold so is damaged.
_MIN_ENTRY_BYTES = 20


def _check_entries(path: str, split: str, n: int) -> None:
    """Refuse an entry count that ``data.mdb`` cannot hold (before anything is sized by it)."""
    size = os.path.getsize(os.path.join(path, "data.mdb"))
    if n > size // _MIN_ENTRY_BYTES:
        raise FormatError("split %r claims %d records, but data.mdb (%d bytes) holds at most "
                          "%d: the file is damaged" % (split, n, size, size // _MIN_ENTRY_BYTES),
                          path)


class LMDBFile:
    """Random-access reader of one split of an LMDB dataset; a
    :class:`~gluon_data.store.RecordStore` (the same interface as :class:`RecordFile`).

    Parameters
    ----------
    path : str
        The ``NAME.lmdb`` directory.
    split : str
        Sub-database to read; :class:`FormatError` lists the available ones if absent.

    Keys are positions (``key(i) == i``) and records have no byte offset (``offset(i)`` is
    ``None``). The first read in every process (a forked or spawned worker, an unpickled
    copy) compares :meth:`identity` with the one taken when the dataset was opened and raises
    :class:`FormatError` if the environment was replaced meanwhile.

    Examples
    --------
    >>> f = LMDBFile("voc.lmdb", "val")
    >>> payload = f.read(0)
    >>> payload == bytes(next(iter(f.scan()))), f.split, f.offset(0)
    (True, 'val', None)
    """

    def __init__(self, path: str, split: str = "train"):
        self.path = os.fspath(path)
        self.split = split
        env = shared_env(self.path)
        metas = _read_all_meta(env, self.path)
        if split not in metas:
            raise FormatError("split %r not found; available splits: %s"
                              % (split, ", ".join(sorted(metas)) or "none"), self.path)
        self.meta = metas[split]
        db = env.open_db(split.encode(), create=False)
        with env.begin(db=db) as txn:
            n = txn.stat(db)["entries"]
        _check_entries(self.path, split, n)
        if n != self.meta["num_records"]:
            raise FormatError("split %r holds %d records but its metadata promises %d"
                              % (split, n, self.meta["num_records"]), self.path)
        self._n = n
        self._identity = self._current_identity(self.meta, env)
        self._checked_pid = os.getpid()
        self._env = ProcessEnv(self.path)
        self._psize = env.stat()["psize"]
        self._init_direct()

    def _init_direct(self):
        self._locations: Optional[_ValueLocations] = None
        self._fd_pid: Optional[Tuple[int, int, int]] = None
        self._lock = threading.Lock()
        self._scratch = threading.local()

    def _fd(self) -> int:
        """This process's descriptor of ``data.mdb`` for direct value reads, advised
        ``POSIX_FADV_RANDOM`` so a read fetches the value's pages and no more."""
        return self._fd_size()[0]

    def _fd_size(self) -> Tuple[int, int]:
        """``(descriptor, size of data.mdb when it was opened)`` for this process."""
        cur, pid = self._fd_pid, os.getpid()
        if cur is not None and cur[1] == pid:
            return cur[0], cur[2]
        with self._lock:
            if self._fd_pid is None or self._fd_pid[1] != pid:
                fd = os.open(os.path.join(self.path, "data.mdb"),
                             os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                if hasattr(os, "posix_fadvise"):
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
                # one inherited from the parent is left alone
                self._fd_pid = (fd, pid, os.fstat(fd).st_size)
            return self._fd_pid[0], self._fd_pid[2]

    # -- store protocol ---------------------------------------------------------------
    @property
    def location(self) -> str:
        return self.path

    def _current_identity(self, meta: dict, env: lmdb.Environment) -> str:
        try:
            st = os.stat(os.path.join(self.path, "data.mdb"))
        except OSError as e:
            raise FormatError("cannot stat data.mdb (%s)" % e.strerror, self.path) from None
        return "%s/%d:%d:%d:%d" % (meta.get("conversion_id") or "-", st.st_dev, st.st_ino,
                                   st.st_mtime_ns, env.info()["last_txnid"])

    def identity(self) -> str:
        """``conversion_id`` of the split's metadata (``-`` without one), the device, inode
        and mtime (ns) of ``data.mdb`` and LMDB's last committed transaction id when the
        split was opened: ``id/device:inode:mtime_ns:txnid``. An environment rewritten in
        place (same file, same size) has another mtime and transaction id."""
        return self._identity

    def _check_identity(self) -> None:
        """First use in this process: the environment must still be the one opened."""
        env, _ = self._env.get(None)
        try:
            mdb = env.open_db(META_DB, create=False)
            with env.begin(db=mdb) as txn:
                raw = txn.get(self.split.encode())
            meta = json.loads(bytes(raw).decode("utf-8")) if raw is not None else {}
        except (lmdb.Error, UnicodeDecodeError, ValueError):
            meta = {}
        now = self._current_identity(meta if isinstance(meta, dict) else {}, env)
        if now != self._identity:
            raise FormatError("the LMDB environment was replaced after this dataset was opened "
                              "(identity %s, now %s): its records are not the ones indexed; "
                              "open the dataset again" % (self._identity, now), self.path)
        self._checked_pid = os.getpid()

    def __len__(self) -> int:
        return self._n

    def key(self, i: int) -> int:
        """The record's key: its position, or the key it had in the ``.rec`` it was copied
        from (``record_keys`` in the metadata)."""
        keys = self.meta.get("record_keys")
        return int(keys[i]) if keys is not None else int(i)

    def keys(self):
        """Keys of every record in position order (as :meth:`key`)."""
        import numpy as np
        keys = self.meta.get("record_keys")
        return np.asarray(keys, dtype=np.int64) if keys is not None else np.arange(self._n)

    def offset(self, i: int) -> Optional[int]:
        """``None``: an LMDB record has no byte offset a reader could use."""
        return None

    def read(self, i: int) -> bytes:
        """Payload of the record at position ``i``."""
        return bytes(self.view(i))

    def view(self, i: int):
        """Like :meth:`read`; the payload may be a ``memoryview`` into a per-thread buffer
        that the thread's next read overwrites (the contract of ``RecordFile.view``)."""
        if self._checked_pid != os.getpid():
            self._check_identity()
        i = int(i)
        if not 0 <= i < self._n:
            raise IndexError("record %d out of range (%d records)" % (i, self._n))
        locs = self._locations
        if locs is None:
            locs = self._locations = _ValueLocations(self._n, self._psize)
        loc = int(locs.table[i])
        if not loc and locs.usable:
            loc = self._learn(locs, i)
        if loc:
            if getattr(self._scratch, "buf", None) is None:
                self._scratch.buf = bytearray(1 << 20)
            fd, size = self._fd_size()
            try:
                return locs.read(fd, loc, self._scratch, self.path, i, size)
            except CorruptRecordError:
                check_mapped(self._env.get(self.split)[0])  # shrunk under us: say so
                raise
        k = record_key(i)
        v = self._env.get_value(k, self.split, record=i)
        if v is None:
            raise FormatError("record key %r missing from split %r" % (k.decode(), self.split),
                              self.path, i)
        return v

    def will_need(self, indices) -> None:
        """Start fetching the values of the records at positions ``indices`` (the batch about
        to be read) into the page cache and return at once: ``posix_fadvise(WILLNEED)`` on
        each value's pages in ``data.mdb`` (see :func:`~gluon_data.fileio.advise_willneed`),
        so the device serves them together and each :meth:`read` that follows finds its
        pages cached (and checks the overflow page header, as always). Locations not known
        yet are learnt first (one leaf page per ~150 records); values stored inline in the
        leaf pages are left to the read. Positions out of range are ignored."""
        pos = valid_positions(indices, self._n)
        if not pos.size:
            return
        if self._checked_pid != os.getpid():
            self._check_identity()
        locs = self._locations
        if locs is None:
            locs = self._locations = _ValueLocations(self._n, self._psize)
        if not locs.usable:
            return
        table = locs.table
        for i in pos[table[pos] == 0].tolist():
            if not table[i] and locs.usable:
                self._learn(locs, i)
        loc = table[pos]
        loc = loc[loc != 0]
        if loc.size:
            starts = (loc >> np.uint64(32)).astype(np.int64) * self._psize
            sizes = (loc & np.uint64(0xFFFFFFFF)).astype(np.int64) + _PAGEHDRSZ
            advise_willneed(self._fd(), starts, starts + sizes)

    def _learn(self, locs: _ValueLocations, i: int) -> int:
        k = record_key(i)
        env, db = self._env.get(self.split)
        check_mapped(env)
        try:
            try:
                with env.begin(db=db, buffers=True) as txn:
                    found = locs.learn(txn, k)
            except lmdb.MapResizedError:  # another process grew the map: adopt its size
                env.set_mapsize(0)
                with env.begin(db=db, buffers=True) as txn:
                    found = locs.learn(txn, k)
        except lmdb.Error as e:
            raise CorruptRecordError("LMDB could not read the value (%s: %s)"
                                     % (type(e).__name__, e), self.path, i) from None
        if not found:
            raise FormatError("record key %r missing from split %r" % (k.decode(), self.split),
                              self.path, i)
        return int(locs.table[i])

    def scan(self):
        """Every payload in position order, read with one cursor in one read transaction
        (each a ``memoryview`` valid until the next one is produced)."""
        if self._checked_pid != os.getpid():
            self._check_identity()
        env, db = self._env.get(self.split)
        n = 0
        try:
            with env.begin(db=db, buffers=True) as txn:
                for k, v in txn.cursor().iternext():
                    if bytes(k) != record_key(n):
                        raise FormatError("unexpected key %r at position %d of split %r (keys "
                                          "must be %r ...)" % (bytes(k), n, self.split,
                                                              record_key(n)), self.path, n)
                    n += 1
                    yield v
        except lmdb.Error as e:
            raise CorruptRecordError("LMDB could not read the split (%s: %s)"
                                     % (type(e).__name__, e), self.path, n) from None
        if n != self._n:
            raise FormatError("split %r yielded %d records, its metadata promises %d"
                              % (self.split, n, self._n), self.path)

    def __del__(self):
        try:
            cur = self._fd_pid
            if cur is not None and cur[1] == os.getpid():
                os.close(cur[0])
        except Exception:
            pass

    def close(self) -> None:
        """Forget this reader's handles (the shared environment stays for other readers)."""
        self._env = ProcessEnv(self.path)
        cur, self._fd_pid = self._fd_pid, None
        if cur is not None and cur[1] == os.getpid():
            os.close(cur[0])

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_checked_pid"] = None  # an unpickled copy checks the identity on first read
        for k in ("_locations", "_fd_pid", "_lock", "_scratch"):
            state.pop(k, None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._init_direct()

    def __repr__(self):
        return "LMDBFile(%r, split=%r, %d records)" % (self.path, self.split, self._n)


# layout name -> opener(location, split, **options) for LMDBs in other layouts, registered by
# the modules that read them (gluon_data.legacy: 'raw-lmdb', 'caffe-lmdb'), so this module
# needs none of them.
_LAYOUTS: Dict[str, Callable[..., object]] = {}


def register_layout(name: str, opener: Callable[..., object]) -> None:
    """Make ``open_store(path, split, layout=name, **options)`` on an LMDB directory return
    ``opener(path, split, **options)`` (a store over an LMDB in another layout)."""
    _LAYOUTS[name] = opener


def _open_lmdb(location: str, split: Optional[str] = None, *, layout: Optional[str] = None,
               **options):
    """The :func:`~gluon_data.store.open_store` opener of an LMDB directory: one split of
    our layout, or (``layout='raw-lmdb'`` / ``'caffe-lmdb'``) a legacy LMDB read in place."""
    if layout is not None and layout != "gluon_data":
        if layout not in _LAYOUTS:
            raise ValueError("unknown LMDB layout %r; valid: %s"
                             % (layout, ", ".join(["gluon_data"] + sorted(_LAYOUTS))))
        return _LAYOUTS[layout](location, split, **options)
    if options:
        raise TypeError("an LMDB store takes no options but layout=, got %s"
                        % ", ".join(sorted(options)))
    if split is None:  # the "train" split if there is one, else the first
        names = _lmdb_splits(location)
        split = "train" if "train" in names or not names else names[0]
    return LMDBFile(location, split)


def _lmdb_splits(location: str) -> List[str]:
    return sorted(read_lmdb_meta(location))


def _names_lmdb_store(location: str) -> bool:
    """A directory (only LMDB environments are directories) or a ``.lmdb`` name."""
    return not is_uri(location) and (os.path.isdir(location) or names_lmdb(location))


register_opener(_names_lmdb_store, _open_lmdb, priority=10, splits=_lmdb_splits)


class LMDBWriter:
    """Write one LMDB dataset (several splits) atomically, growing the map as needed.

    Records are buffered and committed every ``commit_every`` puts. When the map is full
    the transaction is aborted, the map doubled and the *whole* batch replayed, so no put
    is lost. The environment is built in ``NAME.lmdb.partial`` and renamed on
    :meth:`publish`.
    """

    PARTIAL = ".partial"
    PROGRESS_DB = b"__progress__"

    def __init__(self, path: str, *, overwrite: bool = False, map_size: int = 64 << 20,
                 commit_every: int = 256, resume: bool = False):
        self.path = os.fspath(path).rstrip("/")
        check_replaceable(self.path, "lmdb", overwrite)  # only our own LMDB, never a link
        self.tmp = self.path + self.PARTIAL
        if not resume:
            remove_partial_dir(self.tmp)
        elif os.path.lexists(self.tmp) and (os.path.islink(self.tmp)
                                            or not os.path.isdir(self.tmp)):
            raise OutputError("cannot resume: the partial LMDB environment is not a directory "
                              "(a link?); rerun without --resume", self.tmp)
        os.makedirs(self.tmp, exist_ok=True)
        self.env = lmdb.open(self.tmp, map_size=map_size, max_dbs=_MAX_DBS, subdir=True,
                             sync=False, metasync=False, writemap=False)
        self.env.set_mapsize(max(map_size, self.env.info()["map_size"]))
        self.commit_every = commit_every
        self.grows = 0
        self._state = "open"

    def split(self, name: str, resume: Optional[Tuple[int, int]] = None) -> "_SplitWriter":
        """A writer for split ``name``; ``resume=(count, bytes)`` continues a checkpoint."""
        if name == META_DB.decode() or not name:
            raise ValueError("invalid split name %r" % name)
        return _SplitWriter(self, name, resume)

    @classmethod
    def read_progress(cls, path: str) -> Optional[bytes]:
        """The progress document of an interrupted write of ``path``, if there is one."""
        tmp = os.fspath(path).rstrip("/") + cls.PARTIAL
        if not os.path.isfile(os.path.join(tmp, "data.mdb")):
            return None
        env = lmdb.open(tmp, readonly=True, lock=False, max_dbs=_MAX_DBS, subdir=True)
        try:
            try:
                db = env.open_db(cls.PROGRESS_DB, create=False)
            except lmdb.NotFoundError:
                return None
            with env.begin(db=db) as txn:
                v = txn.get(b"state")
                return None if v is None else bytes(v)
        finally:
            env.close()

    def _commit(self, db, batch, progress: Optional[bytes] = None) -> None:
        """Put ``batch`` (and the progress document) in one transaction; on a full map, grow
        it and replay the whole batch, so nothing is lost and nothing is half-written."""
        pdb = self.env.open_db(self.PROGRESS_DB) if progress is not None else None
        while True:
            try:
                with self.env.begin(write=True, db=db) as txn:
                    for k, v in batch:
                        txn.put(k, v, db=db)
                    if pdb is not None:
                        txn.put(b"state", progress, db=pdb)
                return
            except lmdb.MapFullError:
                self.env.set_mapsize(self.env.info()["map_size"] * 2)
                self.grows += 1

    def put_meta(self, split: str, meta: dict) -> None:
        self._commit(self.env.open_db(META_DB), [(split.encode(), dumps_meta(meta))])

    def publish(self) -> None:
        if self._state == "published":
            return
        with self.env.begin(write=True) as txn:  # resume bookkeeping does not ship
            try:
                txn.drop(self.env.open_db(self.PROGRESS_DB, txn=txn), delete=True)
            except lmdb.NotFoundError:
                pass
        self.env.sync(True)
        self.env.close()
        try:  # readers run lock-free; a published dataset is just data.mdb
            os.remove(os.path.join(self.tmp, "lock.mdb"))
        except FileNotFoundError:
            pass
        self._replace_final()
        fsync_dir(os.path.dirname(os.path.abspath(self.path)))
        self._state = "published"

    def suspend(self) -> None:
        """Close the partial environment and keep it: its committed progress document says
        where a resume continues."""
        if self._state in ("published", "aborted", "suspended"):
            return
        try:
            self.env.close()
        except lmdb.Error:
            pass
        self._state = "suspended"

    def _replace_final(self) -> None:
        """Put the finished environment under the final name. An existing dataset (checked
        as ours when the writer opened) is swapped out in one atomic exchange, so the final
        name always holds a complete dataset, then removed; without ``renameat2`` it is moved
        to a fresh ``NAME.lmdb.old-*`` folder for the instant between two renames. (A
        directory, so not :func:`~gluon_data.fsutil.atomic_write`, which writes one file;
        :meth:`publish` syncs the environment first and the parent directory after.)"""
        if not os.path.lexists(self.path):
            os.rename(self.tmp, self.path)
            return
        if exchange_dirs(self.tmp, self.path):
            shutil.rmtree(self.tmp)  # now the previous dataset
            return
        import tempfile
        parent, base = os.path.split(os.path.abspath(self.path))
        old = tempfile.mkdtemp(prefix=base + ".old-", dir=parent)
        os.rename(self.path, old)  # replaces the empty folder we just made, nothing else
        try:
            os.rename(self.tmp, self.path)
        except BaseException:
            os.rename(old, self.path)
            raise
        shutil.rmtree(old)

    def abort(self) -> None:
        if self._state in ("published", "aborted"):
            return
        try:
            self.env.close()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self._state = "aborted"


class _SplitWriter:
    """The RecordWriter interface for one split of an :class:`LMDBWriter`."""

    def __init__(self, parent: LMDBWriter, name: str,
                 resume: Optional[Tuple[int, int]] = None):
        self.parent, self.name = parent, name
        self.db = parent.env.open_db(name.encode())
        count, nbytes = resume or (0, 0)
        if resume is not None:  # drop whatever was committed after the checkpoint
            with parent.env.begin(write=True, db=self.db) as txn:
                cur = txn.cursor()
                if cur.set_range(record_key(count)):
                    while cur.delete():
                        pass
        self.count = count
        self.bytes_written = nbytes
        self._batch: List[Tuple[bytes, bytes]] = []
        self._state = "open"

    def write(self, key: int, payload: bytes) -> int:
        """Append a record (``key`` is ignored: LMDB keys are positions)."""
        pos = self.count
        self._batch.append((record_key(pos), bytes(payload)))
        self.count += 1
        self.bytes_written += len(payload)
        if len(self._batch) >= self.parent.commit_every:
            self._flush()
        return pos

    def _flush(self, progress: Optional[bytes] = None):
        if self._batch or progress is not None:
            self.parent._commit(self.db, self._batch, progress)
            self._batch = []

    keeps_progress = True  # a conversion's checkpoint commits with the records

    def sync(self) -> Tuple[int, int]:
        """``(count, bytes)``, the argument ``resume`` takes to continue from here; the
        records up to it become durable with the next :meth:`checkpoint`."""
        return self.count, self.bytes_written

    def checkpoint(self, progress: bytes) -> None:
        """Commit the buffered records together with ``progress`` (atomically)."""
        self._flush(progress)

    def finish(self, meta: Optional[dict] = None) -> None:
        self._flush()
        if meta is not None:
            self.parent.put_meta(self.name, dict(meta, container="lmdb"))
        self._state = "finished"

    def publish(self) -> None:
        self.parent.publish()
        self._state = "published"

    def suspend(self) -> None:
        self.parent.suspend()
        self._state = "suspended"

    def abort(self) -> None:
        self.parent.abort()
        self._state = "aborted"
