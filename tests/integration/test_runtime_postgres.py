"""The runtime's Postgres edge on the embedded server: migrations once and recorded, pgvector in
use, and every write the pool acknowledged survives a restart in the middle of the traffic."""

from __future__ import annotations

import asyncio
import time
import uuid

import numpy as np
import pytest

from services.runtime.postgres import Database, apply_migrations, load_migrations

pytestmark = pytest.mark.integration


async def test_migrations_apply_once_and_are_recorded(pg_settings) -> None:
    db = Database(pg_settings)
    await db.start()
    try:
        await apply_migrations(db, pg_settings.cachemesh_embedding_dim)
        again = await apply_migrations(db, pg_settings.cachemesh_embedding_dim)
        rows = await db.fetch("SELECT version, variant FROM schema_migrations ORDER BY version")
        assert again == []
        assert [r["version"] for r in rows] == sorted(load_migrations())
        assert (
            dict((r["version"], r["variant"]) for r in rows)[2]
            == f"vector({pg_settings.cachemesh_embedding_dim})"
        )
        with pytest.raises(RuntimeError, match="CACHEMESH_EMBEDDING_DIM=768"):
            await apply_migrations(db, 768)
    finally:
        await db.stop()


async def test_descriptor_embeddings_use_pgvector_hnsw(pg_settings) -> None:
    db = Database(pg_settings)
    await db.start()
    try:
        await apply_migrations(db, pg_settings.cachemesh_embedding_dim)
        assert db.has_vector
        dim = pg_settings.cachemesh_embedding_dim
        key = f"k-{uuid.uuid4().hex}"
        vec = np.zeros(dim, dtype=np.float32)
        vec[0] = 1.0
        await db.execute(
            "INSERT INTO cache_descriptors (key, kind, model, created_at_ms, updated_at_ms, embedding) "
            "VALUES ($1, 'prompt', 'm', 0, 0, $2)",
            key,
            vec,
        )
        near = await db.fetchrow(
            "SELECT key, 1 - (embedding <=> $1) AS cosine FROM cache_descriptors "
            "WHERE embedding IS NOT NULL ORDER BY embedding <=> $1 LIMIT 1",
            vec,
        )
        assert near is not None and near["key"] == key and near["cosine"] == pytest.approx(1.0)
        index = await db.fetchval(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'cache_descriptors_embedding_hnsw'"
        )
        assert "hnsw" in index and "vector_cosine_ops" in index
    finally:
        await db.stop()


async def test_acknowledged_writes_survive_a_restart_in_the_middle(pg_settings, postgres) -> None:
    db = Database(pg_settings)
    await db.start()
    table = f"acks_{uuid.uuid4().hex[:8]}"
    await db.execute(f"CREATE TABLE {table} (id int PRIMARY KEY)")
    acknowledged: list[int] = []
    stop = asyncio.Event()

    async def writer(start: int) -> None:
        i = start
        while not stop.is_set():
            await db.run(
                lambda c, i=i: c.execute(f"INSERT INTO {table} (id) VALUES ($1) ON CONFLICT DO NOTHING", i)
            )
            acknowledged.append(i)
            i += 4
            await asyncio.sleep(0.002)

    async def acknowledged_at_least(n: int) -> None:
        deadline = time.monotonic() + 60
        while len(acknowledged) < n and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    writers = [asyncio.create_task(writer(s)) for s in range(4)]
    try:
        await acknowledged_at_least(40)  # writes are flowing before the restart
        before = len(acknowledged)
        await asyncio.to_thread(postgres.restart)
        await acknowledged_at_least(before + 40)  # and again after it
        stop.set()
        await asyncio.gather(*writers)
        stored = {r["id"] for r in await db.fetch(f"SELECT id FROM {table}")}
    finally:
        stop.set()
        await db.stop()
    assert before > 0
    assert len(acknowledged) > before, "writes must go on after the restart"
    assert set(acknowledged) <= stored


async def test_unreachable_database_gives_a_clear_error_without_the_password() -> None:
    from pydantic import SecretStr

    from services.runtime.settings import PostgresSettings

    settings = PostgresSettings(
        database_url=SecretStr("postgresql://svc:hunter2@127.0.0.1:1/nothing"), pg_retry_deadline_s=0.3
    )
    db = Database(settings)
    with pytest.raises(ConnectionError) as err:
        await db.start()
    assert "hunter2" not in str(err.value)
    assert "svc:***@127.0.0.1:1" in str(err.value)
    assert err.value.__cause__ is None


async def test_a_connection_released_inside_a_transaction_comes_back_rolled_back(pg_settings) -> None:
    """The pool skips asyncpg's per-release reset round trip; what it must still undo is an open
    transaction (a caller cancelled between BEGIN and COMMIT): the next user starts clean and the
    uncommitted row is gone."""
    db = Database(pg_settings.model_copy(update={"pg_pool_min": 1, "pg_pool_max": 1}))
    await db.start()
    table = f"t_{uuid.uuid4().hex[:10]}"
    try:
        await db.execute(f"CREATE TABLE {table} (x int)")

        async def stuck(conn) -> None:  # type: ignore[no-untyped-def]
            await conn.execute("BEGIN")
            await conn.execute(f"INSERT INTO {table} VALUES (1)")

        await db.run(stuck, transaction=False)

        async def after(conn) -> tuple[bool, int]:  # type: ignore[no-untyped-def]
            return conn.is_in_transaction(), await conn.fetchval(f"SELECT count(*) FROM {table}")

        assert await db.run(after, transaction=False) == (False, 0)
    finally:
        await db.execute(f"DROP TABLE IF EXISTS {table}")
        await db.stop()
