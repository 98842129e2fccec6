"""Sharded datasets: a plan, N self-contained shards, a manifest, and one store over them.

A sharded split is ``PREFIX-00000-of-00016.rec`` (``.idx``, ``.meta.json``; or one
``PREFIX-00000-of-00016.lmdb`` environment per shard) plus ``PREFIX.shards.json``, the
manifest, written last (FORMAT.md, section 7). This module is the store layer: names, the
shard plan's ranges, the manifest, :class:`ShardedStore` (the shards read as one
:class:`~gluon_data.store.RecordStore`) and :func:`verify_sharded`. The conversion (one task
per shard) is :mod:`gluon_data.convert.sharded`, which sits above it;
:func:`convert_sharded` stays importable from here.
"""
from __future__ import annotations

import hashlib
import importlib
import operator
import os
import re
import threading
from bisect import bisect_right
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np

from .documents import load_document
from .errors import FormatError, GluonDataError
from .fsutil import atomic_write, classify_location, sha256_file
from .lmdbio import is_lmdb, read_lmdb_meta
from .meta import dumps_meta, meta_path, read_meta
from .recordio import BINARY_INDEX_SUFFIX, idx_path_for, read_index
from .store import (is_uri, open_store, read_bytes, register_opener, valid_positions,
                    will_need)
from .verify import VerifyReport, register_verifier, verify

__all__ = ["ShardedStore", "convert_sharded", "plan_ranges", "parse_size", "shard_name",
           "manifest_path", "read_manifest", "is_manifest", "verify_sharded",
           "write_combined_index", "dataset_files",
           "MANIFEST_SUFFIX", "MANIFEST_FORMAT", "MANIFEST_VERSION"]

MANIFEST_SUFFIX = ".shards.json"
MANIFEST_FORMAT = "gluon_data-shards"
MANIFEST_VERSION = 1
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)?\s*$", re.I)
_UNITS = {"": 1, "B": 1, "K": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9, "T": 10 ** 12,
          "KI": 1 << 10, "MI": 1 << 20, "GI": 1 << 30, "TI": 1 << 40}


# --------------------------------------------------------------------------- naming, plan
def is_manifest(location: str) -> bool:
    """Whether ``location`` names a shard manifest (``*.shards.json``)."""
    return os.fspath(location).endswith(MANIFEST_SUFFIX)


def prefix_of(output: str) -> str:
    """``out/train.rec`` / ``out/train.lmdb`` / ``out/train.shards.json`` -> ``out/train``."""
    output = os.fspath(output).rstrip("/")
    for ext in (MANIFEST_SUFFIX, ".rec", ".lmdb"):
        if output.endswith(ext):
            return output[:-len(ext)]
    return output


def manifest_path(prefix: str) -> str:
    return prefix + MANIFEST_SUFFIX


def shard_name(prefix: str, index: int, count: int, container: str = "rec") -> str:
    """``PREFIX-00003-of-00016.rec`` (Beam's ``-SSSSS-of-NNNNN``); ``.lmdb`` for LMDB."""
    return "%s-%05d-of-%05d.%s" % (prefix, index, count, container)


def parse_size(text: str) -> int:
    """``"1GB"`` -> 10**9, ``"512MiB"`` -> 512 * 2**20, ``"4096"`` -> 4096 bytes."""
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError("cannot parse size %r; write e.g. 1GB, 256MB, 512MiB" % (text,))
    unit = (m.group(2) or "").upper().rstrip("B")
    unit = unit if unit else ("" if not m.group(2) else "B")
    n = int(float(m.group(1)) * _UNITS[unit])
    if n <= 0:
        raise ValueError("size must be positive, got %r" % (text,))
    return n


def plan_ranges(sizes: Sequence[int], shards: Optional[int] = None,
                shard_size: Optional[int] = None,
                shard_items: Optional[int] = None) -> List[Tuple[int, int]]:
    """Cut ``len(sizes)`` items (in order) into contiguous ``[start, end)`` shards.

    Exactly one of ``shards`` (equal counts), ``shard_size`` (bytes, from ``sizes``: a shard
    closes once it reaches the size) or ``shard_items`` (items per shard) is given.

    >>> plan_ranges([1] * 10, shards=3)
    [(0, 3), (3, 6), (6, 10)]
    """
    n = len(sizes)
    given = [x is not None for x in (shards, shard_size, shard_items)]
    if sum(given) != 1:
        raise ValueError("give exactly one of shards, shard_size, shard_items")
    if n == 0:
        raise ValueError("nothing to shard: no items")
    if shards is not None:
        if shards < 1 or shards > n:
            raise ValueError("--shards %d: need 1..%d (one item at least per shard)"
                             % (shards, n))
        bounds = [k * n // shards for k in range(shards + 1)]
        return list(zip(bounds[:-1], bounds[1:]))
    if shard_items is not None:
        if shard_items < 1:
            raise ValueError("--shard-items must be >= 1, got %d" % shard_items)
        return [(s, min(s + shard_items, n)) for s in range(0, n, shard_items)]
    if shard_size < 1:
        raise ValueError("--shard-size must be positive")
    out, start, acc = [], 0, 0
    for i, s in enumerate(sizes):
        acc += int(s)
        if acc >= shard_size:
            out.append((start, i + 1))
            start, acc = i + 1, 0
    if start < n:
        out.append((start, n))
    return out


def _shard_files(path: str, container: str) -> List[str]:
    if container == "lmdb":
        return [os.path.join(path, "data.mdb")]
    return [path, idx_path_for(path), meta_path(path)]


def dataset_files(*locations: str, container: Optional[str] = None) -> List[str]:
    """The local files the datasets at ``locations`` consist of: what reading them reads, or
    writing them writes or replaces. A ``.rec``: it, its ``.idx``, ``.idx.gdx`` and
    ``.meta.json``; an LMDB: the directory, its ``data.mdb`` and ``lock.mdb``; a manifest: it
    and every shard's files (only itself when it cannot be read); a URI: none. ``container``
    (``'rec'``, ``'lmdb'``) says what an output will be (by default: what is there now, see
    :func:`~gluon_data.fsutil.classify_location`).

    >>> dataset_files("out/a.rec", container="rec")
    ['out/a.rec', 'out/a.idx', 'out/a.idx.gdx', 'out/a.meta.json']
    """
    out: List[str] = []
    for loc in map(os.fspath, locations):
        kind = "manifest" if is_manifest(loc) else container or classify_location(loc)
        if kind in ("uri", "missing") or is_uri(loc):
            continue
        if kind == "lmdb":
            out += [loc, os.path.join(loc, "data.mdb"), os.path.join(loc, "lock.mdb")]
        elif kind == "rec":
            idx = idx_path_for(loc)
            out += [loc, idx, idx + BINARY_INDEX_SUFFIX, meta_path(loc)]
        else:
            out.append(loc)
        if kind == "manifest" and os.path.isfile(loc):
            try:
                doc = read_manifest(loc)
            except (GluonDataError, OSError):
                continue
            folder = os.path.dirname(os.path.abspath(loc))
            out += dataset_files(*(os.path.join(folder, s["name"]) for s in doc["shards"]),
                                 container=doc["container"])
    return out


def _read_shard_meta(path: str, container: str, split: str) -> Optional[dict]:
    if container == "lmdb":
        return read_lmdb_meta(path).get(split) if is_lmdb(path) else None
    return read_meta(path) if os.path.exists(path) else None


def shard_summary(path: str, container: str, split: str) -> dict:
    """Records, bytes and checksums of a published shard: its manifest entry."""
    meta = _read_shard_meta(path, container, split)
    if meta is None:
        raise FormatError("shard has no metadata (missing or not written by a sharded "
                          "conversion)", path)
    if container == "lmdb":
        stored = dict(meta)
        return {"name": os.path.basename(path), "records": meta["num_records"],
                "bytes": os.path.getsize(os.path.join(path, "data.mdb")), "idx_sha256": None,
                "meta_sha256": hashlib.sha256(dumps_meta(stored)).hexdigest(), "meta": meta}
    rec, idx, mp = _shard_files(path, container)
    return {"name": os.path.basename(path), "records": meta["num_records"],
            "bytes": os.path.getsize(rec), "idx_sha256": sha256_file(idx),
            "meta_sha256": sha256_file(mp), "meta": meta}


# --------------------------------------------------------------------------- manifest
def read_manifest(path: str) -> dict:
    """Load and check a manifest; :class:`FormatError` naming it when it is not one."""
    return _load_manifest(path)[0]


def _load_manifest(path: str, raw: Optional[bytes] = None,
                   where: Optional[str] = None) -> Tuple[dict, bytes]:
    """The manifest at ``path`` (or its bytes ``raw``, named ``where``) and its bytes, checked:
    its schema and its invariants (:mod:`gluon_data.documents`, kind ``manifest``: shard ``i``
    named ``PREFIX-%05d-of-%05d`` at position ``i``, counts adding up, the checksum)."""
    path = os.fspath(path)
    if raw is None:
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            raise FileNotFoundError("no sharded dataset at %s (its manifest is missing: a "
                                    "sharded conversion writes it last, so the conversion did "
                                    "not finish; rerun the same command)" % path) from None
    return load_document(raw, "manifest", where or path), raw


def shard_mismatch(doc: dict, s: int, meta: Optional[dict]) -> Optional[str]:
    """Why shard ``s``'s metadata does not belong to manifest ``doc`` (``None`` if it does):
    its ``shard`` record must give its position, the number of shards and the manifest's plan
    digest. Metadata without a ``shard`` record (written before it existed) is left to the
    counts and, in ``verify``, the checksums."""
    if meta is None:
        return "has no metadata (.meta.json): every shard of a sharded conversion has one"
    info = meta.get("shard")
    if info is None:
        return None
    n = len(doc["shards"])
    if (info["index"], info["count"]) != (s, n):
        return ("is shard %d of %d by its metadata, not %d of %d: the manifest's entries or "
                "the shard files were moved" % (info["index"], info["count"], s, n))
    plan = doc.get("plan") or {}
    if "names" in plan:  # the plan's names digest: each shard's own digest covers its items
        want, have = plan["names"], info.get("plan")
    else:  # written before shards had a digest of their own: one plan digest for all
        want, have = plan.get("digest"), info["plan_digest"]
    if want is not None and have != want:
        return ("belongs to another conversion (its metadata's plan digest is %s..., the "
                "manifest's %s...): restore the shard or rerun the conversion"
                % (str(have)[:12], want[:12]))
    return None


def _write_manifest(path: str, doc: dict) -> None:
    atomic_write(path, dumps_meta(doc))


# --------------------------------------------------------------------------- the store
class ShardRouter:
    """The :class:`~gluon_data.store.RecordStore` methods of N shards read as one: global
    position ``i`` -> (shard, record) through the cumulative record counts, each call routed
    to ``self.shard(s)``. Subclasses (:class:`ShardedStore`) set ``_starts`` (a list: 0, then the running totals), ``_n``
    and ``_identity``, and define ``shard(s)``."""

    _starts: List[int]
    _n: int
    _identity: str

    def shard(self, s: int):  # pragma: no cover - defined by subclasses
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

    def view(self, i: int):
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
    """N shards behind a manifest, read as one :class:`~gluon_data.store.RecordStore`.

    Global position ``i`` maps to (shard, record) through the cumulative record counts;
    each shard is opened lazily, on first use, in each process, through
    :func:`~gluon_data.store.open_store` -- a local file, or, for a manifest at a URI, the
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
        Passed to :func:`~gluon_data.store.open_store` for each shard (the remote store's
        ``storage_options``, ``cache_dir``, ``cache_limit``, ``reads``...).

    Examples
    --------
    >>> store = ShardedStore("imagenet/train.shards.json")   # doctest: +SKIP
    >>> len(store), store.locate(1000)                        # doctest: +SKIP
    (1281167, (0, 1000))
    """

    def __init__(self, location: str, split: Optional[str] = None, *,
                 max_open_shards: Optional[int] = None, prefetch_shards: Optional[int] = None,
                 **options):
        self.location = os.fspath(location)
        self._options = dict(options)
        remote = is_uri(self.location)
        raw = read_bytes(self.location, **options) if remote else None
        self.manifest, raw = _load_manifest(self.location, raw)
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
        self._lock = threading.RLock()  # (shard() opens through _store())
        self._reset()

    def _reset(self) -> None:
        self._shards: List[object] = [None] * len(self.paths)
        self._order: List[int] = []  # the open shards, least recently opened first
        self._pid = os.getpid()

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

    def shard(self, s: int):
        """The store of shard ``s`` (what :func:`~gluon_data.store.open_store` gives for its
        location), opened on first use; with ``max_open_shards``, the least recently opened
        one beyond it is closed."""
        f = self._shards[s]
        if f is not None and self.max_open_shards is None:
            return f
        if self._pid != os.getpid():  # forked: the parent's open list is not ours
            self._order, self._pid = [], os.getpid()
        order = self._order
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
            sums = {"data.mdb": files.get(name + "/data.mdb") or {"bytes": entry["bytes"]}}
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
        if not remote and not os.path.exists(path):
            raise FileNotFoundError("%s of %s is missing; restore it or rerun the conversion"
                                    % (self._label(s), self.location))
        entry = self.manifest["shards"][s]
        # a .rec's size is fixed by its records; an LMDB's data.mdb may grow with any commit,
        # so an LMDB shard is bound by its metadata and its records' checksums instead (a
        # remote shard by the manifest's sizes and SHA-256 sums, checked on download)
        try:
            size = None if self.container == "lmdb" or remote else os.path.getsize(path)
        except OSError:
            size = None  # the reader below names what is missing
        if size is not None and size != entry["bytes"]:
            raise FormatError("%s has %d bytes, the manifest says %d: the shard was replaced "
                              "or damaged; restore it or rerun the conversion"
                              % (self._label(s), size, entry["bytes"]), path)
        split = (self.manifest.get("split") or "train") if self.container == "lmdb" else None
        try:
            f = open_store(path, split, **self._shard_options(s))
            wrong = None if remote else shard_mismatch(self.manifest, s, f.meta)
        except GluonDataError as e:
            raise type(e)("%s is damaged: %s" % (self._label(s), e.reason), e.path or path,
                          e.key, e.offset) from None
        if wrong is not None:
            f.close()
            raise FormatError("%s %s" % (self._label(s), wrong), path)
        if len(f) != want:
            raise FormatError("%s holds %d records, the manifest promises %d"
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
            reading = self._order[-1] if self._order and self._pid == os.getpid() else None
            if reading is not None and reading not in wanted:
                wanted = wanted[:self.prefetch_shards]
        return [(s, (pos[which == s] - starts[s]).tolist()) for s in wanted]

    def will_need(self, indices) -> None:
        """Hand each shard the positions of ``indices`` that fall in it (see
        :func:`gluon_data.store.will_need`): a local shard advises the kernel, a remote one
        starts downloading its object in the background (at most ``prefetch_shards`` beyond
        the one being read)."""
        for s, local in self._hinted(indices):
            will_need(self._store(s), local)

    def prefetch(self, indices) -> list:
        """:meth:`will_need` returning the futures of the remote shards' downloads it
        started or found in flight (empty for local shards)."""
        out = []
        for s, local in self._hinted(indices):
            fut = getattr(self._store(s), "prefetch", lambda _: None)(local)
            if fut is not None:
                out.append(fut)
        return out

    def check_tail(self) -> None:
        """Check that each ``.rec`` shard's last indexed record ends it (``verify`` does)."""
        if self.container == "rec":
            for s in range(len(self.paths)):
                f = self.shard(s)
                getattr(f, "check_tail", None) or f._check_tail()

    def close(self) -> None:
        """Close every open shard (a remote shard's cached copy becomes evictable)."""
        with self._lock:
            for f in self._shards:
                if f is not None:
                    f.close()
            self._order = []

    def view(self, i: int):
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
        self.__init__(state["location"], **state.get("options", {}))
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


def write_combined_index(manifest: str, idx_path: str) -> List[str]:
    """For stock MXNet: one ``.idx`` over all RecordIO shards of ``manifest``, offsets
    counted from the start of the first shard as if the shards were concatenated, which is
    how ``ImageRecordIter(path_imgrec="a.rec;b.rec;...")`` addresses them. Returns the
    shard paths in order (join them with ``;`` for ``path_imgrec``).

    >>> paths = write_combined_index("train.shards.json", "train.all.idx")   # doctest: +SKIP
    >>> it = mx.io.ImageRecordIter(path_imgrec=";".join(paths),              # doctest: +SKIP
    ...                            path_imgidx="train.all.idx", shuffle=True, ...)
    """
    store = ShardedStore(manifest)
    if store.container != "rec":
        raise ValueError("a combined index needs RecordIO shards, %s holds %s"
                         % (manifest, store.container))
    base, lines = 0, []
    for s, path in enumerate(store.paths):
        store.shard(s)  # missing or damaged: an error naming the shard
        keys, offsets = read_index(idx_path_for(path))
        lines.extend("%d\t%d\n" % (k, o + base) for k, o in zip(keys.tolist(),
                                                                  offsets.tolist()))
        base += os.path.getsize(path)
    atomic_write(idx_path, "".join(lines).encode("ascii"))  # fsynced, never through a link
    return list(store.paths)


# --------------------------------------------------------------------------- verify
def verify_sharded(path: str, deep: bool = False, workers: int = 4):
    """Check the manifest against every shard (existence, counts, sizes, checksums), then
    every shard with :func:`gluon_data.verify.verify` (in parallel threads); one report."""
    report = VerifyReport(path, deep=deep)
    try:
        doc = read_manifest(path)
    except (GluonDataError, OSError) as e:
        report.add(e, path)
        return report
    folder = os.path.dirname(os.path.abspath(path))
    container, split = doc["container"], doc.get("split") or "train"
    n = len(doc["shards"])
    todo = []
    for s, entry in enumerate(doc["shards"]):
        spath = os.path.join(folder, entry["name"])
        where = "shard %d of %d (%s)" % (s, n, spath)
        if not os.path.exists(spath):
            report.problems.append({"where": where, "key": None, "offset": None,
                                    "reason": "shard is missing"})
            continue
        try:
            have = shard_summary(spath, container, split)
        except (GluonDataError, OSError) as e:
            report.add(e, where)
            continue
        wrong = shard_mismatch(doc, s, have["meta"])
        if wrong is not None:
            report.problems.append({"where": where, "key": None, "offset": None,
                                    "reason": "the shard " + wrong})
        for k in ("records", "bytes", "idx_sha256", "meta_sha256"):
            if have[k] != entry.get(k):
                report.problems.append({"where": where, "key": None, "offset": None,
                                        "reason": "%s is %s, the manifest says %s"
                                        % (k, have[k], entry.get(k))})
        todo.append(spath)
    if container == "lmdb":  # verify() forks a child per LMDB: not from several threads
        workers = 1
    with ThreadPoolExecutor(max(1, min(workers, len(todo) or 1))) as ex:
        for sub in ex.map(lambda p: verify(p, deep=deep), todo):
            report.records += sub.records
            report.checked += sub.checked
            report.problems.extend(sub.problems)
    return report


register_verifier(is_manifest, verify_sharded)

_CONVERTER_NAMES = ("convert_sharded", "write_shard", "ShardJob")


def __getattr__(name: str):
    """The sharded conversion's names, kept importable from here: the converter lives above
    the stores, in :mod:`gluon_data.convert.sharded`, which imports this module (PEP 562)."""
    if name in _CONVERTER_NAMES:
        return getattr(importlib.import_module("gluon_data.convert.sharded"), name)
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
