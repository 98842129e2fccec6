"""Where bytes live: files, locks, ownership-free writes, the cache, fsspec access, shared
memory between a loader's processes (no format knowledge)."""
