"""The node core: the lookup plan (`plan`: L1, L2, peers' L2, L3) that `reads` executes, the tiered cache
(`tiered`: writes, events, stats), and the outbox of events it owes."""
