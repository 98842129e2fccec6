"""Dataset metadata: the JSON document stored beside a ``.rec`` (``PREFIX.meta.json``).

The schema is documented in ``FORMAT.md``. A ``.rec`` without metadata is a stock MXNet
file (e.g. from ``im2rec``): it is readable as classification data, without checksums.
"""
from __future__ import annotations

import json
import os
import zlib
from typing import Any, Dict, Optional

from .errors import FormatError

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "SUPPORTED_VERSIONS", "TASKS",
           "meta_path", "read_meta", "check_meta", "dumps_meta", "ids_are_keys",
           "meta_checksum", "CONTAINER_KEYS"]

FORMAT_NAME = "gluon_data"
FORMAT_VERSION = 1
SUPPORTED_VERSIONS = (1,)
TASKS = ("classification", "segmentation")


#: Metadata keys that describe one container, not the dataset, so a copy into another does
#: not carry them: ``container`` and ``record_keys`` (LMDB, FORMAT.md §5) and ``files`` (the
#: sizes and SHA-256 of the objects an upload wrote, §8).
CONTAINER_KEYS = ("container", "record_keys", "files")


def meta_path(rec_path: str) -> str:
    """``data/voc_train.rec`` -> ``data/voc_train.meta.json``."""
    return os.path.splitext(rec_path)[0] + ".meta.json"


#: Field holding the CRC-32 of the rest of the document (see :func:`meta_checksum`).
CHECKSUM_FIELD = "meta_crc32"


def meta_checksum(meta: Dict[str, Any]) -> int:
    """CRC-32 of a metadata document's content (every field but :data:`CHECKSUM_FIELD`),
    serialized canonically: sorted keys, no whitespace, ASCII. Layout and whitespace of the
    file do not matter; any change of a value does."""
    body = {k: v for k, v in meta.items() if k != CHECKSUM_FIELD}
    return zlib.crc32(json.dumps(body, sort_keys=True, separators=(",", ":"),
                                 ensure_ascii=True).encode("ascii"))


def check_meta(meta: Any, path: str) -> Dict[str, Any]:
    """Validate a metadata document; raise :class:`FormatError` naming ``path`` if wrong.

    A document carrying ``meta_crc32`` (every one written since it was introduced) must match
    it, so a damaged value (``ignore_label``, ``num_records``...) is an error, not a
    silently different dataset."""
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise FormatError("not a gluon_data metadata document (missing \"format\": \"%s\")"
                          % FORMAT_NAME, path)
    version = meta.get("format_version")
    if version not in SUPPORTED_VERSIONS:
        raise FormatError("format version %r is not supported by this gluon_data (supports %s);"
                          " upgrade gluon_data or re-convert the dataset"
                          % (version, ", ".join(map(str, SUPPORTED_VERSIONS))), path)
    if meta.get("task") not in TASKS:
        raise FormatError("unknown task %r (expected one of %s)" % (meta.get("task"), TASKS),
                          path)
    n = meta.get("num_records")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise FormatError("num_records must be a non-negative integer, got %r" % (n,), path)
    for name, ok, want in _FIELD_TYPES:
        if name in meta and meta[name] is not None and not ok(meta[name]):
            raise FormatError("metadata field %r must be %s, got %s %s"
                              % (name, want, type(meta[name]).__name__,
                                 _short(meta[name])), path)
    if CHECKSUM_FIELD in meta:
        stored = meta[CHECKSUM_FIELD]
        if not isinstance(stored, int) or isinstance(stored, bool) \
                or stored != meta_checksum(meta):
            raise FormatError("metadata checksum mismatch (stored %r, computed %d): the "
                              "document was damaged or edited; restore it or re-convert"
                              % (stored, meta_checksum(meta)), path)
    return meta


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _short(v) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _counts(v) -> bool:
    return isinstance(v, dict) and all(_int(c) and c >= 0 for c in v.values())


#: Optional fields readers use, with the type each must have (``None`` is always allowed):
#: a wrong type is one clear FormatError at open, not a TypeError deep in a reader.
_FIELD_TYPES = (
    ("split", lambda v: isinstance(v, str), "a string"),
    ("checksum", lambda v: isinstance(v, str), "a string"),
    ("image_encoding", lambda v: isinstance(v, str), "a string"),
    ("mask_encoding", lambda v: isinstance(v, str), "a string"),
    ("classes", lambda v: isinstance(v, list) and all(isinstance(c, str) for c in v),
     "a list of strings"),
    ("num_classes", lambda v: _int(v) and v >= 0, "a non-negative integer"),
    ("ignore_label", lambda v: _int(v) and 0 <= v <= 65535, "an integer 0..65535"),
    ("pred_offset", _int, "an integer"),
    ("palette", lambda v: isinstance(v, list) and all(
        isinstance(c, list) and len(c) == 3 and all(_int(x) and 0 <= x <= 255 for x in c)
        for c in v), "a list of [r, g, b] lists"),
    ("record_keys", lambda v: isinstance(v, list) and all(_int(k) for k in v),
     "a list of integers"),
    ("class_pixels", _counts, "an object of counts"),
    ("class_images", _counts, "an object of counts"),
    ("class_image_pixels", _counts, "an object of counts"),
    ("skipped", lambda v: isinstance(v, list), "a list"),
    ("created_by", lambda v: isinstance(v, dict), "an object"),
    ("image_size", lambda v: isinstance(v, dict), "an object"),
    ("image_stats", lambda v: isinstance(v, dict), "an object"),
)


def ids_are_keys(meta: Optional[Dict[str, Any]], container: str = "rec") -> bool:
    """Whether every record's header ``id`` must equal its key (so a reader can tell that an
    index points at the wrong record). True for our checksummed datasets, except two kinds
    written by older versions: an LMDB converted from a ``.lst`` (list indices as ids,
    positions as keys), and a conversion that skipped items (source positions as ids)."""
    if not meta or meta.get("checksum") != "crc32-id2":
        return False
    if meta.get("skipped") and CHECKSUM_FIELD not in meta:
        return False  # written before ids were renumbered past skipped items
    if container == "lmdb" and meta.get("record_keys") is None:
        return (meta.get("created_by") or {}).get("layout") != "lst"
    return True


def wrong_record(found_id: int, key: int) -> str:
    """The reason given when a record's header id is not its key."""
    return ("the record found here has id %d, not its key %d: the index points at the wrong "
            "record (offsets swapped or duplicated); rebuild it with gluon-data salvage"
            % (found_id, key))


def read_meta(rec_path: str) -> Optional[Dict[str, Any]]:
    """Metadata of a ``.rec``, or ``None`` when there is none (a stock MXNet file)."""
    path = meta_path(rec_path)
    from .recordio import _require_regular
    _require_regular(path)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise FormatError("metadata is not valid JSON (%s)" % e, path) from None
    return check_meta(meta, path)


def dumps_meta(meta: Dict[str, Any]) -> bytes:
    """Serialize deterministically (sorted keys), so equal inputs give equal files, with
    the content's checksum in ``meta_crc32`` (any previous one is recomputed)."""
    meta = {k: v for k, v in meta.items() if k != CHECKSUM_FIELD}
    meta[CHECKSUM_FIELD] = meta_checksum(meta)
    return (json.dumps(meta, indent=1, sort_keys=True) + "\n").encode("utf-8")
