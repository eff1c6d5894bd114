"""The L3 contract (tests/contract/l3_contract.py) against `PostgresL3Store` on the real Postgres with
pgvector. The suite runs in a schema of its own (migrations applied there), emptied before each test,
so sweeping and searching never meet other tests' rows."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
from pydantic import SecretStr

from services.runtime.postgres import Database, apply_migrations
from services.runtime.settings import PostgresSettings
from services.tiers.l3.store import PostgresL3Store
from tests.contract.l3_contract import DIM, SemanticL3Contract

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
async def contract_db(postgres) -> AsyncIterator[Database]:  # type: ignore[no-untyped-def]
    schema = f"l3_contract_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(postgres.dsn)
    try:
        await admin.execute(f"CREATE SCHEMA {schema}")
        # The migrations create pgvector where the search path points first: on a fresh server (this
        # file run alone) that would be the test schema, and the codec looks for public.vector.
        try:
            await admin.execute("CREATE EXTENSION IF NOT EXISTS vector SCHEMA public")
        except asyncpg.PostgresError:
            pass  # no pgvector on this server: the fixture skips below
        # asyncpg hands unknown DSN parameters to the server as session settings: every pooled
        # connection resolves the tables in this schema first (pgvector's type stays in public).
        sep = "&" if "?" in postgres.dsn else "?"
        dsn = f"{postgres.dsn}{sep}search_path={schema},public"
        db = Database(
            PostgresSettings(database_url=SecretStr(dsn), pg_retry_deadline_s=30, cachemesh_embedding_dim=DIM)
        )
        await db.start()
        try:
            await apply_migrations(db, DIM)
            if not db.has_vector:
                pytest.skip("this Postgres has no pgvector")  # tests/integration/test_tiers_no_pgvector.py
            yield db
        finally:
            await db.stop()
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await admin.close()


class TestPostgresL3Store(SemanticL3Contract):
    @pytest.fixture
    async def store(self, contract_db: Database) -> PostgresL3Store:
        await contract_db.execute("TRUNCATE cache_descriptors, cache_outbox CASCADE")
        store = PostgresL3Store(contract_db, dim=DIM, outbox_topic="contract.cache.invalidated")
        assert store.semantic, "the contract's Postgres needs pgvector (the embedded server has it)"
        return store
