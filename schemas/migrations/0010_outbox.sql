-- The transactional outbox of the tier nodes (services/tiers/l3/store.py): the invalidation a write or
-- delete owes every node, recorded in the transaction of that write. The node publishes it at once and
-- deletes the row once the broker acknowledged it; a row older than a grace period (its node died, or
-- cannot reach the broker) is relayed by any node of the same topic, which deletes it once acknowledged.
CREATE TABLE IF NOT EXISTS cache_outbox (
    seq        bigserial PRIMARY KEY,
    event_id   text NOT NULL,
    topic      text NOT NULL,
    key        text NOT NULL,
    payload    bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS cache_outbox_due ON cache_outbox (topic, created_at);
CREATE INDEX IF NOT EXISTS cache_outbox_event ON cache_outbox (event_id);
