"""Bring-up on the real servers: Apache Kafka and tansu carry a message across a restart, embedded Postgres
keeps a pgvector row across a restart and a crash on the same DSN, and servers die with their parent."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from infra.brokers import Broker, ExternalBroker, InfraError, TansuBroker
from infra.paths import free_port
from infra.postgres import EmbeddedPostgres, ExternalPostgres, Postgres

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _topic() -> str:
    return f"infra-{uuid.uuid4().hex[:10]}"


async def _produce(bootstrap: str, topic: str, value: bytes) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, partition=0)
    finally:
        await producer.stop()


async def _read(bootstrap: str, topic: str, expected: int, group: str | None = None) -> list[bytes]:
    """Values from partition 0 (from the start, or from the group's committed offset), committing them."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    if group is None:
        consumer.assign([TopicPartition(topic, 0)])
    else:
        consumer.subscribe([topic])
    values: list[bytes] = []
    try:
        deadline = time.monotonic() + 30
        while len(values) < expected and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            values += [record.value for records in batch.values() for record in records if record.value]
        if group is not None:
            await consumer.commit()
    finally:
        await consumer.stop()
    return values


async def test_kafka_keeps_log_and_group_offsets_across_restart(kafka: Broker) -> None:
    topic, group = _topic(), f"g-{uuid.uuid4().hex[:8]}"
    await _produce(kafka.bootstrap, topic, b"before")
    assert await _read(kafka.bootstrap, topic, 1, group) == [b"before"]

    bootstrap = kafka.bootstrap
    await asyncio.to_thread(kafka.restart)
    assert kafka.bootstrap == bootstrap and kafka.is_alive()
    print(f"\n{kafka.name}: restart ready in {kafka.start_seconds:.2f} s")

    await _produce(kafka.bootstrap, topic, b"after")
    # The committed offset survived: the group resumes after "before"; the log itself kept both.
    assert await _read(kafka.bootstrap, topic, 1, group) == [b"after"]
    assert await _read(kafka.bootstrap, topic, 2) == [b"before", b"after"]


@pytest.mark.tansu
async def test_tansu_serves_again_after_restart_but_forgets(tansu: Broker) -> None:
    topic = _topic()
    await _produce(tansu.bootstrap, topic, b"before")
    assert await _read(tansu.bootstrap, topic, 1) == [b"before"]

    bootstrap = tansu.bootstrap
    await asyncio.to_thread(tansu.restart)
    assert tansu.bootstrap == bootstrap and tansu.is_alive()

    await _produce(tansu.bootstrap, topic, b"after")
    # Memory storage: the restart dropped "before" (documented on TansuBroker).
    assert await _read(tansu.bootstrap, topic, 1) == [b"after"]


async def test_external_broker_waits_for_a_live_cluster_and_fails_fast_on_a_dead_one(kafka: Broker) -> None:
    with ExternalBroker(kafka.bootstrap) as external:
        assert external.is_alive()
    dead = ExternalBroker(f"127.0.0.1:{free_port()}", start_timeout_s=0.3)
    assert not dead.is_alive()
    with pytest.raises(InfraError, match="not reachable"):
        dead.start()


async def _fetch(dsn: str, query: str, *args: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetch(query, *args)
    finally:
        await conn.close()


async def test_postgres_keeps_a_vector_row_across_restart_and_crash(postgres: Postgres) -> None:
    table = f"infra_vec_{uuid.uuid4().hex[:8]}"
    await _fetch(postgres.dsn, "CREATE EXTENSION IF NOT EXISTS vector")
    await _fetch(postgres.dsn, f"CREATE TABLE {table} (id int PRIMARY KEY, v vector(3))")
    await _fetch(postgres.dsn, f"INSERT INTO {table} VALUES (1, '[1,0,0]'), (2, '[0,1,0]')")

    dsn = postgres.dsn
    await asyncio.to_thread(postgres.restart)
    assert postgres.dsn == dsn and postgres.is_alive()
    nearest = await _fetch(dsn, f"SELECT id FROM {table} ORDER BY v <=> '[0.9,0.1,0]' LIMIT 1")
    assert [row["id"] for row in nearest] == [1]

    if isinstance(postgres, EmbeddedPostgres):
        postgres.kill()
        assert not postgres.is_alive()
        await asyncio.to_thread(postgres.restart)
        assert postgres.dsn == dsn
    assert len(await _fetch(dsn, f"SELECT id FROM {table}")) == 2
    print(f"\npostgres: restart ready in {postgres.start_seconds:.2f} s")


async def test_external_postgres_connects_and_redacts(postgres: Postgres) -> None:
    with ExternalPostgres(postgres.dsn) as external:
        assert external.is_alive()
    secret = ExternalPostgres(f"postgresql://u:hunter2@127.0.0.1:{free_port()}/x", start_timeout_s=0.3)
    with pytest.raises(InfraError) as failure:
        secret.start()
    assert "hunter2" not in str(failure.value) and "hunter2" not in repr(secret)


def test_postgres_start_failure_reports_the_server_log() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = EmbeddedPostgres(port=taken.getsockname()[1], start_timeout_s=20)
        with pytest.raises(InfraError, match=r"(?s)postgres exited during start.*could not"):
            server.start()
        server.stop()
    assert not server.is_alive()


_ORPHAN = """
import sys
from infra.brokers import TansuBroker
broker = TansuBroker()
broker.start()
print(broker.pid, flush=True)
sys.stdin.read()
"""


@pytest.mark.tansu
def test_server_dies_with_its_parent_process() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    server_pid = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)  # no atexit, no finally: only PR_SET_PDEATHSIG can stop it
    parent.wait()
    deadline = time.monotonic() + 10
    while _running(server_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(server_pid)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"  # a zombie has exited; reaping it is init's job


@pytest.mark.tansu
def test_start_is_idempotent_and_timed() -> None:
    with TansuBroker() as broker:
        first = broker.pid
        broker.start()
        assert broker.pid == first and broker.start_seconds > 0
    broker.stop()
    assert not broker.is_alive()
