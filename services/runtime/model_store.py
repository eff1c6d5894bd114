"""Model checkpoints in Postgres (`model_fits`): each save is a new version, the latest is restored.
Any service that learns online keeps its fits here (heat: the torch MLP; warmup: FTL fits as JSON)."""

from __future__ import annotations

import json
import time
from typing import Protocol

import asyncpg

from services.runtime.postgres import Database


class ModelStore(Protocol):
    async def save(
        self,
        name: str,
        blob: bytes,
        params: dict[str, object],
        metrics: dict[str, object],
        kind: str = "torch",
    ) -> int: ...

    async def latest(self, name: str) -> tuple[int, bytes] | None: ...


class PostgresModelStore:
    def __init__(self, db: Database, keep_versions: int = 5) -> None:
        self._db = db
        self._keep = keep_versions

    async def save(
        self,
        name: str,
        blob: bytes,
        params: dict[str, object],
        metrics: dict[str, object],
        kind: str = "torch",
    ) -> int:
        async def write(conn: asyncpg.Connection) -> int:
            # Serialise writers of the same model so versions never collide.
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", name)
            version = await conn.fetchval(
                "SELECT coalesce(max(version), 0) + 1 FROM model_fits WHERE name = $1", name
            )
            await conn.execute(
                "INSERT INTO model_fits (name, version, kind, params, blob, metrics, created_at_ms) "
                "VALUES ($1, $2, $7, $3::jsonb, $4, $5::jsonb, $6)",
                name,
                version,
                json.dumps(params),
                blob,
                json.dumps(metrics),
                time.time_ns() // 1_000_000,
                kind,
            )
            await conn.execute(
                "DELETE FROM model_fits WHERE name = $1 AND version <= $2", name, version - self._keep
            )
            return int(version)

        return await self._db.run(write)

    async def latest(self, name: str) -> tuple[int, bytes] | None:
        row = await self._db.fetchrow(
            "SELECT version, blob FROM model_fits WHERE name = $1 ORDER BY version DESC LIMIT 1", name
        )
        return None if row is None else (int(row["version"]), bytes(row["blob"]))

    async def newest_of(self, name: str) -> tuple[str, int, bytes] | None:
        """The most recently saved model named `name` or `name@<instance>` (what instances of one
        service save under their own names), as (name, version, blob)."""
        row = await self._db.fetchrow(
            "SELECT name, version, blob FROM model_fits WHERE name = $1 OR starts_with(name, $2) "
            "ORDER BY created_at_ms DESC, version DESC LIMIT 1",
            name,
            name + "@",
        )
        return None if row is None else (str(row["name"]), int(row["version"]), bytes(row["blob"]))
