"""The cache tiers (DESIGN.md §1): L1 in-process (`l1`, `cuckoo`, `vector_index`), the L2 block pool
(`block_pool`, `l2`) and its node-to-node `transport`, L3 on Postgres (`l3_store`), the LLM-aware value
`codec`, and the node that ties them together (`tiered`, `api`, `service`; `client` for callers)."""
