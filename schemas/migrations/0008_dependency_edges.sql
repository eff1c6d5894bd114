-- The dependency index of the invalidation service: one edge per (what an entry depends on, the entry),
-- kept by a trigger on cache_descriptors. A deleted descriptor's edges stay, marked orphaned, until the
-- invalidation service has followed them (a tier node may delete a conversation's entries first, and
-- what depends on those must still be found); orphans older than a grace period are collected.
CREATE TABLE IF NOT EXISTS cache_dependency_edges (
    depends_on     text NOT NULL,
    via            text NOT NULL CHECK (via IN ('dependency', 'trace')),
    dependant      text NOT NULL,
    orphaned_at_ms bigint,
    PRIMARY KEY (depends_on, via, dependant)
);
CREATE INDEX IF NOT EXISTS cache_dependency_edges_dependant ON cache_dependency_edges (dependant);
CREATE INDEX IF NOT EXISTS cache_dependency_edges_orphaned
    ON cache_dependency_edges (orphaned_at_ms) WHERE orphaned_at_ms IS NOT NULL;

CREATE OR REPLACE FUNCTION cache_dependency_edges_sync() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        UPDATE cache_dependency_edges
            SET orphaned_at_ms = (extract(epoch FROM clock_timestamp()) * 1000)::bigint
            WHERE dependant = OLD.key AND orphaned_at_ms IS NULL;
        RETURN OLD;
    END IF;
    -- Most upserts rewrite a value, not its dependencies: leave the edges alone then.
    IF TG_OP = 'UPDATE'
       AND NEW.context_dependency_ids IS NOT DISTINCT FROM OLD.context_dependency_ids
       AND NEW.trace_id IS NOT DISTINCT FROM OLD.trace_id THEN
        RETURN NEW;
    END IF;
    DELETE FROM cache_dependency_edges WHERE dependant = NEW.key;
    INSERT INTO cache_dependency_edges (depends_on, via, dependant)
        SELECT DISTINCT d, 'dependency', NEW.key FROM unnest(NEW.context_dependency_ids) AS d
        UNION
        SELECT NEW.trace_id, 'trace', NEW.key WHERE NEW.trace_id IS NOT NULL
        ON CONFLICT DO NOTHING;
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS cache_dependency_edges_sync ON cache_descriptors;
CREATE TRIGGER cache_dependency_edges_sync
    AFTER INSERT OR UPDATE OF context_dependency_ids, trace_id OR DELETE ON cache_descriptors
    FOR EACH ROW EXECUTE FUNCTION cache_dependency_edges_sync();

-- Entries written before this migration.
INSERT INTO cache_dependency_edges (depends_on, via, dependant)
    SELECT DISTINCT d, 'dependency', key FROM cache_descriptors, unnest(context_dependency_ids) AS d
    UNION
    SELECT trace_id, 'trace', key FROM cache_descriptors WHERE trace_id IS NOT NULL
    ON CONFLICT DO NOTHING;
