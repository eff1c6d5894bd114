"""`cachemesh demo`: realistic traffic through the running mesh, found from the launcher's state file.

Two streams at once, for `seconds`: the Mooncake trace (shared data, read in place) replayed as KV and
access events into Kafka, its first `trace_s` of trace time compressed to the run so event time follows
the wall clock, on the running tier node (its node id) and with the blocks it names stored there as an
engine would store them (`POST /v1/blocks/put`, small stand-in values, the first time a block is
computed), so warmup's commands find them and load what the node's L2 let go; and a semantic Q&A
stream through the tiers API (GPTCache paraphrase pairs: put an answer
under one wording, ask with the other, ask new questions that miss, rewrite the documents answers cite).
Ends with a summary of what the tier nodes and the dashboard saw.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx
import numpy as np
from cachemesh_client.blockframe import MEDIA_TYPE, FetchedBlock, encode_blocks
from cachemesh_client.kvkeys import KEY_PREFIX
from cachemesh_client.valuecodec import encode

from infra.demo_report import MEANING, DemoReport
from infra.mesh_state import MeshState
from infra.paths import shared_data_dir
from schemas.events import CacheAccessed, Event
from schemas.ids import new_event_id

Progress = Callable[[str, int], None]


@dataclass(frozen=True)
class DemoPlan:
    seconds: float = 30.0
    trace_s: float = 600.0
    pairs: int = 300
    workers: int = 8
    model: str = "demo"
    chats: int = 20  # questions sent twice through the gateway, when it has a model server
    chat_model: str = "stub-model"  # the stand-in's (infra/standin.py)


def dashboard_url(mesh: MeshState) -> str | None:
    """The page on the dashboard's metrics port (always served there)."""
    base = mesh.base_url("dashboard")
    return None if base is None else f"{base}/dashboard/"


async def dashboard_page(session: aiohttp.ClientSession, mesh: MeshState) -> str | None:
    """The URL the dashboard reports in its health (its fixed port, 8790 by default), else the above."""
    health_url = mesh.health_urls.get("dashboard")
    body = None if health_url is None else await _get_json(session, health_url)
    return str(body["url"]) if isinstance(body, dict) and body.get("url") else dashboard_url(mesh)


async def tiers_node(session: aiohttp.ClientSession, mesh: MeshState) -> tuple[str, str] | None:
    """The tier node's API URL and node id, from its health report."""
    health_url = mesh.health_urls.get("tiers")
    body = None if health_url is None else await _get_json(session, health_url)
    api = (body or {}).get("api") or {}
    return (str(api["url"]), str(body.get("node_id") or "")) if api.get("url") and body else None


async def gateway_url(session: aiohttp.ClientSession, mesh: MeshState) -> str | None:
    """The gateway's OpenAI base URL, from its health report, when it is up with a model server."""
    health_url = mesh.health_urls.get("gateway")
    body = None if health_url is None else await _get_json(session, health_url)
    if not isinstance(body, dict) or body.get("status") not in ("healthy", "degraded"):
        return None
    if any("upstream" in str(reason) for reason in body.get("degraded") or []):
        return None  # no model server behind it: every miss would be a 503
    url = (body.get("endpoints") or {}).get("gateway (OpenAI base_url)")
    return str(url) if url else None


async def _get_json(session: aiohttp.ClientSession, url: str) -> Any:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as response:
            return await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


def kv_events(plan: DemoPlan, now_ms: int, node_id: str | None = None) -> list[Event]:
    """The trace's conversations of two turns or more (requests sharing their first block, as
    bench/engine_replay.py reads the trace: the turns of one conversation) in its first `trace_s`, on
    `node_id` (the generator spreads events over node-0, node-1, ...: warmup would address its
    commands to nodes that do not exist), each KV block under a content key (`kv:`, what the node's
    block API takes), each request in its conversation (the generator gives every request a trace of
    its own, so no conversation ever had a next turn to warm for)."""
    from infra.generator import MooncakeReplay, ReplayConfig, read_mooncake

    requests = read_mooncake(until_ms=round(plan.trace_s * 1000))
    turns = Counter(r.hash_ids[0] for r in requests if r.hash_ids)
    requests = [r for r in requests if r.hash_ids and turns[r.hash_ids[0]] >= 2]
    config = ReplayConfig(base_ms=now_ms, time_scale=plan.seconds / plan.trace_s)
    events = sorted(MooncakeReplay(config).events(requests), key=lambda e: e.occurred_at_ms)
    run = f"{now_ms:x}"  # a conversation of this run is not the same-named one of the run before
    out = []
    conversation: dict[str, str] = {}  # the generator's trace id -> the conversation's
    for e in events:
        # The generator's ids are the same every run (deterministic for tests); consumers would drop a
        # second demo's events as duplicates of the first's.
        update: dict[str, Any] = {"event_id": new_event_id()}
        if node_id and getattr(e, "node_id", None) is not None:
            update["node_id"] = node_id
        if isinstance(e, CacheAccessed) and e.kind == "kv_block" and e.key.startswith("block:"):
            block = e.key.removeprefix("block:")
            update["key"] = f"{KEY_PREFIX}demo-{block}"
            if e.trace_id is not None:  # its request's first block comes first
                conversation.setdefault(e.trace_id, f"demo-{run}-{block}")
        trace = getattr(e, "trace_id", None)
        if trace is not None and trace in conversation:
            update["trace_id"] = conversation[trace]
        out.append(e.model_copy(update=update))
    return out


def stand_in_block(key: str, model: str) -> FetchedBlock:
    """A small KV block value (the demo has no engine to compute real ones): what a warm loads."""
    value = encode(np.zeros(128, dtype=np.float16), kind="kv_block", model=model)
    return FetchedBlock(key, "hit", None, value)


class BlockStore:
    """Stores each KV block the first time the trace computes it (a miss), in batches, in the
    background: the demo's stand-in for the engine that would have written it (the vLLM connector)."""

    def __init__(self, session: aiohttp.ClientSession, api: str, token: str | None, batch: int = 256) -> None:
        self.session, self.url, self.batch = session, f"{api}/v1/blocks/put", batch
        self.headers = {"Content-Type": MEDIA_TYPE, **({"Authorization": f"Bearer {token}"} if token else {})}
        self.seen: set[str] = set()
        self.pending: list[FetchedBlock] = []
        self.stored = 0
        self.failed = 0
        self._sends: set[asyncio.Task[None]] = set()

    def computed(self, event: Event) -> None:
        if not isinstance(event, CacheAccessed) or event.kind != "kv_block" or event.hit:
            return
        if not event.key.startswith(KEY_PREFIX) or event.key in self.seen:
            return
        self.seen.add(event.key)
        self.pending.append(stand_in_block(event.key, event.model or "demo"))
        if len(self.pending) >= self.batch:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        body, self.pending = encode_blocks(self.pending), []
        task = asyncio.create_task(self._send(body))
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    async def _send(self, body: bytes) -> None:
        try:
            async with self.session.post(
                self.url, data=body, headers=self.headers, timeout=aiohttp.ClientTimeout(total=60)
            ) as response:
                answer = await response.json(content_type=None)
                if response.status == 200 and isinstance(answer, dict):
                    self.stored += int(answer.get("stored", 0)) + int(answer.get("present", 0))
                else:
                    self.failed += 1
        except (aiohttp.ClientError, TimeoutError, ValueError):
            self.failed += 1

    async def drain(self) -> None:
        self.flush()
        if self._sends:
            await asyncio.gather(*self._sends, return_exceptions=True)


def qa_pairs(n: int) -> tuple[list[dict[str, str]], list[str]]:
    """`n` pairs to put and ask, and `n // 3` other questions that nothing answers (misses)."""
    pairs: list[dict[str, str]] = json.loads(
        (shared_data_dir() / "semantic" / "gptcache_mock_pairs.json").read_text()
    )
    return pairs[:n], [p["similar"] for p in pairs[n : n + n // 3]]


async def _paced(began: float, due_s: float) -> None:
    delay = began + due_s - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


async def drive_kv(
    events: Sequence[Event],
    bootstrap: str,
    namespace: str,
    seconds: float,
    report: DemoReport,
    on: Progress,
    store: BlockStore | None = None,
) -> None:
    from services.runtime.publisher import EventPublisher
    from services.runtime.settings import KafkaSettings

    publisher = EventPublisher(
        KafkaSettings(bootstrap=bootstrap, topic_namespace=namespace), client_id="demo"
    )
    await publisher.start()
    try:
        began = time.monotonic()
        t0 = events[0].occurred_at_ms if events else 0
        for n, event in enumerate(events):
            await _paced(began, min(seconds, (event.occurred_at_ms - t0) / 1000))
            if store is not None:
                store.computed(event)
            await publisher.publish(event, wait=False)
            report.kv_events += 1
            if n % 200 == 0:
                on("kv", report.kv_events)
        on("kv", report.kv_events)
    finally:
        await publisher.stop()


async def drive_qa(client: Any, plan: DemoPlan, report: DemoReport, on: Progress) -> None:
    """Per pair: put the answer under the origin wording, ask with the paraphrase; every other pair asks
    the origin again word for word (a repeat: an exact hit); every third pair also asks a new question
    (a miss); every tenth rewrites a source document (invalidating the answers that cite it) and asks
    again. An explored miss is labelled as the gateway would: the demo knows which answer is right.
    `workers` pairs at a time (the node batches their embeddings); no pair starts after `seconds`."""
    from cachemesh_client import TiersError

    pairs, unanswered = qa_pairs(plan.pairs)
    deadline = time.monotonic() + plan.seconds
    queue = list(range(len(pairs)))
    done = 0

    async def ask(text: str, right: str | None = None) -> None:
        try:
            got = await client.lookup(text=text, model=plan.model, include_value=False)
        except (httpx.HTTPError, TiersError) as exc:
            if isinstance(exc, TiersError) and exc.status < 500:
                raise
            report.calls_failed += 1
            return
        report.asked += 1
        if got.explore_key is not None:
            try:
                await client.feedback(got.explore_key, text, correct=got.explore_key == right, explored=True)
            except httpx.HTTPError:
                report.calls_failed += 1
                return
            except TiersError as exc:
                if exc.status == 404:
                    return  # the entry went meanwhile (a rewritten source invalidated it): nothing to label
                if exc.status < 500:
                    raise
                report.calls_failed += 1
                return
            report.labels += 1

    async def put(key: str, value: str, **kw: Any) -> bool:
        """A write, tried again when the node says when (503 with Retry-After: its L3 is unavailable for
        now); False when it still refuses."""
        for attempt in range(4):
            try:
                await client.put(key, value, model=plan.model, **kw)
                return True
            except httpx.HTTPError:
                report.calls_failed += 1
                return False
            except TiersError as exc:
                if exc.status != 503 or exc.retry_after_s is None or attempt == 3:
                    report.writes_refused += 1
                    return False
                await asyncio.sleep(min(exc.retry_after_s, 5.0))
        return False

    async def pair(i: int) -> None:
        key, origin = f"demo-qa-{i}", pairs[i]["origin"]
        # Each answer cites a source document; rewriting the document invalidates what cites it (the
        # invalidation service's cascade, recorded on invalidation.records.v1).
        doc = f"demo-doc-{i % 10}"
        if await put(key, f"Answer {i}: {origin}", embed_text=origin, context_dependency_ids=[doc]):
            report.puts += 1
        await ask(pairs[i]["similar"], key)
        if i % 2 == 0:
            await ask(origin, key)
        if i % 3 == 0 and i // 3 < len(unanswered):
            await ask(unanswered[i // 3])
        if i % 10 == 9 and await put(doc, f"source document {i % 10}, revision {i}"):
            report.rewrites += 1
            await ask(pairs[i]["similar"], key)

    async def worker() -> None:
        nonlocal done
        while queue and time.monotonic() < deadline:
            await pair(queue.pop(0))
            done += 1
            on("qa", done)

    await asyncio.gather(*(worker() for _ in range(plan.workers)))


def chat_miss_reason(headers: Mapping[str, str]) -> str:
    """Why the gateway answered a repeated question from the model server, from its headers."""
    if headers.get("x-cachemesh-lookup") == "hedged":
        return "hedged"  # the lookup was slower than the gateway's hedge: the model server answered first
    rule = headers.get("x-cachemesh-miss")
    return rule.split(";")[0] if rule else headers.get("x-cachemesh-lookup", "no reason given")


async def drive_chat(
    session: aiohttp.ClientSession, base_url: str, plan: DemoPlan, report: DemoReport
) -> None:
    """A few chat completions through the gateway, paced over the run, each question twice: the first
    goes to the model server and is stored, the second (half a run later) is answered from the cache."""
    questions = [p["origin"] for p in qa_pairs(plan.chats)[0]]
    listed = await _get_json(session, f"{base_url}/models")  # the model behind the gateway
    models = [m.get("id") for m in (listed or {}).get("data") or [] if isinstance(m, dict)]
    model = str(models[0]) if models and models[0] else plan.chat_model
    began, step_s = time.monotonic(), plan.seconds / max(1, 2 * len(questions))
    for round_ in range(2):
        for n, question in enumerate(questions):
            await _paced(began, (round_ * len(questions) + n) * step_s)
            body = {"model": model, "messages": [{"role": "user", "content": question}], "max_tokens": 16}
            try:
                async with session.post(
                    f"{base_url}/chat/completions", json=body, timeout=aiohttp.ClientTimeout(total=60)
                ) as response:
                    await response.read()
                    if response.status != 200:
                        continue
                    report.chats += 1
                    hit = response.headers.get("x-cachemesh-cache") == "hit"
                    report.chat_hits += hit
                    if round_ == 1 and not hit:
                        why = chat_miss_reason(response.headers)
                        report.chat_misses[why] = report.chat_misses.get(why, 0) + 1
            except (aiohttp.ClientError, TimeoutError):
                continue


async def board_snapshot(session: aiohttp.ClientSession, mesh: MeshState) -> dict[str, Any]:
    url = dashboard_url(mesh)  # the metrics port: the one the state file names
    body = None if url is None else await _get_json(session, f"{url}api/snapshot")
    return body if isinstance(body, dict) else {}


def delta_t_since(snapshot: dict[str, Any], since_s: float) -> list[int]:
    """The dashboard's Δt samples (its warmup_delta series) measured from `since_s` (epoch s) on."""
    series = (snapshot.get("series") or {}).get("warmup_delta") or {}
    return [
        int(d)
        for t, d in zip(series.get("t") or [], series.get("delta_t_ms") or [], strict=False)
        if t >= since_s
    ]


async def wait_for_embedder(client: Any, model: str, timeout_s: float = 600.0) -> str:
    """Until the node's embedding model has loaded (the first start on a machine exports it: half a
    minute or more, during which every write or lookup by text waits); returns its final state."""
    deadline = time.monotonic() + timeout_s
    asked: list[asyncio.Task[None]] = []  # kept: the loop holds tasks weakly
    while True:
        state = str(((await client.stats()).get("embedder") or {}).get("state") or "none")
        if state in ("ready", "failed", "none") or time.monotonic() > deadline:
            return state
        if state == "idle" and not asked:  # not preloaded: a lookup by text starts the load
            asked.append(asyncio.create_task(_quietly(client.lookup(text="warm up", model=model))))
        await asyncio.sleep(0.5)


async def _quietly(call: Awaitable[Any]) -> None:
    with contextlib.suppress(Exception):
        await call


async def run_demo(
    mesh: MeshState,
    plan: DemoPlan,
    on_start: Callable[[int, int], None] = lambda kv, qa: None,
    on: Progress = lambda name, n: None,
    on_wait: Callable[[str], None] = lambda what: None,
) -> DemoReport:
    """Drives both streams; raises LookupError when the mesh has no tier node to talk to."""
    from cachemesh_client import AsyncTiersClient

    report = DemoReport()
    began = time.monotonic()
    async with aiohttp.ClientSession() as session:
        node = await tiers_node(session, mesh)
        if node is None:
            raise LookupError("the mesh has no healthy tiers service (see `cachemesh status`)")
        api, node_id = node
        token = os.environ.get("CACHEMESH_TIERS_API_TOKEN")
        store = BlockStore(session, api, token)
        async with AsyncTiersClient(api, token=token, timeout_s=30) as client:
            on_wait("the tier node's embedding model (a first start exports it: about a minute)")
            await wait_for_embedder(client, plan.model)
            # Stamped now, after the wait: the streams' windows and warmup's turns run on these times.
            events = kv_events(plan, int(time.time() * 1000), node_id or None)
            on_start(len(events), plan.pairs)
            report.before = await client.stats()
            report.board_before = dict((await board_snapshot(session, mesh)).get("totals") or {})
            started_s = time.time()
            gateway = await gateway_url(session, mesh)
            await asyncio.gather(
                drive_kv(events, mesh.bootstrap, mesh.namespace, plan.seconds, report, on, store),
                drive_qa(client, plan, report, on),
                *([drive_chat(session, gateway, plan, report)] if gateway and plan.chats else []),
            )
            await store.drain()
            report.blocks_stored, report.block_writes_failed = store.stored, store.failed
            # Records (warmups, invalidations) trail the traffic by a tick or two.
            await asyncio.sleep(1.5)
            report.after = await client.stats()
            snapshot = await board_snapshot(session, mesh)
            report.board_after = dict(snapshot.get("totals") or {})
            report.delta_t_ms = delta_t_since(snapshot, started_s)
    report.took_s = time.monotonic() - began
    return report


def main(plan: DemoPlan, as_json: bool = False) -> int:
    """The command: find the mesh, run with a progress bar, print the dashboard URL and a summary
    (`as_json`: the summary alone as JSON on stdout, the rest on stderr).
    Returns the exit code (3: the mesh is not up)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as Bar
    from rich.table import Table

    from infra.mesh_state import NOT_UP, running_mesh

    console = Console(stderr=as_json)
    mesh = running_mesh()
    if mesh is None:
        Console(stderr=True).print(f"[red]{NOT_UP}[/]")
        return 3

    async def find_page() -> str | None:
        async with aiohttp.ClientSession() as session:
            return await dashboard_page(session, mesh)

    url = asyncio.run(find_page())
    console.print(f"dashboard: [bold]{url or 'not running (no dashboard service)'}[/]")
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Bar(*columns, console=console) as bar:
        tasks: dict[str, Any] = {}

        def start(kv: int, qa: int) -> None:
            tasks["kv"] = bar.add_task("Mooncake KV events -> Kafka", total=kv)
            tasks["qa"] = bar.add_task("semantic Q&A pairs -> tiers API", total=qa)

        def step(name: str, n: int) -> None:
            bar.update(tasks[name], completed=n)

        try:
            report = asyncio.run(
                run_demo(mesh, plan, start, step, lambda what: console.print(f"waiting for {what}"))
            )
        except LookupError as exc:
            Console(stderr=True).print(f"[red]{exc}[/]")
            return 1
    if as_json:
        print(json.dumps(report.summary()))
        return 0
    table = Table(title="cachemesh demo", title_justify="left")
    table.add_column("what")
    table.add_column("count", justify="right")
    table.add_column("what it means", style="dim")
    for what, count in report.rows():
        table.add_row(what, count, MEANING.get(what.strip(), ""))
    console.print(table)
    if url:
        console.print(f"open the dashboard: [bold]{url}[/]")
    return 0
