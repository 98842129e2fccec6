"""The user cache: one folder, one trust rule, one size limit.

Everything gluon_data keeps for later lives in one folder
(:func:`~gluon_data.storage.fsutil.default_cache_dir`: ``$GLUON_DATA_CACHE_DIR``, else
``~/.cache/gluon_data``) and follows the rule of :class:`Cache`:

* ``objects/<key>/<name>``: whole downloaded objects (:class:`~gluon_data.storage.objects.ShardCache`);
* ``index/<key>/index.gdx``: big stock ``.idx`` files parsed once (:mod:`gluon_data.stores.recordio`);
* ``staging/<key>/``: a conversion into object storage staged before its upload
  (:meth:`Cache.staging`, :mod:`gluon_data.convert.to_uri`), pinned while in use, kept for
  ``resume`` after a failure, removed once uploaded;
* ``locks/<key>.pin`` / ``.get`` / ``.seal``: readers' pins, one maker per entry, the seal
  (a staging area's pin: ``locks/staging-<key>.pin``);
* ``key``: the secret the seals are keyed with; ``cache.lock``: room-making.

**Trust rule.** The cache folder and every folder in it must be a real directory owned by the
user (or root) and not writable by group or others, as ssh asks of ``~/.ssh``; the folders the
cache creates (missing parents of the cache folder included) are created ``0700``. An entry is
used only if its file is a regular file (``lstat``: no link, no FIFO) that matches its *seal*:
``locks/<key>.seal`` records the file's SHA-256 and identity (device, inode, size, mtime,
ctime) under an HMAC-SHA256 keyed with ``key`` (32 random bytes, ``0600``, made once), so only
this cache can have written it. Checking a seal costs one ``lstat`` and a small read; a file
whose identity changed is hashed again and trusted only if it still holds the sealed bytes (or
the SHA-256 the dataset records). A file the cache did not make is never served, replaced nor
removed: temporaries are created exclusively under fixed names and removed by exact name, and
only the file the seal names (its inode) is ever replaced. Eviction removes whole entry folders
(real directories owned by the user, least recently used first, never one pinned).

**One limit.** Entries of every kind (staging areas with everything under them) count
against ``cache_limit`` (default ``$GLUON_DATA_CACHE_LIMIT``, else none) and are evicted by
the same :meth:`Cache.make_room`, least recently used first, never one pinned (a download in
flight or read, a staging area in use). A staging area kept for ``resume`` is an entry like
any other: when the limit needs its room it is evicted, and a resume then starts over.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import hmac
import json
import os
import re
import shutil
import stat
import threading
import time
import warnings
from typing import List, Optional, Sequence, Tuple

import numpy as np

from ..errors import CacheError
from .fileio import stat_stamp
from .fsutil import (CacheLock, atomic_write, default_cache_dir, kind_of, open_new,
                     sha256_file)
from .staging import Staging, remove_tree_entry, tree_bytes

__all__ = ["Cache", "parse_size"]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)\s*$", re.I)
KINDS = ("objects", "index", "staging")  # the entry folders, under one limit
_SEAL_TAG = b"gluon_data cache seal v1\0"


def parse_size(value) -> Optional[int]:
    """``"20GB"`` -> bytes (``KB``/``MB``/``GB``/``TB`` are powers of 1000, ``KiB``... of
    1024); an int passes through; ``None`` or ``""`` means no limit."""
    if value is None or value == "":
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    m = _SIZE.match(str(value))
    if not m:
        raise ValueError("cannot read %r as a size (e.g. 500MB, 20GB, 1GiB)" % (value,))
    unit = m.group(2).lower().rstrip("b")
    base = 1024 if unit.endswith("i") else 1000
    power = " kmgt".index(unit[:1]) if unit else 0
    return int(float(m.group(1)) * base ** power)


_kind_of = kind_of


def _regular_or_absent(path: str, role: str) -> None:
    """Raise :class:`CacheError` naming ``path`` and what it is unless it is missing or a
    regular file: the one check before the cache opens or replaces a file of its own (the
    key, a seal, a seal's temporary), so a link or folder planted there is refused, untouched,
    instead of surfacing as a raw ``OSError``."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise CacheError("is %s, not %s of the cache (a regular file); it was left "
                         "untouched: remove it" % (_kind_of(st), role), path)


def _check_dir(path: str, follow: bool = False) -> None:
    """Raise :class:`CacheError` unless ``path`` is a directory owned by the user (or root)
    that group and others cannot write (``follow``: the cache folder itself may be a link)."""
    st = os.stat(path) if follow else os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise CacheError("is %s, not a folder of the cache; it was left untouched: remove it "
                         "or choose another cache folder" % _kind_of(st), path)
    if st.st_uid not in (os.geteuid(), 0):
        raise CacheError("is owned by uid %d, not by you (uid %d): a cache someone else can "
                         "write is never trusted; choose another cache folder"
                         % (st.st_uid, os.geteuid()), path)
    if st.st_mode & 0o022:
        raise CacheError("is writable by group or others (mode %03o): a cache others can write "
                         "is never trusted; chmod 700 it, or choose another cache folder"
                         % (st.st_mode & 0o777), path)


def private_dir(path: str, follow: bool = False) -> str:
    """``path`` as a trusted folder (:func:`_check_dir`), created ``0700`` if missing, with
    each missing parent created (and checked) the same way."""
    missing = []
    p = os.path.abspath(path)
    while not os.path.lexists(p) and os.path.dirname(p) != p:
        missing.append(p)
        p = os.path.dirname(p)
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
        _check_dir(d)  # a folder we meant to create: someone else's is refused
    _check_dir(path, follow=follow and not missing)
    return path


def _lock_key(kind: str, key: str) -> str:
    """The name an entry's locks go by (``locks/<name>.pin``): a staging area's are
    prefixed, so they never share a download's."""
    return "staging-" + key if kind == "staging" else key


def _identity(st: os.stat_result) -> List[int]:
    return list(stat_stamp(st))


class Cache:
    """The cache folder under the trust rule and the limit (see the module's docstring).

    Parameters
    ----------
    cache_dir : str, optional
        Default ``$GLUON_DATA_CACHE_DIR``, else ``~/.cache/gluon_data``.
    cache_limit : int or str, optional
        Bytes (``"20GB"`` works) both kinds of entries may hold together; default
        ``$GLUON_DATA_CACHE_LIMIT``, else no limit.
    """

    def __init__(self, cache_dir: Optional[str] = None, cache_limit=None):
        self.cache_dir = os.path.abspath(os.fspath(cache_dir or default_cache_dir()))
        self.cache_limit = parse_size(cache_limit if cache_limit is not None
                                      else os.environ.get("GLUON_DATA_CACHE_LIMIT"))
        self._locks = os.path.join(self.cache_dir, "locks")
        self._ready = False

    @classmethod
    def for_file(cls, path: str) -> "Cache":
        """The cache holding ``path`` if it is a downloaded object's copy
        (``<cache>/objects/<key>/<name>``, the cache's ``key`` beside ``objects``), else the
        default cache: an ``.idx`` downloaded into a cache is parsed into the same one."""
        entry = os.path.dirname(os.path.abspath(path))
        objects = os.path.dirname(entry)
        root = os.path.dirname(objects)
        if os.path.basename(objects) == "objects" and os.path.isfile(os.path.join(root, "key")):
            return cls(root)
        return cls()

    # -- folders, locks, the secret ------------------------------------------------------
    def ready(self) -> "Cache":
        """Check (and make) the cache folder and its sub-folders; :class:`CacheError`."""
        if not self._ready:
            private_dir(self.cache_dir, follow=True)
            for sub in KINDS + ("locks",):
                private_dir(os.path.join(self.cache_dir, sub))
            self._ready = True
        return self

    def entry(self, kind: str, key: str) -> str:
        """The folder of entry ``key`` of ``kind`` (made ``0700`` if missing)."""
        self.ready()
        return private_dir(os.path.join(self.cache_dir, kind, key))

    def lock(self, key: str, what: str, mode: int, blocking: bool = True) -> CacheLock:
        """``locks/<key>.<what>`` (``pin``: readers, shared; ``get``: the one maker)."""
        return CacheLock(os.path.join(self._locks, "%s.%s" % (key, what)), mode, blocking)

    def _secret(self) -> bytes:
        """The cache's key, made on first use (read each time, ~10 us: a cache folder deleted
        and made again under a running job gets one key for every process)."""
        path = os.path.join(self.cache_dir, "key")
        _regular_or_absent(path, "the key")
        if not os.path.lexists(path):
            tmp = "%s.partial-%d-%d" % (path, os.getpid(), threading.get_ident())
            with open_new(tmp) as f:  # 0644 & umask, then 0600 before a byte is written
                os.fchmod(f.fileno(), 0o600)
                f.write(os.urandom(32))
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)  # appears whole, or not at all if another process won
            except FileExistsError:
                pass
            finally:
                os.remove(tmp)
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
                         | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        except OSError:  # replaced between the check and the open
            _regular_or_absent(path, "the key")
            raise
        try:
            st = os.fstat(fd)
            secret = os.pread(fd, 64, 0) if stat.S_ISREG(st.st_mode) else b""
        finally:
            os.close(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in (os.geteuid(), 0) \
                or st.st_mode & 0o077 or len(secret) != 32:
            raise CacheError("is not the cache's key (a 32-byte file only you can read); it "
                             "was left untouched: remove it", path)
        return secret

    # -- seals ---------------------------------------------------------------------------
    def _mac(self, key: str, body: bytes) -> str:
        return hmac.new(self._secret(), _SEAL_TAG + key.encode() + b"\0" + body,
                        hashlib.sha256).hexdigest()

    def check_sealable(self, key: str) -> str:
        """The path of entry ``key``'s seal, after checking that the key and the seal (and
        its temporary) are regular files or missing: :class:`CacheError` naming a link or
        folder there. Called before a download, so nothing is fetched that cannot be sealed."""
        self._secret()
        seal = os.path.join(self._locks, key + ".seal")
        _regular_or_absent(seal, "a seal")
        _regular_or_absent(seal + ".partial", "a seal's temporary")
        return seal

    def seal(self, key: str, path: str, sha256: str) -> None:
        """Record that ``path`` (just made or checked, holding bytes of ``sha256``) is entry
        ``key``'s file. The caller holds the entry's ``get`` lock."""
        st = os.lstat(path)
        body = json.dumps({"name": os.path.basename(path), "sha256": sha256,
                           "id": _identity(st)}, sort_keys=True).encode()
        seal = self.check_sealable(key)
        atomic_write(seal,
                     self._mac(key, body).encode() + b"\n" + body, sync_dir=False)

    def _read_seal(self, key: str) -> Optional[dict]:
        try:
            fd = os.open(os.path.join(self._locks, key + ".seal"), os.O_RDONLY | getattr(
                os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            mac, _, body = os.pread(fd, 4096, 0).partition(b"\n")
        finally:
            os.close(fd)
        if not hmac.compare_digest(mac, self._mac(key, body).encode()):
            return None
        try:
            return json.loads(body.decode())
        except ValueError:
            return None

    def verify(self, key: str, path: str, sha256: Optional[str] = None,
               locked: bool = False) -> Tuple[bool, bool, str]:
        """``(trusted, replaceable, why not)`` for entry ``key``'s file ``path``: trusted when
        it matches its seal (and, with ``sha256``, holds those bytes); replaceable when it is
        missing or is the very file the seal names (its inode), changed since. ``locked``: the
        caller holds the entry's ``get`` lock (a re-check is sealed again under it)."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return False, True, "missing"
        if not stat.S_ISREG(st.st_mode):
            return False, False, "is %s, not a file of the cache" % _kind_of(st)
        if st.st_uid not in (os.geteuid(), 0):
            return False, False, "is owned by uid %d, not by you" % st.st_uid
        seal = self._read_seal(key)
        if seal is not None and seal.get("name") == os.path.basename(path) \
                and sha256 in (None, seal.get("sha256")):
            if seal.get("id") == _identity(st):
                return True, True, ""
            want, ours = seal.get("sha256"), seal.get("id", [])[:2] == _identity(st)[:2]
        elif sha256 is not None:  # no seal (a crash between rename and seal): the bytes decide
            want, ours = sha256, False
        else:
            return False, False, "has no seal of this cache: gluon-data did not make it"
        got = sha256_file(path)
        if got != want:
            return False, ours, "holds other bytes than the copy gluon-data checked (SHA-256 " \
                "%s, not %s)" % (got, want)
        if locked:
            self.seal(key, path, want)
        else:
            with self.lock(key, "get", fcntl.LOCK_EX):
                self.seal(key, path, want)
        return True, True, ""

    def discard(self, path: str, names: Sequence[str] = ()) -> None:
        """Remove a leftover temporary of ours by its exact name: a regular file, or a folder
        holding at most ``names`` (regular files); anything else there is left untouched and
        raises :class:`CacheError`."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if stat.S_ISREG(st.st_mode):
            os.remove(path)
            return
        if stat.S_ISDIR(st.st_mode):
            for n in names:
                p = os.path.join(path, n)
                try:
                    if stat.S_ISREG(os.lstat(p).st_mode):
                        os.remove(p)
                except FileNotFoundError:
                    pass
            try:
                os.rmdir(path)
                return
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
        raise CacheError("is in the way of a temporary of the cache and is not one (%s, or a "
                         "folder holding files gluon-data did not make); it was left "
                         "untouched: remove it" % _kind_of(st), path)

    # -- one limit -----------------------------------------------------------------------
    def _entries(self) -> List[Tuple[float, int, str, str]]:
        """``(last use, bytes, kind, key)`` of every entry (a real folder of the user's;
        anything else in the entry folders is neither counted nor evicted)."""
        out, me = [], os.geteuid()
        for kind in KINDS:
            top = os.path.join(self.cache_dir, kind)
            try:
                names = os.listdir(top)
            except FileNotFoundError:
                continue
            for key in names:
                d = os.path.join(top, key)
                try:
                    st = os.lstat(d)
                    if not stat.S_ISDIR(st.st_mode) or st.st_uid != me:
                        continue
                    size = tree_bytes(d) if kind == "staging" else 0
                    for e in os.scandir(d) if kind != "staging" else ():
                        if e.is_dir(follow_symlinks=False):  # a download in flight
                            size += sum(f.stat(follow_symlinks=False).st_size
                                        for f in os.scandir(e.path)
                                        if f.is_file(follow_symlinks=False))
                        elif e.is_file(follow_symlinks=False):
                            size += e.stat(follow_symlinks=False).st_size
                except FileNotFoundError:
                    continue
                out.append((st.st_mtime, size, kind, key))
        return out

    def usage(self) -> int:
        """Bytes the cache holds now (both kinds of entries, downloads in flight)."""
        self.ready()
        return sum(e[1] for e in self._entries())

    def make_room(self, incoming: int, keep: str, what: str) -> None:
        """Evict least recently used entries not in use until ``incoming`` more bytes fit the
        limit (the caller holds ``cache.lock``); ``ValueError`` if they never could."""
        limit = self.cache_limit
        if limit is None:
            return
        if incoming > limit:
            raise ValueError("%s has %d bytes, more than the whole cache_limit (%d bytes); "
                             "raise cache_limit (or write smaller shards)"
                             % (what, incoming, limit))
        entries = self._entries()
        total = sum(e[1] for e in entries)
        for used, size, kind, key in sorted(entries):
            if total + incoming <= limit:
                return
            if key == keep:
                continue
            try:  # an entry pinned (read, downloading, a staging area in use) stays
                lock = self.lock(_lock_key(kind, key), "pin", fcntl.LOCK_EX, blocking=False)
            except BlockingIOError:
                continue
            with lock:
                shutil.rmtree(os.path.join(self.cache_dir, kind, key), ignore_errors=True)
                try:
                    os.remove(os.path.join(self._locks, key + ".seal"))
                except FileNotFoundError:
                    pass
            total -= size
        if total + incoming > limit:
            warnings.warn("cache %s: %d bytes in use exceed cache_limit %d; the in-use copies "
                          "are kept" % (self.cache_dir, total + incoming, limit),
                          RuntimeWarning, stacklevel=4)

    def room_lock(self) -> CacheLock:
        """``cache.lock``, held exclusively while room is made and an entry's bytes claimed."""
        return CacheLock(os.path.join(self.cache_dir, "cache.lock"), fcntl.LOCK_EX)

    # -- staging -------------------------------------------------------------------------
    def staging(self, key: str, fresh: bool = False) -> "Staging":
        """Staging area ``key`` (``staging/<key>/``, made ``0700`` under the trust rule),
        pinned until :meth:`Staging.release` (or the ``with`` block ends): it counts toward
        ``cache_limit`` like every entry, and is never evicted while pinned. ``fresh``: empty
        it first (a conversion that does not resume starts clean). Entries not in use are
        evicted first if the cache is over its limit already."""
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", key) or key in (".", ".."):
            raise ValueError("a staging key is a plain name, got %r" % (key,))
        self.ready()
        path = private_dir(os.path.join(self.cache_dir, "staging", key))
        pin = self.lock(_lock_key("staging", key), "pin", fcntl.LOCK_SH)
        try:
            if fresh:
                for e in os.scandir(path):
                    remove_tree_entry(e)
            area = Staging(self, key, path, pin)
            area.claim()
        except BaseException:
            pin.release()
            raise
        return area
