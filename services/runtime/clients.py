"""Where every aiokafka client the product builds is made: the services' publisher and consumer
(publisher.py, kafka.py), topic creation (topics.py) and the few one-off readers and admin calls below.
One place sets the address and the client's identity; no module outside `services/runtime` imports an
aiokafka client class (tests/unit/test_layout.py checks it). faust builds its own, inside faust."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient


def producer(bootstrap: str, **options: Any) -> AIOKafkaProducer:
    """A producer (not started); `options` as aiokafka names them."""
    return AIOKafkaProducer(bootstrap_servers=bootstrap, **options)


def reader(bootstrap: str, client_id: str, **options: Any) -> AIOKafkaConsumer:
    """A consumer outside any group, committing nothing (not started): it reads what it is assigned or
    subscribed to, from where it seeks."""
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap, client_id=client_id, group_id=None, enable_auto_commit=False, **options
    )


@asynccontextmanager
async def admin(bootstrap: str, client_id: str) -> AsyncIterator[AIOKafkaAdminClient]:
    """A started admin client, closed on the way out (also when it could not start)."""
    client = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id=client_id)
    try:
        await client.start()
        yield client
    finally:
        await client.close()


async def partition_count(bootstrap: str, topic: str, client_id: str) -> int | None:
    """How many partitions `topic` has; None when it does not exist."""
    async with admin(bootstrap, client_id) as client:
        for desc in await client.describe_topics([topic]):
            if desc.get("topic") == topic and not desc.get("error_code"):
                return len(desc.get("partitions", [])) or None
        return None


async def committed_offsets(bootstrap: str, group: str, client_id: str) -> dict[tuple[str, int], int]:
    """The offsets `group` committed, by (topic, partition). Raises KafkaError or OSError when the
    broker cannot answer."""
    async with admin(bootstrap, client_id) as client:
        committed = await client.list_consumer_group_offsets(group)
    return {(tp.topic, tp.partition): meta.offset for tp, meta in committed.items()}
