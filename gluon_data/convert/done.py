"""The one rule of "done": a unit of work is done when a record says it was done under the
digest this run derives for it, and what it produced is still what the record says: sizes
*and* digests of the bytes.

A *done record* (:class:`Done`) is ``{"unit": W, "digest": D, "outputs": {name: {"bytes": n,
"sha256": s, "etag": e}}}``: unit ``W`` (a split of a local conversion, ``shard 3 of 8``, an
object's URI) was done under digest ``D`` (a plan's or a part's digest from
:mod:`gluon_data.format.plan`, or the SHA-256 of an uploaded object's content) and produced
``outputs`` with these sizes and digests of their bytes, taken when the unit finished (the
SHA-256; for an object in storage also the ETag the store reported). Every conversion kind
reads and writes it the same way:

* each split's metadata of a local conversion (field ``done``: its ``.rec`` and ``.idx``;
  :func:`gluon_data.convert.outputs.done_record`, checked on ``--resume`` by
  :mod:`gluon_data.convert.resume`), and its checkpoint while it runs (``OUTPUT.resume.json``,
  an LMDB's progress key);
* each shard's metadata (``shard.done``: :mod:`gluon_data.convert.shard_task`);
* each shard's upload receipt (``PREFIX-SSSSS-of-NNNNN.upload.json``, field ``done``:
  :class:`gluon_data.convert.upload.ShardUploader`);
* the upload journal (``upload.json`` in the staging area: one record per object, keyed by
  the SHA-256 of what was uploaded: :func:`gluon_data.convert.upload.upload_dataset`).

:func:`why_not_done` is the one check (:func:`is_done` its yes/no): an output recorded
without a digest (the previous release's records) is not provably done, so it is redone;
``look`` callables (:func:`local_look`, :func:`gluon_data.stores.remote.commit.object_look`)
bring what each output is now. :func:`read_record` validates a document through
:func:`gluon_data.format.documents.load_document` and refuses one that cannot be read with a
:class:`~gluon_data.errors.ConversionError` naming the file and saying to restart without
resuming (never a silent redo or skip); :func:`write_record` is the one atomic write.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Callable, Dict, Mapping, Optional, Sequence, TypeVar, Union, cast

from ..errors import ConversionError, FormatError
from ..format.documents import (CHECKSUM_FIELD, COUNT, SHA256, STR, Doc, F, check_document,
                                load_document, map_of, obj, parse_json, register)
from ..format.ownership import check_replaceable
from ..format.recindex import idx_path_for
# file_facts: what the rule records of a file, defined beside the digest so that a conversion
# worker taking the digests imports nothing more than it has
from ..storage.fileio import read_input
from ..storage.fsutil import atomic_write, file_facts, fsync_dir, sha256_file

__all__ = ["Done", "is_done", "why_not_done", "file_facts", "local_look", "DIGESTS", "read_record", "record_in", "read_records", "records_doc",
           "write_record",
           "shard_unit", "output_unit", "DONE_FORMAT", "REC_OUTPUTS", "why_rec_not_done"]

#: The ``format`` marker of a document holding done records only (the upload journal).
DONE_FORMAT = "gluon_data-done"

_OUTPUT = obj("an object with \"bytes\" (and \"sha256\" or \"etag\")",
              bytes=F(COUNT, True, False), sha256=F(SHA256), etag=F(STR))

#: The digests of an output's bytes a done record may hold: its SHA-256, or the ETag its
#: object store reported when it was written (a rewrite changes it).
DIGESTS = ("sha256", "etag")

#: ``look(name, recorded) -> {"bytes": n, "sha256" or "etag": ...} or None``: what an output
#: is now (see :func:`why_not_done`).
Look = Callable[[str, dict], Optional[dict]]
_FIELDS = {"unit": F(STR, True, False), "digest": F(STR, True, False),
           "outputs": F(map_of(_OUTPUT, "an object of {\"bytes\", \"sha256\"} per output"),
                        True, False)}
_RECORD = obj("a done record (unit, digest, outputs)", **_FIELDS)

register("done", Doc("done record", _FIELDS, noun="done record"))
register("done_set", Doc("resume record document", {
    "records": F(map_of(_RECORD, "an object of done records"), True, False)},
    marker=("format", DONE_FORMAT), versions=(1,), noun="resume record document"))


@dataclass(frozen=True)
class Done:
    """Unit ``unit`` was done under ``digest``, producing ``outputs`` (``{name: {"bytes": n,
    "sha256": s}}``; ``sha256`` may be absent).

    Examples
    --------
    >>> r = Done("shard 1 of 4", "ab12", {"c-00001-of-00004.rec": {"bytes": 10}})
    >>> is_done(r, "shard 1 of 4", "ab12")
    True
    >>> is_done(r, "shard 1 of 4", "ab12", lambda name, want: {"bytes": 10})  # no digest
    False
    >>> is_done(r, "shard 1 of 4", "cd34")
    False
    """

    unit: str
    digest: str
    outputs: Mapping[str, dict] = field(default_factory=dict)

    def doc(self) -> dict:
        """The record as JSON-able data."""
        return {"unit": self.unit, "digest": str(self.digest),
                "outputs": {k: dict(v) for k, v in self.outputs.items()}}

    @classmethod
    def parse(cls, doc, where) -> "Done":
        """The record held in ``doc`` (checked: :class:`FormatError` naming ``where``)."""
        check_document(doc, "done", where)
        return cls(doc["unit"], doc["digest"], doc["outputs"])


def output_unit(split: str) -> str:
    """The unit name of split ``split`` of a local, unsharded conversion (not its output's
    name: equal conversions write equal metadata wherever they write it)."""
    return "split %s of the conversion" % split


def shard_unit(index: int, count: int) -> str:
    """The unit name of shard ``index`` of ``count``."""
    return "shard %d of %d" % (index, count)


#: The outputs a done record of a local ``.rec`` must name (the files :func:`local_look`
#: looks at): a record naming fewer proves nothing of the others.
REC_OUTPUTS = (".rec", ".idx")


def why_rec_not_done(meta: Mapping, record: Optional[Done], unit: str, digest: str,
                     path: str) -> Optional[str]:
    """:func:`why_not_done` of a local ``.rec`` output at ``path`` whose record is held in
    metadata ``meta`` (a split's, or a shard's): that metadata must carry its checksum (one
    edited by hand, the checksum dropped, proves nothing), the record must name the ``.rec``
    and ``.idx`` (:data:`REC_OUTPUTS`), and both files must be what it records."""
    if CHECKSUM_FIELD not in meta:
        return "its metadata carries no checksum (edited by hand), so its record proves nothing"
    return why_not_done(record, unit, digest, local_look(path), REC_OUTPUTS)


def is_done(record: Optional[Done], unit: str, digest: str,
            look: Optional[Look] = None, required: Sequence[str] = ()) -> bool:
    """Whether ``record`` proves ``unit`` done under ``digest``: :func:`why_not_done` found
    nothing against it."""
    return why_not_done(record, unit, digest, look, required) is None


def why_not_done(record: Optional[Done], unit: str, digest: str,
                 look: Optional[Look] = None, required: Sequence[str] = ()) -> Optional[str]:
    """The one rule of "done": ``None`` when ``record`` says ``unit`` was done under
    ``digest``, names every output of ``required`` (:data:`REC_OUTPUTS` for a ``.rec``) and,
    with ``look``, every output it records is what it records; else why not.

    ``look(name, recorded)`` says what output ``name`` is now (``{"bytes": n, "sha256": s}``,
    or ``"etag"`` in place of ``"sha256"`` for an object whose store reports one; ``None``
    when it is missing); :func:`local_look` and the remote one of
    :mod:`gluon_data.stores.remote.commit` are the two. An output counts only if its size
    *and* a digest of its bytes (SHA-256, or the store's ETag taken when it was written)
    equal the record's: an output recorded without a digest (a record of the previous
    release) is not provably done. A record with no outputs (an LMDB environment, whose
    integrity is its own transactions) is done by its unit and digest alone."""
    if record is None:
        return "no done record"
    if record.unit != unit:
        return "its done record is of %s, not %s" % (record.unit, unit)
    if record.digest != str(digest):
        return ("its done record was made from other inputs or options, or from the source "
                "as it was before it changed")
    unnamed = [name for name in required if name not in record.outputs]
    if unnamed:
        return "its done record names no %s, so it proves nothing of it" % " or ".join(unnamed)
    if look is None:
        return None
    for name, want in sorted(record.outputs.items()):
        if not any(k in want for k in DIGESTS):
            return ("%s was recorded without a digest of its bytes (by an earlier version), "
                    "so it cannot be proved complete" % name)
        have = look(name, want)
        if have is None:
            return "%s is missing" % name
        if "bytes" in want and have.get("bytes") != want["bytes"]:
            return "%s has %s bytes, its done record says %d" % (name, have.get("bytes"),
                                                                 want["bytes"])
        common = [k for k in DIGESTS if k in want and have.get(k) is not None]
        if not common:
            return "%s: no digest of its bytes could be taken to compare" % name
        if any(have[k] != want[k] for k in common):
            return ("%s has the recorded size but other bytes than its done record's "
                    "digest (damaged or rewritten)" % name)
    return None


def local_look(path: str) -> Look:
    """The ``look`` of :func:`why_not_done` for the files of a local ``.rec`` output at
    ``path``, named in its record by their suffix: ``.rec`` is ``path`` itself (whatever its
    name ends with) and ``.idx`` its index beside it (:func:`~gluon_data.format.recindex.
    idx_path_for`). Size first, the SHA-256 (one read of the file) only when the size is
    the recorded one."""
    files = {".rec": path, ".idx": idx_path_for(path)}

    def look(name: str, want: Mapping) -> Optional[dict]:
        file = files.get(name)
        if file is None:
            return None
        try:
            size = os.path.getsize(file)
        except OSError:
            return None
        if size != want.get("bytes") or "sha256" not in want:
            return {"bytes": size}
        return {"bytes": size, "sha256": sha256_file(file)}
    return look


def _unreadable(e: FormatError, what: str, where) -> ConversionError:
    return ConversionError("%s is unreadable (%s); it was left as it is: restart without "
                           "resume (--resume; with --overwrite where the output exists) to "
                           "redo the work" % (what, e.reason), e.path or where)


def read_record(source: Union[str, bytes], kind: str, where: Optional[str] = None, *,
                legacy: Optional[Callable[[dict], Done]] = None,
                what: str = "resume record", keep: Optional[dict] = None) -> Done:
    """The :class:`Done` of a resume document of ``kind`` (a path, or bytes with ``where``
    naming them), validated by :func:`~gluon_data.format.documents.load_document`: its
    ``done`` field, or ``legacy(doc)`` for a document of the previous release (no ``done``
    field). A document that cannot be read, or whose record is not valid, raises
    :class:`ConversionError` naming the file (``what`` it is): it is never taken as done,
    nor silently redone. ``keep``: filled with the document read."""
    # without ``where``, ``source`` is a path (bytes come with ``where``, as documented)
    where = where if where is not None else cast(str, os.fspath(source))
    try:
        doc = load_document(source, kind, where)
    except FormatError as e:
        raise _unreadable(e, what, where) from None
    if keep is not None:
        keep.update(doc)
    return record_in(doc, where, legacy, what)


#: What ``legacy`` of :func:`record_in` gives: a :class:`Done` (or ``None``: none found).
_Legacy = TypeVar("_Legacy", bound=Optional[Done])


def record_in(doc: dict, where, legacy: Optional[Callable[[dict], _Legacy]] = None,
              what: str = "resume record") -> Union[Done, _Legacy]:
    """The :class:`Done` held in field ``done`` of ``doc`` (a document or part of one,
    already checked as its kind), or ``legacy(doc)`` when it has none; an invalid record
    raises :class:`ConversionError` naming ``where``."""
    try:
        if "done" in doc:
            return Done.parse(doc["done"], where)
        if legacy is None:
            raise FormatError("lacks the done record (field 'done')", where)
        return legacy(doc)
    except FormatError as e:
        raise _unreadable(e, what, where) from None


def read_records(path: str, legacy: Callable[[dict], Dict[str, Done]], legacy_kind: str,
                 what: str = "resume record document") -> Dict[str, Done]:
    """The records, by unit, of a document holding done records only (``{"format":
    DONE_FORMAT, "format_version": 1, "records": {unit: record}}``); one of the previous
    release (kind ``legacy_kind``) through ``legacy``. Unreadable: :class:`ConversionError`
    naming ``path``."""
    try:
        doc = parse_json(read_input(path), what, path)
        if isinstance(doc, dict) and doc.get("format") == DONE_FORMAT:
            check_document(doc, "done_set", path)
            return {u: Done.parse(r, path) for u, r in doc["records"].items()}
        return legacy(check_document(doc, legacy_kind, path))
    except FormatError as e:
        raise _unreadable(e, what, path) from None


def records_doc(records: Mapping[str, Done]) -> bytes:
    """The document of ``records`` (a :data:`DONE_FORMAT` document)."""
    return json.dumps({"format": DONE_FORMAT, "format_version": 1,
                       "records": {u: r.doc() for u, r in records.items()}},
                      sort_keys=True).encode("utf-8")


def write_record(path: str, data: bytes, kind: Optional[str] = None,
                 durable: bool = False) -> None:
    """Replace ``path`` with ``data`` atomically (never through a link; ``kind``: only a
    document of ours of that kind, see :func:`~gluon_data.format.ownership.check_replaceable`).
    ``durable``: the folder is fsynced too, so the record survives a power loss."""
    if kind is not None:
        check_replaceable(path, kind, True)
    atomic_write(path, data, sync_dir=False)
    if durable:
        fsync_dir(os.path.dirname(os.path.abspath(path)))
