"""L2: encoded values in the block pool (`block_pool`, `store`); `net` shares the pool with other nodes."""
