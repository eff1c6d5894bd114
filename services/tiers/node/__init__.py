"""The node core: the tiered cache that walks L1, L2, peers and L3, and the outbox of events it owes."""
