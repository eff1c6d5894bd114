"""The Postgres adapter of the L3 ports (`ports.py`; docs/design.md §1.1 L3).

`ValueStore` keeps encoded values (codec.py: tensor header + raw payload) by key; `DescriptorStore`
keeps the descriptors with their semantic tags and gives the nearest ones (`neighbours`). `PostgresL3Store`
implements both over asyncpg: `cache_descriptors` + `semantic_tags` + `cache_values` (migration 0006),
one transaction per write, with the invalidation the write owes in `cache_outbox` (migration 0010; the
outbox port of ports.py). Semantic search uses pgvector's HNSW cosine index when the extension
exists; without it L3 answers exact keys only, and says so once with a warning.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Sequence
from typing import Any

import asyncpg
import numpy as np
import numpy.typing as npt

from schemas.events import CacheInvalidated
from schemas.wire import encode
from services.runtime.postgres import Database
from services.tiers.entry import Entry, EntryMeta
from services.tiers.ports import L3Rejected, L3Store, SemanticMatch, Send, StampTaken

log = logging.getLogger(__name__)


_COLUMNS = (
    "d.key, d.kind, d.model, d.ttl_hint_ms, d.similarity_tolerance, d.context_dependency_ids, d.trace_id, "
    "d.size_bytes, d.created_at_ms, d.updated_at_ms, d.embedding, d.prompt_text, v.value, "
    "ARRAY(SELECT t.tag FROM semantic_tags t WHERE t.key = d.key ORDER BY t.tag) AS tag_names, "
    "ARRAY(SELECT t.value FROM semantic_tags t WHERE t.key = d.key ORDER BY t.tag) AS tag_values"
)
_FROM = "FROM cache_descriptors d JOIN cache_values v ON v.key = d.key"
_LIVE = "(d.expires_at_ms IS NULL OR d.expires_at_ms > $2)"

_UPSERT_DESCRIPTOR = """
INSERT INTO cache_descriptors (key, kind, model, ttl_hint_ms, similarity_tolerance, context_dependency_ids,
    trace_id, size_bytes, tier, created_at_ms, updated_at_ms, last_access_ms, embedding, prompt_text)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'l3', $9, $10, NULL, $11, $12)
ON CONFLICT (key) DO UPDATE SET
    kind = EXCLUDED.kind, model = EXCLUDED.model, ttl_hint_ms = EXCLUDED.ttl_hint_ms,
    similarity_tolerance = EXCLUDED.similarity_tolerance,
    context_dependency_ids = EXCLUDED.context_dependency_ids, trace_id = EXCLUDED.trace_id,
    size_bytes = EXCLUDED.size_bytes, tier = EXCLUDED.tier, updated_at_ms = EXCLUDED.updated_at_ms,
    embedding = EXCLUDED.embedding, prompt_text = EXCLUDED.prompt_text
WHERE cache_descriptors.updated_at_ms < EXCLUDED.updated_at_ms
"""
_STAMP_OF = "SELECT updated_at_ms FROM cache_descriptors WHERE key = $1"
_REPLACE_TAGS = (
    "INSERT INTO semantic_tags (key, tag, value) SELECT $1, u.tag, u.value "
    "FROM unnest($2::text[], $3::text[]) AS u(tag, value)"
)
_OUTBOX_INSERT = "INSERT INTO cache_outbox (event_id, topic, key, payload) VALUES ($1, $2, $3, $4)"
_OUTBOX_DUE = """
SELECT seq, key, payload FROM cache_outbox
WHERE topic = $1 AND created_at <= clock_timestamp() - make_interval(secs => $2::float8 / 1000)
ORDER BY seq LIMIT $3 FOR UPDATE SKIP LOCKED
"""
_UPSERT_VALUE = """
INSERT INTO cache_values (key, value, checksum, updated_at_ms) VALUES ($1, $2, $3, $4)
ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, checksum = EXCLUDED.checksum,
    updated_at_ms = EXCLUDED.updated_at_ms
"""


def _as_vector(value: Any) -> np.ndarray:
    # pgvector's codec gives a Vector; the plain real[] column a list.
    raw = value.to_numpy() if hasattr(value, "to_numpy") else value
    return np.asarray(raw, dtype=np.float32)


def _entry(row: asyncpg.Record) -> Entry:
    emb = row["embedding"]
    meta = EntryMeta(
        key=row["key"],
        kind=row["kind"],
        model=row["model"],
        embedding=None if emb is None else _as_vector(emb),
        similarity_tolerance=round(float(row["similarity_tolerance"]), 6),  # a real column: float32
        ttl_hint_ms=row["ttl_hint_ms"],
        trace_id=row["trace_id"],
        context_dependency_ids=tuple(row["context_dependency_ids"] or ()),
        semantic_tags=dict(zip(row["tag_names"] or (), row["tag_values"] or (), strict=True)),
        created_at_ms=row["created_at_ms"],
        updated_at_ms=row["updated_at_ms"],
        size_bytes=row["size_bytes"],
        prompt_text=row["prompt_text"],
    )
    return Entry(meta, row["value"])


class PostgresL3Store(L3Store):
    """L3 on Postgres; `db` must have had `apply_migrations` run (the service does that at start).
    `outbox_topic`: the (qualified) topic of the invalidations this node's outbox rows go to, and the
    only rows its relay takes (None: no broker, nothing recorded)."""

    def __init__(self, db: Database, *, dim: int, outbox_topic: str | None = None) -> None:
        self.db = db
        self.dim = dim
        self.outbox_topic = outbox_topic
        self.semantic = db.has_vector
        if not self.semantic:
            log.warning(
                "pgvector is not available: L3 answers exact keys only; semantic lookups are served "
                "from L1 alone (install pgvector to search L3 by embedding)"
            )

    def _embedding_param(self, embedding: np.ndarray | None) -> Any:
        if embedding is None:
            return None
        vec = np.asarray(embedding, dtype=np.float32).reshape(-1)
        if vec.shape[0] != self.dim:
            raise ValueError(f"embedding has {vec.shape[0]} dimensions; L3 stores {self.dim}")
        # pgvector's codec takes numpy; the plain real[] column takes a list.
        return vec if self.semantic else vec.tolist()

    async def _record(self, conn: asyncpg.Connection, announce: CacheInvalidated | None) -> None:
        if announce is not None and self.outbox_topic is not None:
            await conn.execute(
                _OUTBOX_INSERT, announce.event_id, self.outbox_topic, announce.key, encode(announce)
            )

    async def put(self, entry: Entry, *, announce: CacheInvalidated | None = None) -> None:
        m = entry.meta
        try:
            embedding = self._embedding_param(m.embedding)
        except ValueError as exc:  # the data, not L3: a retry would fail the same way
            raise L3Rejected(f"L3 refused {m.key!r}: {exc}") from exc
        names = sorted(m.semantic_tags)
        values = [m.semantic_tags[n] for n in names]
        checksum = zlib.crc32(entry.blob)

        async def write(conn: asyncpg.Connection) -> None:
            await self._record(conn, announce)
            status = await conn.execute(
                _UPSERT_DESCRIPTOR,
                m.key,
                m.kind,
                m.model,
                m.ttl_hint_ms,
                m.similarity_tolerance,
                list(m.context_dependency_ids),
                m.trace_id,
                len(entry.blob),
                m.created_at_ms,
                m.updated_at_ms,
                embedding,
                m.prompt_text,
            )
            if status == "INSERT 0 0":
                # A write of the key at least as new is there (two nodes' writes, or a write-behind
                # flushed late), its row locked by the conflict: the store keeps the newest, whichever
                # transaction commits last; the same stamp is a tie no node could break, refused.
                held = await conn.fetchval(_STAMP_OF, m.key)
                if held == m.updated_at_ms:
                    raise StampTaken(m.key, held)
                return
            await conn.execute("DELETE FROM semantic_tags WHERE key = $1", m.key)
            if names:
                await conn.execute(_REPLACE_TAGS, m.key, names, values)
            await conn.execute(_UPSERT_VALUE, m.key, entry.blob, checksum, m.updated_at_ms)

        try:
            await self.db.run(write)
        except (asyncpg.DataError, asyncpg.IntegrityConstraintViolationError) as exc:
            raise L3Rejected(f"L3 refused {m.key!r}: {exc}") from exc

    async def get(self, key: str, now_ms: int) -> Entry | None:
        row = await self.db.fetchrow(f"SELECT {_COLUMNS} {_FROM} WHERE d.key = $1 AND {_LIVE}", key, now_ms)
        return None if row is None else _entry(row)

    async def get_many(self, keys: Sequence[str], now_ms: int) -> dict[str, Entry]:
        if not keys:
            return {}
        rows = await self.db.fetch(
            f"SELECT {_COLUMNS} {_FROM} WHERE d.key = ANY($1::text[]) AND {_LIVE}", list(keys), now_ms
        )
        return {r["key"]: _entry(r) for r in rows}

    async def neighbours(
        self,
        embedding: npt.ArrayLike,
        now_ms: int,
        *,
        model: str | None = None,
        min_similarity: float = 0.0,
        candidates: int = 4,
    ) -> list[SemanticMatch]:
        if not self.semantic:
            return []
        rows = await self._nearest(None, embedding, now_ms, model, candidates, min_similarity)
        return [SemanticMatch(_entry(r), s) for r in rows if (s := float(r["similarity"])) >= min_similarity]

    async def find_neighbours(
        self,
        key: str,
        embedding: npt.ArrayLike,
        now_ms: int,
        *,
        model: str | None = None,
        min_similarity: float = 0.0,
        candidates: int = 4,
    ) -> tuple[Entry | None, list[SemanticMatch]]:
        if not self.semantic:
            entry = await self.get(key, now_ms)
            ok = entry is not None and (model is None or entry.meta.model == model)
            return (entry, []) if ok else (None, [])
        rows = await self._nearest(key, embedding, now_ms, model, candidates, min_similarity)
        for row in rows:
            if float(row["similarity"]) > 1.5:
                return _entry(row), []
        return None, [
            SemanticMatch(_entry(r), s) for r in rows if (s := float(r["similarity"])) >= min_similarity
        ]

    async def _nearest(
        self,
        key: str | None,
        embedding: npt.ArrayLike,
        now_ms: int,
        model: str | None,
        candidates: int,
        min_similarity: float = 0.0,
    ) -> list[asyncpg.Record]:
        """The nearest live neighbours at least `min_similarity` close, best first, and (with `key`) the
        exact row first, marked with similarity 2: one round trip."""
        vec = self._embedding_param(np.asarray(embedding, dtype=np.float32))
        args: list[Any] = [vec, now_ms, int(candidates)]
        model_filter = ""
        if model is not None:
            args.append(model)
            model_filter = f" AND d.model = ${len(args)}"
        floor = ""
        if min_similarity > 0.0:
            # In SQL, not after: most semantic lookups find nothing that close, and then no candidate
            # row (its value, embedding and tags) is read, sent and decoded only to be dropped. The
            # same expression as the similarity column, so the same rows pass as the filter above.
            args.append(float(min_similarity))
            floor = f" AND 1 - (d.embedding <=> $1) >= ${len(args)}"
        # The nearest keys first, from the descriptors alone, then the columns of those few rows: joined
        # before the LIMIT, Postgres joins every candidate row's value (and runs the tag subqueries)
        # before it sorts (EXPLAIN: a hash join over all 500 rows of a model, 1.1 ms -> 0.4 ms).
        near = (
            f"(SELECT {_COLUMNS}, n.similarity FROM "
            "(SELECT d.key, 1 - (d.embedding <=> $1) AS similarity FROM cache_descriptors d "
            f"WHERE d.embedding IS NOT NULL AND {_LIVE}{model_filter}{floor} "
            "ORDER BY d.embedding <=> $1 LIMIT $3) n "
            "JOIN cache_descriptors d ON d.key = n.key JOIN cache_values v ON v.key = d.key "
            "ORDER BY n.similarity DESC)"
        )
        if key is None:
            return list(await self.db.fetch(near, *args))
        args.append(key)
        exact = (
            f"(SELECT {_COLUMNS}, 2.0::float8 AS similarity {_FROM} "
            f"WHERE d.key = ${len(args)} AND {_LIVE}{model_filter})"
        )
        return list(await self.db.fetch(f"{exact} UNION ALL {near}", *args))

    async def delete(self, key: str, *, announce: CacheInvalidated | None = None) -> bool:
        async def drop(conn: asyncpg.Connection) -> bool:
            await self._record(conn, announce)
            return bool(await conn.execute("DELETE FROM cache_descriptors WHERE key = $1", key) == "DELETE 1")

        return await self.db.run(drop)

    async def outbox_sent(self, event_ids: Sequence[str]) -> int:
        if not event_ids:
            return 0
        status = await self.db.execute(
            "DELETE FROM cache_outbox WHERE event_id = ANY($1::text[])", list(event_ids)
        )
        return int(status.split()[-1])

    async def relay_outbox(self, send: Send, *, older_than_ms: int, limit: int = 500) -> int:
        if self.outbox_topic is None:
            return 0
        topic = self.outbox_topic

        async def relay(conn: asyncpg.Connection) -> int:
            # The rows stay locked (other relays skip them) until they are sent and gone, or the send
            # fails and the transaction rolls back: a row is deleted only once the broker has it.
            rows = await conn.fetch(_OUTBOX_DUE, topic, older_than_ms, limit)
            if rows:
                await send([(r["key"], bytes(r["payload"])) for r in rows])
                await conn.execute(
                    "DELETE FROM cache_outbox WHERE seq = ANY($1::bigint[])", [r["seq"] for r in rows]
                )
            return len(rows)

        return await self.db.run(relay)

    async def delete_bound_to(self, trace_id: str) -> list[str]:
        rows = await self.db.run(
            lambda c: c.fetch(
                "DELETE FROM cache_descriptors "
                "WHERE trace_id = $1 OR context_dependency_ids @> ARRAY[$1]::text[] RETURNING key",
                trace_id,
            )
        )
        return [r["key"] for r in rows]

    async def delete_expired(self, now_ms: int, limit: int = 1000) -> int:
        status = await self.db.execute(
            "DELETE FROM cache_descriptors WHERE key IN (SELECT key FROM cache_descriptors "
            "WHERE expires_at_ms <= $1 LIMIT $2)",
            now_ms,
            limit,
        )
        return int(status.split()[-1])
