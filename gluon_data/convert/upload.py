"""Uploads: a local dataset, or each shard where it is written, then the commit document."""
from __future__ import annotations

import dataclasses
import hashlib
import os
import posixpath
import shutil
import time
import warnings
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Tuple, cast

from ..format import codec
from ..format.documents import load_document
from ..errors import ConversionError, FormatError, RemoteNotFoundError
from ..storage.fsutil import sha256_file
from ..stores.lmdbio import LMDBFile, read_lmdb_meta
from ..format.meta import dumps_meta, meta_path
from ..stores.recordio import idx_path_for
from ..stores.shards import load_manifest, prefix_of, read_manifest, shard_files
from ..tools.verify import verify
from ..stores.remote.commit import (Commit, existing_objects, existing_sizes, object_look,
                                    put_object)
from ..format.layout import LMDB_DATA, LMDB_FORMAT, MANIFEST_SUFFIX, sibling_uri
from ..storage.remotefs import Remote
from ..storage.cache import Cache
from ..storage.objects import staging_key
from ..storage.staging import Staging
from .done import Done, is_done, read_record, read_records, records_doc, shard_unit, write_record

if TYPE_CHECKING:  # annotations only: the planning modules are not a task's imports
    from .shard_plan import SplitPlan


# --------------------------------------------------------------------------- writing
RECEIPT_SUFFIX = ".upload.json"   # PREFIX-SSSSS-of-NNNNN.upload.json: a shard's upload receipt


def _lmdb_commit(local: str, files: Dict[str, dict]) -> dict:
    """The commit document of a local LMDB environment uploaded to object storage."""
    return {"format": LMDB_FORMAT, "format_version": 1, "container": "lmdb",
            "splits": read_lmdb_meta(local), "files": files}


def _file(path: str, sha: str) -> dict:
    return {"bytes": os.path.getsize(path), "sha256": sha}


def _upload_plan(local: str, uri: str):
    """``(dataset uri, commit document, [(local file, uri, SHA-256)])`` of one local
    dataset: a ``.rec`` (committed by its metadata), an ``.lmdb`` environment (its
    ``data.mdb``, committed by ``NAME.lmdb/meta.json``) or a ``.shards.json`` (by the
    manifest; its shards' files are data)."""
    if local.rstrip("/").endswith(".lmdb"):
        local = local.rstrip("/")
        target = sibling_uri(uri, os.path.basename(local))
        data = os.path.join(local, LMDB_DATA)
        sha = sha256_file(data)
        doc = _lmdb_commit(local, {LMDB_DATA: _file(data, sha)})
        return target, doc, [(data, target + "/" + LMDB_DATA, sha)]
    if local.endswith(MANIFEST_SUFFIX):
        doc = read_manifest(local)
        folder = os.path.dirname(local)
        triples, files = [], {}
        for sh in doc["shards"]:
            rec = os.path.join(folder, sh["name"])
            if not os.path.isfile(rec):
                raise ValueError("%s: only RecordIO shards can be uploaded (%s)"
                                 % (local, sh["name"]))
            triples += [(p, sibling_uri(uri, os.path.basename(p)), sha256_file(p))
                        for p in (rec, idx_path_for(rec), meta_path(rec))]
            files[sh["name"]] = _file(rec, triples[-3][2])
        doc["files"] = files
        return sibling_uri(uri, os.path.basename(local)), doc, triples
    rec_uri = sibling_uri(uri, os.path.basename(local))
    triples = [(p, t, sha256_file(p)) for p, t in ((local, rec_uri),
                                                   (idx_path_for(local), idx_path_for(rec_uri)))]
    doc = load_document(meta_path(local), "meta")
    doc["files"] = {posixpath.basename(t): _file(p, sha) for p, t, sha in triples}
    return rec_uri, doc, triples


def upload_dataset(local: Sequence[str], uri: str, *,
                   storage_options: Optional[dict] = None, overwrite: bool = False,
                   resume: bool = False, journal: Optional[str] = None,
                   retries: Optional[int] = None,
                   kept: Optional[List[str]] = None) -> Dict[str, str]:
    """Upload local datasets beside ``uri``: ``.rec`` files (with their ``.idx`` and
    metadata), ``.lmdb`` environments (their ``data.mdb``) or ``.shards.json`` manifests
    (with every shard's files). Returns ``{local path: its URI}`` (the ``.rec``, the
    ``.lmdb`` or the manifest).

    Each dataset goes up by the one protocol of :class:`~gluon_data.stores.remote.commit.Commit`:
    refusals first (nothing is changed then); its upload marker, its old commit document
    removed; every data object; its commit document -- the metadata with a ``files`` entry
    recording the size and SHA-256 of its ``.rec`` and ``.idx``, the LMDB commit document,
    the manifest with one per shard's ``.rec`` (what readers verify downloads against) --
    written only once every object is there; then the marker removed. A reader sees either
    no dataset (while the marker exists, an error saying an upload is in progress) or a
    complete one. With ``resume``, objects the ``journal`` (a local JSON file of done records,
    :mod:`gluon_data.convert.done`: each object's URI done under the SHA-256 of what was
    uploaded, with its size and the ETag the store reported) records as uploaded with the
    same SHA-256 are not sent again while the one rule of "done" finds them unchanged (same
    size and ETag), and an identical complete dataset (every object there with the size and
    SHA-256 its commit document records, each read once to tell) is left alone. A journal of
    the previous release (``{uri: SHA-256}``) is read the same way (each object read once to
    compare its SHA-256); one that cannot be read raises :class:`~gluon_data.errors.ConversionError`
    naming it (restart without ``resume``). ``kept``: a list the local paths of the datasets
    found complete that way are appended to.

    Raises
    ------
    FileExistsError
        An output object exists and neither ``overwrite`` nor a resumable upload of ours
        (``resume`` with the journal naming it) allows replacing it.
    OutputError
        With ``overwrite``: an output object exists that is not recognisably ours (no metadata
        or manifest of ours under the output name, nor an interrupted upload of ours); nothing
        was changed.
    """
    remote = Remote(storage_options, retries)
    done: Dict[str, Done] = {}
    if resume and journal and os.path.exists(journal):
        done = read_records(journal, _legacy_journal, "journal", what="upload journal")
    local = list(dict.fromkeys(os.fspath(p) for p in local))  # (an LMDB's splits: one path)
    plan = []  # (local path, its Commit, commit document, {object uri: (file, SHA-256)})
    for p in local:
        u, doc, triples = _upload_plan(p, uri)
        plan.append((p, Commit(remote, u), doc, {t: (f, sha) for f, t, sha in triples}))
    todo = []  # (Commit, document, objects, whether the commit found is this upload's)
    for _, c, doc, objects in plan:
        found = c.committed() if resume else None
        ours = found is not None and found == dumps_meta(doc)
        if not (ours and _complete(remote, c, cast(bytes, found), objects)):  # ours: found
            todo.append((c, doc, objects, ours))
    if kept is not None:
        sent = {id(c) for c, _, _, _ in todo}
        kept.extend(p for p, c, _, _ in plan if id(c) not in sent)
    for c, _, objects, ours in todo:  # refuse before anything is changed
        def resumed(target: str, ours: bool = ours) -> bool:
            return resume and (ours or target in done)
        c.refuse(existing_sizes(remote, list(objects) + [c.commit]), overwrite, resumed)
    for c, _, _, _ in todo:
        c.begin()
    for c, doc, objects, _ in todo:
        look = object_look(remote, str, existing_objects(remote, [t for t in objects
                                                                  if t in done]))
        for target, (path, sha) in objects.items():
            if not is_done(done.get(target), target, sha, look):  # the one rule
                _record(journal, done, target, sha, put_object(remote, path, target))
        c.end(doc, _sizes(objects))
        blob = dumps_meta(doc)
        _record(journal, done, c.commit, hashlib.sha256(blob).hexdigest(),
                {"bytes": len(blob)})
    return {p: c.uri for p, c, _, _ in plan}


def _sizes(objects: Dict[str, Tuple[str, str]]) -> Dict[str, int]:
    return {t: os.path.getsize(f) for t, (f, _) in objects.items()}


def _complete(remote: Remote, c: Commit, blob: bytes,
              objects: Dict[str, Tuple[str, str]]) -> bool:
    """Whether the earlier upload committed by ``blob`` (this upload's commit document) is
    complete, by the one rule of "done": every object it describes has the size and SHA-256
    of the local file (each read once to tell)."""
    digest = hashlib.sha256(blob).hexdigest()
    record = Done(c.uri, digest, {t: {"bytes": os.path.getsize(f), "sha256": sha}
                                  for t, (f, sha) in objects.items()})
    look = object_look(remote, str, existing_objects(remote, list(objects)))
    if not is_done(record, c.uri, digest, look):
        return False
    c.settle()
    return True


def _record(journal: Optional[str], done: Dict[str, Done], target: str, sha: str,
            facts: dict) -> None:
    """Record in the upload journal that ``target`` is done under ``sha`` (the SHA-256 of
    what was uploaded), with what the store reported of it (``facts``: its size, and its
    ETag where it reports one)."""
    done[target] = Done(target, sha, {target: dict(facts, sha256=sha)})
    if journal:
        write_record(journal, records_doc(done))


def _legacy_journal(doc: Dict[str, str]) -> Dict[str, Done]:
    """A journal of the previous release (``{uri: SHA-256}``, checked as kind ``journal``):
    the same records, without sizes or ETags (each object found is read once to compare
    its SHA-256)."""
    return {t: Done(t, sha, {t: {"sha256": sha}}) for t, sha in doc.items()}


class ShardUploader:
    """Where the shard tasks of a sharded conversion into object storage put their shards
    (the ``sink`` of :func:`gluon_data.convert.sharded.convert_sharded`). Picklable: it travels with
    every task to the process or Dask worker that runs it, with the storage options
    (credentials stay in memory; nothing of them is written to any object).

    Each task (:meth:`write_shard`) writes its shard into a staging folder local to the machine
    running it, verifies it, uploads its objects, then its receipt
    (``PREFIX-SSSSS-of-NNNNN.upload.json``: the plan digest, each object's size, SHA-256 and
    ETag, the manifest entry), deletes the staged copy and returns the manifest entry. A shard whose
    receipt carries the shard's plan digest (``job.digest``: its items' names and each file's
    stamp: size, mtime, inode and ctime, see :mod:`gluon_data.format.plan`) and whose objects
    have the recorded sizes and ETags (the one rule of "done", :mod:`gluon_data.convert.done`)
    is kept (a rerun with ``resume``, or Dask retrying a task that died after uploading); a
    shard of a source file changed since, or with an object rewritten in place, is written and
    uploaded again. Each split's manifest is
    uploaded by the one protocol of :class:`~gluon_data.stores.remote.commit.Commit`, the tasks
    putting its objects: the client calls :meth:`prepare` before any task (refusals, the
    upload marker, old commit documents removed) and :meth:`finish` after all (each
    manifest, once every shard object is there; the markers removed). The converter hands
    each task its shard writer (``write``: :func:`gluon_data.convert.sharded.write_shard`).

    Parameters
    ----------
    uri : str
        The output URI the conversion was given (its folder receives the shards).
    remote : Remote
        Storage options and retry policy.
    cache_dir : str, optional
        The cache whose staging area ``shards`` holds the staged shards
        (:meth:`~gluon_data.storage.cache.Cache.staging`, ``staging/shards/<hash of uri>/``),
        pinned while a task writes and uploads, counted toward that cache's ``cache_limit``;
        default the machine's own (``$GLUON_DATA_CACHE_DIR`` there, else
        ``~/.cache/gluon_data``).
    staging : str, optional
        Deprecated: the same as ``cache_dir`` (staged shards go through a cache's staging
        area, never into a folder of their own); it warns.
    overwrite, resume : bool
        As for :func:`convert_to_uri`.

    Examples
    --------
    >>> sink = ShardUploader("s3://bucket/voc.rec", Remote())
    >>> sink.shard_uri("voc-00000-of-00002.rec")
    's3://bucket/voc-00000-of-00002.rec'
    """

    def __init__(self, uri: str, remote: "Remote", staging: Optional[str] = None,
                 overwrite: bool = False, resume: bool = False,
                 cache_dir: Optional[str] = None):
        if staging is not None:
            if cache_dir is not None:
                raise ValueError("give cache_dir or staging (deprecated), not both")
            warnings.warn("ShardUploader(staging=...) is deprecated: pass cache_dir=...; the "
                          "shards are staged in that cache's staging area", DeprecationWarning,
                          stacklevel=2)
            cache_dir = staging
        self.uri, self.remote, self.cache_dir = uri, remote, cache_dir
        self.overwrite, self.resume = overwrite, resume
        self.complete: set = set()  # (client) manifests already uploaded for this plan

    def shard_uri(self, name: str) -> str:
        return sibling_uri(self.uri, name)

    def receipt_uri(self, name: str) -> str:
        return self.shard_uri(prefix_of(name) + RECEIPT_SUFFIX)

    def _stage_area(self) -> Tuple[str, Staging]:
        """``(folder for this upload's shards, the pinned staging area)``."""
        area = Cache(self.cache_dir).staging("shards")
        return os.path.join(area.path, staging_key(self.uri)), area

    # -- client side -----------------------------------------------------------------------
    def _objects(self, job) -> List[str]:
        """URIs of the objects of ``job``'s shard and its receipt."""
        name = os.path.basename(job.path)
        if job.container == "lmdb":
            names = [name + "/" + LMDB_DATA]
        else:
            names = [name, idx_path_for(name), meta_path(name)]
        return [self.shard_uri(n) for n in names] + [self.receipt_uri(name)]

    def _commit(self, p: SplitPlan) -> Commit:
        return Commit(self.remote, self.shard_uri(os.path.basename(p.manifest)))

    def prepare(self, plans: List[SplitPlan], container: str) -> None:
        """Before any task: refuse what may not be replaced (nothing is changed then), put
        each split's upload marker, remove the old manifests and, unless ``resume``, the old
        receipts (so only this run's uploads are kept by a retried task)."""
        todo = []
        for p in plans:
            c = self._commit(p)
            if self.resume and self._complete(p, c):
                self.complete.add(c.uri)  # complete already: the tasks find every receipt
                continue
            targets = [u for j in p.jobs for u in self._objects(j)] + [c.commit]
            present = existing_sizes(self.remote, targets)

            def resumed(target: str, c: Commit = c) -> bool:
                return self.resume and c.ours()
            c.refuse(present, self.overwrite, resumed)
            todo.append((p, c, present))
        for p, c, present in todo:
            c.begin()
            if not self.resume:
                for j in p.jobs:
                    receipt = self.receipt_uri(os.path.basename(j.path))
                    if receipt in present:
                        self.remote.rm(receipt)

    def _complete(self, p: SplitPlan, c: Commit) -> bool:
        """Whether an earlier upload of plan ``p`` is complete, by the one rule of "done": its
        manifest is committed with this plan's digest, and every shard is proved uploaded by
        its receipt (:meth:`_uploaded`: sizes and ETags)."""
        blob = c.committed()
        if blob is None:
            return False
        try:
            doc = load_manifest(c.commit, blob)[0]
        except FormatError:
            return False  # not one whole: this run writes it
        made = Done(c.uri, str((doc.get("plan") or {}).get("digest")))
        if not is_done(made, c.uri, p.digest) or \
                any(self._uploaded(j) is None for j in p.jobs):
            return False
        c.settle()
        return True

    def finish(self, report) -> Dict[str, str]:
        """After every task: each split's manifest (the local one, plus ``files``: size and
        SHA-256 of each shard's data object) uploaded last, then the markers removed.
        Returns ``{split: manifest URI}``."""
        out = {}
        for split, local in sorted(report.outputs.items()):
            c = Commit(self.remote, self.shard_uri(os.path.basename(local)))
            doc = read_manifest(local)
            entries = [e for e in report.shards if e["split"] == split]
            doc["files"] = {}
            for e in entries:  # each shard's data object
                data = e["name"] + "/" + LMDB_DATA if doc["container"] == "lmdb" else e["name"]
                doc["files"][data] = e["files"][data]
            out[split] = c.uri
            if c.uri in self.complete and self.remote.cat(c.commit) == dumps_meta(doc):
                continue  # resumed a complete upload of this plan: nothing to send
            c.end(doc, {self.shard_uri(n): f["bytes"] for e in entries
                        for n, f in e["files"].items()})
        return out

    # -- task side -------------------------------------------------------------------------
    def _uploaded(self, job) -> Optional[dict]:
        """The manifest entry of ``job``'s shard if its receipt's done record says the shard
        is done under its digest (same items, same file stamps) and its objects have the
        sizes and ETags the record gives (no ETag recorded: their SHA-256, each read once);
        else ``None``. A receipt that cannot be read raises
        :class:`ConversionError` naming it (:func:`~gluon_data.convert.done.read_record`)."""
        name = os.path.basename(job.path)
        uri = self.receipt_uri(name)
        try:
            blob = self.remote.cat(uri)
        except RemoteNotFoundError:
            return None  # not uploaded yet
        doc: dict = {}

        def legacy(d: dict) -> Done:  # the previous release's: no done record, same facts
            return Done(shard_unit(d["shard"]["index"], d["shard"]["count"]),
                        d["shard"]["plan_digest"], d["files"])

        record = read_record(blob, "receipt", uri, legacy=legacy, what="upload receipt",
                             keep=doc)
        found = existing_objects(self.remote, [self.shard_uri(rel) for rel in record.outputs])
        if not record.outputs or not is_done(record, shard_unit(job.index, job.count),
                                             job.digest,
                                             object_look(self.remote, self.shard_uri, found)):
            return None
        return dict(doc["entry"], files=doc["files"], reused=True)

    def write_shard(self, job, write: Callable[[object], dict]) -> dict:
        """Task: write shard ``job.index`` with ``write`` (the converter's shard writer, given
        the job with a staged path), verify and upload it (or find it uploaded); return its
        manifest entry with ``files``."""
        done = self._uploaded(job)
        if done is not None:
            return done
        t0 = time.perf_counter()
        name = os.path.basename(job.path)
        root, area = self._stage_area()
        folder = os.path.join(root, name + ".d")  # this shard's alone
        try:
            os.makedirs(folder, exist_ok=True)
            local = os.path.join(folder, name)
            summary = write(dataclasses.replace(job, path=local))
            _verify_shard(local, job)
            area.claim()  # the staged shard counted: entries not in use make room
            files = {}
            for path in shard_files(local, job.container):
                rel = os.path.relpath(path, folder).replace(os.sep, "/")
                files[rel] = {"bytes": os.path.getsize(path), "sha256": sha256_file(path)}
            stored = {rel: put_object(self.remote, os.path.join(folder, rel),
                                      self.shard_uri(rel)) for rel in files}
            entry = {k: summary[k] for k in ("name", "records", "bytes", "idx_sha256",
                                             "meta_sha256", "meta")}
            receipt = {"writer": "gluon_data", "format_version": 1,
                       "shard": {"index": job.index, "count": job.count,
                                 "plan_digest": job.digest},  # (the previous release's)
                       "files": files, "entry": entry,
                       "done": Done(shard_unit(job.index, job.count), job.digest,
                                    {rel: dict(stored[rel], **f)
                                     for rel, f in files.items()}).doc()}
            self.remote.pipe(self.receipt_uri(name), dumps_meta(receipt))
        finally:
            shutil.rmtree(folder, ignore_errors=True)  # the staged copy, uploaded or not
            area.release()
        return dict(entry, files=files, reused=False, seconds=time.perf_counter() - t0)


def _verify_shard(local: str, job) -> None:
    """Check a freshly written shard before it is uploaded: every record's framing and CRC
    (RecordIO: :func:`gluon_data.tools.verify.verify`; LMDB: read back in this process, since
    ``verify`` scans an LMDB in a child process, which a daemonic Dask worker cannot start,
    and this environment was just written by us)."""
    label = "shard %d of %d (%s)" % (job.index, job.count, os.path.basename(local))
    if job.container == "lmdb":
        f = LMDBFile(local, job.split)
        seg = f.meta["task"] == "segmentation"
        try:
            for i in range(len(f)):
                codec.unpack(f.read(i), segmentation=seg, verify=True, path=local,
                             key=f.key(i))
        finally:
            f.close()
        return
    report = verify(local)
    if not report.ok:
        raise ConversionError("%s failed verification before upload: %s"
                              % (label, report.problems[0]["reason"]), local)
