"""L1, in process: the cuckoo table for exact keys, the vector index for near-duplicates, the L1 cache."""
