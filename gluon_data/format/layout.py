"""The names of the objects a dataset at a URI is made of (FORMAT.md section 8)."""
from __future__ import annotations

from ..storage.fsutil import LMDB_DATA

__all__ = ["UPLOAD_MARKER", "LMDB_DATA", "LMDB_COMMIT", "LMDB_MARKER", "LMDB_FORMAT",
           "MANIFEST_SUFFIX", "SEGMENT_SUFFIX", "sibling_uri"]

UPLOAD_MARKER = ".uploading.json"  # PREFIX.uploading.json: an upload is in progress

# LMDB_DATA (storage.fsutil): the one file of a published environment (no lock.mdb: FORMAT.md §5)

#: PREFIX.shards.json: a sharded dataset's manifest (FORMAT.md section 7)
MANIFEST_SUFFIX = ".shards.json"
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
