"""Where the bridge keeps each engine's position (last sequence forwarded, and its epoch): Postgres,
table `bridge_positions` (migration 0009)."""

from __future__ import annotations

from schemas.events import now_ms
from services.bridge.sequence import Position
from services.runtime.postgres import Database


class PostgresPositionStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def load(self, engine_id: str) -> Position | None:
        row = await self.db.fetchrow(
            "SELECT epoch, seq FROM bridge_positions WHERE engine_id = $1", engine_id
        )
        return None if row is None else Position(int(row["epoch"]), int(row["seq"]))

    async def save(self, engine_id: str, position: Position) -> None:
        await self.db.execute(
            "INSERT INTO bridge_positions (engine_id, epoch, seq, updated_at_ms) VALUES ($1, $2, $3, $4) "
            "ON CONFLICT (engine_id) DO UPDATE SET epoch = EXCLUDED.epoch, seq = EXCLUDED.seq, "
            "updated_at_ms = EXCLUDED.updated_at_ms",
            engine_id,
            position.epoch,
            position.seq,
            now_ms(),
        )
