"""The remote stores: a ``.rec``, an LMDB and a manifest of shards at a URI."""
from __future__ import annotations

import os
import posixpath
import threading
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Dict, Iterable, Iterator, List, Optional, Tuple


from ..documents import load_document
from ..errors import ChecksumMismatchError, FormatError, RemoteNotFoundError
from ..lmdbio import LMDBFile, read_lmdb_meta
from ..meta import meta_path
from ..recordio import RecordFile, idx_path_for
from ..shards import ShardedStore
from ..store import is_uri, register_opener, register_reader
from ..verify import verify
from .layout import LMDB_COMMIT, LMDB_DATA, LMDB_MARKER, UPLOAD_MARKER
from .fs import _Remote
from .objects import ShardCache
from .ranged import _RangedRecordFile, _load_index


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
    described : dict, optional
        What a manifest says of this shard (``records``, ``bytes``, ``files``: the size and
        SHA-256 of each object, by name), taken as given: no metadata GET, no HEAD
        (:class:`~gluon_data.shards.ShardedStore` passes it).

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
                 backoff: Optional[float] = None, prefetch_threads: int = 2,
                 described: Optional[dict] = None):
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
        self._stamps: Dict[str, str] = {}
        if described is not None:  # a shard: its manifest entry, taken as given
            self.meta, self._expected = None, int(described["records"])
            self.file_size = int(described["bytes"])
            files = described["files"]
        else:
            files = self._open_meta(split)
        self._sums = {u: files.get(posixpath.basename(u)) for u in (self.location,
                                                                      self.idx_location)}
        want = self._sums[self.location]
        if want is not None and int(want.get("bytes", -1)) != self.file_size:
            raise ChecksumMismatchError(
                "the object has %d bytes but the metadata records %d: it was replaced or "
                "is being rewritten; re-upload the dataset" % (self.file_size, want["bytes"]),
                self.location)
        self._init_local()

    def _open_meta(self, split: Optional[str]) -> dict:
        """Read the metadata and the object's size (a GET and a HEAD); its ``files``."""
        self.meta = self._read_meta()
        if split is not None and (self.meta or {}).get("split", split) != split:
            raise ValueError("%s holds split %r, not %r: a .rec holds one split"
                             % (self.location, self.meta["split"], split))
        self._expected = self.meta["num_records"] if self.meta else None
        info = self._remote.info(self.location)
        self.file_size = int(info["size"])
        self._stamps[self.location] = _stamp(info)
        return (self.meta or {}).get("files") or {}

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
    storage_options, cache_dir, cache_limit, retries, backoff, described
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
                 backoff: Optional[float] = None, prefetch_threads: int = 2,
                 described: Optional[dict] = None):
        if reads not in ("cache", "ranged"):
            raise ValueError("reads must be 'cache' or 'ranged', got %r" % (reads,))
        self._locate(location)
        self.reads = reads
        self._remote = _Remote(storage_options, retries, backoff)
        self._cache_args = (cache_dir, cache_limit)
        self._init_local()
        if described is not None:  # a shard: its manifest entry (split, records, data.mdb's
            want = described["files"].get(LMDB_DATA) or {}  # size and SHA-256) as given
            self.file_size, self._sha = int(described["bytes"]), want.get("sha256")
            self._stamp = None if self._sha is None else "sha256:" + self._sha
            self.split, self.splits, self.meta = split or "train", [split or "train"], None
            self._n, self._conversion = int(described["records"]), None
            return
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


class RemoteShardedStore(ShardedStore):
    """Deprecated: a manifest at a URI is a :class:`~gluon_data.shards.ShardedStore` whose
    shards are remote stores; ``open_store("s3://bucket/train.shards.json", ...)`` gives it.
    This name still opens one (same options), with a :class:`DeprecationWarning`."""

    def __init__(self, location: str, split: Optional[str] = None, **options):
        warnings.warn("RemoteShardedStore is deprecated: open_store(manifest_uri, ...) gives a "
                      "ShardedStore whose shards are remote stores", DeprecationWarning,
                      stacklevel=2)
        super().__init__(location, split, **options)


def _read_uri(location: str, storage_options: Optional[dict] = None,
              retries: Optional[int] = None, backoff: Optional[float] = None,
              **_store_options) -> bytes:
    """:func:`~gluon_data.store.read_bytes` of a URI (a manifest): one GET, retried."""
    return _Remote(storage_options, retries, backoff).cat(location)


register_reader(is_uri, _read_uri)
