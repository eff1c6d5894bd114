-- The inbox: a consumer records each event_id it applied in the same transaction as the effect,
-- so a redelivered event (at-least-once Kafka) is applied exactly once in effect.
CREATE TABLE IF NOT EXISTS processed_events (
    consumer_group  text NOT NULL,
    event_id        text NOT NULL,
    processed_at_ms bigint NOT NULL,
    PRIMARY KEY (consumer_group, event_id)
);
CREATE INDEX IF NOT EXISTS processed_events_age ON processed_events (processed_at_ms);
