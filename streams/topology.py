"""The topics the faust worker reads, writes and keeps its state in, named once.

Internal topics (the hand-off between the two window stages, the table changelogs, faust's leader
topic) are created up front with the partition counts faust will check them against -- a table's
changelog has as many partitions as the stream that writes it -- so the worker runs on a cluster
with topic auto-creation off.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.events import CacheAccessed, DriftClustered, KvBlockStored, WindowComputed
from schemas.topics import BY_NAME, DAY_MS, Topic, dlq_name, qualified
from streams.settings import StreamsSettings

# A pane of a busy shard lists thousands of keys; keep room for it on the internal topics.
INTERNAL_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class InternalTopic(Topic):
    max_message_bytes: int = INTERNAL_MAX_MESSAGE_BYTES

    def configs(self) -> dict[str, str]:
        configs = Topic.configs(self)
        configs["max.message.bytes"] = str(self.max_message_bytes)
        if self.cleanup_policy == "compact":
            configs.pop("retention.ms", None)
        return configs


@dataclass(frozen=True, slots=True)
class Names:
    """Qualified (namespaced) topic names and the faust app id."""

    app_id: str
    access: str
    kv: str
    window: str
    drift: str
    handoff: str
    ingest_table: str
    merge_table: str
    latest_table: str
    leader: str

    def dlq(self, topic: str) -> str:
        return dlq_name(topic)


INGEST_TABLE = "ingest"
MERGE_TABLE = "merge"
LATEST_TABLE = "latest"


def names(settings: StreamsSettings) -> Names:
    ns = settings.kafka.topic_namespace
    app_id = f"{ns}{settings.app_id}"
    return Names(
        app_id=app_id,
        access=qualified(CacheAccessed.topic, ns),
        kv=qualified(KvBlockStored.topic, ns),
        window=qualified(WindowComputed.topic, ns),
        drift=qualified(DriftClustered.topic, ns),
        handoff=f"{app_id}-handoff",
        ingest_table=f"{app_id}-{INGEST_TABLE}-changelog",
        merge_table=f"{app_id}-{MERGE_TABLE}-changelog",
        latest_table=f"{app_id}-{LATEST_TABLE}-changelog",
        leader=f"{app_id}-__assignor-__leader",
    )


def source_partitions(settings: StreamsSettings) -> int:
    return settings.source_partitions or BY_NAME[CacheAccessed.topic].partitions


def internal_topics(settings: StreamsSettings, source_count: int | None = None) -> list[Topic]:
    """Unqualified names (`ensure_topics` adds the namespace), partition counts matching faust's."""
    base = settings.app_id
    n = settings.partitions
    sources = source_count or source_partitions(settings)
    week = 7 * DAY_MS
    return [
        InternalTopic(f"{base}-handoff", "group", n, "delete", DAY_MS, "streams stage 1", "streams stage 2"),
        InternalTopic(
            f"{base}-{INGEST_TABLE}-changelog", "pane", sources, "compact", week, "streams", "streams"
        ),
        InternalTopic(f"{base}-{MERGE_TABLE}-changelog", "pane", n, "compact", week, "streams", "streams"),
        InternalTopic(f"{base}-{LATEST_TABLE}-changelog", "group", n, "compact", week, "streams", "streams"),
        InternalTopic(f"{base}-__assignor-__leader", "-", 1, "delete", DAY_MS, "faust", "faust"),
    ]
