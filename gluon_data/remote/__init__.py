"""Datasets in object storage (``s3://``, ``gs://``, ``https://`` ...) through fsspec.

Three ways bytes move, each built on fsspec (``pip install gluon-data[remote]``; fsspec and
s3fs are imported only here, and only when a URI is used):

* **Training reads** download whole objects (a ``.rec`` and its ``.idx``) into a local
  :class:`ShardCache` -- atomically (temporary file, then rename), verified against the
  SHA-256 the dataset's metadata records, under a size limit with LRU eviction, shared
  between DataLoader workers and between jobs on one node through ``flock`` locks in the
  cache directory -- and then read with the local fast path (:class:`~gluon_data.stores.recordio.
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

The package: :mod:`.layout` (object names), :mod:`.fs` (options, client, retries),
:mod:`.objects` (the object cache), :mod:`.ranged` (ranged reads), :mod:`.describe` (what a
remote location is made of), :mod:`.stores` (the one remote store), :mod:`.sampling`,
:mod:`.commit` (the one upload protocol: marker, objects, commit document), :mod:`.upload`
(uploads of local datasets and of shards). :func:`convert_to_uri` lives with the converters
(:mod:`gluon_data.convert.to_uri`, which imports the uploader) and is loaded from here on
first use, so reading a URI never loads the converter.
"""
from __future__ import annotations

import importlib

from ..format.layout import (UPLOAD_MARKER, LMDB_DATA, LMDB_COMMIT, LMDB_MARKER, LMDB_FORMAT, _join)  # noqa: F401
from ..storage.remotefs import (INSTALL_HINT, RETRIES, BACKOFF, CONNECT_TIMEOUT, READ_TIMEOUT, MIN_RATE,
                 CHUNK_BYTES, parse_storage_options, filesystem, _is_s3, _bounded, _transient,
                 attempt_limit, call_bound, _NO_CREDENTIALS, _Remote)  # noqa: F401
from ..storage.objects import (_default_cache_dir, _Lock, ShardCache)  # noqa: F401
from ..stores.remote.ranged import (_RangedRecordFile, _load_index)  # noqa: F401
from ..stores.remote.describe import (Described, describe_rec, describe_lmdb)  # noqa: F401
from ..stores.remote.stores import (_ProcessLocal, _ReadsLocalCopy, RemoteStore, _stamp, _open_remote,
                     _names_remote_lmdb, check_lmdb_download, RemoteLMDBStore, _prefetch_pool,
                     _open_remote_lmdb, _remote_lmdb_splits, RemoteShardedStore,
                     _read_uri)  # noqa: F401
from ..sampling.remote import (BlockShuffleSampler, PrefetchSampler)  # noqa: F401
from ..stores.remote.commit import (Commit, _commit_names, _NOT_OURS, _remote_is_ours, put_object,
                     check_bucket, probe_writable)  # noqa: F401
from ..convert.upload import (RECEIPT_SUFFIX, _lmdb_commit, _upload_plan, upload_dataset,
                     ShardUploader, _verify_shard)  # noqa: F401
from ..storage.cache import parse_size  # noqa: F401  (re-exported, as before)

__all__ = ["RemoteStore", "RemoteLMDBStore", "ShardCache", "BlockShuffleSampler",
           "PrefetchSampler", "filesystem", "parse_storage_options", "parse_size",
           "upload_dataset", "convert_to_uri", "ShardUploader", "call_bound", "attempt_limit",
           "INSTALL_HINT"]


def __getattr__(name: str):
    """``convert_to_uri``, loaded on first use from :mod:`gluon_data.convert.to_uri` (PEP 562):
    the converter imports this package, so this package may not import it."""
    if name == "convert_to_uri":
        value = importlib.import_module("gluon_data.convert.to_uri").convert_to_uri
        globals()[name] = value
        return value
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
