"""Conversations the gateway has seen (pure): which one is new (a `ConversationStarted` goes out), which
ended by idling past the timeout (a `ConversationEnded` goes out and its entries go), bounded in size.
And the answers served from the cache, by response id, so that "that answer was wrong" can name one.
The clock (monotonic ms) is passed in."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass


class Conversations:
    def __init__(self, *, idle_ms: int, max_tracked: int, clock: Callable[[], int]) -> None:
        self.idle_ms = idle_ms
        self.max_tracked = max_tracked
        self.clock = clock
        self._last_seen: OrderedDict[str, int] = OrderedDict()  # oldest first
        self.forgotten = 0

    def __len__(self) -> int:
        return len(self._last_seen)

    def __contains__(self, conversation_id: object) -> bool:
        return conversation_id in self._last_seen

    def touch(self, conversation_id: str) -> bool:
        """Seen now; True when it is new (it started)."""
        new = conversation_id not in self._last_seen
        self._last_seen[conversation_id] = self.clock()
        self._last_seen.move_to_end(conversation_id)
        while len(self._last_seen) > self.max_tracked:
            # Forgotten, not ended: ending would drop the entries of a conversation still going on.
            self._last_seen.popitem(last=False)
            self.forgotten += 1
        return new

    def end(self, conversation_id: str) -> bool:
        """Ended explicitly; True when it was tracked."""
        return self._last_seen.pop(conversation_id, None) is not None

    def idle(self) -> list[str]:
        """The conversations idle for `idle_ms` or more (they end now); never any when idle_ms is 0."""
        if self.idle_ms <= 0:
            return []
        cutoff = self.clock() - self.idle_ms
        ended = []
        while self._last_seen:
            conversation_id, seen = next(iter(self._last_seen.items()))
            if seen > cutoff:
                break
            self._last_seen.popitem(last=False)
            ended.append(conversation_id)
        return ended


@dataclass(frozen=True, slots=True)
class Served:
    key: str
    prompt: str | None
    match: str | None  # exact | semantic


class ServedAnswers:
    """The last `capacity` answers served from the cache, by the response id the caller got."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._by_id: OrderedDict[str, Served] = OrderedDict()

    def add(self, response_id: str, served: Served) -> None:
        self._by_id[response_id] = served
        while len(self._by_id) > self.capacity:
            self._by_id.popitem(last=False)

    def get(self, response_id: str) -> Served | None:
        return self._by_id.get(response_id)
