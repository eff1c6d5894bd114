"""The tiers API at rate: one tier node in its own process (real Kafka and Postgres from KAFKA_BOOTSTRAP /
DATABASE_URL, e.g. `source /work/shared-infra/env.sh`) and a load generator in another (a raw keep-alive
HTTP/1.1 client on asyncio streams: httpx costs more per request than the node does).

Exact-key lookups (POST /v1/lookup with a key that is in L1): closed loop at 1 and 32 connections
(throughput, p50/p99, the node's CPU per lookup from /proc), open loop at a fixed rate (latency from the
scheduled send time, so a stall is not hidden), and batched lookups (POST /v1/lookup/batch) in keys/s.

    python -m bench.api                          # ~30 s
    python -m bench.api --seconds 2 --loop asyncio
    python -m bench.api --profile /tmp/node.prof # cProfile of the node, top functions printed
    python -m bench.api --drop-access-events     # the node without publishing cache.access (attribution)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
import uuid
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
KEYS = 1_000
TARGETS = {"open p99 ms": 5.0, "max lookups/s": 5_000.0, "batch keys/s": 41_700.0}


# --- the node (server process) --------------------------------------------------------------------


async def _serve(prefix: str, keys: int, loop_name: str, drop_access: bool) -> None:
    from services.runtime.service import configure_gc
    from services.runtime.topics import ensure_topics
    from services.tiers.entry import EntryMeta, encode_text
    from services.tiers.service import TiersService
    from services.tiers.settings import TiersSettings

    await ensure_topics(os.environ["KAFKA_BOOTSTRAP"], os.environ["KAFKA_TOPIC_NAMESPACE"])
    settings = TiersSettings(
        node_id=f"bench-api-{prefix}",
        api_port=0,
        block_port=0,
        metrics_port=0,
        embedder_preload=False,
        l2_pages=256,
        max_batch=4096,
    )
    configure_gc(settings)  # as `run_service` does for `python -m services.tiers`
    service = TiersService(settings)
    await service.start()
    if drop_access:
        # Attribution only: the access events are taken from the outbox as usual but not published, so
        # the node's CPU per lookup without the event plane's share shows.
        service._publish_access = _take_access  # type: ignore[method-assign]
    task = asyncio.create_task(service.run())
    try:
        assert service.cache is not None
        for i in range(keys):
            key = f"{prefix}-{i}"
            answer = f"answer {i}: " + "x" * 150
            await service.cache.put(
                EntryMeta(key=key, kind="prompt", model="m"), encode_text(answer, model="m")
            )
        print(json.dumps({"url": service.api_url, "pid": os.getpid(), "loop": loop_name}), flush=True)
        await asyncio.to_thread(sys.stdin.readline)  # the bench closes stdin when it is done
    finally:
        service.request_stop()
        await asyncio.gather(task, return_exceptions=True)
        await service.stop()


async def _asgi_cpu_us(n: int = 5_000) -> tuple[float, float]:
    """Process CPU per exact lookup, and per key of a batch of 1,000, through the ASGI app alone (no
    sockets, no Kafka): the API's own cost over an L1 hit."""
    from services.runtime.breaker import LatencyBreaker
    from services.tiers.edge.api import create_app
    from services.tiers.entry import EntryMeta, encode_text
    from services.tiers.l1.cache import L1Cache
    from services.tiers.node.outbox import Outbox
    from services.tiers.node.tiered import TieredCache
    from services.tiers.settings import TiersSettings

    settings = TiersSettings(api_token=None)
    cache = TieredCache(
        l1=L1Cache(dim=settings.embedding_dim, capacity_bytes=1 << 24, max_entries=2 * KEYS),
        l2=None,
        l3=None,
        outbox=Outbox(clock=lambda: 0),
        breaker=LatencyBreaker(clock=lambda: 0),
        node_id="bench-asgi",
    )
    for i in range(KEYS):
        answer = f"answer {i}: " + "x" * 150
        await cache.put(EntryMeta(key=f"k{i}", kind="prompt", model="m"), encode_text(answer, model="m"))
    app = create_app(cache, settings)
    statuses: list[int] = []

    async def call(path: str, body: bytes) -> None:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))],
            "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 2),
        }

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                statuses.append(message["status"])

        await app(scope, receive, send)

    ones = [json.dumps({"key": f"k{i}"}).encode() for i in range(KEYS)]
    batch = json.dumps({"requests": [{"key": f"k{i}"} for i in range(KEYS)]}).encode()
    for body in ones[:200]:
        await call("/v1/lookup", body)
    t0 = time.process_time()
    for i in range(n):
        await call("/v1/lookup", ones[i % KEYS])
    one_us = (time.process_time() - t0) / n * 1e6
    t0 = time.process_time()
    for _ in range(10):
        await call("/v1/lookup/batch", batch)
    batch_us = (time.process_time() - t0) / (10 * KEYS) * 1e6
    assert set(statuses) == {200}, set(statuses)
    return one_us, batch_us


async def _take_access(outbox: Any) -> None:
    outbox.take_access()


def serve_main(prefix: str, keys: int, loop_name: str, profile: str | None, drop_access: bool) -> None:
    import logging

    logging.basicConfig(level=logging.WARNING)
    if loop_name == "uvloop":
        import uvloop

        runner: Any = uvloop.run
    else:
        runner = asyncio.run
    if profile is None:
        runner(_serve(prefix, keys, loop_name, drop_access))
        return
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    try:
        runner(_serve(prefix, keys, loop_name, drop_access))
    finally:
        prof.disable()
        prof.dump_stats(profile)
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(30)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- the load generator (its own process) ---------------------------------------------------------


def _request(host: str, path: str, body: bytes) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, host: str, port: int) -> Conn:
        return cls(*await asyncio.open_connection(host, port))

    async def call(self, raw: bytes) -> tuple[int, bytes]:
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


async def _closed_loop(url: str, bodies: list[bytes], conns: int, seconds: float) -> dict[str, Any]:
    host, port = url.removeprefix("http://").split(":")
    pool = [await Conn.open(host, int(port)) for _ in range(conns)]
    lat: list[float] = []
    errors = 0
    stop = time.perf_counter() + seconds

    async def worker(c: Conn, offset: int) -> None:
        nonlocal errors
        i = offset
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            status, _ = await c.call(bodies[i % len(bodies)])
            lat.append(time.perf_counter() - t0)
            errors += status != 200
            i += 7

    started = time.perf_counter()
    await asyncio.gather(*(worker(c, k * 131) for k, c in enumerate(pool)))
    elapsed = time.perf_counter() - started
    for c in pool:
        c.close()
    return _summary(lat, elapsed, errors)


async def _open_loop(url: str, bodies: list[bytes], rate: float, seconds: float) -> dict[str, Any]:
    """Requests due at fixed intervals; each takes a free connection (a new one if all are busy), and its
    latency counts from when it was due."""
    host, port = url.removeprefix("http://").split(":")
    free = [await Conn.open(host, int(port)) for _ in range(16)]
    lat: list[float] = []
    errors = 0
    tasks = []

    async def one(raw: bytes, due: float) -> None:
        nonlocal errors
        c = free.pop() if free else await Conn.open(host, int(port))
        status, _ = await c.call(raw)
        lat.append(time.perf_counter() - due)
        errors += status != 200
        free.append(c)

    n = int(rate * seconds)
    slips: list[float] = []  # how late this generator sent each request: its own stalls, not the node's
    start = time.perf_counter() + 0.05
    for i in range(n):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        slips.append(time.perf_counter() - due)
        tasks.append(asyncio.create_task(one(bodies[(i * 7) % len(bodies)], due)))
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    for c in free:
        c.close()
    out = _summary(lat, elapsed, errors)
    out["client_slip_p99_ms"] = float(np.percentile(np.asarray(slips) * 1000, 99))
    out["client_slip_max_ms"] = max(slips) * 1000
    return out


def _summary(lat: list[float], elapsed: float, errors: int) -> dict[str, Any]:
    a = np.asarray(lat) * 1000
    return {
        "requests": len(lat),
        "per_s": len(lat) / elapsed,
        "p50_ms": float(np.percentile(a, 50)),
        "p99_ms": float(np.percentile(a, 99)),
        "errors": errors,
    }


def _load(kind: str, url: str, bodies: list[bytes], arg: float, seconds: float, out: Any) -> None:
    import uvloop

    if kind == "open":
        out.put(uvloop.run(_open_loop(url, bodies, arg, seconds)))
    else:
        out.put(uvloop.run(_closed_loop(url, bodies, int(arg), seconds)))


def run_load(kind: str, url: str, bodies: list[bytes], arg: float, seconds: float) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_load, args=(kind, url, bodies, arg, seconds, out))
    proc.start()
    result: dict[str, Any] = out.get(timeout=seconds + 60)
    proc.join()
    return result


# --- the bench ------------------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=4.0, help="per measurement")
    p.add_argument("--rate", type=float, default=1_000.0, help="open-loop lookups/s")
    p.add_argument("--batch", type=int, default=1_000, help="keys per batched lookup")
    p.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop", help="the node's event loop")
    p.add_argument("--profile", help="write the node's cProfile here (and print its top functions)")
    p.add_argument(
        "--drop-access-events",
        action="store_true",
        help="attribution: the node does not publish its cache.access events (what the API costs alone)",
    )
    p.add_argument("--serve", help=argparse.SUPPRESS)  # internal: run the node
    args = p.parse_args()
    if args.serve:
        serve_main(args.serve, KEYS, args.loop, args.profile, args.drop_access_events)
        return
    for var in ("KAFKA_BOOTSTRAP", "DATABASE_URL"):
        if not os.environ.get(var):
            sys.exit(
                f"{var} is not set: point it at a broker and Postgres (source /work/shared-infra/env.sh)"
            )
    prefix = uuid.uuid4().hex[:8]
    env = {**os.environ, "PYTHONPATH": str(REPO), "KAFKA_TOPIC_NAMESPACE": f"bapi{prefix}."}
    env["CACHEMESH_TIERS_LOG_LEVEL"] = "WARNING"
    cmd = [sys.executable, "-m", "bench.api", "--serve", prefix, "--loop", args.loop]
    if args.profile:
        cmd += ["--profile", args.profile]
    if args.drop_access_events:
        cmd.append("--drop-access-events")
    node = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert node.stdout is not None and node.stdin is not None
        info = json.loads(node.stdout.readline())
        url, pid = info["url"], info["pid"]
        host = url.removeprefix("http://")
        one = [
            _request(host, "/v1/lookup", json.dumps({"key": f"{prefix}-{i}"}).encode()) for i in range(KEYS)
        ]
        batches = [
            _request(
                host,
                "/v1/lookup/batch",
                json.dumps(
                    {"requests": [{"key": f"{prefix}-{(b * 37 + j) % KEYS}"} for j in range(args.batch)]}
                ).encode(),
            )
            for b in range(8)
        ]
        run_load("closed", url, one, 1, 1.0)  # warm up both sides
        rows: list[tuple[str, dict[str, Any], float]] = []

        cpu0 = cpu_s(pid)
        time.sleep(args.seconds)
        idle_cpu_per_s = (cpu_s(pid) - cpu0) / args.seconds  # the node's loops with no requests
        for name, kind, bodies, arg in (
            ("exact, 1 client", "closed", one, 1),
            ("exact, 8 clients", "closed", one, 8),
            ("exact, 32 clients", "closed", one, 32),
            (f"exact, open loop {args.rate:,.0f}/s", "open", one, args.rate),
            (f"batch of {args.batch}, 1 client", "closed", batches, 1),
            (f"batch of {args.batch}, 4 clients", "closed", batches, 4),
        ):
            cpu0, t0 = cpu_s(pid), time.perf_counter()
            r = run_load(kind, url, bodies, arg, args.seconds)
            busy = cpu_s(pid) - cpu0 - idle_cpu_per_s * (time.perf_counter() - t0)
            keys = args.batch if "batch" in name else 1
            r["keys_per_s"] = r["per_s"] * keys
            r["cpu_us_per_key"] = busy / (r["requests"] * keys) * 1e6
            rows.append((name, r, keys))
    finally:
        if node.stdin is not None:
            node.stdin.close()
        node.wait(timeout=60)
    print(
        f"\ntiers API, one node ({args.loop}{', access events dropped' if args.drop_access_events else ''}), "
        f"{KEYS} keys in L1; load average {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} cores; {args.seconds:g} s per row"
    )
    header = (
        f"{'load':34} {'requests/s':>11} {'keys/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'node CPU us/key':>16} {'errors':>6}"
    )
    print(header)
    print("-" * len(header))
    for name, r, _ in rows:
        print(
            f"{name:34} {r['per_s']:11,.0f} {r['keys_per_s']:9,.0f} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} "
            f"{r['cpu_us_per_key']:16.1f} {r['errors']:6d}"
        )
    print(
        f"targets: open-loop p99 <= {TARGETS['open p99 ms']} ms; max exact >= "
        f"{TARGETS['max lookups/s']:,.0f}/s; 32 clients >= 1; batch >= {TARGETS['batch keys/s']:,.0f} "
        "keys/s; <= 100 us node CPU per exact lookup"
    )
    for name, r, _ in rows:
        if "client_slip_max_ms" in r:
            print(
                f"{name}: the load generator itself sent late by p99 {r['client_slip_p99_ms']:.2f} ms, "
                f"max {r['client_slip_max_ms']:.2f} ms (a stall of this machine, not of the node)"
            )
    exact = [r for name, r, _ in rows if name.startswith("exact") and "open" not in name]
    print(f"max exact lookups/s: {max(r['per_s'] for r in exact):,.0f}")
    one_us, batch_us = asyncio.run(_asgi_cpu_us())
    print(
        f"node CPU: the node process above its idle {idle_cpu_per_s * 100:.1f}% of a core (uvicorn, the "
        "app, and the Kafka access event every lookup publishes)"
    )
    print(
        f"the ASGI app alone, in process: {one_us:.1f} us CPU per exact lookup, "
        f"{batch_us:.1f} us per batched key"
    )
    print("json:", json.dumps({name: r for name, r, _ in rows}))


if __name__ == "__main__":
    main()
