"""Warming an engine for a conversation's next turn, decided without I/O.

The warmup service predicts when a conversation's next turn is near and which of its KV blocks have left
the engine since (services/warmup/conversations.py); its command names the conversation (`trace_id`).
The gateway is where the conversation's prompt and instance are known: it remembers each conversation's
latest prompt (token ids) and the instance it was routed to, and answers a command with a prefill of
that prompt (`max_tokens: 1`) on that instance. The engine then finds what its own cache lost in the
tiers (the connector loads it) or computes it, before the turn arrives instead of while it waits.

A warm goes only to an idle instance (nothing in flight from here, nothing queued): a speculative prefill
must never delay a real request. Each warm has an outcome, decided by the conversation's next request:
`used` when it was routed to the warmed instance and found the warmed prompt still there (its last full
block held), `wasted` when it went elsewhere or the blocks were evicted first. What warming costs is the
prefill: the tokens the instance did not hold when it was warmed.
"""

from __future__ import annotations

from collections import OrderedDict
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


@dataclass
class WarmCounts:
    commands: int = 0
    sent: int = 0
    unknown: int = 0  # a conversation this gateway has no prompt of (another gateway routes it)
    busy: int = 0  # the instance had work: not warmed
    already_held: int = 0  # the instance held the whole prompt: nothing to warm
    failed: int = 0
    used: int = 0
    wasted: int = 0
    prefill_tokens: int = 0  # tokens the warmed instances did not hold (recomputed or loaded)

    def precision(self) -> float | None:
        judged = self.used + self.wasted
        return self.used / judged if judged else None

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "commands": self.commands,
            "sent": self.sent,
            "unknown": self.unknown,
            "busy": self.busy,
            "already_held": self.already_held,
            "failed": self.failed,
            "used": self.used,
            "wasted": self.wasted,
            "prefill_tokens": self.prefill_tokens,
            "precision": self.precision(),
        }


@dataclass
class EngineWarmer:
    max_conversations: int = 4_096
    block_size: int = 32
    counts: WarmCounts = field(default_factory=WarmCounts)
    _prompts: OrderedDict[str, Prompt] = field(default_factory=OrderedDict)
    _pending: OrderedDict[str, Warm] = field(default_factory=OrderedDict)  # warms not judged yet

    def routed(self, conversation: str, instance: str, model: str, ids: list[int], keys: list[str]) -> None:
        """A request of `conversation` went to `instance` with this prompt, for `model`."""
        self._prompts.pop(conversation, None)
        self._prompts[conversation] = Prompt(instance, model, tuple(ids), tuple(keys))
        while len(self._prompts) > self.max_conversations:
            self._prompts.popitem(last=False)

    def judge(self, conversation: str, instance: str, still_held: bool) -> str | None:
        """The conversation's next request went to `instance`; `still_held`: the warmed prompt's last
        block was still in that instance when it arrived. The warm's outcome, if one was pending."""
        warm = self._pending.pop(conversation, None)
        if warm is None:
            return None
        if warm.instance == instance and still_held:
            self.counts.used += 1
            return "used"
        self.counts.wasted += 1
        return "wasted"

    def prompt_keys(self, conversation: str) -> tuple[str, ...]:
        prompt = self._prompts.get(conversation)
        return prompt.keys if prompt is not None else ()

    def pending(self, conversation: str) -> Warm | None:
        return self._pending.get(conversation)

    def on_command(self, conversation: str, *, idle: dict[str, bool], held: dict[str, int]) -> Warm | None:
        """A warmup command for `conversation`: the prefill to send, or None (and why, counted).
        `idle`: which instances have nothing in flight or queued; `held`: how many leading blocks of
        the conversation's prompt each instance holds."""
        self.counts.commands += 1
        prompt = self._prompts.get(conversation)
        if prompt is None or prompt.instance not in idle:
            self.counts.unknown += 1
            return None
        have = held.get(prompt.instance, 0)
        if have >= len(prompt.keys):  # (a prompt under a block has nothing to keep either)
            self.counts.already_held += 1
            return None
        if not idle[prompt.instance]:
            self.counts.busy += 1
            return None
        warm = Warm(conversation, prompt.instance, prompt.model, prompt.ids, prompt.keys, have)
        self._pending.pop(conversation, None)
        self._pending[conversation] = warm
        while len(self._pending) > self.max_conversations:
            self._pending.popitem(last=False)
        self.counts.sent += 1
        self.counts.prefill_tokens += max(0, len(prompt.ids) - have * self.block_size)
        return warm

    def failed(self, warm: Warm) -> None:
        """The prefill did not go through: nothing to judge."""
        if self._pending.get(warm.conversation) is warm:
            del self._pending[warm.conversation]
        self.counts.sent -= 1
        self.counts.failed += 1
        self.counts.prefill_tokens -= max(0, len(warm.ids) - warm.held_blocks * self.block_size)
