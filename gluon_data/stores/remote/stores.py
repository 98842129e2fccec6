"""The remote store: a ``.rec`` or an LMDB environment at a URI, read through the cache.

A remote location is described once (:mod:`.describe`: its objects, their sizes and SHA-256
sums), its objects are fetched and verified by the :class:`~.objects.ShardCache` (one limit,
one trust rule), and the local copy is then read as a local store is: the same reader
:func:`~gluon_data.stores.base.open_store` gives for a local path. A manifest at a URI is a
:class:`~gluon_data.stores.shardstore.ShardedStore` whose shards are remote stores.
"""
from __future__ import annotations

import os
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Dict, Iterable, Iterator, List, Optional, Tuple, cast

from ...errors import ChecksumMismatchError, FormatError, RemoteError, TruncatedDownloadError
from ..lmdbio import read_lmdb_meta
from ...format.meta import meta_path
from ..recordio import RecordFile, idx_path_for
from ..shardstore import ShardedStore
from ..base import is_uri, open_store, register_opener, register_reader
from .describe import (check_lmdb_download, describe_lmdb, describe_rec, names_remote_lmdb,
                       stamp)
from ...storage.perprocess import PerProcess
from ...storage.remotefs import Remote
from ...format.layout import LMDB_COMMIT, LMDB_DATA
from ...storage.objects import ShardCache
from .ranged import RangedRecordFile, load_remote_index

_stamp = stamp  # (the names these had)
_names_remote_lmdb = names_remote_lmdb


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
    """A dataset at a URI, as a record store: a ``.rec`` with its ``.idx`` (and
    ``.meta.json``), or one split of an LMDB environment (``s3://bucket/voc.lmdb``: its
    ``data.mdb``, and the commit document ``meta.json`` that ``gluon-data convert`` uploads).

    The constructor reads what the location is made of (the metadata or commit document and
    the object sizes; nothing for a shard its manifest describes). The first record read
    downloads the objects whole into a :class:`ShardCache` (once per node; atomically;
    verified against the SHA-256 sums recorded at upload, a ``data.mdb`` without one by
    :func:`check_lmdb_download`) and opens the local copy with the local store
    (:class:`~gluon_data.stores.recordio.RecordFile`, :class:`~gluon_data.stores.lmdbio.LMDBFile`).
    ``reads='ranged'`` (inspection of a ``.rec``) fetches the index, then only the bytes of
    the records read. :meth:`will_need` (the hint ``gluon_data.DataLoader`` and
    :class:`PrefetchSampler` give) starts the download in the background.

    A bare ``data.mdb`` (no ``meta.json``) is downloaded when opened, since its metadata is
    inside. While an upload marker exists and the metadata does not, the dataset is refused.

    Parameters
    ----------
    location : str
        URI of the ``.rec`` (``s3://bucket/prefix/voc_train.rec``) or of the LMDB
        environment (``s3://bucket/prefix/voc.lmdb``).
    split : str, optional
        A ``.rec`` holds one split; when given, it must be the metadata's. An LMDB's default
        is ``train`` if there is one, else the first.
    storage_options : dict, optional
        fsspec options (``endpoint_url``, ``key``/``secret``, ``anon``, ``client_kwargs``...).
        Credentials default to the standard environment or profile; nothing is stored in
        the dataset.
    cache_dir, cache_limit
        The :class:`ShardCache` (defaults: ``$GLUON_DATA_CACHE_DIR`` or
        ``~/.cache/gluon_data``, ``$GLUON_DATA_CACHE_LIMIT`` or unlimited).
    reads : {'cache', 'ranged'}
        (An LMDB reads the cached download either way.)
    retries, backoff : optional
        Retry policy for transient errors (default: the environment at each call,
        :meth:`gluon_data.storage.retry.RetryPolicy.from_env`).
    prefetch_threads : int
        Bound of the background download pool :meth:`will_need` uses.
    described : dict, optional
        What a manifest says of this shard (``records``, ``bytes``, ``files``: the size and
        SHA-256 of each object, by name), taken as given: no metadata GET, no HEAD
        (:class:`~gluon_data.stores.shardstore.ShardedStore` passes it).
    fresh : bool
        Read every object from the remote even where the cache holds a verified copy, and
        check it (:meth:`ShardCache.fetch`): what the store serves *now*, as
        :func:`gluon_data.verify` checks it. Readers leave it off: a cached copy holding
        the recorded bytes is the dataset.

    Examples
    --------
    >>> store = RemoteStore("s3://bucket/voc_train.rec",
    ...                     storage_options={"endpoint_url": "http://127.0.0.1:9000"})  # doctest: +SKIP
    >>> len(store), store.meta["task"]                                                # doctest: +SKIP
    (1464, 'segmentation')
    >>> payload = store.read(0)      # downloads voc_train.rec/.idx into the cache once  # doctest: +SKIP
    """

    location: str
    split: Optional[str]
    splits: List[str]  # (an LMDB's)
    meta: Optional[dict]

    def __init__(self, location: str, split: Optional[str] = None, *,
                 storage_options: Optional[dict] = None, cache_dir: Optional[str] = None,
                 cache_limit=None, reads: str = "cache", retries: Optional[int] = None,
                 backoff: Optional[float] = None, prefetch_threads: int = 2,
                 described: Optional[dict] = None, fresh: bool = False):
        if reads not in ("cache", "ranged"):
            raise ValueError("reads must be 'cache' or 'ranged', got %r" % (reads,))
        self.reads, self.fresh = reads, bool(fresh)
        self._remote = Remote(storage_options, retries, backoff)
        self._cache_args = (cache_dir, cache_limit)
        self._prefetch_threads = max(1, int(prefetch_threads))
        self._init_local()
        location = os.fspath(location)
        if names_remote_lmdb(location):
            self.location = location.rstrip("/")
            self.data_location = self.location + "/" + LMDB_DATA
            self.commit_location = self.location + "/" + LMDB_COMMIT
            self._d = describe_lmdb(self._remote, self.location, described)
            self.container, self.file_size = "lmdb", self._d.size
            self._choose_split(split, described is not None)
        else:
            self.location, self.split = location, None  # (no "splits": it holds one)
            self.idx_location = idx_path_for(location)
            self.meta_location = meta_path(location)
            self._d = describe_rec(self._remote, location, split, described)
            self.meta = self._d.meta
            self.container, self.file_size = "rec", self._d.size

    _PROCESS_LOCAL = ("_cache", "_reader", "_pins", "_pending")

    def _init_local(self) -> None:
        self._cache = ShardCache(*self._cache_args)
        self._reader: PerProcess = PerProcess()  # this process's reader of the local copy
        self._pins: list = []  # (guarded by self._pending's lock)
        # this process's background download (a forked child's pool has none in flight)
        self._pending: PerProcess[Future] = PerProcess()

    def _choose_split(self, split: Optional[str], shard: bool) -> None:
        """An LMDB's split: the manifest's for a shard, else one of the commit document's
        (or, for a bare ``data.mdb``, of the metadata inside its download)."""
        if shard:
            self.split = split or "train"
            self.splits, self.meta = [self.split], None
            return
        metas = self._d.metas
        if metas is None:  # the metadata lives in data.mdb: download it now
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
        self._d.records = int(self.meta["num_records"])
        self._d.conversion = self.meta.get("conversion_id")

    # -- the objects ---------------------------------------------------------------------
    def _sha(self, uri: str) -> Optional[str]:
        return (self._d.objects.get(uri) or {}).get("sha256")

    def _stamp_of(self, uri: Optional[str] = None) -> str:
        uri = uri or self._d.main
        sha = self._sha(uri)
        if sha is not None:
            return "sha256:" + sha
        if uri not in self._d.stamps:
            self._d.stamps[uri] = stamp(self._remote.info(uri))
        return self._d.stamps[uri]

    def _size_of(self, uri: str) -> int:
        entry = self._d.objects.get(uri) or {}
        if "bytes" in entry:
            return int(entry["bytes"])
        return self.file_size if uri == self._d.main else int(self._remote.info(uri)["size"])

    def fetch(self, uri: Optional[str] = None, pin: bool = False):
        """Download object ``uri`` (default: the ``.rec``, the ``data.mdb``) into the cache
        if it is not there; return ``(local path, pin)``."""
        uri = uri or self._d.main
        check = None
        if self.container == "lmdb" and self._sha(uri) is None:
            check = partial(check_lmdb_download, uri=uri)
        try:
            return self._cache.fetch(self._remote, uri, self._size_of(uri), self._sha(uri),
                                     self._stamp_of(uri), pin=pin, check=check,
                                     fresh=self.fresh)
        except (TruncatedDownloadError, ChecksumMismatchError) as e:
            self._check_not_replaced(uri, e)
            raise

    def _fetch_pinned(self, uri: Optional[str] = None) -> str:
        """:meth:`fetch`, the pin kept until :meth:`close` (a ranged reader reading the
        ``.rec`` whole from a server that ignores ``Range``)."""
        path, pin = self.fetch(uri, pin=True)
        self._pins.append(pin)
        return path

    def _check_not_replaced(self, uri: str, cause: BaseException) -> None:
        """After a download came short or failed its checksum: if the object no longer has
        the size (or version) this store described when it was opened, it was replaced by
        another upload, which is what the error must say (reading on would mix datasets)."""
        try:
            info = self._remote.info(uri)
        except RemoteError:
            return  # gone or unreachable: the download's own error says enough
        was, now = self._size_of(uri), int(info["size"])
        then = self._d.stamps.get(uri)
        if now != was or (then is not None and stamp(info) != then):
            raise FormatError("the object was replaced after this dataset was opened (%d bytes "
                              "then, %d now); open the dataset again to read the new one"
                              % (was, now), uri) from cause

    # -- the local copy ------------------------------------------------------------------
    def _open(self):
        """The reader of the local copy, and the pins of its objects."""
        pins = []
        try:
            if self.reads == "ranged" and self.container == "rec":
                idx_local, pin = self.fetch(self.idx_location, pin=True)
                pins.append(pin)
                keys, offsets = load_remote_index(idx_local, self.idx_location)
                return RangedRecordFile(self.location, self._remote, self.file_size, keys,
                                         offsets, self._d.records, self.idx_location,
                                         whole=self._fetch_pinned), pins
            local = {}
            for uri in self._d.objects:  # (.idx first: it is checked before the .rec)
                local[uri], pin = self.fetch(uri, pin=True)
                pins.append(pin)
            try:
                return self._open_local(local), pins
            except FormatError as e:  # name the object, not the cache file
                raise FormatError(e.reason, self.location, e.key, e.offset) from None
        except BaseException:
            for p in pins:
                p.release()
            raise

    def _open_local(self, local: dict):
        if self.container == "rec":  # (the .idx lands in its own cache entry)
            return RecordFile(local[self.location], local[self.idx_location],
                              expected_count=self._d.records)
        f = open_store(os.path.dirname(local[self.data_location]), self.split)
        conversion = self._d.conversion
        # (an LMDBFile: its meta is its split's metadata; _choose_split set the count)
        if len(f) != self._d.records or (conversion is not None
                                         and cast(dict, f.meta).get("conversion_id")
                                         != conversion):
            raise FormatError("%s holds %d records of conversion %s in split %r, not the %d "
                              "of conversion %s the dataset was opened with: it was "
                              "replaced; open the dataset again"
                              % (LMDB_DATA, len(f), cast(dict, f.meta).get("conversion_id"),
                                 self.split, cast(int, self._d.records), conversion),
                              self.location)
        return f

    def _local(self):
        """The reader of this process (opened on first use: the objects are fetched then)."""
        return self._reader.get(self._open_reader)

    def _open_reader(self):
        f, pins = self._open()
        with self._pending.lock():
            self._pins += pins  # (a forked child keeps its parent's pins too)
        return f

    record_file = lmdb_file = _local  # (the names of the local reader, by container)

    def close(self) -> None:
        """Release this process's pins on cached copies (they become evictable), after the
        background download in flight, if any."""
        self._reader.clear()  # (waits for a reader being opened)
        with self._pending.lock():
            pending = self._pending.clear()
            pins, self._pins = self._pins, []
        for p in pins:
            p.release()
        if pending is not None:
            pending.exception()  # waits (each remote call is bounded); failures are ignored

    # -- fetching ahead ------------------------------------------------------------------
    def will_need(self, indices: Iterable[int], wait: bool = False) -> None:
        """The hint (:func:`gluon_data.stores.base.will_need`): start downloading, in the
        background, what reading ``indices`` needs (the objects, unless this process reads
        them already) and return at once; never raises (the read that follows reports).

        ``wait``: return once that download (the one started, or found in flight) is done,
        raising its error if it failed: the one way to wait for a hint (tests, benchmarks).
        """
        pending = self._fetch_ahead(indices)
        if wait and pending is not None:
            pending.result()

    def prefetch(self, indices: Iterable[int]) -> Optional[Future]:
        """Deprecated: ``will_need(indices, wait=True)`` waits for the download. Returns the
        future of the download (the one in flight, if any), or ``None`` when nothing is
        needed (ranged reads, already open)."""
        warnings.warn("RemoteStore.prefetch(indices) is deprecated: will_need(indices) is the "
                      "hint, will_need(indices, wait=True) waits for its download",
                      DeprecationWarning, stacklevel=2)
        return self._fetch_ahead(indices)

    def _fetch_ahead(self, indices: Iterable[int]) -> Optional[Future]:
        """The download of this process that reading ``indices`` waits for: the one in
        flight, else a new one (``None``: nothing to fetch)."""
        if (self.reads != "cache" and self.container == "rec") or \
                not any(True for _ in indices):
            return None
        if self._reader.mine():
            return None
        with self._pending.lock():
            pending = self._pending.peek()
            if pending is not None and not (pending.done() and pending.exception()):
                return pending
            pending = self._prefetch_pool().submit(
                lambda: [self.fetch(uri) for uri in list(self._d.objects)])
            self._pending.set(pending)
            return pending

    def _prefetch_pool(self) -> ThreadPoolExecutor:
        return _prefetch_pool(self._prefetch_threads)

    # -- the store protocol --------------------------------------------------------------
    def parts(self) -> List[int]:
        """Records per object downloaded as a unit (one ``.rec`` or ``data.mdb``:
        ``[len]``)."""
        return [len(self)]

    def __len__(self) -> int:
        if self._d.records is not None:
            return int(self._d.records)
        return len(self._local())

    def keys(self):
        return self._local().keys()

    def offset(self, i: int) -> Optional[int]:
        return self._local().offset(i) if self.container == "rec" else None

    def check_tail(self) -> None:
        """Check that the last indexed record ends the ``.rec`` (``verify`` does)."""
        self._local()._check_tail()

    def identity(self) -> str:
        """The stamp of the ``.rec`` or ``data.mdb`` (its SHA-256, or ETag and size); for
        an LMDB, with the split's ``conversion_id``."""
        if self.container == "rec":
            return self._stamp_of()
        return "%s/%s" % (self._stamp_of(), self._d.conversion or "-")

    def __repr__(self) -> str:
        return "RemoteStore(%r, split=%r, reads=%r)" % (self.location, self.split, self.reads)


#: This process's background download pools, by number of threads (a forked child makes its
#: own: the parent's threads do not exist there).
_POOLS: PerProcess[Dict[int, ThreadPoolExecutor]] = PerProcess()


def _prefetch_pool(threads: int = 2) -> ThreadPoolExecutor:
    """This process's background download pool of ``threads`` threads, shared by every
    remote store (a forked child makes its own): the shards of a dataset share its bound."""
    pools = _POOLS.get(dict)
    pool = pools.get(threads)
    if pool is None:
        with _POOLS.lock():
            pool = pools.get(threads)
            if pool is None:
                pool = pools[threads] = ThreadPoolExecutor(
                    threads, thread_name_prefix="gluon-data-prefetch")
    return pool


#: The LMDB environment at a URI is a :class:`RemoteStore` (the one remote store; the name
#: stays as an alias: it opens what it always opened, with the same options).
RemoteLMDBStore = RemoteStore


def _open_remote(location: str, split: Optional[str] = None, **options) -> RemoteStore:
    return RemoteStore(location, split, **options)


_open_remote_lmdb = _open_remote


def _remote_lmdb_splits(location: str) -> List[str]:
    """Split names of a remote LMDB (storage options from the standard environment)."""
    return RemoteStore(location).splits


register_opener(is_uri, _open_remote, priority=10)
register_opener(names_remote_lmdb, _open_remote, priority=20, splits=_remote_lmdb_splits)


class RemoteShardedStore(ShardedStore):
    """Deprecated: a manifest at a URI is a :class:`~gluon_data.stores.shardstore.ShardedStore` whose
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
    """:func:`~gluon_data.stores.base.read_bytes` of a URI (a manifest): one GET, retried."""
    return Remote(storage_options, retries, backoff).cat(location)


register_reader(is_uri, _read_uri)
