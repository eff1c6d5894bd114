"""The invalidation service on real Kafka and Postgres beside a tier node: a write, a conversation end and
a source-row change each take every dependant (transitively, through a cycle and a diamond) off the node
and out of L3, leave unrelated entries alone, and say what went and why; a redelivery does nothing twice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer

from schemas.events import ConversationEnded, Event, InvalidationRecorded, now_ms, source_dependency_id
from schemas.topics import qualified
from schemas.wire import decode
from services.invalidation.producer import SourceChangePublisher
from services.invalidation.service import InvalidationService
from services.invalidation.settings import InvalidationSettings
from services.runtime.postgres import Database
from services.runtime.publisher import EventPublisher
from services.tiers.entry import EntryMeta, encode_text
from services.tiers.service import TiersService
from tests.integration.conftest import kafka_settings_for
from tests.integration.nodes import running, serving, until

pytestmark = pytest.mark.integration


def _settings(kafka, namespace, pg_settings, **overrides) -> InvalidationSettings:  # type: ignore[no-untyped-def]
    return InvalidationSettings(
        kafka=kafka_settings_for(kafka, namespace),
        postgres=pg_settings,
        group_id=f"invalidation-{namespace}",
        metrics_port=0,
        **overrides,
    )


def invalidation(settings: InvalidationSettings) -> AbstractAsyncContextManager[InvalidationService]:
    return serving(InvalidationService(settings))


class Records:
    """Reads `invalidation.records.v1` from the start while the test runs."""

    def __init__(self, bootstrap: str, namespace: str) -> None:
        self.seen: list[InvalidationRecorded] = []
        self._reader = AIOKafkaConsumer(
            qualified(InvalidationRecorded.topic, namespace),
            bootstrap_servers=bootstrap,
            auto_offset_reset="earliest",
            group_id=None,
        )
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Records:
        await self._reader.start()
        self._task = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self._reader.stop()

    async def _read(self) -> None:
        while True:
            for records in (await self._reader.getmany(timeout_ms=100)).values():
                for r in records:
                    event = decode(r.value)
                    assert isinstance(event, InvalidationRecorded)
                    self.seen.append(event)


async def eventually(condition: Callable[[], Awaitable[bool]], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def held(node: TiersService, key: str) -> bool:
    cache = node.cache
    assert cache is not None
    return key in cache.l1 or (cache.l2 is not None and key in cache.l2)


async def in_l3(db: Database, keys: Iterable[str]) -> set[str]:
    rows = await db.fetch("SELECT key FROM cache_descriptors WHERE key = ANY($1::text[])", list(keys))
    return {r["key"] for r in rows}


async def put(node: TiersService, key: str, *deps: str, trace: str | None = None) -> None:
    assert node.cache is not None
    meta = EntryMeta(key=key, kind="prompt", model="m", trace_id=trace, context_dependency_ids=deps)
    result = await node.cache.put(meta, encode_text(f"answer of {key}", model="m"))
    assert result.persisted
    # Change times are in ms: the next write (or change) must come strictly later to be told apart.
    await until(lambda: now_ms() > result.updated_at_ms)


async def gone_everywhere(node: TiersService, db: Database, keys: set[str]) -> None:
    async def gone() -> bool:
        return not any(held(node, k) for k in keys) and not await in_l3(db, keys)

    await eventually(gone)


@pytest.fixture
async def db(pg_settings) -> AsyncIterator[Database]:  # type: ignore[no-untyped-def]
    database = Database(pg_settings)
    await database.start()
    yield database
    await database.stop()


async def test_a_write_takes_its_dependants_transitively_and_leaves_the_rest(
    kafka, namespace, topics_on, node_settings, pg_settings, db
) -> None:  # type: ignore[no-untyped-def]
    await topics_on(kafka)
    k = {name: f"{namespace}{name}" for name in ("r", "a", "b", "c", "d", "e", "x", "u", "other")}
    async with (
        invalidation(_settings(kafka, namespace, pg_settings)) as service,
        running(node_settings("a")) as node,
        Records(kafka.bootstrap, namespace) as records,
    ):
        # A chain five deep below r, a diamond (x on a and b), and a cycle back to r (r depends on e).
        await put(node, k["r"], k["e"])
        for child, parent in (("a", "r"), ("b", "a"), ("c", "b"), ("d", "c"), ("e", "d")):
            await put(node, k[child], k[parent])
        await put(node, k["x"], k["a"], k["b"])
        await put(node, k["u"], k["other"])
        dependants = {k[n] for n in ("a", "b", "c", "d", "e", "x")}
        assert all(held(node, key) for key in dependants)

        await put(node, k["r"], k["e"])  # the write: its CacheInvalidated goes out from the node
        await gone_everywhere(node, db, dependants)
        await until(lambda: any(r.root == k["r"] for r in records.seen), timeout_s=30)

        assert held(node, k["u"]) and held(node, k["r"])
        assert await in_l3(db, [k["u"], k["r"]]) == {k["u"], k["r"]}
        [record] = [r for r in records.seen if r.root == k["r"]]
        assert record.cause == "invalidated" and record.reason == "write" and record.roots == [k["r"]]
        assert set(record.keys) == dependants and record.dependants == 6 and record.depth == 5
        assert not record.truncated and record.l3_deleted == 6 and record.node_id == "*"
        health = await service.health()
        assert health["healthy"] and health["dependants"] >= 6


async def test_a_conversation_end_takes_what_depends_on_its_entries(
    kafka, namespace, topics_on, node_settings, pg_settings, db
) -> None:  # type: ignore[no-untyped-def]
    await topics_on(kafka)
    conv, other = f"{namespace}conv", f"{namespace}conv-other"
    k = {name: f"{namespace}{name}" for name in ("t1", "t2", "p", "s", "s2", "o")}
    publisher = EventPublisher(kafka_settings_for(kafka, namespace))
    await publisher.start()
    try:
        async with (
            invalidation(_settings(kafka, namespace, pg_settings)),
            running(node_settings("a")) as node,
            Records(kafka.bootstrap, namespace) as records,
        ):
            await put(node, k["t1"], trace=conv)
            await put(node, k["t2"], trace=conv)
            await put(node, k["p"], conv)  # lists the conversation as a dependency
            await put(node, k["s"], k["t1"])  # a summary of a turn: the node alone would keep it
            await put(node, k["s2"], k["s"])
            await put(node, k["o"], trace=other)
            await publisher.publish(ConversationEnded(trace_id=conv))
            doomed = {k[n] for n in ("t1", "t2", "p", "s", "s2")}
            await gone_everywhere(node, db, doomed)
            await until(lambda: any(r.root == conv for r in records.seen), timeout_s=30)
            assert held(node, k["o"]) and await in_l3(db, [k["o"]]) == {k["o"]}
            [record] = [r for r in records.seen if r.root == conv]
            # The node may have deleted the conversation's own rows from L3 first; the edges remain.
            assert record.cause == "conversation_ended" and set(record.keys) == doomed
            assert record.depth == 3 and not record.truncated
    finally:
        await publisher.stop()


async def test_a_source_change_takes_its_dependants_once_even_when_redelivered(
    kafka, namespace, topics_on, node_settings, pg_settings, db
) -> None:  # type: ignore[no-untyped-def]
    await topics_on(kafka)
    row42, row43 = source_dependency_id("orders", "42"), source_dependency_id("orders", "43")
    k = {name: f"{namespace}{name}" for name in ("view", "dash", "view43", "late")}
    settings = _settings(kafka, namespace, pg_settings)
    async with (
        running(node_settings("a")) as node,
        Records(kafka.bootstrap, namespace) as records,
        SourceChangePublisher(kafka.bootstrap, namespace=namespace, producer="orders-api") as source,
    ):
        # Several tests share "row:orders/42" across runs: the keys are this test's own.
        await put(node, k["view"], row42)
        await put(node, k["dash"], k["view"])
        await put(node, k["view43"], row43)
        async with invalidation(settings) as service:
            [event] = await source.changed("orders", [42])
            await gone_everywhere(node, db, {k["view"], k["dash"]})
            await until(lambda: any(r.source_event_id == event.event_id for r in records.seen), timeout_s=30)
            assert held(node, k["view43"]) and await in_l3(db, [k["view43"]]) == {k["view43"]}
            assert service.counters["cascades_source_changed"] == 1

        # An entry put after the change depends on the same row; the change arrives again (the same
        # event, as after a producer retry) at a restarted service: nothing more happens.
        await put(node, k["late"], row42)
        async with invalidation(settings) as service:
            await _send_again(kafka, namespace, event)
            await until(lambda: service.counters["redelivered"] == 1, timeout_s=30)
            assert "cascades_source_changed" not in service.counters
        assert held(node, k["late"]) and await in_l3(db, [k["late"]]) == {k["late"]}
        mine = [r for r in records.seen if r.source_event_id == event.event_id]
        assert len(mine) == 1 and mine[0].cause == "source_changed" and mine[0].root == "orders"
        assert set(mine[0].keys) >= {k["view"], k["dash"]} and mine[0].roots == [row42]


async def _send_again(kafka: Any, namespace: str, event: Event) -> None:
    publisher = EventPublisher(kafka_settings_for(kafka, namespace))
    await publisher.start()
    try:
        await publisher.publish(event)
    finally:
        await publisher.stop()


async def test_the_inbox_forgets_event_ids_past_the_retention_in_batches(  # type: ignore[no-untyped-def]
    kafka, namespace, topics_on, pg_settings
) -> None:
    await topics_on(kafka)
    settings = _settings(kafka, namespace, pg_settings, inbox_retention_ms=60_000, inbox_prune_batch=100)
    now = now_ms()
    async with invalidation(settings) as service:
        db = service._db
        assert db is not None
        # 250 ids older than the retention, 30 recent ones, and 50 old ones of another group.
        rows = [(settings.group_id, f"old-{i}", now - 3_600_000) for i in range(250)]
        rows += [(settings.group_id, f"new-{i}", now - 1_000) for i in range(30)]
        rows += [(f"other-{namespace}", f"old-{i}", now - 3_600_000) for i in range(50)]
        await db.run(
            lambda conn: conn.executemany(
                "INSERT INTO processed_events (consumer_group, event_id, processed_at_ms) "
                "VALUES ($1, $2, $3)",
                rows,
            )
        )
        assert await service.prune_inbox_once() == 250  # three batches of at most 100
        assert service.inbox_rows == 30
        assert (await service.health())["inbox_rows"] == 30
        left = await db.fetchval(
            "SELECT count(*) FROM processed_events WHERE consumer_group = $1", f"other-{namespace}"
        )
        assert left == 50, "another group's inbox is its own"
        await db.execute("DELETE FROM processed_events WHERE consumer_group = $1", f"other-{namespace}")
