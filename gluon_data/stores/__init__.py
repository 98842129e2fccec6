""""Record i" from somewhere: RecordIO, LMDB, legacy, sharded and remote stores behind one protocol."""
