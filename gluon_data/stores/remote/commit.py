"""The one upload protocol of a dataset in object storage (FORMAT.md section 8): the upload
marker, the objects, the commit document last; and the checks made before anything is written."""
from __future__ import annotations

import hashlib
import json
import os
import posixpath
import time
import uuid
from typing import Callable, Dict, Iterable, Optional

from ...errors import OutputError, RemoteError, RemoteNotFoundError
from ...format.meta import dumps_meta, meta_path
from ...format.ownership import Ownership, exists_refusal, location_ownership
from ...storage.remotefs import RangesIgnoredError, Remote
from ...format.layout import LMDB_COMMIT, LMDB_MARKER, MANIFEST_SUFFIX, UPLOAD_MARKER, sibling_uri

_NOT_OURS = ("exists and is not a dataset written by gluon-data (%s); --overwrite only "
             "replaces gluon-data's own outputs, so it was left untouched: remove it or choose "
             "another output name")

#: A folder asked about more objects than this is listed once instead of one HEAD each.
_HEADS_PER_FOLDER = 4


def _commit_names(uri: str):
    """``(commit document, upload marker)`` URIs of the dataset at ``uri`` (a ``.rec``, an
    ``.lmdb`` environment or a ``.shards.json`` manifest), as FORMAT.md section 8 names them."""
    uri = uri.rstrip("/")
    if uri.endswith(".lmdb"):
        return uri + "/" + LMDB_COMMIT, uri + "/" + LMDB_MARKER
    if uri.endswith(MANIFEST_SUFFIX):
        return uri, uri[:-len(MANIFEST_SUFFIX)] + UPLOAD_MARKER
    return meta_path(uri), os.path.splitext(uri)[0] + UPLOAD_MARKER


def _commit_kind(commit: str) -> str:
    """The document kind (:mod:`gluon_data.format.documents`) of the commit document
    ``commit`` (a URI :func:`_commit_names` gave)."""
    if commit.endswith(".lmdb/" + LMDB_COMMIT):
        return "lmdb_commit"
    return "manifest" if commit.endswith(MANIFEST_SUFFIX) else "meta"


def _remote_ownership(remote: "Remote", commit: str, marker: str) -> Ownership:
    """Whether the objects under a dataset's names are ours to replace, and why not: the one
    rule, :func:`gluon_data.format.ownership.location_ownership` (a local output's too), over
    its commit document ``commit`` (checked with its kind's schema) and its upload marker
    ``marker``, read here through ``remote``. A failed remote call propagates."""
    def size(uri: str) -> Optional[int]:
        try:
            return int(remote.info(uri)["size"])
        except RemoteNotFoundError:
            return None

    return location_ownership(size, remote.cat, commit, _commit_kind(commit), marker)


def _remote_is_ours(remote: "Remote", commit: str, marker: str) -> bool:
    """Whether the objects under a dataset's names are recognisably gluon_data's output
    (:func:`_remote_ownership`)."""
    return _remote_ownership(remote, commit, marker).ours


def _facts(info: dict) -> dict:
    """``{"bytes": n, "etag": e}`` of an object's listing or HEAD (no ``etag`` where the
    store reports none)."""
    out: Dict[str, object] = {"bytes": int(info.get("size") or 0)}
    etag = info.get("ETag") or info.get("etag")
    if etag:
        out["etag"] = str(etag).strip('"')
    return out


def existing_objects(remote: "Remote", uris: Iterable[str]) -> Dict[str, dict]:
    """``{uri: {"bytes": n, "etag": e}}`` of those of ``uris`` that exist (``etag`` where
    the store reports one): one HEAD each, or one listing of a folder asked about more than
    a few of its objects."""
    folders: Dict[str, list] = {}
    for u in dict.fromkeys(uris):
        folders.setdefault(u.rsplit("/", 1)[0], []).append(u)
    out: Dict[str, dict] = {}
    for folder, wanted in sorted(folders.items()):
        if len(wanted) <= _HEADS_PER_FOLDER:
            for u in wanted:
                try:
                    out[u] = _facts(remote.info(u))
                except RemoteNotFoundError:
                    pass
            continue
        try:
            entries = remote.call(folder, "list", lambda fs, p, kw: fs.ls(
                p, detail=True, refresh=True, **kw))
        except RemoteNotFoundError:
            continue
        found = {e["name"].rstrip("/").rsplit("/", 1)[-1]: _facts(e)
                 for e in entries if e.get("type") != "directory"}
        out.update((u, found[u.rsplit("/", 1)[-1]]) for u in wanted
                   if u.rsplit("/", 1)[-1] in found)
    return out


def existing_sizes(remote: "Remote", uris: Iterable[str]) -> Dict[str, int]:
    """``{uri: size}`` of those of ``uris`` that exist (:func:`existing_objects`)."""
    return {u: f["bytes"] for u, f in existing_objects(remote, uris).items()}


def object_sha256(remote: "Remote", uri: str, size: int) -> str:
    """The SHA-256 of the object at ``uri`` (``size`` bytes), read once, in ranges."""
    h = hashlib.sha256()
    if size <= _HASH_CHUNK:
        h.update(remote.cat(uri))
        return h.hexdigest()
    try:
        for start in range(0, size, _HASH_CHUNK):
            h.update(remote.cat(uri, start, min(size, start + _HASH_CHUNK)))
    except RangesIgnoredError:
        h = hashlib.sha256(remote.cat(uri))
    return h.hexdigest()


_HASH_CHUNK = 16 << 20


def object_look(remote: "Remote", uri_of: Callable[[str], str],
                found: Dict[str, dict]) -> Callable[[str, dict], Optional[dict]]:
    """What the one rule of "done" (``look`` of :func:`gluon_data.convert.done.why_not_done`)
    learns of the object named ``name`` (its URI ``uri_of(name)``; ``found``: what
    :func:`existing_objects` gave): its size, its ETag where one was recorded and the store
    reports one, else the SHA-256 of its bytes (read once)."""
    def look(name: str, want: dict) -> Optional[dict]:
        uri = uri_of(name)
        have = found.get(uri)
        if have is None:
            return None
        out = {"bytes": have["bytes"]}
        if "bytes" in want and have["bytes"] != want["bytes"]:
            return out
        if "etag" in want and "etag" in have:
            out["etag"] = have["etag"]
        elif "sha256" in want:
            out["sha256"] = object_sha256(remote, uri, have["bytes"])
        return out
    return look


def put_object(remote: "Remote", local: str, uri: str) -> dict:
    """Upload one object of a dataset, then check the storage kept it whole (its size).
    Returns what the store reports of it (``{"bytes": n, "etag": e}``, ``etag`` where it
    reports one): a done record holds it."""
    nbytes = os.path.getsize(local)
    remote.put_file(local, uri)
    facts = _facts(remote.info(uri))
    if facts["bytes"] != nbytes:
        raise RemoteError("uploaded %d bytes but the object has %d: the storage did not keep "
                          "the upload whole" % (nbytes, facts["bytes"]), uri)
    return facts


class Commit:
    """The upload of one dataset at ``uri`` (a ``.rec``, an ``NAME.lmdb`` environment or a
    ``.shards.json`` manifest), in the one order FORMAT.md section 8 describes:

    1. :meth:`refuse` -- before anything is changed, raise unless every existing object under
       the dataset's names may be replaced (``overwrite`` and recognisably ours, or resumed);
    2. :meth:`begin` -- the upload marker (``PREFIX.uploading.json``, ``NAME.lmdb/
       uploading.json``) put, the old commit document removed;
    3. the objects, each with :func:`put_object` (by whoever holds them: the client, or the
       shard task where it runs);
    4. :meth:`end` -- the commit document (``PREFIX.meta.json``, ``NAME.lmdb/meta.json``, the
       manifest), written only once every object it needs exists with its size, then the
       marker removed.

    A reader therefore sees no dataset while the marker exists without a commit document, and
    a complete one once the commit document exists. :meth:`committed` reads the commit
    document a finished earlier upload left (whether that upload is complete is the one
    rule of "done"'s to say, in :mod:`gluon_data.convert.upload`). Picklable.
    """

    def __init__(self, remote: "Remote", uri: str):
        self.remote, self.uri = remote, uri.rstrip("/")
        self.commit, self.marker = _commit_names(self.uri)
        self._ours: Optional[Ownership] = None

    def ownership(self) -> Ownership:
        """Whether what is under the dataset's names is ours, and why not (asked once):
        the one rule of :func:`~gluon_data.format.ownership.location_ownership`, over the
        commit document (checked with its schema) and the upload marker."""
        if self._ours is None:
            self._ours = _remote_ownership(self.remote, self.commit, self.marker)
        return self._ours

    def ours(self) -> bool:
        """Whether what is under the dataset's names is ours (asked once)."""
        return self.ownership().ours

    def refuse(self, present: Iterable[str], overwrite: bool,
               resumed: Callable[[str], bool] = lambda target: False) -> None:
        """Raise :class:`FileExistsError` (no ``overwrite``) or :class:`OutputError` (not
        ours) for the first object of ``present`` (existing objects under the dataset's
        names) this upload may not replace; ``resumed(target)`` says which it continues."""
        for target in present:
            if resumed(target):
                continue
            if not overwrite:
                raise exists_refusal(target)
            verdict = self.ownership()
            if not verdict.ours:
                raise OutputError(_NOT_OURS % verdict.why, target)

    def committed(self) -> Optional[bytes]:
        """The commit document's bytes, or ``None`` where there is none (whether the upload
        it commits is complete is the one rule of "done"'s to say:
        :func:`gluon_data.convert.upload.upload_dataset`)."""
        try:
            return self.remote.cat(self.commit)
        except RemoteNotFoundError:
            return None

    def settle(self) -> None:
        """A complete earlier upload left alone: remove a marker left beside its commit
        document (the upload stopped after committing)."""
        if self.marker in existing_sizes(self.remote, [self.marker]):
            self.remote.rm(self.marker)

    def begin(self) -> None:
        """The upload marker, then the old commit document removed: no commit document may
        describe the objects replaced next."""
        self.remote.pipe(self.marker, json.dumps({"writer": "gluon_data",
                                                  "started": time.time()}).encode())
        self.remote.rm(self.commit)

    def end(self, doc: dict, sizes: Dict[str, int]) -> None:
        """The commit document ``doc``, written once every object of ``sizes`` (``{uri:
        size}``) exists with its size (a :class:`RemoteError` naming the first that does not,
        the dataset left uncommitted), then the marker removed."""
        found = existing_sizes(self.remote, sizes)
        for u, n in sizes.items():
            if found.get(u) != n:
                raise RemoteError("%s before committing: the upload is not complete, so the "
                                  "commit document %s was not written" % (
                                      "missing" if u not in found else "%d bytes, not %d"
                                      % (found[u], n), self.commit), u)
        self.remote.pipe(self.commit, dumps_meta(doc))
        self.remote.rm(self.marker)


def check_bucket(remote: "Remote", output: str) -> None:
    """Before any conversion: the bucket (the URI's first component) must exist (one HEAD;
    a :class:`RemoteNotFoundError` naming the bucket otherwise)."""
    scheme, _, rest = output.partition("://")
    bucket = rest.split("/", 1)[0]
    try:
        remote.info("%s://%s" % (scheme, bucket))
    except RemoteNotFoundError:
        raise RemoteNotFoundError("bucket %r does not exist (or these credentials cannot see "
                                  "it): create it first; nothing was converted" % bucket,
                                  output) from None


def probe_writable(remote: "Remote", output: str) -> None:
    """Before any conversion: a uniquely named empty object under the output's folder is
    written and deleted, so missing write or delete permissions show now, not after the
    conversion (the :class:`RemoteError` of the failed call, naming the probe)."""
    name = ".%s.gluon-data-probe-%s" % (posixpath.basename(output), uuid.uuid4().hex[:12])
    target = sibling_uri(output, name)
    try:
        remote.pipe(target, b"")
        remote.rm(target)
    except RemoteError as e:
        raise type(e)("cannot write and delete under %s (%s); nothing was converted"
                      % (output, e.reason), target) from None
