"""verify, salvage, statistics, previews and progress: tools over any store."""
