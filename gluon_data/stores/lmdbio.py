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
from typing import Callable, Dict, List, Optional

import lmdb
import numpy as np

from ..format.documents import load_document
from ..errors import CorruptRecordError, FormatError
from ..storage.fsutil import LMDB_DATA, is_lmdb_dir
from ..storage.perprocess import PerProcess
from ..format.ownership import register_sniffer
from .lmdb_pages import META_DB, PageReader, direct_reads_refused, record_key
from .lmdb_env import (REPLACED, ProcessEnv,  # noqa: F401  (importable from here, as before)
                       check_mapped, env_stamp, shared_env)
from .lmdb_writer import LMDBWriter  # noqa: F401  (gluon_data.stores.lmdbio.LMDBWriter)
from .base import is_uri, register_opener

__all__ = ["LMDBFile", "LMDBWriter", "ProcessEnv", "read_lmdb_meta", "is_lmdb",
           "record_key", "shared_env", "env_stamp"]

def is_lmdb(path: str) -> bool:
    """Whether ``path`` is an LMDB environment directory
    (:func:`~gluon_data.storage.fsutil.is_lmdb_dir`: it holds a ``data.mdb``)."""
    return is_lmdb_dir(path)


def names_lmdb(path: str) -> bool:
    """Whether ``path`` is, or by its ``.lmdb`` suffix is meant to be, an LMDB dataset."""
    path = os.fspath(path)
    return is_lmdb(path) or path.rstrip("/").endswith(".lmdb")


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
#: A scan checks that data.mdb is still as it was opened (size, mtime, ctime: one fstat)
#: before its first record and then every this many records; a read, at every read.
_SCAN_CHECK_EVERY = 64


def _check_entries(path: str, split: str, n: int) -> None:
    """Refuse an entry count that ``data.mdb`` cannot hold (before anything is sized by it)."""
    size = os.path.getsize(os.path.join(path, LMDB_DATA))
    if n > size // _MIN_ENTRY_BYTES:
        raise FormatError("split %r claims %d records, but data.mdb (%d bytes) holds at most "
                          "%d: the file is damaged" % (split, n, size, size // _MIN_ENTRY_BYTES),
                          path)


def from_older_pickle(state: dict) -> dict:
    """A store's state as pickled by a version that kept ``_checked_pid``: its per-process
    check (``_checked``) starts afresh instead (shared with the legacy stores)."""
    if "_checked_pid" not in state:
        return state
    state = {k: v for k, v in state.items() if k != "_checked_pid"}
    state["_checked"] = PerProcess()
    return state


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
        self._checked: PerProcess[bool] = PerProcess()
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

    def _check_identity(self) -> bool:
        """First use in this process (``self._checked``'s factory): open the environment
        and the page reader's descriptor together, each checked against the stamp taken when
        the dataset was opened (:class:`FormatError` "replaced" if the path now names another
        file, or the file was rewritten); from then on both read that file (inode), whatever
        the path names."""
        env, _ = self._env.get(None)
        if self._bound is None:  # pickled by an older version: its identity is the stamp
            dev, ino, _, mtime_ns, txnid = env_stamp(env)
            now = "%d:%d:%d:%d" % (dev, ino, mtime_ns, txnid)
            if now != self._identity.rsplit("/", 1)[-1]:
                raise FormatError("the file was replaced or rewritten after this dataset was "
                                  "opened (identity %s, now %s): %s; open the dataset again"
                                  % (self._identity, now, REPLACED), self.path)
        if self._pages is not None:
            self._pages.open()
        return True

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
        self._checked.get(self._check_identity)
        i = int(i)
        if not 0 <= i < self._n:
            raise IndexError("record %d out of range (%d records)" % (i, self._n))
        if self._pages is not None:
            v = self._pages.view(i)
            if v is not None:
                # as a read through py-lmdb is checked: the file still as it was opened (after
                # the read: the bytes handed out predate any rewrite)
                self._env.check()
                return v
        k = record_key(i)
        value = self._env.get_value(k, self.split, record=i)
        if value is None:
            raise FormatError("record key %r missing from split %r" % (k.decode(), self.split),
                              self.path, i)
        return value

    def will_need(self, indices, wait: bool = False) -> None:
        """Start fetching the values of the records at positions ``indices`` (the batch about
        to be read) into the page cache and return at once: ``posix_fadvise(WILLNEED)`` on
        the overflow pages of each value in ``data.mdb`` (see
        :meth:`~gluon_data.stores.lmdb_pages.PageReader.will_need`), so the device serves them
        together and each :meth:`read` that follows finds its pages cached (and checks the
        overflow page header, as always). Values stored inline in the leaf pages, and every
        value where direct reads are off, are left to the read. Positions out of range are
        ignored. ``wait`` changes nothing: the kernel's reads are not waited for."""
        if self._pages is None:
            return
        self._checked.get(self._check_identity)
        self._env.check()
        self._pages.will_need(indices)

    def scan(self):
        """Every payload in position order, read with one cursor in one read transaction
        (each a ``memoryview`` valid until the next one is produced)."""
        self._checked.get(self._check_identity)
        env, db = self._env.get(self.split)
        n = 0
        try:
            with env.begin(db=db, buffers=True) as txn:
                for k, v in txn.cursor().iternext():
                    if bytes(k) != record_key(n):
                        raise FormatError("unexpected key %r at position %d of split %r (keys "
                                          "must be %r ...)" % (bytes(k), n, self.split,
                                                              record_key(n)), self.path, n)
                    if not n % _SCAN_CHECK_EVERY:  # the file still as opened (one fstat)
                        self._env.check()
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

    def __setstate__(self, state):  # (a PerProcess pickles empty: a copy checks on first read)
        self.__dict__.update(from_older_pickle(state))
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
