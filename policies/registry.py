"""Build a policy by name. Each entry names its family and a builder; `capabilities` reads what the
policy class declares (size-aware, prefix-aware) without building one."""

from __future__ import annotations

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


def _lru() -> type[Policy]:
    from policies.recency.lru import LRU

    return LRU


def _lru2() -> type[Policy]:
    from policies.recency.lru_k import LRUK

    return LRUK


def _lfu() -> type[Policy]:
    from policies.frequency.lfu import LFU

    return LFU


def _arc() -> type[Policy]:
    from policies.adaptive.arc import ARC

    return ARC


def _wtinylfu() -> type[Policy]:
    from policies.adaptive.wtinylfu import WTinyLFU

    return WTinyLFU


def _lirs() -> type[Policy]:
    from policies.adaptive.lirs import LIRS

    return LIRS


def _s3fifo() -> type[Policy]:
    from policies.fifo.s3fifo import S3FIFO

    return S3FIFO


def _sieve() -> type[Policy]:
    from policies.fifo.sieve import SIEVE

    return SIEVE


def _heat() -> type[Policy]:
    from policies.learned.compiled import CompiledHeat

    return CompiledHeat


def _opt() -> type[Policy]:
    from policies.offline.opt import Belady

    return Belady


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
        PolicySpec("lru", "recency", _lru, _plain),
        PolicySpec("lfu", "frequency", _lfu, _plain),
        PolicySpec("lru2", "recency", _lru2, _build_lru2),
        PolicySpec("arc", "adaptive", _arc, _plain),
        PolicySpec("wtinylfu", "adaptive", _wtinylfu, _seeded),
        PolicySpec("lirs", "adaptive", _lirs, _plain),
        PolicySpec("s3fifo", "fifo", _s3fifo, _plain),
        PolicySpec("sieve", "fifo", _sieve, _plain),
        PolicySpec("heat", "learned", _heat, _build_heat),
        PolicySpec("opt", "offline", _opt, _build_opt),
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
