"""Warming an engine for a conversation's next turn, decided without I/O: when to answer the warmup
service's command with a prefill of the conversation's latest prompt on its instance, and how it went.

A warm lives `life = pool / rate` in the engine; `elapsed` ms after the conversation's last request it
goes once `P(elapsed + prefill < gap <= elapsed + life) / P(gap > elapsed)` over the gaps seen (`Gaps`)
reaches `min_precision`, `prefill` from FTL = base + m * delta (docs/design.md §2.1) fit per instance;
until `Gaps` knows 20 gaps, `survive_fraction` of its life before `deadline_ms`. Only to an idle
instance (again every `retry_ms`). Outcomes: used, wasted, overtaken, unlikely.
How it works: docs/gateway.md ("Warming an engine for the next turn").
"""

from __future__ import annotations

import bisect
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Prompt:
    instance: str
    model: str
    ids: tuple[int, ...]
    keys: tuple[str, ...]  # its full blocks' content keys
    at_ms: int = 0  # when it was routed


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
    chance: float | None = None  # that the turn comes within the warm's life, when the gaps said
    prefill_ms: float | None = None  # how long it takes, by the instance's FTL fit (None: not fitted)
    saves_ms: float | None = None  # the first-token time it saves the turn if used (same fit)


@dataclass(slots=True)
class _Armed:
    """A command not answered yet: when to look at it next, and when to give up."""

    next_at_ms: int
    due_ms: int | None
    give_up_ms: int
    deferred: bool = False


class Gaps:
    """The gaps between consecutive requests of a conversation, over every conversation seen (the
    latest `maxlen`), and what they say about when a turn comes. Past the point where fewer than
    `min_alive` of them were longer, they say nothing (chance 0): the tail of a sample is no forecast."""

    def __init__(self, maxlen: int = 512, min_gaps: int = 20, min_alive: int = 10) -> None:
        self.min_gaps = min_gaps
        self.min_alive = min_alive
        self._recent: deque[float] = deque(maxlen=maxlen)
        self._sorted: list[float] = []

    def add(self, gap_ms: float) -> None:
        if len(self._recent) == self._recent.maxlen:
            del self._sorted[bisect.bisect_left(self._sorted, self._recent[0])]
        self._recent.append(gap_ms)
        bisect.insort(self._sorted, gap_ms)

    @property
    def known(self) -> bool:
        return len(self._sorted) >= self.min_gaps

    def chance(self, elapsed_ms: float, life_ms: float, after_ms: float = 0.0) -> float:
        """P(turn between `after_ms` and `life_ms` from now | none for `elapsed_ms`): a warm that takes
        `after_ms` to prefill is of use to a turn that comes once it is done and before it is evicted.
        0 where too few gaps were longer."""
        g = self._sorted
        alive = len(g) - bisect.bisect_right(g, elapsed_ms)
        if alive < max(1, self.min_alive) or after_ms >= life_ms:
            return 0.0
        inside = bisect.bisect_right(g, elapsed_ms + life_ms) - bisect.bisect_right(g, elapsed_ms + after_ms)
        return inside / alive

    def first_time(
        self, elapsed_ms: float, life_ms: float, floor: float, after_ms: float = 0.0
    ) -> float | None:
        """The earliest elapsed time from `elapsed_ms` on at which `chance` reaches `floor`, or None.
        The chance only changes where a gap starts or ends the window, so only those are tried."""
        if self.chance(elapsed_ms, life_ms, after_ms) >= floor:
            return elapsed_ms
        candidates = sorted(
            {t for g in self._sorted for t in (g, g - life_ms, g - after_ms) if t > elapsed_ms}
        )
        return next((t for t in candidates if self.chance(t, life_ms, after_ms) >= floor), None)


class Turnover:
    """How long a block an instance just read or computed stays there: its KV pool over the rate it
    is sent blocks (from (time, blocks sent so far) samples over the last `window_ms`)."""

    def __init__(self, window_ms: int = 30_000) -> None:
        self.window_ms = window_ms
        self._samples: deque[tuple[int, int]] = deque()

    def sample(self, now_ms: int, blocks_total: int) -> None:
        self._samples.append((now_ms, blocks_total))
        while len(self._samples) > 2 and now_ms - self._samples[1][0] >= self.window_ms:
            self._samples.popleft()

    def rate_per_ms(self) -> float | None:
        if len(self._samples) < 2:
            return None
        (t0, n0), (t1, n1) = self._samples[0], self._samples[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else None

    def survive_ms(self, pool_blocks: int | None) -> float | None:
        """None while unknown (no pool size or too few samples). With nothing sent over the window, at
        least the window: a lull says nothing of how long it lasts, and traffic that resumes evicts."""
        rate = self.rate_per_ms()
        if pool_blocks is None or rate is None:
            return None
        span = self._samples[-1][0] - self._samples[0][0]
        return pool_blocks / rate if rate > 0 else float(max(span, 1))


@dataclass
class WarmCounts:
    commands: int = 0
    sent: int = 0
    unknown: int = 0  # a conversation this gateway has no prompt of (another gateway routes it)
    busy: int = 0  # the instance had work until the turn was overdue: not warmed
    already_held: int = 0  # the instance held the whole prompt: nothing to warm
    deferred: int = 0  # commands that waited for the turn to be near enough for the warm to survive
    overtaken: int = 0  # the turn came before the warm went out
    unlikely: int = 0  # the turn would not come within a warm's life often enough: none sent
    failed: int = 0
    used: int = 0
    wasted: int = 0
    evicted: int = 0  # of `wasted`: the turn came to the warmed instance, the blocks had gone
    prefill_tokens: int = 0  # tokens the warmed instances did not hold (recomputed or loaded)
    lead_ms_total: float = 0.0  # from each judged warm to its turn
    chance_total: float = 0.0  # the chances predicted for the judged warms (against `used`)
    chance_judged: int = 0
    ttft_saved_ms: float = 0.0  # first-token time the used warms saved their turns (by the FTL fit)

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
            "unlikely": self.unlikely,
            "failed": self.failed,
            "used": self.used,
            "wasted": self.wasted,
            "evicted": self.evicted,
            "prefill_tokens": self.prefill_tokens,
            "lead_ms_mean": self.lead_ms_total / judged if judged else None,
            "precision": self.precision(),
            "predicted_precision": self.chance_total / self.chance_judged if self.chance_judged else None,
            "ttft_saved_ms": round(self.ttft_saved_ms, 1),
        }


@dataclass
class EngineWarmer:
    max_conversations: int = 4_096
    block_size: int = 32
    survive_fraction: float = 0.5  # send no earlier than this share of a warm's life before the turn
    retry_ms: int = 100  # a busy instance is looked at again after this
    max_wait_ms: int = 10_000  # without a turn time, how long a command waits for an idle instance
    min_precision: float = 0.8  # the chance a warm is used below which it is not sent
    counts: WarmCounts = field(default_factory=WarmCounts)
    gaps: Gaps = field(default_factory=Gaps)
    _prompts: OrderedDict[str, Prompt] = field(default_factory=OrderedDict)
    _armed: OrderedDict[str, _Armed] = field(default_factory=OrderedDict)  # commands not answered yet
    _pending: OrderedDict[str, Warm] = field(default_factory=OrderedDict)  # warms not judged yet

    def routed(
        self, conversation: str, instance: str, model: str, ids: list[int], keys: list[str], now_ms: int = 0
    ) -> None:
        """A request of `conversation` went to `instance` with this prompt, for `model`, at `now_ms`."""
        if self._armed.pop(conversation, None) is not None:
            self.counts.overtaken += 1
        last = self._prompts.pop(conversation, None)
        if last is not None and now_ms > last.at_ms:
            self.gaps.add(now_ms - last.at_ms)
        self._prompts[conversation] = Prompt(instance, model, tuple(ids), tuple(keys), now_ms)
        while len(self._prompts) > self.max_conversations:
            self._prompts.popitem(last=False)

    def judge(self, conversation: str, instance: str, still_held: bool, now_ms: int = 0) -> str | None:
        """The conversation's next request went to `instance`; `still_held`: the warmed prompt's last
        block was still in that instance when it arrived. The warm's outcome, if one was pending."""
        warm = self._pending.pop(conversation, None)
        if warm is None:
            return None
        self.counts.lead_ms_total += max(0, now_ms - warm.sent_at_ms)
        if warm.chance is not None:
            self.counts.chance_total += warm.chance
            self.counts.chance_judged += 1
        if warm.instance == instance and still_held:
            self.counts.used += 1
            self.counts.ttft_saved_ms += warm.saves_ms or 0.0
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
        ftl: Callable[[str], tuple[float, float] | None] = lambda instance: None,
    ) -> list[Warm]:
        """The prefills to send now. `idle`: which instances have nothing in flight or queued;
        `held(keys, instance)`: how many leading blocks of `keys` the instance holds; `survive_ms`: how
        long a warm lasts in the instance (Turnover), None while unknown; `ftl`: the instance's
        first-token latency as (base_ms, delta_ms) of FTL = base + m * delta (docs/design.md §2.1), fit
        to what it answered (m: the share of the prompt it computes), None until fitted. A warm takes
        base + m * delta to prefill, so the turn must come after that to find it done, and saves the
        turn m * delta."""
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
            fit = ftl(prompt.instance)
            missing = (len(prompt.keys) - have) / len(prompt.keys)
            prefill = fit[0] + missing * fit[1] if fit is not None else 0.0
            chance = None
            if life is not None and life != float("inf") and self.gaps.known:
                elapsed = now_ms - prompt.at_ms
                chance = self.gaps.chance(elapsed, life, prefill)
                if chance < self.min_precision:
                    later = self.gaps.first_time(elapsed, life, self.min_precision, prefill)
                    if later is None:
                        del self._armed[conversation]
                        self.counts.unlikely += 1
                        continue
                    armed.next_at_ms = prompt.at_ms + int(later)
                    armed.give_up_ms = max(armed.give_up_ms, armed.next_at_ms + self.max_wait_ms)
                    if not armed.deferred:
                        armed.deferred = True
                        self.counts.deferred += 1
                    continue
            elif armed.due_ms is not None and life is not None and life != float("inf"):
                start = int(armed.due_ms - max(self.survive_fraction * life, prefill))
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
            warm = Warm(
                conversation, prompt.instance, prompt.model, prompt.ids, prompt.keys, have, now_ms, chance,
                prefill_ms=prefill if fit is not None else None,
                saves_ms=missing * fit[1] if fit is not None else None,
            )  # fmt: skip
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
