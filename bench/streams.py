"""How many access events per second one faust worker sustains with its window lag under 1 s.

One `python -m streams` worker on Apache Kafka. Live traffic (the Mooncake replay's keys, hits and
layers, stamped with the current time) is produced at a ladder of rates, each for a few seconds;
the window lag is the wall time between a window's end and its arrival on `stream.window.v1`, for
every window that ends inside the step's steady state (after a warm-up, before the last 2 s). The
figure is the highest rate whose p95 lag stays under 1 s with the worker keeping up; the worker's
CPU share and events per CPU-second show how much of that is the machine (benchmarks share it).
The baseline row is the same window maths offline (no Kafka, no faust) on the same events, so the
ratio shows what the streaming plumbing costs. After the ladder, every window the worker(s) emitted
is compared with the offline computation over exactly the accesses sent (counts, entropy, rates,
percentiles: `streams.offline.compare_windows`), and the result is printed per setup.

Run: `python -m bench.streams [--rates 500,1000,2000] [--seconds 12]`; `KAFKA_BOOTSTRAP` uses an
existing cluster instead of starting one.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated

import aiohttp
import typer
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner
from rich.console import Console
from rich.table import Table

from infra.brokers import ApacheKafkaBroker, Broker, broker_from_env
from infra.generator import ReplayConfig, mooncake_events
from infra.paths import free_port
from infra.process import ServerProcess
from schemas.events import CacheAccessed, WindowComputed
from schemas.topics import qualified
from schemas.wire import decode, encode
from services.runtime.topics import ensure_topics
from streams.offline import compare_windows, offline_windows
from streams.settings import StreamsSettings
from streams.windows import HOPPING_10S

RESULTS = Path(__file__).parent / "results"
REPO_ROOT = Path(__file__).resolve().parent.parent
STAMP = 1_111_111_111_111  # placeholder time in the pre-encoded payloads
LAG_LIMIT_MS = 1_000
COOLDOWN_MS = 2_000
_PARTITIONER = DefaultPartitioner()


@dataclass
class Row:
    setup: str
    target_eps: float
    sent_eps: float
    applied_eps: float
    windows: int
    lag_p50_ms: float
    lag_p95_ms: float
    lag_max_ms: float
    worker_cpu_pct: float
    events_per_cpu_s: float
    broker_cpu_pct: float
    keeps_up: bool
    # Every window of the run against the offline computation on the events sent (the whole ladder
    # of this setup): "equal (N windows)" or the differences.
    counts: str = ""


TEMPLATES = 20_000  # distinct payloads a producer cycles through


def _template_accesses() -> list[CacheAccessed]:
    """The Mooncake replay's accesses, which the templates take in turn."""
    return [e for e in mooncake_events(config=ReplayConfig(base_ms=0)) if isinstance(e, CacheAccessed)]


def _templates(count: int) -> list[tuple[bytes, bytes, str]]:
    """(key, payload with a placeholder time, topic name) from the Mooncake replay."""
    events = _template_accesses()
    out = []
    for n in range(count):
        e = events[n % len(events)]
        e = e.model_copy(update={"occurred_at_ms": STAMP, "event_id": uuid.uuid4().hex})
        out.append((e.kafka_key().encode(), encode(e), e.topic))
    return out


def _batch_payload(key: bytes, payloads: list[bytes], now: bytes) -> bytes:
    """A `CacheAccessBatch` record of already-encoded accesses (what `encode` would write)."""
    head = b'{"schema_version":1,"event_id":"%s","occurred_at_ms":%s,"type":"cache.accessed.batch","key":'
    return (
        head % (uuid.uuid4().hex.encode(), now)
        + json.dumps(key.decode()).encode()
        + b',"events":['
        + b",".join(payloads)
        + b"]}"
    )


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def _health(port: int) -> dict[str, object]:
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/healthz", timeout=aiohttp.ClientTimeout(total=2)) as r,
        ):
            body = await r.json(content_type=None)
            return body if isinstance(body, dict) else {}
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return {}


class _Lags:
    def __init__(self) -> None:
        self.by_end: list[tuple[int, float]] = []
        self.windows: list[WindowComputed] = []  # every one read, for the count check
        self.ready = asyncio.Event()  # positioned at the end of every partition

    async def follow(self, bootstrap: str, topic: str, stop: asyncio.Event) -> None:
        reader = AIOKafkaConsumer(
            topic, bootstrap_servers=bootstrap, auto_offset_reset="latest", group_id=None
        )
        await reader.start()
        try:
            while not reader.assignment():  # noqa: ASYNC110 - aiokafka offers no event for this
                await asyncio.sleep(0.05)
            for tp in reader.assignment():
                await reader.position(tp)
            self.ready.set()
            while not stop.is_set():
                batch = await reader.getmany(timeout_ms=100)
                now = time.time() * 1000
                for records in batch.values():
                    for record in records:
                        event = decode(record.value)
                        if isinstance(event, WindowComputed):
                            self.by_end.append((event.window_end_ms, now - event.window_end_ms))
                            self.windows.append(event)
        finally:
            await reader.stop()


async def _step(
    producer: AIOKafkaProducer,
    templates: list[tuple[bytes, bytes, str]],
    namespace: str,
    rate: float,
    seconds: float,
    batch: int = 1,
) -> tuple[float, float, float, list[tuple[int, int, int]]]:
    """Sends at `rate` events/s for `seconds`, one record per event or, with `batch` > 1, the events
    due in each 10 ms tick grouped by partition into `CacheAccessBatch` records of up to `batch`;
    returns (start ms, end ms, achieved events/s, what was sent: (first template, end, time ms) per
    10 ms tick, the templates taken in turn from the first)."""
    placeholder = str(STAMP).encode()
    topic = qualified(templates[0][2], namespace)
    partitions = sorted(await producer.partitions_for(topic))
    began = time.monotonic()
    start_ms = time.time() * 1000
    sent = 0
    tick_s = 0.01
    ticks: list[tuple[int, int, int]] = []
    while (elapsed := time.monotonic() - began) < seconds:
        due = int(elapsed * rate) + 1
        now_ms = int(time.time() * 1000)
        now = str(now_ms).encode()
        if due > sent:
            ticks.append((sent, due, now_ms))
        if batch <= 1:
            while sent < due:
                key, payload, _ = templates[sent % len(templates)]
                await producer.send(topic, payload.replace(placeholder, now), key=key)
                sent += 1
        else:
            groups: dict[int, list[tuple[bytes, bytes]]] = {}
            while sent < due:
                key, payload, _ = templates[sent % len(templates)]
                partition = _PARTITIONER(key, partitions, partitions)
                groups.setdefault(partition, []).append((key, payload.replace(placeholder, now)))
                sent += 1
            for partition, group in groups.items():
                for i in range(0, len(group), batch):
                    part = group[i : i + batch]
                    value = _batch_payload(part[0][0], [p for _, p in part], now)
                    await producer.send(topic, value, key=part[0][0], partition=partition)
        await asyncio.sleep(tick_s)
    await producer.flush()
    took = time.monotonic() - began
    return start_ms, time.time() * 1000, sent / took, ticks


async def produce_step(
    bootstrap: str, namespace: str, rate: float, seconds: float, batch: int = 1
) -> tuple[float, float, float, list[tuple[int, int, int]]]:
    templates = _templates(TEMPLATES)
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=5, acks=1, max_batch_size=1 << 20, max_request_size=4 << 20
    )
    await producer.start()
    try:
        return await _step(producer, templates, namespace, rate, seconds, batch)
    finally:
        await producer.stop()


async def _produce_elsewhere(
    bootstrap: str, namespace: str, rate: float, seconds: float, batch: int
) -> tuple[float, float, float, list[tuple[int, int, int]]]:
    """Runs the producer in its own process, so it does not delay the reading of the windows."""
    code = (
        "import asyncio, json, sys; from bench.streams import produce_step; "
        "args = sys.argv[1:3] + [float(a) for a in sys.argv[3:5]] + [int(sys.argv[5])]; "
        "print(json.dumps(asyncio.run(produce_step(*args))))"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        bootstrap,
        namespace,
        str(rate),
        str(seconds),
        str(batch),
        cwd=REPO_ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"producer failed ({proc.returncode})")
    start_ms, end_ms, sent_eps, ticks = json.loads(out.decode().strip().splitlines()[-1])
    return float(start_ms), float(end_ms), float(sent_eps), [(a, b, t) for a, b, t in ticks]


def _sent_accesses(ticks: list[tuple[int, int, int]]) -> list[CacheAccessed]:
    """The accesses a producer sent, from its ticks: the same templates (`_templates` is the same
    replay in the same order; only the event ids differ, which no window counts), stamped as sent."""
    events = _template_accesses()
    out = []
    for first, end, at_ms in ticks:
        for n in range(first, end):
            out.append(events[n % TEMPLATES % len(events)].model_copy(update={"occurred_at_ms": at_ms}))
    return out


def _check_counts(got: list[WindowComputed], sent: list[CacheAccessed]) -> str:
    want = offline_windows(sent)
    problems = compare_windows(got, want)
    if not problems:
        return f"equal ({len(want):,} windows)"
    return f"{len(problems)} differences, e.g. {problems[0]}"


def _baseline(templates: list[tuple[bytes, bytes, str]], count: int) -> float:
    events = []
    for n in range(count):
        e = decode(
            templates[n % len(templates)][1].replace(
                str(STAMP).encode(), str(1_700_000_000_000 + 1_000 * (n // 500)).encode()
            )
        )
        assert isinstance(e, CacheAccessed)
        events.append(e)
    began = time.perf_counter()
    offline_windows(events)
    return count / (time.perf_counter() - began)


async def _applied(ports: list[int]) -> int:
    healths = [await _health(port) for port in ports]
    return sum(int(h.get("applied", 0)) for h in healths)  # type: ignore[call-overload]


async def run(
    broker: Broker, rates: list[float], seconds: float, warmup_s: float, *, workers: int = 1, batch: int = 1
) -> list[Row]:
    namespace = f"bench{uuid.uuid4().hex[:6]}."
    await ensure_topics(broker.bootstrap, namespace)
    setup = (
        f"{workers} faust worker{'s' if workers > 1 else ''}, " if workers else "no worker (broker only), "
    ) + ("1 event/record" if batch <= 1 else f"batches of <= {batch}")
    ports, procs = [], []
    try:
        for n in range(workers):
            port = free_port()
            data_dir = tempfile.mkdtemp(prefix="bench-streams-")
            env = {
                **os.environ,
                "PYTHONPATH": str(REPO_ROOT),
                "KAFKA_BOOTSTRAP": broker.bootstrap,
                "KAFKA_TOPIC_NAMESPACE": namespace,
                "CACHEMESH_STREAMS_METRICS_PORT": str(port),
                "CACHEMESH_STREAMS_DATA_DIR": data_dir,
                "CACHEMESH_STREAMS_LOG_LEVEL": "WARNING",
            }
            procs.append(
                ServerProcess(
                    [sys.executable, "-m", "streams"],
                    log_path=Path(data_dir) / f"worker{n}.log",
                    env=env,
                    cwd=REPO_ROOT,
                )
            )
            ports.append(port)
        deadline = time.monotonic() + 120
        for port, worker in zip(ports, procs, strict=True):
            while not (await _health(port)).get("healthy"):
                if time.monotonic() > deadline or not worker.is_alive():
                    raise RuntimeError(f"worker did not start:\n{worker.log_tail()}")
                await asyncio.sleep(0.5)
        if workers > 1:
            # Every worker healthy at once: the group has settled on one assignment.
            deadline = time.monotonic() + 60
            while not all([(await _health(port)).get("healthy") for port in ports]):
                if time.monotonic() > deadline:
                    raise RuntimeError("workers did not settle")
                await asyncio.sleep(0.5)
        rows = await _ladder(broker, namespace, setup, ports, procs, rates, seconds, warmup_s, batch)
        if not workers:
            rows = [Row(**{**asdict(r), "keeps_up": False}) for r in rows]
    finally:
        for worker in procs:
            worker.stop(20)
    return rows


async def _ladder(
    broker: Broker,
    namespace: str,
    setup: str,
    ports: list[int],
    procs: list[ServerProcess],
    rates: list[float],
    seconds: float,
    warmup_s: float,
    batch: int,
) -> list[Row]:
    rows: list[Row] = []
    lags = _Lags()
    stop = asyncio.Event()
    follower = asyncio.create_task(
        lags.follow(broker.bootstrap, qualified(WindowComputed.topic, namespace), stop)
    )
    sent_ticks: list[tuple[int, int, int]] = []
    try:
        await asyncio.wait_for(lags.ready.wait(), 60)
        for rate in rates:
            applied_before = await _applied(ports)
            cpu_before = sum(_cpu_seconds(w.pid) for w in procs)
            broker_pid = getattr(broker, "pid", None)
            broker_before = _cpu_seconds(broker_pid) if broker_pid else float("nan")
            start_ms, end_ms, sent_eps, ticks = await _produce_elsewhere(
                broker.bootstrap, namespace, rate, seconds, batch
            )
            sent_ticks += ticks
            await asyncio.sleep(2.5)  # the last windows of the step close and arrive
            cpu = sum(_cpu_seconds(w.pid) for w in procs) - cpu_before
            broker_cpu = (_cpu_seconds(broker_pid) if broker_pid else float("nan")) - broker_before
            applied = await _applied(ports) - applied_before
            # Steady state only: after the warm-up, and before traffic stops (the last windows
            # then close by idleness, not by newer events).
            steady = (start_ms + warmup_s * 1000, end_ms - COOLDOWN_MS)
            window = [lag for end, lag in lags.by_end if steady[0] < end <= steady[1]]
            p95 = _percentile(window, 0.95)
            sent = sent_eps * seconds
            keeps_up = bool(window) and p95 < LAG_LIMIT_MS and applied >= 0.99 * sent
            rows.append(
                Row(
                    setup,
                    rate,
                    sent_eps,
                    applied / seconds,
                    len(window),
                    statistics.median(window) if window else float("nan"),
                    p95,
                    max(window) if window else float("nan"),
                    100.0 * cpu / (seconds + 2.5),
                    applied / cpu if cpu > 0 else float("nan"),
                    100.0 * broker_cpu / (seconds + 2.5),
                    keeps_up,
                )
            )
            print(json.dumps(asdict(rows[-1])), flush=True)
            lags.by_end.clear()
            await asyncio.sleep(2.0)  # drain before the next step
        # Quiet: every partition goes idle and the last hopping windows close on the wall clock.
        await asyncio.sleep((HOPPING_10S.size_ms + StreamsSettings().idle_ms + 2_000) / 1000)
    finally:
        stop.set()
        await follower
    if rows:
        counts = _check_counts(lags.windows, _sent_accesses(sent_ticks))
        rows = [Row(**{**asdict(r), "counts": counts}) for r in rows]
        print(f"{setup}: counts against the offline computation: {counts}", flush=True)
    return rows


def main(
    rates: Annotated[
        str, typer.Option(help="Comma-separated target rates (events/s)")
    ] = "1000,2000,3000,4000,5000",
    seconds: Annotated[float, typer.Option(help="Seconds per rate step")] = 12.0,
    warmup: Annotated[float, typer.Option(help="Seconds at the start of a step left out of the lag")] = 3.0,
    workers: Annotated[
        str,
        typer.Option(help="Comma-separated worker counts, one run each (0: the broker alone, for its CPU)"),
    ] = "1",
    batch: Annotated[
        str, typer.Option(help="Comma-separated events per record (1: single CacheAccessed records)")
    ] = "1,64",
) -> None:
    ladder = [float(r) for r in rates.split(",") if r.strip()]
    configs = [
        (int(w), int(b)) for w in workers.split(",") if w.strip() for b in batch.split(",") if b.strip()
    ]
    broker: Broker = broker_from_env() if os.environ.get("KAFKA_BOOTSTRAP") else ApacheKafkaBroker()
    rows: list[Row] = []
    with broker:
        for count, size in configs:
            rows += asyncio.run(run(broker, ladder, seconds, warmup, workers=count, batch=size))
    templates = _templates(20_000)
    offline_eps = _baseline(templates, 20_000)
    table = Table(title=f"streams: window lag per input rate (lag limit {LAG_LIMIT_MS} ms)")
    columns = (
        "setup",
        "target/s",
        "sent/s",
        "applied/s",
        "windows",
        "lag p50 ms",
        "lag p95 ms",
        "lag max ms",
        "worker CPU %",
        "events/CPU-s",
        "broker CPU %",
    )
    for column in (*columns, "x offline", "< 1 s"):
        table.add_column(column, justify="left" if column == "setup" else "right")
    for r in rows:
        table.add_row(
            r.setup,
            f"{r.target_eps:,.0f}",
            f"{r.sent_eps:,.0f}",
            f"{r.applied_eps:,.0f}",
            str(r.windows),
            f"{r.lag_p50_ms:,.0f}",
            f"{r.lag_p95_ms:,.0f}",
            f"{r.lag_max_ms:,.0f}",
            f"{r.worker_cpu_pct:.0f}",
            f"{r.events_per_cpu_s:,.0f}",
            f"{r.broker_cpu_pct:.0f}",
            f"{r.applied_eps / offline_eps:.2f}",
            "yes" if r.keeps_up else "no",
        )
    blank = [""] * 7
    table.add_row("offline maths (no Kafka)", "", "", f"{offline_eps:,.0f}", *blank, "1.00", "")
    console = Console(width=200)
    console.print(table)
    for setup in dict.fromkeys(r.setup for r in rows):
        sustained = max((r.sent_eps for r in rows if r.setup == setup and r.keeps_up), default=0.0)
        console.print(f"{setup}: sustained with p95 window lag < 1 s: {sustained:,.0f} events/s")
        counts = next(r.counts for r in rows if r.setup == setup)
        console.print(f"{setup}: every window against the offline computation: {counts}")
    RESULTS.mkdir(exist_ok=True)
    with open(RESULTS / "streams.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(asdict(rows[0])))
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        typer.run(main)
