"""Dataset metadata: the JSON document stored beside a ``.rec`` (``PREFIX.meta.json``).

The schema is documented in ``FORMAT.md``. A ``.rec`` without metadata is a stock MXNet
file (e.g. from ``im2rec``): it is readable as classification data, without checksums.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional

from .documents import CHECKSUM_FIELD, check_document, content_crc32, load_document
from ..storage.fileio import read_input

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


def meta_checksum(meta: Dict[str, Any]) -> int:
    """CRC-32 of a metadata document's content (every field but :data:`CHECKSUM_FIELD`),
    serialized canonically: sorted keys, no whitespace, ASCII. Layout and whitespace of the
    file do not matter; any change of a value does."""
    return content_crc32(meta)


def check_meta(meta: Any, path: str) -> Dict[str, Any]:
    """Validate a metadata document; raise :class:`FormatError` naming ``path`` if wrong.

    The schema (required fields, the type of every field readers use) is the ``meta`` kind
    of :mod:`gluon_data.format.documents`. A document carrying ``meta_crc32`` (every one written
    since it was introduced) must match it, so a damaged value (``ignore_label``,
    ``num_records``...) is an error, not a silently different dataset."""
    return check_document(meta, "meta", path)


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
    try:  # the input-kind rule first: a FIFO or device here is refused, never opened
        raw = read_input(path)
    except FileNotFoundError:
        return None
    return load_document(raw, "meta", path)


def dumps_meta(meta: Dict[str, Any]) -> bytes:
    """Serialize deterministically (sorted keys), so equal inputs give equal files, with
    the content's checksum in ``meta_crc32`` (any previous one is recomputed)."""
    meta = {k: v for k, v in meta.items() if k != CHECKSUM_FIELD}
    meta[CHECKSUM_FIELD] = meta_checksum(meta)
    return (json.dumps(meta, indent=1, sort_keys=True) + "\n").encode("utf-8")
