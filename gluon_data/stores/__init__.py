""""Record i" from somewhere: one protocol (:class:`~.base.RecordStore`), many backends.

:func:`open_store` opens a ``.rec`` with its index, an LMDB split, the shards behind a
manifest, or any of those at a URI, through one registry of openers. Each backend registers
itself when imported, and this package imports every built-in backend, so the registry is
complete before :func:`open_store` can be called (a backend never loads another by name).
"""
from . import legacy, lmdbio, recordio, shardstore  # noqa: F401  (register their openers)
from .remote import stores as _remote_stores  # noqa: F401  (the URI opener)
from .base import RecordStore, is_uri, open_store, store_splits, will_need

__all__ = ["RecordStore", "open_store", "store_splits", "is_uri", "will_need"]
