"""The local cache of whole remote objects (:class:`ShardCache`)."""
from __future__ import annotations

import fcntl
import hashlib
import os
import posixpath
from typing import Any, Callable, Optional, Tuple


from .cache import Cache
from ..errors import CacheError, ChecksumMismatchError
from .fsutil import CacheLock, default_cache_dir, open_new
from .fsutil import fsync_dir as _fsync_dir
from .remotefs import Remote

__all__ = ["ShardCache", "staging_key"]


def staging_key(uri: str) -> str:
    """The one key of the staging area (:meth:`Cache.staging
    <gluon_data.storage.cache.Cache.staging>`) of an output at ``uri``: the first 24 hex
    digits of the SHA-256 of the URI, so every conversion into ``uri`` (and its resume)
    stages in the same folder.

    >>> staging_key("s3://bucket/train.rec")
    'eaa04199ec373d853f82d67d'
    """
    return hashlib.sha256(uri.encode("utf-8")).hexdigest()[:24]


# --------------------------------------------------------------------------- the cache
# the cache directory and its locks are fsutil's, the trust rule and the limit cache.py's (the
# index cache shares them)
_default_cache_dir = default_cache_dir
_Lock = CacheLock


class ShardCache(Cache):
    """A local cache of whole remote objects, shared by every process on the node.

    Layout under ``cache_dir`` (see :mod:`gluon_data.storage.cache` for the trust rule and the one
    limit it shares with the index cache): ``objects/<key>/<name>`` (a verified copy; the
    folder's mtime is its last use), ``locks/<key>.pin`` (held shared by every process reading
    the copy: an entry in use is never evicted), ``locks/<key>.get`` (one downloader per
    object; the others wait and then use its copy), ``locks/<key>.seal`` (the copy's SHA-256
    and identity, keyed: only this cache can have written it) and ``cache.lock``
    (room-making). A download goes to ``objects/<key>/.partial/<name>`` (made exclusively),
    pre-sized so concurrent downloads count against the limit, and is renamed only after its
    size and SHA-256 (or the ``check`` of :meth:`fetch`) check out; a crash leaves a partial
    that the next download of the object removes, by its exact name. A copy is served only
    while it matches its seal (and the recorded SHA-256); anything else at an entry's name (a
    link, a FIFO, a file of other bytes) is a :class:`~gluon_data.errors.CacheError` naming it,
    left untouched. An LMDB's copy, ``objects/<key>/data.mdb``, makes the entry an environment
    folder. ``<key>`` hashes the URI with the object's checksum (or ETag and size), so a
    replaced object is never served from a stale copy.

    Parameters
    ----------
    cache_dir : str, optional
        Default ``$GLUON_DATA_CACHE_DIR``, else ``~/.cache/gluon_data``.
    cache_limit : int or str, optional
        Bytes (``"20GB"`` works) the cache may hold; least recently used copies not in use
        are evicted to make room. Default ``$GLUON_DATA_CACHE_LIMIT``, else no limit. In-use
        copies are never evicted, so the cache can exceed the limit by what is in use.

    Examples
    --------
    >>> cache = ShardCache("/tmp/gd-cache", cache_limit="2GB")           # doctest: +SKIP
    >>> path, pin = cache.fetch(Remote(), "s3://bucket/a.rec", size=1 << 20)  # doctest: +SKIP
    """

    PARTIAL = ".partial"

    @staticmethod
    def entry_key(uri: str, stamp: str) -> str:
        # "v2": entries sealed under the trust rule (older, unsealed ones are never consulted)
        return hashlib.sha256(("%s\0%s\0v2" % (uri, stamp)).encode("utf-8")).hexdigest()[:32]

    def fetch(self, remote: Remote, uri: str, size: int, sha256: Optional[str] = None,
              stamp: str = "", pin: bool = False, check: Optional[Callable[[str], Any]] = None,
              fresh: bool = False) -> Tuple[str, Optional[CacheLock]]:
        """Path of a verified local copy of ``uri`` (downloading it if needed), and a pin:
        a lock keeping the copy from eviction until ``pin.release()`` (``None`` unless
        ``pin``). ``check(path)``, if given, inspects a finished download (a file named like
        the object, alone in a private folder) before it becomes the cached copy, and raises
        to discard it: how objects without a recorded SHA-256 are verified.

        ``fresh`` (what ``verify`` asks): the object's bytes are read from the remote even
        when a trusted copy is cached, and checked against the recorded SHA-256 (or, without
        one, against the cached copy's: the same version must hold the same bytes). A
        download that matches leaves the cached copy in place (readers may have it open);
        one that does not raises, the cached copy untouched."""
        key = self.entry_key(uri, stamp)
        entry = self.entry("objects", key)
        final = os.path.join(entry, posixpath.basename(uri) or "object")
        held = self.lock(key, "pin", fcntl.LOCK_SH)
        try:
            if fresh or not self.verify(key, final, sha256)[0]:
                with self.lock(key, "get", fcntl.LOCK_EX):
                    ok, replaceable, why = self.verify(key, final, sha256, locked=True)
                    if not ok and not replaceable:
                        raise CacheError("%s; it is not served, and was left untouched: "
                                         "remove it (or the whole cache folder %s)"
                                         % (why, self.cache_dir), final)
                    if not ok or fresh:
                        self._download(remote, uri, size, sha256, entry, final, key, check,
                                       cached=ok)
            st = os.lstat(final)
            if st.st_size != size:
                raise ChecksumMismatchError("the cached copy %s has %d bytes, the object %d; "
                                            "delete the cache folder %s"
                                            % (final, st.st_size, size, self.cache_dir), uri)
            os.utime(entry)  # last use, for LRU: the folder's mtime (the file's is part of
            # the stamp an open RecordFile checks, and of the seal)
        except BaseException:
            held.release()
            raise
        if not pin:
            held.release()
            return final, None
        return final, held

    def _download(self, remote, uri, size, sha256, entry, final, key, check=None,
                  cached: bool = False) -> None:
        # the download lands in a private folder under the object's own name, so a check
        # can open it as it will be (an LMDB environment is a folder holding data.mdb); we
        # hold the object's download lock, so the folder's one name is ours alone
        name = os.path.basename(final)
        part = os.path.join(entry, self.PARTIAL)
        tmp = os.path.join(part, name)
        self.discard(part, [name])  # a crashed download's leftover
        self.check_sealable(key)  # a link or folder at the key or the seal: refused first
        with self.room_lock():
            self.make_room(size, keep=key, what=uri)
            os.mkdir(part, 0o700)
            with open_new(tmp) as f:
                f.truncate(size)  # counted by the next room-making, before a byte arrives
        try:
            digest = remote.download(uri, tmp, size, sha256)
            if check is not None:
                check(tmp)
            if cached:  # read again (fresh): the copy in place must hold the same bytes
                was = (self._read_seal(key) or {}).get("sha256")
                if digest != was:
                    raise ChecksumMismatchError(
                        "the object now holds other bytes (SHA-256 %s) than the copy cached "
                        "of the same version (%s): it was changed in place" % (digest, was), uri)
                return
            os.replace(tmp, final)  # over nothing, or over the sealed copy (our own file)
            try:
                self.seal(key, final, digest)
            except BaseException:  # our file, just renamed, under the get lock: unsealed,
                os.remove(final)   # it would be refused as foreign by every later fetch
                raise
        finally:
            self.discard(part, [name])
        _fsync_dir(entry)
