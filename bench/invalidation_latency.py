"""Invalidation propagation between tier nodes: a put on node A until node B has dropped its semantically
close entry (over `cache.invalidate.v1`), p50/p95/p99 against the propagation window.

Two nodes run in this process, each with its own API port and consumer groups, sharing L3, on a real
broker and Postgres (`KAFKA_BOOTSTRAP` / `DATABASE_URL` when set, otherwise it starts its own).
Run: `python -m bench.invalidation_latency [--rounds N]`.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from pydantic import SecretStr
from rich.console import Console
from rich.table import Table

from infra.brokers import broker_from_env
from infra.postgres import postgres_from_env
from infra.topics import ensure_topics
from services.runtime.settings import KafkaSettings, PostgresSettings
from services.tiers.edge.client import AsyncTiersClient
from services.tiers.service import TiersService
from services.tiers.settings import TiersSettings

RESULTS = Path(__file__).parent / "results"
DIM = 384
# What a put on one node promises the others: their close entries are gone within this (p99).
PROPAGATION_WINDOW_MS = 1000.0


@dataclass
class Row:
    rounds: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float


async def _until(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.perf_counter() + timeout_s
    while not condition():
        if time.perf_counter() > deadline:
            return False
        await asyncio.sleep(0.001)
    return True


@contextlib.asynccontextmanager
async def _node(settings: TiersSettings) -> AsyncIterator[TiersService]:
    service = TiersService(settings)
    await service.start()
    task = asyncio.create_task(service.run())
    try:
        if not await _until(lambda: all(c.health()["assigned"] for c in service._consumers), 60):
            raise RuntimeError(f"{settings.node_id}: consumers not assigned within 60 s")
        yield service
    finally:
        service.request_stop()
        await asyncio.gather(task, return_exceptions=True)
        await service.stop()


def _unit(rng: np.random.Generator) -> np.ndarray:
    v = rng.standard_normal(DIM)
    return (v / np.linalg.norm(v)).astype(np.float32)


def _at_cosine(rng: np.random.Generator, v: np.ndarray, cosine: float) -> np.ndarray:
    r = rng.standard_normal(DIM)
    r -= (r @ v) * v
    r /= np.linalg.norm(r)
    return (cosine * v + np.sqrt(1 - cosine**2) * r).astype(np.float32)


async def _linked(client: AsyncTiersClient, reader: TiersService) -> None:
    """Until `reader` sees the writer's invalidations (its new group, at `latest`, is positioned)."""
    assert reader.cache is not None
    for _ in range(60):
        seen = reader.cache.counters.invalidations_received
        await client.put(f"sentinel-{uuid.uuid4().hex}", "s", model="m")
        if await _until(lambda: reader.cache.counters.invalidations_received > seen, 1.0):  # type: ignore[union-attr]  # noqa: B023
            return
    raise RuntimeError("the reader never received the writer's invalidations")


async def _run(bootstrap: str, dsn: str, rounds: int) -> list[float]:
    namespace = f"bench{uuid.uuid4().hex[:6]}."
    await ensure_topics(bootstrap, namespace)

    def settings(name: str) -> TiersSettings:
        return TiersSettings(
            node_id=f"{name}-{namespace}",
            api_port=0,
            block_port=0,
            metrics_port=0,
            embedder_preload=False,
            kafka=KafkaSettings(bootstrap=bootstrap, topic_namespace=namespace),
            postgres=PostgresSettings(database_url=SecretStr(dsn), cachemesh_embedding_dim=DIM),
        )

    rng = np.random.default_rng(2024)
    latencies_ms: list[float] = []
    async with _node(settings("a")) as a, _node(settings("b")) as b:
        assert b.cache is not None
        async with AsyncTiersClient(a.api_url) as ca, AsyncTiersClient(b.api_url) as cb:
            await _linked(ca, b)
            await _linked(cb, a)
            for i in range(rounds):
                base = _unit(rng)
                await cb.put(f"near-{i}", "old", model="m", embedding=_at_cosine(rng, base, 0.96))
                started = time.perf_counter()
                await ca.put(f"key-{i}", "new", model="m", embedding=base, similarity_tolerance=0.92)
                if await _until(lambda: f"near-{i}" not in b.cache.l1, 30):  # type: ignore[union-attr]  # noqa: B023
                    latencies_ms.append((time.perf_counter() - started) * 1000)
    return latencies_ms


def main(
    rounds: Annotated[int, typer.Option(help="Writes on node A, each timed until B drops")] = 100,
) -> None:
    with broker_from_env() as broker, postgres_from_env() as pg:
        latencies = asyncio.run(_run(broker.bootstrap, pg.dsn, rounds))
    if not latencies:
        raise SystemExit("no invalidation reached node B")
    p50, p95, p99 = (float(p) for p in np.percentile(latencies, [50, 95, 99]))
    row = Row(len(latencies), p50, p95, p99, max(latencies))
    table = Table(title=f"invalidation A -> B over Kafka (window p99 {PROPAGATION_WINDOW_MS:.0f} ms)")
    for column in ("dropped/rounds", "p50 ms", "p95 ms", "p99 ms", "max ms", "p99 in window"):
        table.add_column(column, justify="right")
    table.add_row(
        f"{row.rounds}/{rounds}",
        f"{p50:.1f}",
        f"{p95:.1f}",
        f"{p99:.1f}",
        f"{row.max_ms:.1f}",
        "yes" if p99 <= PROPAGATION_WINDOW_MS and row.rounds == rounds else "NO",
    )
    Console().print(table)
    RESULTS.mkdir(exist_ok=True)
    with open(RESULTS / "invalidation_latency.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(asdict(row)))
        writer.writeheader()
        writer.writerow(asdict(row))


if __name__ == "__main__":
    typer.run(main)
