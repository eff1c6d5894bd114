"""KV-aware routing over several engine instances, decided without I/O: which instance serves a request,
and why.

Reference: llm-d's prefix-aware scorer and NVIDIA Dynamo's KV router; here the shared tiers count too.
An instance's score, in blocks of prompt a request need not compute:

    held + tier_value * from_tiers - pending - load_cost * waiting

The conversation's instance wins unless another scores `affinity_slack` blocks more; equal scores go
to the least loaded, then the fewest `written_blocks`. The terms: docs/gateway.md ("KV-aware routing").
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

Reason = Literal["prefix", "tiers", "affinity", "load", "only"]


@dataclass
class Instance:
    """One engine as the router sees it: its blocks (by content key, from its KV events) and load."""

    name: str
    capacity_blocks: int = 1_000_000  # bound on the blocks remembered (its KV pool, when known)
    healthy: bool = True
    in_flight: int = 0
    pending_blocks: float = 0.0  # blocks of prompt its requests in flight from here still compute
    waiting: int = 0  # requests queued in the engine (vllm:num_requests_waiting)
    blocks: OrderedDict[str, None] = field(default_factory=OrderedDict)
    sent_blocks: int = 0  # blocks of prompt sent to it from here, ever (how fast it turns its pool over)
    written_blocks: int = 0  # of those, past its own prefix: written into its pool (computed or loaded)

    def stored(self, key: str) -> None:
        self.blocks[key] = None
        self.blocks.move_to_end(key)
        while len(self.blocks) > self.capacity_blocks:
            self.blocks.popitem(last=False)

    def removed(self, key: str) -> None:
        self.blocks.pop(key, None)

    def cleared(self) -> None:
        self.blocks.clear()

    def prefix(self, keys: Sequence[str]) -> int:
        """How many leading blocks of `keys` this instance holds."""
        n = 0
        for key in keys:
            if key not in self.blocks:
                break
            n += 1
        return n

    @property
    def load(self) -> int:
        return self.in_flight + self.waiting

    def cost(self, weights: Weights) -> float:
        """The blocks of compute a new request would wait behind here."""
        return self.pending_blocks + weights.load_cost * self.waiting


@dataclass(frozen=True, slots=True)
class Choice:
    instance: str
    reason: Reason
    predicted_blocks: int  # blocks it need not compute: its own prefix plus what the tiers supply
    held_blocks: int  # of those, in its own prefix cache
    score: float


@dataclass(frozen=True, slots=True)
class Weights:
    tier_value: float = 0.8  # a block loaded from the tiers, against one held (1.0) or computed (0.0)
    load_cost: float = 4.0  # blocks a request queued in the engine (not sent from here) is worth
    affinity_slack: float = 8.0  # how much better another instance must score to move a conversation


DEFAULT_WEIGHTS = Weights()


def choose(
    instances: Iterable[Instance],
    keys: Sequence[str],
    tiers_held: int,
    *,
    sticky: str | None = None,
    weights: Weights = DEFAULT_WEIGHTS,
) -> Choice | None:
    """The instance for a request whose prompt has block `keys`, of which the tiers hold the first
    `tiers_held`; `sticky` is the instance its conversation was on. None when no instance is healthy."""
    scored: list[tuple[float, int, int, Instance]] = []
    for inst in instances:
        if not inst.healthy:
            continue
        held = inst.prefix(keys)
        from_tiers = max(0, tiers_held - held)
        score = held + weights.tier_value * from_tiers - inst.cost(weights)
        scored.append((score, held, from_tiers, inst))
    if not scored:
        return None
    # Highest score; ties to the least loaded, then to the pool written least, then by name.
    scored.sort(key=lambda s: (-s[0], s[3].load, s[3].written_blocks, s[3].name))
    best_score, best_held, best_tiers, best = scored[0]
    if len(scored) == 1:
        return Choice(best.name, "only", best_held + best_tiers, best_held, best_score)
    if sticky is not None:
        for score, held, tiers, inst in scored:
            if inst.name == sticky and score + weights.affinity_slack >= best_score:
                return Choice(inst.name, "affinity", held + tiers, held, score)
    runner_up = scored[1]
    if best_held > runner_up[1]:
        reason: Reason = "prefix"
    elif best_tiers > 0 and best_held + best_tiers > runner_up[1] + runner_up[2]:
        reason = "tiers"
    else:
        reason = "load"
    return Choice(best.name, reason, best_held + best_tiers, best_held, best_score)
