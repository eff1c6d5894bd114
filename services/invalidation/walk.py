"""The dependency walk, without I/O: breadth-first from the roots over "X depends on Y" edges, a visited
set against cycles and diamonds, bounded depth and size. The caller answers each `Query` from its index.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from schemas.events import WalkBound

Via = Literal["dependency", "trace"]


@dataclass(frozen=True, slots=True)
class Query:
    """Which distinct entries name one of `ids` (through `vias`)? At most `limit` of them."""

    ids: tuple[str, ...]
    vias: tuple[Via, ...]
    limit: int
    # New dependants this level may add; more than that and the walk stops at `bound`.
    room: int
    bound: WalkBound


@dataclass(frozen=True, slots=True)
class Cascade:
    """What a finished walk found: dependants in discovery order (nearest first)."""

    keys: tuple[str, ...]
    depth: int
    bound: WalkBound | None

    @property
    def truncated(self) -> bool:
        return self.bound is not None


class DependencyWalk:
    """Feed it the answer to each `next_query()` with `add()` until `next_query()` returns None.

    Roots never become dependants (a cycle back to a freshly written key stops there), and neither do
    entries written after `changed_at_ms` (nor what hangs only on them). Each query asks for
    `room + len(visited) + 1` rows: an answer shorter than that is complete, and a full one holds at
    least `room + 1` unvisited keys, so the bound is detected while memory stays within about twice
    `max_dependants`. Past `max_depth` one more query with no room tells whether anything was left.
    """

    def __init__(
        self,
        roots: Sequence[str],
        *,
        max_depth: int,
        max_dependants: int,
        root_vias: tuple[Via, ...] = ("dependency",),
        changed_at_ms: int | None = None,
    ) -> None:
        if max_depth < 1 or max_dependants < 1:
            raise ValueError("max_depth and max_dependants must be positive")
        self.max_depth = max_depth
        self.max_dependants = max_dependants
        self._root_vias = root_vias
        self._changed_at_ms = changed_at_ms
        self._visited: set[str] = set(roots)
        self._found: list[str] = []
        self._frontier: list[str] = list(dict.fromkeys(roots))
        self._level = 0  # levels asked so far
        self._depth = 0  # deepest level that yielded a dependant
        self._bound: WalkBound | None = None
        self._asked: Query | None = None

    def next_query(self) -> Query | None:
        if self._asked is not None:
            raise RuntimeError("add() the answer to the previous query first")
        if not self._frontier or self._bound is not None:
            return None
        vias = self._root_vias if self._level == 0 else ("dependency",)
        if self._level >= self.max_depth:
            room, bound = 0, "max_depth"
        else:
            room, bound = self.max_dependants - len(self._found), "max_dependants"
        self._asked = Query(tuple(self._frontier), vias, room + len(self._visited) + 1, room, bound)  # type: ignore[arg-type]
        return self._asked

    def add(self, dependants: Iterable[tuple[str, int | None]]) -> None:
        """The answer: (key, when its entry was last written; None when it is gone already)."""
        asked, self._asked = self._asked, None
        if asked is None:
            raise RuntimeError("no query is outstanding")
        rows = list(dict(dependants).items())[: asked.limit]
        new: list[str] = []
        for key, updated_at_ms in rows:
            if key in self._visited:
                continue
            if (
                self._changed_at_ms is not None
                and updated_at_ms is not None
                and updated_at_ms > self._changed_at_ms
            ):
                # Written after the change, so from what the change left: neither it nor what hangs on
                # it is stale. Visited, so it is not weighed again.
                self._visited.add(key)
                continue
            new.append(key)
        # A full answer holds more than `room` new keys, unless fresh ones took their place: then the
        # cut may have hidden stale ones, and the bound is declared conservatively.
        if len(new) > asked.room or len(rows) >= asked.limit:
            self._bound = asked.bound
            new = new[: asked.room]
        self._level += 1
        self._visited.update(new)
        self._found.extend(new)
        if new:
            self._depth = self._level
        self._frontier = new

    def result(self) -> Cascade:
        return Cascade(tuple(self._found), self._depth, self._bound)
