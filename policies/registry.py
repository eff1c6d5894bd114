"""Build a policy by name. Each entry names its family and a builder; `capabilities` reads what the
policy class declares (size-aware, prefix-aware) without building one."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from policies.base import Policy

Family = Literal["recency", "frequency", "adaptive", "fifo", "learned", "offline"]


@dataclass(frozen=True, slots=True)
class BuildArgs:
    capacity: int
    future: Sequence[Hashable] | np.ndarray | None
    seed: int
    heat_options: Mapping[str, object]


@dataclass(frozen=True, slots=True)
class PolicySpec:
    name: str
    family: Family
    load: Callable[[], type[Policy]]  # imported on demand: the learned policy pulls in torch
    build: Callable[[type[Policy], BuildArgs], Policy]


def _lazy(path: str) -> Callable[[], type[Policy]]:
    """The class at `module:Name`, imported when first asked for (the learned policy pulls in torch)."""
    module, _, name = path.partition(":")

    def load() -> type[Policy]:
        cls: type[Policy] = getattr(importlib.import_module(module), name)
        return cls

    return load


def _plain(cls: type[Policy], a: BuildArgs) -> Policy:
    return cls(a.capacity)


def _seeded(cls: type[Policy], a: BuildArgs) -> Policy:
    factory: Any = cls
    return factory(a.capacity, seed=a.seed)


def _build_lru2(cls: type[Policy], a: BuildArgs) -> Policy:
    factory: Any = cls
    return factory(a.capacity, k=2)


def _build_heat(cls: type[Policy], a: BuildArgs) -> Policy:
    factory: Any = cls
    return factory(a.capacity, seed=a.seed, **dict(a.heat_options))


def _build_opt(cls: type[Policy], a: BuildArgs) -> Policy:
    if a.future is None:
        raise ValueError("opt needs the future key sequence")
    factory: Any = cls
    return factory(a.capacity, a.future)


REGISTRY: dict[str, PolicySpec] = {
    spec.name: spec
    for spec in (
        PolicySpec("lru", "recency", _lazy("policies.recency.lru:LRU"), _plain),
        PolicySpec("lfu", "frequency", _lazy("policies.frequency.lfu:LFU"), _plain),
        PolicySpec("lru2", "recency", _lazy("policies.recency.lru_k:LRUK"), _build_lru2),
        PolicySpec("arc", "adaptive", _lazy("policies.adaptive.arc:ARC"), _plain),
        PolicySpec("wtinylfu", "adaptive", _lazy("policies.adaptive.wtinylfu:WTinyLFU"), _seeded),
        PolicySpec("lirs", "adaptive", _lazy("policies.adaptive.lirs:LIRS"), _plain),
        PolicySpec("s3fifo", "fifo", _lazy("policies.fifo.s3fifo:S3FIFO"), _plain),
        PolicySpec("sieve", "fifo", _lazy("policies.fifo.sieve:SIEVE"), _plain),
        PolicySpec("heat", "learned", _lazy("policies.learned.compiled:CompiledHeat"), _build_heat),
        PolicySpec("opt", "offline", _lazy("policies.offline.opt:Belady"), _build_opt),
    )
}

CLASSIC = ("lru", "lfu", "lru2", "arc", "wtinylfu", "lirs", "s3fifo", "sieve")
AI = tuple(name for name, spec in REGISTRY.items() if spec.family == "learned")
OFFLINE = tuple(name for name, spec in REGISTRY.items() if spec.family == "offline")
ALL = (*CLASSIC, *AI, *OFFLINE)


def spec(name: str) -> PolicySpec:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(ALL)}") from None


def capabilities(name: str) -> dict[str, bool]:
    cls = spec(name).load()
    return {"size_aware": cls.size_aware, "prefix_aware": cls.prefix_aware}


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
    s = spec(name)
    return s.build(s.load(), BuildArgs(capacity, future, seed, heat_options or {}))
