"""In-memory stand-ins for unit tests: an L3 port over dicts (with an injectable latency on a fake clock,
and failures), a settable clock, other nodes' L2 as a dict, and an in-memory RDMA fabric (no device
here). Integration tests use the real Postgres and real sockets. `MemoryL3` passes the same contract
suite as `PostgresL3Store` (tests/contract/l3_contract.py), so it refuses what Postgres refuses."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt

from schemas.events import CacheInvalidated
from schemas.wire import encode
from services.tiers.entry import Entry, EntryMeta
from services.tiers.l1.vector_index import normalize
from services.tiers.l2.block_pool import BlockPool
from services.tiers.l2.net.frames import QpInfo, ServerHello, decode_client_hello, encode_server_hello
from services.tiers.l2.net.rdma import RdmaEndpoint
from services.tiers.l2.net.rdma_plan import RdmaOp
from services.tiers.ports import L3Rejected, L3Store, RemoteHit, RemoteL2, SemanticMatch, Send, StampTaken


class Clock:
    """Wall ms, monotonic ms and perf ns in one settable counter."""

    def __init__(self, start_ms: int = 1_000_000) -> None:
        self.ms = start_ms

    def __call__(self) -> int:
        return self.ms

    def ns(self) -> int:
        return self.ms * 1_000_000

    def advance(self, ms: int) -> None:
        self.ms += ms


_KINDS = ("prompt", "embedding", "kv_block")


def _refusal(meta: EntryMeta, dim: int | None, semantic: bool) -> str | None:
    """Why Postgres would refuse this descriptor (migrations 0001-0003's constraints, text without NUL,
    pgvector's finite vectors of the column's dimension), or None."""
    texts: Iterable[str | None] = (
        meta.key,
        meta.model,
        meta.trace_id,
        meta.prompt_text,
        *meta.context_dependency_ids,
        *meta.semantic_tags,
        *meta.semantic_tags.values(),
    )
    if any(t is not None and "\x00" in t for t in texts):
        return "text with a NUL character"
    if not 1 <= len(meta.key) <= 512:
        return "key length outside 1..512"
    if meta.kind not in _KINDS:
        return f"kind {meta.kind!r}"
    if meta.ttl_hint_ms is not None and meta.ttl_hint_ms <= 0:
        return "ttl_hint_ms must be positive"
    if not 0 <= meta.similarity_tolerance <= 1:
        return "similarity_tolerance outside 0..1"
    if any(not 1 <= len(tag) <= 128 for tag in meta.semantic_tags):
        return "tag name length outside 1..128"
    if meta.embedding is not None:
        vec = np.asarray(meta.embedding, dtype=np.float32).reshape(-1)
        if dim is not None and vec.shape[0] != dim:
            return f"embedding has {vec.shape[0]} dimensions; L3 stores {dim}"
        if semantic and not np.all(np.isfinite(vec)):
            return "non-finite embedding"
    return None


def _unit_or_none(v: npt.ArrayLike) -> np.ndarray | None:
    """A zero or non-finite vector has no cosine: pgvector's `<=>` gives NaN, which never matches."""
    try:
        return normalize(v)[0]
    except ValueError:
        return None


class MemoryL3(L3Store):
    """L3 over a dict, behaving as `PostgresL3Store` does: the same refusals (as `L3Rejected`, nothing
    written), `created_at_ms` kept across replacements, `size_bytes` the stored value's length, the
    tolerance read back through a float32 column, the embedding as a float32 copy."""

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        latency_ms: int = 0,
        semantic: bool = True,
        fail: bool = False,
        dim: int | None = None,
    ) -> None:
        self.rows: dict[str, Entry] = {}
        self.dim = dim
        self.clock = clock
        self.latency_ms = latency_ms
        self.semantic = semantic
        self.fail = fail
        self.calls = 0
        self.reject: set[str] = set()  # keys whose writes L3 refuses as bad data
        # The outbox: (event id, key, JSON, monotonic ms recorded), oldest first.
        self.outbox: list[tuple[str, str, bytes, float]] = []

    def _record(self, announce: CacheInvalidated | None) -> None:
        if announce is not None:
            self.outbox.append((announce.event_id, announce.key, encode(announce), time.monotonic() * 1000))

    async def outbox_sent(self, event_ids: Sequence[str]) -> int:
        self._call()
        ids, before = set(event_ids), len(self.outbox)
        self.outbox = [row for row in self.outbox if row[0] not in ids]
        return before - len(self.outbox)

    async def relay_outbox(self, send: Send, *, older_than_ms: int, limit: int = 500) -> int:
        self._call()
        due_by = time.monotonic() * 1000 - older_than_ms
        due = [row for row in self.outbox if row[3] <= due_by][:limit]
        if due:
            await send([(key, payload) for _, key, payload, _ in due])
            self.outbox = [row for row in self.outbox if row not in due]
        return len(due)

    def _call(self) -> None:
        self.calls += 1
        if self.clock is not None:
            self.clock.advance(self.latency_ms)
        if self.fail:
            raise OSError("L3 is down")

    def _live(self, entry: Entry, now_ms: int) -> bool:
        expires = entry.meta.expires_at_ms
        return expires is None or expires > now_ms

    async def put(self, entry: Entry, *, announce: CacheInvalidated | None = None) -> None:
        self._call()
        if entry.key in self.reject:
            raise L3Rejected(f"L3 refused {entry.key!r}")
        why = _refusal(entry.meta, self.dim, self.semantic)
        if why is not None:
            raise L3Rejected(f"L3 refused {entry.key!r}: {why}")
        m = entry.meta
        before = self.rows.get(entry.key)
        if before is not None and before.meta.updated_at_ms == m.updated_at_ms:
            raise StampTaken(entry.key, m.updated_at_ms)  # nothing written, the outbox included
        self._record(announce)
        if before is not None and before.meta.updated_at_ms > m.updated_at_ms:
            return  # the newest write stays, as in Postgres
        stored = replace(
            m,
            embedding=None if m.embedding is None else np.array(m.embedding, dtype=np.float32).reshape(-1),
            similarity_tolerance=round(float(np.float32(m.similarity_tolerance)), 6),
            context_dependency_ids=tuple(m.context_dependency_ids),
            semantic_tags=dict(m.semantic_tags),
            created_at_ms=m.created_at_ms if before is None else before.meta.created_at_ms,
            size_bytes=len(entry.blob),
        )
        self.rows[entry.key] = Entry(stored, entry.blob)

    async def get(self, key: str, now_ms: int) -> Entry | None:
        self._call()
        entry = self.rows.get(key)
        return entry if entry is not None and self._live(entry, now_ms) else None

    async def get_many(self, keys: Sequence[str], now_ms: int) -> dict[str, Entry]:
        self._call()
        return {k: e for k in keys if (e := self.rows.get(k)) is not None and self._live(e, now_ms)}

    def _scored(
        self, embedding: npt.ArrayLike, now_ms: int, model: str | None, candidates: int
    ) -> list[tuple[float, Entry]]:
        """The `candidates` nearest live entries (of `model`), best first."""
        query = np.asarray(embedding, dtype=np.float32).reshape(-1)
        if self.dim is not None and query.shape[0] != self.dim:
            raise ValueError(f"embedding has {query.shape[0]} dimensions; L3 stores {self.dim}")
        q = _unit_or_none(query)
        if q is None:
            return []
        scored = []
        for e in self.rows.values():
            if e.meta.embedding is None or not self._live(e, now_ms):
                continue
            if model is not None and e.meta.model != model:
                continue
            unit_e = _unit_or_none(e.meta.embedding)
            if unit_e is not None:
                scored.append((float(unit_e @ q), e))
        scored.sort(key=lambda t: -t[0])
        return scored[:candidates]

    async def neighbours(
        self,
        embedding: npt.ArrayLike,
        now_ms: int,
        *,
        model: str | None = None,
        min_similarity: float = 0.0,
        candidates: int = 4,
    ) -> list[SemanticMatch]:
        self._call()
        if not self.semantic:
            return []
        found = self._scored(embedding, now_ms, model, candidates)
        return [SemanticMatch(e, sim) for sim, e in found if sim >= min_similarity]

    async def delete(self, key: str, *, announce: CacheInvalidated | None = None) -> bool:
        self._call()
        self._record(announce)
        return self.rows.pop(key, None) is not None

    async def delete_bound_to(self, trace_id: str) -> list[str]:
        self._call()
        gone = [k for k, e in self.rows.items() if trace_id in e.meta.bound_to()]
        for k in gone:
            del self.rows[k]
        return gone

    async def delete_expired(self, now_ms: int, limit: int = 1000) -> int:
        self._call()
        gone = [k for k, e in self.rows.items() if not self._live(e, now_ms)][:limit]
        for k in gone:
            del self.rows[k]
        return len(gone)


def unit(rng: np.random.Generator, dim: int) -> np.ndarray:
    return normalize(rng.standard_normal(dim))[0]


def at_cosine(rng: np.random.Generator, v: np.ndarray, cosine: float) -> np.ndarray:
    """A unit vector at exactly `cosine` from unit vector `v`."""
    r = rng.standard_normal(v.shape)
    r -= (r @ v) * v
    r /= np.linalg.norm(r)
    return (cosine * v + np.sqrt(1 - cosine**2) * r).astype(np.float32)


# --- RDMA without a device: an in-memory fabric with one-sided semantics -------------------------


class MemoryFabric:
    """Queue pair numbers and the sessions exporters opened, shared by both ends of a test."""

    def __init__(self) -> None:
        self._next_qp = 0x100
        self.sessions: dict[int, tuple[MemoryExporter, bool]] = {}  # server qp_num -> (exporter, write)

    def new_qp(self) -> int:
        self._next_qp += 1
        return self._next_qp


class MemoryExporter:
    """The server side of `RdmaExporter` over a host pool: 'registers' its buffer at a fake address."""

    BASE = 0x7F00_0000_0000

    def __init__(self, fabric: MemoryFabric, pool: BlockPool, *, writable: bool = False) -> None:
        self.fabric = fabric
        self.pool = pool
        self.writable = writable
        self.rkey = 0xBEEF
        self.accepted = 0

    def accept(self, hello: bytes) -> tuple[bytes, Callable[[], None]]:
        client = decode_client_hello(hello)
        qp_num = self.fabric.new_qp()
        self.fabric.sessions[qp_num] = (self, client.write)
        self.accepted += 1
        answer = ServerHello(
            QpInfo(bytes(16), qp_num, 42, 1, 5), self.BASE, self.rkey, self.pool.total_bytes, self.writable
        )
        return encode_server_hello(answer), lambda: self.fabric.sessions.pop(qp_num, None)


class MemoryEndpoint(RdmaEndpoint):
    """The client side: READ / WRITE copy between its bounce buffer and the exporter's pool buffer
    without the server's request handler (one-sided), checking rkey, bounds and write permission as
    an HCA would; `hold` keeps completions back (a peer that never answers)."""

    def __init__(self, fabric: MemoryFabric, *, bounce_bytes: int = 4096, depth: int = 4) -> None:
        self.fabric = fabric
        self.bounce_bytes = bounce_bytes
        self.depth = depth
        self.buf = bytearray(bounce_bytes)
        self.qp_num = fabric.new_qp()
        self.remote: tuple[MemoryExporter, bool] | None = None
        self.posted: list[RdmaOp] = []
        self.batches: list[int] = []
        self.completions: list[tuple[int, str | None]] = []
        self.hold = False
        self.resets = 0
        self.closed = False

    def local(self) -> QpInfo:
        return QpInfo(bytes(16), self.qp_num, 7, 1, 5)

    def connect(self, remote: QpInfo) -> None:
        self.remote = self.fabric.sessions[remote.qp_num]

    def post(self, ops: Sequence[RdmaOp], rkey: int) -> None:
        assert self.remote is not None, "post before connect"
        assert len(ops) <= self.depth
        exporter, write_ok = self.remote
        self.batches.append(len(ops))
        for op in ops:
            self.posted.append(op)
            start = op.remote_addr - exporter.BASE
            if rkey != exporter.rkey or start < 0 or start + op.length > exporter.pool.total_bytes:
                self.completions.append((op.wr_id, "remote access error"))
            elif op.write and not (exporter.writable and write_ok):
                self.completions.append((op.wr_id, "remote access error"))
            elif op.write:
                exporter.pool.buffer[start : start + op.length] = np.frombuffer(
                    bytes(self.buf[op.local_offset : op.local_offset + op.length]), np.uint8
                )
                self.completions.append((op.wr_id, None))
            else:
                chunk = exporter.pool.buffer[start : start + op.length].tobytes()
                self.buf[op.local_offset : op.local_offset + op.length] = chunk
                self.completions.append((op.wr_id, None))

    def poll(self, max_entries: int) -> list[tuple[int, str | None]]:
        if self.hold:
            return []
        done, self.completions = self.completions[:max_entries], self.completions[max_entries:]
        return done

    def put(self, offset: int, data: bytes) -> None:
        self.buf[offset : offset + len(data)] = data

    def get(self, offset: int, nbytes: int) -> bytes:
        return bytes(self.buf[offset : offset + nbytes])

    def reset(self) -> None:
        self.resets += 1
        self.remote = None
        self.completions = []
        self.qp_num = self.fabric.new_qp()

    def close(self) -> None:
        self.closed = True


class FakePeers(RemoteL2):
    """Other nodes' L2 as a dict; `fail` makes the port raise (which it must not, but the cache copes)."""

    def __init__(self, entries: dict[str, Entry] | None = None, *, peer: str = "10.0.0.2:8701") -> None:
        self.entries = dict(entries or {})
        self.peer = peer
        self.asked: list[list[str]] = []
        self.fail = False

    async def fetch_many(self, keys: Sequence[str]) -> dict[str, RemoteHit]:
        self.asked.append(list(keys))
        if self.fail:
            raise OSError("peer port broke its promise")
        return {k: RemoteHit(self.entries[k], self.peer) for k in keys if k in self.entries}

    def stats(self) -> dict[str, Any]:
        return {"peers": [self.peer]}
