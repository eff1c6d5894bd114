"""`cachemesh demo`: realistic traffic through the running mesh, found from the launcher's state file.

Two streams at once, for `seconds`: the Mooncake trace (shared data, read in place) replayed as KV and
access events into Kafka, its first `trace_s` of trace time compressed to the run so event time follows
the wall clock; and a semantic Q&A stream through the tiers API (GPTCache paraphrase pairs: put an answer
under one wording, ask with the other, ask new questions that miss, rewrite the documents answers cite).
Ends with a summary of what the tier nodes and the dashboard saw.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from infra.mesh_state import MeshState
from infra.paths import shared_data_dir
from schemas.events import Event, new_event_id

Progress = Callable[[str, int], None]


@dataclass(frozen=True)
class DemoPlan:
    seconds: float = 30.0
    trace_s: float = 300.0
    pairs: int = 300
    workers: int = 8
    model: str = "demo"


@dataclass
class DemoReport:
    kv_events: int = 0
    puts: int = 0
    rewrites: int = 0
    asked: int = 0
    before: dict[str, Any] = field(default_factory=dict)
    after: dict[str, Any] = field(default_factory=dict)
    board_before: dict[str, int] = field(default_factory=dict)
    board_after: dict[str, int] = field(default_factory=dict)
    took_s: float = 0.0

    def rows(self) -> list[tuple[str, str]]:
        def delta(key: str) -> int:
            return int(self.after.get(key) or 0) - int(self.before.get(key) or 0)

        lookups, hits = delta("lookups"), delta("hits")
        rows = [
            ("KV and access events sent (Mooncake)", str(self.kv_events)),
            ("answers put / source documents rewritten", f"{self.puts} / {self.rewrites}"),
            ("questions asked", str(self.asked)),
            ("lookups", str(lookups)),
            ("hits", f"{hits} ({hits / lookups:.0%})" if lookups else "0"),
        ]
        kinds_after = self.after.get("hits_by_tier") or {}
        kinds_before = self.before.get("hits_by_tier") or {}
        for kind in sorted(kinds_after):
            n = int(kinds_after[kind]) - int(kinds_before.get(kind, 0))
            if n:
                rows.append((f"  hits {kind}", str(n)))
        rows.append(("warmup commands applied (tier node)", str(delta("warmed"))))
        rows.append(("invalidations received (tier node)", str(delta("invalidations_received"))))
        for key, label in (
            ("warmup_decisions", "warmup decisions (dashboard)"),
            ("invalidations", "invalidation records (dashboard)"),
            ("heat_decisions", "heat decisions (dashboard)"),
            ("drift_clusters", "drift clusters (dashboard)"),
        ):
            if key in self.board_after:
                rows.append((label, str(self.board_after[key] - self.board_before.get(key, 0))))
        rows.append(("took", f"{self.took_s:.1f} s"))
        return rows


def dashboard_url(mesh: MeshState) -> str | None:
    """The page on the dashboard's metrics port (always served there)."""
    base = mesh.base_url("dashboard")
    return None if base is None else f"{base}/dashboard/"


async def dashboard_page(session: aiohttp.ClientSession, mesh: MeshState) -> str | None:
    """The URL the dashboard reports in its health (its fixed port, 8790 by default), else the above."""
    health_url = mesh.health_urls.get("dashboard")
    body = None if health_url is None else await _get_json(session, health_url)
    return str(body["url"]) if isinstance(body, dict) and body.get("url") else dashboard_url(mesh)


async def tiers_url(session: aiohttp.ClientSession, mesh: MeshState) -> str | None:
    """The tier node's API URL, from its health report."""
    health_url = mesh.health_urls.get("tiers")
    body = None if health_url is None else await _get_json(session, health_url)
    api = (body or {}).get("api") or {}
    return str(api["url"]) if api.get("url") else None


async def _get_json(session: aiohttp.ClientSession, url: str) -> Any:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as response:
            return await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


def kv_events(plan: DemoPlan, now_ms: int) -> list[Event]:
    from streams.generator import ReplayConfig, mooncake_events

    config = ReplayConfig(base_ms=now_ms, time_scale=plan.seconds / plan.trace_s)
    events = mooncake_events(until_ms=round(plan.trace_s * 1000), config=config)
    # The generator's ids are the same every run (deterministic for tests); consumers would drop a
    # second demo's events as duplicates of the first's.
    return [e.model_copy(update={"event_id": new_event_id()}) for e in events]


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
    events: Sequence[Event], bootstrap: str, namespace: str, seconds: float, report: DemoReport, on: Progress
) -> None:
    from services.runtime.kafka import EventPublisher
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
            await publisher.publish(event, wait=False)
            report.kv_events += 1
            if n % 200 == 0:
                on("kv", report.kv_events)
        on("kv", report.kv_events)
    finally:
        await publisher.stop()


async def drive_qa(client: Any, plan: DemoPlan, report: DemoReport, on: Progress) -> None:
    """Per pair: put the answer under the origin wording, ask with the paraphrase; every third pair
    also asks a new question (a miss); every tenth rewrites a source document (invalidating the answers
    that cite it) and asks again.
    `workers` pairs at a time (the node batches their embeddings); no pair starts after `seconds`."""
    pairs, unanswered = qa_pairs(plan.pairs)
    deadline = time.monotonic() + plan.seconds
    queue = list(range(len(pairs)))
    done = 0

    async def ask(text: str) -> None:
        await client.lookup(text=text, model=plan.model, include_value=False)
        report.asked += 1

    async def pair(i: int) -> None:
        key, origin = f"demo-qa-{i}", pairs[i]["origin"]
        # Each answer cites a source document; rewriting the document invalidates what cites it (the
        # invalidation service's cascade, recorded on invalidation.records.v1).
        doc = f"demo-doc-{i % 10}"
        await client.put(
            key, f"Answer {i}: {origin}", model=plan.model, embed_text=origin, context_dependency_ids=[doc]
        )
        report.puts += 1
        await ask(pairs[i]["similar"])
        if i % 3 == 0 and i // 3 < len(unanswered):
            await ask(unanswered[i // 3])
        if i % 10 == 9:
            await client.put(doc, f"source document {i % 10}, revision {i}", model=plan.model)
            report.rewrites += 1
            await ask(pairs[i]["similar"])

    async def worker() -> None:
        nonlocal done
        while queue and time.monotonic() < deadline:
            await pair(queue.pop(0))
            done += 1
            on("qa", done)

    await asyncio.gather(*(worker() for _ in range(plan.workers)))


async def board_totals(session: aiohttp.ClientSession, mesh: MeshState) -> dict[str, int]:
    url = dashboard_url(mesh)  # the metrics port: the one the state file names
    body = None if url is None else await _get_json(session, f"{url}api/snapshot")
    return dict((body or {}).get("totals") or {})


async def run_demo(
    mesh: MeshState,
    plan: DemoPlan,
    on_start: Callable[[int, int], None] = lambda kv, qa: None,
    on: Progress = lambda name, n: None,
) -> DemoReport:
    """Drives both streams; raises LookupError when the mesh has no tier node to talk to."""
    from cachemesh_client import AsyncTiersClient

    report = DemoReport()
    began = time.monotonic()
    async with aiohttp.ClientSession() as session:
        api = await tiers_url(session, mesh)
        if api is None:
            raise LookupError("the mesh has no healthy tiers service (see `cachemesh status`)")
        events = kv_events(plan, int(time.time() * 1000))
        on_start(len(events), plan.pairs)
        token = os.environ.get("CACHEMESH_TIERS_API_TOKEN")
        async with AsyncTiersClient(api, token=token, timeout_s=30) as client:
            report.before = await client.stats()
            report.board_before = await board_totals(session, mesh)
            await asyncio.gather(
                drive_kv(events, mesh.bootstrap, mesh.namespace, plan.seconds, report, on),
                drive_qa(client, plan, report, on),
            )
            # Records (warmups, invalidations) trail the traffic by a tick or two.
            await asyncio.sleep(1.5)
            report.after = await client.stats()
            report.board_after = await board_totals(session, mesh)
    report.took_s = time.monotonic() - began
    return report


def main(plan: DemoPlan) -> int:
    """The command: find the mesh, run with a progress bar, print the dashboard URL and a summary.
    Returns the exit code (3: the mesh is not up)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as Bar
    from rich.table import Table

    from infra.mesh_state import NOT_UP, running_mesh

    console = Console()
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
            report = asyncio.run(run_demo(mesh, plan, start, step))
        except LookupError as exc:
            Console(stderr=True).print(f"[red]{exc}[/]")
            return 1
    table = Table(title="cachemesh demo", title_justify="left")
    table.add_column("what")
    table.add_column("count", justify="right")
    for what, count in report.rows():
        table.add_row(what, count)
    console.print(table)
    if url:
        console.print(f"open the dashboard: [bold]{url}[/]")
    return 0
