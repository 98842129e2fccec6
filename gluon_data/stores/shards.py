"""Sharded datasets: a plan, N self-contained shards, a manifest, and one store over them.

A sharded split is ``PREFIX-00000-of-00016.rec`` (``.idx``, ``.meta.json``; or one
``PREFIX-00000-of-00016.lmdb`` environment per shard) plus ``PREFIX.shards.json``, the
manifest, written last (FORMAT.md, section 7). This module holds the names, the
shard plan's ranges and the manifest. The shards read as one store are
:class:`~gluon_data.stores.shardstore.ShardedStore`, checked by
:func:`gluon_data.tools.verify.verify_sharded`, and written by the conversion's one task per
shard (:mod:`gluon_data.convert.sharded`).
"""
from __future__ import annotations

import hashlib
import os
from urllib.parse import urlparse
from urllib.request import url2pathname
from typing import Any, List, Optional, Sequence, Tuple, Union, cast

from ..format.documents import load_document
from ..storage.cache import parse_size as cache_parse_size
from ..errors import FormatError, GluonDataError
from ..storage.fileio import read_input, require_regular
from ..storage.fsutil import LMDB_DATA, LMDB_LOCK, atomic_write, sha256_file
from ..format.layout import MANIFEST_SUFFIX, SHARD_PART
from ..format.ownership import classify_location
from .lmdbio import is_lmdb, read_lmdb_meta
from ..format.meta import dumps_meta, meta_path, read_meta
from .recordio import BINARY_INDEX_SUFFIX, idx_path_for, read_index
from .base import is_uri, open_store

__all__ = ["plan_ranges", "parse_size", "shard_name",
           "manifest_path", "read_manifest", "is_manifest",
           "write_combined_index", "dataset_files",
           "MANIFEST_SUFFIX", "MANIFEST_FORMAT", "MANIFEST_VERSION", "shard_files",
           "read_shard_meta", "load_manifest", "write_manifest"]

MANIFEST_FORMAT = "gluon_data-shards"
MANIFEST_VERSION = 1


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


def parse_size(text: Union[int, str]) -> int:
    """A shard size: ``"1GB"`` -> 10**9, ``"512MiB"`` -> 512 * 2**20, ``"4096"`` -> 4096 bytes
    (:func:`gluon_data.storage.cache.parse_size`, the one size parser), which must be
    positive."""
    n = cache_parse_size(text)
    if n is None or n <= 0:
        raise ValueError("a shard size must be positive, got %r; write e.g. 1GB, 256MB, 512MiB"
                         % (text,))
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
    size = cast(int, shard_size)  # (the one given: the check above)
    if size < 1:
        raise ValueError("--shard-size must be positive")
    out, start, acc = [], 0, 0
    for i, s in enumerate(sizes):
        acc += int(s)
        if acc >= size:
            out.append((start, i + 1))
            start, acc = i + 1, 0
    if start < n:
        out.append((start, n))
    return out


def shard_files(path: str, container: str) -> List[str]:
    """The files one shard at ``path`` is made of: a RecordIO shard's ``.rec``, ``.idx`` and
    ``.meta.json`` (the ``.rec`` first), an LMDB shard's ``data.mdb``."""
    if container == "lmdb":
        return [os.path.join(path, LMDB_DATA)]
    return [path, idx_path_for(path), meta_path(path)]


_FILE_URI = "file://"


def _file_uri_paths(uri: str) -> List[str]:
    """The local paths a ``file://`` URI may name: as fsspec reads it (the rest of the URI,
    as written) and as a URL (``file:///a%20b`` is ``/a b``)."""
    raw, decoded = uri[len(_FILE_URI):], url2pathname(urlparse(uri).path)
    return [raw] if raw == decoded else [raw, decoded]


def dataset_files(*locations: str, container: Optional[str] = None) -> List[str]:
    """The local files the datasets at ``locations`` consist of: what reading them reads, or
    writing them writes or replaces. A ``.rec``: it, its ``.idx``, ``.idx.gdx`` and
    ``.meta.json``; an LMDB: the directory, its ``data.mdb`` and ``lock.mdb``; a manifest: it
    and every shard's files (only itself when it cannot be read); a URI: none, but for a
    ``file://`` URI its path's files (under both readings of the path: as written, as fsspec
    reads it, and URL-decoded). ``container``
    (``'rec'``, ``'lmdb'``) says what an output will be (by default: what is there now, see
    :func:`~gluon_data.format.ownership.classify_location`).

    >>> dataset_files("out/a.rec", container="rec")
    ['out/a.rec', 'out/a.idx', 'out/a.idx.gdx', 'out/a.meta.json']
    """
    out: List[str] = []
    for loc in map(os.fspath, locations):
        if loc.startswith(_FILE_URI):
            out += dataset_files(*_file_uri_paths(loc), container=container)
            continue
        kind = "manifest" if is_manifest(loc) else container or classify_location(loc)
        if kind in ("uri", "missing") or is_uri(loc):
            continue
        if kind == "lmdb":
            out += [loc, os.path.join(loc, LMDB_DATA), os.path.join(loc, LMDB_LOCK)]
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


def read_shard_meta(path: str, container: str, split: str) -> Optional[dict]:
    """Shard ``path``'s metadata (an LMDB shard's for ``split``), ``None`` when it has none."""
    if container == "lmdb":
        return read_lmdb_meta(path).get(split) if is_lmdb(path) else None
    return read_meta(path) if os.path.exists(path) else None


def shard_summary(path: str, container: str, split: str) -> dict:
    """Records, bytes and checksums of a published shard: its manifest entry."""
    # (a .rec that is a FIFO, or a link that loops, is refused naming it)
    st = None if container == "lmdb" else require_regular(shard_files(path, container)[0])
    meta = read_shard_meta(path, container, split)
    if meta is None:
        raise FormatError("shard has no metadata (missing or not written by a sharded "
                          "conversion)", path)
    if container == "lmdb":
        stored = dict(meta)
        return {"name": os.path.basename(path), "records": meta["num_records"],
                "bytes": os.path.getsize(os.path.join(path, LMDB_DATA)), "idx_sha256": None,
                "meta_sha256": hashlib.sha256(dumps_meta(stored)).hexdigest(), "meta": meta}
    rec, idx, mp = shard_files(path, container)
    return {"name": os.path.basename(path), "records": meta["num_records"],
            "bytes": os.path.getsize(rec) if st is None else st.st_size,
            "idx_sha256": sha256_file(idx),
            "meta_sha256": sha256_file(mp), "meta": meta}


# --------------------------------------------------------------------------- manifest
def read_manifest(path: str) -> dict:
    """Load and check a manifest; :class:`FormatError` naming it when it is not one."""
    return load_manifest(path)[0]


def load_manifest(path: str, raw: Optional[bytes] = None,
                  where: Optional[str] = None) -> Tuple[dict, bytes]:
    """The manifest at ``path`` (or its bytes ``raw``, named ``where``) and its bytes, checked:
    its schema and its invariants (:mod:`gluon_data.format.documents`, kind ``manifest``: shard ``i``
    named ``PREFIX-%05d-of-%05d`` at position ``i``, counts adding up, the checksum)."""
    path = os.fspath(path)
    if raw is None:
        try:
            raw = read_input(path)
        except FileNotFoundError:
            raise FileNotFoundError("no sharded dataset at %s (%s)" % (path, _why_missing(path))) \
                from None
    return load_document(raw, "manifest", where or path), raw


def _why_missing(manifest: str) -> str:
    """Why a manifest is not there, as far as its folder tells: shards of its prefix without
    it are a sharded conversion that did not finish (the manifest is written last)."""
    folder, name = os.path.split(os.path.abspath(manifest))
    stem = name[:-len(MANIFEST_SUFFIX)] if name.endswith(MANIFEST_SUFFIX) else None
    try:
        shards = stem is not None and any(f.startswith(stem) and SHARD_PART.match(f[len(stem):])
                                          for f in os.listdir(folder))
    except OSError:
        shards = False
    return ("its manifest is missing: a sharded conversion writes it last, so the conversion "
            "did not finish; rerun the same command" if shards else "no such file")


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


def write_manifest(path: str, doc: dict) -> None:
    """Publish manifest ``doc`` at ``path``, atomically (a reader sees the old one or this)."""
    atomic_write(path, dumps_meta(doc))


def write_combined_index(manifest: str, idx_path: str) -> List[str]:
    """For stock MXNet: one ``.idx`` over all RecordIO shards of ``manifest``, offsets
    counted from the start of the first shard as if the shards were concatenated, which is
    how ``ImageRecordIter(path_imgrec="a.rec;b.rec;...")`` addresses them. Returns the
    shard paths in order (join them with ``;`` for ``path_imgrec``).

    >>> paths = write_combined_index("train.shards.json", "train.all.idx")   # doctest: +SKIP
    >>> it = mx.io.ImageRecordIter(path_imgrec=";".join(paths),              # doctest: +SKIP
    ...                            path_imgidx="train.all.idx", shuffle=True, ...)
    """
    # the ShardedStore (gluon_data.stores.shardstore, which imports this module)
    store: Any = open_store(manifest)
    if store.container != "rec":
        raise ValueError("a combined index needs RecordIO shards, %s holds %s"
                         % (manifest, store.container))
    base = 0
    lines: List[str] = []
    for s, path in enumerate(store.paths):
        store.shard(s)  # missing or damaged: an error naming the shard
        keys, offsets = read_index(idx_path_for(path))
        lines.extend("%d\t%d\n" % (k, o + base) for k, o in zip(keys.tolist(),
                                                                  offsets.tolist()))
        base += os.path.getsize(path)
    atomic_write(idx_path, "".join(lines).encode("ascii"))  # fsynced, never through a link
    return list(store.paths)


# --------------------------------------------------------------------------- verify


# The old private name, until benchmarks/bench_scale.py imports write_manifest (then delete
# this line).
_write_manifest = write_manifest
