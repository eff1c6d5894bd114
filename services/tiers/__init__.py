"""The cache tiers (DESIGN.md §1): L1 in-process (`l1`, `cuckoo`, `vector_index`), the L2 block pool
(`block_pool`) and its node-to-node `transport`, and the LLM-aware value `codec`."""
