"""The names a dataset's files and objects take: a sharded dataset's manifest and shards, the
objects of a dataset at a URI (FORMAT.md sections 7 and 8), and what lies beside a missing
``.rec``."""
from __future__ import annotations

import os
import re

from ..storage.fsutil import LMDB_DATA

__all__ = ["UPLOAD_MARKER", "LMDB_DATA", "LMDB_COMMIT", "LMDB_MARKER", "LMDB_FORMAT",
           "MANIFEST_SUFFIX", "SEGMENT_SUFFIX", "SHARD_PART", "sibling_uri", "missing_rec_hint"]

UPLOAD_MARKER = ".uploading.json"  # PREFIX.uploading.json: an upload is in progress

# LMDB_DATA (storage.fsutil): the one file of a published environment (no lock.mdb: FORMAT.md §5)

#: PREFIX.shards.json: a sharded dataset's manifest (FORMAT.md section 7)
MANIFEST_SUFFIX = ".shards.json"
#: What follows a shard's prefix in its name: ``PREFIX-00003-of-00016.rec`` (``.lmdb``...).
SHARD_PART = re.compile(r"-\d{5}-of-\d{5}(\.|$)")
#: The name ending of a conversion worker's segment file (framed records a writer appends).
SEGMENT_SUFFIX = ".seg"

LMDB_COMMIT = "meta.json"        # NAME.lmdb/meta.json: the commit document (FORMAT.md §8)
LMDB_MARKER = "uploading.json"   # NAME.lmdb/uploading.json: an upload in progress
LMDB_FORMAT = "gluon_data-lmdb"


def sibling_uri(base_uri: str, name: str) -> str:
    """The URI of the object ``name`` beside ``base_uri`` (in the same folder).

    >>> sibling_uri("s3://bucket/data/train.rec", "train.idx")
    's3://bucket/data/train.idx'
    """
    return base_uri.rsplit("/", 1)[0] + "/" + name


def missing_rec_hint(path: str, shown: int = 4) -> str:
    """What lies beside a ``.rec`` that is not there, for the error naming it: the manifests
    of its shards (a sharded conversion writes ``NAME.shards.json``, or ``NAME_<split>.
    shards.json``, and no ``NAME.rec``), else the files of its splits (``NAME_train.rec``...);
    at most ``shown`` names."""
    folder, name = os.path.split(os.path.abspath(path))
    if not name.endswith(".rec"):
        return ""
    stem = name[:-len(".rec")]
    try:
        mine = sorted(f for f in os.listdir(folder) if f.startswith((stem + "_", stem + ".")))
    except OSError:
        return ""
    manifests = [f for f in mine if f.endswith(MANIFEST_SUFFIX)]
    splits = [f for f in mine if f.endswith(".rec") and f != name and not SHARD_PART.search(f)]

    def names(found):
        return ", ".join(os.path.join(os.path.dirname(path), f) for f in found[:shown]) + (
            ", ..." if len(found) > shown else "")
    if manifests:
        return ("; beside it, the manifest of a sharded dataset: %s (open that; each shard is "
                "a .rec of its own)" % names(manifests))
    return "; beside it, one file per split: %s" % names(splits) if splits else ""
