"""Event -> heat decision latency of the heat service: a `cache.access.v1` event published until its
`heat.scores.v1` decision is read back, p50/p95/p99 per paced rate.

The service runs in this process on a real broker and Postgres (`KAFKA_BOOTSTRAP` / `DATABASE_URL`
when set, otherwise it starts its own). The clock starts after a warm-up event has come back (leaders
elected, the service's group joined, the reader positioned), so start-up is not in the tail.
Run: `python -m bench.heat_latency [--events N] [--rates 100,500]`.
"""

from __future__ import annotations

import asyncio
import csv
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from aiokafka import AIOKafkaConsumer
from pydantic import SecretStr
from rich.console import Console
from rich.table import Table

from infra.brokers import Broker, broker_from_env
from infra.postgres import postgres_from_env
from schemas.events import CacheAccessed, HeatScored, record_events
from schemas.topics import qualified
from schemas.wire import decode
from services.heat.service import HeatService
from services.heat.settings import HeatSettings
from services.runtime.publisher import EventPublisher
from services.runtime.settings import KafkaSettings, PostgresSettings
from services.runtime.topics import ensure_topics

RESULTS = Path(__file__).parent / "results"
# What the heat service used to promise in an integration test (docs/design.md §1.2 re-scores every 100 ms).
BUDGET_P99_MS = 250.0


@dataclass
class Row:
    rate_eps: float
    events: int
    decided: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float


async def _run(broker: Broker, dsn: str, events: int, rate: float) -> Row:
    namespace = f"bench{uuid.uuid4().hex[:6]}."
    await ensure_topics(broker.bootstrap, namespace)
    settings = HeatSettings(
        kafka=KafkaSettings(bootstrap=broker.bootstrap, topic_namespace=namespace),
        postgres=PostgresSettings(database_url=SecretStr(dsn)),
        group_id=f"heat-{namespace}",
        model_name=f"heat-{namespace}",
        capacity=max(1000, events * 2),
    )
    reader = AIOKafkaConsumer(
        qualified(HeatScored.topic, namespace),
        bootstrap_servers=broker.bootstrap,
        auto_offset_reset="earliest",
    )
    await reader.start()
    publisher = EventPublisher(settings.kafka)
    await publisher.start()
    sent_at: dict[str, float] = {}
    latency_ms: dict[str, float] = {}
    arrived = asyncio.Event()  # set whenever a new decision came back

    async def read() -> None:
        while True:
            batch = await reader.getmany(timeout_ms=200)
            now = time.monotonic()
            for records in batch.values():
                for record in records:
                    for scored in record_events(decode(record.value)):
                        if (
                            isinstance(scored, HeatScored)
                            and scored.key in sent_at
                            and scored.key not in latency_ms
                        ):
                            latency_ms[scored.key] = (now - sent_at[scored.key]) * 1000
                            arrived.set()

    async def until_decided(keys: set[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not keys <= latency_ms.keys() and time.monotonic() < deadline:
            arrived.clear()
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    await arrived.wait()
            except TimeoutError:
                break

    try:
        async with HeatService(settings) as service:
            runner = asyncio.create_task(service.run())
            reading = asyncio.create_task(read())
            sent_at["warm-up"] = time.monotonic()
            await publisher.publish(CacheAccessed(key="warm-up", hit=False))
            await until_decided({"warm-up"}, 60)
            if "warm-up" not in latency_ms:
                raise RuntimeError("no decision for the warm-up event within 60 s")
            del sent_at["warm-up"], latency_ms["warm-up"]
            began = time.perf_counter()
            for i in range(events):
                key = f"prompt-{i}"
                sent_at[key] = time.monotonic()
                await publisher.publish(CacheAccessed(key=key, hit=False, trace_id=f"conv-{i % 5}"))
                ahead = (i + 1) / rate - (time.perf_counter() - began)
                if ahead > 0:
                    await asyncio.sleep(ahead)  # pacing the load, not waiting for a result
            await until_decided(set(sent_at), 60)
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)
            service.request_stop()
            await runner
    finally:
        await publisher.stop()
        await reader.stop()
    values = list(latency_ms.values()) or [float("nan")]
    p50, p95, p99 = (float(p) for p in np.percentile(values, [50, 95, 99]))
    return Row(rate, events, len(latency_ms), p50, p95, p99, float(max(values)))


def main(
    events: Annotated[int, typer.Option(help="Events per rate step")] = 500,
    rates: Annotated[str, typer.Option(help="Comma-separated paced rates (events/s)")] = "100,500",
) -> None:
    ladder = [float(r) for r in rates.split(",") if r.strip()]
    rows: list[Row] = []
    with broker_from_env() as broker, postgres_from_env() as pg:
        for rate in ladder:
            rows.append(asyncio.run(_run(broker, pg.dsn, events, rate)))
    table = Table(
        title=f"heat: event -> decision latency ({events} events per rate; budget p99 {BUDGET_P99_MS:.0f} ms)"
    )
    for column in ("rate/s", "events", "decided", "p50 ms", "p95 ms", "p99 ms", "max ms", "p99 in budget"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(
            f"{r.rate_eps:,.0f}",
            str(r.events),
            str(r.decided),
            f"{r.p50_ms:.0f}",
            f"{r.p95_ms:.0f}",
            f"{r.p99_ms:.0f}",
            f"{r.max_ms:.0f}",
            "yes" if r.p99_ms < BUDGET_P99_MS and r.decided == r.events else "NO",
        )
    Console().print(table)
    RESULTS.mkdir(exist_ok=True)
    with open(RESULTS / "heat_latency.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(asdict(rows[0])))
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)


if __name__ == "__main__":
    typer.run(main)
