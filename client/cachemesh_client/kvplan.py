"""What the vLLM connector (vllm.py) loads and saves, decided without vLLM, I/O or torch: the scheduler side
of the connector keeps one `Tracked` per request and turns each engine step into a `StepPlan` the worker
side carries out.

- Load: when vLLM asks how many prompt tokens an external cache can supply beyond its own prefix cache,
  the answer is the longest run of whole blocks the tiers hold after those vLLM computed, never the whole
  prompt (vLLM must compute at least its last token). Loads are synchronous: the worker copies the
  blocks into paged memory before the step's forward pass, and a block it cannot load is reported so
  that vLLM recomputes from it (`kv_load_failure_policy: recompute`).
- Save: every full prompt block the tiers do not hold yet is saved once it is in paged memory, whether
  vLLM computed it in this step or had it in its own prefix cache; never a block the tiers supplied.
  Blocks of generated tokens are not saved (as LMCache by default).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from cachemesh_client.kvkeys import block_keys


@dataclass(frozen=True, slots=True)
class BlockCopy:
    """One block between the tiers and paged memory: its key, its position in the prompt and the paged
    block it lives in."""

    key: str
    index: int
    block_id: int


@dataclass(slots=True)
class StepPlan:
    """The worker's work for one engine step: loads (by request, before the forward pass) and saves."""

    loads: dict[str, list[BlockCopy]] = field(default_factory=dict)
    saves: list[BlockCopy] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.loads or self.saves)


@dataclass(slots=True)
class Tracked:
    """One request as the scheduler side of the connector knows it."""

    keys: list[str]  # of the prompt's full blocks
    held: int  # leading blocks the tiers held when asked
    local: int = 0  # leading blocks vLLM had computed itself (its prefix cache)
    load: int = 0  # blocks to load from the tiers, after the local ones
    saved: int = 0  # blocks [0, saved) are in the tiers (held, loaded or saved)
    block_ids: list[int] = field(default_factory=list)
    pending_load: bool = False


class Planner:
    """The scheduler side's bookkeeping, by request id."""

    def __init__(self, *, model: str, block_size: int, max_blocks: int | None = None) -> None:
        self.model = model
        self.block_size = block_size
        self.max_blocks = max_blocks
        self.requests: dict[str, Tracked] = {}

    def keys_of(self, prompt: Sequence[int], namespace: str = "") -> list[str]:
        return block_keys(
            prompt,
            model=self.model,
            block_size=self.block_size,
            namespace=namespace,
            max_blocks=self.max_blocks,
        )

    def matched(self, req_id: str, keys: list[str], held: int, prompt_len: int, num_computed: int) -> int:
        """Tokens the tiers can supply beyond the `num_computed` vLLM has, given that they hold the first
        `held` of the prompt's blocks; remembers the request. At most up to the block before the one
        holding the prompt's last token (vLLM computes that one)."""
        usable = min(held, (prompt_len - 1) // self.block_size)
        local = num_computed // self.block_size
        tracked = self.requests.get(req_id)
        if tracked is None:
            tracked = self.requests[req_id] = Tracked(keys, held)
        else:
            tracked.held = held
        tracked.local = local
        tracked.load = max(0, usable - local)
        # Everything after the tiers' prefix is saved as it reaches paged memory (from vLLM's own prefix
        # cache at once, or as it is computed); nothing before it.
        tracked.saved = min(held, len(keys))
        return tracked.load * self.block_size

    def allocated(self, req_id: str, num_external_tokens: int) -> None:
        """vLLM allocated blocks for the request, `num_external_tokens` of them to load from the tiers."""
        tracked = self.requests.get(req_id)
        if tracked is None:
            return
        if num_external_tokens <= 0:
            tracked.load = 0
        else:
            tracked.load = num_external_tokens // self.block_size
            tracked.pending_load = True

    def step(
        self,
        scheduled: Sequence[tuple[str, Sequence[int] | None, int, int, bool]],
    ) -> StepPlan:
        """One engine step: per scheduled request (id, its block ids when they changed or None, tokens
        computed before this step, tokens scheduled in it, resumed after preemption), what to load now
        and what became saveable."""
        plan = StepPlan()
        for req_id, block_ids, computed, scheduled_tokens, resumed in scheduled:
            tracked = self.requests.get(req_id)
            if tracked is None:
                continue
            if block_ids is not None:
                if resumed:
                    tracked.block_ids = list(block_ids)
                else:
                    tracked.block_ids.extend(block_ids)
            if tracked.pending_load and tracked.block_ids:
                tracked.pending_load = False
                plan.loads[req_id] = self._copies(tracked, tracked.local, tracked.local + tracked.load)
            done_blocks = min(computed + scheduled_tokens, len(tracked.keys) * self.block_size)
            done_blocks //= self.block_size
            if done_blocks > tracked.saved:
                plan.saves.extend(self._copies(tracked, tracked.saved, done_blocks))
                tracked.saved = done_blocks
        return plan

    def _copies(self, tracked: Tracked, start: int, stop: int) -> list[BlockCopy]:
        stop = min(stop, len(tracked.block_ids), len(tracked.keys))
        return [BlockCopy(tracked.keys[i], i, tracked.block_ids[i]) for i in range(start, stop)]

    def finished(self, req_id: str) -> None:
        self.requests.pop(req_id, None)
