"""Postgres without pgvector, on the real server: the embedded Postgres ships pgvector, so each test makes
its own database owned by the superuser and a login role that may use it (CONNECT, CREATE on schema
public) but not create the untrusted `vector` extension. The migration runner takes the plain variant
and warns; L3 keeps descriptors, tags and values by exact key, semantic L3 search is off with a clear
warning, and a whole tier node runs on it without crashing."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import numpy as np
import pytest
from pydantic import SecretStr

from services.runtime.postgres import Database, apply_migrations, load_migrations
from services.runtime.settings import PostgresSettings
from services.tiers.edge.client import AsyncTiersClient
from services.tiers.entry import Entry, EntryMeta, encode_text
from services.tiers.l3.store import PostgresL3Store
from tests.integration.nodes import running

pytestmark = pytest.mark.integration

DIM = 384


def _with(dsn: str, *, user: str | None = None, password: str | None = None, database: str) -> str:
    parts = urlsplit(dsn)
    host = parts.hostname or "127.0.0.1"
    port = f":{parts.port}" if parts.port else ""
    login = user if user is not None else (parts.username or "")
    secret = f":{password}" if password else ""
    return urlunsplit(parts._replace(netloc=f"{login}{secret}@{host}{port}", path=f"/{database}"))


@pytest.fixture
async def no_vector_dsn(postgres) -> AsyncIterator[str]:  # type: ignore[no-untyped-def]
    """A fresh database and a role that cannot create extensions there; dropped afterwards."""
    name = f"novec_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(postgres.dsn)
    try:
        if not await admin.fetchval("SELECT rolsuper FROM pg_roles WHERE rolname = current_user"):
            pytest.skip("needs a superuser DATABASE_URL to create a database and a role")
        if not await admin.fetchval(
            "SELECT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'vector')"
        ):
            pytest.skip("this server has no pgvector at all; the plain path is then the only one")
        await admin.execute(f"CREATE ROLE {name} LOGIN PASSWORD 'pw' NOSUPERUSER NOCREATEDB NOCREATEROLE")
        await admin.execute(f"CREATE DATABASE {name}")  # owned by the superuser: no CREATE for the role
        await admin.execute(f"GRANT CONNECT ON DATABASE {name} TO {name}")
        inside = await asyncpg.connect(_with(postgres.dsn, database=name))
        try:
            await inside.execute(f"GRANT USAGE, CREATE ON SCHEMA public TO {name}")
        finally:
            await inside.close()
        yield _with(postgres.dsn, user=name, password="pw", database=name)
    finally:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await admin.execute(f"DROP ROLE IF EXISTS {name}")
        await admin.close()


def _settings(dsn: str) -> PostgresSettings:
    return PostgresSettings(database_url=SecretStr(dsn), pg_retry_deadline_s=10, cachemesh_embedding_dim=DIM)


def _vec(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(DIM)
    return (v / np.linalg.norm(v)).astype(np.float32)


async def test_migrations_and_l3_without_pgvector(
    no_vector_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    db = Database(_settings(no_vector_dsn))
    await db.start()
    try:
        applied = await apply_migrations(db, DIM)
        assert "0002_descriptor_embedding.plain" in applied
        assert not db.has_vector
        assert "pgvector is not available on this Postgres" in caplog.text
        rows = await db.fetch("SELECT version, variant FROM schema_migrations ORDER BY version")
        assert [r["version"] for r in rows] == sorted(load_migrations())
        assert dict((r["version"], r["variant"]) for r in rows)[2] == "plain"
        assert not await db.fetchval("SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'vector')")
        column = await db.fetchval(
            "SELECT data_type FROM information_schema.columns "
            "WHERE table_name = 'cache_descriptors' AND column_name = 'embedding'"
        )
        assert column == "ARRAY"
        assert await apply_migrations(db, DIM) == []  # a second start applies nothing, still plain

        caplog.clear()
        l3 = PostgresL3Store(db, dim=DIM)
        assert not l3.semantic
        assert "semantic lookups are served from L1 alone" in caplog.text
        vec = _vec(1)
        meta = EntryMeta(
            key="q:1",
            kind="prompt",
            model="m",
            embedding=vec,
            trace_id="conv-1",
            semantic_tags={"lang": "en"},
            created_at_ms=1,
            updated_at_ms=1,
        )
        blob = encode_text("an answer", model="m")
        await l3.put(Entry(meta, blob))
        got = await l3.get("q:1", now_ms=2)
        assert got is not None and got.blob == blob
        assert got.meta.semantic_tags == {"lang": "en"} and got.meta.trace_id == "conv-1"
        np.testing.assert_allclose(got.meta.embedding, vec, rtol=1e-6)  # kept as real[]
        assert set(await l3.get_many(["q:1", "nope"], now_ms=2)) == {"q:1"}
        assert await l3.neighbours(vec, now_ms=2) == []  # no semantic L3 here
        exact, near = await l3.find_neighbours("q:1", vec, now_ms=2)
        assert exact is not None and exact.key == "q:1" and near == []
        assert await l3.find_neighbours("other", vec, now_ms=2) == (None, [])
        assert await l3.delete_bound_to("conv-1") == ["q:1"]
        assert await l3.get("q:1", now_ms=2) is None
    finally:
        await db.stop()


async def test_a_tier_node_runs_on_postgres_without_pgvector(
    kafka, topics_on, node_settings, no_vector_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    await topics_on(kafka)
    novec = node_settings("novec", postgres=_settings(no_vector_dsn), match_rule="fixed")  # serves by vector
    async with running(novec) as node:
        assert node.cache is not None and node.l3 is not None and not node.l3.semantic
        assert "pgvector is not available" in caplog.text
        async with AsyncTiersClient(node.api_url) as client:
            vec = _vec(2)
            put = await client.put("faq:1", "cached answer", model="m", embedding=vec)
            assert put["persisted"]
            near = await client.lookup(embedding=vec)
            assert (near.hit, near.tier, near.match) == (True, "l1", "semantic")  # L1 still searches
            node.cache.l1.remove("faq:1")
            assert node.cache.l2 is not None
            node.cache.l2.remove("faq:1")
            by_vec = await client.lookup(embedding=vec)
            assert not by_vec.hit and not by_vec.degraded  # L3 cannot search by embedding: a plain miss
            both = await client.lookup("faq:1", embedding=vec)
            assert (both.hit, both.tier, both.match, both.value) == (True, "l3", "exact", "cached answer")
            stats = await client.stats()
            assert stats["l3"]["semantic_search"] is False and stats["l3"]["errors"] == 0
            assert await client.delete("faq:1")
        health = await node.health()
        assert health["healthy"] and health["database"]
