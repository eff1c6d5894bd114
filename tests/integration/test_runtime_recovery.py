"""The runtime under failure, on real Apache Kafka and Postgres: a consumer killed mid-batch, the
database restarted under a running service, the broker restarted. Every event's effect lands once."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import asyncpg
import pytest

from schemas.events import CacheAccessed
from schemas.topics import dlq_name, qualified
from services.runtime.publisher import EventPublisher
from services.runtime.settings import PostgresSettings
from tests.integration.apps.ledger import LedgerService, LedgerSettings
from tests.integration.conftest import kafka_settings_for
from tests.integration.test_runtime_kafka import _read_all

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


async def _totals(dsn: str, ledger: str) -> tuple[int, int, int]:
    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow(
            "SELECT total, applications, redelivered FROM test_ledger_totals WHERE ledger = $1", ledger
        )
    except asyncpg.UndefinedTableError:
        row = None
    finally:
        await conn.close()
    return (row["total"], row["applications"], row["redelivered"]) if row else (0, 0, 0)


async def _wait_for(
    dsn: str, ledger: str, applications: int, timeout_s: float = 60.0
) -> tuple[int, int, int]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        totals = await _totals(dsn, ledger)
        if totals[1] >= applications or loop.time() > deadline:
            return totals
        await asyncio.sleep(0.1)


def _events(n: int, start: int = 0) -> list[CacheAccessed]:
    return [CacheAccessed(key=f"k{i % 37}", hit=i % 3 == 0, size_bytes=i) for i in range(start, start + n)]


async def _publish(publisher: EventPublisher, events: list[CacheAccessed]) -> None:
    for event in events:
        await publisher.publish(event, wait=False)
    await publisher.stop()  # flushes and waits for every acknowledgement
    await publisher.start()


async def test_consumer_killed_mid_batch_applies_every_event_exactly_once(
    kafka, postgres, namespace, topics_on
) -> None:
    await topics_on(kafka)
    settings = kafka_settings_for(kafka, namespace)
    publisher = EventPublisher(settings)
    await publisher.start()
    events = _events(400)
    await _publish(publisher, events)
    await publisher.stop()

    ledger = f"kill-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "KAFKA_BOOTSTRAP": kafka.bootstrap,
        "KAFKA_TOPIC_NAMESPACE": namespace,
        "KAFKA_MAX_POLL_RECORDS": "50",
        "DATABASE_URL": postgres.dsn,
        "LEDGER_LEDGER": ledger,
        "LEDGER_GROUP_ID": f"ledger-{ledger}",
        "LEDGER_APPLY_DELAY_MS": "4",
    }

    def spawn() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.integration.apps.ledger"],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    first = spawn()
    try:
        before_kill = await _wait_for(postgres.dsn, ledger, applications=120)
        assert before_kill[1] >= 120, first.stderr.read().decode()[-2000:] if first.poll() is not None else ""
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
    killed_at = (await _totals(postgres.dsn, ledger))[1]
    assert killed_at < len(events), "the kill must land before the consumer finished"

    second = spawn()
    try:
        total, applications, redelivered = await _wait_for(postgres.dsn, ledger, applications=len(events))
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(20) == 0, second.stderr.read().decode()[-2000:]

    assert applications == len(events)
    assert total == sum(e.size_bytes or 0 for e in events)
    # The killed process had applied events whose offsets it never committed: they came again
    # and were recognised, not re-applied.
    assert redelivered >= 1
    assert await _read_all(kafka.bootstrap, dlq_name(qualified(CacheAccessed.topic, namespace)), 1, 2) == []


async def test_postgres_restart_under_a_running_service_loses_no_write(
    kafka, postgres, namespace, topics_on, pg_settings: PostgresSettings
) -> None:
    await topics_on(kafka)
    kafka_settings = kafka_settings_for(kafka, namespace)
    ledger = f"pg-{uuid.uuid4().hex[:8]}"
    settings = LedgerSettings(
        kafka=kafka_settings,
        postgres=pg_settings,
        ledger=ledger,
        group_id=f"ledger-{ledger}",
        apply_delay_ms=2,
    )
    publisher = EventPublisher(kafka_settings)
    await publisher.start()
    events = _events(300)
    async with LedgerService(settings) as service:
        runner = asyncio.create_task(service.run())
        await _publish(publisher, events[:150])
        await _wait_for(postgres.dsn, ledger, applications=50)
        await asyncio.to_thread(postgres.restart)
        await _publish(publisher, events[150:])
        total, applications, _ = await _wait_for(postgres.dsn, ledger, applications=len(events))
        health = await service.health()
        service.request_stop()
        await runner
    await publisher.stop()

    assert applications == len(events)
    assert total == sum(e.size_bytes or 0 for e in events)
    assert health["healthy"] is True


async def test_service_survives_a_broker_restart(kafka, postgres, namespace, topics_on, pg_settings) -> None:
    await topics_on(kafka)
    kafka_settings = kafka_settings_for(kafka, namespace)
    ledger = f"broker-{uuid.uuid4().hex[:8]}"
    settings = LedgerSettings(
        kafka=kafka_settings, postgres=pg_settings, ledger=ledger, group_id=f"ledger-{ledger}"
    )
    events = _events(200)
    async with LedgerService(settings) as service:
        runner = asyncio.create_task(service.run())
        publisher = EventPublisher(kafka_settings)
        await publisher.start()
        await _publish(publisher, events[:100])
        await _wait_for(postgres.dsn, ledger, applications=100)
        await publisher.stop()
        await asyncio.to_thread(kafka.restart)
        publisher = EventPublisher(kafka_settings)
        await publisher.start()
        await _publish(publisher, events[100:])
        await publisher.stop()
        total, applications, _ = await _wait_for(postgres.dsn, ledger, applications=len(events), timeout_s=90)
        service.request_stop()
        await runner

    assert applications == len(events)
    assert total == sum(e.size_bytes or 0 for e in events)
