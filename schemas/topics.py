"""The topic catalogue, defined once: names, record keys, partitions, cleanup and retention.

A namespace prefix (CACHEMESH_TOPIC_NAMESPACE) lets several meshes, or several tests, share one
cluster. Every topic has a dead-letter sibling `<name minus .v1>.dlq.v1`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


@dataclass(frozen=True, slots=True)
class Topic:
    name: str
    key: str
    partitions: int
    cleanup_policy: Literal["delete", "compact"]
    retention_ms: int
    producers: str
    consumers: str

    def configs(self) -> dict[str, str]:
        return {"cleanup.policy": self.cleanup_policy, "retention.ms": str(self.retention_ms)}


def dlq_name(topic: str) -> str:
    base = topic.removesuffix(".v1")
    return f"{base}.dlq.v1"


CATALOGUE: tuple[Topic, ...] = (
    Topic("cache.access.v1", "entry key", 6, "delete", DAY_MS, "tiers, external producers", "heat, streams"),
    Topic("kv.events.v1", "block hash", 6, "delete", DAY_MS, "inference servers", "heat, streams, warmup"),
    Topic("cache.invalidate.v1", "entry key", 3, "delete", DAY_MS, "tiers", "invalidation, every tiers node"),
    Topic("context.lifecycle.v1", "trace id", 3, "delete", 7 * DAY_MS, "gateways", "invalidation"),
    Topic("heat.scores.v1", "entry key", 3, "delete", 6 * HOUR_MS, "heat", "tiers"),
    Topic("stream.window.v1", "shard", 3, "delete", DAY_MS, "streams", "warmup, dashboards"),
    Topic("stream.drift.v1", "cluster id", 3, "delete", DAY_MS, "streams", "warmup, dashboards"),
    Topic("tier.commands.v1", "node id", 3, "delete", DAY_MS, "warmup, invalidation, heat", "tiers"),
    Topic("warmup.records.v1", "shard / node id", 3, "delete", DAY_MS, "warmup, tiers", "dashboards, bench"),
    Topic(
        "source.changes.v1", "source", 3, "delete", 7 * DAY_MS, "applications, any producer", "invalidation"
    ),
    Topic(
        "invalidation.records.v1",
        "root key / trace",
        3,
        "delete",
        7 * DAY_MS,
        "invalidation",
        "dashboards, bench",
    ),
    Topic("tier.status.v1", "node id", 3, "delete", 7 * DAY_MS, "tiers", "dashboards, bench"),
)

DLQ_RETENTION_MS = 14 * DAY_MS


def dead_letter_topics() -> tuple[Topic, ...]:
    return tuple(
        Topic(dlq_name(t.name), "source key", 1, "delete", DLQ_RETENTION_MS, "any consumer", "people")
        for t in CATALOGUE
    )


def all_topics() -> tuple[Topic, ...]:
    return CATALOGUE + dead_letter_topics()


BY_NAME: dict[str, Topic] = {t.name: t for t in all_topics()}


def qualified(name: str, namespace: str = "") -> str:
    """The topic name on the wire; `namespace` is a plain prefix such as `staging.`."""
    return f"{namespace}{name}"
