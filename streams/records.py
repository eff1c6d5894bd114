"""What the two window stages hand each other, and the table writes they ask their adapter for.

Stage 1 (`ingest.py`) sends a `Partial` per closed pane, group and source partition, then a
`Progress` to every stage-2 partition whenever the watermark of one of its source partitions
passes a pane boundary. Stage 2
(`merge.py`) merges them. Both keep their state in faust tables through `TableWrite`s, so the
maths stays free of faust: the adapter (`app.py`) turns each write into a changelog record on the
named partition.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import msgspec

from schemas.events import CacheAccessBatch, CacheAccessed
from streams.windows import Group, PaneAggregate


@dataclass(frozen=True, slots=True)
class TableWrite:
    """Set `key` to `value` (None deletes it) in the changelog partition `partition`."""

    partition: int
    key: str
    value: Any | None


def table_key(*parts: object) -> str:
    return json.dumps(parts, separators=(",", ":"))


def parse_table_key(key: str) -> list[Any]:
    parts = json.loads(key)
    if not isinstance(parts, list) or not parts:
        raise ValueError(f"not a streams table key: {key!r}")
    return parts


@dataclass(frozen=True, slots=True)
class Partial:
    """The aggregate of one group in one pane, from one source partition; final once sent."""

    source_partition: int
    group: Group
    pane_start_ms: int
    aggregate: PaneAggregate

    def routing_key(self) -> str:
        return table_key(self.group[0], self.group[1])

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "partial",
            "p": self.source_partition,
            "g": [self.group[0], self.group[1]],
            "s": self.pane_start_ms,
            "a": self.aggregate.to_json(),
        }


@dataclass(frozen=True, slots=True)
class Progress:
    """Each listed source partition (of `partitions`) has sent every pane before its time."""

    partitions: int
    closed_before_ms: dict[int, int]

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "progress",
            "n": self.partitions,
            "c": {str(p): c for p, c in sorted(self.closed_before_ms.items())},
        }


def decode_handoff(doc: dict[str, Any]) -> Partial | Progress:
    kind = doc.get("kind")
    if kind == "partial":
        shard, model = doc["g"]
        return Partial(int(doc["p"]), (str(shard), model), int(doc["s"]), PaneAggregate.from_json(doc["a"]))
    if kind == "progress":
        return Progress(int(doc["n"]), {int(p): int(c) for p, c in doc["c"].items()})
    raise ValueError(f"unknown hand-off record kind {kind!r}")


_ENCODER = msgspec.json.Encoder()


def compact_json(value: Any) -> bytes:
    """Compact JSON, as `json.dumps(value, separators=(",", ":"))` writes it, at a fraction of the cost
    (the hand-off and changelog records carry a count per key)."""
    return _ENCODER.encode(value)


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def accesses_of(decoded: object) -> list[CacheAccessed]:
    """The accesses a source record stands for: a batch's, the one access, or none."""
    if isinstance(decoded, CacheAccessed):
        return [decoded]
    if isinstance(decoded, CacheAccessBatch):
        return decoded.events
    return []
