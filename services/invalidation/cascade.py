"""From a triggering event to what the invalidation service does, without I/O: the roots to walk from,
the eviction commands for the dependants found (chunked to MAX_KEYS_PER_EVENT), and the records."""

from __future__ import annotations

from dataclasses import dataclass

from schemas.events import (
    MAX_KEYS_PER_EVENT,
    CacheInvalidated,
    ConversationEnded,
    Event,
    EvictionRequested,
    InvalidationCause,
    InvalidationRecorded,
    SourceChanged,
)
from services.invalidation.walk import Cascade, Via


@dataclass(frozen=True, slots=True)
class Trigger:
    """Why a walk starts: its roots, which edges the first level follows, and what to record."""

    cause: InvalidationCause
    root: str
    roots: tuple[str, ...]
    root_vias: tuple[Via, ...]
    reason: str | None
    event_id: str
    # L3 rows written at or after this time are newer than the change: a delete leaves them.
    occurred_at_ms: int


def trigger_of(event: Event) -> Trigger | None:
    """The walk an event asks for; None for events the service only passes by."""
    if isinstance(event, CacheInvalidated):
        # The key itself is the writer's business (a fresh value, or deleted already): only what
        # depends on it goes.
        return Trigger(
            "invalidated",
            event.key,
            (event.key,),
            ("dependency",),
            event.reason,
            event.event_id,
            event.occurred_at_ms,
        )
    if isinstance(event, ConversationEnded):
        # Entries of the conversation (their trace id) and entries listing it as a dependency.
        return Trigger(
            "conversation_ended",
            event.trace_id,
            (event.trace_id,),
            ("dependency", "trace"),
            None,
            event.event_id,
            event.occurred_at_ms,
        )
    if isinstance(event, SourceChanged):
        return Trigger(
            "source_changed",
            event.source,
            tuple(event.dependency_ids()),
            ("dependency",),
            event.reason,
            event.event_id,
            event.occurred_at_ms,
        )
    return None


def chunks(keys: tuple[str, ...], size: int = MAX_KEYS_PER_EVENT) -> list[tuple[str, ...]]:
    return [keys[i : i + size] for i in range(0, len(keys), size)]


def eviction_commands(trigger: Trigger, cascade: Cascade, node_id: str = "*") -> list[EvictionRequested]:
    """One command per chunk of dependants. Addressed to every node: which node holds an entry in L1/L2
    is known only to that node (Postgres records descriptors, not residency), and a node drops an
    absent key for the price of a lookup."""
    reason = f"{trigger.cause}:{trigger.root}"[:200]
    return [EvictionRequested(node_id=node_id, keys=list(c), reason=reason) for c in chunks(cascade.keys)]


def records(
    trigger: Trigger,
    cascade: Cascade,
    commands: list[EvictionRequested],
    *,
    l3_deleted: int,
    node_id: str = "*",
) -> list[InvalidationRecorded]:
    """One record per command (its keys), or one with no keys when nothing depended on the roots."""
    parts: list[tuple[tuple[str, ...], str | None]] = [(tuple(c.keys), c.event_id) for c in commands]
    parts = parts or [((), None)]
    return [
        InvalidationRecorded(
            root=trigger.root,
            cause=trigger.cause,
            reason=trigger.reason,
            roots=list(trigger.roots[:MAX_KEYS_PER_EVENT]),
            source_event_id=trigger.event_id,
            keys=list(keys),
            chunk=i,
            chunks=len(parts),
            dependants=len(cascade.keys),
            depth=cascade.depth,
            truncated=cascade.truncated,
            bound=cascade.bound,
            command_event_id=command_id,
            node_id=node_id,
            l3_deleted=l3_deleted,
        )
        for i, (keys, command_id) in enumerate(parts)
    ]
