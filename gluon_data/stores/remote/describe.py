"""What a remote location is made of: its objects, their sizes and SHA-256 sums (from the
metadata or the commit document, or a manifest's entry), read once when the store opens.

A ``.rec`` is its ``.idx`` and itself (and ``.meta.json``, read here); an LMDB environment
``NAME.lmdb`` is ``NAME.lmdb/data.mdb`` (and ``NAME.lmdb/meta.json``, the commit document,
read here). :class:`~gluon_data.stores.remote.stores.RemoteStore` has the cache fetch and verify the
objects, then opens the local copy as a local store.
"""
from __future__ import annotations

import os
import posixpath
from typing import Dict, Optional, Tuple, cast

from ...format.documents import load_document
from ...errors import ChecksumMismatchError, FormatError, RemoteNotFoundError
from ...format.meta import meta_path
from ..recordio import idx_path_for
from ..base import is_uri
from ..check import check_local
from ...storage.remotefs import Remote
from ...format.layout import LMDB_COMMIT, LMDB_DATA, LMDB_MARKER, UPLOAD_MARKER


class Described:
    """A remote location, described once: ``container`` (``'rec'`` or ``'lmdb'``), the
    ``objects`` it is made of (URI -> its manifest-style entry: ``bytes`` and ``sha256``,
    either may be unknown), the ``main`` object (the ``.rec``, ``data.mdb``), the metadata
    (``meta``; an LMDB's ``metas``, split name -> metadata, from its commit document), the
    record count and the stamps learnt (ETag, size) of objects without a SHA-256."""

    def __init__(self, container: str, main: str, objects: Dict[str, dict],
                 meta: Optional[dict], records: Optional[int], size: int,
                 stamps: Optional[Dict[str, str]] = None):
        self.container, self.main, self.objects = container, main, objects
        self.meta, self.records, self.size = meta, records, size
        self.stamps = dict(stamps or {})
        self.metas: Optional[Dict[str, dict]] = None
        self.conversion: Optional[str] = None


def names_remote_lmdb(location: str) -> bool:
    """A URI naming an LMDB environment: ``s3://bucket/voc.lmdb`` (its ``data.mdb`` below)."""
    return is_uri(location) and location.rstrip("/").endswith(".lmdb")


def stamp(info: dict) -> str:
    """An object's version from its listing: its ETag, else its modification time (a local
    ``mtime``, an HTTP server's ``Last-Modified``: Python's own ``http.server`` sends no
    ETag), with its size. Without either, an object replaced by another of the same size
    would be served from the copy cached of the first."""
    etag = (info.get("ETag") or info.get("etag") or info.get("mtime")
            or info.get("Last-Modified") or "")
    return "etag:%s:%s" % (str(etag).strip('"'), info.get("size"))


def _sized(described: dict, location: str, names: Tuple[str, ...]) -> Dict[str, dict]:
    files = described.get("files") or {}
    base = location.rstrip("/") + "/" if names == (LMDB_DATA,) else \
        location.rsplit("/", 1)[0] + "/"
    return {base + n: dict(files.get(n) or {}) for n in names}


def describe_rec(remote: Remote, location: str, split: Optional[str],
                 described: Optional[dict]) -> Described:
    """A ``.rec`` and its ``.idx``: from a manifest's entry (``described``, taken as given),
    else from the metadata (a GET) and the object's size (a HEAD)."""
    idx = idx_path_for(location)
    names = (posixpath.basename(idx), posixpath.basename(location))
    if described is not None:
        objects = _sized(described, location, names)
        return Described("rec", location, objects, None, int(described["records"]),
                         int(described["bytes"]))
    meta = _read_meta(remote, location)
    if split is not None and (meta or {}).get("split", split) != split:  # so meta is a dict
        raise ValueError("%s holds split %r, not %r: a .rec holds one split"
                         % (location, cast(dict, meta)["split"], split))
    info = remote.info(location)
    size = int(info["size"])
    objects = _sized({"files": (meta or {}).get("files") or {}}, location, names)
    _check_size(objects[location], size, "the metadata", location)
    return Described("rec", location, objects, meta,
                     meta["num_records"] if meta else None, size, {location: stamp(info)})


def _check_size(entry: dict, size: int, where: str, uri: str) -> None:
    if "bytes" in entry and int(entry["bytes"]) != size:
        raise ChecksumMismatchError(
            "the object has %d bytes but %s records %d: it was replaced or is being "
            "rewritten; re-upload the dataset" % (size, where, entry["bytes"]), uri)


def _read_meta(remote: Remote, location: str) -> Optional[dict]:
    meta_location = meta_path(location)
    try:
        raw = remote.cat(meta_location)
    except RemoteNotFoundError:
        prefix = os.path.splitext(location)[0]
        if remote.exists(prefix + UPLOAD_MARKER):
            raise FormatError("an upload of this dataset is in progress or was interrupted "
                              "(%s exists, the metadata does not yet): wait for it, or "
                              "rerun the conversion with --resume"
                              % (prefix + UPLOAD_MARKER), location) from None
        return None
    return load_document(raw, "meta", meta_location)


def describe_lmdb(remote: Remote, location: str, described: Optional[dict]) -> Described:
    """An LMDB environment's ``data.mdb``: from a manifest's entry (its split is the
    manifest's), else from the commit document ``meta.json`` (every split's metadata, the
    size and SHA-256 of ``data.mdb``) and a HEAD. Without ``meta.json`` (a bare
    ``data.mdb``) ``metas`` stays ``None``: the metadata is inside, read from
    the download."""
    data = location + "/" + LMDB_DATA
    if described is not None:
        return Described("lmdb", data, _sized(described, location, (LMDB_DATA,)), None,
                         int(described["records"]), int(described["bytes"]))
    doc = _read_commit(remote, location)
    try:
        info = remote.info(data)
    except RemoteNotFoundError:
        raise RemoteNotFoundError("no LMDB environment here (no %s object under it)"
                                  % LMDB_DATA, location) from None
    size = int(info["size"])
    if doc is None:
        return Described("lmdb", data, {data: {}}, None, None, size, {data: stamp(info)})
    want = doc["files"][LMDB_DATA]
    _check_size(want, size, LMDB_COMMIT, data)
    out = Described("lmdb", data, {data: dict(want)}, None, None, size)
    out.metas = doc["splits"]
    return out


def _read_commit(remote: Remote, location: str) -> Optional[dict]:
    """``meta.json``, checked; ``None`` if there is none (a bare ``data.mdb``)."""
    commit = location + "/" + LMDB_COMMIT
    try:
        raw = remote.cat(commit)
    except RemoteNotFoundError:
        marker = location + "/" + LMDB_MARKER
        if remote.exists(marker):
            raise FormatError("an upload of this dataset is in progress or was interrupted "
                              "(%s exists, %s does not yet): wait for it, or rerun the "
                              "conversion with --resume" % (marker, LMDB_COMMIT),
                              location) from None
        return None
    return load_document(raw, "lmdb_commit", commit)


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
    report = check_local(folder, deep=False, isolate=True)
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
