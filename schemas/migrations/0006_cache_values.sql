-- L3 values (docs/design.md §1.1): the LLM-aware serialization (tensor header + raw payload, see
-- services/tiers/codec.py) byte for byte, one row per descriptor; deleting the descriptor deletes it.
CREATE TABLE IF NOT EXISTS cache_values (
    key           text PRIMARY KEY REFERENCES cache_descriptors (key) ON DELETE CASCADE,
    value         bytea NOT NULL,
    checksum      bigint NOT NULL,
    updated_at_ms bigint NOT NULL
);
-- Tensors and prompt answers compress poorly and are read whole: skip TOAST compression.
ALTER TABLE cache_values ALTER COLUMN value SET STORAGE EXTERNAL;
