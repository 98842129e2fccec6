"""The on-disk format: the record codec, the decoder of record, documents, metadata and indexes (no framework)."""
