"""Publisher -> consumer on each broker: start time, throughput and end-to-end latency.

Rows: the cachemesh runtime (schemas, traceparent, dedupe, commit-after-apply; per event and with
`publish_many`) and bare aiokafka (bytes in, bytes out: records of the runtime's size, and the old
19-byte records, which fit ten times as many to a producer batch) on Apache Kafka and on tansu, or on
one running broker (`--bootstrap`), measured in the same run; "x bare" compares with the first.
Throughput is a burst of N events; latency is measured at a paced rate well under saturation, so it
shows the path and not a queue. Run: `python -m bench.broker [--events N] [--rate R]`.
"""

from __future__ import annotations

import asyncio
import csv
import statistics
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated

import typer
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from infra.brokers import ApacheKafkaBroker, Broker, ExternalBroker, TansuBroker
from schemas.events import CacheAccessed
from schemas.wire import encode
from services.runtime.kafka import Delivery, EventConsumer
from services.runtime.publisher import EventPublisher
from services.runtime.settings import KafkaSettings
from services.runtime.topics import ensure_topics
from services.runtime.tracing import configure_tracing

RESULTS = Path(__file__).parent / "results"
SENT_NS = "bench.sent_ns"
# Events sent and consumed before measuring: the first fetches after a group join resolve offsets
# and would otherwise put start-up into the latency tail.
WARMUP = 200


@dataclass
class Row:
    broker: str
    client: str
    start_s: float
    events: int
    throughput_eps: float
    p50_ms: float
    p99_ms: float


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# Events per `publish_many` call in the batched runtime row.
BATCH = 500


async def _runtime_batched_run(bootstrap: str, events: int, rate: float | None) -> tuple[float, list[float]]:
    return await _runtime_run(bootstrap, events, rate, batch=BATCH)


async def _runtime_run(
    bootstrap: str, events: int, rate: float | None, batch: int = 0
) -> tuple[float, list[float]]:
    """Returns (seconds for all events, per-event latency ms). `batch` > 0 publishes with
    `publish_many` in chunks of that many events (one event a chunk when paced)."""
    namespace = f"bench{uuid.uuid4().hex[:6]}."
    await ensure_topics(bootstrap, namespace)
    settings = KafkaSettings(bootstrap=bootstrap, topic_namespace=namespace, dedupe_window=events)
    publisher = EventPublisher(settings)
    await publisher.start()
    latencies: list[float] = []
    warm: list[int] = []
    warmed, done = asyncio.Event(), asyncio.Event()

    async def handler(delivery: Delivery) -> None:
        sent = dict(delivery.headers).get(SENT_NS)
        if sent is None:
            warm.append(1)
            if len(warm) >= WARMUP:
                warmed.set()
            return
        latencies.append((time.time_ns() - int(sent)) / 1e6)
        if len(latencies) >= events:
            done.set()

    consumer = EventConsumer(settings, [CacheAccessed.topic], f"bench-{namespace}", handler, publisher)
    await consumer.start()
    runner = asyncio.create_task(consumer.run())
    await _wait_assigned(consumer)
    for i in range(WARMUP):
        await publisher.publish(CacheAccessed(key=f"w{i}", hit=False), wait=False)
    await asyncio.wait_for(warmed.wait(), 60)
    began = time.perf_counter()
    chunk: list[CacheAccessed] = []
    for i in range(events):
        event = CacheAccessed(key=f"k{i % 1000}", hit=i % 2 == 0, tier="l1", latency_ms=0.1)
        if not batch:
            await publisher.publish(event, wait=False, headers=[(SENT_NS, str(time.time_ns()).encode())])
        else:
            chunk.append(event)
            if rate or len(chunk) >= batch or i == events - 1:
                sent = [(SENT_NS, str(time.time_ns()).encode())]
                await publisher.publish_many(chunk, wait=False, headers=sent)
                chunk = []
        if rate:
            await _pace(began, i + 1, rate)
    await asyncio.wait_for(done.wait(), 120)
    elapsed = time.perf_counter() - began
    runner.cancel()
    await asyncio.gather(runner, return_exceptions=True)
    await consumer.stop()
    await publisher.stop()
    return elapsed, latencies


async def _wait_assigned(consumer: EventConsumer) -> None:
    for _ in range(300):
        if consumer.health()["assigned"]:
            return
        await asyncio.sleep(0.05)


async def _pace(began: float, sent: int, rate: float) -> None:
    ahead = sent / rate - (time.perf_counter() - began)
    if ahead > 0:
        await asyncio.sleep(ahead)


# What the runtime puts in a record (value and headers, by size), for the like-for-like bare row.
_EVENT_VALUE = encode(CacheAccessed(key="k000", hit=True, tier="l1", latency_ms=0.1))
_EVENT_HEADERS = [
    ("event_type", b"cache.accessed"),
    ("traceparent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-02"),
]


async def _raw_tiny_run(bootstrap: str, events: int, rate: float | None) -> tuple[float, list[float]]:
    return await _raw_run(bootstrap, events, rate, like_runtime=False)


async def _raw_run(
    bootstrap: str, events: int, rate: float | None, like_runtime: bool = True
) -> tuple[float, list[float]]:
    """`like_runtime`: records of the runtime's size (an encoded event, its headers, the send time
    in a header); otherwise the send time alone as the value (~19 bytes, no headers)."""
    topic = f"bench-raw-{uuid.uuid4().hex[:6]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(topic, 6, 1)])
    await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"g-{topic}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_wait_ms=100,  # as the runtime's consumer
    )
    await producer.start()
    await consumer.start()
    latencies: list[float] = []

    warm: list[int] = []

    async def consume() -> None:
        while len(latencies) < events:
            batch = await consumer.getmany(timeout_ms=200, max_records=500)
            now = time.time_ns()
            for records in batch.values():
                for r in records:
                    if r.value == b"warmup":
                        warm.append(1)
                    elif like_runtime:
                        latencies.append((now - int(dict(r.headers)[SENT_NS])) / 1e6)
                    else:
                        latencies.append((now - int(r.value)) / 1e6)
            if batch:  # one commit per batch, as the runtime does
                await consumer.commit({tp: records[-1].offset + 1 for tp, records in batch.items()})

    reader = asyncio.create_task(consume())
    while not consumer.assignment():  # noqa: ASYNC110 - aiokafka offers no event for this
        await asyncio.sleep(0.05)
    for i in range(WARMUP):
        await producer.send(topic, b"warmup", key=f"w{i}".encode())
    while len(warm) < WARMUP:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    began = time.perf_counter()
    for i in range(events):
        key = f"k{i % 1000}".encode()
        if like_runtime:
            headers = [*_EVENT_HEADERS, (SENT_NS, str(time.time_ns()).encode())]
            await producer.send(topic, _EVENT_VALUE, key=key, headers=headers)
        else:
            await producer.send(topic, str(time.time_ns()).encode(), key=key)
        if rate:
            await _pace(began, i + 1, rate)
    await producer.flush()
    await asyncio.wait_for(reader, 120)
    elapsed = time.perf_counter() - began
    await consumer.stop()
    await producer.stop()
    return elapsed, latencies


def measure(broker: Broker, events: int, rate: float, repeat: int, progress: Progress) -> list[Row]:
    """Bursts `repeat` times, the clients taking turns (on a shared machine the load drifts; turns
    spread it over all of them), reporting the median; then one paced latency run each."""
    clients = (
        ("cachemesh runtime", _runtime_run),
        ("cachemesh runtime, publish_many", _runtime_batched_run),
        ("bare aiokafka", _raw_run),
        ("bare aiokafka, 19-byte records", _raw_tiny_run),
    )
    task = progress.add_task(f"{broker.name}", total=len(clients) * (repeat + 1))
    rates: dict[str, list[float]] = {client: [] for client, _ in clients}
    for _ in range(repeat):
        for client, run in clients:
            elapsed, _ = asyncio.run(run(broker.bootstrap, events, None))
            rates[client].append(events / elapsed)
            progress.advance(task)
    rows = []
    for client, run in clients:
        _, latencies = asyncio.run(run(broker.bootstrap, max(200, int(rate * 5)), rate))
        progress.advance(task)
        rows.append(
            Row(
                broker.name,
                client,
                broker.start_seconds,
                events,
                statistics.median(rates[client]),
                statistics.median(latencies),
                _percentile(latencies, 0.99),
            )
        )
    return rows


def main(
    events: Annotated[int, typer.Option(help="Events in the throughput burst")] = 20_000,
    rate: Annotated[float, typer.Option(help="Paced rate (events/s) for the latency run")] = 1_000.0,
    bootstrap: Annotated[
        str | None, typer.Option(help="Measure only this running broker (e.g. $KAFKA_BOOTSTRAP)")
    ] = None,
    repeat: Annotated[int, typer.Option(help="Bursts per client (median reported)")] = 3,
) -> None:
    configure_tracing("bench")
    rows: list[Row] = []
    brokers: tuple[Broker, ...] = (
        (ExternalBroker(bootstrap),) if bootstrap else (ApacheKafkaBroker(), TansuBroker())
    )
    with Progress() as progress:
        for broker in brokers:
            with broker:
                rows.extend(measure(broker, events, rate, repeat, progress))
    first = rows[0].broker
    base = {r.client: r for r in rows if r.broker == first}
    bare = {r.broker: r for r in rows if r.client == "bare aiokafka"}
    table = Table(
        title=f"publisher -> consumer: {events} events burst (median of {repeat}); "
        f"latency at {rate:.0f} events/s"
    )
    columns = ("broker", "client", "start s", "events/s", f"x {first}", "x bare", "p50 ms", "p99 ms")
    for column in columns:
        table.add_column(column, justify="right" if column not in ("broker", "client") else "left")
    for r in rows:
        table.add_row(
            r.broker,
            r.client,
            f"{r.start_s:.2f}",
            f"{r.throughput_eps:,.0f}",
            f"{r.throughput_eps / base[r.client].throughput_eps:.2f}",
            f"{r.throughput_eps / bare[r.broker].throughput_eps:.2f}",
            f"{r.p50_ms:.1f}",
            f"{r.p99_ms:.1f}",
        )
    Console().print(table)
    RESULTS.mkdir(exist_ok=True)
    with open(RESULTS / "broker.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(asdict(rows[0])))
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)


if __name__ == "__main__":
    typer.run(main)
