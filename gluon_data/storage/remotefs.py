"""Options, the fsspec client, and :class:`Remote`: every remote call, made under the one
retry and time-bound policy (:class:`~gluon_data.storage.retry.RetryPolicy`)."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import socket
import threading
import time
import warnings
from typing import Any, Dict, Optional, Sequence, Union
from urllib.parse import urlsplit

from ..errors import (ChecksumMismatchError, RemoteConnectionError, RemoteError,
                      RemoteNotFoundError, TruncatedDownloadError)
# The one retry and time-bound policy (read from the environment at each call), and its
# defaults and bounds where they were always imported from. Every retry is Remote's
# (botocore makes one attempt, s3fs one try, aiohttp sends each request once), so a stalled
# or unreachable server is a RemoteConnectionError after at most call_bound() seconds
# (defaults: 5 x 70 s + 3.75 s).
from .perprocess import PerProcess
from .retry import (BACKOFF, CONNECT_TIMEOUT, MIN_RATE, READ_TIMEOUT, RETRIES,  # noqa: F401
                    RetryPolicy, attempt_limit, call_bound)

_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_uri(location: Union[str, "os.PathLike[str]"]) -> bool:
    """Whether ``location`` names a remote object (``scheme://...``) rather than a path."""
    return _URI.match(os.fspath(location)) is not None


INSTALL_HINT = "pip install gluon-data[remote]"
CHUNK_BYTES = 8 << 20        # one ranged GET of a download (and the largest read-ahead)


class RangesIgnoredError(RemoteError):
    """The server answered a ranged GET with more bytes than were asked for: it ignores
    ``Range`` (a ``200`` with the whole object instead of a ``206``, as Python's
    ``http.server`` does). Not transient: never retried. :meth:`Remote.download` and the
    ranged reader then read whole objects (one GET each) through the cache instead."""


#: Endpoints (``scheme://host:port``) found to ignore ``Range`` in this process: said once
#: (a warning), then read whole, never asked for a range again.
_NO_RANGES: set = set()
_NO_RANGES_LOCK = threading.Lock()


def _endpoint(uri: str) -> str:
    u = urlsplit(uri)
    return "%s://%s" % (u.scheme, u.netloc)



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


def filesystem(uri: str, storage_options: Optional[dict] = None,
               policy: Optional[RetryPolicy] = None):
    """``(fs, path)`` for ``uri``: an fsspec filesystem built from ``storage_options``
    (endpoint, credentials...; unset ones come from the standard environment or profile,
    e.g. ``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, ``~/.aws``). An S3 client gets the
    timeouts of ``policy`` (default: the environment's now, :meth:`RetryPolicy.from_env`).

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
        fs, path = fsspec.core.url_to_fs(uri, **_bounded(uri, storage_options, policy))
    except ImportError as e:
        raise ImportError("the filesystem for %s is not installed (%s): %s; other schemes "
                          "need their fsspec backend (gcsfs, adlfs, ...)"
                          % (uri, e, INSTALL_HINT)) from None
    return fs, path


def _is_s3(uri: str) -> bool:
    return uri.split("://", 1)[0] in ("s3", "s3a")


def _bounded(uri: str, storage_options: Optional[dict],
             policy: Optional[RetryPolicy] = None) -> dict:
    """``storage_options`` for a client that sends each request once (only :class:`Remote`
    retries, bounded, with backoff): over HTTP(S) an aiohttp session without its own resend
    (``get_client``), and for S3 botocore's ``connect_timeout``/``read_timeout`` (aiohttp's
    socket timeouts) from ``policy`` (default: the environment now,
    :meth:`RetryPolicy.from_env`), one attempt per call in botocore and the same aiohttp
    session, unless the options set them."""
    opts = dict(storage_options or {})
    scheme = uri.split("://", 1)[0].lower()
    if scheme in ("http", "https"):
        opts.setdefault("get_client", _http_client)
    if not _is_s3(uri):
        return opts
    policy = RetryPolicy.from_env() if policy is None else policy
    opts["config_kwargs"] = policy.client_config(opts)
    session_cls = _s3_session_cls()
    if session_cls is not None:
        opts["config_kwargs"].setdefault("http_session_cls", session_cls)
    return opts


# aiohttp sends an idempotent request (a GET, a PUT) a second time when the connection drops
# before the answer (RFC 9112's retry of a persistent connection), below Remote's retries:
# with GLUON_DATA_REMOTE_RETRIES=0 a server that resets saw two GETs. Every client we make
# sends each request once (aiohttp has no public switch: its own test client clears the same
# attribute), for fsspec's HTTP filesystem and for S3 (aiobotocore's aiohttp sessions).
def _single_try(session):
    if hasattr(session, "_retry_connection"):
        session._retry_connection = False
    return session


async def _http_client(**kwargs):
    """fsspec's HTTP ``get_client``: an aiohttp session that sends each request once."""
    import aiohttp  # present wherever fsspec's HTTP filesystem is
    return _single_try(aiohttp.ClientSession(**kwargs))


_S3_SESSION: list = []


def _s3_session_cls():
    """aiobotocore's HTTP session class, made to send each request once (``None`` without
    aiobotocore: s3fs is not installed, and no S3 client is made)."""
    if not _S3_SESSION:
        try:
            from aiobotocore.httpsession import AIOHTTPSession
        except ImportError:
            return None

        class SingleTryAIOHTTPSession(AIOHTTPSession):
            async def _get_session(self, proxy_url):
                return _single_try(await super()._get_session(proxy_url))

        if not hasattr(AIOHTTPSession, "_get_session"):  # another aiobotocore: its default
            SingleTryAIOHTTPSession = None  # noqa: N806
        _S3_SESSION.append(SingleTryAIOHTTPSession)
    return _S3_SESSION[0]


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


_NO_CREDENTIALS = ("%s: no credentials on host %s: each process, a Dask worker included, "
                   "uses the storage options it was given and its own environment or profile "
                   "(AWS_ACCESS_KEY_ID..., an instance role); configure the workers, or "
                   "convert with --forward-credentials (forward_credentials=True) to send "
                   "this client's")


class Remote:
    """One storage endpoint: the filesystem (rebuilt lazily in each process) and the retry
    policy. Pickles as its options only. The remote stores, the upload
    (:class:`~gluon_data.convert.upload.ShardUploader` takes one) and a conversion to a URI
    each make one: ``Remote(storage_options, retries)``.

    ``retries`` / ``backoff`` (the ``remote_retries`` option, a store's ``retries=``) are
    the explicit part of the policy and travel with it; everything else is read from the
    environment of the process making each call (:meth:`RetryPolicy.from_env`), so a
    variable set after this object was made, or on the worker running a task, applies."""

    def __init__(self, storage_options: Optional[dict] = None, retries: Optional[int] = None,
                 backoff: Optional[float] = None):
        self.storage_options = dict(storage_options or {})
        checked = RetryPolicy.from_env(retries, backoff, environ={})  # refused now, if bad
        self.retries = checked.retries if retries is not None else None
        self.backoff = checked.backoff if backoff is not None else None
        self._fs: PerProcess[Dict[tuple, Any]] = PerProcess()  # this process's fsspec clients

    def __getstate__(self):
        return {"storage_options": self.storage_options, "retries": self.retries,
                "backoff": self.backoff}

    def __setstate__(self, state):
        self.__init__(**state)

    def policy(self) -> RetryPolicy:
        """The policy of a call made now: the environment's, with this object's explicit
        ``retries`` / ``backoff``."""
        return RetryPolicy.from_env(self.retries, self.backoff)

    def fs(self, uri: str, policy: Optional[RetryPolicy] = None):
        policy = self.policy() if policy is None else policy
        proto = uri.split("://", 1)[0]
        # the client is built with the policy's timeouts: one per process and per timeouts
        # (a fresh one in each process: an async client's event loop does not survive fork)
        clients = self._fs.get(dict)
        key = (proto, policy.connect_timeout, policy.read_timeout)
        fs = clients.get(key)
        if fs is None:
            fs = filesystem(uri, dict(self.storage_options, skip_instance_cache=True),
                            policy=policy)[0]
            if hasattr(fs, "retries"):  # s3fs (and gcsfs) retry inside each call, sleeping;
                fs.retries = 1  # one try each: this class owns every retry (see call_bound)
            clients[key] = fs
        return fs, fs._strip_protocol(uri)

    def call(self, uri: str, what: str, fn, nbytes: int = 0):
        """``fn(fs, path, kw)`` with bounded retries under :meth:`policy` (read once, when
        the call starts); failures become typed errors. ``kw`` holds the keyword arguments
        every filesystem call of ``fn`` passes on: for an asynchronous filesystem,
        ``timeout`` (fsspec cancels the attempt then; see :meth:`RetryPolicy.attempt_limit`,
        given the ``nbytes`` the call moves)."""
        policy = self.policy()
        last: Optional[BaseException] = None
        for attempt in range(policy.attempts):
            if attempt:
                time.sleep(policy.sleep_before(attempt))
            try:
                fs, path = self.fs(uri, policy)
                kw = ({"timeout": policy.attempt_limit(self.storage_options, nbytes)}
                      if getattr(fs, "async_impl", False) else {})
                return fn(fs, path, kw)
            except FileNotFoundError as e:  # (fsspec's HTTP stat says so of a server that is
                if e.__cause__ is None or not _transient(e.__cause__):  # down: its cause)
                    raise RemoteNotFoundError("%s: no such object" % what, uri) from None
                last = e.__cause__
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
                                                                     policy.attempts), uri)
        raise RemoteConnectionError("%s failed after %d attempts: %s: %s"
                                    % (what, policy.attempts, type(last).__name__, last),
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

    def ranges_ignored(self, uri: str) -> bool:
        """Whether ``uri``'s server was found to ignore ``Range`` (in this process)."""
        return _endpoint(uri) in _NO_RANGES

    def cat(self, uri: str, start: Optional[int] = None, end: Optional[int] = None) -> bytes:
        """The object's bytes ``[start, end)`` (all of it by default); a short answer to a
        range is a :class:`TruncatedDownloadError` (retried), a longer one (the server
        ignores ``Range``) a :class:`RangesIgnoredError` (said once, not retried; a range of
        a server known to ignore them raises it without a request)."""
        ranged = start is not None and end is not None
        if ranged and self.ranges_ignored(uri):
            raise RangesIgnoredError("the server ignores HTTP Range requests: a range is "
                                     "never asked of it", uri)

        def get(fs, p, kw):
            data = fs.cat_file(p, start=start, end=end, **kw)
            if ranged and len(data) > end - start:
                raise RangesIgnoredError(
                    "the server ignores HTTP Range requests: asked for bytes %d..%d, got %d "
                    "bytes (a whole object, not the range)" % (start, end, len(data)), uri)
            if ranged and len(data) != end - start:
                raise TruncatedDownloadError("asked for bytes %d..%d, got %d bytes"
                                             % (start, end, len(data)), uri)
            return data
        try:
            return self.call(uri, "read" if start is None else "ranged read", get,
                             nbytes=(end - start) if start is not None and end is not None
                             else CHUNK_BYTES)  # i.e. if ranged
        except RangesIgnoredError as e:
            self._no_ranges(uri, e)
            raise

    @staticmethod
    def _no_ranges(uri: str, e: RangesIgnoredError) -> None:
        """Remember that ``uri``'s server ignores ``Range``, and say so once per server."""
        where = _endpoint(uri)
        with _NO_RANGES_LOCK:
            if where in _NO_RANGES:
                return
            _NO_RANGES.add(where)
        warnings.warn("%s ignores HTTP Range requests (%s): gluon_data reads whole objects "
                      "from it, through the cache, instead of byte ranges"
                      % (where, e.reason.split(": ", 1)[-1]), RuntimeWarning, stacklevel=3)

    def download(self, uri: str, dest: str, size: int, sha256: Optional[str]) -> str:
        """Write the object's ``size`` bytes to ``dest`` in ranged chunks (each retried),
        check the count and the SHA-256, fsync; returns the SHA-256 of what it wrote. Raises
        on any mismatch; the caller discards ``dest``. From a server that ignores ``Range``
        the object comes whole, in one streamed GET (:meth:`_download_whole`)."""
        if self.ranges_ignored(uri):
            return self._download_whole(uri, dest, size, sha256)
        digest = hashlib.sha256()
        with open(dest, "r+b") as f:
            pos = 0
            while pos < size:
                end = min(size, pos + CHUNK_BYTES)
                try:
                    data = self.cat(uri, pos, end)
                except RangesIgnoredError:
                    break
                f.write(data)
                digest.update(data)
                pos = end
            else:
                f.truncate(size)
                f.flush()
                os.fsync(f.fileno())
        if pos < size:  # the server ignores Range: the whole object, streamed
            return self._download_whole(uri, dest, size, sha256)
        return self._checked(uri, size, sha256, digest)

    def _download_whole(self, uri: str, dest: str, size: int, sha256: Optional[str]) -> str:
        """The object in one GET streamed to ``dest`` (retried whole), for a server that
        ignores ``Range``; its size and SHA-256 checked as :meth:`download`'s."""
        self.call(uri, "download", lambda fs, p, kw: fs.get_file(p, dest, **kw), nbytes=size)
        digest = hashlib.sha256()
        with open(dest, "r+b") as f:
            got = os.fstat(f.fileno()).st_size
            if got != size:
                raise TruncatedDownloadError("downloaded %d bytes of a %d-byte object"
                                             % (got, size), uri)
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
            os.fsync(f.fileno())
        return self._checked(uri, size, sha256, digest)

    @staticmethod
    def _checked(uri: str, size: int, sha256: Optional[str], digest) -> str:
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


#: The name before it was public: ``gluon_data.remote._Remote`` (which the documentation of
#: ``ShardUploader`` showed) still resolves, through the alias table.
_Remote = Remote
