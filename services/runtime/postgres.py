"""The Postgres edge: an asyncpg pool that rides out a database restart, and the migration runner.

`Database.run(fn)` runs `fn(conn)` in a transaction and re-runs it from the start when the
connection is lost, until `pg_retry_deadline_s`; `fn` must therefore be idempotent (the inbox table
`processed_events` makes event handlers so). pgvector's codec is registered when the extension exists.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from services.runtime import metrics
from services.runtime.settings import PostgresSettings

log = logging.getLogger(__name__)

T = TypeVar("T")

CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,  # admin shutdown, cannot connect now
    asyncpg.exceptions.InterfaceError,
)

# InternalClientError: "another operation is in progress" on a connection a restart broke.
BROKEN_CONNECTION_ERRORS = (*CONNECTION_ERRORS, asyncpg.exceptions.InternalClientError)

# Serialises migrations across services starting together.
_MIGRATION_LOCK_ID = 0x63616368656D7368  # "cachemsh"


def redact_dsn(dsn: str) -> str:
    """The DSN with its password replaced by `***`, for logs and errors."""
    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


async def _release_reset(conn: asyncpg.Connection) -> None:
    """The pool's reset on release: nothing more than asyncpg's own cleanup, which runs before it and
    rolls back an open transaction (a caller cancelled mid-way). asyncpg's default would also send
    `SELECT pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL` on every release: a second round
    trip per query (a third of a semantic L3 lookup's time here), for session state this code never
    creates (its advisory locks are transaction-scoped; it neither LISTENs, SETs nor declares cursors)."""
    return None


class Database:
    def __init__(self, settings: PostgresSettings) -> None:
        self._settings = settings
        self._pool: asyncpg.Pool | None = None
        self.has_vector = False

    @property
    def dsn_redacted(self) -> str:
        return redact_dsn(self._settings.database_url.get_secret_value())

    async def start(self) -> None:
        if self._pool is not None:
            return
        deadline = time.monotonic() + self._settings.pg_retry_deadline_s
        backoff = 0.1
        while True:
            try:
                self._pool = await asyncpg.create_pool(
                    self._settings.database_url.get_secret_value(),
                    min_size=self._settings.pg_pool_min,
                    max_size=self._settings.pg_pool_max,
                    command_timeout=self._settings.pg_command_timeout_s,
                    init=self._init_connection,
                    reset=_release_reset,
                )
                break
            except CONNECTION_ERRORS as exc:
                if time.monotonic() > deadline:
                    raise ConnectionError(f"cannot reach Postgres at {self.dsn_redacted}: {exc}") from None
                log.warning("Postgres not reachable yet; retrying", extra={"error": repr(exc)})
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    async def stop(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def _init_connection(self, conn: asyncpg.Connection) -> None:
        if self.has_vector:
            from pgvector.asyncpg import register_vector

            await register_vector(conn)

    async def enable_vector_codec(self) -> None:
        """Called once the extension is known to exist: new connections get the codec, and the
        pool is reset so existing ones do too."""
        self.has_vector = True
        if self._pool is not None:
            await self._pool.expire_connections()

    async def run(self, fn: Callable[[asyncpg.Connection], Awaitable[T]], *, transaction: bool = True) -> T:
        if self._pool is None:
            raise RuntimeError("database is not started")
        deadline = time.monotonic() + self._settings.pg_retry_deadline_s
        backoff = 0.05
        while True:
            try:
                async with self._pool.acquire() as conn:
                    try:
                        if not transaction:
                            return await fn(conn)
                        async with conn.transaction():
                            return await fn(conn)
                    except BROKEN_CONNECTION_ERRORS:
                        # The server went away mid-operation; asyncpg may leave the protocol
                        # believing an operation is still running. Never hand this one out again.
                        conn.terminate()
                        raise
            except BROKEN_CONNECTION_ERRORS as exc:
                if time.monotonic() > deadline:
                    raise
                metrics.DB_RETRIES.inc()
                log.warning("lost the database connection; retrying", extra={"error": repr(exc)})
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    async def execute(self, query: str, *args: Any) -> str:
        return await self.run(lambda c: c.execute(query, *args))

    async def fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        return await self.run(lambda c: c.fetch(query, *args), transaction=False)

    async def fetchrow(self, query: str, *args: Any) -> asyncpg.Record | None:
        return await self.run(lambda c: c.fetchrow(query, *args), transaction=False)

    async def fetchval(self, query: str, *args: Any) -> Any:
        return await self.run(lambda c: c.fetchval(query, *args), transaction=False)

    async def health(self) -> bool:
        if self._pool is None:
            return False
        try:
            async with self._pool.acquire(timeout=2) as conn:
                return bool(await conn.fetchval("SELECT 1", timeout=2))
        except Exception:
            return False


async def mark_processed(conn: asyncpg.Connection, consumer_group: str, event_id: str) -> bool:
    """Records `event_id` for `consumer_group` inside the caller's transaction. False means it was
    applied before: skip the effect (the inbox pattern)."""
    status = await conn.execute(
        "INSERT INTO processed_events (consumer_group, event_id, processed_at_ms) VALUES ($1, $2, $3) "
        "ON CONFLICT DO NOTHING",
        consumer_group,
        event_id,
        time.time_ns() // 1_000_000,
    )
    return bool(status == "INSERT 0 1")


async def prune_processed(db: Database, consumer_group: str, older_than_ms: int, batch: int = 1000) -> int:
    """Forget inbox rows of `consumer_group` recorded before `older_than_ms`, at most `batch` of them
    (one short statement on the age index, so consumers writing the inbox never wait long); returns
    how many went. Call it again while it returns `batch`."""
    status = await db.execute(
        "DELETE FROM processed_events WHERE ctid IN (SELECT ctid FROM processed_events "
        "WHERE consumer_group = $1 AND processed_at_ms < $2 ORDER BY processed_at_ms LIMIT $3)",
        consumer_group,
        older_than_ms,
        batch,
    )
    return int(status.split()[-1])


async def prune_inbox(db: Database, consumer_group: str, older_than_ms: int, batch: int = 1000) -> int:
    """Forget every inbox row of `consumer_group` recorded before `older_than_ms`, `batch` at a time,
    yielding between batches so consumers' transactions get in; returns how many went."""
    pruned = 0
    while True:
        n = await prune_processed(db, consumer_group, older_than_ms, batch)
        pruned += n
        if n < batch:
            return pruned
        await asyncio.sleep(0)


async def count_processed(db: Database, consumer_group: str) -> int:
    return int(
        await db.fetchval("SELECT count(*) FROM processed_events WHERE consumer_group = $1", consumer_group)
    )


# --- migrations ---------------------------------------------------------------------------------

_MIGRATION_FILE = re.compile(
    r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+?)(?:\.(?P<variant>vector|plain))?\.sql$"
)


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    variant: str | None
    sql: str


def load_migrations() -> dict[int, list[Migration]]:
    """Numbered SQL files from `schemas/migrations`, grouped by version (a version may come in a
    `.vector` and a `.plain` variant, for servers with and without pgvector)."""
    by_version: dict[int, list[Migration]] = {}
    for entry in sorted(resources.files("schemas").joinpath("migrations").iterdir(), key=lambda p: p.name):
        match = _MIGRATION_FILE.match(entry.name)
        if match is None:
            continue
        migration = Migration(int(match["version"]), match["name"], match["variant"], entry.read_text())
        by_version.setdefault(migration.version, []).append(migration)
    return by_version


def _choose(variants: list[Migration], has_vector: bool) -> Migration:
    if len(variants) == 1:
        return variants[0]
    wanted = "vector" if has_vector else "plain"
    return next(m for m in variants if m.variant == wanted)


async def apply_migrations(db: Database, embedding_dim: int) -> list[str]:
    """Applies every migration not yet recorded in `schema_migrations`; safe to call from every
    service at start (an advisory lock serialises them). Returns the names applied now."""

    async def migrate(conn: asyncpg.Connection) -> tuple[list[str], bool]:
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK_ID)
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version int PRIMARY KEY, name text NOT NULL, variant text,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {
            r["version"]: r["variant"]
            for r in await conn.fetch("SELECT version, variant FROM schema_migrations")
        }
        has_vector = await _vector_usable(conn)
        applied: list[str] = []
        for version, variants in sorted(load_migrations().items()):
            if version in done:
                continue
            migration = _choose(variants, has_vector)
            sql = migration.sql.replace("__EMBEDDING_DIM__", str(int(embedding_dim)))
            await conn.execute(sql)
            variant = (
                f"{migration.variant}({embedding_dim})"
                if migration.variant == "vector"
                else migration.variant
            )
            await conn.execute(
                "INSERT INTO schema_migrations (version, name, variant) VALUES ($1, $2, $3)",
                version,
                migration.name,
                variant,
            )
            applied.append(
                f"{version:04d}_{migration.name}" + (f".{migration.variant}" if migration.variant else "")
            )
        dims = [v for v in done.values() if v and v.startswith("vector(")]
        if dims and dims[0] != f"vector({embedding_dim})":
            raise RuntimeError(
                f"descriptor embeddings were created as {dims[0]} but CACHEMESH_EMBEDDING_DIM={embedding_dim}"
            )
        installed = await conn.fetchval("SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'vector')")
        return applied, bool(installed)

    applied, vector_installed = await db.run(migrate)
    if vector_installed:
        await db.enable_vector_codec()
    else:
        log.warning(
            "pgvector is not available on this Postgres: descriptors work by exact key; "
            "semantic L3 search is disabled"
        )
    if applied:
        log.info("applied migrations", extra={"migrations": applied})
    return applied


async def _vector_usable(conn: asyncpg.Connection) -> bool:
    """True when the `vector` extension exists or can be created by this role."""
    if await conn.fetchval("SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'vector')"):
        return True
    if not await conn.fetchval("SELECT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'vector')"):
        return False
    try:
        async with conn.transaction():  # a savepoint: a refusal must not abort the migration
            await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        return True
    except asyncpg.exceptions.InsufficientPrivilegeError:
        return False
