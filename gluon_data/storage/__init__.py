"""Where bytes live: files, locks, ownership-free writes, the cache, fsspec access (no format knowledge)."""
