"""δ, the bound on the rate of wrong answers served, per model (or any group name the caller uses), with
a default: which δ a candidate's learner works to (matching/decision.py).

A table is parsed from `{"gpt-4o": 0.01, "support-*": 0.05}` (a JSON object, as the node's
CACHEMESH_TIERS_MATCH_DELTA_BY setting holds it): an exact name wins, then the longest matching
pattern with a trailing `*`, then the default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


def _check(delta: float, name: str) -> float:
    if not 0.0 < delta < 0.5:
        raise ValueError(f"δ for {name!r} must be in (0, 0.5), got {delta}")
    return float(delta)


@dataclass(frozen=True)
class DeltaTable:
    by_group: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, delta in self.by_group.items():
            if not name or name == "*":
                raise ValueError("a δ table key must name a model or a prefix pattern ending in *")
            _check(delta, name)

    def delta_for(self, group: str, default: float) -> float:
        if group in self.by_group:
            return self.by_group[group]
        prefixes = [k for k in self.by_group if k.endswith("*") and group.startswith(k[:-1])]
        return self.by_group[max(prefixes, key=len)] if prefixes else default
