-- Cache descriptors (docs/design.md §1.1): one row per entry; values live in the tiers.
CREATE TABLE IF NOT EXISTS cache_descriptors (
    key                    text PRIMARY KEY CHECK (length(key) BETWEEN 1 AND 512),
    kind                   text NOT NULL CHECK (kind IN ('prompt', 'embedding', 'kv_block')),
    model                  text NOT NULL,
    ttl_hint_ms            bigint CHECK (ttl_hint_ms > 0),
    similarity_tolerance   real NOT NULL DEFAULT 0.92 CHECK (similarity_tolerance BETWEEN 0 AND 1),
    context_dependency_ids text[] NOT NULL DEFAULT '{}',
    trace_id               text,
    size_bytes             bigint NOT NULL DEFAULT 0 CHECK (size_bytes >= 0),
    tier                   text NOT NULL DEFAULT 'l1' CHECK (tier IN ('l1', 'l2', 'l3')),
    created_at_ms          bigint NOT NULL,
    updated_at_ms          bigint NOT NULL,
    last_access_ms         bigint,
    expires_at_ms          bigint GENERATED ALWAYS AS (updated_at_ms + ttl_hint_ms) STORED
);
CREATE INDEX IF NOT EXISTS cache_descriptors_trace_id ON cache_descriptors (trace_id) WHERE trace_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS cache_descriptors_model ON cache_descriptors (model);
CREATE INDEX IF NOT EXISTS cache_descriptors_expires ON cache_descriptors (expires_at_ms) WHERE expires_at_ms IS NOT NULL;
CREATE INDEX IF NOT EXISTS cache_descriptors_dependencies ON cache_descriptors USING gin (context_dependency_ids);
