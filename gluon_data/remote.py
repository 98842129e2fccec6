"""Datasets in object storage (``s3://``, ``gs://``, ``https://`` ...) through fsspec.

Three ways bytes move, each built on fsspec (``pip install gluon-data[remote]``; fsspec and
s3fs are imported only here, and only when a URI is used):

* **Training reads** download whole objects (a ``.rec`` and its ``.idx``) into a local
  :class:`ShardCache` -- atomically (temporary file, then rename), verified against the
  SHA-256 the dataset's metadata records, under a size limit with LRU eviction, shared
  between DataLoader workers and between jobs on one node through ``flock`` locks in the
  cache directory -- and then read with the local fast path (:class:`~gluon_data.recordio.
  RecordFile` on the cached file). A partial download is never used.
* **Inspection reads** (``info``, ``show --index N``, ``verify``) fetch only the bytes they
  need with ranged GETs: the metadata, the index, then the records asked for (sequential
  scans read ahead in growing chunks).
* **Writes** (``gluon-data convert SRC s3://bucket/out.rec``, or ``out.lmdb``) convert into a
  local staging folder, then upload the records and indexes (an LMDB's ``data.mdb``), and the
  metadata *last*: the metadata is the commit marker, so a reader never sees a half-written
  dataset. Sharded outputs are uploaded by their shard tasks, each where it runs (a Dask
  worker included: :class:`ShardUploader`), and the manifest last by the client.

Every failure is a typed error naming the URI (:class:`~gluon_data.errors.RemoteError`
and its subclasses); transient ones (connection refused or reset, timeouts, a short read)
are retried a bounded number of times with exponential backoff, by :class:`_Remote` alone
(the client libraries make one try), each attempt cancelled at :func:`attempt_limit`: a
failed call takes at most :func:`call_bound` seconds.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import posixpath
import re
import shutil
import socket
import threading
import uuid
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from . import codec
from .cache import Cache, parse_size
from .credentials import forward_options
from .documents import load_document
from .errors import (CacheError, ChecksumMismatchError, ConversionError, FormatError,
                     OutputError, RemoteConnectionError, RemoteError, RemoteNotFoundError,
                     TruncatedDownloadError)
from .fsutil import CacheLock, default_cache_dir, open_new, sha256_file
from .fsutil import fsync_dir as _fsync_dir
from .lmdbio import LMDBFile, read_lmdb_meta
from .meta import dumps_meta, meta_path
from .recordio import RecordFile, idx_path_for, read_index
from .sampler import SampleKey
from .shards import (MANIFEST_FORMAT, ShardRouter, _load_manifest, _shard_files, is_manifest,
                     manifest_path, prefix_of, read_manifest)
from .store import is_uri, register_opener
from .verify import verify

__all__ = ["RemoteStore", "RemoteLMDBStore", "ShardCache", "BlockShuffleSampler",
           "PrefetchSampler", "filesystem", "parse_storage_options", "parse_size",
           "upload_dataset", "convert_to_uri", "ShardUploader", "call_bound", "attempt_limit",
           "INSTALL_HINT"]

INSTALL_HINT = "pip install gluon-data[remote]"
#: Transient failures are retried this many times (``GLUON_DATA_REMOTE_RETRIES``) ...
RETRIES = int(os.environ.get("GLUON_DATA_REMOTE_RETRIES", "4"))
#: ... sleeping ``BACKOFF * 2**attempt`` seconds (``GLUON_DATA_REMOTE_BACKOFF``), at most 10 s.
BACKOFF = float(os.environ.get("GLUON_DATA_REMOTE_BACKOFF", "0.25"))
#: Client timeouts in seconds for S3 (``GLUON_DATA_REMOTE_CONNECT_TIMEOUT``,
#: ``GLUON_DATA_REMOTE_READ_TIMEOUT``; ``storage_options``' ``config_kwargs`` override them).
#: Every retry is :class:`_Remote`'s (botocore makes one attempt, s3fs one try), so a stalled
#: or unreachable server is a :class:`RemoteConnectionError` after at most
#: :func:`call_bound` seconds: ``RETRIES + 1`` attempts of at most one connect and one read
#: timeout each, plus the backoff sleeps (defaults: 5 x 70 s + 3.75 s).
CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 60.0
#: Slowest transfer rate in bytes/s an attempt is allowed (``GLUON_DATA_REMOTE_MIN_RATE``):
#: one attempt of a call moving ``n`` bytes is cancelled after ``connect + read timeout +
#: n / MIN_RATE`` seconds whatever the client library does (a server that answers an upload's
#: ``Expect: 100-continue``, takes the body and never answers leaves aiohttp without any read
#: timeout; see :func:`call_bound`).
MIN_RATE = 1e6
CHUNK_BYTES = 8 << 20        # one ranged GET of a download (and the largest read-ahead)
UPLOAD_MARKER = ".uploading.json"  # PREFIX.uploading.json: an upload is in progress


# --------------------------------------------------------------------------- options
def parse_storage_options(pairs: Optional[Sequence[str]]) -> dict:
    """CLI ``--storage-option KEY=VALUE`` pairs -> fsspec ``storage_options``. Values are
    read as JSON when they parse (``anon=true``, ``config_kwargs={"connect_timeout": 5}``),
    else kept as strings (``endpoint_url=http://127.0.0.1:9000``)."""
    out = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError("--storage-option expects KEY=VALUE, got %r" % pair)
        try:
            out[key.strip()] = json.loads(value)
        except ValueError:
            out[key.strip()] = value
    return out


def filesystem(uri: str, storage_options: Optional[dict] = None):
    """``(fs, path)`` for ``uri``: an fsspec filesystem built from ``storage_options``
    (endpoint, credentials...; unset ones come from the standard environment or profile,
    e.g. ``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, ``~/.aws``).

    Raises
    ------
    ImportError
        fsspec (or the backend for the URI's scheme, e.g. s3fs) is not installed; the
        message says what to install.
    """
    try:
        import fsspec.core
    except ImportError:
        raise ImportError("reading or writing %s needs fsspec and s3fs: %s"
                          % (uri, INSTALL_HINT)) from None
    try:
        fs, path = fsspec.core.url_to_fs(uri, **_bounded(uri, storage_options))
    except ImportError as e:
        raise ImportError("the filesystem for %s is not installed (%s): %s; other schemes "
                          "need their fsspec backend (gcsfs, adlfs, ...)"
                          % (uri, e, INSTALL_HINT)) from None
    return fs, path


def _is_s3(uri: str) -> bool:
    return uri.split("://", 1)[0] in ("s3", "s3a")


def _bounded(uri: str, storage_options: Optional[dict]) -> dict:
    """``storage_options`` with bounded client timeouts for S3: botocore's
    ``connect_timeout``/``read_timeout`` (aiohttp's socket timeouts) from the environment, and
    one attempt per call in botocore (only :class:`_Remote` retries, bounded, with backoff),
    unless the options' ``config_kwargs`` set them."""
    opts = dict(storage_options or {})
    if not _is_s3(uri):
        return opts
    config = {"connect_timeout": float(os.environ.get("GLUON_DATA_REMOTE_CONNECT_TIMEOUT",
                                                      CONNECT_TIMEOUT)),
              "read_timeout": float(os.environ.get("GLUON_DATA_REMOTE_READ_TIMEOUT",
                                                   READ_TIMEOUT)),
              "retries": {"max_attempts": 1}}
    config.update(opts.get("config_kwargs") or {})
    opts["config_kwargs"] = config
    return opts


def _transient(exc: BaseException) -> bool:
    """Connection refused or reset, timeouts, short reads: worth another try."""
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError,
                        NotADirectoryError, ChecksumMismatchError)):
        return False
    if isinstance(exc, (ConnectionError, TimeoutError, TruncatedDownloadError)):
        return True
    if isinstance(exc, OSError) and exc.errno in (errno.ECONNRESET, errno.ECONNREFUSED,
                                                  errno.ETIMEDOUT, errno.EPIPE):
        return True
    if isinstance(exc, OSError) and exc.errno == errno.EBUSY:
        return True  # s3fs's translation of SlowDown / 503 ServiceUnavailable (throttling)
    names = {c.__name__ for c in type(exc).__mro__}
    # botocore.exceptions.ConnectionError/HTTPClientError (ConnectionClosedError: the server
    # dropped the connection before answering; ReadTimeoutError), ResponseParserError, aiohttp's
    # client errors, http.client.IncompleteRead: raised by the fsspec backends on a broken
    # connection. Everything s3fs's own retry loop retried is here: we own the retries.
    return bool(names & {"ConnectionError", "EndpointConnectionError", "ReadTimeoutError",
                         "ConnectTimeoutError", "ClientConnectionError", "ClientPayloadError",
                         "ServerDisconnectedError", "IncompleteRead", "ResponseStreamingError",
                         "ProtocolError", "ClientOSError", "HTTPClientError",
                         "ConnectionClosedError", "ResponseParserError"})


def attempt_limit(storage_options: Optional[dict] = None, nbytes: int = 0) -> float:
    """Seconds after which one attempt of a remote call moving ``nbytes`` is cancelled:
    the connect and read timeouts (``storage_options``' ``config_kwargs`` or the
    environment) plus ``nbytes`` at :data:`MIN_RATE`."""
    config = _bounded("s3://", storage_options)["config_kwargs"]
    rate = float(os.environ.get("GLUON_DATA_REMOTE_MIN_RATE", MIN_RATE))
    return (float(config["connect_timeout"]) + float(config["read_timeout"])
            + max(0, int(nbytes)) / rate)


def call_bound(retries: Optional[int] = None, backoff: Optional[float] = None,
               storage_options: Optional[dict] = None, nbytes: int = 0) -> float:
    """Seconds one remote call moving ``nbytes`` may take at most before it raises
    (:class:`RemoteConnectionError` once the retries are spent): ``retries + 1`` attempts of
    at most :func:`attempt_limit` each, plus the backoff sleeps between them. botocore makes
    one attempt per call and s3fs one try (their own retry loops, with their own sleeps,
    multiplied the time by 5 and more): every retry is :class:`_Remote`'s, and every attempt
    of an asynchronous filesystem (s3fs, gcsfs, HTTP) is cancelled at its limit.

    >>> round(call_bound(retries=1, backoff=0.5,
    ...                  storage_options={"config_kwargs": {"connect_timeout": 1,
    ...                                                     "read_timeout": 2}}), 2)
    6.5
    """
    retries = RETRIES if retries is None else int(retries)
    backoff = BACKOFF if backoff is None else float(backoff)
    return ((retries + 1) * attempt_limit(storage_options, nbytes)
            + sum(min(10.0, backoff * 2 ** k) for k in range(retries)))


_NO_CREDENTIALS = ("%s: no credentials on host %s: each process, a Dask worker included, "
                   "uses the storage options it was given and its own environment or profile "
                   "(AWS_ACCESS_KEY_ID..., an instance role); configure the workers, or "
                   "convert with --forward-credentials (forward_credentials=True) to send "
                   "this client's")


class _Remote:
    """One storage endpoint: the filesystem (rebuilt lazily in each process) and the retry
    policy. Pickles as its options only."""

    def __init__(self, storage_options: Optional[dict] = None, retries: Optional[int] = None,
                 backoff: Optional[float] = None):
        self.storage_options = dict(storage_options or {})
        self.retries = RETRIES if retries is None else int(retries)
        self.backoff = BACKOFF if backoff is None else float(backoff)
        self._fs: Dict[Tuple[int, str], object] = {}

    def __getstate__(self):
        return {"storage_options": self.storage_options, "retries": self.retries,
                "backoff": self.backoff}

    def __setstate__(self, state):
        self.__init__(**state)

    def fs(self, uri: str):
        proto = uri.split("://", 1)[0]
        key = (os.getpid(), proto)
        fs = self._fs.get(key)
        if fs is None:
            # a fresh instance per process: an async client's event loop does not survive fork
            fs = filesystem(uri, dict(self.storage_options, skip_instance_cache=True))[0]
            if hasattr(fs, "retries"):  # s3fs (and gcsfs) retry inside each call, sleeping;
                fs.retries = 1  # one try each: this class owns every retry (see call_bound)
            self._fs[key] = fs
        return fs, fs._strip_protocol(uri)

    def call(self, uri: str, what: str, fn, nbytes: int = 0):
        """``fn(fs, path, kw)`` with bounded retries; failures become typed errors. ``kw``
        holds the keyword arguments every filesystem call of ``fn`` passes on: for an
        asynchronous filesystem, ``timeout`` (fsspec cancels the attempt then; see
        :func:`attempt_limit`, given the ``nbytes`` the call moves)."""
        last: Optional[BaseException] = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(10.0, self.backoff * 2 ** (attempt - 1)))
            try:
                fs, path = self.fs(uri)
                kw = ({"timeout": attempt_limit(self.storage_options, nbytes)}
                      if getattr(fs, "async_impl", False) else {})
                return fn(fs, path, kw)
            except FileNotFoundError:
                raise RemoteNotFoundError("%s: no such object" % what, uri) from None
            except TruncatedDownloadError as e:  # (a RemoteError, but worth another try)
                last = e
            except RemoteError:
                raise
            except ImportError:
                raise
            except Exception as e:  # noqa: BLE001 - classified below
                if type(e).__name__ in ("NoCredentialsError", "PartialCredentialsError"):
                    raise RemoteError(_NO_CREDENTIALS % (what, socket.gethostname()),
                                      uri) from None
                if not _transient(e):
                    raise RemoteError("%s failed: %s: %s" % (what, type(e).__name__, e),
                                      uri) from e
                last = e
        if isinstance(last, TruncatedDownloadError):
            raise TruncatedDownloadError("%s (after %d attempts)" % (last.reason,
                                                                     self.retries + 1), uri)
        raise RemoteConnectionError("%s failed after %d attempts: %s: %s"
                                    % (what, self.retries + 1, type(last).__name__, last),
                                    uri) from last

    # -- operations ----------------------------------------------------------------------
    def info(self, uri: str) -> dict:
        return self.call(uri, "stat", lambda fs, p, kw: fs.info(p, **kw))

    def exists(self, uri: str) -> bool:
        try:
            self.info(uri)
            return True
        except RemoteNotFoundError:
            return False

    def cat(self, uri: str, start: Optional[int] = None, end: Optional[int] = None) -> bytes:
        """The object's bytes ``[start, end)`` (all of it by default); a short answer to a
        range is a :class:`TruncatedDownloadError` (retried)."""
        def get(fs, p, kw):
            data = fs.cat_file(p, start=start, end=end, **kw)
            if start is not None and end is not None and len(data) != end - start:
                raise TruncatedDownloadError("asked for bytes %d..%d, got %d bytes"
                                             % (start, end, len(data)), uri)
            return data
        return self.call(uri, "read" if start is None else "ranged read", get,
                         nbytes=(end - start) if start is not None and end is not None
                         else CHUNK_BYTES)

    def download(self, uri: str, dest: str, size: int, sha256: Optional[str]) -> str:
        """Write the object's ``size`` bytes to ``dest`` in ranged chunks (each retried),
        check the count and the SHA-256, fsync; returns the SHA-256 of what it wrote. Raises
        on any mismatch; the caller discards ``dest``."""
        digest = hashlib.sha256()
        with open(dest, "r+b") as f:
            pos = 0
            while pos < size:
                end = min(size, pos + CHUNK_BYTES)
                data = self.cat(uri, pos, end)
                f.write(data)
                digest.update(data)
                pos = end
            f.truncate(size)
            f.flush()
            os.fsync(f.fileno())
        if sha256 is not None and digest.hexdigest() != sha256:
            raise ChecksumMismatchError(
                "downloaded %d bytes with SHA-256 %s, but the dataset records %s: "
                "the object was modified or damaged after it was written; the copy was "
                "discarded (re-upload the dataset)" % (size, digest.hexdigest(), sha256), uri)
        return digest.hexdigest()

    def put_file(self, local: str, uri: str) -> None:
        self.call(uri, "upload", lambda fs, p, kw: fs.put_file(local, p, **kw),
                  nbytes=os.path.getsize(local))

    def pipe(self, uri: str, data: bytes) -> None:
        self.call(uri, "upload", lambda fs, p, kw: fs.pipe_file(p, data, **kw),
                  nbytes=len(data))

    def rm(self, uri: str) -> None:
        try:
            self.call(uri, "delete", lambda fs, p, kw: fs.rm_file(p, **kw))
        except RemoteNotFoundError:
            pass


# --------------------------------------------------------------------------- the cache
# the cache directory and its locks are fsutil's, the trust rule and the limit cache.py's (the
# index cache shares them)
_default_cache_dir = default_cache_dir
_Lock = CacheLock


class ShardCache(Cache):
    """A local cache of whole remote objects, shared by every process on the node.

    Layout under ``cache_dir`` (see :mod:`gluon_data.cache` for the trust rule and the one
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
    >>> path, pin = cache.fetch(_Remote(), "s3://bucket/a.rec", size=1 << 20)  # doctest: +SKIP
    """

    PARTIAL = ".partial"

    @staticmethod
    def entry_key(uri: str, stamp: str) -> str:
        # "v2": entries sealed under the trust rule (older, unsealed ones are never consulted)
        return hashlib.sha256(("%s\0%s\0v2" % (uri, stamp)).encode("utf-8")).hexdigest()[:32]

    def fetch(self, remote: _Remote, uri: str, size: int, sha256: Optional[str] = None,
              stamp: str = "", pin: bool = False, check=None):
        """Path of a verified local copy of ``uri`` (downloading it if needed), and a pin:
        a lock keeping the copy from eviction until ``pin.release()`` (``None`` unless
        ``pin``). ``check(path)``, if given, inspects a finished download (a file named like
        the object, alone in a private folder) before it becomes the cached copy, and raises
        to discard it: how objects without a recorded SHA-256 are verified."""
        key = self.entry_key(uri, stamp)
        entry = self.entry("objects", key)
        final = os.path.join(entry, posixpath.basename(uri) or "object")
        held = self.lock(key, "pin", fcntl.LOCK_SH)
        try:
            if not self.verify(key, final, sha256)[0]:
                with self.lock(key, "get", fcntl.LOCK_EX):
                    ok, replaceable, why = self.verify(key, final, sha256, locked=True)
                    if not ok and not replaceable:
                        raise CacheError("%s; it is not served, and was left untouched: "
                                         "remove it (or the whole cache folder %s)"
                                         % (why, self.cache_dir), final)
                    if not ok:
                        self._download(remote, uri, size, sha256, entry, final, key, check)
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
            held = None
        return final, held

    def _download(self, remote, uri, size, sha256, entry, final, key, check=None) -> None:
        # the download lands in a private folder under the object's own name, so a check
        # can open it as it will be (an LMDB environment is a folder holding data.mdb); we
        # hold the object's download lock, so the folder's one name is ours alone
        name = os.path.basename(final)
        part = os.path.join(entry, self.PARTIAL)
        tmp = os.path.join(part, name)
        self.discard(part, [name])  # a crashed download's leftover
        with self.room_lock():
            self.make_room(size, keep=key, what=uri)
            os.mkdir(part, 0o700)
            with open_new(tmp) as f:
                f.truncate(size)  # counted by the next room-making, before a byte arrives
        try:
            digest = remote.download(uri, tmp, size, sha256)
            if check is not None:
                check(tmp)
            os.replace(tmp, final)  # over nothing, or over the sealed copy (our own file)
            self.seal(key, final, digest)
        finally:
            self.discard(part, [name])
        _fsync_dir(entry)


# --------------------------------------------------------------------------- reading
class _RangedRecordFile(RecordFile):
    """A :class:`RecordFile` whose data bytes come from ranged GETs of a remote ``.rec``:
    one GET per record read, growing read-ahead (up to :data:`CHUNK_BYTES`) while reads
    are sequential, as in ``verify``'s scan."""

    def __init__(self, uri: str, remote: _Remote, size: int, keys, offsets,
                 expected_count: Optional[int], idx_uri: str):
        self.path, self.idx_path = uri, idx_uri
        self._remote = remote
        self._meta, self._stamp = None, (0, 0, int(size), 0)  # (the store holds both)
        self._init_index(keys, offsets, size, expected_count)
        self._ahead = threading.local()

    def __getstate__(self):
        state = super().__getstate__()
        state["_ahead"] = None
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self._ahead = threading.local()

    def _fd(self) -> int:  # pragma: no cover - every read is overridden below
        raise RuntimeError("a remote record file has no descriptor")

    def close(self) -> None:
        pass

    def _get(self, n: int, offset: int) -> bytes:
        n = max(0, min(n, self.file_size - offset))
        st = self._ahead
        buf, start = getattr(st, "buf", b""), getattr(st, "start", -1)
        if start <= offset and offset + n <= start + len(buf):
            return buf[offset - start:offset - start + n]
        sequential = start <= offset <= start + len(buf)
        ahead = min(CHUNK_BYTES, max(n, 2 * getattr(st, "ahead", 0))) if sequential else n
        end = min(self.file_size, offset + max(n, ahead))
        have = buf[offset - start:] if sequential else b""  # never fetch a byte twice
        data = have + (self._remote.cat(self.path, offset + len(have), end)
                       if end > offset + len(have) else b"")
        st.buf, st.start, st.ahead = data, offset, ahead
        return data[:n]

    def _pread(self, n: int, offset: int) -> bytes:
        return self._get(n, offset)

    def _readinto(self, view: memoryview, offset: int) -> int:
        data = self._get(len(view), offset)
        view[:len(data)] = data
        return len(data)


def _load_index(local_idx: str, uri: str):
    try:
        return read_index(local_idx)
    except FormatError as e:  # name the object, not the cache file
        raise FormatError(e.reason, uri, e.key, e.offset) from None


class _ProcessLocal:
    """State rebuilt in each process by ``_init_local()`` (caches, locks, open readers, thread
    pools) and named in ``_PROCESS_LOCAL``: left out of pickles, rebuilt on unpickling."""

    _PROCESS_LOCAL: Tuple[str, ...] = ()

    def _init_local(self) -> None:
        raise NotImplementedError

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in self._PROCESS_LOCAL}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_local()


class _ReadsLocalCopy(_ProcessLocal):
    """The record methods of a remote store that reads through a local copy: each is the
    local store's (``self._local()``, opened or downloaded on first use)."""

    def _local(self):
        raise NotImplementedError

    def key(self, i: int) -> int:
        return self._local().key(i)

    def read(self, i: int) -> bytes:
        return self._local().read(i)

    def view(self, i: int):
        return self._local().view(i)

    def scan(self) -> Iterator:
        return self._local().scan()


class RemoteStore(_ReadsLocalCopy):
    """A ``.rec`` with its ``.idx`` (and ``.meta.json``) in object storage, as a record store.

    ``reads='cache'`` (training) downloads the whole ``.rec`` and ``.idx`` into a
    :class:`ShardCache` on the first record read (verified against the SHA-256 sums the
    metadata records when the dataset was uploaded by ``gluon-data convert``) and reads the
    local copies with :class:`~gluon_data.recordio.RecordFile`. ``reads='ranged'``
    (inspection) fetches the index, then only the bytes of the records read. Either way the
    constructor fetches the metadata and the object sizes only.

    Parameters
    ----------
    location : str
        URI of the ``.rec`` (``s3://bucket/prefix/voc_train.rec``).
    split : str, optional
        A ``.rec`` holds one split; when given, it must be the metadata's.
    storage_options : dict, optional
        fsspec options (``endpoint_url``, ``key``/``secret``, ``anon``, ``client_kwargs``...).
        Credentials default to the standard environment or profile; nothing is stored in
        the dataset.
    cache_dir, cache_limit
        The :class:`ShardCache` (defaults: ``$GLUON_DATA_CACHE_DIR`` or
        ``~/.cache/gluon_data``, ``$GLUON_DATA_CACHE_LIMIT`` or unlimited).
    reads : {'cache', 'ranged'}
    retries, backoff : optional
        Retry policy for transient errors (defaults :data:`RETRIES`, :data:`BACKOFF`).
    prefetch_threads : int
        Bound of the background download pool :meth:`prefetch` uses.

    Examples
    --------
    >>> store = RemoteStore("s3://bucket/voc_train.rec",
    ...                     storage_options={"endpoint_url": "http://127.0.0.1:9000"})  # doctest: +SKIP
    >>> len(store), store.meta["task"]                                                # doctest: +SKIP
    (1464, 'segmentation')
    >>> payload = store.read(0)      # downloads voc_train.rec/.idx into the cache once  # doctest: +SKIP
    """

    def __init__(self, location: str, split: Optional[str] = None, *,
                 storage_options: Optional[dict] = None, cache_dir: Optional[str] = None,
                 cache_limit=None, reads: str = "cache", retries: Optional[int] = None,
                 backoff: Optional[float] = None, prefetch_threads: int = 2):
        if reads not in ("cache", "ranged"):
            raise ValueError("reads must be 'cache' or 'ranged', got %r" % (reads,))
        self.location = os.fspath(location)
        self.split = None
        self.reads = reads
        self._remote = _Remote(storage_options, retries, backoff)
        self._cache_args = (cache_dir, cache_limit)
        self._prefetch_threads = max(1, int(prefetch_threads))
        self.idx_location = idx_path_for(self.location)
        self.meta_location = meta_path(self.location)
        self.meta = self._read_meta()
        if split is not None and (self.meta or {}).get("split", split) != split:
            raise ValueError("%s holds split %r, not %r: a .rec holds one split"
                             % (self.location, self.meta["split"], split))
        self._expected = self.meta["num_records"] if self.meta else None
        info = self._remote.info(self.location)
        self.file_size = int(info["size"])
        self._stamps = {self.location: _stamp(info)}
        files = (self.meta or {}).get("files") or {}
        self._sums = {u: files.get(posixpath.basename(u)) for u in (self.location,
                                                                      self.idx_location)}
        want = self._sums[self.location]
        if want is not None and int(want.get("bytes", -1)) != self.file_size:
            raise ChecksumMismatchError(
                "the object has %d bytes but the metadata records %d: it was replaced or "
                "is being rewritten; re-upload the dataset" % (self.file_size, want["bytes"]),
                self.location)
        self._init_local()

    _PROCESS_LOCAL = ("_cache", "_reader", "_pins", "_lock", "_pool", "_pending")

    def _init_local(self):
        self._cache = ShardCache(*self._cache_args)
        self._reader: Optional[Tuple[int, RecordFile]] = None
        self._pins: list = []
        self._lock = threading.Lock()
        self._pool: Optional[ThreadPoolExecutor] = None
        self._pending: Optional[Future] = None

    # -- opening -------------------------------------------------------------------------
    def _read_meta(self) -> Optional[dict]:
        try:
            raw = self._remote.cat(self.meta_location)
        except RemoteNotFoundError:
            prefix = os.path.splitext(self.location)[0]
            if self._remote.exists(prefix + UPLOAD_MARKER):
                raise FormatError("an upload of this dataset is in progress or was interrupted "
                                  "(%s exists, the metadata does not yet): wait for it, or "
                                  "rerun the conversion with --resume"
                                  % (prefix + UPLOAD_MARKER), self.location) from None
            return None
        return load_document(raw, "meta", self.meta_location)

    def _sha(self, uri: str) -> Optional[str]:
        entry = self._sums.get(uri)
        return None if not entry else entry.get("sha256")

    def _stamp_of(self, uri: str) -> str:
        sha = self._sha(uri)
        if sha is not None:
            return "sha256:" + sha
        if uri not in self._stamps:
            self._stamps[uri] = _stamp(self._remote.info(uri))
        return self._stamps[uri]

    def _size_of(self, uri: str) -> int:
        entry = self._sums.get(uri)
        if entry and "bytes" in entry:
            return int(entry["bytes"])
        return self.file_size if uri == self.location else int(self._remote.info(uri)["size"])

    def fetch(self, uri: Optional[str] = None, pin: bool = False):
        """Download ``uri`` (default: the ``.rec``) into the cache if it is not there;
        return ``(local path, pin)``."""
        uri = uri or self.location
        return self._cache.fetch(self._remote, uri, self._size_of(uri), self._sha(uri),
                                 self._stamp_of(uri), pin=pin)

    @classmethod
    def _part(cls, location: str, remote: "_Remote", cache_args, reads: str, records: int,
              size: int, sums: Dict[str, dict], prefetch_threads: int = 2) -> "RemoteStore":
        """One shard of a remote sharded dataset: what the manifest says about it is taken
        as given (no metadata GET, no HEAD of the ``.rec``)."""
        self = cls.__new__(cls)
        self.location, self.split, self.reads, self.meta = location, None, reads, None
        self._remote, self._cache_args = remote, cache_args
        self._prefetch_threads = prefetch_threads
        self.idx_location = idx_path_for(location)
        self.meta_location = meta_path(location)
        self._expected, self.file_size = int(records), int(size)
        self._stamps = {}
        self._sums = {location: sums.get(location), self.idx_location: sums.get(
            self.idx_location)}
        self._init_local()
        return self

    def _open(self) -> RecordFile:
        expected = self._expected
        idx_local, idx_pin = self.fetch(self.idx_location, pin=True)
        pins = [idx_pin]
        try:
            if self.reads == "ranged":
                keys, offsets = _load_index(idx_local, self.idx_location)
                return _RangedRecordFile(self.location, self._remote, self.file_size, keys,
                                         offsets, expected, self.idx_location), pins
            rec_local, rec_pin = self.fetch(self.location, pin=True)
            pins.append(rec_pin)
            try:
                return RecordFile(rec_local, idx_local, expected_count=expected), pins
            except FormatError as e:
                raise FormatError(e.reason, self.location, e.key, e.offset) from None
        except BaseException:
            for p in pins:
                p.release()
            raise

    def record_file(self) -> RecordFile:
        """The reader of this process (opened on first use: the index and, with
        ``reads='cache'``, the data are fetched then)."""
        pid = os.getpid()
        cur = self._reader
        if cur is not None and cur[0] == pid:
            return cur[1]
        with self._lock:
            if self._reader is None or self._reader[0] != pid:
                f, pins = self._open()
                self._pins = pins  # (a forked child keeps its parent's pins too)
                self._reader = (pid, f)
            return self._reader[1]

    def close(self) -> None:
        """Release this process's pins on cached copies (they become evictable)."""
        with self._lock:
            for p in self._pins:
                p.release()
            self._pins = []
            self._reader = None
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

    # -- prefetch ------------------------------------------------------------------------
    def parts(self) -> List[int]:
        """Record counts of the objects downloaded as units (one ``.rec``: ``[len]``)."""
        return [len(self)]

    def prefetch(self, indices: Iterable[int]) -> Optional[Future]:
        """Start downloading, in the background, what reading ``indices`` will need (the
        sampler's upcoming order); returns the future of the download, or ``None`` when
        nothing is needed (ranged reads, already fetched). Bounded: one download per
        object in flight, on at most ``prefetch_threads`` threads."""
        if self.reads != "cache" or not any(True for _ in indices):
            return None
        cur = self._reader
        if cur is not None and cur[0] == os.getpid():
            return None
        with self._lock:
            if self._pending is not None and not self._pending.done():
                return self._pending
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._prefetch_threads,
                                                thread_name_prefix="gluon-data-prefetch")
            def work():
                for uri in (self.idx_location, self.location):
                    self.fetch(uri)
            self._pending = self._pool.submit(work)
            return self._pending

    # -- the store protocol --------------------------------------------------------------
    def __len__(self) -> int:
        if self._expected is not None:
            return int(self._expected)
        return len(self.record_file())

    def _local(self) -> RecordFile:
        return self.record_file()

    def offset(self, i: int) -> Optional[int]:
        return self.record_file().offset(i)

    def check_tail(self) -> None:
        """Check that the last indexed record ends the ``.rec`` (``verify`` does)."""
        self.record_file()._check_tail()

    def identity(self) -> str:
        return self._stamp_of(self.location)

    def __repr__(self) -> str:
        return "RemoteStore(%r, reads=%r)" % (self.location, self.reads)


def _stamp(info: dict) -> str:
    etag = info.get("ETag") or info.get("etag") or info.get("mtime") or ""
    return "etag:%s:%s" % (str(etag).strip('"'), info.get("size"))


def _open_remote(location: str, split: Optional[str] = None, **options) -> RemoteStore:
    return RemoteStore(location, split, **options)


register_opener(is_uri, _open_remote, priority=10)


# --------------------------------------------------------------------------- LMDB
LMDB_DATA = "data.mdb"  # the one file of a published environment (no lock.mdb: FORMAT.md §5)


def _names_remote_lmdb(location: str) -> bool:
    """A URI naming an LMDB environment: ``s3://bucket/voc.lmdb`` (its ``data.mdb`` below)."""
    return is_uri(location) and location.rstrip("/").endswith(".lmdb")


def check_lmdb_download(path: str, uri: str) -> None:
    """The integrity check of a downloaded ``data.mdb`` that no SHA-256 is recorded for.

    Run on the download (``path``, alone in its folder) before it becomes the cached copy:
    everything ``gluon-data verify`` checks, in a child process (LMDB trusts its B-tree pages,
    so a damaged page may crash the reader, which must not be the training process) -- the
    meta pages and the file size they need, every split's metadata (with its ``meta_crc32``)
    and record count, and every record's framing, CRC-32 and header id against its key.
    Together with the size from the object's listing this catches a truncated or damaged
    transfer and a tampered record; it cannot tell bytes LMDB never reads (free pages).

    Raises
    ------
    ChecksumMismatchError
        Naming ``uri``: the first problem found (and how many there are).
    """
    folder = os.path.dirname(path)
    report = verify(folder, deep=False, isolate=True)
    if report.ok:
        return
    first = report.problems[0]
    where = (first["where"] or "").replace(folder, uri.rsplit("/", 1)[0])
    raise ChecksumMismatchError(
        "the downloaded data.mdb fails the integrity check (%s%s: %s; %d problem(s) in all); "
        "the copy was discarded: the object was modified or damaged after it was written "
        "(re-upload the dataset)"
        % (where, "" if first["key"] is None else ", record %s" % first["key"],
           first["reason"], len(report.problems)), uri, first["key"])


LMDB_COMMIT = "meta.json"        # NAME.lmdb/meta.json: the commit document (FORMAT.md §8)
LMDB_MARKER = "uploading.json"   # NAME.lmdb/uploading.json: an upload in progress
LMDB_FORMAT = "gluon_data-lmdb"


class RemoteLMDBStore(_ReadsLocalCopy):
    """One split of an LMDB dataset in object storage, as a record store.

    The dataset is the objects under the URI's prefix (FORMAT.md §8): the environment's
    ``data.mdb`` (``s3://bucket/voc.lmdb/data.mdb``, byte for byte as the local ``voc.lmdb/``
    folder holds it) and, as uploaded by ``gluon-data convert``, the commit document
    ``meta.json`` (every split's metadata, and the size and SHA-256 of ``data.mdb``).

    Training and inspection reads alike download ``data.mdb`` whole into the
    :class:`ShardCache` (once per node; atomically, as ``.rec`` downloads) and read the cached
    copy with the local fast path (:class:`~gluon_data.lmdbio.LMDBFile`, read-only, without a
    lock file). With ``meta.json`` the store opens from it alone (``info`` and ``stats``
    download nothing else), the download happens on the first record read and is verified
    against the recorded SHA-256. A ``data.mdb`` without ``meta.json`` (copied up by other
    tools) is downloaded when opened, since its metadata is inside, and verified by
    :func:`check_lmdb_download`. While ``uploading.json`` exists and ``meta.json`` does not,
    the dataset is refused (an upload is in progress).

    Parameters
    ----------
    location : str
        URI of the environment (``s3://bucket/prefix/voc.lmdb``).
    split : str, optional
        The split (sub-database); default ``train`` if there is one, else the first.
    storage_options, cache_dir, cache_limit, retries, backoff
        As for :class:`RemoteStore`.
    reads : {'cache', 'ranged'}
        Accepted for symmetry with :class:`RemoteStore`; both read the cached download.

    Examples
    --------
    >>> store = RemoteLMDBStore("s3://bucket/voc.lmdb", "val",
    ...                         storage_options={"endpoint_url": "http://127.0.0.1:9000"})  # doctest: +SKIP
    >>> store.splits, len(store), store.meta["task"]                                  # doctest: +SKIP
    (['train', 'val'], 1449, 'segmentation')
    """

    def __init__(self, location: str, split: Optional[str] = None, *,
                 storage_options: Optional[dict] = None, cache_dir: Optional[str] = None,
                 cache_limit=None, reads: str = "cache", retries: Optional[int] = None,
                 backoff: Optional[float] = None, prefetch_threads: int = 2):
        if reads not in ("cache", "ranged"):
            raise ValueError("reads must be 'cache' or 'ranged', got %r" % (reads,))
        self._locate(location)
        self.reads = reads
        self._remote = _Remote(storage_options, retries, backoff)
        self._cache_args = (cache_dir, cache_limit)
        self._init_local()
        doc = self._read_commit()
        try:
            info = self._remote.info(self.data_location)
        except RemoteNotFoundError:
            raise RemoteNotFoundError("no LMDB environment here (no %s object under it)"
                                      % LMDB_DATA, self.location) from None
        self.file_size = int(info["size"])
        if doc is not None:
            want = doc["files"][LMDB_DATA]
            if int(want["bytes"]) != self.file_size:
                raise ChecksumMismatchError(
                    "the object has %d bytes but %s records %d: it was replaced or is being "
                    "rewritten; re-upload the dataset" % (self.file_size, LMDB_COMMIT,
                                                          want["bytes"]), self.data_location)
            self._sha, self._stamp = want["sha256"], "sha256:" + want["sha256"]
            metas = doc["splits"]
        else:  # the metadata lives in data.mdb: download it now (checked by a full scan)
            self._sha, self._stamp = None, _stamp(info)
            path, pin = self.fetch(pin=True)
            self._pins.append(pin)
            try:
                metas = read_lmdb_meta(os.path.dirname(path))
            except FormatError as e:  # name the object, not the cache folder
                raise FormatError(e.reason, self.location, e.key, e.offset) from None
        self.splits = sorted(metas)
        if split is None:
            split = "train" if "train" in metas or not metas else self.splits[0]
        if split not in metas:
            raise FormatError("split %r not found; available splits: %s"
                              % (split, ", ".join(self.splits) or "none"), self.location)
        self.split, self.meta = split, metas[split]
        self._n = int(self.meta["num_records"])
        self._conversion = self.meta.get("conversion_id")

    def _locate(self, location: str) -> None:
        self.location = os.fspath(location).rstrip("/")
        self.data_location = self.location + "/" + LMDB_DATA
        self.commit_location = self.location + "/" + LMDB_COMMIT

    @classmethod
    def _part(cls, location: str, remote: "_Remote", cache_args, split: Optional[str],
              records: int, size: int, sha256: Optional[str]) -> "RemoteLMDBStore":
        """One LMDB shard of a remote sharded dataset: what the manifest says about it (its
        split, records, size and SHA-256 of ``data.mdb``) is taken as given."""
        self = cls.__new__(cls)
        self._locate(location)
        self.reads, self._remote, self._cache_args = "cache", remote, cache_args
        self.file_size, self._sha = int(size), sha256
        self._stamp = None if sha256 is None else "sha256:" + sha256
        self.split, self.splits, self.meta = split or "train", [split or "train"], None
        self._n, self._conversion = int(records), None
        self._init_local()
        return self

    _PROCESS_LOCAL = ("_cache", "_reader", "_pins", "_lock", "_pending")

    def _init_local(self):
        self._cache = ShardCache(*self._cache_args)
        self._reader: Optional[Tuple[int, object]] = None
        self._pins: list = []
        self._lock = threading.Lock()
        self._pending: Optional[Future] = None

    def _read_commit(self) -> Optional[dict]:
        """``meta.json``, checked; ``None`` if there is none (a bare ``data.mdb``)."""
        try:
            raw = self._remote.cat(self.commit_location)
        except RemoteNotFoundError:
            marker = self.location + "/" + LMDB_MARKER
            if self._remote.exists(marker):
                raise FormatError("an upload of this dataset is in progress or was interrupted "
                                  "(%s exists, %s does not yet): wait for it, or rerun the "
                                  "conversion with --resume" % (marker, LMDB_COMMIT),
                                  self.location) from None
            return None
        return load_document(raw, "lmdb_commit", self.commit_location)

    def _stamp_of(self) -> str:
        if self._stamp is None:  # a shard the manifest gives no SHA-256 for
            self._stamp = _stamp(self._remote.info(self.data_location))
        return self._stamp

    def fetch(self, pin: bool = False):
        """Download ``data.mdb`` into the cache if it is not there (verified against the
        recorded SHA-256, else by :func:`check_lmdb_download`); return ``(local path,
        pin)``."""
        check = None
        if self._sha is None:
            check = partial(check_lmdb_download, uri=self.data_location)
        return self._cache.fetch(self._remote, self.data_location, self.file_size, self._sha,
                                 self._stamp_of(), pin=pin, check=check)

    def lmdb_file(self):
        """The :class:`~gluon_data.lmdbio.LMDBFile` of this process on the cached copy
        (downloaded on first use)."""
        pid = os.getpid()
        cur = self._reader
        if cur is not None and cur[0] == pid:
            return cur[1]
        with self._lock:
            if self._reader is None or self._reader[0] != pid:
                self._reader = (pid, self._open())
            return self._reader[1]

    def _open(self):
        path, pin = self.fetch(pin=True)
        try:
            try:
                f = LMDBFile(os.path.dirname(path), self.split)
            except FormatError as e:  # name the object, not the cache folder
                raise FormatError(e.reason, self.location, e.key, e.offset) from None
            if len(f) != self._n or (self._conversion is not None
                                     and f.meta.get("conversion_id") != self._conversion):
                raise FormatError("%s holds %d records of conversion %s in split %r, not the "
                                  "%d of conversion %s the dataset was opened with: it was "
                                  "replaced; open the dataset again"
                                  % (LMDB_DATA, len(f), f.meta.get("conversion_id"),
                                     self.split, self._n, self._conversion), self.location)
        except BaseException:
            pin.release()
            raise
        self._pins.append(pin)  # (a forked child keeps its parent's pins too)
        return f

    def close(self) -> None:
        """Release this process's pins on the cached copy (it becomes evictable)."""
        with self._lock:
            for p in self._pins:
                p.release()
            self._pins = []
            self._reader = None

    # -- what the samplers use ------------------------------------------------------------
    def parts(self) -> List[int]:
        """Records per unit downloaded (the one environment: ``[len]``)."""
        return [len(self)]

    def prefetch(self, indices: Iterable[int]) -> Optional[Future]:
        """Download ``data.mdb`` in the background if it is not cached yet (see
        :meth:`RemoteStore.prefetch`); ``None`` when nothing is needed."""
        cur = self._reader
        if (cur is not None and cur[0] == os.getpid()) or not any(True for _ in indices):
            return None
        with self._lock:
            pending = self._pending
            if pending is None or (pending.done() and pending.exception() is not None):
                self._pending = _prefetch_pool().submit(self.fetch)
            return self._pending

    # -- the store protocol ---------------------------------------------------------------
    def __len__(self) -> int:
        return self._n

    def _local(self):
        return self.lmdb_file()

    def keys(self):
        return self.lmdb_file().keys()

    def offset(self, i: int) -> Optional[int]:
        return None

    def identity(self) -> str:
        """The stamp of ``data.mdb`` (its SHA-256, or ETag and size) and the split's
        ``conversion_id``."""
        return "%s/%s" % (self._stamp_of(), self._conversion or "-")

    def __repr__(self) -> str:
        return "RemoteLMDBStore(%r, split=%r)" % (self.location, self.split)


_POOL: Optional[Tuple[int, ThreadPoolExecutor]] = None


def _prefetch_pool() -> ThreadPoolExecutor:
    """One small background pool per process for LMDB prefetches."""
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid():
        _POOL = (os.getpid(), ThreadPoolExecutor(2, thread_name_prefix="gluon-data-prefetch"))
    return _POOL[1]


def _open_remote_lmdb(location: str, split: Optional[str] = None, **options):
    return RemoteLMDBStore(location, split, **options)


def _remote_lmdb_splits(location: str) -> List[str]:
    """Split names of a remote LMDB (storage options from the standard environment)."""
    return RemoteLMDBStore(location).splits


register_opener(_names_remote_lmdb, _open_remote_lmdb, priority=20, splits=_remote_lmdb_splits)


class RemoteShardedStore(_ProcessLocal, ShardRouter):
    """A sharded dataset in object storage (``s3://bucket/train.shards.json``, the manifest of
    :mod:`gluon_data.shards`) as one record store.

    Each shard is a :class:`RemoteStore` part: downloaded whole into the :class:`ShardCache`
    when first read (its ``.idx`` checked against the manifest's ``idx_sha256``, its ``.rec``
    against the size and, when uploaded by ``gluon-data convert``, the SHA-256 the manifest's
    ``files`` records), then read locally. LMDB shards (``NAME.lmdb/data.mdb``, the manifest's
    ``container`` ``lmdb``) are :class:`RemoteLMDBStore` parts, downloaded whole the same way
    (checked against the SHA-256 the manifest's ``files`` records for ``NAME.lmdb/data.mdb``,
    else by :func:`check_lmdb_download`). At most ``max_open_shards`` shards are held open
    (pinned in the cache) per process; older ones are released and become evictable, so a
    ``cache_limit`` of a few shards serves a dataset of any size. :meth:`prefetch` downloads the
    shards the upcoming indices need, in sampler order, on a bounded pool.

    Parameters
    ----------
    location : str
        URI of the manifest.
    split : str, optional
        Must match the manifest's split when given.
    storage_options, cache_dir, cache_limit, retries, backoff, prefetch_threads
        As for :class:`RemoteStore`.
    max_open_shards : int
        Shards held open (and pinned) per process.
    prefetch_shards : int
        How many shards ahead of the current one :meth:`prefetch` downloads.

    Examples
    --------
    >>> store = RemoteShardedStore("s3://bucket/train.shards.json", cache_limit="4GB")  # doctest: +SKIP
    >>> sampler = PrefetchSampler(BlockShuffleSampler(store.parts(), seed=0), store)  # doctest: +SKIP
    """

    def __init__(self, location: str, split: Optional[str] = None, *,
                 storage_options: Optional[dict] = None, cache_dir: Optional[str] = None,
                 cache_limit=None, reads: str = "cache", retries: Optional[int] = None,
                 backoff: Optional[float] = None, prefetch_threads: int = 2,
                 max_open_shards: int = 2, prefetch_shards: int = 1):
        self.location = os.fspath(location)
        self._remote = _Remote(storage_options, retries, backoff)
        raw = self._remote.cat(self.location)
        manifest = _load_manifest(self.location, raw)[0]  # schema and invariants, as on disk
        if split is not None and split != manifest.get("split"):
            raise FormatError("split %r not found; this manifest holds split %r"
                              % (split, manifest.get("split")), self.location)
        self.manifest, self.meta, self.split = manifest, manifest["meta"], None
        self.reads = reads
        self._opts = ((cache_dir, cache_limit), reads, max(1, int(prefetch_threads)))
        self.max_open_shards = max(1, int(max_open_shards))
        self.prefetch_shards = max(0, int(prefetch_shards))
        self.uris = [_join(self.location, sh["name"]) for sh in manifest["shards"]]
        self._counts = [int(sh["records"]) for sh in manifest["shards"]]
        self._starts = [0] + np.cumsum(self._counts, dtype=np.int64).tolist()
        self._n = self._starts[-1]
        self._identity = "sha256:" + hashlib.sha256(raw).hexdigest()
        self._init_local()

    _PROCESS_LOCAL = ("_stores", "_open_order", "_lock", "_pool", "_inflight", "_pid")

    def _init_local(self):
        files = self.manifest.get("files") or {}
        self._stores = []
        for uri, sh in zip(self.uris, self.manifest["shards"]):
            if self.manifest["container"] == "lmdb":  # NAME.lmdb/data.mdb per shard
                want = files.get(sh["name"] + "/" + LMDB_DATA) or {}
                self._stores.append(RemoteLMDBStore._part(
                    uri, self._remote, self._opts[0], self.manifest.get("split"),
                    sh["records"], sh["bytes"], want.get("sha256")))
                continue
            idx = idx_path_for(uri)
            sums = {uri: files.get(posixpath.basename(uri)) or {"bytes": sh["bytes"]},
                    idx: dict(files.get(posixpath.basename(idx)) or {},
                              sha256=sh.get("idx_sha256"))}
            self._stores.append(RemoteStore._part(uri, self._remote, self._opts[0],
                                                  self._opts[1], sh["records"], sh["bytes"],
                                                  sums, self._opts[2]))
        self._open_order: List[int] = []
        self._lock = threading.Lock()
        self._pool: Optional[ThreadPoolExecutor] = None
        self._inflight: Dict[int, Future] = {}
        self._pid = os.getpid()

    def parts(self) -> List[int]:
        """Records per shard (for :class:`BlockShuffleSampler`)."""
        return list(self._counts)

    def shard(self, s: int) -> RemoteStore:
        """Shard ``s``'s store, kept among this process's ``max_open_shards`` open ones."""
        if self._pid != os.getpid():  # forked: the parent's open list is not ours
            self._open_order, self._pid = [], os.getpid()
            self._inflight, self._pool = {}, None
        order = self._open_order
        if order and order[-1] == s:
            return self._stores[s]
        with self._lock:
            if s in order:
                order.remove(s)
            order.append(s)
            while len(order) > self.max_open_shards:
                self._stores[order.pop(0)].close()  # unpinned; open readers keep working
        return self._stores[s]

    def prefetch(self, indices: Iterable[int]) -> List[Future]:
        """Download the shards holding ``indices`` (the first ``1 + prefetch_shards`` of
        them, in order, counting the shard being read) in the background; returns the futures
        of downloads in flight."""
        if self.reads != "cache":
            return []
        wanted: List[int] = []
        for i in indices:
            s = int(np.searchsorted(self._starts, int(i), side="right")) - 1
            if s not in wanted:
                wanted.append(s)
                if len(wanted) > self.prefetch_shards:
                    break
        reading = self._open_order[-1] if self._open_order else None
        if reading is not None and reading not in wanted:  # the shard being read holds a slot:
            wanted = wanted[:self.prefetch_shards]  # a next one may not evict the one after
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._opts[2],
                                                thread_name_prefix="gluon-data-prefetch")
            for s in wanted:
                fut = self._inflight.get(s)
                if fut is None or (fut.done() and fut.exception() is not None):
                    part = self._stores[s]
                    self._inflight[s] = self._pool.submit(
                        part.fetch if isinstance(part, RemoteLMDBStore) else
                        lambda p=part: [p.fetch(u) for u in (p.idx_location, p.location)])
            return [self._inflight[s] for s in wanted]

    def close(self) -> None:
        for st in self._stores:
            st.close()
        self._open_order = []
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    @property
    def file_size(self) -> int:
        """Bytes of all the shards' ``.rec`` objects."""
        return sum(int(sh["bytes"]) for sh in self.manifest["shards"])

    def check_tail(self) -> None:
        """Check that each shard's last indexed record ends its ``.rec`` (``verify``)."""
        for s in range(len(self._stores)):
            if self.manifest["container"] == "rec":
                self.shard(s).check_tail()

    def __repr__(self) -> str:
        return "RemoteShardedStore(%r, %d shards, %d records)" % (self.location,
                                                                  len(self.uris), self._n)


def _names_remote_manifest(location: str) -> bool:
    return is_uri(location) and location.endswith(".shards.json")


register_opener(_names_remote_manifest, RemoteShardedStore, priority=20)


# --------------------------------------------------------------------------- sampling
class BlockShuffleSampler:
    """Seeded shuffle that keeps each epoch's reads shard-local.

    Each epoch draws one permutation of the parts (shards) and, for every block of
    ``parts_per_block`` consecutive parts in that order, one permutation of the records of
    the block; it yields the blocks one after the other. Only ``parts_per_block`` parts are
    needed at a time, so a cache holding a few shards serves the whole epoch with each shard
    downloaded once, and the next block can be prefetched while this one is read.

    **Shuffle quality.** A full shuffle makes any two records equally likely to meet in a
    batch. Here a batch holds records from at most ``parts_per_block`` parts (two, at a
    block boundary), so a shard with skewed content (e.g. written in class order) gives
    skewed batches. Shuffle the items when converting (``convert --shuffle``) so every shard
    is a random sample, and raise ``parts_per_block`` (at the cost of that many shards in
    the cache) for more mixing; with one block covering every part this is a full shuffle.
    The order is a pure function of ``(seed, epoch, part sizes)``.

    Parameters
    ----------
    part_sizes : sequence of int
        Records per part, in store order (``store.parts()``).
    shuffle : bool
        ``False``: parts and records in store order.
    seed : int
    parts_per_block : int

    Examples
    --------
    >>> s = BlockShuffleSampler([3, 3, 2], seed=0)
    >>> s.set_epoch(1)
    >>> sorted(int(k) for k in s) == list(range(8)), len(s)
    (True, 8)
    """

    def __init__(self, part_sizes: Sequence[int], shuffle: bool = True, seed: int = 0,
                 parts_per_block: int = 1):
        self.part_sizes = [int(n) for n in part_sizes]
        if any(n < 0 for n in self.part_sizes) or int(parts_per_block) < 1:
            raise ValueError("part sizes must be >= 0 and parts_per_block >= 1")
        self._starts = np.concatenate(([0], np.cumsum(self.part_sizes)))
        self.shuffle, self.seed = shuffle, int(seed)
        self.parts_per_block = int(parts_per_block)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return int(self._starts[-1])

    def blocks(self) -> List[np.ndarray]:
        """This epoch's order, block by block (arrays of record indices)."""
        rng = np.random.default_rng([self.seed & 0xFFFFFFFFFFFFFFFF, self.epoch, 0x42534850])
        nparts = len(self.part_sizes)
        order = rng.permutation(nparts) if self.shuffle else np.arange(nparts)
        out = []
        for b in range(0, nparts, self.parts_per_block):
            idx = np.concatenate([np.arange(self._starts[p], self._starts[p + 1])
                                  for p in order[b:b + self.parts_per_block]] or [[]])
            if self.shuffle:
                rng.shuffle(idx)
            out.append(idx.astype(np.int64))
        return out

    def __iter__(self) -> Iterator[SampleKey]:
        epoch = self.epoch
        for block in self.blocks():
            for i in block:
                yield SampleKey(int(i), epoch)


class PrefetchSampler:
    """Wraps a sampler and tells ``store.prefetch`` the next ``lookahead`` indices before
    yielding each one, so downloads run ahead of the DataLoader in the sampler's order.
    The store's cache is shared on the node, so workers find the files the main process
    prefetched.

    Examples
    --------
    >>> store = RemoteStore("s3://bucket/train.rec")                         # doctest: +SKIP
    >>> sampler = PrefetchSampler(BlockShuffleSampler(store.parts(), seed=1), store)  # doctest: +SKIP
    >>> loader = DataLoader(dataset, batch_size=32, sampler=sampler, num_workers=4)  # doctest: +SKIP
    """

    def __init__(self, sampler, store, lookahead: int = 256):
        self.sampler, self.store, self.lookahead = sampler, store, max(1, int(lookahead))

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self):
        window: List = []
        it = iter(self.sampler)
        done = False
        while True:
            while not done and len(window) < self.lookahead:
                try:
                    window.append(next(it))
                except StopIteration:
                    done = True
            if not window:
                return
            self.store.prefetch(int(k) for k in window)
            yield window.pop(0)


# --------------------------------------------------------------------------- writing
def _join(base_uri: str, name: str) -> str:
    return base_uri.rsplit("/", 1)[0] + "/" + name


RECEIPT_SUFFIX = ".upload.json"   # PREFIX-SSSSS-of-NNNNN.upload.json: a shard's upload receipt


def _commit_names(uri: str) -> Tuple[str, str]:
    """``(commit document, upload marker)`` URIs of the dataset at ``uri`` (a ``.rec``, an
    ``.lmdb`` environment or a ``.shards.json`` manifest), as FORMAT.md section 8 names them."""
    uri = uri.rstrip("/")
    if uri.endswith(".lmdb"):
        return uri + "/" + LMDB_COMMIT, uri + "/" + LMDB_MARKER
    if uri.endswith(".shards.json"):
        return uri, uri[:-len(".shards.json")] + UPLOAD_MARKER
    return meta_path(uri), os.path.splitext(uri)[0] + UPLOAD_MARKER


def _lmdb_commit(local: str, files: Dict[str, dict]) -> dict:
    """The commit document of a local LMDB environment uploaded to object storage."""
    return {"format": LMDB_FORMAT, "format_version": 1, "container": "lmdb",
            "splits": read_lmdb_meta(local), "files": files}


def _upload_plan(local: str, uri: str):
    """``(commit uri, commit document, [(local file, uri)], marker uri)`` of one local
    dataset: a ``.rec`` (committed by its metadata), an ``.lmdb`` environment (its
    ``data.mdb``, committed by ``NAME.lmdb/meta.json``) or a ``.shards.json`` (by the
    manifest; its shards' files are data)."""
    if local.rstrip("/").endswith(".lmdb"):
        local = local.rstrip("/")
        target = _join(uri, os.path.basename(local))
        data = os.path.join(local, LMDB_DATA)
        commit, marker = _commit_names(target)
        doc = _lmdb_commit(local, {LMDB_DATA: {"bytes": os.path.getsize(data),
                                               "sha256": sha256_file(data)}})
        return commit, doc, [(data, target + "/" + LMDB_DATA)], marker
    if local.endswith(".shards.json"):
        doc = read_manifest(local)
        folder = os.path.dirname(local)
        pairs, files = [], {}
        for sh in doc["shards"]:
            rec = os.path.join(folder, sh["name"])
            if not os.path.isfile(rec):
                raise ValueError("%s: only RecordIO shards can be uploaded (%s)"
                                 % (local, sh["name"]))
            pairs += [(p, _join(uri, os.path.basename(p)))
                      for p in (rec, idx_path_for(rec), meta_path(rec))]
            files[sh["name"]] = {"bytes": os.path.getsize(rec), "sha256": sha256_file(rec)}
        doc["files"] = files
        commit = _join(uri, os.path.basename(local))
        return commit, doc, pairs, commit[:-len(".shards.json")] + UPLOAD_MARKER
    rec_uri = _join(uri, os.path.basename(local))
    pairs = [(local, rec_uri), (idx_path_for(local), idx_path_for(rec_uri))]
    doc = load_document(meta_path(local), "meta")
    doc["files"] = {posixpath.basename(t): {"bytes": os.path.getsize(p),
                                            "sha256": sha256_file(p)} for p, t in pairs}
    return meta_path(rec_uri), doc, pairs, os.path.splitext(rec_uri)[0] + UPLOAD_MARKER


_NOT_OURS = ("exists and is not a dataset written by gluon-data (no gluon-data metadata %s "
             "beside it, nor an interrupted upload of ours); --overwrite only replaces "
             "gluon-data's own outputs, so it was left untouched: remove it or choose another "
             "output name")


def _remote_is_ours(remote: "_Remote", commit: str, marker: str) -> bool:
    """Whether the objects under a dataset's names are recognisably gluon_data's output, the
    remote form of :func:`gluon_data.fsutil.is_ours`: its commit document (metadata or
    manifest) says ``"format": "gluon_data"`` (``"gluon_data-shards"``), or an upload marker
    of ours says an upload of ours was interrupted. Only content is trusted, never a name."""
    for uri, key, wanted in ((commit, "format", ("gluon_data", MANIFEST_FORMAT, LMDB_FORMAT)),
                             (marker, "writer", ("gluon_data",))):
        try:
            if int(remote.info(uri)["size"]) > 64 << 20:  # no metadata is that large
                continue
            doc = json.loads(remote.cat(uri).decode("utf-8"))
        except (RemoteNotFoundError, UnicodeDecodeError, ValueError):
            continue
        if isinstance(doc, dict) and doc.get(key) in wanted:
            return True
    return False


def upload_dataset(local: Sequence[str], uri: str, *,
                   storage_options: Optional[dict] = None, overwrite: bool = False,
                   resume: bool = False, journal: Optional[str] = None,
                   retries: Optional[int] = None) -> Dict[str, str]:
    """Upload local datasets beside ``uri``: ``.rec`` files (with their ``.idx`` and
    metadata) or ``.shards.json`` manifests (with every shard's files). Returns
    ``{local path: its URI}`` (the ``.rec``, or the manifest).

    Order: ``PREFIX.uploading.json`` markers; the old commit documents (metadata, manifest)
    removed; every data object; every commit document -- the metadata with a ``files`` entry
    recording the size and SHA-256 of its ``.rec`` and ``.idx``, the manifest with one
    recording each shard's ``.rec`` (what readers verify downloads against); then the
    markers removed. A reader therefore sees either no dataset (while the marker exists, an
    error saying an upload is in progress) or a complete one. With ``resume``, objects the
    ``journal`` (a local JSON file) lists as uploaded with the same SHA-256 and found with
    the same size are not sent again, and an identical complete dataset is left alone.

    Raises
    ------
    FileExistsError
        An output object exists and neither ``overwrite`` nor a resumable upload of ours
        (``resume`` with the journal naming it) allows replacing it.
    OutputError
        With ``overwrite``: an output object exists that is not recognisably ours (no metadata
        or manifest of ours under the output name, nor an interrupted upload of ours); nothing
        was changed.
    """
    remote = _Remote(storage_options, retries)
    done: Dict[str, str] = {}
    if resume and journal and os.path.exists(journal):
        done = load_document(journal, "journal")
    local = list(dict.fromkeys(os.fspath(p) for p in local))  # (an LMDB's splits: one path)
    plan = [(p,) + _upload_plan(p, uri) for p in local]
    shas = {t: sha256_file(p) for _, _, _, pairs, _ in plan for p, t in pairs}
    same = set()
    if resume:  # a complete earlier upload identical to this one is left alone
        for _, commit, doc, _, _ in plan:
            try:
                if remote.cat(commit) == dumps_meta(doc):
                    same.add(commit)
            except RemoteNotFoundError:
                pass
    result = {p: (commit if p.endswith(".shards.json") else
                  pairs[0][1][:-len("/data.mdb")] if p.rstrip("/").endswith(".lmdb")
                  else pairs[0][1]) for p, commit, _, pairs, _ in plan}
    if len(same) == len(plan):
        return result
    for _, commit, _, pairs, marker in plan:  # refuse before anything is changed
        ours = None
        for target in [t for _, t in pairs] + [commit]:
            if (resume and target in done) or not remote.exists(target):
                continue
            if not overwrite:
                raise FileExistsError("%s already exists; pass overwrite=True (CLI: "
                                      "--overwrite) to replace it" % target)
            if ours is None:
                ours = _remote_is_ours(remote, commit, marker)
            if not ours:
                raise OutputError(_NOT_OURS % commit.rsplit("/", 1)[-1], target)
    markers = [m for _, _, _, _, m in plan]
    for m in markers:
        remote.pipe(m, json.dumps({"writer": "gluon_data", "started": time.time()}).encode())
    for _, commit, _, _, _ in plan:
        if commit not in same:
            remote.rm(commit)  # no commit document may describe the objects replaced next

    def record(target, sha):
        done[target] = sha
        if journal:
            tmp = journal + ".partial"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(done, f)
            os.replace(tmp, journal)

    for _, commit, _, pairs, _ in plan:
        if commit in same:
            continue
        for path, target in pairs:
            if done.get(target) == shas[target]:
                try:
                    if int(remote.info(target)["size"]) == os.path.getsize(path):
                        continue
                except RemoteNotFoundError:
                    pass
            remote.put_file(path, target)
            record(target, shas[target])
    for _, commit, doc, _, _ in plan:  # the commit documents, last
        if commit not in same:
            remote.pipe(commit, dumps_meta(doc))
            record(commit, "commit")
    for m in markers:
        remote.rm(m)
    return result


class ShardUploader:
    """Where the shard tasks of a sharded conversion into object storage put their shards
    (the ``sink`` of :func:`gluon_data.shards.convert_sharded`). Picklable: it travels with
    every task to the process or Dask worker that runs it, with the storage options
    (credentials stay in memory; nothing of them is written to any object).

    Each task (:meth:`write_shard`) writes its shard into a staging folder local to the machine
    running it, verifies it, uploads its objects, then its receipt
    (``PREFIX-SSSSS-of-NNNNN.upload.json``: the plan digest, each object's size and SHA-256,
    the manifest entry), deletes the staged copy and returns the manifest entry. A shard whose
    receipt carries the shard's plan digest (``job.digest``: its items' names and each file's
    size and mtime, see :mod:`gluon_data.plan`) and whose objects have the recorded sizes is
    kept (a rerun with ``resume``, or Dask retrying a task that died after uploading); a shard
    of a source file changed since is written and uploaded again. The client
    calls :meth:`prepare` before any task (refusals, the upload marker, old commit documents
    removed) and :meth:`finish` after all (the manifests, last; the markers removed).

    Parameters
    ----------
    uri : str
        The output URI the conversion was given (its folder receives the shards).
    remote : _Remote
        Storage options and retry policy.
    staging : str, optional
        Folder for the staged shards; default ``staging/shards/<hash of uri>`` under the
        cache directory of the machine running the task (``$GLUON_DATA_CACHE_DIR`` there,
        else ``~/.cache/gluon_data``).
    overwrite, resume : bool
        As for :func:`convert_to_uri`.

    Examples
    --------
    >>> sink = ShardUploader("s3://bucket/voc.rec", _Remote())
    >>> sink.shard_uri("voc-00000-of-00002.rec")
    's3://bucket/voc-00000-of-00002.rec'
    """

    def __init__(self, uri: str, remote: "_Remote", staging: Optional[str] = None,
                 overwrite: bool = False, resume: bool = False):
        self.uri, self.remote, self.staging = uri, remote, staging
        self.overwrite, self.resume = overwrite, resume
        self.complete: set = set()  # (client) manifests already uploaded for this plan

    def shard_uri(self, name: str) -> str:
        return _join(self.uri, name)

    def receipt_uri(self, name: str) -> str:
        return self.shard_uri(prefix_of(name) + RECEIPT_SUFFIX)

    def _stage_root(self) -> str:
        root = self.staging or os.path.join(_default_cache_dir(), "staging", "shards")
        return os.path.join(os.path.abspath(root),
                            hashlib.sha256(self.uri.encode("utf-8")).hexdigest()[:24])

    # -- client side -----------------------------------------------------------------------
    def _objects(self, job) -> List[str]:
        """URIs of the objects of ``job``'s shard and its receipt."""
        name = os.path.basename(job.path)
        if job.container == "lmdb":
            names = [name + "/data.mdb"]
        else:
            names = [name, idx_path_for(name), meta_path(name)]
        return [self.shard_uri(n) for n in names] + [self.receipt_uri(name)]

    def prepare(self, plans: List[dict], container: str) -> None:
        """Before any task: refuse what may not be replaced (nothing is changed then), put
        each split's upload marker, remove the old manifests and, unless ``resume``, the old
        receipts (so only this run's uploads are kept by a retried task)."""
        remote, todo = self.remote, []
        for p in plans:
            manifest = self.shard_uri(os.path.basename(manifest_path(p["prefix"])))
            commit, marker = _commit_names(manifest)
            if self.resume and self._same_plan(manifest, p["digest"]):
                self.complete.add(manifest)  # complete already: the tasks find every receipt
                continue
            targets = [u for j in p["jobs"] for u in self._objects(j)] + [commit]
            present = self._present(targets)
            ours = None
            for target in targets:
                if target not in present:
                    continue
                if ours is None:
                    ours = _remote_is_ours(remote, commit, marker)
                if self.resume and ours:
                    break  # an interrupted upload of ours: the receipts say what is done
                if not self.overwrite:
                    raise FileExistsError("%s already exists; pass overwrite=True (CLI: "
                                          "--overwrite) to replace it" % target)
                if not ours:
                    raise OutputError(_NOT_OURS % commit.rsplit("/", 1)[-1], target)
            todo.append((p, commit, marker, present))
        for p, commit, marker, present in todo:
            remote.pipe(marker, json.dumps({"writer": "gluon_data",
                                            "started": time.time()}).encode())
            remote.rm(commit)  # no manifest may describe the shards replaced next
            if not self.resume:
                for j in p["jobs"]:
                    receipt = self.receipt_uri(os.path.basename(j.path))
                    if receipt in present:
                        remote.rm(receipt)

    def _same_plan(self, manifest: str, digest: str) -> bool:
        try:
            doc = _load_manifest(manifest, self.remote.cat(manifest))[0]
        except (RemoteNotFoundError, FormatError):
            return False  # none, or not one whole: this run writes it
        return (doc.get("plan") or {}).get("digest") == digest

    def _present(self, uris: List[str]) -> set:
        """Which of ``uris`` exist: one listing per folder (not one request per object)."""
        found = set()
        for folder in sorted({u.rsplit("/", 1)[0] for u in uris}):
            try:
                names = self.remote.call(folder, "list", lambda fs, p, kw: fs.ls(
                    p, detail=False, refresh=True, **kw))
            except RemoteNotFoundError:
                continue
            found.update(n.rstrip("/").rsplit("/", 1)[-1] for n in names)
        return {u for u in uris if u.rsplit("/", 1)[-1] in found}

    def finish(self, report) -> Dict[str, str]:
        """After every task: each split's manifest (the local one, plus ``files``: size and
        SHA-256 of each shard's data object) uploaded last, then the markers removed.
        Returns ``{split: manifest URI}``."""
        out = {}
        for split, local in sorted(report.outputs.items()):
            uri = self.shard_uri(os.path.basename(local))
            commit, marker = _commit_names(uri)
            doc = read_manifest(local)
            files = {}
            for e in report.shards:
                if e["split"] == split:
                    data = e["name"] + "/data.mdb" if doc["container"] == "lmdb" else e["name"]
                    files[data] = e["files"][data]
            doc["files"] = files
            out[split] = uri
            if uri in self.complete and self.remote.cat(commit) == dumps_meta(doc):
                continue  # resumed a complete upload of this plan: nothing to send
            self.remote.pipe(commit, dumps_meta(doc))
            self.remote.rm(marker)
        return out

    # -- task side -------------------------------------------------------------------------
    def _uploaded(self, job) -> Optional[dict]:
        """The manifest entry of ``job``'s shard if its receipt carries this shard's digest
        (same items, same sizes and mtimes) and its objects have the sizes the receipt
        records; else ``None``."""
        name = os.path.basename(job.path)
        uri = self.receipt_uri(name)
        try:
            doc = load_document(self.remote.cat(uri), "receipt", uri)
        except (RemoteNotFoundError, FormatError):
            return None  # none, or damaged: the shard is written and uploaded again
        want = {"index": job.index, "count": job.count, "plan_digest": job.digest}
        if doc["shard"] != want or not doc["files"]:
            return None
        for rel, f in doc["files"].items():
            try:
                if int(self.remote.info(self.shard_uri(rel))["size"]) != f["bytes"]:
                    return None
            except RemoteNotFoundError:
                return None
        return dict(doc["entry"], files=doc["files"], reused=True)

    def write_shard(self, job) -> dict:
        """Task: write, verify and upload shard ``job.index`` (or find it uploaded); return
        its manifest entry with ``files``."""
        import dataclasses

        from .convert.sharded import write_shard  # the converter: only when converting
        done = self._uploaded(job)
        if done is not None:
            return done
        t0 = time.perf_counter()
        name = os.path.basename(job.path)
        folder = os.path.join(self._stage_root(), name + ".d")  # this shard's alone
        os.makedirs(folder, exist_ok=True)
        try:
            local = os.path.join(folder, name)
            summary = write_shard(dataclasses.replace(job, path=local))
            _verify_shard(local, job)
            files = {}
            for path in _shard_files(local, job.container):
                rel = os.path.relpath(path, folder).replace(os.sep, "/")
                files[rel] = {"bytes": os.path.getsize(path), "sha256": sha256_file(path)}
            for rel, f in files.items():
                target = self.shard_uri(rel)
                self.remote.put_file(os.path.join(folder, rel), target)
                size = int(self.remote.info(target)["size"])
                if size != f["bytes"]:
                    raise RemoteError("uploaded %d bytes but the object has %d: the storage "
                                      "did not keep the upload whole" % (f["bytes"], size),
                                      target)
            entry = {k: summary[k] for k in ("name", "records", "bytes", "idx_sha256",
                                             "meta_sha256", "meta")}
            receipt = {"writer": "gluon_data", "format_version": 1,
                       "shard": {"index": job.index, "count": job.count,
                                 "plan_digest": job.digest},
                       "files": files, "entry": entry}
            self.remote.pipe(self.receipt_uri(name), dumps_meta(receipt))
        finally:
            shutil.rmtree(folder, ignore_errors=True)  # the staged copy, uploaded or not
        return dict(entry, files=files, reused=False, seconds=time.perf_counter() - t0)


def _verify_shard(local: str, job) -> None:
    """Check a freshly written shard before it is uploaded: every record's framing and CRC
    (RecordIO: :func:`gluon_data.verify.verify`; LMDB: read back in this process, since
    ``verify`` scans an LMDB in a child process, which a daemonic Dask worker cannot start,
    and this environment was just written by us)."""
    label = "shard %d of %d (%s)" % (job.index, job.count, os.path.basename(local))
    if job.container == "lmdb":
        f = LMDBFile(local, job.split)
        seg = f.meta["task"] == "segmentation"
        try:
            for i in range(len(f)):
                codec.unpack(f.read(i), segmentation=seg, verify=True, path=local,
                             key=f.key(i))
        finally:
            f.close()
        return
    report = verify(local)
    if not report.ok:
        raise ConversionError("%s failed verification before upload: %s"
                              % (label, report.problems[0]["reason"]), local)


def check_bucket(remote: "_Remote", output: str) -> None:
    """Before any conversion: the bucket (the URI's first component) must exist (one HEAD;
    a :class:`RemoteNotFoundError` naming the bucket otherwise)."""
    scheme, _, rest = output.partition("://")
    bucket = rest.split("/", 1)[0]
    try:
        remote.info("%s://%s" % (scheme, bucket))
    except RemoteNotFoundError:
        raise RemoteNotFoundError("bucket %r does not exist (or these credentials cannot see "
                                  "it): create it first; nothing was converted" % bucket,
                                  output) from None


def probe_writable(remote: "_Remote", output: str) -> None:
    """Before any conversion: a uniquely named empty object under the output's folder is
    written and deleted, so missing write or delete permissions show now, not after the
    conversion (the :class:`RemoteError` of the failed call, naming the probe)."""
    name = ".%s.gluon-data-probe-%s" % (posixpath.basename(output), uuid.uuid4().hex[:12])
    target = _join(output, name)
    try:
        remote.pipe(target, b"")
        remote.rm(target)
    except RemoteError as e:
        raise type(e)("cannot write and delete under %s (%s); nothing was converted"
                      % (output, e.reason), target) from None


def convert_to_uri(source: str, output: str, layout: Optional[str] = None, *,
                   storage_options: Optional[dict] = None, cache_dir: Optional[str] = None,
                   overwrite: bool = False, resume: bool = False,
                   retries: Optional[int] = None, forward_credentials: bool = False,
                   **convert_options):
    """:func:`gluon_data.convert.convert` into object storage. Returns the
    :class:`~gluon_data.convert.ConversionReport` with URIs as outputs.

    A ``.rec`` or an ``.lmdb`` environment is converted into a local staging folder
    (``CACHE_DIR/staging/<hash of output>/``, kept until the upload completes, so ``resume``
    continues an interrupted conversion or upload), then uploaded by :func:`upload_dataset`
    (an LMDB as ``NAME.lmdb/data.mdb`` and its commit document ``NAME.lmdb/meta.json``, last).

    With ``shards``, ``shard_size`` or ``shard_items`` (or a ``.shards.json`` source) the
    output is sharded (:func:`gluon_data.shards.convert_sharded`), and each shard task writes,
    verifies and uploads its own shard (:class:`ShardUploader`) where it runs: with
    ``engine='dask'`` on the worker, staged under the worker's own cache directory, so no
    shard passes through this machine. Each split's ``.shards.json`` manifest goes up last.

    Examples
    --------
    >>> convert_to_uri("VOCdevkit", "s3://bucket/voc.rec", layout="voc",
    ...                storage_options={"endpoint_url": "http://127.0.0.1:9000"})  # doctest: +SKIP
    """
    from .convert import convert
    output = os.fspath(output).rstrip("/")
    if forward_credentials:  # this machine's credentials, for the tasks (in memory only)
        storage_options = forward_options(output, storage_options)
    remote = _Remote(storage_options, retries)
    check_bucket(remote, output)
    # refuse an existing output before any work (the split names are checked again later)
    if not resume and remote.exists(output):
        if not overwrite:
            raise FileExistsError("%s already exists; pass overwrite=True (CLI: --overwrite) "
                                  "to replace it" % output)
        commit, marker = _commit_names(output)
        if not _remote_is_ours(remote, commit, marker):
            raise OutputError(_NOT_OURS % posixpath.basename(commit), output)
    cache_root = os.path.abspath(cache_dir or _default_cache_dir())
    staging = os.path.join(cache_root, "staging",
                           hashlib.sha256(output.encode("utf-8")).hexdigest()[:24])
    from .convert.sharded import convert_sharded
    sharded = is_manifest(os.fspath(source)) or any(
        convert_options.get(k) is not None for k in ("shards", "shard_size", "shard_items"))
    if not (resume or sharded):  # (sharded: the upload marker, put before any task, probes)
        probe_writable(remote, output)
    if not resume and os.path.isdir(staging):
        shutil.rmtree(staging)  # our own staging folder: a fresh conversion starts clean
    os.makedirs(staging, exist_ok=True)
    local = os.path.join(staging, posixpath.basename(output) or "out.rec")
    if sharded:
        convert_options.pop("checkpoint_every", None)
        # the tasks stage and upload their own shards: on a Dask worker under its own cache
        # directory (this machine's paths mean nothing there), locally under this one's
        dask = convert_options.get("engine") == "dask"
        sink = ShardUploader(output, remote, staging=None if dask else os.path.join(
            cache_root, "staging", "shards"), overwrite=overwrite, resume=resume)
        try:  # shards resume from their receipts: the client's staging is never kept
            report = convert_sharded(source, local, layout, overwrite=True, sink=sink,
                                     forward_credentials=forward_credentials,
                                     **convert_options)
            report.outputs = sink.finish(report)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return report
    for k in ("shards", "shard_size", "shard_items", "engine", "scheduler"):
        convert_options.pop(k, None)
    report = convert(source, local, layout, overwrite=True, resume=resume, **convert_options)
    uris = upload_dataset([report.outputs[s] for s in sorted(report.outputs)], output,
                          storage_options=storage_options, overwrite=overwrite, resume=resume,
                          journal=os.path.join(staging, "upload.json"), retries=retries)
    report.outputs = {s: uris[p] for s, p in report.outputs.items()}
    shutil.rmtree(staging, ignore_errors=True)
    return report
