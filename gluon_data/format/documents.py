"""One schema check for every JSON document gluon_data reads (FORMAT.md sections 4, 7, 8).

Metadata (``.meta.json``, an LMDB split's ``__meta__``), shard manifests (``.shards.json``),
upload receipts (``.upload.json``), the LMDB commit document (``NAME.lmdb/meta.json``), the
resume checkpoint and the upload journal are each described by a small declarative schema
(field -> constraint, required or optional, nested entries); :func:`load_document` parses
and :func:`check_document` checks one. A wrong document is one :class:`FormatError` naming
the file, the field, what was expected and the value found, never a ``TypeError`` or
``KeyError`` deep in a reader. Cross-field rules (checksums, sums, manifest order) are a
kind's ``after`` hook, run once the fields have their types.

This module imports only :mod:`gluon_data.errors` and the standard library.
"""
from __future__ import annotations

import json
import os
import re
import sys
import zlib
from typing import Any, Callable, Dict, Optional, Tuple, Union

from ..errors import FormatError
from ..storage.fileio import read_input
from ..storage.fsutil import LMDB_DATA

__all__ = ["load_document", "parse_json", "check_document", "KINDS", "Spec", "F", "Doc"]


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _short(v) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


class Spec:
    """A constraint on one value: ``ok(value)`` and how the expectation reads in a message.
    ``items`` / ``values`` check each element of a list / each value of an object;
    ``fields`` checks a nested object (a :class:`Doc` without ``format``)."""

    def __init__(self, ok: Callable[[Any], bool], want: str, items: "Optional[Spec]" = None,
                 values: "Optional[Spec]" = None, fields: "Optional[Dict[str, F]]" = None):
        self.ok, self.want, self.items, self.values, self.fields = ok, want, items, values, \
            fields


class F:
    """A field: its :class:`Spec`, whether it is required, whether ``null`` is allowed."""

    def __init__(self, spec: Spec, required: bool = False, null: bool = True):
        self.spec, self.required, self.null = spec, required, null


STR = Spec(lambda v: isinstance(v, str), "a string")
INT = Spec(_int, "an integer")
COUNT = Spec(lambda v: _int(v) and v >= 0, "a non-negative integer")
NUMBER = Spec(lambda v: (_int(v) or isinstance(v, float)), "a number")
BOOL = Spec(lambda v: isinstance(v, bool), "true or false")
LIST = Spec(lambda v: isinstance(v, list), "a list")
OBJ = Spec(lambda v: isinstance(v, dict), "an object")
SHA256 = Spec(lambda v: isinstance(v, str) and re.fullmatch("[0-9a-f]{64}", v) is not None,
              "a SHA-256 (64 hex digits)")


def list_of(item: Spec, want: str) -> Spec:
    return Spec(lambda v: isinstance(v, list), want, items=item)


def map_of(value: Spec, want: str) -> Spec:
    return Spec(lambda v: isinstance(v, dict), want, values=value)


def obj(want: str, **fields: F) -> Spec:
    return Spec(lambda v: isinstance(v, dict), want, fields=fields)


def one_of(*choices) -> Spec:
    return Spec(lambda v: isinstance(v, str) and v in choices,
                "one of %s" % ", ".join(map(repr, choices)))


class Doc:
    """A document kind: what it is called in messages, its ``format`` / ``format_version``
    (or ``writer``) marker, its fields and a hook for cross-field rules."""

    def __init__(self, title: str, fields: Dict[str, F], marker: Optional[Tuple[str, Any]] = None,
                 versions: Tuple[int, ...] = (), upgrade: str = "upgrade gluon_data",
                 after: Optional[Callable[[dict, str], None]] = None,
                 noun: Optional[str] = None):
        self.title, self.fields, self.marker = title, fields, marker
        self.noun = noun or title  # "metadata field 'x' must be ..."
        self.versions, self.upgrade, self.after = versions, upgrade, after


#: Every kind :func:`check_document` knows; modules add theirs with :func:`register`.
KINDS: Dict[str, Doc] = {}


def register(kind: str, doc: Doc) -> Doc:
    KINDS[kind] = doc
    return doc


def _fail(noun: str, field: str, want: str, value, where, top=None) -> None:
    """``top``: the document's field holding ``field`` (a list element, a nested key), named
    first, with what it must be."""
    head = "%s field %r" % (noun, field) if top is None or top[0] == field else \
        "%s field %r (%s): %s" % (noun, top[0], top[1], field)
    raise FormatError("%s must be %s, got %s %s"
                      % (head, want, type(value).__name__, _short(value)), where)


def _check_fields(d: dict, fields: Dict[str, F], title: str, where, prefix: str = "",
                  top=None) -> None:
    for name, f in fields.items():
        field = prefix + name
        if name not in d:
            if f.required:
                raise FormatError("%s lacks the required field %r (%s)"
                                  % (title, field, f.spec.want), where)
            continue
        v = d[name]
        at = top or (field, f.spec.want)
        if v is None:
            if not f.null:
                _fail(title, field, f.spec.want, v, where, at)
            continue
        _check_value(v, f.spec, title, field, where, at)


def _check_value(v, spec: Spec, title: str, field: str, where, top) -> None:
    if not spec.ok(v):
        _fail(title, field, spec.want, v, where, top)
    if spec.items is not None:
        for i, x in enumerate(v):
            _check_value(x, spec.items, title, "%s[%d]" % (field, i), where, top)
    if spec.values is not None:
        for k, x in v.items():
            _check_value(x, spec.values, title, "%s[%r]" % (field, k), where, top)
    if spec.fields is not None:
        _check_fields(v, spec.fields, title, where, field + ".", top)


def check_document(doc: Any, kind: str, where) -> dict:
    """Check ``doc`` against the schema of ``kind``; return it, or raise
    :class:`FormatError` naming ``where`` (the file), the field, what was expected and what
    was found."""
    d = KINDS[kind]
    if d.marker is not None:
        key, value = d.marker
        if not isinstance(doc, dict) or doc.get(key) != value:
            raise FormatError("not a %s (missing \"%s\": \"%s\")" % (d.title, key, value), where)
    elif not isinstance(doc, dict):
        raise FormatError("%s must be a JSON object, got %s %s"
                          % (d.title, type(doc).__name__, _short(doc)), where)
    if d.versions:
        version = doc.get("format_version")
        if not _int(version) or version not in d.versions:
            raise FormatError("%s version %r is not supported by this gluon_data (supports %s);"
                              " %s" % (d.noun, version,
                                       ", ".join(map(str, d.versions)), d.upgrade), where)
    _check_fields(doc, d.fields, d.noun, where)
    if d.after is not None:
        d.after(doc, where)
    return doc


def check_nested(doc: Any, kind: str, where, noun: str, field: str) -> dict:
    """:func:`check_document` of a document held in field ``field`` of another (a manifest's
    ``meta``): the error names the outer file and the field."""
    try:
        return check_document(doc, kind, where)
    except FormatError as e:
        raise FormatError("%s field %r: %s" % (noun, field, e.reason), where) from None


def load_document(source: Union[str, "os.PathLike[str]", bytes], kind: str,
                  where: Optional[str] = None) -> dict:
    """Parse a JSON document (a file's path, or its bytes with ``where`` naming it) and
    :func:`check_document` it. A missing file raises ``FileNotFoundError``; bytes that are
    not UTF-8 JSON a :class:`FormatError`."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        raw = bytes(source)
    else:
        where = os.fspath(source) if where is None else where
        raw = read_input(os.fspath(source))
    doc = parse_json(raw, KINDS[kind].noun, where)
    try:
        return check_document(doc, kind, where)
    except RecursionError:  # parsed just under the limit, too deep to check or checksum
        raise _too_deep(KINDS[kind].noun, where) from None


def _too_deep(noun: str, where) -> FormatError:
    return FormatError("%s is nested too deeply (arrays or objects inside each other beyond "
                       "what Python can parse, ~%d levels; no gluon_data document nests more "
                       "than a few): the file is damaged or not one of ours; restore it or "
                       "re-convert" % (noun, sys.getrecursionlimit()), where)


def parse_json(raw: bytes, noun: str = "document", where=None) -> Any:
    """The one JSON parser of the documents gluon_data reads (:func:`load_document`, and
    the ownership checks that only peek at a ``format`` marker): UTF-8 JSON, else a
    :class:`FormatError` (a ``ValueError``) naming ``where`` -- bytes that are not UTF-8,
    not JSON, or nested too deeply to parse (``[[[[...]]]]`` 100000 deep is a
    ``RecursionError`` in :mod:`json`, never let out as one)."""
    try:
        return json.loads(bytes(raw).decode("utf-8"))
    except RecursionError:
        raise _too_deep(noun, where) from None
    except (UnicodeDecodeError, ValueError) as e:
        raise FormatError("%s is not valid JSON (%s)" % (noun, e), where) from None


# --------------------------------------------------------------------------- the kinds
#: Field holding the CRC-32 of the rest of a document (see :func:`content_crc32`).
CHECKSUM_FIELD = "meta_crc32"


def content_crc32(doc: Dict[str, Any]) -> int:
    """CRC-32 of a document's content (every field but :data:`CHECKSUM_FIELD`), serialized
    canonically: sorted keys, no whitespace, ASCII."""
    body = {k: v for k, v in doc.items() if k != CHECKSUM_FIELD}
    return zlib.crc32(json.dumps(body, sort_keys=True, separators=(",", ":"),
                                 ensure_ascii=True).encode("ascii"))


def check_crc(doc: dict, where, title: str) -> None:
    """A document carrying ``meta_crc32`` must match it (one without it is accepted)."""
    if CHECKSUM_FIELD not in doc:
        return
    stored = doc[CHECKSUM_FIELD]
    if not _int(stored) or stored != content_crc32(doc):
        raise FormatError("%s checksum mismatch (stored %r, computed %d): the document was "
                          "damaged or edited; restore it or re-convert"
                          % (title, stored, content_crc32(doc)), where)


_COUNTS = map_of(COUNT, "an object of counts")
_FILE = obj("an object with \"bytes\" and \"sha256\"", bytes=F(COUNT, True, False),
            sha256=F(SHA256, True, False))
_FILES = map_of(_FILE, "an object of {\"bytes\", \"sha256\"} per file")

META_FIELDS: Dict[str, F] = {
    "task": F(one_of("classification", "segmentation"), True, False),
    "num_records": F(COUNT, True, False),
    "split": F(STR),
    "checksum": F(STR),
    "images_checked": F(STR),
    "image_encoding": F(STR),
    "mask_encoding": F(STR),
    "classes": F(list_of(STR, "a list of strings")),
    "num_classes": F(COUNT),
    "ignore_label": F(Spec(lambda v: _int(v) and 0 <= v <= 65535, "an integer 0..65535")),
    "pred_offset": F(INT),
    "palette": F(list_of(Spec(lambda c: isinstance(c, list) and len(c) == 3 and all(
        _int(x) and 0 <= x <= 255 for x in c), "an [r, g, b] list"),
        "a list of [r, g, b] lists")),
    "record_keys": F(list_of(INT, "a list of integers")),
    "class_pixels": F(_COUNTS),
    "class_images": F(_COUNTS),
    "class_image_pixels": F(_COUNTS),
    "skipped": F(LIST),
    "created_by": F(OBJ),
    "image_size": F(OBJ),
    "image_stats": F(OBJ),
    "conversion_id": F(STR),
    "item_names": F(list_of(STR, "a list of strings")),
    "masks": F(BOOL),
    "files": F(_FILES),
    "done": F(OBJ),
    "shard": F(obj("an object with \"index\", \"count\" and \"plan_digest\"",
                   index=F(COUNT, True, False), count=F(COUNT, True, False),
                   plan_digest=F(STR, True, False), plan=F(STR),
                   items=F(list_of(COUNT, "[first, end]")), stats=F(OBJ))),
    CHECKSUM_FIELD: F(INT),
}

register("meta", Doc("gluon_data metadata document", META_FIELDS,
                     marker=("format", "gluon_data"), versions=(1,),
                     upgrade="upgrade gluon_data or re-convert the dataset",
                     after=lambda d, w: check_crc(d, w, "metadata"), noun="metadata"))

SHARD_ENTRY = obj("a shard entry (name, records, bytes, idx_sha256, meta_sha256)",
                  name=F(STR, True, False), records=F(COUNT, True, False),
                  bytes=F(COUNT, True, False), idx_sha256=F(SHA256),
                  meta_sha256=F(SHA256, False, False))

MANIFEST_FIELDS: Dict[str, F] = {
    "container": F(one_of("rec", "lmdb"), True, False),
    "split": F(STR),
    "task": F(STR),
    "num_records": F(COUNT, True, False),
    "shards": F(list_of(SHARD_ENTRY, "a list of shard entries"), True, False),
    "meta": F(OBJ, True, False),
    "plan": F(obj("an object (kind, source, ranges, digest)", digest=F(STR), names=F(STR),
                  ranges=F(LIST), kind=F(STR))),
    "files": F(_FILES),
    CHECKSUM_FIELD: F(INT),
}

#: ``PREFIX-SSSSS-of-NNNNN.rec`` / ``.lmdb``: a shard's name encodes its index and the count.
SHARD_NAME = re.compile(r"^(.+)-(\d{5,})-of-(\d{5,})\.(rec|lmdb)$")


def _manifest_after(doc: dict, where) -> None:
    """The invariants of a manifest, checked on every open (FORMAT.md section 7): one entry
    per shard, shard ``i`` at position ``i`` (its name says ``-%05d-of-%05d`` with the count
    of entries, one prefix for all, the container's extension), counts that add up to
    ``num_records``, the split's metadata agreeing on the total."""
    shards, n = doc["shards"], len(doc["shards"])
    if n == 0:
        raise FormatError("manifest field 'shards' is empty (a sharded dataset has at least "
                          "one shard); the manifest is damaged", where)
    prefix = None
    for i, entry in enumerate(shards):
        m = SHARD_NAME.match(entry["name"])
        if m is None or "/" in entry["name"] or entry["name"] != os.path.basename(entry["name"]):
            raise FormatError("manifest field 'shards[%d].name' must be PREFIX-%05d-of-%05d.%s,"
                              " got %s" % (i, i, n, doc["container"], _short(entry["name"])),
                              where)
        if (int(m.group(2)), int(m.group(3)), m.group(4)) != (i, n, doc["container"]) \
                or (prefix is not None and m.group(1) != prefix):
            raise FormatError("manifest field 'shards[%d].name' is %s, but entry %d of %d must "
                              "be %s-%05d-of-%05d.%s: entries are missing, duplicated, "
                              "reordered or renamed; restore the manifest or rerun the "
                              "conversion" % (i, _short(entry["name"]), i, n,
                                              prefix or m.group(1), i, n, doc["container"]),
                              where)
        prefix = m.group(1)
        if doc["container"] == "rec" and entry.get("idx_sha256") is None:
            raise FormatError("manifest field 'shards[%d].idx_sha256' must be %s for RecordIO "
                              "shards, got %s" % (i, SHA256.want, _short(entry.get("idx_sha256"))),
                              where)
    total = sum(e["records"] for e in shards)
    if total != doc["num_records"]:
        raise FormatError("manifest's shard record counts (sum %d) do not add up to "
                          "num_records=%d" % (total, doc["num_records"]), where)
    meta = {k: v for k, v in doc["meta"].items() if k != CHECKSUM_FIELD}  # the outer CRC
    check_nested(meta, "meta", where, "manifest", "meta")
    if meta["num_records"] != total:
        raise FormatError("manifest field 'meta.num_records' is %d, the shards hold %d"
                          % (meta["num_records"], total), where)
    ranges = (doc.get("plan") or {}).get("ranges")
    if ranges is not None and len(ranges) != n:
        raise FormatError("manifest field 'plan.ranges' has %d ranges for %d shards"
                          % (len(ranges), n), where)
    check_crc(doc, where, "manifest")  # last: the rules above say what is wrong, if they can


register("manifest", Doc("shard manifest", MANIFEST_FIELDS,
                         marker=("format", "gluon_data-shards"), versions=(1,),
                         after=_manifest_after, noun="manifest"))

RECEIPT_FIELDS: Dict[str, F] = {
    "shard": F(obj("an object with \"index\", \"count\" and \"plan_digest\"",
                   index=F(COUNT, True, False), count=F(COUNT, True, False),
                   plan_digest=F(STR, True, False)), True, False),
    "files": F(_FILES, True, False),
    "entry": F(obj("a shard entry with its metadata", name=F(STR, True, False),
                   records=F(COUNT, True, False), bytes=F(COUNT, True, False),
                   idx_sha256=F(SHA256), meta_sha256=F(SHA256, False, False),
                   meta=F(OBJ, True, False)), True, False),
    CHECKSUM_FIELD: F(INT),
}


def _receipt_after(doc: dict, where) -> None:
    check_crc(doc, where, "upload receipt")
    check_nested(doc["entry"]["meta"], "meta", where, "upload receipt", "entry.meta")


register("receipt", Doc("shard upload receipt", RECEIPT_FIELDS,
                        marker=("writer", "gluon_data"), versions=(1,),
                        after=_receipt_after, noun="upload receipt"))


def _lmdb_commit_after(doc: dict, where) -> None:
    if LMDB_DATA not in doc["files"]:
        raise FormatError("LMDB commit document field 'files' lacks \"data.mdb\" (the size "
                          "and SHA-256 of data.mdb)", where)
    for s, m in doc["splits"].items():
        check_document(m, "meta", "%s [split %s]" % (where, s))


register("lmdb_commit", Doc("LMDB commit document", {
    "container": F(STR), "splits": F(OBJ, True, False), "files": F(_FILES, True, False)},
    marker=("format", "gluon_data-lmdb"), versions=(1,), after=_lmdb_commit_after))

_CKPT_SPLIT = obj("an object with \"done\", \"stats\" and \"writer\"",
                  done=F(COUNT, True, False), stats=F(OBJ, True, False),
                  writer=F(list_of(INT, "a list of integers"), True, False),
                  stamps=F(STR))  # the digest of the written items with their files' stamps

def _checkpoint_after(doc: dict, where) -> None:
    if not doc.get("publishing") and "skipped" not in doc:
        raise FormatError("resume checkpoint lacks the required field 'skipped' (a list)",
                          where)


register("checkpoint", Doc("resume checkpoint", {
    "digest": F(STR, True, False),
    "names": F(STR),  # the names-only digest: tells "same plan, source changed" apart
    "planned_ns": F(COUNT),  # when the plan was taken: files modified after it are named
    "splits": F(map_of(_CKPT_SPLIT, "an object of per-split progress"), True, False),
    "skipped": F(LIST),
    "publishing": F(BOOL)}, after=_checkpoint_after))


def _journal_after(doc: dict, where) -> None:
    for k, v in doc.items():
        _check_value(v, SHA256, "upload journal", k, where, None)


register("journal", Doc("upload journal", {}, after=_journal_after))
