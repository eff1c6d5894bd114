"""Text lookup latency at a tier node's API, embedding included: a real node (its own process, on the
broker and Postgres of `KAFKA_BOOTSTRAP` / `DATABASE_URL`, or ones it starts), filled with entries, then
lookups of texts it has not seen (so the embedder's cache does not answer them):

- open loop at a fixed rate (default 200/s for 20 s): p50/p99 from the scheduled send time, so queueing
  counts; exact-key lookups at the same rate as the baseline;
- closed loop at 1 and 32 concurrent clients: lookups per second (text and exact key);
- the floor: the same backend embedding one new text at a time in the bench process, nothing else
  running (no HTTP, no search), so the table shows how much of a lookup is the model itself.

Texts come from the semantic benchmark's prompts (../shared/data/semantic and fow-cache) in a few
phrasings, each sent once. `--profile` runs the node under cProfile and writes the top functions.

    .venv/bin/python -m bench.semantic_latency [--embedder onnx-int8|onnx] [--screen onnx-int8] [--lanes 2]
        [--rate 200] [--seconds 20] [--profile]

`--lanes` / `--max-call-texts` set the node's CACHEMESH_TIERS_EMBEDDER_LANES / _MAX_CALL_TEXTS.

Writes bench/results/semantic_latency.{csv,md} (and semantic_latency.prof.txt with --profile).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import csv
import json
import os
import random
import shutil
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from bench import semantic
from bench.tiers import _Conn, _post_head
from infra.brokers import broker_from_env
from infra.paths import free_port
from infra.postgres import postgres_from_env
from infra.process import ServerProcess
from services.runtime.topics import ensure_topics
from services.tiers.edge.embedder import Embedder

ROOT = Path(__file__).resolve().parents[1]
_STALE_S = 4.0  # under uvicorn's keep-alive timeout (5 s)
PHRASINGS = (
    "{}",
    "Quick question: {}",
    "{} Thanks!",
    "Could you tell me this: {}",
    "I was wondering, {}",
    "{} Please explain briefly.",
    "Hi! {}",
    "{} (asking for a project)",
)


def start_node(
    dsn: str,
    bootstrap: str,
    namespace: str,
    workdir: Path,
    embedder: str,
    profile: Path | None,
    extra_env: dict[str, str] | None = None,
) -> tuple[ServerProcess, str]:
    api_port, metrics_port = free_port(), free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "KAFKA_BOOTSTRAP": bootstrap,
        "KAFKA_TOPIC_NAMESPACE": namespace,
        "DATABASE_URL": dsn,
        "CACHEMESH_TIERS_NODE_ID": f"bench-semantic-{namespace}",
        "CACHEMESH_TIERS_API_PORT": str(api_port),
        "CACHEMESH_TIERS_METRICS_PORT": str(metrics_port),
        "CACHEMESH_TIERS_EMBEDDER": embedder,
        "CACHEMESH_TIERS_EMBEDDER_PRELOAD": "true",
        "CACHEMESH_TIERS_LOG_LEVEL": "WARNING",
        **(extra_env or {}),
    }
    cmd = [sys.executable, "-m", "services.tiers"]
    if profile is not None:
        cmd = [sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "services.tiers"]
    proc = ServerProcess(cmd, log_path=workdir / "tiers.log", env=env, cwd=ROOT)
    deadline = time.monotonic() + 90
    while True:
        try:
            with socket.create_connection(("127.0.0.1", metrics_port), timeout=1) as s:
                s.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
                if b'"healthy": true' in s.recv(65536):
                    break
        except OSError:
            pass
        if not proc.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"tiers node did not come up:\n{proc.log_tail()}")
        time.sleep(0.2)
    return proc, f"http://127.0.0.1:{api_port}"


def b64(vector: np.ndarray) -> str:
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()


class Texts:
    """Each text handed out once: the dataset's prompts in PHRASINGS, shuffled."""

    def __init__(self, prompts: list[str], seed: int) -> None:
        rng = random.Random(seed)
        self.fill = rng.sample(prompts, min(500, len(prompts)))
        filled = set(self.fill)
        rest = [p.format(t) for p in PHRASINGS for t in prompts if p.format(t) not in filled]
        rng.shuffle(rest)
        self._rest: Iterator[str] = iter(rest)

    def take(self, n: int) -> list[str]:
        out = [t for _, t in zip(range(n), self._rest, strict=False)]
        if len(out) < n:
            raise RuntimeError("out of new texts: lower --rate/--seconds")
        return out


async def fill(url: str, model: str, texts: list[str]) -> list[str]:
    host, port = url.removeprefix("http://").split(":")
    conn = _Conn(*await asyncio.open_connection(host, int(port)))
    keys = []
    for i, text in enumerate(texts):
        key = f"model:{model}:v1:q{i}"
        body = json.dumps({"model": model, "embed_text": text, "value": {"text": f"answer {i}"}}).encode()
        head = f"PUT /v1/entries/{key} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        status, payload = await conn.request(f"{head}Content-Length: ".encode(), body)
        if status != 201:
            raise RuntimeError(f"put {key}: {status} {payload[:200]!r}")
        keys.append(key)
    conn.writer.close()
    return keys


async def open_loop(url: str, bodies: list[bytes], rate: float, grace_s: float = 10.0) -> dict[str, float]:
    """Sent on a fixed schedule over a pool of keep-alive connections; latency from the due time. What
    has not answered `grace_s` after the last send is given up and counted as unfinished, at the
    latency it had reached (a lower bound), so an overloaded node ends the run instead of draining."""
    host, port = url.removeprefix("http://").split(":")
    head = _post_head("/v1/lookup", host)
    # (connection, when it was last used): the node (uvicorn) closes a keep-alive connection idle for 5 s,
    # and the bottom of this stack can sit that long until a backlog reaches it; such a one is replaced
    # rather than written to (it would count as an error the node never made).
    idle = [(_Conn(*await asyncio.open_connection(host, int(port))), time.perf_counter()) for _ in range(16)]
    latencies: list[float] = []
    errors = 0

    async def one(body: bytes, due: float) -> None:
        nonlocal errors
        try:
            conn, used = idle.pop() if idle else (None, 0.0)
            if conn is None or time.perf_counter() - used > _STALE_S:
                if conn is not None:
                    conn.writer.close()
                conn = _Conn(*await asyncio.open_connection(host, int(port)))
            if await conn.post(head, body) != 200:
                errors += 1
            idle.append((conn, time.perf_counter()))
        except (OSError, asyncio.IncompleteReadError):
            errors += 1
        latencies.append(time.perf_counter() - due)

    start = time.perf_counter() + 0.05
    tasks = []
    for i, body in enumerate(bodies):
        due = start + i / rate
        if (delay := due - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(body, due)))
    sent_s = time.perf_counter() - start
    _, pending = await asyncio.wait(tasks, timeout=grace_s)
    now = time.perf_counter()
    for task in pending:
        task.cancel()
    latencies += [now - (start + i / rate) for i, t in enumerate(tasks) if t in pending]
    elapsed = now - start
    for conn, _ in idle:
        conn.writer.close()
    ms = np.asarray(latencies) * 1e3
    return {
        "sent_per_s": len(bodies) / sent_s,
        "answered_per_s": (len(bodies) - len(pending)) / elapsed,
        "unfinished": len(pending),
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
        "errors": errors,
    }


async def closed_loop(url: str, bodies: list[bytes], clients: int, seconds: float) -> dict[str, float]:
    """`clients` connections, each sending its next lookup when the last one answered."""
    host, port = url.removeprefix("http://").split(":")
    head = _post_head("/v1/lookup", host)
    queue = iter(bodies)
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def client() -> None:
        conn = _Conn(*await asyncio.open_connection(host, int(port)))
        while time.perf_counter() < deadline and (body := next(queue, None)) is not None:
            sent = time.perf_counter()
            await conn.post(head, body)
            latencies.append(time.perf_counter() - sent)
        conn.writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.perf_counter() - started
    ms = np.asarray(latencies) * 1e3
    return {
        "per_s": len(latencies) / elapsed,
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "done": len(latencies),
    }


def embed_alone(local: Embedder, texts: list[str]) -> dict[str, Any]:
    """The floor under a text lookup: the same backend embedding one new text at a time in this process,
    nothing else asked of it (no HTTP, no search, no queue). A lookup can be no faster than this."""
    encode = local.embed_blocking
    latencies = []
    for text in texts:
        started = time.perf_counter()
        encode([text])
        latencies.append(time.perf_counter() - started)
    ms = np.asarray(latencies) * 1e3
    return {
        "kind": "embedding only",
        "load": "one text at a time, no server",
        "per_s": len(ms) / (ms.sum() / 1e3),
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
        "done": len(ms),
    }


async def stats(url: str) -> dict[str, Any]:
    host, port = url.removeprefix("http://").split(":")
    conn = _Conn(*await asyncio.open_connection(host, int(port)))
    conn.writer.write(f"GET /v1/stats HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    status_line = await conn.reader.readuntil(b"\r\n")
    length = 0
    while (line := await conn.reader.readuntil(b"\r\n")) != b"\r\n":
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    payload = await conn.reader.readexactly(length)
    conn.writer.close()
    if b"200" not in status_line:
        return {}
    report: dict[str, Any] = json.loads(payload)
    return report


async def forget(dsn: str, model: str) -> None:
    """Delete this run's entries from L3: Postgres may be shared, and other lookups would find them."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("DELETE FROM cache_descriptors WHERE model = $1", model)
    finally:
        await conn.close()


async def measure(args: argparse.Namespace, console: Console) -> list[dict[str, Any]]:
    pairs, _ = semantic.load_pairs(args.gptcache)
    texts = Texts(sorted(semantic.build_world(pairs).answer), args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="cachemesh-bench-semlat-"))
    model = f"semlat{uuid.uuid4().hex[:6]}"
    rows: list[dict[str, Any]] = []
    local = Embedder(backend=args.embedder)
    local.embed_blocking(["load the model before the node starts"])
    profile = args.out / "semantic_latency.prof" if args.profile else None
    with broker_from_env() as broker, postgres_from_env() as pg:
        namespace = f"bench{uuid.uuid4().hex[:6]}."
        await ensure_topics(broker.bootstrap, namespace)
        tuning = {"CACHEMESH_TIERS_EMBEDDER_LANES": str(args.lanes)}
        if args.screen != "none":
            tuning["CACHEMESH_TIERS_EMBEDDER_SCREEN"] = args.screen
            if args.band is not None:
                tuning["CACHEMESH_TIERS_EMBEDDER_SCREEN_BAND"] = str(args.band)
        if args.max_call_texts:
            tuning["CACHEMESH_TIERS_EMBEDDER_MAX_CALL_TEXTS"] = str(args.max_call_texts)
        node, url = start_node(pg.dsn, broker.bootstrap, namespace, workdir, args.embedder, profile, tuning)
        try:
            started = time.perf_counter()
            keys = await fill(url, model, texts.fill)
            console.print(f"filled {len(keys)} entries in {time.perf_counter() - started:.1f} s", style="dim")

            def text_bodies(n: int) -> list[bytes]:
                return [json.dumps({"text": t, "model": model}).encode() for t in texts.take(n)]

            def vector_bodies(n: int) -> list[bytes]:
                """Lookups by an embedding made here: the same search without the node's embedding."""
                rows = local.embed_blocking(chosen := texts.take(n))
                return [
                    json.dumps({"embedding_b64": b64(v), "model": model}).encode()
                    for v, _ in zip(rows, chosen, strict=True)
                ]

            def key_bodies(n: int) -> list[bytes]:
                return [json.dumps({"key": keys[i % len(keys)], "model": model}).encode() for i in range(n)]

            n = int(args.rate * args.seconds)
            rows.append(embed_alone(local, texts.take(300)))
            console.print(rows[-1], style="dim")
            await closed_loop(url, text_bodies(50), 4, 5.0)  # warm-up: connections, first batches
            deadline = time.monotonic() + 60
            while args.screen != "none" and ((await stats(url)).get("screen") or {}).get("state") != "ready":
                if time.monotonic() > deadline:
                    raise RuntimeError("the node's screen model did not load")
                await asyncio.sleep(0.2)
            # Closed loops first: an overloaded open loop leaves the node a backlog that would stall them.
            for clients in (1, 32):
                for kind, make in (
                    ("text", text_bodies),
                    ("embedding", vector_bodies),
                    ("exact key", key_bodies),
                ):
                    cap = int(args.closed_seconds * {"text": 400, "embedding": 300}.get(kind, 3000))
                    r = await closed_loop(url, make(cap), clients, args.closed_seconds)
                    rows.append({"kind": kind, "load": f"closed loop, {clients} clients", **r})
                    console.print(rows[-1], style="dim")
            before = await stats(url)
            kinds = (("exact key", key_bodies(n)), ("embedding", vector_bodies(n)), ("text", text_bodies(n)))
            for kind, bodies in kinds:
                r = await open_loop(url, bodies, args.rate)
                rows.append({"kind": kind, "load": f"open loop {args.rate:.0f}/s", **r})
                console.print(rows[-1], style="dim")
            after = await stats(url)
            # The model that embeds text lookups first: the screen when there is one.
            which = "screen" if args.screen != "none" else "embedder"
            b, a = before.get(which) or {}, after.get(which) or {}
            encoded = a.get("encoded_texts", 0) - b.get("encoded_texts", 0)
            batches = a.get("batches", 0) - b.get("batches", 0)
            call_ms = 1000 * (a.get("encode_s", 0.0) - b.get("encode_s", 0.0)) / max(batches, 1)
            per_batch = encoded / max(batches, 1)
            refine_b, refine_a = before.get("refine") or {}, after.get("refine") or {}
            screened = refine_a.get("screened", 0) - refine_b.get("screened", 0)
            refined = refine_a.get("refined", 0) - refine_b.get("refined", 0)
            rows.append(
                {
                    "kind": "embedder",
                    "load": "open loop",
                    "texts_per_batch": per_batch,
                    "call_ms": call_ms,
                    "refined_share": refined / screened if screened else None,
                    "max_shift": refine_a.get("max_shift"),
                    "over_band": refine_a.get("over_band"),
                }
            )
        finally:
            node.stop(30)
            shutil.rmtree(workdir, ignore_errors=True)
            await forget(pg.dsn, model)
    if profile is not None and profile.exists():
        import pstats

        with (args.out / "semantic_latency.prof.txt").open("w") as fh:
            for order in ("tottime", "cumulative"):
                pstats.Stats(str(profile), stream=fh).sort_stats(order).print_stats(40)
    return rows


def report(rows: list[dict[str, Any]], args: argparse.Namespace, console: Console) -> None:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with (out / "semantic_latency.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    head = ["kind", "load", "answered/s", "p50 ms", "p99 ms", "max ms", "unfinished", "errors"]

    def cell(r: dict[str, Any], k: str) -> str:
        v = r.get(k)
        return "-" if v is None else f"{v:.1f}" if isinstance(v, float) else str(v)

    body = [
        [r["kind"], r["load"], cell(r, "answered_per_s") if "answered_per_s" in r else cell(r, "per_s")]
        + [cell(r, k) for k in ("p50_ms", "p99_ms", "max_ms", "unfinished", "errors")]
        for r in rows
        if r["kind"] != "embedder"
    ]
    emb = next((r for r in rows if r["kind"] == "embedder"), {"texts_per_batch": 0.0, "call_ms": 0.0})
    screen = ""
    if args.screen != "none":
        share = emb.get("refined_share")
        screen = (
            f", screened by {args.screen} ({100 * (share or 0.0):.1f}% of text lookups re-scored, largest"
            f" shift {emb.get('max_shift') or 0.0:.3f}, {emb.get('over_band') or 0} past the band)"
        )
    title = (
        f"lookups at the API, embedder {args.embedder}{screen}, {args.lanes} lane(s)"
        f" (open loop: {emb['texts_per_batch']:.2f} texts per"
        f" model call of {emb['call_ms']:.1f} ms;"
        " targets: text p50 <= 5 ms, p99 <= 15 ms at 200/s; 32 clients >= 1 client)"
    )
    table = Table(*head, title=title)
    for cells in body:
        table.add_row(*cells)
    console.print(table)
    md = [f"**{title}**", "", "| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    md += ["| " + " | ".join(c) + " |" for c in body]
    (out / "semantic_latency.md").write_text("\n".join(md) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--embedder", default="onnx-int8", choices=("torch", "onnx", "onnx-int8"))
    parser.add_argument(
        "--screen", default="none", choices=("none", "onnx-int8"), help="the node's EMBEDDER_SCREEN"
    )
    parser.add_argument("--band", type=float, default=None, help="the node's EMBEDDER_SCREEN_BAND")
    parser.add_argument("--lanes", type=int, default=1, help="the node's embedder lanes")
    parser.add_argument("--max-call-texts", type=int, default=0, help="0: the node's default")
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--closed-seconds", type=float, default=5.0)
    parser.add_argument("--profile", action="store_true", help="run the node under cProfile")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gptcache", type=Path, default=semantic.GPTCACHE)
    parser.add_argument("--out", type=Path, default=semantic.OUT)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    console = Console(width=150)
    report(asyncio.run(measure(args, console)), args, console)


if __name__ == "__main__":
    main()
