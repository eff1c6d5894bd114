-- Free-form semantic tags per entry, queryable by tag and value.
CREATE TABLE IF NOT EXISTS semantic_tags (
    key   text NOT NULL REFERENCES cache_descriptors (key) ON DELETE CASCADE,
    tag   text NOT NULL CHECK (length(tag) BETWEEN 1 AND 128),
    value text NOT NULL,
    PRIMARY KEY (key, tag)
);
CREATE INDEX IF NOT EXISTS semantic_tags_tag_value ON semantic_tags (tag, value);
