"""What a stream library costs per record before any window maths: the floor under `bench/streams.py`.

N access events (the Mooncake replay's, the size the mesh produces) are put on a fresh 6-partition topic
once; then each consumer reads all of them from the start in its own process (bench/_floor_consumers.py):
bare aiokafka (`getmany`), aiokafka plus the mesh's event decoding, a faust agent that only counts (on
the streams worker's settings: manual acks per record, as stage 1 does; faust's batch API `take`; and
faust's own buffer sizes),
and quixstreams (a per-record count, and its own 1 s tumbling-window count) where `.venv-quix` exists
(`make quix-venv`; quixstreams pins an older pydantic than the mesh's, so it lives apart). Records/s and
CPU microseconds per record, timed from each consumer's first record to its N-th; "x aiokafka" is
the ratio to bare aiokafka in the same run. The streams worker's target is 20,000 events/s per worker:
a library whose empty loop cannot read that fast on this machine cannot be the base of it.

Run: `python -m bench.stream_floor [--events N]`; `KAFKA_BOOTSTRAP` uses a running broker.
"""

from __future__ import annotations

import asyncio
import csv
import json
import os
import subprocess
import sys
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated

import typer
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from rich.console import Console
from rich.progress import track
from rich.table import Table

from infra.brokers import broker_from_env
from infra.generator import ReplayConfig, mooncake_events
from schemas.events import CacheAccessed
from schemas.wire import encode

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results"
QUIX_PYTHON = REPO / ".venv-quix" / "bin" / "python"
PARTITIONS = 6


@dataclass
class Row:
    consumer: str
    records: int
    seconds: float
    records_per_s: float
    cpu_us_per_record: float


async def _fill(bootstrap: str, topic: str, n: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    finally:
        await admin.close()
    events = [e for e in mooncake_events(config=ReplayConfig()) if isinstance(e, CacheAccessed)]
    templates = [(e.kafka_key().encode(), encode(e)) for e in events[:20_000]]
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=1 << 20)
    await producer.start()
    try:
        for i in track(range(n), description=f"putting {n:,} events on {topic}"):
            key, value = templates[i % len(templates)]
            await producer.send(topic, value, key=key)
        await producer.flush()
    finally:
        await producer.stop()


def _consume(kind: str, bootstrap: str, topic: str, n: int, timeout_s: float) -> Row | None:
    python = str(QUIX_PYTHON) if kind.startswith("quix") else sys.executable
    args = [python, str(REPO / "bench" / "_floor_consumers.py"), kind, bootstrap, topic, str(n)]
    try:
        done = subprocess.run(
            args,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    except subprocess.TimeoutExpired:
        Console(stderr=True).print(f"{kind}: did not read {n:,} records within {timeout_s:.0f} s")
        return None
    # faust's worker writes terminal escapes (a hidden cursor) to stdout ahead of the result.
    lines = [line[line.index("{") :] for line in done.stdout.splitlines() if "{" in line]
    if not lines:
        Console(stderr=True).print(f"{kind} failed ({done.returncode}):\n{done.stderr[-2000:]}")
        return None
    out = json.loads(lines[-1])
    return Row(
        kind,
        out["records"],
        out["seconds"],
        out["records"] / out["seconds"],
        1e6 * out["cpu_s"] / out["records"],
    )


def main(
    events: Annotated[int, typer.Option(help="Records on the topic, read by every consumer")] = 200_000,
    timeout_s: Annotated[float, typer.Option(help="Longest one consumer may take")] = 300.0,
    only: Annotated[str | None, typer.Option(help="Comma-separated consumers to run (default: all)")] = None,
) -> None:
    kinds = ["aiokafka", "aiokafka+decode", "faust", "faust-take", "faust-defaults"]
    if QUIX_PYTHON.exists():
        kinds += ["quix", "quix-window"]
    else:
        Console(stderr=True).print("no .venv-quix (make quix-venv): quixstreams rows left out")
    if only:
        kinds = [k for k in kinds if k in only.split(",")]
    rows: list[Row] = []
    with broker_from_env() as broker:
        topic = f"floor-{uuid.uuid4().hex[:8]}"
        asyncio.run(_fill(broker.bootstrap, topic, events))
        for kind in kinds:
            row = _consume(kind, broker.bootstrap, topic, events, timeout_s)
            if row is not None:
                rows.append(row)
                print(json.dumps(asdict(row)), flush=True)
    base = next((r.records_per_s for r in rows if r.consumer == "aiokafka"), None)
    table = Table(title=f"stream floor: {events:,} records from the start of a {PARTITIONS}-partition topic")
    for column in ("consumer", "records/s", "CPU µs/record", "x aiokafka"):
        table.add_column(column, justify="left" if column == "consumer" else "right")
    for r in rows:
        ratio = f"{r.records_per_s / base:.2f}" if base else ""
        table.add_row(r.consumer, f"{r.records_per_s:,.0f}", f"{r.cpu_us_per_record:.1f}", ratio)
    Console().print(table)
    RESULTS.mkdir(exist_ok=True)
    with (RESULTS / "stream_floor.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(Row.__dataclass_fields__))
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)


if __name__ == "__main__":
    typer.run(main)
