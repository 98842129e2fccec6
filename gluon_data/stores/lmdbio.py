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
:class:`FormatError` instead of killing the process with SIGBUS. The environments are cached
per process by the file they map (device and inode of ``data.mdb``), never by path alone, and
a reader is bound to the file it was opened on, as a RecordIO reader is (see
:class:`LMDBFile`): a path republished or rewritten in place since is refused when a process
first uses the reader, never read as if it were the dataset opened.

Cold reads: values in LMDB's overflow pages (records bigger than about half a page) are
read by :class:`~gluon_data.stores.lmdb_pages.PageReader`, one ``pread`` per value, where the
environment's on-disk version is one it knows and it is not switched off
(``GLUON_DATA_LMDB_PAGES=0``); every other read goes through py-lmdb. The writer lives in
:mod:`gluon_data.stores.lmdb_writer` (``LMDBWriter`` is importable from here too).
"""
from __future__ import annotations

import os
import threading
from typing import Callable, Dict, List, Optional, Tuple

import lmdb
import numpy as np

from ..format.documents import load_document
from ..errors import CorruptRecordError, FormatError
from ..storage.fileio import open_or_explain, replaced_error
from ..format.ownership import register_sniffer
from .lmdb_pages import MAX_DBS as _MAX_DBS
from .lmdb_pages import META_DB, PageReader, direct_reads_refused, record_key
from .lmdb_pages import check_data_file as _check_data_file
from .lmdb_writer import LMDBWriter  # noqa: F401  (gluon_data.stores.lmdbio.LMDBWriter)
from ..format.recindex import file_stamp
from .base import is_uri, register_opener

__all__ = ["LMDBFile", "LMDBWriter", "ProcessEnv", "read_lmdb_meta", "is_lmdb",
           "record_key", "shared_env", "env_stamp"]

def is_lmdb(path: str) -> bool:
    """Whether ``path`` is an LMDB environment directory (holds a ``data.mdb``)."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "data.mdb"))


def names_lmdb(path: str) -> bool:
    """Whether ``path`` is, or by its ``.lmdb`` suffix is meant to be, an LMDB dataset."""
    path = os.fspath(path)
    return is_lmdb(path) or path.rstrip("/").endswith(".lmdb")


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


# One read-only environment per (file, process), under the key (real path of the folder it
# was first opened through, device, inode of the data.mdb it maps) and found by the device
# and inode alone: those of the file opened, not of what the path named a moment before, so
# the cache never hands out the environment of another file for the same path, and every
# path to one file (a renamed folder, say) shares its environment. LMDB forbids opening an
# environment twice in a process (py-lmdb refuses a second open of the same file), and
# forbids using one inherited across fork: a child closes what it inherited (which leaves
# the parent's untouched) and opens its own.
_ENVS: Dict[Tuple[str, int, int], Tuple[int, lmdb.Environment]] = {}
_ENVS_LOCK = threading.Lock()


def _cached(file: Optional[Tuple[int, int]], pid: int) -> Optional[lmdb.Environment]:
    """This process's environment of the file ``(device, inode)``, if it has one."""
    if file is not None:
        for key, (p, env) in _ENVS.items():
            if key[1:] == file and p == pid:
                return env
    return None


def _open_env(path: str) -> lmdb.Environment:
    """The environment of the ``data.mdb`` that ``path`` names now. The file is opened (our
    guard descriptor) and checked first, then found in the cache by its inode or mapped by
    LMDB through its path, and the path looked at again: if it names another file by then,
    the map may be of either, so it is opened again (a republish in between). Called with
    _ENVS_LOCK held."""
    data = os.path.join(path, "data.mdb")
    pid = os.getpid()
    for _ in range(3):
        if not os.path.isfile(data):
            _check_data_file(path)  # raises: "not an LMDB environment ..."
        fd = open_or_explain(data)
        env = None
        try:
            st = os.fstat(fd)
            key = (st.st_dev, st.st_ino)
            env = _cached(key, pid)
            if env is not None:
                return env  # the file is open already (found through another path)
            need = _check_data_file(path, fd)
            # the data file itself (subdir=False): read-only without locks, the environment
            # is that one file, so an environment rewritten in place (a new data.mdb beside
            # an old lock.mdb) is not taken by py-lmdb for the one still open in this process
            try:
                env = lmdb.open(data, readonly=True, lock=False, readahead=False,
                                meminit=False, max_dbs=_MAX_DBS, subdir=False, create=False)
            except lmdb.Error as e:
                if _names(data) == key:
                    raise FormatError("cannot open LMDB environment: %s" % e, path) from None
                # else the path named another file by then (one open already, say): again
            if env is not None and _names(data) == key:
                _GUARDS[id(env)] = (fd, need, data)
                _ENVS[(os.path.realpath(path),) + key] = (pid, env)
                fd = -1  # the guard's now
                return env
        finally:
            if fd >= 0:
                os.close(fd)
        if env is not None:
            env.close()
    raise FormatError("data.mdb was replaced again and again while it was being opened; open "
                      "the dataset once its publisher is done", path)


def _names(data: str) -> Optional[Tuple[int, int]]:
    """``(device, inode)`` of the file the path ``data`` names now (``None``: none)."""
    try:
        st = os.stat(data)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _reset_lock_after_fork():
    global _ENVS_LOCK
    _ENVS_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_lock_after_fork)


def shared_env(path: str) -> lmdb.Environment:
    """The process's read-only environment of the ``data.mdb`` that ``path`` names now
    (opened on first use; one per file, whatever path reaches it)."""
    file = _names(os.path.join(path, "data.mdb"))
    pid = os.getpid()
    with _ENVS_LOCK:
        env = _cached(file, pid)
        if env is not None:
            return env
        for k in [k for k, (p, _) in _ENVS.items() if p != pid]:
            try:
                old = _ENVS.pop(k)[1]
                _forget_guard(old)
                old.close()  # inherited across fork: release this process's copy
            except Exception:
                pass
        return _open_env(path)


def env_stamp(env: lmdb.Environment) -> Tuple[int, int, int, int, int]:
    """``(device, inode, size, mtime_ns, txnid)`` of the ``data.mdb`` that an environment of
    :func:`shared_env` maps, now: :func:`~gluon_data.format.recindex.file_stamp` of the file and
    LMDB's last committed transaction id (an environment rewritten in place, even within the
    file system's mtime granularity, has another)."""
    g = _GUARDS.get(id(env))
    if g is None:
        raise ValueError("not an environment of shared_env")
    return file_stamp(os.fstat(g[0])) + (env.info()["last_txnid"],)


_STAMP_FIELDS = "device:inode:size:mtime:txnid"
_REPLACED = "its records are not the ones this dataset was opened on"


class ProcessEnv:
    """Picklable handle to :func:`shared_env` that re-resolves after fork or unpickling.

    ``bound``: the :func:`env_stamp` taken when the dataset was opened. A bound handle is
    the RecordIO rule applied to an environment: each process resolves it once, when first
    used, and refuses (:class:`FormatError` "replaced") an environment whose ``data.mdb`` is
    not that file any more (another inode at the path: republished) or not in that state
    (rewritten in place); once resolved, it reads the environment of that file, whatever the
    path names later. ``None``: the environment the path names when first used.
    """

    def __init__(self, path: str, bound: Optional[tuple] = None):
        self.path = path
        self.bound = bound
        self._state: Optional[Tuple[int, lmdb.Environment, dict]] = None
        self._lock = threading.Lock()

    def _resolve(self) -> lmdb.Environment:
        env = shared_env(self.path)
        if self.bound is not None:
            now = env_stamp(env)
            if now != tuple(self.bound):
                raise replaced_error(self.path, self.bound, now, fields=_STAMP_FIELDS,
                                     consequence=_REPLACED)
        return env

    def get(self, db_name: Optional[str] = None):
        """``(env, db)`` for this process; ``db`` is the named sub-database (or main)."""
        pid = os.getpid()
        st = self._state
        if st is None or st[0] != pid:
            with self._lock:
                st = self._state
                if st is None or st[0] != pid:
                    st = self._state = (pid, self._resolve(), {})
        dbs = st[2]
        if db_name not in dbs:
            dbs[db_name] = (st[1].open_db(db_name.encode(), create=False)
                            if db_name is not None else None)
        return st[1], dbs[db_name]

    def run(self, db_name: Optional[str], fn, *, buffers: bool = False, where=None,
            record=None):
        """``fn(txn)`` in one short read transaction on sub-database ``db_name``; handles a
        map grown by another process, and an LMDB error is a :class:`CorruptRecordError`."""
        env, db = self.get(db_name)
        check_mapped(env)
        try:
            try:
                with env.begin(db=db, buffers=buffers) as txn:
                    return fn(txn)
            except lmdb.MapResizedError:  # another process grew the map: adopt its size
                env.set_mapsize(0)
                with env.begin(db=db, buffers=buffers) as txn:
                    return fn(txn)
        except lmdb.Error as e:
            raise CorruptRecordError("LMDB could not read the value (%s: %s)"
                                     % (type(e).__name__, e), where or self.path,
                                     record) from None

    def get_value(self, key: bytes, db_name: Optional[str] = None, *, where=None,
                  record=None) -> Optional[bytes]:
        """The value of ``key`` (``None`` if absent), as :meth:`run` reads it."""
        return self.run(db_name, lambda txn: txn.get(key), where=where, record=record)

    def check(self) -> None:
        """:func:`check_mapped` on this process's environment (if it is open)."""
        st = self._state
        if st is not None and st[0] == os.getpid():
            check_mapped(st[1])

    def __getstate__(self):
        return {"path": self.path, "bound": self.bound}

    def __setstate__(self, d):
        self.__init__(d["path"], d.get("bound"))  # (no "bound": pickled by an older version)


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
    :class:`~gluon_data.stores.base.RecordStore` (the same interface as :class:`RecordFile`).

    Parameters
    ----------
    path : str
        The ``NAME.lmdb`` directory.
    split : str
        Sub-database to read; :class:`FormatError` lists the available ones if absent.
    pages : bool, optional
        ``False``: every read through py-lmdb, never the direct reads of overflow values
        (:class:`~gluon_data.stores.lmdb_pages.PageReader`); ``None`` (default): direct reads unless
        ``$GLUON_DATA_LMDB_PAGES`` is ``0`` when the dataset is opened, or the environment's
        on-disk version is not one the page reader knows (:attr:`pages_refused` says why).

    Keys are positions (``key(i) == i``) and records have no byte offset (``offset(i)`` is
    ``None``).

    ``data.mdb`` is stamped when the split is opened (device, inode, size, mtime and LMDB's
    last transaction id, as :meth:`identity` shows them), and the reader is bound to that
    file as a :class:`~gluon_data.stores.recordio.RecordFile` is bound to its ``.rec``: the first
    read in every process (this one included, a forked or spawned worker, an unpickled copy)
    opens the environment and the page reader's descriptor and compares both with the stamp,
    raising :class:`FormatError` ("replaced") if the path now names another environment
    (republished: ``convert --overwrite``) or the file was rewritten in place, instead of
    reading another dataset's records under this one's length and metadata; once opened,
    both keep reading the file they were opened on, whatever the path names later.

    Examples
    --------
    >>> f = LMDBFile("voc.lmdb", "val")
    >>> payload = f.read(0)
    >>> payload == bytes(next(iter(f.scan()))), f.split, f.offset(0)
    (True, 'val', None)
    """

    def __init__(self, path: str, split: str = "train", *, pages: Optional[bool] = None):
        self.path = os.fspath(path)
        self.split = split
        env = shared_env(self.path)
        #: :func:`env_stamp` of the environment read here, taken before anything is read from
        #: it: every handle of this reader (the environment and the page reader's descriptor,
        #: in this process and in every worker) is bound to it
        self._bound = env_stamp(env)
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
        cid = self.meta.get("conversion_id") or "-"
        dev, ino, _, mtime_ns, txnid = self._bound
        self._identity = "%s/%d:%d:%d:%d" % (cid, dev, ino, mtime_ns, txnid)
        # Not bound to ``env`` yet, in this process either: as a RecordIO reader's descriptor
        # is closed once opened, the first read opens and checks (_check_identity).
        self._checked_pid: Optional[int] = None
        self._env = ProcessEnv(self.path, self._bound)
        self._psize = env.stat()["psize"]
        #: why values are read through py-lmdb only (``None``: overflow values read directly)
        self.pages_refused = direct_reads_refused(self.path, pages)
        self._pages = (None if self.pages_refused else
                       PageReader(self.path, split, n, self._psize, self._env,
                                  stamp=self._bound[:4]))

    # -- store protocol ---------------------------------------------------------------
    @property
    def location(self) -> str:
        return self.path

    def identity(self) -> str:
        """``conversion_id`` of the split's metadata (``-`` without one), the device, inode
        and mtime (ns) of ``data.mdb`` and LMDB's last committed transaction id when the
        split was opened: ``id/device:inode:mtime_ns:txnid``. An environment rewritten in
        place (same file, same size) has another mtime and transaction id."""
        return self._identity

    def _check_identity(self) -> None:
        """First use in this process: open the environment and the page reader's descriptor
        together, each checked against the stamp taken when the dataset was opened
        (:class:`FormatError` "replaced" if the path now names another file, or the file was
        rewritten); from then on both read that file (inode), whatever the path names."""
        env, _ = self._env.get(None)
        if self._bound is None:  # pickled by an older version: its identity is the stamp
            dev, ino, _, mtime_ns, txnid = env_stamp(env)
            now = "%d:%d:%d:%d" % (dev, ino, mtime_ns, txnid)
            if now != self._identity.rsplit("/", 1)[-1]:
                raise FormatError("the file was replaced or rewritten after this dataset was "
                                  "opened (identity %s, now %s): %s; open the dataset again"
                                  % (self._identity, now, _REPLACED), self.path)
        if self._pages is not None:
            self._pages.open()
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
        if self._pages is not None:
            v = self._pages.view(i)
            if v is not None:
                return v
        k = record_key(i)
        v = self._env.get_value(k, self.split, record=i)
        if v is None:
            raise FormatError("record key %r missing from split %r" % (k.decode(), self.split),
                              self.path, i)
        return v

    def will_need(self, indices) -> None:
        """Start fetching the values of the records at positions ``indices`` (the batch about
        to be read) into the page cache and return at once: ``posix_fadvise(WILLNEED)`` on
        the overflow pages of each value in ``data.mdb`` (see
        :meth:`~gluon_data.stores.lmdb_pages.PageReader.will_need`), so the device serves them
        together and each :meth:`read` that follows finds its pages cached (and checks the
        overflow page header, as always). Values stored inline in the leaf pages, and every
        value where direct reads are off, are left to the read. Positions out of range are
        ignored."""
        if self._pages is None:
            return
        if self._checked_pid != os.getpid():
            self._check_identity()
        self._pages.will_need(indices)

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

    def close(self) -> None:
        """Forget this reader's handles (the shared environment stays for other readers); the
        next read opens them again, checked against the stamp taken when it was opened."""
        self._env = ProcessEnv(self.path, self._bound)
        if self._pages is not None:
            self._pages.close(self._env)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_checked_pid"] = None  # an unpickled copy checks the identity on first read
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.__dict__.setdefault("_bound", None)  # pickled by an older version

    def __repr__(self):
        return "LMDBFile(%r, split=%r, %d records)" % (self.path, self.split, self._n)


# layout name -> opener(location, split, **options) for LMDBs in other layouts, registered by
# the modules that read them (gluon_data.stores.legacy: 'raw-lmdb', 'caffe-lmdb'), so this module
# needs none of them.
_LAYOUTS: Dict[str, Callable[..., object]] = {}


def register_layout(name: str, opener: Callable[..., object]) -> None:
    """Make ``open_store(path, split, layout=name, **options)`` on an LMDB directory return
    ``opener(path, split, **options)`` (a store over an LMDB in another layout)."""
    _LAYOUTS[name] = opener


def _open_lmdb(location: str, split: Optional[str] = None, *, layout: Optional[str] = None,
               **options):
    """The :func:`~gluon_data.stores.base.open_store` opener of an LMDB directory: one split of
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
