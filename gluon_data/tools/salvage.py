"""``gluon-data salvage``: rebuild a lost or short ``.idx`` by scanning the ``.rec``.

The scan looks for the RecordIO magic word at 4-byte aligned offsets, parses the framing from
there (multi-part records included) and keeps a record only if it is whole and, when it
carries one, its CRC-32 matches. Everything between kept records is reported as a damaged
byte range. Each record keeps the key it was written under where that can be known: a
dataset of ours stores it as the record's header id (so the id == key check readers apply
holds after a record is lost, and a second copy of an id is left out); for a stock file the
lines of the old index that survived give theirs, and where there is none the ids serve
when distinct (as ``im2rec`` writes them), else the positions in the file (see
:func:`_keys`).
"""
from __future__ import annotations

import errno
import mmap
import os
import struct
from dataclasses import dataclass, field
from typing import List, Optional, Tuple, cast

from ..format import codec
from .._callable import callable_module
from ..errors import FormatError, GluonDataError, OutputError
from ..storage.fileio import open_or_explain, open_regular, read_input, require_regular
from ..storage.fsutil import OutputLock, atomic_write, fsync_dir
from ..format.ownership import LOCATIONS, check_disjoint, check_replaceable, classify_location, is_ours
from ..format.meta import dumps_meta, ids_are_keys, meta_path, read_meta
from ..format.textindex import parse_index_prefix
from ..format.layout import missing_rec_hint
from ..stores.recordio import BINARY_INDEX_SUFFIX, idx_path_for, write_binary_index
from ..stores.base import dataset_part
from .stats import counted_records

__all__ = ["salvage", "SalvageReport", "scan_records"]

_MAGIC = struct.pack("<I", codec.RECORDIO_MAGIC)

#: What to do instead, for each kind of location salvage does not repair.
_INSTEAD = {
    "manifest": "salvage each shard's .rec instead (gluon-data verify %s names the damaged "
                "ones)",
    "lmdb": "an LMDB cannot be salvaged by a scan: verify it, then restore it or convert it "
            "again from its source",
    "uri": "salvage repairs local files: download the .rec (with its .idx and .meta.json), "
           "salvage it, upload it again",
    "idx": "give the .rec beside it",
    "gdx": "give the .rec beside it",
    "meta": "give the .rec beside it",
}


@dataclass
class SalvageReport:
    path: str
    idx_path: str
    records: int = 0
    damaged: List[Tuple[int, int]] = field(default_factory=list)  # [start, end) byte ranges
    file_size: int = 0
    tail_moved_to: Optional[str] = None  # where a damaged tail's bytes were moved
    #: offsets of intact records left out: a second copy of an id the dataset keys by
    duplicates: List[int] = field(default_factory=list)
    #: ``(index, count)`` where the .rec is a shard of a manifest (which still lists it as
    #: it was)
    shard: Optional[Tuple[int, int]] = None

    def __str__(self):
        lost = sum(e - s for s, e in self.damaged)
        lines = ["%s: recovered %d records into %s; %d damaged byte range(s), %d bytes"
                 % (self.path, self.records, self.idx_path, len(self.damaged), lost)]
        lines += ["  damaged bytes %d..%d (%d bytes)" % (s, e, e - s) for s, e in self.damaged]
        if self.duplicates:
            lines.append("  left out: %d intact record(s) repeating an id already indexed, at "
                         "offset(s) %s" % (len(self.duplicates),
                                           ", ".join(map(str, self.duplicates))))
        if self.tail_moved_to:
            lines.append("  the damaged tail was moved to %s and the .rec truncated"
                         % self.tail_moved_to)
        if self.shard is not None and (self.damaged or self.duplicates):
            lines.append("  this .rec is shard %d of %d of a manifest, which still lists it "
                         "as it was: rerun the conversion that wrote the manifest with "
                         "--resume to redo the shard from its source" % self.shard)
        return "\n".join(lines)


def scan_records(buf, segmentation=None, require_checksum: bool = False):
    """Yield ``(offset, end)`` of every intact record in a RecordIO byte buffer, and
    ``(start, end, None)`` markers for damaged ranges between them. With
    ``require_checksum`` a record whose checksum tag is gone counts as damaged."""
    for start, end, found in _scan_buffer(buf, segmentation, require_checksum):
        yield (start, end) if found is not None else (start, end, None)


def _scan_buffer(buf, segmentation, require_checksum: bool):
    """:func:`scan_records` with each intact record's header id: ``(offset, end, id)``, and
    ``(start, end, None)`` for a damaged range."""
    n = len(buf)
    pos, bad_start = 0, None
    while pos + 8 <= n:
        if buf[pos:pos + 4] == _MAGIC:
            try:
                payload, end = codec.unframe(buf, pos)
                rec = codec.unpack(payload, segmentation=segmentation, verify=True)
                intact = rec.checksum is not None or not require_checksum
            except GluonDataError:
                intact = False
            if intact:
                if bad_start is not None:
                    yield bad_start, pos, None
                    bad_start = None
                yield pos, end, rec.id
                pos = end
                continue
        if bad_start is None:
            bad_start = pos
        nxt = buf.find(_MAGIC, pos + 4)
        while nxt != -1 and nxt % 4:
            nxt = buf.find(_MAGIC, nxt + 1)
        pos = n if nxt == -1 else nxt
    if pos < n and bad_start is None:
        bad_start = pos
    if bad_start is not None:
        yield bad_start, n, None


def salvage(rec_path: str, idx_path: Optional[str] = None,
            overwrite: bool = False) -> SalvageReport:
    """Rebuild ``idx_path`` (default: beside the ``.rec``) from the records found in the file.

    An existing index is kept as ``.idx.bak`` (only with ``overwrite``); metadata, if any, is
    updated to the recovered count (the old one kept as ``.meta.json.bak``) and records what
    was salvaged. Bytes after the last record indexed (a writer killed mid-record, a copy of
    a record left out) are moved to ``.rec.damaged-tail`` so the ``.rec`` ends with it.
    """
    rec_path = os.fspath(rec_path)
    _check_is_rec(rec_path)
    idx_path = os.fspath(idx_path or idx_path_for(rec_path))
    gdx = idx_path + BINARY_INDEX_SUFFIX
    mp = meta_path(rec_path)
    for p in (idx_path, mp):  # read too (kept as .bak, the task): the input-kind rule first
        require_regular(p)
    _check_targets(rec_path, idx_path, gdx, mp, overwrite)
    # the one output lock every writer takes: never beside a conversion writing this .rec
    with OutputLock([rec_path]):
        return _salvage_locked(rec_path, idx_path, gdx, mp)


def _salvage_locked(rec_path: str, idx_path: str, gdx: str, mp: str) -> SalvageReport:
    try:
        meta = read_meta(rec_path)
    except GluonDataError:
        meta = None
    seg = None if meta is None else meta["task"] == "segmentation"
    require = meta is not None and meta.get("checksum") == "crc32-id2"
    report = SalvageReport(rec_path, idx_path, file_size=os.path.getsize(rec_path))
    shard = (meta or {}).get("shard")
    if shard:
        report.shard = (shard["index"], shard["count"])
    offsets, ends, ids = _scan(rec_path, seg, require, report)
    if not offsets:  # an empty index would read as an empty dataset
        raise FormatError("no intact record in its %d bytes, so nothing to index (%s); the "
                          "index and metadata are left as they were"
                          % (report.file_size, "not RecordIO, or damaged throughout"
                             if report.file_size else "an empty file"), rec_path)
    try:  # the index being replaced: what its lines still say, and its .bak
        old_raw: Optional[bytes] = read_input(idx_path)
    except FileNotFoundError:
        old_raw = None
    old = None if old_raw is None else parse_index_prefix(old_raw)
    offsets, ends, keys = _keys(offsets, ends, ids, ids_are_keys(meta), old, report)
    report.records = len(offsets)
    if ends[-1] < report.file_size:  # damaged bytes, or a copy left out, after the last
        _cut_tail(rec_path, ends[-1], report)
    text = "".join("%d\t%d\n" % kv for kv in zip(keys, offsets)).encode("ascii")
    if old_raw is not None:
        atomic_write(idx_path + ".bak", old_raw)
    atomic_write(idx_path, text)
    if offsets:  # the binary copy readers map instead of the text (a stale one is ignored)
        write_binary_index(idx_path, lock_held=True)  # (under salvage's lock)
    elif os.path.lexists(gdx) and is_ours(gdx, "gdx"):
        os.remove(gdx)
    if meta is not None and meta["num_records"] != len(offsets):
        atomic_write(mp + ".bak", read_input(mp))
        atomic_write(mp, dumps_meta(_salvaged_meta(meta, offsets, keys, old, report)))
    return report


#: the largest key an ``.idx`` holds (readers parse keys as int64)
_MAX_KEY = (1 << 63) - 1


def _keys(offsets: List[int], ends: List[int], ids: List[int], ours: bool,
          old: Optional[List[Tuple[int, int]]],
          report: SalvageReport) -> Tuple[List[int], List[int], List[int]]:
    """The records to index (their offsets and ends) and each one's key. A dataset whose
    records carry their keys as ids (``ours``: :func:`~gluon_data.format.meta.ids_are_keys`)
    is keyed by them, a second copy of an id left out (``report.duplicates``). Otherwise
    the old index (its readable lines) decides where it lists records: keyed by their ids if it did so too, else
    each listed record keeps its old key and the rest continue its numbering. Without one,
    the ids serve (as ``im2rec`` writes them) if distinct and small enough for an index,
    else the positions in the file."""
    if ours:
        seen: set = set()
        kept = []
        for off, end, i in zip(offsets, ends, ids):
            if i in seen:
                report.duplicates.append(off)
            else:
                seen.add(i)
                kept.append((off, end, i))
        return [r[0] for r in kept], [r[1] for r in kept], [r[2] for r in kept]
    distinct = len(set(ids)) == len(ids) and max(ids, default=0) <= _MAX_KEY
    listed = dict((off, key) for key, off in old or [])
    if distinct and all(listed.get(off, i) == i for off, i in zip(offsets, ids)):
        return offsets, ends, ids
    if listed:
        nxt = max(listed.values()) + 1
        keys = []
        for off in offsets:
            key = listed.get(off)
            if key is None:
                key, nxt = nxt, nxt + 1
            keys.append(key)
        if len(set(keys)) == len(keys):
            return offsets, ends, keys
    return offsets, ends, list(range(len(offsets)))


def _salvaged_meta(meta: dict, offsets: List[int], keys: List[int],
                   old: Optional[List[Tuple[int, int]]], report: SalvageReport) -> dict:
    """The metadata of the recovered records (``offsets`` and ``keys``, in file order):
    their count, what was salvaged, and each one's item name where it is known which record
    each name was of (else none: they would name other records). The names are listed in
    the order of the index they were written with: the old index pairs each with its
    record's offset; without it, a conversion's own dataset never salvaged before (its
    keys its positions, from its first item's: a shard's ``items``) pairs them by key."""
    try:
        counted = counted_records(meta)
    except FormatError:  # a count an earlier salvage left unreadable: this file's, then
        counted = meta["num_records"]
    out = dict(meta, num_records=len(keys),
               salvaged={"records_before": meta["num_records"],
                         "damaged_ranges": [list(r) for r in report.damaged],
                         # the statistics are the conversion's: counted over its records,
                         # the lost ones included (tools.stats says so)
                         "counted_records": counted})
    names = out.pop("item_names", None)
    if not isinstance(names, list) or len(names) != meta["num_records"]:
        return out
    if old is not None and len(old) == len(names):
        by_offset = {off: name for (_, off), name in zip(old, names)}
        kept = [by_offset.get(off) for off in offsets]
    elif "salvaged" not in meta and ids_are_keys(meta):
        first = ((meta.get("shard") or {}).get("items") or [0])[0]
        kept = [names[k - first] if 0 <= k - first < len(names) else None for k in keys]
    else:
        return out
    if all(name is not None for name in kept):
        out["item_names"] = kept
    return out


def _check_targets(rec_path: str, idx_path: str, gdx: str, mp: str, overwrite: bool) -> None:
    """Everything salvage may write is checked before anything is: only our own files are
    replaced, nothing through a link (fsutil's rule). The metadata is rewritten only when it
    reads (:func:`_salvage_locked`), so only then is it a target: a damaged one is left as it
    is and the index is still rebuilt."""
    check_replaceable(idx_path, "idx", overwrite, option="the overwrite option (--overwrite; "
                      "the old index is kept as .idx.bak)")
    check_replaceable(idx_path + ".bak", "idx", True)
    check_replaceable(gdx, "gdx", True)
    try:
        writes_meta = os.path.lexists(mp) and read_meta(rec_path) is not None
    except GluonDataError:
        writes_meta = False
    if writes_meta:
        check_replaceable(mp, "meta", True)
        check_replaceable(mp + ".bak", "meta", True)
    check_disjoint([idx_path, idx_path + ".bak", gdx, mp, mp + ".bak"], [rec_path])


def _scan(rec_path: str, seg, require: bool,
          report: SalvageReport) -> Tuple[List[int], List[int], List[int]]:
    """The offsets, ends and header ids of the intact records of ``rec_path``; damaged byte
    ranges are added to ``report.damaged``."""
    offsets: List[int] = []
    ends: List[int] = []
    ids: List[int] = []
    fd = open_or_explain(rec_path)
    try:
        buf = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if report.file_size else b""
    finally:
        os.close(fd)  # the mapping keeps the file, not the descriptor
    try:
        for start, end, found in _scan_buffer(buf, seg, require):
            if found is None:
                report.damaged.append((start, end))
            else:
                offsets.append(start)
                ends.append(end)
                ids.append(found)
    finally:
        if report.file_size:
            cast(mmap.mmap, buf).close()  # mapped: b"" only for an empty file
    return offsets, ends, ids


def _cut_tail(rec_path: str, start: int, report: SalvageReport) -> None:
    """Bytes after the last record indexed, from ``start`` (a writer killed mid-record, or
    a copy of a record left out): move them aside, so the .rec ends with its last indexed
    record and readers accept the rebuilt index."""
    if os.path.islink(rec_path):
        raise OutputError("the damaged tail must be cut from this .rec, but it is a "
                          "symbolic link (to %s) and gluon-data never writes through one: "
                          "salvage the real file" % os.readlink(rec_path), rec_path)
    with open_regular(rec_path, "r+b") as f:
        f.seek(start)
        tail = f.read()
        report.tail_moved_to = _write_unique(rec_path + ".damaged-tail", tail)
        f.truncate(start)  # in place (the tail is saved above): no temporary + rename
        f.flush()
        os.fsync(f.fileno())


def _check_is_rec(path: str) -> None:
    """Refuse, before anything is touched, a location that is not a single local ``.rec``
    (a manifest, an LMDB, a URI, a folder, an index...), saying what to do instead; a FIFO,
    a device or a socket (or a link to one) is refused by the input-kind rule before
    anything looks inside it."""
    require_regular(path, directory=True)  # (a folder or an LMDB: named below)
    part = dataset_part(path)  # the one check every command recognises these inputs by
    if part is not None:
        raise FormatError("salvage repairs a single .rec file; this is %s of a dataset: give "
                          "%s; nothing was changed" % part, path)
    kind = classify_location(path)
    if kind == "rec":
        return
    if kind == "missing":
        raise FileNotFoundError("no .rec at %s: salvage repairs a single .rec file%s"
                                % (path, missing_rec_hint(path)))
    instead = _INSTEAD.get(kind, "give a .rec (a RecordIO data file)")
    raise FormatError("salvage repairs a single .rec file; this is %s: %s; nothing was "
                      "changed" % (LOCATIONS[kind], instead.replace("%s", path)), path)


def _write_unique(path: str, data: bytes) -> str:
    """Write ``data`` to a new file ``path`` (or ``path.1``, ``path.2``... when taken):
    bytes moved out of a dataset never replace anything, and never go through a link.
    (Not :func:`~gluon_data.storage.fsutil.atomic_write`, which replaces its target: here the
    exclusive create is what guarantees nothing is replaced.)"""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    for n in range(1000):
        name = path if n == 0 else "%s.%d" % (path, n)
        try:
            fd = os.open(name, flags, 0o644)
        except FileExistsError:
            continue
        except OSError as e:
            if e.errno == errno.ELOOP:
                continue
            raise
        with os.fdopen(fd, "wb") as t:
            t.write(data)
            t.flush()
            os.fsync(t.fileno())
        fsync_dir(os.path.dirname(os.path.abspath(name)))
        return name
    raise OutputError("no free name for the damaged tail beside it", path)


callable_module(__name__)  # from gluon_data import salvage: the function, even once the module is loaded
