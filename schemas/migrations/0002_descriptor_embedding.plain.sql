-- Without pgvector the embedding is kept as a plain array: exact-key lookups work, semantic L3 search is off.
ALTER TABLE cache_descriptors ADD COLUMN IF NOT EXISTS embedding real[];
