"""The names of the objects a dataset at a URI is made of (FORMAT.md section 8)."""
from __future__ import annotations






UPLOAD_MARKER = ".uploading.json"  # PREFIX.uploading.json: an upload is in progress

LMDB_DATA = "data.mdb"  # the one file of a published environment (no lock.mdb: FORMAT.md §5)

LMDB_COMMIT = "meta.json"        # NAME.lmdb/meta.json: the commit document (FORMAT.md §8)
LMDB_MARKER = "uploading.json"   # NAME.lmdb/uploading.json: an upload in progress
LMDB_FORMAT = "gluon_data-lmdb"

def _join(base_uri: str, name: str) -> str:
    return base_uri.rsplit("/", 1)[0] + "/" + name
