"""Heat services side by side: events/s that 1, 2, ... heat services (each its own process and
`CACHEMESH_HEAT_INSTANCE`, one consumer group) apply from a backlog of `cache.access.v1`, or of
`kv.events.v1` with `--shape chains`.

A backlog of N accesses (`zipf`: keys in `CacheAccessBatch` records of 64, grouped by partition as the
tier nodes send them; the panel decides. `chains`: `KvBlockStored` blocks, one record each as the bridge
sends them, whose parents are the blocks before them in their request: prefix chains, which heat's
compiled core decides) is written once; each row starts its instances in a fresh group, so they read it
from the start. The rate is taken between 10% and 100% of the backlog applied (summed over the
instances' health reports), so process start-up (torch import, group join) is not in it; CPU is the
instances' user + system time over the same span, and idle CPU is theirs over 5 s starting 5 s after the
backlog is handled (nothing left to read, the last decisions out). Every row must handle exactly N
events (applied, or parked as an orphan until its parent arrives): more would be events applied twice.
On a 2-core machine the broker and the instances share the cores, which bounds what a second instance
can add; the "x one" column is the ratio to the first row of the same run.

    python -m bench.heat_scale [--events 100000] [--instances 1,2] [--shape zipf|chains]
    (KAFKA_BOOTSTRAP / DATABASE_URL: a broker and Postgres; otherwise it starts its own)
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench.heat_cost import million_chains
from infra.brokers import broker_from_env
from infra.paths import free_port
from infra.postgres import postgres_from_env
from schemas.events import CacheAccessed, KvBlockStored, access_batch
from services.runtime.publisher import EventPublisher
from services.runtime.settings import KafkaSettings
from services.runtime.topics import ensure_topics

REPO = Path(__file__).resolve().parent.parent
PER_RECORD = 64


def chain_events(events: int, seed: int, t0: int) -> list[KvBlockStored]:
    """`events` stored blocks of prefix traffic (bench.heat_cost's generator), each the first time its
    request computes it (an engine stores a block once; later requests hit its prefix cache), naming
    the block before it in its request as its parent."""
    trace = million_chains(max(1, events), seed)
    keys, starts = trace.keys.tolist(), set(trace.starts.tolist())
    out: list[KvBlockStored] = []
    seen: set[int] = set()
    for i, k in enumerate(keys):
        if len(out) == events:
            break
        if k in seen:
            continue
        seen.add(k)
        parent = None if i in starts else f"{keys[i - 1]:016x}"
        out.append(KvBlockStored(block_hash=f"{k:016x}", parent_block_hash=parent, occurred_at_ms=t0 + i))
    return out


async def _write_backlog(bootstrap: str, namespace: str, events: int, seed: int, shape: str) -> None:
    publisher = EventPublisher(KafkaSettings(bootstrap=bootstrap, topic_namespace=namespace))
    await publisher.start()
    t0 = 1_700_000_000_000
    try:
        if shape == "chains":
            blocks = chain_events(events, seed, t0)
            for start in range(0, len(blocks), 4096):
                await publisher.publish_many(blocks[start : start + 4096])
            return
        keys = np.random.default_rng(seed).zipf(1.2, size=events) % 50_000
        for start in range(0, events, 4096):
            chunk = [
                CacheAccessed(key=f"k{k}", hit=False, occurred_at_ms=t0 + start + i)
                for i, k in enumerate(keys[start : start + 4096])
            ]
            by_partition: dict[int, list[CacheAccessed]] = {}
            for event, partition in zip(chunk, await publisher.partitions_of(chunk), strict=True):
                by_partition.setdefault(partition, []).append(event)
            records = [
                access_batch(group[i : i + PER_RECORD])
                for group in by_partition.values()
                for i in range(0, len(group), PER_RECORD)
            ]
            await publisher.publish_many(records)
    finally:
        await publisher.stop()


def _health(port: int) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            return json.loads(r.read())
    except Exception:  # starting, or 503 while not yet healthy: both carry no count yet
        return None


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_row(env: dict[str, str], namespace: str, instances: int, events: int, progress: Progress) -> dict:
    group = f"heat-scale-{uuid.uuid4().hex[:6]}"
    procs, ports = [], []
    for i in range(instances):
        port = free_port()
        ports.append(port)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "services.heat"],
                cwd=REPO,
                env={
                    **env,
                    "PYTHONPATH": str(REPO),
                    "KAFKA_TOPIC_NAMESPACE": namespace,
                    "CACHEMESH_HEAT_GROUP_ID": group,
                    "CACHEMESH_HEAT_INSTANCE": f"i{i}",
                    "CACHEMESH_HEAT_MODEL_NAME": group,
                    "CACHEMESH_HEAT_METRICS_PORT": str(port),
                    "CACHEMESH_HEAT_LOG_LEVEL": "WARNING",
                },
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    task = progress.add_task(f"{instances} instance(s)", total=events)
    try:
        marks: dict[str, tuple[float, float]] = {}
        deadline = time.monotonic() + 600
        applied = 0
        while time.monotonic() < deadline:
            reports = [_health(p) for p in ports]
            # Handled: applied, or parked until its parent arrives (a block read before its parent,
            # which another partition holds, waits up to the service's orphan hold).
            applied = sum(
                int(r.get("events_applied", 0)) + int(r.get("orphans", {}).get("parked", 0))
                for r in reports
                if r
            )
            progress.update(task, completed=applied)
            now, cpu = time.perf_counter(), sum(_cpu_s(p.pid) for p in procs)
            if "start" not in marks and applied >= events // 10:
                marks["start"] = (now, cpu, applied)  # type: ignore[assignment]
            if applied >= events:
                marks["end"] = (now, cpu, applied)  # type: ignore[assignment]
                break
            if any(p.poll() is not None for p in procs):
                raise RuntimeError("a heat service exited")
            time.sleep(0.1)
        if "end" not in marks:
            raise RuntimeError(f"only {applied} of {events} events applied in 600 s")
        (t0, c0, a0), (t1, c1, a1) = marks["start"], marks["end"]  # type: ignore[misc]
        # The backlog is handled: after 5 s for the last decisions to go out, what the instances cost
        # over 5 s while nothing arrives.
        time.sleep(5.0)
        t2, c2 = time.perf_counter(), sum(_cpu_s(p.pid) for p in procs)
        time.sleep(5.0)
        idle_s, idle_cpu = time.perf_counter() - t2, sum(_cpu_s(p.pid) for p in procs) - c2
        return {
            "instances": instances,
            "applied": a1,
            "per_s": (a1 - a0) / (t1 - t0),
            "cpu_us": (c1 - c0) / (a1 - a0) * 1e6,
            "idle_cpu_pct": idle_cpu / idle_s * 100 / instances,  # per instance, % of one core
        }
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


def main(
    events: Annotated[int, typer.Option(help="Accesses in the backlog")] = 100_000,
    instances: Annotated[str, typer.Option(help="Comma-separated instance counts, one row each")] = "1,2",
    seed: Annotated[int, typer.Option()] = 0,
    shape: Annotated[
        str, typer.Option(help="zipf (accesses, the panel) or chains (KV blocks, the core)")
    ] = "zipf",
) -> None:
    if shape not in ("zipf", "chains"):
        raise typer.BadParameter(f"shape must be zipf or chains, not {shape!r}")
    counts = [int(n) for n in instances.split(",") if n]
    console = Console()
    with broker_from_env() as broker, postgres_from_env() as pg:
        namespace = f"hscale{uuid.uuid4().hex[:6]}."
        asyncio.run(ensure_topics(broker.bootstrap, namespace))
        asyncio.run(_write_backlog(broker.bootstrap, namespace, events, seed, shape))
        env = {**os.environ, "KAFKA_BOOTSTRAP": broker.bootstrap, "DATABASE_URL": pg.dsn}
        rows = []
        with Progress(console=console) as progress:
            for n in counts:
                rows.append(run_row(env, namespace, n, events, progress))
    table = Table(
        title=f"heat services on one group, a backlog of {events:,} {shape} events ({os.cpu_count()} cores)"
    )
    for col in ("instances", "events applied", "events/s", "x one", "CPU us per event", "idle CPU %"):
        table.add_column(col, justify="right")
    for row in rows:
        table.add_row(
            str(row["instances"]),
            f"{row['applied']:,}" + ("" if row["applied"] == events else " (!)"),
            f"{row['per_s']:,.0f}",
            f"{row['per_s'] / rows[0]['per_s']:.2f}",
            f"{row['cpu_us']:.1f}",
            f"{row['idle_cpu_pct']:.1f}",
        )
    console.print(table)


if __name__ == "__main__":
    typer.run(main)
