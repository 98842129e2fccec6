"""``gluon-data verify``: check a dataset end to end and name every bad record.

Checks, in order: metadata (version, task), the index against the data (offsets, duplicates,
an index shorter than the data), the ``.idx.gdx`` beside it (damaged or stale: readers ignore
it), the record count against the metadata, every record's framing
and CRC-32, and with ``deep`` the decoding of every image and mask and the mask ids against the
declared classes. LMDB datasets are scanned in a child process: LMDB trusts its B-tree pages,
and a damaged page can crash the reading process, which must not be the caller.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, List, Optional, Tuple, cast


from .._callable import callable_module
from ..errors import GluonDataError
from ..storage.fileio import require_regular
from ..stores.check import VerifyReport, check_local, check_records
from ..stores.shards import (is_manifest, read_manifest, shard_mismatch,
                             shard_summary)
from ..stores.base import is_uri, open_store, refuse_part

__all__ = ["verify", "verify_sharded", "VerifyReport", "register_verifier"]

#: ``(predicate, verifier)`` pairs registered by code built on gluon_data (checked first).
_VERIFIERS: List[Tuple[Callable[[str], bool], Callable[..., VerifyReport]]] = []


def register_verifier(predicate: Callable[[str], bool],
                      verifier: Callable[..., VerifyReport]) -> None:
    """Make :func:`verify` hand local paths for which ``predicate(path)`` is true to
    ``verifier(path, deep=deep)``: a dataset kind of your own, checked by your code."""
    _VERIFIERS.append((predicate, verifier))


def _verify_uri(path: str, deep: bool, remote: Optional[dict],
                split: Optional[str] = None) -> VerifyReport:
    """A dataset in object storage, as the store serves it now: ranged reads of every record
    (``deep``: the whole files downloaded into the local cache, verified against the
    recorded SHA-256). An LMDB is downloaded whole (its metadata is inside) and that copy
    checked as a local one, problems named by the URI. Every object is read from the remote
    again (``fresh``), whatever the cache holds: a good cached copy never hides a damaged
    object."""
    report = VerifyReport(path, deep=deep)
    try:
        store = open_store(path, reads="cache" if deep else "ranged", fresh=True,
                           **(remote or {}))
        if getattr(store, "splits", None) is None:  # (remote record stores have check_tail;
            cast(Any, store).check_tail()  # the RecordStore protocol does not declare it)
    except (GluonDataError, OSError) as e:
        return report.refused(e, path)
    if getattr(store, "splits", None) is not None:  # a remote LMDB (RemoteLMDBStore)
        try:
            local, pin = cast(Any, store).fetch(pin=True)  # RemoteLMDBStore's own method
        except (GluonDataError, OSError) as e:  # the object as served now is not the dataset
            return report.refused(e, path)
        try:
            folder = os.path.dirname(local)
            report = verify(folder, deep=deep, split=split)
        finally:
            pin.release()
        report.path = path
        for p in report.problems:
            p["where"] = p["where"].replace(folder, path) if p["where"] else path
        return report
    report.records = len(store)
    check_records(store, store.meta, report, deep, path)
    return report


def verify(path: str, deep: bool = False, split: Optional[str] = None,
           isolate: bool = True, remote: Optional[dict] = None) -> VerifyReport:
    """Check a ``.rec``, ``.lmdb`` or sharded (``.shards.json``) dataset, local or at a
    URI; return a :class:`VerifyReport` (shards: see :func:`gluon_data.tools.verify.verify_sharded`).

    A FIFO, a device or a socket (or a link to one) given as the dataset, or beside a
    ``.rec`` as its ``.idx`` or ``.meta.json``, raises :class:`~gluon_data.errors.FormatError`
    naming it (nothing is opened): it is not a dataset to report on; so does a file of a
    dataset named instead of the dataset (its ``.idx``, its metadata, an LMDB's ``data.mdb``:
    :func:`~gluon_data.stores.base.dataset_part`), saying which path to give.

    Parameters
    ----------
    path : str
    deep : bool
        Also decode every image and mask and check mask ids against the classes.
    split : str, optional
        LMDB: check only this split.
    isolate : bool
        LMDB: scan in a child process, so a crash of LMDB on a damaged page is reported.
    remote : dict, optional
        For a URI: :class:`gluon_data.stores.remote.stores.RemoteStore` options (``storage_options``...).
    """
    path = os.fspath(path)
    if is_uri(path):
        return _verify_uri(path, deep, remote, split)
    # The input-kind rule, before anything is opened: a FIFO, device or socket (or a link to
    # one) where the dataset or a file of it should be is not a damaged dataset to report
    # on, it is refused (FormatError naming it), as by every command.
    require_regular(path, directory=True)
    refuse_part(path)  # an index, metadata or data.mdb named instead: which path to give
    for predicate, verifier in _VERIFIERS:
        if predicate(path):
            return verifier(path, deep=deep)
    if is_manifest(path):
        return verify_sharded(path, deep=deep)
    return check_local(path, deep, split, isolate)


def verify_sharded(path: str, deep: bool = False, workers: int = 4):
    """Check the manifest against every shard (existence, counts, sizes, checksums), then
    every shard with :func:`gluon_data.tools.verify.verify` (in parallel threads); one report."""
    report = VerifyReport(path, deep=deep)
    try:
        doc = read_manifest(path)
    except (GluonDataError, OSError) as e:
        return report.refused(e, path)
    folder = os.path.dirname(os.path.abspath(path))
    container, split = doc["container"], doc.get("split") or "train"
    n = len(doc["shards"])
    todo = []
    for s, entry in enumerate(doc["shards"]):
        spath = os.path.join(folder, entry["name"])
        where = "shard %d of %d (%s)" % (s, n, spath)
        try:  # missing (or a link to nothing), or not a file: a FIFO, a link that loops
            missing = require_regular(spath, directory=True) is None
        except GluonDataError as e:
            report.add(e, where)
            continue
        if missing:
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


callable_module(__name__)  # from gluon_data import verify: the function, even once the module is loaded
