"""Integrity checks of one local dataset (a ``.rec`` with its index, or an LMDB): every
record's framing, checksum and id, its metadata and, with ``deep``, its decoded pixels.
:func:`gluon_data.verify` builds on them (URIs, shards); a remote store runs them on what it
downloads."""
from __future__ import annotations
import os
import pickle
from dataclasses import dataclass, field
from typing import List, Optional, cast
import numpy as np
from ..format import codec
from ..errors import GluonDataError
from ..storage.fileio import require_regular
from ..storage.fsutil import LMDB_DATA
from .lmdbio import names_lmdb
from ..format.meta import ids_are_keys, meta_path, read_meta, wrong_record
from .recordio import BINARY_INDEX_SUFFIX, RecordFile, binary_index_problem, idx_path_for
from .base import open_store, store_splits

__all__ = ["VerifyReport", "check_local", "check_records"]


@dataclass
class VerifyReport:
    """What :func:`verify` found. ``ok`` is True when nothing is wrong."""

    path: str
    records: int = 0
    checked: int = 0
    deep: bool = False
    problems: List[dict] = field(default_factory=list)  # {"where", "key", "offset", "reason"}
    #: False when the dataset could not be read (:meth:`refused`): nothing was counted or
    #: checked, and ``records`` is 0 for that reason, not because it is empty
    opened: bool = True

    @property
    def ok(self) -> bool:
        return not self.problems

    def refused(self, err: BaseException, where: Optional[str] = None) -> "VerifyReport":
        """Report ``err``, why the dataset could not be read (so none of it was checked);
        returns this report."""
        self.add(err, where)
        self.opened = False
        return self

    def add(self, err: BaseException, where: Optional[str] = None, key=None,
            offset=None) -> None:
        if isinstance(err, GluonDataError):
            self.problems.append({"where": err.path or where, "key": err.key if err.key
                                  is not None else key, "offset": err.offset if err.offset
                                  is not None else offset, "reason": err.reason})
        else:
            self.problems.append({"where": where, "key": key, "offset": offset,
                                  "reason": "%s: %s" % (type(err).__name__, err)})

    def __str__(self) -> str:
        counted = ("%d records, %d checked%s" % (self.records, self.checked,
                                                  " (deep: decoded)" if self.deep else "")
                   if self.opened else "could not be read, no record checked")
        head = "%s: %s: %s" % (self.path, counted,
                               "OK" if self.ok else "%d problem(s)" % len(self.problems))
        lines = [head]
        for p in self.problems[:200]:
            loc = ", ".join(x for x in (
                p["where"], None if p["key"] is None else "record %s" % p["key"],
                None if p["offset"] is None else "offset %d" % p["offset"]) if x)
            lines.append("  BAD %s: %s" % (loc, p["reason"]))
        if len(self.problems) > 200:
            lines.append("  ... %d more" % (len(self.problems) - 200))
        return "\n".join(lines)


def check_records(store, meta, report: VerifyReport, deep: bool, where: str,
                  container: str = "rec") -> None:
    """Check every record as the dataset readers would read it: framing, checksum, header id
    against the index key, and with ``deep`` the reader's own image and mask decoders."""
    seg = bool(meta) and meta.get("task") == "segmentation"
    check_ids = ids_are_keys(meta, container)
    checksummed = bool(meta) and meta.get("checksum") == "crc32-id2"
    ncls = meta.get("num_classes") if seg else None
    ignore = meta.get("ignore_label", 255) if seg else None
    for i in range(len(store)):
        key, off = store.key(i), store.offset(i)
        try:
            rec = codec.unpack(store.read(i), segmentation=seg, verify=True, path=where,
                               key=key, offset=off)
            if checksummed and rec.checksum is None:
                raise GluonDataError("checksum missing from a record of a checksummed dataset",
                                     where, key, off)
            if check_ids and rec.id != key:
                raise GluonDataError(wrong_record(rec.id, key), where, key, off)
            if deep:
                codec.decode_image(rec.image, 1, what="image")
                if seg and meta.get("masks", True) is not False:  # (False: images only)
                    # (a segmentation record has a mask: unpack raises without one)
                    mask = codec.decode_mask(cast(bytes, rec.mask), what="mask")
                    if ncls is not None:
                        ids = np.unique(mask)
                        bad = [int(x) for x in ids if x >= ncls and x != ignore]
                        if bad:
                            raise GluonDataError("mask ids %s outside the %d classes"
                                                 % (bad, ncls), where, key, off)
        except Exception as e:  # every problem is reported, the scan goes on
            report.add(e, where, key, off)
        report.checked += 1


def _verify_rec(path: str, deep: bool) -> VerifyReport:
    for p in (path, idx_path_for(path), meta_path(path)):  # the input-kind rule: raised
        require_regular(p)
    report = VerifyReport(path, deep=deep)
    try:
        meta = read_meta(path)
    except GluonDataError as e:
        report.add(e)
        meta = None
    try:
        store = RecordFile(path, expected_count=meta["num_records"] if meta else None)
    except (GluonDataError, OSError) as e:
        report.refused(e, path)
        reason = report.problems[-1]["reason"]
        if os.path.isfile(path) and "salvage" not in reason:  # salvage can index them again
            report.problems[-1]["reason"] = reason + " (gluon-data salvage can rebuild the index)"
        return report
    report.records = len(store)
    if meta is not None:
        try:
            store.check_order()
        except GluonDataError as e:
            report.add(e, path)
    _check_binary_index(store.idx_path, report)
    check_records(store, meta, report, deep, path)
    return report


def _check_binary_index(idx_path: str, report: VerifyReport) -> None:
    """A ``.idx.gdx`` that readers cannot use is a problem: they ignore it, silently, and
    parse the text at every open; say how to rebuild it."""
    why = binary_index_problem(idx_path)
    if why is not None:
        report.problems.append({
            "where": idx_path + BINARY_INDEX_SUFFIX, "key": None, "offset": None,
            "reason": "the binary index %s, so readers ignore it and parse the .idx at every "
                      "open; remove it (nothing needs it), then rebuild it from the .idx if "
                      "wanted: python -c \"from gluon_data.stores.recordio import write_binary_index; "
                      "write_binary_index('%s')\"" % (why, idx_path)})


def _verify_lmdb_here(path: str, deep: bool, split: Optional[str]) -> VerifyReport:
    report = VerifyReport(path, deep=deep)
    try:
        splits = store_splits(path)
    except GluonDataError as e:
        return report.refused(e, path)
    for s in ([split] if split else splits):
        try:
            store = open_store(path, s)
        except GluonDataError as e:
            report.add(e, path)
            continue
        report.records += len(store)
        check_records(store, store.meta, report, deep, "%s [split %s]" % (path, s), "lmdb")
    return report


def _verify_lmdb_isolated(path: str, deep: bool, split: Optional[str]):
    """``_verify_lmdb_here`` in a forked child: ``(its report or exception, or None if it
    died; the child's exit code)``. A bare ``fork`` rather than ``multiprocessing``, which
    refuses children to daemonic processes (a DataLoader worker downloading a dataset)."""
    r, w = os.pipe()
    try:
        pid = os.fork()
    except BaseException:
        os.close(r)
        os.close(w)
        raise
    if pid == 0:  # the child: report through the pipe, then leave without cleanup
        code = 0
        try:
            os.close(r)
            try:
                result: object = _verify_lmdb_here(path, deep, split)
            except BaseException as e:  # noqa: BLE001 - reported to the parent
                result = e
            try:
                data = pickle.dumps(result)
            except Exception:  # noqa: BLE001 - an exception that does not pickle
                data = pickle.dumps(GluonDataError("%s: %s" % (type(result).__name__, result),
                                                   path))
            with os.fdopen(w, "wb") as f:
                f.write(data)
        except BaseException:  # noqa: BLE001
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    try:
        result = pickle.loads(data) if data else None
    except Exception:  # noqa: BLE001 - a truncated answer: the child died writing it
        result = None
    return result, os.waitstatus_to_exitcode(status)


def check_local(path: str, deep: bool = False, split: Optional[str] = None,
                isolate: bool = True) -> VerifyReport:
    """Check a local ``.rec`` (with its index) or LMDB dataset; see :func:`gluon_data.verify`.

    An LMDB is scanned in a forked child when ``isolate`` is true, so a crash of LMDB on a
    damaged page is reported as a problem, not suffered by this process.
    """
    if not names_lmdb(path):
        return _verify_rec(path, deep)
    if not isolate:
        return _verify_lmdb_here(path, deep, split)
    result, exitcode = _verify_lmdb_isolated(path, deep, split)
    if isinstance(result, VerifyReport):
        return result
    report = VerifyReport(path, deep=deep, opened=False)
    if isinstance(result, BaseException):
        report.add(result, path)
    else:
        report.problems.append({"where": os.path.join(path, LMDB_DATA), "key": None,
                                "offset": None, "reason": "LMDB crashed while reading the file "
                                "(exit code %s): data.mdb is damaged" % exitcode})
    return report
