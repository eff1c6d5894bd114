"""A tier node (docs/design.md §1.1), in wings: `l1` (in process: cuckoo table, vector index), `l2` (the
block pool; `l2/net` shares it with other nodes), `l3` (Postgres and its breaker), `node` (the core: the
lookup plan, the tiered cache, the outbox) and `edge` (HTTP API, client, embedder). At the top: `ports`
(what the core needs from L3 and the peers), `settings` (a leaf), `entry` and `codec` (values), `service`."""
