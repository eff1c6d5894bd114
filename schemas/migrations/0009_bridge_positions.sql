-- How far the vLLM KV-event bridge has forwarded each engine's stream (services/bridge): the last
-- sequence number produced to kv.events.v1 within the engine's epoch (a restart of the engine begins
-- a new epoch). On start the bridge asks the engine's replay socket for everything after it.
CREATE TABLE IF NOT EXISTS bridge_positions (
    engine_id     text PRIMARY KEY,
    epoch         integer NOT NULL,
    seq           bigint NOT NULL,
    updated_at_ms bigint NOT NULL
);
