"""Replacement policies behind one interface (`base.Policy`), and a registry to build them by name."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import numpy as np

from services.heat.policies.arc import ARC
from services.heat.policies.base import AccessMeta, Eviction, EvictionReason, Policy
from services.heat.policies.lfu import LFU
from services.heat.policies.lirs import LIRS
from services.heat.policies.lru import LRU
from services.heat.policies.lru_k import LRUK
from services.heat.policies.opt import Belady
from services.heat.policies.tinylfu import WTinyLFU

CLASSIC = ("lru", "lfu", "lru2", "arc", "wtinylfu", "lirs")
AI = ("heat",)
OFFLINE = ("opt",)
ALL = (*CLASSIC, *AI, *OFFLINE)


def make_policy(
    name: str,
    capacity: int,
    *,
    future: Sequence[Hashable] | np.ndarray | None = None,
    seed: int = 0,
    heat_options: Mapping[str, object] | None = None,
) -> Policy:
    """Build a policy by registry name. `future` (the whole key sequence) is required by `opt`;
    `heat_options` are keyword arguments for `HeatPolicy` (experiments with its parameters)."""
    if name == "lru":
        return LRU(capacity)
    if name == "lfu":
        return LFU(capacity)
    if name == "lru2":
        return LRUK(capacity, k=2)
    if name == "arc":
        return ARC(capacity)
    if name == "wtinylfu":
        return WTinyLFU(capacity, seed=seed)
    if name == "lirs":
        return LIRS(capacity)
    if name == "heat":
        # Imported here: the heat policy pulls in torch, which the classic policies do not need.
        from services.heat.policies.heat import HeatPolicy

        return HeatPolicy(capacity, seed=seed, **dict(heat_options or {}))  # type: ignore[arg-type]
    if name == "opt":
        if future is None:
            raise ValueError("opt needs the future key sequence")
        return Belady(capacity, future)
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(ALL)}")


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
    "AccessMeta",
    "Belady",
    "Eviction",
    "EvictionReason",
    "Policy",
    "WTinyLFU",
    "make_policy",
]
