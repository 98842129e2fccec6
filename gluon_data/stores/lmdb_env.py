"""LMDB environments, one per file per process: opened read-only, guarded against a
``data.mdb`` that shrinks under its map (no SIGBUS), cached by inode, reset after a fork, and
bound to the file identity they were opened with (:class:`ProcessEnv`, :func:`env_stamp`).
The LMDB store (:mod:`.lmdbio`) reads through them."""
from __future__ import annotations

import os
from typing import Dict, Optional, Tuple, cast

import lmdb

from ..errors import CorruptRecordError, FormatError
from ..storage.fileio import FILE_ID, open_or_explain, path_stamp, replaced_error, stat_stamp
from ..storage.fsutil import LMDB_DATA
from ..storage.perprocess import PerProcess
from .lmdb_pages import MAX_DBS as _MAX_DBS
from .lmdb_pages import check_data_file as _check_data_file
from ..format.recindex import file_stamp

__all__ = ["ProcessEnv", "shared_env", "env_stamp", "check_mapped", "close_envs"]


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


def check_mapped(env: lmdb.Environment, st: Optional[os.stat_result] = None) -> None:
    """Raise :class:`FormatError` if the ``data.mdb`` behind an open read-only ``env`` is now
    shorter than when it was opened (reading it would kill the process with SIGBUS); ``st``:
    the file's ``fstat`` if the caller took it already."""
    g = _GUARDS.get(id(env))
    if g is None:
        return
    size = (os.fstat(g[0]) if st is None else st).st_size
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
# forbids using one inherited across fork: the table is this process's (PerProcess), and a
# child closes what it inherited (which leaves the parent's untouched) before opening its own.
def _close_inherited(envs: Dict[Tuple[str, int, int], lmdb.Environment]) -> None:
    for env in envs.values():
        try:
            _forget_guard(env)
            env.close()  # inherited across fork: release this process's copy
        except Exception:
            pass


_ENVS: PerProcess[Dict[Tuple[str, int, int], lmdb.Environment]] = PerProcess(_close_inherited)


def _cached(envs: dict, file: Optional[Tuple[int, ...]]) -> Optional[lmdb.Environment]:
    """The environment of the file ``(device, inode)`` in ``envs``, if there is one."""
    if file is not None:
        for key, env in envs.items():
            if key[1:] == file:
                return env
    return None


def _open_env(envs: dict, path: str) -> lmdb.Environment:
    """The environment of the ``data.mdb`` that ``path`` names now. The file is opened (our
    guard descriptor) and checked first, then found in this process's table ``envs`` by its
    inode or mapped by LMDB through its path, and the path looked at again: if it names
    another file by then, the map may be of either, so it is opened again (a republish in
    between). Called with the table's lock held."""
    data = os.path.join(path, LMDB_DATA)
    for _ in range(3):
        if not os.path.isfile(data):
            _check_data_file(path)  # raises: "not an LMDB environment ..."
        fd = open_or_explain(data)
        env = None
        try:
            st = os.fstat(fd)
            key = stat_stamp(st, FILE_ID)
            env = _cached(envs, key)
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
                envs[(os.path.realpath(path),) + key] = env
                fd = -1  # the guard's now
                return env
        finally:
            if fd >= 0:
                os.close(fd)
        if env is not None:
            env.close()
    raise FormatError("data.mdb was replaced again and again while it was being opened; open "
                      "the dataset once its publisher is done", path)


def _names(data: str) -> Optional[Tuple[int, ...]]:
    """``(device, inode)`` of the file the path ``data`` names now (``None``: none)."""
    return path_stamp(data, FILE_ID)


def shared_env(path: str) -> lmdb.Environment:
    """The process's read-only environment of the ``data.mdb`` that ``path`` names now
    (opened on first use; one per file, whatever path reaches it)."""
    file = _names(os.path.join(path, LMDB_DATA))
    envs = _ENVS.get(dict)  # (a forked child's first call closes what it inherited)
    with _ENVS.lock():
        env = _cached(envs, file)
        if env is not None:
            return env
        return _open_env(envs, path)


def close_envs(under: str = "") -> None:
    """Close this process's environments of folders whose real path starts with ``under``
    (every one by default): pages they map cannot be evicted, nor their mount unmounted.
    A reader that reads again opens its environment again."""
    envs = _ENVS.peek() or {}
    with _ENVS.lock():
        for key in [k for k in envs if k[0].startswith(under)]:
            env = envs.pop(key)
            _forget_guard(env)
            env.close()


def _fstat(env: lmdb.Environment) -> Optional[os.stat_result]:
    """``fstat`` of the ``data.mdb`` an environment of :func:`shared_env` maps (its guard
    descriptor; about a microsecond)."""
    g = _GUARDS.get(id(env))
    return None if g is None else os.fstat(g[0])


def _state_of(st: os.stat_result) -> Tuple[int, int, int]:
    """What a rewrite in place changes: size, mtime and ctime (which no user can set back)."""
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _main_records(env: lmdb.Environment) -> Optional[Dict[bytes, bytes]]:
    """The records of the main database where they are sub-databases (ours: each one's name
    and descriptor -- its root page, depth and counts, which any commit to it changes), at
    most ``MAX_DBS`` of them; ``None`` where the main database holds more (a legacy layout
    keeps its samples there: no snapshot is taken, so nothing of the dataset is copied)."""
    try:
        if env.stat()["entries"] > _MAX_DBS:
            return None
        with env.begin() as txn:
            return {bytes(k): bytes(v) for k, v in txn.cursor()}
    except lmdb.MapResizedError:  # another process grew the map: adopt its size
        env.set_mapsize(0)
        return _main_records(env)


def env_stamp(env: lmdb.Environment) -> Tuple[int, int, int, int, int]:
    """``(device, inode, size, mtime_ns, txnid)`` of the ``data.mdb`` that an environment of
    :func:`shared_env` maps, now: :func:`~gluon_data.format.recindex.file_stamp` of the file and
    LMDB's last committed transaction id (an environment rewritten in place, even within the
    file system's mtime granularity, has another)."""
    g = _GUARDS.get(id(env))
    if g is None:
        raise ValueError("not an environment of shared_env")
    stamp = file_stamp(os.fstat(g[0])) + (env.info()["last_txnid"],)
    return cast(Tuple[int, int, int, int, int], stamp)  # (file_stamp: four fields)


_STAMP_FIELDS = "device:inode:size:mtime:txnid"
REPLACED = "its records are not the ones this dataset was opened on"


class ProcessEnv:
    """Picklable handle to :func:`shared_env` that re-resolves after fork or unpickling.

    ``bound``: the :func:`env_stamp` taken when the dataset was opened. A bound handle is
    the RecordIO rule applied to an environment: each process resolves it once, when first
    used, and refuses (:class:`FormatError` "replaced") an environment whose ``data.mdb`` is
    not that file any more (another inode at the path: republished) or not in that state
    (rewritten in place); once resolved, it reads the environment of that file, whatever the
    path names later. Every read then (:meth:`run`, :meth:`check`) compares the file's size,
    mtime and ctime with what they were when resolved (one ``fstat``, the one the shrink
    guard takes anyway); if they moved, the file is refused as rewritten unless it was only
    unlinked (a republished path) or another process committed to it without touching a
    sub-database that existed (a later transaction, every record of the main database as it
    was: a scratch sub-database added, say). ``None``: the environment the path names when
    first used (a live environment another process writes: only the shrink guard).
    """

    def __init__(self, path: str, bound: Optional[tuple] = None):
        self.path = path
        self.bound = bound
        # (env, dbs, what data.mdb was when resolved: [size, mtime, ctime, txnid, the main
        # database's records]; None: unbound)
        self._state: PerProcess[Tuple[lmdb.Environment, dict, Optional[list]]] = PerProcess()

    def _resolve(self) -> Tuple[lmdb.Environment, dict, Optional[list]]:
        env = shared_env(self.path)
        if self.bound is None:
            return env, {}, None
        st = _fstat(env)
        now = env_stamp(env)
        if now != tuple(self.bound):
            raise replaced_error(self.path, self.bound, now, fields=_STAMP_FIELDS,
                                 consequence=REPLACED)
        # (st is not None: env_stamp raised were there no guard descriptor)
        return env, {}, list(_state_of(cast(os.stat_result, st))) + [now[4], _main_records(env)]

    def _check(self, env: lmdb.Environment, resolved: Optional[list]) -> None:
        """The shrink guard and, for a bound handle, the file unchanged since resolved."""
        g = _GUARDS.get(id(env))
        if g is None:
            return
        st = os.fstat(g[0])  # (the hot path of every read: fields compared one by one)
        if st.st_size < g[1]:
            check_mapped(env, st)  # raises (a shrink is named as such, before any rewrite)
        if resolved is not None and (st.st_mtime_ns != resolved[1] or st.st_ctime_ns
                                     != resolved[2] or st.st_size != resolved[0]):
            self._changed(env, st, resolved)

    def _changed(self, env: lmdb.Environment, st: os.stat_result, resolved: list) -> None:
        """``data.mdb`` is not as it was when resolved (size, mtime or ctime: a rewrite whose
        mtime was set back still has a new ctime). Refused, unless the file was only unlinked
        (a republished path: its old file, which no path reaches, stays readable), or LMDB
        committed to it since and every sub-database that existed is as it was (where the
        main database holds sub-databases only: a commit to a legacy layout is refused)."""
        now = _state_of(st)
        if now[:2] == tuple(resolved[:2]) and st.st_nlink == 0:
            resolved[2] = now[2]
            return
        txnid = env.info()["last_txnid"]
        if txnid > resolved[3] and resolved[4] is not None:  # (no snapshot: refused)
            records = _main_records(env) or {}
            if all(records.get(k) == v for k, v in resolved[4].items()):
                resolved[:4] = list(now) + [txnid]
                return
        raise replaced_error(self.path, tuple(resolved[:3]), now, fields="size:mtime:ctime",
                             consequence=REPLACED)

    def get(self, db_name: Optional[str] = None):
        """``(env, db)`` for this process; ``db`` is the named sub-database (or main)."""
        env, dbs, _ = self._state.get(self._resolve)
        if db_name not in dbs:
            dbs[db_name] = (env.open_db(db_name.encode(), create=False)
                            if db_name is not None else None)
        return env, dbs[db_name]

    def run(self, db_name: Optional[str], fn, *, buffers: bool = False, where=None,
            record=None):
        """``fn(txn)`` in one short read transaction on sub-database ``db_name``; handles a
        map grown by another process, and an LMDB error is a :class:`CorruptRecordError`."""
        env, db = self.get(db_name)
        state = cast(Tuple[lmdb.Environment, dict, Optional[list]], self._state.peek())
        self._check(env, state[2])  # (self.get made this process's state)
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
        """Before a read that does not go through :meth:`run` (the page reader's): the
        checks :meth:`run` makes, on this process's environment (if it is open)."""
        st = self._state.peek()
        if st is not None:
            self._check(st[0], st[2])

    def __getstate__(self):
        return {"path": self.path, "bound": self.bound}

    def __setstate__(self, d):
        self.__init__(d["path"], d.get("bound"))  # (no "bound": pickled by an older version)
