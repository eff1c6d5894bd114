"""The Postgres L3 adapter's behaviour without pgvector, which the embedded test server (it has pgvector)
cannot show: a clear warning once, exact keys only, no semantic query sent. The SQL paths themselves run
against the real Postgres in tests/integration/test_l3_contract.py (the L3 contract suite)."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

from services.tiers.l3.store import PostgresL3Store


class NoVectorDatabase:
    """Stands in for `Database` on a server without the extension; records what it is asked."""

    has_vector = False

    def __init__(self) -> None:
        self.queries: list[str] = []

    async def fetchrow(self, query: str, *args: Any) -> None:
        self.queries.append(query)
        return None

    async def fetch(self, query: str, *args: Any) -> list[Any]:
        self.queries.append(query)
        return []


async def test_without_pgvector_l3_warns_and_answers_exact_keys_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    db = NoVectorDatabase()
    with caplog.at_level(logging.WARNING):
        store = PostgresL3Store(db, dim=4)  # type: ignore[arg-type]
    assert not store.semantic
    assert any("pgvector is not available" in r.getMessage() for r in caplog.records)
    vec = np.ones(4, dtype=np.float32)
    assert await store.neighbours(vec, 0) == []
    assert db.queries == []
    assert await store.find_neighbours("k", vec, 0) == (None, [])
    assert len(db.queries) == 1 and "<=>" not in db.queries[0] and "d.key = $1" in db.queries[0]
    # The plain real[] column gets a list, and a wrong dimension is refused before any SQL.
    assert store._embedding_param(vec) == [1.0, 1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="3 dimensions; L3 stores 4"):
        store._embedding_param(np.ones(3, dtype=np.float32))
