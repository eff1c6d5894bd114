"""Creates the catalogue's topics (and their dead-letter siblings) before any consumer starts.

Idempotent: existing topics are left alone unless they have fewer partitions than the catalogue
asks for, in which case partitions are added (brokers without CreatePartitions get a warning).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from schemas.topics import Topic, all_topics, qualified
from services.runtime import clients

log = logging.getLogger(__name__)


async def ensure_topics(
    bootstrap: str,
    namespace: str = "",
    topics: Iterable[Topic] | None = None,
    replication_factor: int = 1,
) -> list[str]:
    """Returns the qualified names of the topics created now."""
    wanted = {qualified(t.name, namespace): t for t in (topics if topics is not None else all_topics())}
    async with clients.admin(bootstrap, "cachemesh-topics") as admin:
        existing = set(await admin.list_topics())
        missing = [
            NewTopic(name, t.partitions, replication_factor, topic_configs=t.configs())
            for name, t in wanted.items()
            if name not in existing
        ]
        created: list[str] = []
        if missing:
            response = await admin.create_topics(missing)
            for name, code, message in _topic_errors(response):
                if code == 0:
                    created.append(name)
                elif code != TopicAlreadyExistsError.errno:
                    raise RuntimeError(f"cannot create topic {name}: error {code} {message or ''}".strip())
        present = [name for name in wanted if name in existing]
        if present:
            await _grow_partitions(admin, {name: wanted[name] for name in present})
        return created


def _topic_errors(response: object) -> list[tuple[str, int, str | None]]:
    out: list[tuple[str, int, str | None]] = []
    for entry in getattr(response, "topic_errors", []):
        name, code = entry[0], entry[1]
        message = entry[2] if len(entry) > 2 else None
        out.append((name, code, message))
    return out


async def _grow_partitions(admin: AIOKafkaAdminClient, topics: dict[str, Topic]) -> None:
    described = await admin.describe_topics(list(topics))
    short: dict[str, NewPartitions] = {}
    for desc in described:
        name = desc["topic"]
        have = len(desc.get("partitions", []))
        if name in topics and 0 < have < topics[name].partitions:
            short[name] = NewPartitions(total_count=topics[name].partitions)
    if not short:
        return
    try:
        await admin.create_partitions(short)
        log.info("added partitions", extra={"topics": sorted(short)})
    except Exception as exc:
        log.warning(
            "topics have fewer partitions than the catalogue and the broker would not add more",
            extra={"topics": sorted(short), "error": repr(exc)},
        )
