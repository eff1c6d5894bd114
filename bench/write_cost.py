"""What a durable, announced write costs in L3: `PostgresL3Store.put` of a prompt entry as the node makes
it (a 384-d embedding, a 1 KB answer), with its invalidation recorded in the outbox in the same
transaction (what a tier node does) beside the same put without it, in alternating rounds on one
Postgres (`DATABASE_URL` when set, otherwise it starts its own). The outbox rows are forgotten in batches
as the node's sweep does (`outbox_sent`), and that time is counted per write too.

Prints p50/p99 per write and the ratios; writes `bench/results/write_cost.json` and a CDF plot.
Run: `python -m bench.write_cost [--writes 2000] [--rounds 4]`.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from pydantic import SecretStr
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from infra.postgres import postgres_from_env
from schemas.events import CacheInvalidated
from services.runtime.postgres import Database, apply_migrations
from services.runtime.settings import PostgresSettings
from services.tiers.entry import Entry, EntryMeta, encode_text
from services.tiers.l3.store import PostgresL3Store

DIM = 384
RESULTS = Path(__file__).resolve().parent / "results"
SWEEP_EVERY = 64  # writes between two `outbox_sent` batches (a busy node's 250 ms sweep)


def _entry(key: str, rng: np.random.Generator) -> Entry:
    v = rng.standard_normal(DIM).astype(np.float32)
    now = int(time.time() * 1000)
    meta = EntryMeta(
        key=key,
        kind="prompt",
        model="m",
        embedding=v / np.linalg.norm(v),
        created_at_ms=now,
        updated_at_ms=now,
    )
    return Entry(meta, encode_text("x" * 1024, model="m"))


async def _round(store: PostgresL3Store, writes: int, outbox: bool, rng: np.random.Generator) -> list[float]:
    times, acked = [], []
    for i in range(writes):
        entry = _entry(f"wc-{uuid.uuid4().hex[:12]}", rng)
        event = CacheInvalidated(
            key=entry.key, origin_node_id="bench", occurred_at_ms=entry.meta.updated_at_ms
        )
        started = time.perf_counter()
        await store.put(entry, announce=event if outbox else None)
        times.append((time.perf_counter() - started) * 1000)
        if outbox:
            acked.append(event.event_id)
            if len(acked) == SWEEP_EVERY or i == writes - 1:
                started = time.perf_counter()
                await store.outbox_sent(acked)
                share = (time.perf_counter() - started) * 1000 / len(acked)
                times[-len(acked) :] = [t + share for t in times[-len(acked) :]]
                acked = []
    return times


async def _bench(dsn: str, writes: int, rounds: int) -> dict[str, list[float]]:
    db = Database(PostgresSettings(database_url=SecretStr(dsn), cachemesh_embedding_dim=DIM))
    await db.start()
    try:
        await apply_migrations(db, DIM)
        with_outbox = PostgresL3Store(
            db, dim=DIM, outbox_topic=f"bench-{uuid.uuid4().hex[:6]}.cache.invalidate"
        )
        without = PostgresL3Store(db, dim=DIM)
        rng = np.random.default_rng(0)
        out: dict[str, list[float]] = {"put": [], "put + outbox": []}
        await _round(without, 200, False, rng)  # warm the pool and the plans
        with Progress(console=Console(stderr=True)) as progress:
            task = progress.add_task("writes", total=2 * rounds * writes)
            for r in range(rounds):
                for outbox in (r % 2 == 0, r % 2 == 1):  # alternate which goes first
                    store = with_outbox if outbox else without
                    out["put + outbox" if outbox else "put"] += await _round(store, writes, outbox, rng)
                    progress.advance(task, writes)
        await db.execute("DELETE FROM cache_descriptors WHERE key LIKE 'wc-%'")
        return out
    finally:
        await db.stop()


def main(
    writes: Annotated[int, typer.Option(min=10, help="Writes per round and variant")] = 2000,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds (the variants alternate which goes first)")] = 4,
) -> None:
    with postgres_from_env() as pg:
        out = asyncio.run(_bench(pg.dsn, writes, rounds))
    stats = {
        k: {"p50_ms": float(np.percentile(v, 50)), "p99_ms": float(np.percentile(v, 99))}
        for k, v in out.items()
    }
    base = stats["put"]
    t = Table(title=f"L3 write cost ({rounds} x {writes} writes per variant, alternating)")
    for col in ("variant", "p50 ms", "p99 ms", "p50 vs put", "p99 vs put"):
        t.add_column(col, justify="right")
    for k, s in stats.items():
        t.add_row(
            k,
            f"{s['p50_ms']:.3f}",
            f"{s['p99_ms']:.3f}",
            f"{s['p50_ms'] / base['p50_ms']:.2f}x",
            f"{s['p99_ms'] / base['p99_ms']:.2f}x",
        )
    Console().print(t)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "write_cost.json").write_text(
        json.dumps({"writes": writes, "rounds": rounds, **stats}, indent=2)
    )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for k, v in out.items():
        xs = np.sort(v)
        ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs), label=k)
    ax.set_xscale("log")
    ax.set_xlabel("ms per write (L3)")
    ax.set_ylabel("fraction of writes")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "write_cost.png", dpi=120)


if __name__ == "__main__":
    typer.run(main)
