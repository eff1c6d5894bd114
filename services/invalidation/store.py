"""The Postgres side of the invalidation service: the dependency index (`cache_dependency_edges`, kept
by a trigger on `cache_descriptors`, migration 0008), the L3 deletes, the inbox, and orphan collection."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from schemas.events import now_ms
from services.invalidation.walk import Via
from services.runtime.postgres import Database, mark_processed


class PostgresDependencyIndex:
    def __init__(self, db: Database, consumer_group: str, *, batch_ids: int = 1_000) -> None:
        self.db = db
        self.consumer_group = consumer_group
        self.batch_ids = batch_ids

    async def dependants(
        self, ids: Sequence[str], vias: Sequence[Via], limit: int
    ) -> list[tuple[str, int | None]]:
        """Distinct entries naming any of `ids` through `vias`, at most `limit` of them, with when each
        was last written. Orphaned edges count (written None): their entry may have just been deleted
        by a tier node, and what depends on it must still go."""
        found: dict[str, int | None] = {}
        for start in range(0, len(ids), self.batch_ids):
            if len(found) >= limit:
                break
            rows = await self.db.fetch(
                "SELECT e.dependant, max(d.updated_at_ms) AS updated_at_ms FROM cache_dependency_edges e "
                "LEFT JOIN cache_descriptors d ON d.key = e.dependant "
                "WHERE e.depends_on = ANY($1::text[]) AND e.via = ANY($2::text[]) "
                "GROUP BY e.dependant LIMIT $3",
                list(ids[start : start + self.batch_ids]),
                list(vias),
                # The full limit each time: rows repeated across batches must not hide the rest.
                limit,
            )
            for r in rows:
                found.setdefault(r["dependant"], r["updated_at_ms"])
        return list(found.items())[:limit]

    async def processed(self, event_id: str) -> bool:
        """True when this event's cascade was carried out before (a redelivery after a restart)."""
        return bool(
            await self.db.fetchval(
                "SELECT EXISTS (SELECT 1 FROM processed_events WHERE consumer_group = $1 AND event_id = $2)",
                self.consumer_group,
                event_id,
            )
        )

    async def delete_entries(self, keys: Sequence[str], older_than_ms: int) -> int:
        """Deletes the descriptors (their L3 values and tags cascade) not rewritten since the change."""
        if not keys:
            return 0
        status = await self.db.execute(
            "DELETE FROM cache_descriptors WHERE key = ANY($1::text[]) AND updated_at_ms <= $2",
            list(keys),
            older_than_ms,
        )
        return int(status.split()[-1])

    async def finish(self, event_id: str, keys: Sequence[str]) -> None:
        """Marks the event done and forgets the followed edges of the deleted dependants, in one
        transaction: until then a redelivery walks the same edges again (idempotent deletes)."""

        async def fn(conn: asyncpg.Connection) -> None:
            if not await mark_processed(conn, self.consumer_group, event_id):
                return
            if keys:
                # Only orphaned edges: an entry put again meanwhile keeps its fresh ones.
                await conn.execute(
                    "DELETE FROM cache_dependency_edges "
                    "WHERE dependant = ANY($1::text[]) AND orphaned_at_ms IS NOT NULL",
                    list(keys),
                )

        await self.db.run(fn)

    async def collect_orphans(self, grace_ms: int, batch: int) -> int:
        """Drops edges whose entry has been gone longer than `grace_ms`; returns how many."""
        status = await self.db.execute(
            "DELETE FROM cache_dependency_edges WHERE ctid IN (SELECT ctid FROM cache_dependency_edges "
            "WHERE orphaned_at_ms IS NOT NULL AND orphaned_at_ms < $1 LIMIT $2)",
            now_ms() - grace_ms,
            batch,
        )
        return int(status.split()[-1])
