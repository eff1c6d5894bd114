-- The embedding as a pgvector column with an HNSW cosine index (used when the extension exists).
CREATE EXTENSION IF NOT EXISTS vector;
ALTER TABLE cache_descriptors ADD COLUMN IF NOT EXISTS embedding vector(__EMBEDDING_DIM__);
CREATE INDEX IF NOT EXISTS cache_descriptors_embedding_hnsw
    ON cache_descriptors USING hnsw (embedding vector_cosine_ops);
