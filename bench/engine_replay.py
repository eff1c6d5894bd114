"""A multi-turn replay shaped like the Mooncake conversation trace against 2 real vLLM instances whose own
KV pools are too small for the working set, side by side in one run:

- round_robin: the instances in turn, without prefix caching;
- round_robin_prefix: in turn, with vLLM's own prefix cache;
- routed: through the gateway, routed by the KV each instance holds (its KV events, via the bridge),
  conversation and load (services/gateway/routing.py);
- routed_tiers: the same, and the instances save to and load from cachemesh's tiers (the connector);
- routed_tiers_warmup: the same, and the warmup service (warm_engines) predicts each conversation's next
  turn; the gateway prefills the conversation's prompt on its idle instance before the turn comes
  (services/gateway/warming.py); the warms sent, used and wasted, and their prefill cost, are reported.

By default 16 conversations of the trace (requests sharing a first block) are drawn, and all their
requests kept in the trace's order. The requests keep their prefix structure: each Mooncake block id
(512 tokens there) becomes one 32-token block of the engine, the same tokens wherever the id appears,
so requests that share a prefix of ids share a prefix of KV; a few tokens of its own end every
prompt. Each request is sent at its trace arrival time divided by `--speedup` (an open loop: the
pauses between a conversation's turns are the trace's, scaled); `--speedup 0` sends them in trace
order from two clients instead (a closed loop, no pauses). Through the gateway each request names its
conversation (`x-cachemesh-conversation-id`). Per row: TTFT mean / p50 / p95 (streamed, to the first token),
the prefix-cache hit rate of each instance and in all (tokens found in its own cache or loaded through
the connector, over tokens asked, from vLLM's `/metrics`), and the prompt tokens computed.

Run: `python -m bench.engine_replay [--trace PATH] [--sessions N | --sessions 0 --start N]
[--requests N] [--max-blocks N] [--kv-blocks N] [--speedup X] [--rows a,b] [--seed N]`. Prints the
table, writes `bench/results/engine_replay.json`
(`{"rows": {name: {"ttft_ms_mean", "ttft_ms_p50", "ttft_ms_p95", "prefix_hit_rate", ...}}}`) and
`engine_replay.png`. A real broker and Postgres as bench.engine (env or its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import httpx
import numpy as np
import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench.engine import TierNode
from infra.brokers import broker_from_env
from infra.paths import free_port, shared_data_dir
from infra.postgres import postgres_from_env
from infra.process import ServerProcess
from infra.vllm_env import SMALL
from infra.vllm_server import BLOCK_SIZE, VllmServer, connector_config
from services.gateway.warming import Gaps
from services.runtime.topics import ensure_topics
from services.warmup.ftl import FtlFit, KvShape, kv_miss_rate, seed_miss_rate

RESULTS = Path(__file__).parent / "results"
REPO = Path(__file__).resolve().parent.parent
ROWS = ("round_robin", "round_robin_prefix", "routed", "routed_tiers", "routed_tiers_warmup")
VOCAB = (10, 2000)
TAIL = 8  # tokens of its own at the end of every prompt
CLIENTS = 2


@dataclass(frozen=True)
class Request:
    hash_ids: tuple[int, ...]
    output: int
    tail_seed: int
    at_ms: int = 0  # its arrival in the trace
    salt: int = 0  # other token content, same shape: rows that share the tier node share no blocks

    @property
    def conversation(self) -> str:
        return f"conv-{self.hash_ids[0]}"

    def tokens(self) -> list[int]:
        out: list[int] = []
        for h in self.hash_ids:
            rng = random.Random(h * 1_000_003 + 17 + self.salt * 7_919_000_003)
            out.extend(rng.randrange(*VOCAB) for _ in range(BLOCK_SIZE))
        rng = random.Random(self.tail_seed)
        return out + [rng.randrange(*VOCAB) for _ in range(TAIL)]


def read_requests(
    path: Path, start: int, count: int, max_blocks: int, sessions: int, seed: int = 0
) -> list[Request]:
    """Requests of the trace in its order. With `sessions`, conversations (requests sharing their first
    block, three or more of them) are drawn at random and all their requests kept, interleaved as the
    trace has them: the trace's turns and shared prefixes, scaled down to what a CPU model serves in
    minutes. Without, requests `start`.. in a row."""
    rows = []
    with open(path) as fh:
        for i, line in enumerate(fh):
            if line.strip():
                r = json.loads(line)
                rows.append(
                    (
                        i,
                        tuple(r["hash_ids"][:max_blocks]),
                        min(int(r["output_length"]), 8),
                        int(r.get("timestamp", 0)),
                    )
                )
    if sessions:
        groups: dict[int, list[int]] = {}
        for n, (_, ids, _, _) in enumerate(rows):
            groups.setdefault(ids[0], []).append(n)
        multi = sorted(k for k, v in groups.items() if len(v) >= 3)
        picked = set(random.Random(seed).sample(multi, min(sessions, len(multi))))
        rows = [row for row in rows if row[1][0] in picked]
    else:
        rows = rows[start:]
    return [Request(ids, out, i, at) for i, ids, out, at in rows[:count]]


def warm_bound(requests: list[Request], speedup: float, life_ms: float) -> dict[str, Any]:
    """The best precision any warm timed by the time since a conversation's last request can reach
    on these requests' own gaps (replay time), for a warm that lives `life_ms` in its engine: the
    highest chance (services/gateway/warming.py `Gaps`, every gap known in advance) over all moments,
    and over the moments at which the turn's blocks have been evicted already (from `life_ms` on: only
    then is there anything to warm)."""
    gaps = Gaps(maxlen=100_000, min_gaps=1)
    last: dict[str, float] = {}
    for r in requests:
        at = r.at_ms / (speedup or 1.0)
        if r.conversation in last:
            gaps.add(at - last[r.conversation])
        last[r.conversation] = at
    moments = sorted({0.0, life_ms, *(t for g in gaps._sorted for t in (g, g - life_ms) if t >= 0)})

    def best(since: float) -> tuple[float, float]:
        return max(((gaps.chance(t, life_ms), t) for t in moments if t >= since), default=(0.0, since))

    anytime, lost = best(0.0), best(life_ms)
    return {
        "life_ms": life_ms,
        "best_precision": anytime[0],
        "best_at_ms": anytime[1],
        "best_precision_once_evicted": lost[0],
        "best_once_evicted_at_ms": lost[1],
    }


def reuse_bound(requests: list[Request]) -> float:
    """The share of blocks a cache that never evicts would find (the trace slice's own reuse)."""
    seen: set[int] = set()
    hits = total = 0
    for r in requests:
        for h in r.hash_ids:
            if h not in seen:
                break
            hits += 1
        total += len(r.hash_ids)
        seen.update(r.hash_ids)
    return hits / max(total, 1)


def ttft_ms(url: str, model: str, tokens: list[int], output: int, headers: dict[str, str]) -> float:
    body = {"model": model, "prompt": tokens, "max_tokens": max(output, 1), "temperature": 0, "stream": True}
    started = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=headers, timeout=300) as r:
        r.raise_for_status()
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                # The first chunk carrying a choice is the first token, even one whose text is empty
                # (a random-weight model can pick a token that decodes to nothing on its own).
                if chunk.get("choices"):
                    first = time.perf_counter()
                    for _ in lines:  # the rest of the answer, so the engine is free for the next
                        pass
                    return (first - started) * 1000
    raise RuntimeError("no token streamed")


COUNTERS = (
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:external_prefix_cache_hits_total",
    "vllm:prompt_tokens_total",
)


def counters(engine: VllmServer) -> dict[str, float]:
    got = engine.metrics()
    return {k: got.get(k, 0.0) for k in COUNTERS}


def replay(
    requests: list[Request],
    engines: list[VllmServer],
    gateway_url: str | None,
    progress: Progress,
    row: str,
    speedup: float,
    kill_halfway: bool = False,
) -> dict[str, Any]:
    """Each request's TTFT; with `kill_halfway`, the second instance is killed (SIGKILL) as the middle
    request goes out, and the requests that fail are counted (its counters are then lost with it)."""
    before = [counters(e) for e in engines]
    task = progress.add_task(row, total=len(requests))
    lock = threading.Lock()
    turn = [0]

    first_ms = requests[0].at_ms if requests else 0
    began = time.perf_counter()
    middle = requests[len(requests) // 2] if kill_halfway and requests else None
    failed: list[str] = []

    def one(req: Request) -> float | None:
        if speedup > 0:  # an open loop: at its (scaled) arrival time
            time.sleep(max(0.0, began + (req.at_ms - first_ms) / 1000 / speedup - time.perf_counter()))
        if req is middle:
            engines[1].kill()
        if gateway_url is not None:
            # KV reuse only (no answer cache); the conversation, for affinity and warmup.
            url = gateway_url
            headers = {"x-cachemesh-bypass": "1", "x-cachemesh-conversation-id": req.conversation}
        else:
            with lock:
                url, turn[0] = engines[turn[0] % len(engines)].url, turn[0] + 1
            headers = {}
        try:
            ms: float | None = ttft_ms(url, engines[0].model, req.tokens(), req.output, headers)
        except (httpx.HTTPError, RuntimeError) as exc:
            failed.append(repr(exc)[:200])
            ms = None
        progress.advance(task)
        return ms

    with ThreadPoolExecutor(CLIENTS if speedup <= 0 else 32) as pool:
        ttfts = [t for t in pool.map(one, requests) if t is not None]
    alive = [e for e in engines if not (kill_halfway and e is engines[1])]
    after = {id(e): counters(e) for e in alive}
    per_instance = []
    for e, b in zip(engines, before, strict=True):
        if id(e) not in after:
            continue
        a = after[id(e)]
        d = {k: a[k] - b[k] for k in COUNTERS}
        found = d["vllm:prefix_cache_hits_total"] + d["vllm:external_prefix_cache_hits_total"]
        per_instance.append(
            {
                "queried_tokens": d["vllm:prefix_cache_queries_total"],
                "own_cache_tokens": d["vllm:prefix_cache_hits_total"],
                "loaded_tokens": d["vllm:external_prefix_cache_hits_total"],
                "prompt_tokens": d["vllm:prompt_tokens_total"],
                "hit_rate": found / d["vllm:prompt_tokens_total"] if d["vllm:prompt_tokens_total"] else 0.0,
            }
        )
    prompt = sum(p["prompt_tokens"] for p in per_instance)
    found = sum(p["own_cache_tokens"] + p["loaded_tokens"] for p in per_instance)
    return {
        "ttft_ms_mean": statistics.fmean(ttfts),
        "ttft_ms_p50": float(np.percentile(ttfts, 50)),
        "ttft_ms_p95": float(np.percentile(ttfts, 95)),
        "prefix_hit_rate": found / prompt if prompt else 0.0,
        "tokens_computed": prompt - found,
        "prompt_tokens": prompt,
        "per_instance": per_instance,
        "failed_requests": len(failed),
        "failures": failed[:10],
        "ttft_ms": ttfts,
    }


class Service:
    """A mesh service as its own process (`python -m services.<name>`), ready once /healthz says so."""

    def __init__(self, name: str, env: dict[str, str], logs: Path) -> None:
        self.name, self.env, self.logs = name, env, logs
        self.metrics_port = free_port()
        self.proc: ServerProcess | None = None

    def start(self) -> None:
        env = {
            **os.environ,
            **self.env,
            f"CACHEMESH_{self.name.upper()}_METRICS_PORT": str(self.metrics_port),
        }
        self.proc = ServerProcess(
            [sys.executable, "-m", f"services.{self.name}"],
            log_path=self.logs / f"{self.name}.log",
            env=env,
            cwd=REPO,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if not self.proc.is_alive():
                raise RuntimeError(f"{self.name} exited:\n{self.proc.log_tail()}")
            with contextlib.suppress(httpx.HTTPError, ValueError):
                health = httpx.get(f"http://127.0.0.1:{self.metrics_port}/healthz", timeout=2).json()
                if health.get("healthy"):
                    return
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} not healthy:\n{self.proc.log_tail()}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop(10)


def engine_pair(**kw: Any) -> list[VllmServer]:
    """Two instances, each computing on a core of its own where there are two (as two GPUs would:
    otherwise they take turns on one core and spreading load gains nothing)."""
    cores = sorted(os.sched_getaffinity(0))
    return [
        VllmServer(
            SMALL, max_model_len=2048, env={"VLLM_CPU_OMP_THREADS_BIND": str(cores[i % len(cores)])}, **kw
        )
        for i in range(2)
    ]


def routed_row(
    name: str,
    engines: list[VllmServer],
    requests: list[Request],
    common: dict[str, str],
    node: TierNode,
    logs: Path,
    progress: Progress,
    speedup: float,
    warmup: bool = False,
    kill_halfway: bool = False,
    warm_min_precision: float | None = None,
) -> dict[str, Any]:
    ns = common["KAFKA_TOPIC_NAMESPACE"]
    ids = [f"{name}-{i}-{ns}" for i in range(len(engines))]
    bridge = Service(
        "bridge",
        {
            **common,
            "CACHEMESH_BRIDGE_NODE_ID": f"bridge-{name}-{ns}",
            "CACHEMESH_BRIDGE_REPLAY_HISTORY_ON_FIRST_START": "false",
            "CACHEMESH_BRIDGE_PUBLISHERS": json.dumps(
                [
                    {
                        "engine_id": eid,
                        "endpoint": e.events_endpoint,
                        "replay_endpoint": e.replay_endpoint,
                        "topic": "kv-events",
                        "model": SMALL.name,
                    }
                    for eid, e in zip(ids, engines, strict=True)
                ]
            ),
        },
        logs,
    )
    port = free_port()
    gateway = Service(
        "gateway",
        {
            **common,
            "CACHEMESH_GATEWAY_NODE_ID": f"gw-{name}-{ns}",
            "CACHEMESH_GATEWAY_API_PORT": str(port),
            "CACHEMESH_GATEWAY_TIERS_URL": node.url,
            "CACHEMESH_GATEWAY_UPSTREAMS": json.dumps(
                [
                    {"name": f"i{i}", "url": f"{e.url}/v1", "engine_id": eid}
                    for i, (e, eid) in enumerate(zip(engines, ids, strict=True))
                ]
            ),
            "CACHEMESH_GATEWAY_ROUTING_TOKENIZER_DIR": str(engines[0].model_dir),
            "CACHEMESH_GATEWAY_ROUTING_MODEL": SMALL.name,
            "CACHEMESH_GATEWAY_ROUTING_BLOCK_SIZE": str(BLOCK_SIZE),
            "CACHEMESH_GATEWAY_QUEUE_POLL_MS": "200",
            "CACHEMESH_GATEWAY_ROUTING_WARM": "true" if warmup else "false",
            **(
                {"CACHEMESH_GATEWAY_ROUTING_WARM_MIN_PRECISION": str(warm_min_precision)}
                if warm_min_precision is not None
                else {}
            ),
        },
        logs,
    )
    warmer = Service(
        "warmup",
        {
            **common,
            "CACHEMESH_WARMUP_GROUP_ID": f"warmup-{name}-{ns}",
            "CACHEMESH_WARMUP_MODEL_NAME": f"ftl-{name}-{ns}",
            "CACHEMESH_WARMUP_WARM_ENGINES": "true",
        },
        logs,
    )
    with _running(bridge), _running(gateway), _running(warmer) if warmup else contextlib.nullcontext():
        out = replay(requests, engines, f"http://127.0.0.1:{port}", progress, name, speedup, kill_halfway)
        health = httpx.get(f"http://127.0.0.1:{gateway.metrics_port}/healthz", timeout=10).json()
        routing = health.get("gateway", {}).get("routing", {})
        out["routing_reasons"] = routing.get("reasons", {})
        if warmup:
            out["warms"] = routing.get("warms", {})
            lives = [i["survive_ms"] for i in routing.get("instances", []) if i.get("survive_ms")]
            out["warm_life_ms"] = statistics.fmean(lives) if lives else None
        return out


@contextlib.contextmanager
def _running(server: Any) -> Iterator[None]:
    try:
        server.start()
        yield
    finally:
        server.stop()


def plot(rows: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rows)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    xs = np.arange(len(names))
    for i, stat in enumerate(("ttft_ms_mean", "ttft_ms_p50", "ttft_ms_p95")):
        left.bar(
            xs + (i - 1) * 0.27, [rows[n][stat] for n in names], 0.27, label=stat.removeprefix("ttft_ms_")
        )
    left.set_xticks(xs, names, rotation=20)
    left.set_ylabel("TTFT (ms)")
    left.legend()
    right.bar(xs, [100 * rows[n]["prefix_hit_rate"] for n in names])
    right.set_xticks(xs, names, rotation=20)
    right.set_ylabel("prefix-cache hit rate (%)")
    fig.suptitle(f"Mooncake-shaped replay on 2 vLLM instances ({SMALL.name}, CPU)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(
    trace: Annotated[
        Path | None, typer.Option(help="A Mooncake-format trace (default: the shared one)")
    ] = None,
    start: Annotated[int, typer.Option(help="First request of the slice")] = 0,
    requests: Annotated[int, typer.Option(help="Requests replayed per row (at most)")] = 120,
    sessions: Annotated[
        int, typer.Option(help="Conversations drawn from the trace (0: requests in a row from --start)")
    ] = 16,
    seed: int = 0,
    max_blocks: Annotated[int, typer.Option(help="Blocks kept of each request's prefix")] = 40,
    kv_blocks: Annotated[int, typer.Option(help="Each instance's KV pool (blocks of 32 tokens)")] = 96,
    speedup: Annotated[
        float, typer.Option(help="Trace time / replay time (0: a closed loop of 2 clients, no pauses)")
    ] = 8.0,
    rows: Annotated[str, typer.Option(help="Rows to run, comma-separated")] = ",".join(ROWS),
    kill_halfway: Annotated[
        bool,
        typer.Option(help="Also routed_tiers_warmup_kill: the full stack with an instance killed halfway"),
    ] = False,
    warm_min_precision: Annotated[
        float | None,
        typer.Option(help="The gateway's routing_warm_min_precision (default: the gateway's own)"),
    ] = None,
) -> None:
    chosen = [r for r in rows.split(",") if r] + (["routed_tiers_warmup_kill"] if kill_halfway else [])
    unknown = set(chosen) - {*ROWS, "routed_tiers_warmup_kill"}
    if unknown:
        raise typer.BadParameter(f"unknown rows {sorted(unknown)}; known: {', '.join(ROWS)}")
    path = trace or shared_data_dir() / "traces" / "mooncake_synthetic.jsonl"
    reqs = read_requests(path, start, requests, max_blocks, sessions, seed)
    console = Console(width=160)
    console.print(
        f"{len(reqs)} requests of {path.name} from {start}, up to {max_blocks} blocks each "
        f"(mean {statistics.fmean(len(r.hash_ids) for r in reqs):.1f}); a cache that never evicts would "
        f"find {100 * reuse_bound(reqs):.1f}% of their blocks; each instance holds {kv_blocks} blocks"
    )
    results: dict[str, dict[str, Any]] = {}
    namespace = f"bench{uuid.uuid4().hex[:6]}."
    with (
        broker_from_env() as broker,
        postgres_from_env() as pg,
        tempfile.TemporaryDirectory(prefix="bench-engine-replay-") as tmp,
        Progress(console=console) as progress,
    ):
        asyncio.run(ensure_topics(broker.bootstrap, namespace))
        logs = Path(tmp)
        common = {
            "KAFKA_BOOTSTRAP": broker.bootstrap,
            "KAFKA_TOPIC_NAMESPACE": namespace,
            "DATABASE_URL": pg.dsn,
        }
        node = TierNode(broker.bootstrap, pg.dsn, namespace, logs)
        node.start()
        try:
            if "round_robin" in chosen:
                pair = engine_pair(kv_blocks=kv_blocks, events=False, prefix_caching=False)
                with _all(pair):
                    results["round_robin"] = replay(reqs, pair, None, progress, "round_robin", speedup)
            if {"round_robin_prefix", "routed"} & set(chosen):
                pair = engine_pair(kv_blocks=kv_blocks)
                with _all(pair):
                    if "round_robin_prefix" in chosen:
                        results["round_robin_prefix"] = replay(
                            reqs, pair, None, progress, "round_robin_prefix", speedup
                        )
                        for e in pair:
                            e.reset_prefix_cache()
                    if "routed" in chosen:
                        results["routed"] = routed_row(
                            "routed", pair, reqs, common, node, logs, progress, speedup
                        )
            for salt, (row, warm) in enumerate(
                (("routed_tiers", False), ("routed_tiers_warmup", True), ("routed_tiers_warmup_kill", True))
            ):
                if row not in chosen:
                    continue
                # The node keeps what the row before stored (L2, L3): each row its own token content.
                salted = [dataclasses.replace(r, salt=salt) for r in reqs]
                config = connector_config(node.url, model=SMALL.name)
                pair = engine_pair(kv_blocks=kv_blocks, connector=config)
                with _all(pair):
                    results[row] = routed_row(
                        row, pair, salted, common, node, logs, progress, speedup, warmup=warm,
                        kill_halfway=row.endswith("_kill"), warm_min_precision=warm_min_precision,
                    )  # fmt: skip
        finally:
            node.stop()
    table = Table(
        title=f"Mooncake-shaped replay, {len(reqs)} requests, 2 instances of {SMALL.name} "
        f"({kv_blocks} blocks each)"
    )
    for col in (
        "row",
        "TTFT mean",
        "p50",
        "p95",
        "hit rate",
        "per instance",
        "tokens computed",
        "mean vs rr+prefix",
    ):
        table.add_column(col, justify="left" if col == "row" else "right")
    base = results.get("round_robin_prefix", {}).get("ttft_ms_mean")
    for name, r in results.items():
        table.add_row(
            name,
            f"{r['ttft_ms_mean']:.1f}",
            f"{r['ttft_ms_p50']:.1f}",
            f"{r['ttft_ms_p95']:.1f}",
            f"{100 * r['prefix_hit_rate']:.1f}%",
            " / ".join(f"{100 * p['hit_rate']:.1f}%" for p in r["per_instance"]),
            f"{r['tokens_computed']:.0f}",
            "" if base is None else f"{r['ttft_ms_mean'] / base:.2f}x",
        )
    console.print(table)
    for name, r in results.items():
        if "warms" in r:
            w = r["warms"]
            console.print(
                f"{name}: {w.get('commands', 0)} warmup commands heard, {w.get('sent', 0)} prefills sent "
                f"({w.get('deferred', 0)} waited for a likely moment, {w.get('unlikely', 0)} dropped: "
                f"turn unlikely within a warm's life, {w.get('overtaken', 0)} overtaken by the turn, "
                f"{w.get('busy', 0)} instance busy, {w.get('already_held', 0)} already held); "
                f"{w.get('used', 0)} used, {w.get('wasted', 0)} wasted ({w.get('evicted', 0)} evicted "
                f"first): precision {w.get('precision')} (predicted {w.get('predicted_precision')}), "
                f"sent {w.get('lead_ms_mean')} ms before the turn on average; "
                f"{w.get('prefill_tokens', 0)} tokens prefilled"
            )
            if r.get("warm_life_ms") and speedup > 0:
                r["warm_bound"] = bound = warm_bound(reqs, speedup, r["warm_life_ms"])
                console.print(
                    f"  a warm lived ~{bound['life_ms']:.0f} ms in an instance; on these gaps no timing "
                    f"by elapsed time reaches more than {bound['best_precision']:.2f} precision "
                    f"(at {bound['best_at_ms']:.0f} ms), {bound['best_precision_once_evicted']:.2f} once "
                    f"the blocks were evicted (at {bound['best_once_evicted_at_ms']:.0f} ms)"
                )
    ftl = ftl_fit(results, reqs, kv_blocks)
    if ftl:
        console.print(
            f"seed FTL model (§2.1) over the rows: FTL = {ftl['base_ms']:.0f} + m x "
            f"{ftl['delta_ms']:.0f} ms, R² {ftl['r2']:.2f}, leave-one-out error up to "
            f"{100 * (ftl['loo_max_error'] or 0):.0f}%; the KV "
            f"capacity predicts m = {_num(ftl['m_kv_heads'])} counting KV heads, {_num(ftl['m_seed'])} as "
            f"the seed writes it, against {_num(ftl['m_measured_rr_prefix'])} measured (round_robin_prefix)"
        )
    for name, r in results.items():
        if r.get("failed_requests"):
            console.print(f"{name}: {r['failed_requests']} failed requests: {r.get('failures')}")
    RESULTS.mkdir(exist_ok=True)
    out = {
        "trace": str(path),
        "start": start,
        "sessions": sessions,
        "seed": seed,
        "requests": len(reqs),
        "max_blocks": max_blocks,
        "kv_blocks": kv_blocks,
        "speedup": speedup,
        "warm_min_precision": warm_min_precision,
        "reuse_bound": reuse_bound(reqs),
        "rows": results,
        "ftl_fit": ftl,
        "not_measured": [r for r in ("routed_tiers_warmup",) if r not in results],
    }
    (RESULTS / "engine_replay.json").write_text(json.dumps(out, indent=2) + "\n")
    plot(results, RESULTS / "engine_replay.png")
    console.print(f"wrote {RESULTS / 'engine_replay.json'} and engine_replay.png")


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def ftl_fit(results: dict[str, dict[str, Any]], reqs: list[Request], kv_blocks: int) -> dict[str, Any]:
    """The seed's FTL = base + m * delta (services/warmup/ftl.py) fit to the rows' mean TTFT against
    their miss rate (1 - prefix hit rate), how well it predicts each row (and each left out), and the
    miss rate the seed's capacity formula predicts for one instance seeing the whole working set."""
    pairs = [(1 - r["prefix_hit_rate"], r["ttft_ms_mean"]) for r in results.values()]
    if len({round(m, 3) for m, _ in pairs}) < 2:
        return {}
    fit = FtlFit()
    for m, f in pairs:
        fit.observe(m, f)
    base, delta = fit.params()
    mean = statistics.fmean(f for _, f in pairs)
    ss_res = sum((f - fit.predict(m)) ** 2 for m, f in pairs)
    ss_tot = sum((f - mean) ** 2 for _, f in pairs) or 1.0
    loo = []
    for i, (m, f) in enumerate(pairs):
        rest = FtlFit()
        for j, (mj, fj) in enumerate(pairs):
            if j != i:
                rest.observe(mj, fj)
        if rest.fitted:
            loo.append(abs(rest.predict(m) - f) / f)
    shape = KvShape(SMALL.layers, SMALL.kv_heads, SMALL.hidden // SMALL.heads)
    tokens = BLOCK_SIZE * len({h for r in reqs for h in r.hash_ids})
    capacity = kv_blocks * BLOCK_SIZE * shape.bytes_per_token()
    rr = results.get("round_robin_prefix")
    return {
        "base_ms": base,
        "delta_ms": delta,
        "r2": 1 - ss_res / ss_tot,
        "rows": {
            name: {"m": m, "measured_ms": f, "predicted_ms": fit.predict(m)}
            for name, (m, f) in zip(results, pairs, strict=True)
        },
        "loo_max_error": max(loo) if loo else None,
        "working_set_tokens": tokens,
        "m_kv_heads": kv_miss_rate(tokens, shape, capacity),
        "m_seed": seed_miss_rate(tokens, shape, capacity),
        "m_measured_rr_prefix": 1 - rr["prefix_hit_rate"] if rr else None,
    }


@contextlib.contextmanager
def _all(servers: list[VllmServer]) -> Iterator[None]:
    try:
        for s in servers:
            s.start()
        yield
    finally:
        for s in servers:
            s.stop()


if __name__ == "__main__":
    typer.run(main)
