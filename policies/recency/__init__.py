"""Recency policies: LRU and LRU-K."""
