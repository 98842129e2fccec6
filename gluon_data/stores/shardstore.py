"""The store of a sharded dataset: N shards behind a manifest read as one record store.

:class:`ShardedStore` opens each shard through :func:`~gluon_data.stores.base.open_store`, a
local file or a remote store alike (a manifest at a URI is read through the remote
backend's reader); names, plans, the manifest and ``verify_sharded`` are
:mod:`gluon_data.stores.shards`, which keeps ``ShardedStore`` importable.
"""
from __future__ import annotations

import hashlib
import operator
import os
import warnings
from bisect import bisect_right
from functools import partial
from typing import Any, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..errors import FormatError, GluonDataError
from ..storage.fileio import require_regular
from ..storage.fsutil import LMDB_DATA
from ..storage.perprocess import PerProcess
from .recordio import idx_path_for
from .shards import is_manifest, load_manifest, shard_mismatch
from .base import (is_uri, open_store, read_bytes, register_opener, valid_positions,
                    will_need)

__all__ = ["ShardedStore", "ShardRouter"]


class ShardRouter:
    """The :class:`~gluon_data.stores.base.RecordStore` methods of N shards read as one: global
    position ``i`` -> (shard, record) through the cumulative record counts, each call routed
    to ``self.shard(s)``. Subclasses (:class:`ShardedStore`) set ``_starts`` (a list: 0, then the running totals), ``_n``
    and ``_identity``, and define ``shard(s)``."""

    _starts: List[int]
    _n: int
    _identity: str

    def shard(self, s: int) -> Any:  # pragma: no cover - defined by subclasses
        raise NotImplementedError

    def locate(self, i: int) -> Tuple[int, int]:
        """``(shard, record in shard)`` of global position ``i`` (negative: from the end)."""
        i = operator.index(i)
        if not 0 <= i < self._n:
            if -self._n <= i < 0:
                i += self._n
            else:
                raise IndexError("index %d out of range for %d records" % (i, self._n))
        s = bisect_right(self._starts, i) - 1
        return s, i - self._starts[s]

    def __len__(self) -> int:
        return self._n

    def key(self, i: int) -> int:
        """The shard's key (our converters write the item's global position, or its ``.lst``
        index; LMDB shards keep them in ``record_keys``)."""
        s, j = self.locate(i)
        return self.shard(s).key(j)

    def offset(self, i: int) -> Optional[int]:
        s, j = self.locate(i)
        return self.shard(s).offset(j)

    def read(self, i: int) -> bytes:
        return bytes(self.view(i))

    def view(self, i: int) -> Union[bytes, memoryview]:
        s, j = self.locate(i)
        return self.shard(s).view(j)

    def scan(self) -> Iterator:
        for s in range(len(self._starts) - 1):
            f = self.shard(s)
            if hasattr(f, "scan"):
                yield from f.scan()
            else:
                for j in range(len(f)):
                    yield f.read(j)

    def identity(self) -> str:
        """SHA-256 of the manifest as opened (it holds every shard's checksums)."""
        return self._identity


class ShardedStore(ShardRouter):
    """N shards behind a manifest, read as one :class:`~gluon_data.stores.base.RecordStore`.

    Global position ``i`` maps to (shard, record) through the cumulative record counts;
    each shard is opened lazily, on first use, in each process, through
    :func:`~gluon_data.stores.base.open_store` -- a local file, or, for a manifest at a URI, the
    remote store of the shard's object (downloaded whole into the cache when first read,
    checked against the manifest's sizes and SHA-256 sums, which it is given so that opening
    it sends no request). Pickles carry the location and the options; the copy reads the
    manifest again and refuses one that changed. A missing or damaged shard raises an error
    naming it.

    Parameters
    ----------
    location : str
        The ``PREFIX.shards.json`` manifest (a path or a URI).
    split : str, optional
        Must match the manifest's split when given.
    max_open_shards : int, optional
        Shards held open per process (a remote shard's cached copy is pinned while open);
        older ones are closed, and become evictable. Default: all for a local manifest, 2 for
        a URI, so a ``cache_limit`` of a few shards serves a dataset of any size.
    prefetch_shards : int, optional
        How many shards beyond the one being read :meth:`will_need` starts fetching. Default:
        every one hinted for a local manifest, 1 for a URI.
    **options
        Passed to :func:`~gluon_data.stores.base.open_store` for each shard (the remote store's
        ``storage_options``, ``cache_dir``, ``cache_limit``, ``reads``...).

    Examples
    --------
    >>> store = ShardedStore("imagenet/train.shards.json")   # doctest: +SKIP
    >>> len(store), store.locate(1000)                        # doctest: +SKIP
    (1281167, (0, 1000))
    """

    def __init__(self, location: str, split: Optional[str] = None, *,
                 max_open_shards: Optional[int] = None, prefetch_shards: Optional[int] = None,
                 **options: Any) -> None:
        self.location = os.fspath(location)
        self._options = dict(options)
        remote = is_uri(self.location)
        if options and not remote:  # (the local shards' openers take none)
            raise TypeError("a local sharded store takes no options but max_open_shards= and "
                            "prefetch_shards=, got %s" % ", ".join(sorted(options)))
        raw = read_bytes(self.location, **options) if remote else None
        self.manifest, raw = load_manifest(self.location, raw)
        self._identity = "sha256:" + hashlib.sha256(raw).hexdigest()
        if split is not None and split != self.manifest.get("split"):
            raise FormatError("split %r not found; this manifest holds split %r"
                              % (split, self.manifest.get("split")), self.location)
        self.split = self.manifest.get("split") if self.manifest["container"] == "lmdb" \
            else None
        self.meta = self.manifest["meta"]
        self.container = self.manifest["container"]
        folder = self.location.rsplit("/", 1)[0] if remote else \
            os.path.dirname(os.path.abspath(self.location))
        join = (lambda name: folder + "/" + name) if remote else partial(os.path.join, folder)
        self.paths = [join(s["name"]) for s in self.manifest["shards"]]
        self._counts = [int(s["records"]) for s in self.manifest["shards"]]
        self._starts = [0] + np.cumsum(self._counts, dtype=np.int64).tolist()  # bisect: ~0.1 us
        self._n = self._starts[-1]
        self.max_open_shards = _at_least(max_open_shards, 2 if remote else None, 1)
        self.prefetch_shards = _at_least(prefetch_shards, 1 if remote else None, 0)
        self._reset()

    def _reset(self) -> None:
        self._shards: List[Any] = [None] * len(self.paths)  # (each shard's store, once open)
        # this process's open shards, least recently opened first (a forked child's start
        # empty: the parent's open list is not ours)
        self._order: PerProcess[List[int]] = PerProcess()

    @property
    def _lock(self):
        """This process's lock of the open shards (re-entrant: shard() opens through
        _store(); a forked child's is its own)."""
        return self._order.lock()

    @property
    def uris(self) -> List[str]:
        """The shards' locations (their URIs, for a manifest at a URI)."""
        return list(self.paths)

    def parts(self) -> List[int]:
        """Records per shard (the parts a shard-local sampler keeps reads within)."""
        return list(self._counts)

    @property
    def file_size(self) -> int:
        """Bytes of all the shards (their ``.rec`` or ``data.mdb``), as the manifest says."""
        return sum(int(sh["bytes"]) for sh in self.manifest["shards"])

    # -- shards ------------------------------------------------------------------------
    def _label(self, s: int) -> str:
        return "shard %d of %d (%s)" % (s, len(self.paths), self.paths[s])

    def shard(self, s: int) -> Any:
        """The store of shard ``s`` (what :func:`~gluon_data.stores.base.open_store` gives for its
        location), opened on first use; with ``max_open_shards``, the least recently opened
        one beyond it is closed."""
        f = self._shards[s]
        if f is not None and self.max_open_shards is None:
            return f
        order = self._order.get(list)
        if f is not None and order and order[-1] == s:
            return f
        with self._lock:
            f = self._store(s)
            if self.max_open_shards is not None:
                if s in order:
                    order.remove(s)
                order.append(s)
                while len(order) > self.max_open_shards:
                    self._shards[order.pop(0)].close()  # unpinned; reopened when read again
            return f

    def _store(self, s: int):
        """Shard ``s``'s store, opened if it is not yet (not counted as open for
        ``max_open_shards``: a hint's target)."""
        f = self._shards[s]
        if f is None:
            with self._lock:
                f = self._shards[s]
                if f is None:
                    f = self._shards[s] = self._open_shard(s)
        return f

    def _shard_options(self, s: int) -> dict:
        """What :func:`open_store` is given for shard ``s``: the options, and for a shard at a
        URI its manifest entry (records, sizes, SHA-256 sums), taken as given."""
        if not is_uri(self.paths[s]):
            return self._options
        entry, files = self.manifest["shards"][s], self.manifest.get("files") or {}
        name = entry["name"]
        if self.container == "lmdb":
            sums = {LMDB_DATA: files.get(name + "/" + LMDB_DATA) or {"bytes": entry["bytes"]}}
        else:
            idx = os.path.basename(idx_path_for(name))
            sums = {name: files.get(name) or {"bytes": entry["bytes"]},
                    idx: dict(files.get(idx) or {}, sha256=entry.get("idx_sha256"))}
        described = {"records": int(entry["records"]), "bytes": int(entry["bytes"]),
                     "files": sums}
        return dict(self._options, described=described)

    def _open_shard(self, s: int):
        path, want = self.paths[s], self.manifest["shards"][s]["records"]
        remote = is_uri(path)
        st = None
        if not remote:  # the input rule first: a FIFO or a looping link is named as such
            try:
                st = require_regular(path, directory=self.container == "lmdb")
            except FormatError as e:
                raise FormatError("%s is damaged: %s" % (self._label(s), e.reason),
                                  path) from None
            if st is None:
                raise FileNotFoundError("%s of %s is missing; restore it or rerun the "
                                        "conversion" % (self._label(s), self.location))
        entry = self.manifest["shards"][s]
        # a .rec's size is fixed by its records; an LMDB's data.mdb may grow with any commit,
        # so an LMDB shard is bound by its metadata and its records' checksums instead (a
        # remote shard by the manifest's sizes and SHA-256 sums, checked on download)
        size = None if self.container == "lmdb" or st is None else st.st_size
        if size is not None and size != entry["bytes"]:
            raise FormatError("%s has %d bytes, the manifest says %d: the shard was replaced "
                              "or damaged; restore it or rerun the conversion"
                              % (self._label(s), size, entry["bytes"]), path)
        split = (self.manifest.get("split") or "train") if self.container == "lmdb" else None
        try:
            f: Any = open_store(path, split, **self._shard_options(s))  # (has close())
            wrong = None if remote else shard_mismatch(self.manifest, s, f.meta)
        except GluonDataError as e:
            raise type(e)("%s is damaged: %s" % (self._label(s), e.reason), e.path or path,
                          e.key, e.offset) from None
        if wrong is not None:
            f.close()
            raise FormatError("%s %s" % (self._label(s), wrong), path)
        if len(f) != want:
            raise FormatError("%s holds %d records, the manifest promises %d (the shard "
                              "changed after the manifest was written, by a salvage for one: "
                              "rerun the conversion that wrote the manifest with --resume to "
                              "redo it from its source)"
                              % (self._label(s), len(f), want), path)
        return f

    def _hinted(self, indices) -> List[Tuple[int, List[int]]]:
        """``(shard, positions in it)`` of the positions of ``indices``, shards in the order
        the indices reach them; with ``prefetch_shards``, the first ``1 + prefetch_shards``
        (``prefetch_shards`` when the shard being read is not among them: a next one may not
        evict the one after)."""
        pos = valid_positions(indices, self._n)
        if not pos.size:
            return []
        starts = np.asarray(self._starts, np.int64)
        which = np.searchsorted(starts, pos, side="right") - 1
        first = np.unique(which, return_index=True)[1]
        wanted = which[np.sort(first)].tolist()
        if self.prefetch_shards is not None:
            wanted = wanted[:1 + self.prefetch_shards]
            order = self._order.peek()
            reading = order[-1] if order else None
            if reading is not None and reading not in wanted:
                wanted = wanted[:self.prefetch_shards]
        return [(s, (pos[which == s] - starts[s]).tolist()) for s in wanted]

    def will_need(self, indices: Union[np.ndarray, Sequence[int]], wait: bool = False) -> None:
        """Hand each shard the positions of ``indices`` that fall in it (see
        :func:`gluon_data.stores.base.will_need`): a local shard advises the kernel, a remote one
        starts downloading its object in the background (at most ``prefetch_shards`` beyond
        the one being read). ``wait``: return once those downloads are done."""
        hinted = [(self._store(s), local) for s, local in self._hinted(indices)]
        for f, local in hinted:  # every download started before any is waited for
            will_need(f, local)
        if wait:
            for f, local in hinted:
                will_need(f, local, wait=True)

    def prefetch(self, indices: Union[np.ndarray, Sequence[int]]) -> list:
        """Deprecated: ``will_need(indices, wait=True)`` waits for the downloads. Returns the
        futures of the remote shards' downloads the hint started or found in flight (empty
        for local shards)."""
        warnings.warn("ShardedStore.prefetch(indices) is deprecated: will_need(indices) is the "
                      "hint, will_need(indices, wait=True) waits for its downloads",
                      DeprecationWarning, stacklevel=2)
        out = []
        for s, local in self._hinted(indices):
            fut = getattr(self._store(s), "_fetch_ahead", lambda _: None)(local)
            if fut is not None:
                out.append(fut)
        return out

    def check_tail(self) -> None:
        """Check that each ``.rec`` shard's last indexed record ends it (``verify`` does)."""
        if self.container == "rec":
            for s in range(len(self.paths)):
                f = self.shard(s)
                (getattr(f, "check_tail", None) or f._check_tail)()

    def close(self) -> None:
        """Close every open shard (a remote shard's cached copy becomes evictable)."""
        with self._lock:
            for f in self._shards:
                if f is not None:
                    f.close()
            self._order.clear()

    def view(self, i: int) -> Union[bytes, memoryview]:
        if isinstance(i, int) and 0 <= i < self._n:  # the hot path, inlined: ~0.3 us
            starts = self._starts
            s = bisect_right(starts, i) - 1
            f = self._shards[s]
            return (self.shard(s) if f is None or self.max_open_shards is not None
                    else f).view(i - starts[s])
        s, j = self.locate(i)
        return self.shard(s).view(j)

    def __getstate__(self) -> dict:
        return {"location": self.location, "identity": self._identity,
                "options": dict(self._options, max_open_shards=self.max_open_shards,
                                prefetch_shards=self.prefetch_shards)}

    def __setstate__(self, state: dict) -> None:
        type(self).__init__(self, state["location"], **state.get("options", {}))
        if self._identity != state["identity"]:
            raise FormatError("the sharded dataset was replaced after it was opened (its "
                              "manifest changed); open it again", self.location)

    def __repr__(self) -> str:
        return "ShardedStore(%r, %d shards, %d records)" % (self.location, len(self.paths),
                                                            self._n)


def _at_least(value, default, low: int):
    return default if value is None else max(low, int(value))


def _open(location: str, split: Optional[str] = None, **options) -> ShardedStore:
    return ShardedStore(location, split, **options)


register_opener(is_manifest, _open, priority=10)
