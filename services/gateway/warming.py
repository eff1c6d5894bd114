"""Warming an engine for a conversation's next turn, decided without I/O.

The warmup service predicts when a conversation's next turn is near and which of its KV blocks have left
the engine since (services/warmup/conversations.py); its command names the conversation (`trace_id`) and
when the turn is expected (`deadline_ms`). The gateway is where the conversation's prompt and instance
are known: it remembers each conversation's latest prompt (token ids) and the instance it was routed to,
and answers a command with a prefill of that prompt (`max_tokens: 1`) on that instance. The engine then
finds what its own cache lost in the tiers (the connector loads it) or computes it, before the turn
arrives instead of while it waits.

When: a warmed block lives in an engine until the engine has stored about a pool's worth of newer
blocks, so at the rate the instance stores blocks (its KV events) a warm survives `pool / rate`. A warm
sent earlier than `survive_fraction` of that before the expected turn would be evicted before it is
read: the command waits until then. A warm goes only to an idle instance (nothing in flight from here,
nothing queued): a speculative prefill must never delay a real request; a busy instance is tried again
every `retry_ms` until the turn is overdue. The turn arriving first cancels the warm (`overtaken`).

Each warm has an outcome, decided by the conversation's next request: `used` when it was routed to the
warmed instance and found the warmed prompt still there (its last full block held), `wasted` when it went
elsewhere or the blocks were evicted first. What warming costs is the prefill: the tokens the instance
did not hold when it was warmed.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Prompt:
    instance: str
    model: str
    ids: tuple[int, ...]
    keys: tuple[str, ...]  # its full blocks' content keys


@dataclass(frozen=True, slots=True)
class Warm:
    """A prefill to send: `ids` on `instance`, for `conversation`."""

    conversation: str
    instance: str
    model: str
    ids: tuple[int, ...]
    keys: tuple[str, ...]
    held_blocks: int  # of `keys`, what the instance held when the warm was decided
    sent_at_ms: int = 0


@dataclass(slots=True)
class _Armed:
    """A command not answered yet: when to look at it next, and when to give up."""

    next_at_ms: int
    due_ms: int | None
    give_up_ms: int
    deferred: bool = False


class Turnover:
    """How long a block just stored in an instance stays there: its KV pool over the rate it stores
    blocks, from (time, blocks stored so far) samples over the last `window_ms`."""

    def __init__(self, window_ms: int = 30_000) -> None:
        self.window_ms = window_ms
        self._samples: deque[tuple[int, int]] = deque()

    def sample(self, now_ms: int, stored_total: int) -> None:
        self._samples.append((now_ms, stored_total))
        while len(self._samples) > 2 and now_ms - self._samples[1][0] >= self.window_ms:
            self._samples.popleft()

    def rate_per_ms(self) -> float | None:
        if len(self._samples) < 2:
            return None
        (t0, n0), (t1, n1) = self._samples[0], self._samples[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else None

    def survive_ms(self, pool_blocks: int | None) -> float | None:
        """None while unknown (no pool size or too few samples); infinite when nothing is stored."""
        rate = self.rate_per_ms()
        if pool_blocks is None or rate is None:
            return None
        return pool_blocks / rate if rate > 0 else float("inf")


@dataclass
class WarmCounts:
    commands: int = 0
    sent: int = 0
    unknown: int = 0  # a conversation this gateway has no prompt of (another gateway routes it)
    busy: int = 0  # the instance had work until the turn was overdue: not warmed
    already_held: int = 0  # the instance held the whole prompt: nothing to warm
    deferred: int = 0  # commands that waited for the turn to be near enough for the warm to survive
    overtaken: int = 0  # the turn came before the warm went out
    failed: int = 0
    used: int = 0
    wasted: int = 0
    evicted: int = 0  # of `wasted`: the turn came to the warmed instance, the blocks had gone
    prefill_tokens: int = 0  # tokens the warmed instances did not hold (recomputed or loaded)
    lead_ms_total: float = 0.0  # from each judged warm to its turn

    def precision(self) -> float | None:
        judged = self.used + self.wasted
        return self.used / judged if judged else None

    def as_dict(self) -> dict[str, float | int | None]:
        judged = self.used + self.wasted
        return {
            "commands": self.commands,
            "sent": self.sent,
            "unknown": self.unknown,
            "busy": self.busy,
            "already_held": self.already_held,
            "deferred": self.deferred,
            "overtaken": self.overtaken,
            "failed": self.failed,
            "used": self.used,
            "wasted": self.wasted,
            "evicted": self.evicted,
            "prefill_tokens": self.prefill_tokens,
            "lead_ms_mean": self.lead_ms_total / judged if judged else None,
            "precision": self.precision(),
        }


@dataclass
class EngineWarmer:
    max_conversations: int = 4_096
    block_size: int = 32
    survive_fraction: float = 0.5  # send no earlier than this share of a warm's life before the turn
    retry_ms: int = 100  # a busy instance is looked at again after this
    max_wait_ms: int = 10_000  # without a turn time, how long a command waits for an idle instance
    counts: WarmCounts = field(default_factory=WarmCounts)
    _prompts: OrderedDict[str, Prompt] = field(default_factory=OrderedDict)
    _armed: OrderedDict[str, _Armed] = field(default_factory=OrderedDict)  # commands not answered yet
    _pending: OrderedDict[str, Warm] = field(default_factory=OrderedDict)  # warms not judged yet

    def routed(self, conversation: str, instance: str, model: str, ids: list[int], keys: list[str]) -> None:
        """A request of `conversation` went to `instance` with this prompt, for `model`."""
        if self._armed.pop(conversation, None) is not None:
            self.counts.overtaken += 1
        self._prompts.pop(conversation, None)
        self._prompts[conversation] = Prompt(instance, model, tuple(ids), tuple(keys))
        while len(self._prompts) > self.max_conversations:
            self._prompts.popitem(last=False)

    def judge(self, conversation: str, instance: str, still_held: bool, now_ms: int = 0) -> str | None:
        """The conversation's next request went to `instance`; `still_held`: the warmed prompt's last
        block was still in that instance when it arrived. The warm's outcome, if one was pending."""
        warm = self._pending.pop(conversation, None)
        if warm is None:
            return None
        self.counts.lead_ms_total += max(0, now_ms - warm.sent_at_ms)
        if warm.instance == instance and still_held:
            self.counts.used += 1
            return "used"
        self.counts.wasted += 1
        if warm.instance == instance:
            self.counts.evicted += 1
        return "wasted"

    def prompt_keys(self, conversation: str) -> tuple[str, ...]:
        prompt = self._prompts.get(conversation)
        return prompt.keys if prompt is not None else ()

    def pending(self, conversation: str) -> Warm | None:
        return self._pending.get(conversation)

    def armed(self) -> int:
        return len(self._armed)

    def on_command(self, conversation: str, now_ms: int, due_ms: int | None = None) -> None:
        """A warmup command for `conversation`, whose next turn is expected at `due_ms` (if known):
        `ready` answers it when it is time."""
        self.counts.commands += 1
        if conversation not in self._prompts:
            self.counts.unknown += 1
            return
        give_up = (due_ms if due_ms is not None else now_ms) + self.max_wait_ms
        self._armed.pop(conversation, None)
        self._armed[conversation] = _Armed(now_ms, due_ms, give_up)
        while len(self._armed) > self.max_conversations:
            self._armed.popitem(last=False)

    def ready(
        self,
        now_ms: int,
        *,
        idle: Mapping[str, bool],
        held: Callable[[tuple[str, ...], str], int],
        survive_ms: Callable[[str], float | None],
    ) -> list[Warm]:
        """The prefills to send now. `idle`: which instances have nothing in flight or queued;
        `held(keys, instance)`: how many leading blocks of `keys` the instance holds; `survive_ms`: how
        long a warm lasts in the instance (Turnover), None while unknown."""
        out: list[Warm] = []
        for conversation, armed in list(self._armed.items()):
            if armed.next_at_ms > now_ms:
                continue
            prompt = self._prompts.get(conversation)
            if prompt is None or prompt.instance not in idle:
                del self._armed[conversation]
                self.counts.unknown += 1
                continue
            have = held(prompt.keys, prompt.instance)
            if have >= len(prompt.keys):  # (a prompt under a block has nothing to keep either)
                del self._armed[conversation]
                self.counts.already_held += 1
                continue
            life = survive_ms(prompt.instance)
            if armed.due_ms is not None and life is not None and life != float("inf"):
                start = int(armed.due_ms - self.survive_fraction * life)
                armed.give_up_ms = armed.due_ms + int(self.survive_fraction * life)
                if now_ms < start:
                    armed.next_at_ms = start
                    if not armed.deferred:
                        armed.deferred = True
                        self.counts.deferred += 1
                    continue
            if not idle[prompt.instance]:
                if now_ms >= armed.give_up_ms:
                    del self._armed[conversation]
                    self.counts.busy += 1
                else:
                    armed.next_at_ms = now_ms + self.retry_ms
                continue
            del self._armed[conversation]
            warm = Warm(conversation, prompt.instance, prompt.model, prompt.ids, prompt.keys, have, now_ms)
            self._pending.pop(conversation, None)
            self._pending[conversation] = warm
            while len(self._pending) > self.max_conversations:
                self._pending.popitem(last=False)
            self.counts.sent += 1
            self.counts.prefill_tokens += max(0, len(prompt.ids) - have * self.block_size)
            out.append(warm)
        return out

    def failed(self, warm: Warm) -> None:
        """The prefill did not go through: nothing to judge."""
        if self._pending.get(warm.conversation) is warm:
            del self._pending[warm.conversation]
        self.counts.sent -= 1
        self.counts.failed += 1
        self.counts.prefill_tokens -= max(0, len(warm.ids) - warm.held_blocks * self.block_size)
