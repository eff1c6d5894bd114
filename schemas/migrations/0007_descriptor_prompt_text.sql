-- The prompt an entry answers (when it was written by text), for the match guards of semantic lookups.
ALTER TABLE cache_descriptors ADD COLUMN IF NOT EXISTS prompt_text text;
