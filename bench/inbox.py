"""The `processed_events` inbox over a long run: does it stay bounded?

Writers record event ids the way every consumer does (`mark_processed` inside its own transaction, one
event at a time) as fast as Postgres takes them, while the pruner the invalidation service runs
(`prune_inbox`: rows older than the retention, in batches) runs every `--interval-s`, and a sampler
counts the rows every second. The retention is short (`--retention-s`) so that a run of minutes shows
the steady state a 7-day retention reaches after a week: rows ~ rate x (retention + interval). Beside
it, the same writers without the pruner, whose table holds every id ever written.

Run: `python -m bench.inbox [--events 1000000] [--writers 4] [--retention-s 10] [--interval-s 1]`;
`DATABASE_URL` uses a running Postgres (otherwise an embedded one is started).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from infra.postgres import postgres_from_env
from services.runtime.postgres import Database, count_processed, mark_processed, prune_inbox
from services.runtime.settings import PostgresSettings


@dataclass
class Run:
    label: str
    events: int
    seconds: float
    max_rows: int
    final_rows: int
    table_mb: float


async def _run(
    dsn: str, label: str, events: int, writers: int, retention_ms: int | None, interval_s: float
) -> Run:
    db = Database(PostgresSettings(database_url=dsn))
    await db.start()
    group = f"bench-inbox-{uuid.uuid4().hex[:8]}"
    written, max_rows, done = 0, 0, asyncio.Event()

    async def write(k: int) -> None:
        nonlocal written
        for i in range(k, events, writers):
            event_id = f"{group}-{i}"
            await db.run(lambda conn, e=event_id: mark_processed(conn, group, e))  # type: ignore[misc]
            written += 1

    async def prune() -> None:
        assert retention_ms is not None
        while not done.is_set():
            await asyncio.sleep(interval_s)
            await prune_inbox(db, group, time.time_ns() // 1_000_000 - retention_ms)

    async def sample() -> None:
        nonlocal max_rows
        while not done.is_set():
            max_rows = max(max_rows, await count_processed(db, group))
            await asyncio.sleep(1.0)

    side = [asyncio.create_task(sample())]
    if retention_ms is not None:
        side.append(asyncio.create_task(prune()))
    began = time.perf_counter()
    with Progress(console=Console(stderr=True)) as progress:
        bar = progress.add_task(label, total=events)
        shown = asyncio.create_task(_show(progress, bar, lambda: written, done))
        await asyncio.gather(*(write(k) for k in range(writers)))
        seconds = time.perf_counter() - began
        done.set()
        await shown
    await asyncio.gather(*side)
    final = await count_processed(db, group)
    size = await db.fetchval("SELECT pg_total_relation_size('processed_events')")
    await db.execute("DELETE FROM processed_events WHERE consumer_group = $1", group)
    await db.stop()
    return Run(label, events, seconds, max(max_rows, final), final, int(size) / 2**20)


async def _show(progress: Progress, bar: object, written: object, done: asyncio.Event) -> None:
    while not done.is_set():
        progress.update(bar, completed=written())  # type: ignore[arg-type, operator]
        await asyncio.sleep(0.5)


def main(
    events: Annotated[int, typer.Option(help="Event ids written with the pruner on")] = 1_000_000,
    unpruned: Annotated[int, typer.Option(help="Event ids written without it (the baseline)")] = 100_000,
    writers: Annotated[int, typer.Option(help="Concurrent consumers writing the inbox")] = 4,
    retention_s: Annotated[float, typer.Option(help="Ids older than this are pruned")] = 10.0,
    interval_s: Annotated[float, typer.Option(help="The pruner runs this often")] = 1.0,
) -> None:
    with postgres_from_env() as pg:
        runs = [
            asyncio.run(_run(pg.dsn, "with retention", events, writers, int(retention_s * 1000), interval_s)),
            asyncio.run(_run(pg.dsn, "no retention", unpruned, writers, None, interval_s)),
        ]
    table = Table(
        title=f"processed_events inbox ({writers} writers; retention {retention_s:g} s, pruned every "
        f"{interval_s:g} s)"
    )
    for column in ("run", "events", "took s", "events/s", "max rows", "final rows", "rows / events"):
        table.add_column(column, justify="left" if column == "run" else "right")
    for r in runs:
        table.add_row(
            r.label,
            f"{r.events:,}",
            f"{r.seconds:,.0f}",
            f"{r.events / r.seconds:,.0f}",
            f"{r.max_rows:,}",
            f"{r.final_rows:,}",
            f"{r.max_rows / r.events:.3f}",
        )
    Console().print(table)
    rate = runs[0].events / runs[0].seconds
    Console().print(
        "expected bound with retention: rate x (retention + interval) = "
        f"{rate * (retention_s + interval_s):,.0f} rows; table size at the end of the last run "
        f"{runs[-1].table_mb:.1f} MiB"
    )


if __name__ == "__main__":
    typer.run(main)
