"""Background sends (`publish(..., wait=False)`) until the broker answers them, settled in sweeps.

A done-callback per send cost the publisher about a tenth of its time per event: the loop schedules
each callback as its own handle. Here a send is appended to a list, and the list is swept for the
answered ones when it has grown enough since the last sweep (amortised O(1) a send) and on a timer, so
a quiet publisher still counts and reports within `interval_s`. Each sweep reports per topic how many
were acknowledged and how many failed, with one of the errors.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

# (topic, events acknowledged, events failed, an error among the failed or None)
Settled = Callable[[str, int, int, BaseException | None], None]


class Unacked:
    def __init__(self, on_settled: Settled, *, sweep_at: int = 1024, interval_s: float = 1.0) -> None:
        self._on_settled = on_settled
        self._base = sweep_at
        self._sweep_at = sweep_at
        self._interval_s = interval_s
        self._items: list[tuple[str, int, asyncio.Future[object]]] = []
        self._timer: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._items)

    def add(self, topic: str, count: int, future: asyncio.Future[object]) -> None:
        """Track `future`, the broker's answer for `count` events sent to `topic`."""
        items = self._items
        if not items and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._interval_s, self._tick)
        items.append((topic, count, future))
        if len(items) >= self._sweep_at:
            self.sweep()

    def sweep(self) -> None:
        """Report the answered sends and forget them; the rest wait for a later sweep."""
        waiting: list[tuple[str, int, asyncio.Future[object]]] = []
        tally: dict[str, list[int]] = {}
        errors: dict[str, BaseException] = {}
        for item in self._items:
            topic, count, future = item
            if not future.done():
                waiting.append(item)
                continue
            counts = tally.get(topic)
            if counts is None:
                counts = tally[topic] = [0, 0]
            error = asyncio.CancelledError() if future.cancelled() else future.exception()
            if error is None:
                counts[0] += count
            else:
                counts[1] += count
                errors.setdefault(topic, error)
        self._items = waiting
        # The next sweep once as many again have been added: a list of slow answers is not walked
        # on every send.
        self._sweep_at = max(self._base, 2 * len(waiting))
        for topic, (acked, failed) in tally.items():
            self._on_settled(topic, acked, failed, errors.get(topic))

    def _tick(self) -> None:
        self._timer = None
        self.sweep()
        if self._items:
            self._timer = asyncio.get_running_loop().call_later(self._interval_s, self._tick)

    async def drain(self) -> None:
        """Wait for every answer, report them all, and stop the timer."""
        if self._items:
            await asyncio.gather(*(future for _, _, future in self._items), return_exceptions=True)
        self.sweep()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
