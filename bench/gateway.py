"""The gateway's overhead: a request through the gateway against the same request straight to the
upstream, one after another on one connection each, in one run. Rows: the upstream direct; the gateway
with the cache bypassed (the proxy alone); a miss (the lookup with its embedding, the forward, the relay;
the write happens after the answer); an exact hit and a semantic hit (answered by the gateway, the
upstream never asked). Streamed misses and hits are timed to the last byte. Beside them, the tier node's
own lookup (a miss, straight to its API): how much of a miss's added time is the cache's.

The upstream is the OpenAI-compatible double (`infra/standin.py`, a fixed delay standing in
for generation), the tier node and the gateway run as their own processes, on a real broker and Postgres
(`KAFKA_BOOTSTRAP` / `DATABASE_URL` when set, otherwise it starts its own).
Run: `python -m bench.gateway [--requests N] [--upstream-delay-ms D] [--hedge-after-ms H] [--pin]`.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import httpx
import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from infra.brokers import broker_from_env
from infra.paths import free_port
from infra.postgres import postgres_from_env
from infra.process import ServerProcess
from services.runtime.topics import ensure_topics

RESULTS = Path(__file__).parent / "results"
REPO = Path(__file__).resolve().parent.parent
# A new model name per run: Postgres (L3) keeps earlier runs' answers, which would turn misses into hits.
MODEL = f"bench-{uuid.uuid4().hex[:8]}"
TOPICS = ["refund", "password", "invoice", "shipping", "account", "warranty", "delivery", "subscription"]


@dataclass
class Row:
    path: str
    requests: int
    p50_ms: float
    p99_ms: float
    added_p50_ms: float
    added_p99_ms: float
    ratio_p50: float
    served_as_expected: int


def _question(i: int) -> str:
    return f"How do I change the {TOPICS[i % len(TOPICS)]} settings of account number {1000 + i}?"


def _paraphrase(i: int) -> str:
    return f"How can I change the {TOPICS[i % len(TOPICS)]} settings of account number {1000 + i}?"


@contextlib.contextmanager
def _process(
    name: str, args: list[str], env: dict[str, str], logs: Path, cpus: str | None = None
) -> Iterator[ServerProcess]:
    pin = ["taskset", "-c", cpus] if cpus else []
    proc = ServerProcess(
        [*pin, sys.executable, *args], log_path=logs / f"{name}.log", env={**os.environ, **env}, cwd=REPO
    )
    try:
        yield proc
    finally:
        proc.stop(10)


async def _ready(http: httpx.AsyncClient, url: str, proc: ServerProcess, ok: Callable[[Any], bool]) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if not proc.is_alive():
            raise RuntimeError(f"{url} exited:\n{proc.log_tail()}")
        with contextlib.suppress(httpx.HTTPError, ValueError):
            response = await http.get(url)
            if response.status_code == 200 and ok(response.json()):
                return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{url} not ready within 180 s:\n{proc.log_tail()}")


def _body(text: str, stream: bool = False) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "stream": stream,
        "temperature": 0,
    }


LOOKUP_MS_SEEN: list[float] = []
"""The lookup's time as the gateway measured it (`x-cachemesh-lookup-ms` of each miss)."""


async def _timed(
    client: httpx.AsyncClient, texts: list[str], expect: str | None, stream: bool = False, **headers: str
) -> tuple[list[float], int]:
    """Latency of each request (to the last byte) and how many were served as `expect` said."""
    latencies, expected = [], 0
    for text in texts:
        started = time.perf_counter()
        async with client.stream("POST", "/chat/completions", json=_body(text, stream), headers=headers) as r:
            await r.aread()
        latencies.append((time.perf_counter() - started) * 1000)
        if r.status_code != 200:
            raise RuntimeError(f"{r.status_code}: {r.text[:300]}")
        expected += expect is None or r.headers.get("x-cachemesh-cache") == expect
        if expect == "miss" and "x-cachemesh-lookup-ms" in r.headers:
            LOOKUP_MS_SEEN.append(float(r.headers["x-cachemesh-lookup-ms"]))
    return latencies, expected


async def _lookups(client: httpx.AsyncClient, texts: list[str]) -> tuple[list[float], int]:
    """The tier node's own lookup (exact key, then the text's embedding), straight to its API: the part
    of a miss's cost that is the cache's, not the gateway's."""
    latencies, missed = [], 0
    for i, text in enumerate(texts):
        body = {"key": f"bench-absent-{i}", "text": text, "model": f"{MODEL}-lookups", "include_value": True}
        started = time.perf_counter()
        r = await client.post("/v1/lookup", json=body)
        latencies.append((time.perf_counter() - started) * 1000)
        missed += not r.json()["hit"]
    return latencies, missed


async def _run(
    bootstrap: str,
    dsn: str,
    requests: int,
    delay_ms: float,
    lookup_timeout_ms: int,
    hedge_after_ms: int | None,
    pin: bool = False,
) -> tuple[list[Row], dict[str, int]]:
    namespace = f"bench{uuid.uuid4().hex[:6]}."
    await ensure_topics(bootstrap, namespace)
    up_port, tiers_port, gw_port = free_port(), free_port(), free_port()
    common = {"KAFKA_BOOTSTRAP": bootstrap, "KAFKA_TOPIC_NAMESPACE": namespace, "DATABASE_URL": dsn}
    tiers_env = {
        **common,
        "CACHEMESH_TIERS_NODE_ID": f"bench-{namespace}",
        "CACHEMESH_TIERS_API_PORT": str(tiers_port),
        "CACHEMESH_TIERS_BLOCK_PORT": "0",
        "CACHEMESH_TIERS_METRICS_PORT": "0",
    }
    gw_env = {
        **common,
        "CACHEMESH_GATEWAY_API_PORT": str(gw_port),
        "CACHEMESH_GATEWAY_METRICS_PORT": "0",
        "CACHEMESH_GATEWAY_UPSTREAM_URL": f"http://127.0.0.1:{up_port}/v1",
        "CACHEMESH_GATEWAY_TIERS_URL": f"http://127.0.0.1:{tiers_port}",
        "CACHEMESH_GATEWAY_LOOKUP_TIMEOUT_MS": str(lookup_timeout_ms),
    }
    if hedge_after_ms is not None:
        gw_env["CACHEMESH_GATEWAY_HEDGE_AFTER_MS"] = str(hedge_after_ms)
    upstream_args = ["-m", "infra.standin", "--port", str(up_port), "--delay-ms", str(delay_ms)]
    direct_url, gateway_url = f"http://127.0.0.1:{up_port}/v1", f"http://127.0.0.1:{gw_port}/v1"
    with (
        tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp,
        _process("upstream", upstream_args, {}, Path(tmp), "0" if pin else None) as upstream,
        _process("tiers", ["-m", "services.tiers"], tiers_env, Path(tmp), "1" if pin else None) as tiers,
        _process("gateway", ["-m", "services.gateway"], gw_env, Path(tmp), "0" if pin else None) as gateway,
    ):
        async with httpx.AsyncClient(timeout=60) as http:
            await _ready(http, f"{direct_url}/models", upstream, lambda _: True)
            await _ready(
                http,
                f"http://127.0.0.1:{tiers_port}/v1/stats",
                tiers,
                lambda s: (s.get("embedder") or {}).get("state") == "ready",
            )
            await _ready(http, f"http://127.0.0.1:{gw_port}/healthz", gateway, lambda h: h.get("healthy"))
        async with (
            httpx.AsyncClient(base_url=direct_url, timeout=60) as direct,
            httpx.AsyncClient(base_url=gateway_url, timeout=60) as via,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{tiers_port}", timeout=60) as tier,
        ):
            # Warm both connections and the embedder's first batch; not measured.
            await _timed(direct, [f"warm {i}" for i in range(5)], None)
            await _timed(via, [f"warm {i}" for i in range(5)], None)
            questions = [_question(i) for i in range(requests)]
            streamed = [_question(requests + i) for i in range(requests)]
            bypass = {"x-cachemesh-bypass": "1"}
            runs: list[tuple[str, Callable[[], Awaitable[tuple[list[float], int]]]]] = [
                ("upstream direct", lambda: _timed(direct, [f"direct {q}" for q in questions], None)),
                ("gateway, cache bypassed", lambda: _timed(via, questions, "bypass", **bypass)),
                (
                    "tier node lookup alone (a miss)",
                    lambda: _lookups(tier, [f"lookup {q}" for q in questions]),
                ),
                ("gateway miss", lambda: _timed(via, questions, "miss")),
                ("gateway hit (exact)", lambda: _timed(via, questions, "hit")),
                (
                    "gateway hit (semantic)",
                    lambda: _timed(via, [_paraphrase(i) for i in range(requests)], "hit"),
                ),
                (
                    "upstream direct, streamed",
                    lambda: _timed(direct, [f"direct {q}" for q in streamed], None, True),
                ),
                ("gateway miss, streamed", lambda: _timed(via, streamed, "miss", True)),
                ("gateway hit, streamed", lambda: _timed(via, streamed, "hit", True)),
            ]
            measured: dict[str, tuple[list[float], int]] = {}
            for name, run in runs:
                measured[name] = await run()
                if name.startswith("gateway miss"):
                    await asyncio.sleep(0.5)  # the writes go after the answers: let them land
            stats = (await via.get("/cachemesh/stats")).json()
    rows = []
    for name, (latencies, expected) in measured.items():
        base = measured["upstream direct, streamed" if "streamed" in name else "upstream direct"][0]
        b50, b99 = (float(p) for p in np.percentile(base, [50, 99]))
        p50, p99 = (float(p) for p in np.percentile(latencies, [50, 99]))
        rows.append(Row(name, len(latencies), p50, p99, p50 - b50, p99 - b99, p50 / b50, expected))
    return rows, stats["requests"]


def main(
    requests: Annotated[int, typer.Option(help="Requests per row")] = 200,
    upstream_delay_ms: Annotated[float, typer.Option(help="The upstream double's answer time")] = 20.0,
    lookup_timeout_ms: Annotated[int, typer.Option(help="CACHEMESH_GATEWAY_LOOKUP_TIMEOUT_MS")] = 1000,
    hedge_after_ms: Annotated[int | None, typer.Option(help="CACHEMESH_GATEWAY_HEDGE_AFTER_MS")] = None,
    pin: Annotated[
        bool,
        typer.Option(
            help="The tier node on CPU 1; the gateway, the upstream double and this client on CPU 0 "
            "(a deployment gives the cache its own cores; on 2 shared cores its embedding otherwise "
            "takes CPU from the proxy path)"
        ),
    ] = False,
) -> None:
    if pin:
        os.sched_setaffinity(0, {0})
    with broker_from_env() as broker, postgres_from_env() as pg:
        rows, outcomes = asyncio.run(
            _run(
                broker.bootstrap, pg.dsn, requests, upstream_delay_ms, lookup_timeout_ms, hedge_after_ms, pin
            )
        )
    table = Table(
        title=f"gateway overhead ({requests} sequential requests per row, upstream answers in "
        f"{upstream_delay_ms:g} ms, lookup timeout {lookup_timeout_ms} ms, "
        f"{'no hedging' if hedge_after_ms is None else f'hedged after {hedge_after_ms} ms'}"
        f"{', node pinned apart' if pin else ''})"
    )
    for column in ("path", "p50 ms", "p99 ms", "+p50 ms", "+p99 ms", "p50 / direct", "served as"):
        table.add_column(column, justify="left" if column == "path" else "right")
    for r in rows:
        direct = r.path.startswith("upstream")
        alone = r.path.startswith("tier node")
        table.add_row(
            r.path,
            f"{r.p50_ms:.2f}",
            f"{r.p99_ms:.2f}",
            "" if direct or alone else f"{r.added_p50_ms:+.2f}",
            "" if direct or alone else f"{r.added_p99_ms:+.2f}",
            f"{r.ratio_p50:.2f}x",
            "" if direct else f"{r.served_as_expected}/{r.requests}",
        )
    console = Console()
    console.print(table)
    # A request "served as" something else: its lookup timed out, was skipped, or lost the hedge.
    if LOOKUP_MS_SEEN:
        p50, p99 = np.percentile(LOOKUP_MS_SEEN, [50, 99])
        console.print(f"the lookup on a miss as the gateway timed it: p50 {p50:.2f} ms, p99 {p99:.2f} ms")
    console.print("gateway outcomes: " + ", ".join(f"{k}={v}" for k, v in sorted(outcomes.items()) if v))
    RESULTS.mkdir(exist_ok=True)
    with open(RESULTS / "gateway.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(asdict(rows[0])))
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)


if __name__ == "__main__":
    typer.run(main)
