"""Helpers for tests that run tier nodes in-process: wait for a condition, run a node, and tell when a
node has applied the invalidations published so far (instead of sleeping and hoping)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Self, TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from schemas.events import CacheInvalidated
from schemas.topics import qualified
from schemas.wire import decode
from services.runtime.service import Service
from services.tiers.service import TiersService
from services.tiers.settings import TiersSettings

S = TypeVar("S", bound=Service)


async def until(condition: Callable[[], bool], timeout_s: float = 10.0, step_s: float = 0.001) -> float:
    """Seconds until `condition()` held; fails the test after `timeout_s`."""
    started = time.perf_counter()
    while not condition():
        if time.perf_counter() - started > timeout_s:
            raise AssertionError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(step_s)
    return time.perf_counter() - started


@contextlib.asynccontextmanager
async def running(settings: TiersSettings) -> AsyncIterator[TiersService]:
    async with serving(TiersService(settings)) as service:
        yield service


@contextlib.asynccontextmanager
async def serving(service: S) -> AsyncIterator[S]:
    """Start `service`, run it, and yield once its consumers have their partitions and positions."""
    await service.start()
    task = asyncio.create_task(service.run())
    try:
        await until(
            lambda: all(c.health()["assigned"] for c in service._consumers), timeout_s=60, step_s=0.05
        )
        # A node reads commands from `latest`: resolve that now, or a command sent right after this
        # could land before the position is fetched and be skipped (seen once under CI load).
        for consumer in service._consumers:
            await asyncio.wait_for(consumer.wait_positioned(), 60)
        yield service
    finally:
        service.request_stop()
        await asyncio.gather(task, return_exceptions=True)
        await service.stop()


class InvalidationTap:
    """Reads `cache.invalidate.v1` beside the nodes (no group: every partition from the start), so a test
    can wait until an invalidation is in Kafka, and then until a node's consumer group has applied it
    (committed past its offset: the runtime commits after it applies)."""

    def __init__(self, bootstrap: str, namespace: str) -> None:
        self.topic = qualified(CacheInvalidated.topic, namespace)
        self.seen: list[tuple[CacheInvalidated, TopicPartition, int]] = []
        self._reader = AIOKafkaConsumer(
            self.topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None
        )
        self._admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        await self._reader.start()
        await self._admin.start()
        self._task = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._reader.stop()
        await self._admin.close()

    async def _read(self) -> None:
        while True:
            for tp, records in (await self._reader.getmany(timeout_ms=100)).items():
                for record in records:
                    event = decode(record.value)
                    assert isinstance(event, CacheInvalidated)
                    self.seen.append((event, tp, record.offset))

    async def landed(
        self, key: str, *, attempt: int = 1, origin: TiersService | None = None
    ) -> tuple[TopicPartition, int]:
        """Wait until an invalidation of `key` (that attempt, from that node) is in Kafka; where it is."""
        node_id = None if origin is None else origin.settings.node_id

        def find() -> tuple[TopicPartition, int] | None:
            for event, tp, offset in reversed(self.seen):
                if event.key == key and event.attempt == attempt and node_id in (None, event.origin_node_id):
                    return tp, offset
            return None

        await until(lambda: find() is not None, timeout_s=30, step_s=0.005)
        mark = find()
        assert mark is not None
        return mark

    async def applied(self, node: TiersService, *marks: tuple[TopicPartition, int]) -> None:
        """Wait until `node`'s invalidation consumer has applied the records at `marks` (and so every
        earlier one in their partitions)."""
        group = next(c.group_id for c in node._consumers if c.group_id.startswith("tiers-invalidate-"))
        wanted: dict[TopicPartition, int] = {}
        for tp, offset in marks:
            wanted[tp] = max(wanted.get(tp, 0), offset + 1)
        deadline = time.monotonic() + 30
        while True:
            committed = await self._admin.list_consumer_group_offsets(group, partitions=list(wanted))
            behind = {tp: o for tp, o in wanted.items() if tp not in committed or committed[tp].offset < o}
            if not behind:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{node.settings.node_id} has not applied invalidations up to {behind}")
            await asyncio.sleep(0.01)
