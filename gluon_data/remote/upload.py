"""Uploads: a local dataset, or each shard where it is written, then the commit document."""
from __future__ import annotations

import hashlib
import json
import os
import posixpath
import shutil
import time
from typing import Dict, List, Optional, Sequence, Tuple


from .. import codec
from ..documents import load_document
from ..errors import ConversionError, FormatError, OutputError, RemoteError, RemoteNotFoundError
from ..fsutil import sha256_file
from ..lmdbio import LMDBFile, read_lmdb_meta
from ..meta import dumps_meta, meta_path
from ..recordio import idx_path_for
from ..shards import (MANIFEST_FORMAT, _load_manifest, _shard_files, manifest_path, prefix_of,
                      read_manifest)
from ..verify import verify
from .layout import LMDB_COMMIT, LMDB_DATA, LMDB_FORMAT, LMDB_MARKER, UPLOAD_MARKER, _join
from .fs import _Remote
from .objects import _default_cache_dir


# --------------------------------------------------------------------------- writing
RECEIPT_SUFFIX = ".upload.json"   # PREFIX-SSSSS-of-NNNNN.upload.json: a shard's upload receipt


def _commit_names(uri: str) -> Tuple[str, str]:
    """``(commit document, upload marker)`` URIs of the dataset at ``uri`` (a ``.rec``, an
    ``.lmdb`` environment or a ``.shards.json`` manifest), as FORMAT.md section 8 names them."""
    uri = uri.rstrip("/")
    if uri.endswith(".lmdb"):
        return uri + "/" + LMDB_COMMIT, uri + "/" + LMDB_MARKER
    if uri.endswith(".shards.json"):
        return uri, uri[:-len(".shards.json")] + UPLOAD_MARKER
    return meta_path(uri), os.path.splitext(uri)[0] + UPLOAD_MARKER


def _lmdb_commit(local: str, files: Dict[str, dict]) -> dict:
    """The commit document of a local LMDB environment uploaded to object storage."""
    return {"format": LMDB_FORMAT, "format_version": 1, "container": "lmdb",
            "splits": read_lmdb_meta(local), "files": files}


def _upload_plan(local: str, uri: str):
    """``(commit uri, commit document, [(local file, uri)], marker uri)`` of one local
    dataset: a ``.rec`` (committed by its metadata), an ``.lmdb`` environment (its
    ``data.mdb``, committed by ``NAME.lmdb/meta.json``) or a ``.shards.json`` (by the
    manifest; its shards' files are data)."""
    if local.rstrip("/").endswith(".lmdb"):
        local = local.rstrip("/")
        target = _join(uri, os.path.basename(local))
        data = os.path.join(local, LMDB_DATA)
        commit, marker = _commit_names(target)
        doc = _lmdb_commit(local, {LMDB_DATA: {"bytes": os.path.getsize(data),
                                               "sha256": sha256_file(data)}})
        return commit, doc, [(data, target + "/" + LMDB_DATA)], marker
    if local.endswith(".shards.json"):
        doc = read_manifest(local)
        folder = os.path.dirname(local)
        pairs, files = [], {}
        for sh in doc["shards"]:
            rec = os.path.join(folder, sh["name"])
            if not os.path.isfile(rec):
                raise ValueError("%s: only RecordIO shards can be uploaded (%s)"
                                 % (local, sh["name"]))
            pairs += [(p, _join(uri, os.path.basename(p)))
                      for p in (rec, idx_path_for(rec), meta_path(rec))]
            files[sh["name"]] = {"bytes": os.path.getsize(rec), "sha256": sha256_file(rec)}
        doc["files"] = files
        commit = _join(uri, os.path.basename(local))
        return commit, doc, pairs, commit[:-len(".shards.json")] + UPLOAD_MARKER
    rec_uri = _join(uri, os.path.basename(local))
    pairs = [(local, rec_uri), (idx_path_for(local), idx_path_for(rec_uri))]
    doc = load_document(meta_path(local), "meta")
    doc["files"] = {posixpath.basename(t): {"bytes": os.path.getsize(p),
                                            "sha256": sha256_file(p)} for p, t in pairs}
    return meta_path(rec_uri), doc, pairs, os.path.splitext(rec_uri)[0] + UPLOAD_MARKER


_NOT_OURS = ("exists and is not a dataset written by gluon-data (no gluon-data metadata %s "
             "beside it, nor an interrupted upload of ours); --overwrite only replaces "
             "gluon-data's own outputs, so it was left untouched: remove it or choose another "
             "output name")


def _remote_is_ours(remote: "_Remote", commit: str, marker: str) -> bool:
    """Whether the objects under a dataset's names are recognisably gluon_data's output, the
    remote form of :func:`gluon_data.fsutil.is_ours`: its commit document (metadata or
    manifest) says ``"format": "gluon_data"`` (``"gluon_data-shards"``), or an upload marker
    of ours says an upload of ours was interrupted. Only content is trusted, never a name."""
    for uri, key, wanted in ((commit, "format", ("gluon_data", MANIFEST_FORMAT, LMDB_FORMAT)),
                             (marker, "writer", ("gluon_data",))):
        try:
            if int(remote.info(uri)["size"]) > 64 << 20:  # no metadata is that large
                continue
            doc = json.loads(remote.cat(uri).decode("utf-8"))
        except (RemoteNotFoundError, UnicodeDecodeError, ValueError):
            continue
        if isinstance(doc, dict) and doc.get(key) in wanted:
            return True
    return False


def upload_dataset(local: Sequence[str], uri: str, *,
                   storage_options: Optional[dict] = None, overwrite: bool = False,
                   resume: bool = False, journal: Optional[str] = None,
                   retries: Optional[int] = None) -> Dict[str, str]:
    """Upload local datasets beside ``uri``: ``.rec`` files (with their ``.idx`` and
    metadata) or ``.shards.json`` manifests (with every shard's files). Returns
    ``{local path: its URI}`` (the ``.rec``, or the manifest).

    Order: ``PREFIX.uploading.json`` markers; the old commit documents (metadata, manifest)
    removed; every data object; every commit document -- the metadata with a ``files`` entry
    recording the size and SHA-256 of its ``.rec`` and ``.idx``, the manifest with one
    recording each shard's ``.rec`` (what readers verify downloads against); then the
    markers removed. A reader therefore sees either no dataset (while the marker exists, an
    error saying an upload is in progress) or a complete one. With ``resume``, objects the
    ``journal`` (a local JSON file) lists as uploaded with the same SHA-256 and found with
    the same size are not sent again, and an identical complete dataset is left alone.

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
    remote = _Remote(storage_options, retries)
    done: Dict[str, str] = {}
    if resume and journal and os.path.exists(journal):
        done = load_document(journal, "journal")
    local = list(dict.fromkeys(os.fspath(p) for p in local))  # (an LMDB's splits: one path)
    plan = [(p,) + _upload_plan(p, uri) for p in local]
    shas = {t: sha256_file(p) for _, _, _, pairs, _ in plan for p, t in pairs}
    same = set()
    if resume:  # a complete earlier upload identical to this one is left alone
        for _, commit, doc, _, _ in plan:
            try:
                if remote.cat(commit) == dumps_meta(doc):
                    same.add(commit)
            except RemoteNotFoundError:
                pass
    result = {p: (commit if p.endswith(".shards.json") else
                  pairs[0][1][:-len("/data.mdb")] if p.rstrip("/").endswith(".lmdb")
                  else pairs[0][1]) for p, commit, _, pairs, _ in plan}
    if len(same) == len(plan):
        return result
    for _, commit, _, pairs, marker in plan:  # refuse before anything is changed
        ours = None
        for target in [t for _, t in pairs] + [commit]:
            if (resume and target in done) or not remote.exists(target):
                continue
            if not overwrite:
                raise FileExistsError("%s already exists; pass overwrite=True (CLI: "
                                      "--overwrite) to replace it" % target)
            if ours is None:
                ours = _remote_is_ours(remote, commit, marker)
            if not ours:
                raise OutputError(_NOT_OURS % commit.rsplit("/", 1)[-1], target)
    markers = [m for _, _, _, _, m in plan]
    for m in markers:
        remote.pipe(m, json.dumps({"writer": "gluon_data", "started": time.time()}).encode())
    for _, commit, _, _, _ in plan:
        if commit not in same:
            remote.rm(commit)  # no commit document may describe the objects replaced next

    def record(target, sha):
        done[target] = sha
        if journal:
            tmp = journal + ".partial"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(done, f)
            os.replace(tmp, journal)

    for _, commit, _, pairs, _ in plan:
        if commit in same:
            continue
        for path, target in pairs:
            if done.get(target) == shas[target]:
                try:
                    if int(remote.info(target)["size"]) == os.path.getsize(path):
                        continue
                except RemoteNotFoundError:
                    pass
            remote.put_file(path, target)
            record(target, shas[target])
    for _, commit, doc, _, _ in plan:  # the commit documents, last
        if commit not in same:
            remote.pipe(commit, dumps_meta(doc))
            record(commit, "commit")
    for m in markers:
        remote.rm(m)
    return result


class ShardUploader:
    """Where the shard tasks of a sharded conversion into object storage put their shards
    (the ``sink`` of :func:`gluon_data.shards.convert_sharded`). Picklable: it travels with
    every task to the process or Dask worker that runs it, with the storage options
    (credentials stay in memory; nothing of them is written to any object).

    Each task (:meth:`write_shard`) writes its shard into a staging folder local to the machine
    running it, verifies it, uploads its objects, then its receipt
    (``PREFIX-SSSSS-of-NNNNN.upload.json``: the plan digest, each object's size and SHA-256,
    the manifest entry), deletes the staged copy and returns the manifest entry. A shard whose
    receipt carries the shard's plan digest (``job.digest``: its items' names and each file's
    size and mtime, see :mod:`gluon_data.plan`) and whose objects have the recorded sizes is
    kept (a rerun with ``resume``, or Dask retrying a task that died after uploading); a shard
    of a source file changed since is written and uploaded again. The client
    calls :meth:`prepare` before any task (refusals, the upload marker, old commit documents
    removed) and :meth:`finish` after all (the manifests, last; the markers removed).

    Parameters
    ----------
    uri : str
        The output URI the conversion was given (its folder receives the shards).
    remote : _Remote
        Storage options and retry policy.
    staging : str, optional
        Folder for the staged shards; default ``staging/shards/<hash of uri>`` under the
        cache directory of the machine running the task (``$GLUON_DATA_CACHE_DIR`` there,
        else ``~/.cache/gluon_data``).
    overwrite, resume : bool
        As for :func:`convert_to_uri`.

    Examples
    --------
    >>> sink = ShardUploader("s3://bucket/voc.rec", _Remote())
    >>> sink.shard_uri("voc-00000-of-00002.rec")
    's3://bucket/voc-00000-of-00002.rec'
    """

    def __init__(self, uri: str, remote: "_Remote", staging: Optional[str] = None,
                 overwrite: bool = False, resume: bool = False):
        self.uri, self.remote, self.staging = uri, remote, staging
        self.overwrite, self.resume = overwrite, resume
        self.complete: set = set()  # (client) manifests already uploaded for this plan

    def shard_uri(self, name: str) -> str:
        return _join(self.uri, name)

    def receipt_uri(self, name: str) -> str:
        return self.shard_uri(prefix_of(name) + RECEIPT_SUFFIX)

    def _stage_root(self) -> str:
        root = self.staging or os.path.join(_default_cache_dir(), "staging", "shards")
        return os.path.join(os.path.abspath(root),
                            hashlib.sha256(self.uri.encode("utf-8")).hexdigest()[:24])

    # -- client side -----------------------------------------------------------------------
    def _objects(self, job) -> List[str]:
        """URIs of the objects of ``job``'s shard and its receipt."""
        name = os.path.basename(job.path)
        if job.container == "lmdb":
            names = [name + "/data.mdb"]
        else:
            names = [name, idx_path_for(name), meta_path(name)]
        return [self.shard_uri(n) for n in names] + [self.receipt_uri(name)]

    def prepare(self, plans: List[dict], container: str) -> None:
        """Before any task: refuse what may not be replaced (nothing is changed then), put
        each split's upload marker, remove the old manifests and, unless ``resume``, the old
        receipts (so only this run's uploads are kept by a retried task)."""
        remote, todo = self.remote, []
        for p in plans:
            manifest = self.shard_uri(os.path.basename(manifest_path(p["prefix"])))
            commit, marker = _commit_names(manifest)
            if self.resume and self._same_plan(manifest, p["digest"]):
                self.complete.add(manifest)  # complete already: the tasks find every receipt
                continue
            targets = [u for j in p["jobs"] for u in self._objects(j)] + [commit]
            present = self._present(targets)
            ours = None
            for target in targets:
                if target not in present:
                    continue
                if ours is None:
                    ours = _remote_is_ours(remote, commit, marker)
                if self.resume and ours:
                    break  # an interrupted upload of ours: the receipts say what is done
                if not self.overwrite:
                    raise FileExistsError("%s already exists; pass overwrite=True (CLI: "
                                          "--overwrite) to replace it" % target)
                if not ours:
                    raise OutputError(_NOT_OURS % commit.rsplit("/", 1)[-1], target)
            todo.append((p, commit, marker, present))
        for p, commit, marker, present in todo:
            remote.pipe(marker, json.dumps({"writer": "gluon_data",
                                            "started": time.time()}).encode())
            remote.rm(commit)  # no manifest may describe the shards replaced next
            if not self.resume:
                for j in p["jobs"]:
                    receipt = self.receipt_uri(os.path.basename(j.path))
                    if receipt in present:
                        remote.rm(receipt)

    def _same_plan(self, manifest: str, digest: str) -> bool:
        try:
            doc = _load_manifest(manifest, self.remote.cat(manifest))[0]
        except (RemoteNotFoundError, FormatError):
            return False  # none, or not one whole: this run writes it
        return (doc.get("plan") or {}).get("digest") == digest

    def _present(self, uris: List[str]) -> set:
        """Which of ``uris`` exist: one listing per folder (not one request per object)."""
        found = set()
        for folder in sorted({u.rsplit("/", 1)[0] for u in uris}):
            try:
                names = self.remote.call(folder, "list", lambda fs, p, kw: fs.ls(
                    p, detail=False, refresh=True, **kw))
            except RemoteNotFoundError:
                continue
            found.update(n.rstrip("/").rsplit("/", 1)[-1] for n in names)
        return {u for u in uris if u.rsplit("/", 1)[-1] in found}

    def finish(self, report) -> Dict[str, str]:
        """After every task: each split's manifest (the local one, plus ``files``: size and
        SHA-256 of each shard's data object) uploaded last, then the markers removed.
        Returns ``{split: manifest URI}``."""
        out = {}
        for split, local in sorted(report.outputs.items()):
            uri = self.shard_uri(os.path.basename(local))
            commit, marker = _commit_names(uri)
            doc = read_manifest(local)
            files = {}
            for e in report.shards:
                if e["split"] == split:
                    data = e["name"] + "/data.mdb" if doc["container"] == "lmdb" else e["name"]
                    files[data] = e["files"][data]
            doc["files"] = files
            out[split] = uri
            if uri in self.complete and self.remote.cat(commit) == dumps_meta(doc):
                continue  # resumed a complete upload of this plan: nothing to send
            self.remote.pipe(commit, dumps_meta(doc))
            self.remote.rm(marker)
        return out

    # -- task side -------------------------------------------------------------------------
    def _uploaded(self, job) -> Optional[dict]:
        """The manifest entry of ``job``'s shard if its receipt carries this shard's digest
        (same items, same sizes and mtimes) and its objects have the sizes the receipt
        records; else ``None``."""
        name = os.path.basename(job.path)
        uri = self.receipt_uri(name)
        try:
            doc = load_document(self.remote.cat(uri), "receipt", uri)
        except (RemoteNotFoundError, FormatError):
            return None  # none, or damaged: the shard is written and uploaded again
        want = {"index": job.index, "count": job.count, "plan_digest": job.digest}
        if doc["shard"] != want or not doc["files"]:
            return None
        for rel, f in doc["files"].items():
            try:
                if int(self.remote.info(self.shard_uri(rel))["size"]) != f["bytes"]:
                    return None
            except RemoteNotFoundError:
                return None
        return dict(doc["entry"], files=doc["files"], reused=True)

    def write_shard(self, job) -> dict:
        """Task: write, verify and upload shard ``job.index`` (or find it uploaded); return
        its manifest entry with ``files``."""
        import dataclasses

        from ..convert.sharded import write_shard  # the converter: only when converting
        done = self._uploaded(job)
        if done is not None:
            return done
        t0 = time.perf_counter()
        name = os.path.basename(job.path)
        folder = os.path.join(self._stage_root(), name + ".d")  # this shard's alone
        os.makedirs(folder, exist_ok=True)
        try:
            local = os.path.join(folder, name)
            summary = write_shard(dataclasses.replace(job, path=local))
            _verify_shard(local, job)
            files = {}
            for path in _shard_files(local, job.container):
                rel = os.path.relpath(path, folder).replace(os.sep, "/")
                files[rel] = {"bytes": os.path.getsize(path), "sha256": sha256_file(path)}
            for rel, f in files.items():
                target = self.shard_uri(rel)
                self.remote.put_file(os.path.join(folder, rel), target)
                size = int(self.remote.info(target)["size"])
                if size != f["bytes"]:
                    raise RemoteError("uploaded %d bytes but the object has %d: the storage "
                                      "did not keep the upload whole" % (f["bytes"], size),
                                      target)
            entry = {k: summary[k] for k in ("name", "records", "bytes", "idx_sha256",
                                             "meta_sha256", "meta")}
            receipt = {"writer": "gluon_data", "format_version": 1,
                       "shard": {"index": job.index, "count": job.count,
                                 "plan_digest": job.digest},
                       "files": files, "entry": entry}
            self.remote.pipe(self.receipt_uri(name), dumps_meta(receipt))
        finally:
            shutil.rmtree(folder, ignore_errors=True)  # the staged copy, uploaded or not
        return dict(entry, files=files, reused=False, seconds=time.perf_counter() - t0)


def _verify_shard(local: str, job) -> None:
    """Check a freshly written shard before it is uploaded: every record's framing and CRC
    (RecordIO: :func:`gluon_data.verify.verify`; LMDB: read back in this process, since
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
