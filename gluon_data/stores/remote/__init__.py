"""Datasets in object storage through fsspec: what a location holds, ranged reads, the commit protocol, the remote store."""
