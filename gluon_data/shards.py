"""Sharded datasets: a plan, N self-contained shards, a manifest, and one store over them.

A sharded split is ``PREFIX-00000-of-00016.rec`` (``.idx``, ``.meta.json``; or one
``PREFIX-00000-of-00016.lmdb`` environment per shard) plus ``PREFIX.shards.json``, the
manifest, written last (FORMAT.md, section 7). Conversion is one task per shard, a pure
function of (plan, shard number, options) run by :mod:`gluon_data.engines`; each task calls
the converter's own per-item code (:func:`gluon_data.convert.encode_item`) and writers, and
publishes its shard by rename. A rerun skips shards whose metadata carries the plan's digest.
:class:`ShardedStore` reads the shards as one :class:`~gluon_data.store.RecordStore`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import operator
import os
import re
import threading
import time
from bisect import bisect_right
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from .credentials import forward_options
from .documents import load_document
from .engines import SHARED_PATH_RULE
from .errors import ConversionError, FormatError, GluonDataError, WorkerPathError
from .fsutil import check_disjoint, classify_location, sha256_file
from .meta import CONTAINER_KEYS, meta_path
from .plan import plan_digest, source_head
from .recordio import BINARY_INDEX_SUFFIX, idx_path_for
from .store import is_uri, register_opener, valid_positions, will_need

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


# --------------------------------------------------------------------------- one shard task
@dataclass(frozen=True)
class ShardJob:
    """Everything one shard task needs (picklable; sent to a process or a Dask worker).

    ``items`` (encode: ``(global position, Item)`` pairs) or ``copy_from`` (copy: a store
    location, its split and the ``[start, end)`` record range) say what goes in.
    """

    path: str
    index: int
    count: int
    container: str
    split: str
    digest: str
    items: Optional[tuple] = None
    copy_from: Optional[Tuple[str, Optional[str], int, int]] = None
    source_meta: Optional[dict] = None
    src: object = None        # convert's Source, without its item lists
    opts: object = None       # convert.EncodeOptions
    classes: Optional[list] = None
    num_classes: Optional[int] = None
    options: Optional[dict] = None
    on_error: str = "fail"
    source_options: Optional[dict] = None  # a copy from a URI: the remote store's options
    plan: Optional[str] = None  # the split plan's names-only digest (``digest``: this shard's)


def _shard_files(path: str, container: str) -> List[str]:
    if container == "lmdb":
        return [os.path.join(path, "data.mdb")]
    from .meta import meta_path
    from .recordio import idx_path_for
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


def _check_not_source(plans: List[dict], container: str, source: str) -> None:
    """Refuse a sharded output that would write or replace a file of its ``source`` (its
    manifests, its shards' files), before any task runs."""
    shards = dataset_files(*(j.path for p in plans for j in p["jobs"]), container=container)
    check_disjoint([manifest_path(p["prefix"]) for p in plans] + shards,
                   dataset_files(source))


def _read_shard_meta(path: str, container: str, split: str) -> Optional[dict]:
    if container == "lmdb":
        from .lmdbio import is_lmdb, read_lmdb_meta
        return read_lmdb_meta(path).get(split) if is_lmdb(path) else None
    from .meta import read_meta
    return read_meta(path) if os.path.exists(path) else None


def shard_summary(path: str, container: str, split: str) -> dict:
    """Records, bytes and checksums of a published shard: its manifest entry."""
    from .meta import dumps_meta
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


def _finished(job: ShardJob) -> Optional[dict]:
    """The summary of a shard this plan already published from the same state of its items
    (``job.digest`` covers their sizes and mtimes), else ``None``: a shard of a changed
    source, or of a version that did not record those, is rewritten."""
    try:
        meta = _read_shard_meta(job.path, job.container, job.split)
    except (GluonDataError, OSError):
        return None
    info = (meta or {}).get("shard") or {}
    if info.get("plan_digest") != job.digest or info.get("index") != job.index:
        return None
    if not all(os.path.exists(p) for p in _shard_files(job.path, job.container)):
        return None
    return dict(shard_summary(job.path, job.container, job.split), reused=True)


def _open_writer(job: ShardJob):
    from .convert import open_writers
    _, writers = open_writers(job.path, [job.split], job.container, overwrite=True)
    return writers


def write_shard(job: ShardJob) -> dict:
    """Write shard ``job.index`` (or recognise it as done); return its manifest entry.

    Idempotent: a shard published by the same plan is kept; anything else under its name
    (partial files of a killed attempt included) is rewritten from scratch and published
    by rename. Raises :class:`ConversionError` naming the shard and the bad item.
    """
    from .convert import _Stats, _fail, _metadata, _split_fields, _work
    done = _finished(job)
    if done is not None:
        return done
    label = "shard %d of %d (%s)" % (job.index, job.count, os.path.basename(job.path))
    shard_info = {"index": job.index, "count": job.count, "plan_digest": job.digest,
                  "plan": job.plan}
    writers: Dict[str, object] = {}
    t0 = time.perf_counter()
    try:
        writers = _open_writer(job)
        w = _KeyLog(writers[job.split])
        written_keys = w.keys
        if job.copy_from is not None:
            meta = _copy_records(job, w, label)
        else:
            st, skipped = _Stats(), []
            for pos, item in job.items:
                _, payload, info, err = _work((pos, item), job.opts)
                if err is not None:
                    if job.on_error == "fail":
                        raise ConversionError("%s, item %d (%s): %s"
                                              % (label, pos, item.name, err[1]), err[0])
                    skipped.append({"file": err[0], "reason": err[1]})
                    continue
                w.write(item.key if item.key is not None else pos, payload)
                st.add(info)
                if job.src.task == "segmentation":  # as convert(): mode='test' returns it
                    st.names.append(os.path.basename(item.image))
            meta = _metadata(job.src, job.split, w.count, st, job.opts, job.classes,
                             job.num_classes, skipped, job.options)
            meta.update(_split_fields(job.src, job.split, _shard_digest(job), w, st,
                                      [i for _, i in job.items]))
            shard_info.update(items=[job.items[0][0], job.items[-1][0] + 1],
                              stats=st.state())
        meta["shard"] = shard_info
        if job.container == "lmdb" and written_keys != list(range(len(written_keys))):
            meta["record_keys"] = written_keys  # LMDB keys are positions: keep the .idx keys
        w.finish(meta)
        w.publish()
    except BaseException as e:
        _fail(e, writers, job.path)
    out = shard_summary(job.path, job.container, job.split)
    out.update(reused=False, seconds=time.perf_counter() - t0)
    return out


def _shard_digest(job: ShardJob) -> str:
    """The split plan's names-only digest with the shard's index: its ``conversion_id``
    derives from it (and from what was written), as an unsharded conversion's does."""
    return hashlib.sha256(("%s:%d" % (job.plan or job.digest, job.index)).encode()).hexdigest()


class _KeyLog:
    """A writer that remembers the keys written through it (LMDB shards store them)."""

    def __init__(self, writer):
        self.writer, self.keys = writer, []

    def write(self, key: int, payload) -> int:
        self.keys.append(int(key))
        return self.writer.write(key, payload)

    def __getattr__(self, name):
        return getattr(self.writer, name)


def _copy_records(job: ShardJob, w, label: str) -> dict:
    """Copy records ``[start, end)`` of a store byte for byte (checksums verified)."""
    from . import codec
    location, split, start, end = job.copy_from
    store = _open_source_store(location, split, job.source_options)
    seg = job.source_meta["task"] == "segmentation"
    keys = job.source_meta.get("record_keys")
    for i in range(start, end):
        payload = store.read(i)
        try:
            codec.unpack(payload, segmentation=seg, verify=True, path=location,
                         key=store.key(i), offset=store.offset(i))
        except GluonDataError as e:
            raise ConversionError("%s: source record %d: %s" % (label, i, e.reason),
                                  e.path or location) from None
        w.write(keys[i] if keys is not None else store.key(i), payload)
    meta = {k: v for k, v in job.source_meta.items()
            if k not in _NOT_COPIED}
    meta["num_records"] = end - start
    if meta.get("item_names") is not None:  # position i of this shard is start + i
        meta["item_names"] = meta["item_names"][start:end]
    if "conversion_id" in meta:  # a shard is its own dataset: its own, derived id
        meta["conversion_id"] = _shard_digest(job)[:32]
    return meta


#: Metadata keys a copied shard (and its manifest) does not take from the source: the
#: container's own (:data:`gluon_data.meta.CONTAINER_KEYS`) and ``shard``.
_NOT_COPIED = CONTAINER_KEYS + ("shard",)


def _where(source: str) -> str:
    """How a plan names its source: a URI as given, a path made absolute."""
    return source if is_uri(source) else os.path.abspath(source)


def _open_source_store(location: str, split: Optional[str],
                       options: Optional[dict] = None):
    from .lmdbio import LMDBFile, is_lmdb
    from .meta import read_meta
    from .recordio import RecordFile
    if is_uri(location):  # through the remote store (whole objects cached on the node)
        from .store import open_store
        return open_store(location, split, **(options or {}))
    if is_manifest(location):
        return ShardedStore(location, split)
    if is_lmdb(location):
        return LMDBFile(location, split or "train")
    meta = read_meta(location)
    return RecordFile(location, expected_count=meta["num_records"] if meta else None)


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
    from .fsutil import atomic_write
    from .meta import dumps_meta
    atomic_write(path, dumps_meta(doc))


# --------------------------------------------------------------------------- the store
class ShardRouter:
    """The :class:`~gluon_data.store.RecordStore` methods of N shards read as one: global
    position ``i`` -> (shard, record) through the cumulative record counts, each call routed
    to ``self.shard(s)``. Subclasses (local :class:`ShardedStore`, remote
    ``RemoteShardedStore``) set ``_starts`` (a list: 0, then the running totals), ``_n``
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
    shards are opened lazily, on first use, in each process. Pickles carry the location
    only. A missing or damaged shard raises an error naming it.

    Parameters
    ----------
    location : str
        The ``PREFIX.shards.json`` manifest.
    split : str, optional
        Must match the manifest's split when given.

    Examples
    --------
    >>> store = ShardedStore("imagenet/train.shards.json")   # doctest: +SKIP
    >>> len(store), store.locate(1000)                        # doctest: +SKIP
    (1281167, ('imagenet/train-00000-of-00016.rec', 1000))
    """

    def __init__(self, location: str, split: Optional[str] = None, **options):
        self.location = os.fspath(location)
        self.manifest, raw = _load_manifest(self.location)
        self._identity = "sha256:" + hashlib.sha256(raw).hexdigest()
        if split is not None and split != self.manifest.get("split"):
            raise FormatError("split %r not found; this manifest holds split %r"
                              % (split, self.manifest.get("split")), self.location)
        self.split = self.manifest.get("split") if self.manifest["container"] == "lmdb" \
            else None
        self.meta = self.manifest["meta"]
        self.container = self.manifest["container"]
        folder = os.path.dirname(os.path.abspath(self.location))
        self.paths = [os.path.join(folder, s["name"]) for s in self.manifest["shards"]]
        counts = [int(s["records"]) for s in self.manifest["shards"]]
        self._starts = [0] + np.cumsum(counts, dtype=np.int64).tolist()  # bisect: ~0.1 us
        self._n = self._starts[-1]
        self._shards: List[object] = [None] * len(self.paths)
        self._lock = threading.Lock()

    # -- shards ------------------------------------------------------------------------
    def _label(self, s: int) -> str:
        return "shard %d of %d (%s)" % (s, len(self.paths), self.paths[s])

    def shard(self, s: int):
        """The reader of shard ``s`` (``RecordFile`` / ``LMDBFile``), opened on first use."""
        f = self._shards[s]
        if f is not None:
            return f
        with self._lock:
            if self._shards[s] is None:
                self._shards[s] = self._open_shard(s)
            return self._shards[s]

    def _open_shard(self, s: int):
        from .lmdbio import LMDBFile
        from .recordio import RecordFile
        path, want = self.paths[s], self.manifest["shards"][s]["records"]
        if not os.path.exists(path):
            raise FileNotFoundError("%s of %s is missing; restore it or rerun the conversion"
                                    % (self._label(s), self.location))
        entry = self.manifest["shards"][s]
        # a .rec's size is fixed by its records; an LMDB's data.mdb may grow with any commit,
        # so an LMDB shard is bound by its metadata and its records' checksums instead
        data = path
        try:
            size = None if self.container == "lmdb" else os.path.getsize(data)
        except OSError:
            size = None  # the reader below names what is missing
        if size is not None and size != entry["bytes"]:
            raise FormatError("%s has %d bytes, the manifest says %d: the shard was replaced "
                              "or damaged; restore it or rerun the conversion"
                              % (self._label(s), size, entry["bytes"]), data)
        try:
            f = (LMDBFile(path, self.manifest.get("split") or "train")
                 if self.container == "lmdb" else RecordFile(path, expected_count=want))
            wrong = shard_mismatch(self.manifest, s, f.meta)
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

    def will_need(self, indices) -> None:
        """Hand each shard the positions of ``indices`` that fall in it (see
        :func:`gluon_data.store.will_need`). Local shards only: the remote sharded store has
        none, so a hint never opens a remote object."""
        pos = valid_positions(indices, self._n)
        if not pos.size:
            return
        starts = np.asarray(self._starts, np.int64)
        which = np.searchsorted(starts, pos, side="right") - 1
        for s in np.unique(which).tolist():
            will_need(self.shard(s), (pos[which == s] - starts[s]).tolist())

    def view(self, i: int):
        if isinstance(i, int) and 0 <= i < self._n:  # the hot path, inlined: ~0.3 us
            starts = self._starts
            s = bisect_right(starts, i) - 1
            f = self._shards[s]
            return (self.shard(s) if f is None else f).view(i - starts[s])
        s, j = self.locate(i)
        return self.shard(s).view(j)

    def __getstate__(self) -> dict:
        return {"location": self.location, "identity": self._identity}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["location"])
        if self._identity != state["identity"]:
            raise FormatError("the sharded dataset was replaced after it was opened (its "
                              "manifest changed); open it again", self.location)

    def __repr__(self) -> str:
        return "ShardedStore(%r, %d shards, %d records)" % (self.location, len(self.paths),
                                                            self._n)


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
    from .recordio import idx_path_for, read_index
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
    from .fsutil import atomic_write
    atomic_write(idx_path, "".join(lines).encode("ascii"))  # fsynced, never through a link
    return list(store.paths)


# --------------------------------------------------------------------------- verify
def verify_sharded(path: str, deep: bool = False, workers: int = 4):
    """Check the manifest against every shard (existence, counts, sizes, checksums), then
    every shard with :func:`gluon_data.verify.verify` (in parallel threads); one report."""
    from concurrent.futures import ThreadPoolExecutor

    from .verify import VerifyReport, verify
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


# --------------------------------------------------------------------------- conversion
def _check_target(path: str, container: str, split: str, names: str,
                  overwrite: bool) -> None:
    """Refuse to replace ``path`` unless it is a shard of this plan (``names``: the plan's
    names-only digest; the shard may be of another state of the source, then it is redone)."""
    if overwrite or not os.path.exists(path):
        return
    try:
        meta = _read_shard_meta(path, container, split)
    except (GluonDataError, OSError):
        meta = None
    info = (meta or {}).get("shard") or {}
    if info.get("plan", info.get("plan_digest")) != names:  # older shards: names only
        raise FileExistsError("%s already exists and was not written by this plan; pass "
                              "overwrite=True (CLI: --overwrite) to replace it" % path)


def _item_size(item) -> int:
    size = 0
    for p in (item.image, item.mask):
        if p:
            try:
                size += os.path.getsize(p)
            except OSError:
                pass
    return size


def convert_sharded(source: str, output: str, layout: Optional[str] = None, *,
                    shards: Optional[int] = None, shard_size=None,
                    shard_items: Optional[int] = None, engine: str = "local",
                    scheduler: Optional[str] = None, workers: int = 1,
                    format: Optional[str] = None, split: Optional[str] = None,
                    val_ratio: float = 0.0, shuffle: bool = False, seed: int = 0,
                    encoding: str = "passthrough", quality: int = 95, resize: int = 0,
                    mask_encoding: str = "zraw", on_error: str = "fail",
                    classes: Optional[Sequence[str]] = None,
                    num_classes: Optional[int] = None, ignore_label: int = 255,
                    images_dir: str = "images", masks_dir: str = "masks",
                    lst_root: Optional[str] = None, max_pixels: Optional[int] = None,
                    follow_symlinks: bool = False, max_file_bytes: Optional[int] = None,
                    overwrite: bool = False, progress: bool = False, retries: int = 2,
                    source_options: Optional[dict] = None, sink=None,
                    forward_credentials: bool = False):
    """Convert a source (or re-shard a dataset) into shards plus a manifest per split.

    ``source`` is a folder / ``.lst`` (encoded through the converter's per-item code), or a
    ``.rec``, ``.lmdb`` or ``.shards.json`` dataset (records copied, no re-encoding). The
    items are planned into shards by ``shards``, ``shard_size`` (bytes or ``"1GB"``) or
    ``shard_items`` (a ``.shards.json`` source keeps its own shards when none is given),
    one task per shard runs on ``engine`` (``local`` or ``dask``, see
    :func:`gluon_data.engines.run_tasks`), and the manifest is written last. The output is
    byte-identical for any engine and number of workers; rerunning the same call skips the
    shards already published and finishes the rest.

    A dataset source may be a URI (``s3://bucket/x.rec``, ``.lmdb``, ``.shards.json``): each
    task reads its records through the remote store (:mod:`gluon_data.remote`, with
    ``source_options``: ``storage_options``, ``cache_dir``...; they travel with the tasks and
    are never written into the output), whole objects downloaded once per node into the cache.

    Tasks use the storage options they are given and, for the rest, the environment of the
    machine running them (a Dask worker's own); ``forward_credentials`` completes
    ``source_options``' ``storage_options`` with this machine's credentials
    (:func:`gluon_data.credentials.forward_options`), in memory only. Local paths are made
    absolute here; with ``engine='dask'`` every task first checks that the source (and the
    output folder) exist on its worker (:class:`~gluon_data.errors.WorkerPathError`).

    ``sink`` (optional) puts each shard elsewhere than ``output``'s folder, e.g. into object
    storage (:class:`gluon_data.remote.ShardUploader`): ``sink.prepare(plans, container)`` runs
    once the plan is known and checked, before any task; each task is then
    ``sink.write_shard(job)`` instead of :func:`write_shard` (it returns the manifest entry,
    and may add ``files``); the manifests are still written locally under ``output``.

    Returns
    -------
    ConversionReport
        ``outputs`` maps each split to its manifest; ``shards`` lists per-shard entries.
    """
    from . import codec
    from .convert import (ConversionReport, _check_choices, _check_options,
                          _plan, output_format)
    from .engines import run_tasks
    from .lmdbio import is_lmdb
    from .sources import DEFAULT_MAX_FILE_BYTES, open_source

    if isinstance(shard_size, str):
        shard_size = parse_size(shard_size)
    given = sum(x is not None for x in (shards, shard_size, shard_items))
    if given > 1:
        raise ValueError("give only one of --shards, --shard-size, --shard-items")
    _check_choices(encoding, on_error)
    max_pixels = codec.DEFAULT_MAX_PIXELS if max_pixels is None else max_pixels
    max_file_bytes = DEFAULT_MAX_FILE_BYTES if max_file_bytes is None else max_file_bytes
    _check_options(quality=quality, resize=resize, workers=workers, max_pixels=max_pixels,
                   max_file_bytes=max_file_bytes, ignore_label=ignore_label,
                   num_classes=num_classes)
    # paths resolve here, on the client: a Dask worker runs in its own working directory
    source, output = (_where(os.fspath(x)) for x in (source, output))
    lst_root = None if lst_root is None else os.path.abspath(lst_root)
    if forward_credentials and is_uri(source):
        source_options = dict(source_options or {}, storage_options=forward_options(
            source, (source_options or {}).get("storage_options")))
    container = format or ("lmdb" if output.rstrip("/").endswith(".lmdb") else "rec")
    output_format(output, container)  # validates the name
    prefix = prefix_of(output)
    t0 = time.perf_counter()
    report = ConversionReport()
    report.shards = []  # type: ignore[attr-defined]
    plans: List[dict] = []  # per split: jobs, manifest skeleton, merge info
    copying = (is_manifest(source) or source.endswith(".rec") or is_lmdb(source)
               or (is_uri(source) and source.rstrip("/").endswith(".lmdb")))
    if copying:
        found = list(_copy_sources(source, split, source_options))
        for s, loc_split, meta, ranges_default, sizes in found:
            ranges = (plan_ranges(sizes, shards, shard_size, shard_items) if given
                      else ranges_default)
            if ranges is None:
                raise ValueError("re-sharding %s needs --shards, --shard-size or "
                                 "--shard-items" % source)
            spfx = prefix if len(found) == 1 else "%s_%s" % (prefix, s)
            head = {"copy": _where(source), "split": s, "ranges": ranges,
                    "container": container, "meta": meta}
            names = plan_digest(head)
            digest = plan_digest(head, {s: _stamped_files(source)})
            jobs = [ShardJob(path=shard_name(spfx, k, len(ranges), container), index=k,
                             count=len(ranges), container=container, split=meta.get("split")
                             or "train", digest=str(plan_digest({"plan": digest, "shard": k})),
                             copy_from=(source, loc_split, a, b), source_meta=meta,
                             source_options=source_options, plan=str(names))
                    for k, (a, b) in enumerate(ranges)]
            plans.append({"prefix": spfx, "jobs": jobs, "digest": digest, "meta": meta,
                          "names": names, "split": meta.get("split") or "train",
                          "ranges": ranges,
                          "plan": {"source": _where(source), "kind": "copy",
                                   "ranges": ranges, "names": names}})
    else:
        try:
            src = open_source(source, layout, split=split, images_dir=images_dir,
                              masks_dir=masks_dir, lst_root=lst_root,
                              follow_symlinks=follow_symlinks)
        except GluonDataError as e:
            raise ConversionError("cannot read source: %s" % e.reason, e.path or source) \
                from None
        from .convert.driver import encode_options, resolve_classes, take_problems
        classes, num_classes = resolve_classes(src, classes, num_classes)
        plan = _plan(src, val_ratio, shuffle, seed)
        take_problems(src, on_error, report)
        opts, options = encode_options(
            src, num_classes, encoding=encoding, quality=quality, resize=resize,
            ignore_label=ignore_label, max_pixels=max_pixels, mask_encoding=mask_encoding,
            max_file_bytes=max_file_bytes, shuffle=shuffle, seed=seed, val_ratio=val_ratio,
            on_error=on_error)
        stub = dataclasses.replace(src, splits={}, problems=[])
        for s, items in plan.items():
            if not items:
                raise ConversionError("split %r would be empty" % s, source)
            ranges = plan_ranges([_item_size(i) for i in items], shards, shard_size,
                                 shard_items) if given else [(0, len(items))]
            spfx = prefix if len(plan) == 1 else "%s_%s" % (prefix, s)
            head = source_head(src, opts, dict(options, shards=ranges, container=container))
            names = plan_digest(head, {s: items}, src.root, stamps=False)
            each = [str(plan_digest(dict(head, shard=k), {s: items[a:b]}, src.root))
                    for k, (a, b) in enumerate(ranges)]  # each shard: its own items' stamps
            digest = plan_digest(dict(head, shards=each))
            jobs = [ShardJob(path=shard_name(spfx, k, len(ranges), container), index=k,
                             count=len(ranges), container=container, split=s, digest=each[k],
                             items=tuple((p, items[p]) for p in range(a, b)), src=stub,
                             opts=opts, classes=classes, num_classes=num_classes,
                             options=options, on_error=on_error, plan=str(names))
                    for k, (a, b) in enumerate(ranges)]
            plans.append({"prefix": spfx, "jobs": jobs, "digest": digest, "names": names,
                          "split": s,
                          "ranges": ranges, "merge": (stub, opts, classes, num_classes,
                                                      options),
                          "plan": {"source": os.path.abspath(src.root), "layout": src.layout,
                                   "kind": "encode", "options": options,
                                   "items": len(items), "ranges": ranges, "names": names}})
    _check_not_source(plans, container, source)  # an output sharing a file with the source
    # refuse to clobber what this plan did not write, before any work
    for p in plans:
        mp = manifest_path(p["prefix"])
        if not overwrite and os.path.exists(mp):
            try:  # this plan's, of this or another state of the source
                made = read_manifest(mp)["plan"]
                same = made.get("names", made["digest"]) == p["names"]
            except (GluonDataError, KeyError, OSError):
                same = False
            if not same:
                raise FileExistsError("%s already exists and was made by another plan; pass "
                                      "overwrite=True (CLI: --overwrite) to replace it" % mp)
        for j in p["jobs"]:
            _check_target(j.path, container, j.split, p["names"], overwrite)
    if sink is not None:
        sink.prepare(plans, container)
    shared = []  # what every Dask task checks on its worker before it starts
    if not is_uri(source):
        shared.append(("source", source if copying else os.path.abspath(src.root)))
    if sink is None and engine == "dask":
        os.makedirs(os.path.dirname(output), exist_ok=True)
        shared.append(("output folder", os.path.dirname(output)))
    jobs = [j for p in plans for j in p["jobs"]]
    total = sum(len(j.items) if j.items is not None else j.copy_from[3] - j.copy_from[2]
                for j in jobs)
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=total, unit="img", desc="convert %d shards" % len(jobs),
                   dynamic_ncols=True)
    results: Dict[str, dict] = {}
    nbytes = 0
    try:
        keys = ["gluon-data-%s-%s" % (os.path.basename(j.path), j.digest[:16]) for j in jobs]
        task = write_shard if sink is None else sink.write_shard
        for i, res in run_tasks(task, jobs, engine=engine, workers=workers,
                                scheduler=scheduler, retries=retries, keys=keys,
                                shared_paths=shared):
            if sink is None and engine == "dask":
                _check_shard_here(jobs[i], res)
            results[jobs[i].path] = res
            n_items = (len(jobs[i].items) if jobs[i].items is not None
                       else jobs[i].copy_from[3] - jobs[i].copy_from[2])
            nbytes += res["bytes"]
            if bar is not None:
                bar.update(n_items)
                bar.set_postfix_str("%.1f MB, %d/%d shards" % (nbytes / 1e6, len(results),
                                                               len(jobs)))
    finally:
        if bar is not None:
            bar.close()
    for p in plans:
        entries = [results[j.path] for j in p["jobs"]]
        meta = _merged_meta(p, entries, report.skipped)
        doc = {"format": MANIFEST_FORMAT, "format_version": MANIFEST_VERSION,
               "container": container, "split": p["split"], "task": meta["task"],
               "num_records": sum(e["records"] for e in entries),
               "plan": dict(p["plan"], digest=p["digest"]),
               "shards": [{k: e[k] for k in ("name", "records", "bytes", "idx_sha256",
                                             "meta_sha256")} for e in entries],
               "meta": meta}
        mp = manifest_path(p["prefix"])
        _write_manifest(mp, doc)
        report.outputs[p["split"]] = mp
        report.written[p["split"]] = sum(e["records"] for e in entries if not e["reused"])
        kept = [e for e in entries if e["reused"]]
        if kept:  # shards a rerun (or a retried task) found complete: not written again
            report.kept[p["split"]] = sum(e["records"] for e in kept)
            report.kept_shards += len(kept)
        for k, e in enumerate(entries):
            report.shards.append(dict(e, split=p["split"], index=k))  # type: ignore
            report.bytes_written += 0 if e["reused"] else e["bytes"]
            report.skipped.extend(e["meta"].get("skipped", []) if not copying else [])
    report.seconds = time.perf_counter() - t0
    return report


def _check_shard_here(job: ShardJob, entry: dict) -> None:
    """A shard a Dask worker reports written must be on this machine too (the output folder
    is shared): else the manifest would name shards the client does not have."""
    rec = _shard_files(job.path, job.container)[0]
    if not os.path.exists(rec) or (job.container == "rec"
                                   and os.path.getsize(rec) != entry["bytes"]):
        raise WorkerPathError("a worker wrote this shard, but it is not on this machine: %s"
                              % SHARED_PATH_RULE, rec)


def _merged_meta(p: dict, entries: List[dict], problems: list) -> dict:
    """The whole split's metadata: the copy source's, or recomputed by the converter's own
    :func:`~gluon_data.convert._metadata` from the shards' merged statistics."""
    import types

    from .convert import _metadata, _split_fields, _Stats
    if "merge" not in p:
        meta = {k: v for k, v in p["meta"].items() if k not in _NOT_COPIED}
        meta["num_records"] = sum(e["records"] for e in entries)
        return meta
    stub, opts, classes, num_classes, options = p["merge"]
    st = _Stats()
    skipped = list(problems)
    for e in entries:
        st.merge(_Stats.from_state(e["meta"]["shard"]["stats"]))
        skipped.extend(e["meta"].get("skipped", []))
    count = sum(e["records"] for e in entries)
    meta = _metadata(stub, p["split"], count, st, opts, classes, num_classes, skipped, options)
    written = types.SimpleNamespace(count=count, bytes_written=sum(e["bytes"] for e in entries))
    meta.update(_split_fields(stub, p["split"], p["names"], written, st,
                              [i for j in p["jobs"] for _, i in j.items]))
    return meta


def _stamped_files(source: str) -> List[str]:
    """The local files of a dataset being copied, whose sizes and mtimes its plan binds
    (none for a URI: its metadata, in the plan, identifies it)."""
    if is_uri(source):
        return []
    if is_manifest(source):
        return [source]
    from .lmdbio import is_lmdb
    return _shard_files(source, "lmdb" if is_lmdb(source) else "rec")


def _copy_sources(source: str, split: Optional[str], options: Optional[dict] = None):
    """``(split, store split, meta, default ranges, record sizes)`` per split to copy."""
    from .convert import _stock_meta
    from .lmdbio import LMDBFile, is_lmdb, read_lmdb_meta
    from .meta import read_meta
    from .recordio import RecordFile
    if is_uri(source):
        yield from _uri_copy_sources(source, split, options or {})
        return
    if is_manifest(source):
        yield _manifest_copy_source(read_manifest(source))
        return
    if is_lmdb(source):
        metas = read_lmdb_meta(source)
        for s in (split.split(",") if split else sorted(metas)):
            f = LMDBFile(source, s)
            yield s, s, f.meta, None, [len(f.read(i)) for i in range(len(f))]
        return
    meta = read_meta(source)
    f = RecordFile(source, expected_count=meta["num_records"] if meta else None)
    meta = meta or _stock_meta(source, len(f))
    sizes = f.extent_sizes().tolist()
    yield None, None, meta, None, sizes


def _manifest_copy_source(doc: dict):
    """:func:`_copy_sources`' entry of a manifest: its shards are the default ranges, and
    each record's size is estimated as its shard's mean."""
    bounds = np.concatenate(([0], np.cumsum([s["records"] for s in doc["shards"]])))
    ranges = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
    sizes = [0] * doc["num_records"]
    per = [s["bytes"] / max(s["records"], 1) for s in doc["shards"]]
    for k, (a, b) in enumerate(ranges):
        sizes[a:b] = [int(per[k])] * (b - a)
    return None, doc.get("split"), doc["meta"], ranges, sizes


def _uri_copy_sources(source: str, split: Optional[str], options: dict):
    """:func:`_copy_sources` of a dataset at a URI, read through its remote store."""
    from .convert import _stock_meta
    from .store import open_store
    first = open_store(source, **options)
    if is_manifest(source):  # a RemoteShardedStore: the manifest says it all
        yield _manifest_copy_source(first.manifest)
        return
    names = getattr(first, "splits", None)
    if names is not None:  # an LMDB (RemoteLMDBStore)
        for s in (split.split(",") if split else names):
            f = first if s == first.split else open_store(source, s, **options)
            yield s, s, f.meta, None, [len(f.read(i)) for i in range(len(f))]
        return
    f = first.record_file()  # a .rec: downloaded whole (with its .idx) into the cache
    meta = first.meta or _stock_meta(source, len(first))
    yield None, None, meta, None, f.extent_sizes().tolist()
