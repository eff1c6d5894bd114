"""Replacement policies behind one interface (`base.Policy`), grouped by family — `recency` (LRU,
LRU-K), `frequency` (LFU), `adaptive` (ARC, LIRS, W-TinyLFU), `fifo` (S3-FIFO, SIEVE), `learned`
(heat), `offline` (Belady) — with admission (`admission`: TinyLFU over a count-min sketch) apart,
and a registry (`registry`) that builds one by name. Nothing here does I/O or imports a service."""

from __future__ import annotations

from policies.adaptive.arc import ARC
from policies.adaptive.lirs import LIRS
from policies.adaptive.wtinylfu import WTinyLFU
from policies.base import AccessMeta, Eviction, EvictionReason, Policy
from policies.fifo.s3fifo import S3FIFO
from policies.fifo.sieve import SIEVE
from policies.frequency.lfu import LFU
from policies.offline.opt import Belady
from policies.recency.lru import LRU
from policies.recency.lru_k import LRUK
from policies.registry import AI, ALL, CLASSIC, OFFLINE, REGISTRY, capabilities, make_policy

__all__ = [
    "AI",
    "ALL",
    "ARC",
    "CLASSIC",
    "LFU",
    "LIRS",
    "LRU",
    "LRUK",
    "OFFLINE",
    "REGISTRY",
    "S3FIFO",
    "SIEVE",
    "AccessMeta",
    "Belady",
    "Eviction",
    "EvictionReason",
    "Policy",
    "WTinyLFU",
    "capabilities",
    "make_policy",
]
