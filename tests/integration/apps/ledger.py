"""A minimal service on the runtime, for the runtime's own tests: it applies `cache.accessed`
events to a Postgres ledger exactly once in effect (inbox pattern), optionally slowly."""

from __future__ import annotations

import asyncio
import os
from contextlib import AsyncExitStack

import asyncpg
from pydantic_settings import SettingsConfigDict

from schemas.events import CacheAccessed
from services.runtime.kafka import Delivery
from services.runtime.postgres import Database, mark_processed
from services.runtime.service import Service, run_service
from services.runtime.settings import ServiceSettings

LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS test_ledger (
    ledger text NOT NULL, event_id text NOT NULL, amount bigint NOT NULL, PRIMARY KEY (ledger, event_id));
CREATE TABLE IF NOT EXISTS test_ledger_totals (
    ledger text PRIMARY KEY, total bigint NOT NULL DEFAULT 0, applications bigint NOT NULL DEFAULT 0,
    redelivered bigint NOT NULL DEFAULT 0);
"""


class LedgerSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="LEDGER_", frozen=True, extra="ignore")

    ledger: str = "default"
    group_id: str = "ledger"
    apply_delay_ms: int = 0


class LedgerService(Service):
    name = "ledger"

    def __init__(self, settings: LedgerSettings) -> None:
        super().__init__(settings)
        self.ledger_settings = settings
        self.db: Database | None = None

    async def open(self, stack: AsyncExitStack) -> None:
        self.db = await self.open_database(stack)
        await self.db.execute(LEDGER_DDL)
        publisher = await self.open_publisher(stack)
        await self.open_consumer(
            stack, [CacheAccessed.topic], self.ledger_settings.group_id, self.apply, publisher
        )

    async def apply(self, delivery: Delivery) -> None:
        assert self.db is not None
        event = delivery.event
        assert isinstance(event, CacheAccessed)
        settings = self.ledger_settings
        if settings.apply_delay_ms:
            await asyncio.sleep(settings.apply_delay_ms / 1000)

        async def write(conn: asyncpg.Connection) -> None:
            if not await mark_processed(conn, settings.group_id, event.event_id):
                # Seen before (a redelivery after a crash): count it, apply nothing.
                await conn.execute(
                    "INSERT INTO test_ledger_totals (ledger, redelivered) VALUES ($1, 1) "
                    "ON CONFLICT (ledger) DO UPDATE SET redelivered = test_ledger_totals.redelivered + 1",
                    settings.ledger,
                )
                return
            amount = event.size_bytes or 0
            await conn.execute(
                "INSERT INTO test_ledger (ledger, event_id, amount) VALUES ($1, $2, $3)",
                settings.ledger,
                event.event_id,
                amount,
            )
            await conn.execute(
                "INSERT INTO test_ledger_totals (ledger, total, applications) VALUES ($1, $2, 1) "
                "ON CONFLICT (ledger) DO UPDATE SET total = test_ledger_totals.total + $2, "
                "applications = test_ledger_totals.applications + 1",
                settings.ledger,
                amount,
            )

        await self.db.run(write)


if __name__ == "__main__":
    os.environ.setdefault("LEDGER_LOG_LEVEL", "WARNING")
    run_service(lambda: LedgerService(LedgerSettings()))
