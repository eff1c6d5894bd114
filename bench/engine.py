"""Time to first token of a real vLLM engine with cachemesh as its KV tier, side by side in one run, for
prefixes of 512 / 1,024 / 2,048 tokens (a fresh 16-token suffix on every request, so only the prefix is
shared), on the larger test model (`cachemesh-small`: hidden 512, 4 layers, 8 KV heads, bf16):

- cold: a prefix nothing holds, on vLLM alone (no connector);
- vllm_prefix: the same prompt again on vLLM alone, from its own prefix cache;
- cachemesh_l2: vLLM's cache reset, the prefix loaded by the connector from the tier node's L2;
- cachemesh_l3: the node told to evict the blocks (a `tier.commands.v1` eviction, as heat sends), the
  prefix loaded from L3 (Postgres).

The engine with the connector first computes the prompt itself (its cold time, with the connector's
lookup, is reported as `ttft_ms_cold_with_connector`) and saves it in the background. Beside them: the
L2 load path alone (out of the node's shared segment and over HTTP, GB/s) and the per-block cost of
loading against recomputing. `--faults N` adds N runs where the tier node process is SIGKILLed while a
request loads a 2,048-token prefix (on an engine whose connector loads over HTTP, as from another host:
a copy out of the shared segment outlives the node): every request must still succeed, with the cold
output. The tier node runs as its own process (`python -m services.tiers`), on a real broker and
Postgres (`KAFKA_BOOTSTRAP` / `DATABASE_URL` when set, otherwise it starts its own).

Run: `python -m bench.engine [--prefixes 512,1024,2048] [--reps 7] [--faults 20]`. Prints the table,
writes `bench/results/engine.json` (per prefix length: `prefix_tokens`, median `ttft_ms` per mode, the
load figures; a list, one object per length), `bench/results/engine.png`, and with `--faults`
`bench/results/engine_faults.json`.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from pathlib import Path
from typing import Annotated, Any

import httpx
import numpy as np
import typer
from aiokafka import AIOKafkaProducer
from cachemesh_client.blockframe import parse_blocks
from cachemesh_client.bulk import NodeLink
from cachemesh_client.kvkeys import block_keys
from cachemesh_client.kvload import BlockLoader
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from infra.brokers import broker_from_env
from infra.paths import free_port
from infra.postgres import postgres_from_env
from infra.process import ServerProcess
from infra.vllm_env import SMALL
from infra.vllm_server import BLOCK_SIZE, VllmServer, connector_config
from schemas.events import EvictionRequested
from schemas.topics import qualified
from schemas.wire import encode
from services.runtime.topics import ensure_topics

RESULTS = Path(__file__).parent / "results"
REPO = Path(__file__).resolve().parent.parent
MODES = ("cold", "vllm_prefix", "cachemesh_l2", "cachemesh_l3")
SUFFIX = 16
LOAD_ERRORS = "vllm:cachemesh_load_errors_total"
EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
QUIET_S = 0.5
VOCAB = (10, 2000)


class TierNode:
    """The tier node as its own process, restartable on the same port (the fault runs kill it)."""

    def __init__(self, bootstrap: str, dsn: str, namespace: str, logs: Path) -> None:
        self.port = free_port()
        self.node_id = f"bench-{namespace}"
        self.namespace = namespace
        self.logs = logs
        self.env = {
            **os.environ,
            "KAFKA_BOOTSTRAP": bootstrap,
            "KAFKA_TOPIC_NAMESPACE": namespace,
            "DATABASE_URL": dsn,
            "CACHEMESH_TIERS_NODE_ID": self.node_id,
            "CACHEMESH_TIERS_API_PORT": str(self.port),
            "CACHEMESH_TIERS_BLOCK_PORT": "0",
            "CACHEMESH_TIERS_METRICS_PORT": "0",
            "CACHEMESH_TIERS_EMBEDDER_PRELOAD": "false",
            # room for every prefix of the run in L2: 1 GB, 2,048 blocks of 512 KB (float32)
            "CACHEMESH_TIERS_L2_PAGES": "65536",
            "CACHEMESH_TIERS_MAX_REQUEST_BYTES": str(32 << 20),
        }
        self.proc: ServerProcess | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = ServerProcess(
            [sys.executable, "-m", "services.tiers"],
            log_path=self.logs / "tiers.log",
            env=self.env,
            cwd=REPO,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if not self.proc.is_alive():
                raise RuntimeError(f"the tier node exited:\n{self.proc.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"the tier node is not ready:\n{self.proc.log_tail()}")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop(10)


def ttft_ms(engine: VllmServer, tokens: list[int]) -> tuple[float, str]:
    """Milliseconds to the first streamed token, and the first tokens' text (greedy)."""
    body = {
        "model": engine.model,
        "prompt": tokens,
        "max_tokens": 4,
        "temperature": 0,
        "stream": True,
    }
    started = time.perf_counter()
    first: float | None = None
    text = []
    with httpx.stream("POST", f"{engine.url}/v1/completions", json=body, timeout=300) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            piece = chunk["choices"][0].get("text", "") if chunk.get("choices") else ""
            if first is None and piece:
                first = time.perf_counter()
            text.append(piece)
    if first is None:
        raise RuntimeError("no token streamed")
    return (first - started) * 1000, "".join(text)


def held_where(node: TierNode, keys: list[str]) -> list[str]:
    """The tier each leading held block is in."""
    r = httpx.post(f"{node.url}/v1/prefix", json={"keys": keys}, timeout=30)
    r.raise_for_status()
    return [b["tier"] for b in r.json()["blocks"]]


def wait_for(what: str, cond: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout_s} s")
        time.sleep(0.02)


def load_gbps(node: TierNode, keys: list[str]) -> dict[str, float]:
    """The connector's L2 load path alone, as it runs in vLLM's worker (`kvload.BlockLoader`): every block
    checked (header, crc32) and copied into a paged-memory stand-in, out of the node's shared segment
    (the path on the node's host) and over HTTP (the path from another host); and the HTTP fetch alone.
    GB/s of payload, median of 7 after one warm-up."""
    nbytes = 0
    paged: dict[int, np.ndarray] = {}

    def place(i: int, _: Any, array: np.ndarray) -> None:
        if i not in paged:
            paged[i] = np.empty_like(array)
        paged[i][...] = array

    out: dict[str, float] = {}
    for name, shared in (("load_gbps", True), ("http_load_gbps", False)):
        loader = BlockLoader(node.url, model=None, shared_memory=shared, chunk_bytes=8 << 20)
        times = []
        try:
            for _ in range(8):
                started = time.perf_counter()
                assert loader.load(keys, place, timeout_s=60) == len(keys), "the prefix is not all held"
                times.append(time.perf_counter() - started)
            if shared and loader.from_segment == 0:
                raise RuntimeError("the node's shared segment was not used")
        finally:
            loader.close()
        nbytes = sum(int(a.nbytes) for a in paged.values())
        out[name] = nbytes / statistics.median(times[1:]) / 1e9
    link = NodeLink(node.url, timeout_s=60)
    times = []
    try:
        for _ in range(8):
            started = time.perf_counter()
            parse_blocks(link.post_json_raw("/v1/blocks/fetch", {"keys": keys}), copy=False)
            times.append(time.perf_counter() - started)
    finally:
        link.close()
    out["fetch_gbps"] = nbytes / statistics.median(times[1:]) / 1e9
    out["bytes"] = nbytes
    return out


class Evictor:
    """Sends `tier.commands.v1` evictions to the node (what heat does to spill a block out of L2)."""

    def __init__(self, bootstrap: str, namespace: str) -> None:
        self.bootstrap = bootstrap
        self.topic = qualified(EvictionRequested.topic, namespace)

    async def evict(self, node_id: str, keys: list[str]) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap)
        await producer.start()
        try:
            for i in range(0, len(keys), 256):
                event = EvictionRequested(keys=keys[i : i + 256], node_id=node_id, reason="bench")
                await producer.send_and_wait(self.topic, encode(event), key=node_id.encode())
        finally:
            await producer.stop()


def measure(
    plain: VllmServer,
    engine: VllmServer,
    node: TierNode,
    evictor: Evictor,
    prefix_tokens: int,
    reps: int,
    rng: random.Random,
) -> dict[str, Any]:
    """`plain` is vLLM alone (the cold and vllm_prefix rows); `engine` has cachemesh's connector."""
    samples: dict[str, list[float]] = {m: [] for m in (*MODES, "cold_with_connector")}
    differing = dict.fromkeys((*MODES, "cold_with_connector"), 0)
    blocks = prefix_tokens // BLOCK_SIZE
    keys: list[str] = []
    for rep in range(reps + 1):  # the first repetition warms the paths and is not counted
        # One suffix for every mode of a repetition: the outputs can be compared (16 tokens and 4
        # generated never fill another block, so only the prefix is ever cached).
        tokens = [rng.randrange(*VOCAB) for _ in range(prefix_tokens + SUFFIX)]
        keys = block_keys(tokens[:prefix_tokens], model=engine.model, block_size=BLOCK_SIZE)
        texts = {}
        for mode in ("cold", "vllm_prefix", "cold_with_connector", "cachemesh_l2", "cachemesh_l3"):
            if mode == "cachemesh_l2":
                wait_for("the prefix saved", lambda k=keys: len(held_where(node, k)) == blocks)
                engine.reset_prefix_cache()
            elif mode == "cachemesh_l3":
                asyncio.run(evictor.evict(node.node_id, keys))
                wait_for("the prefix evicted to L3", lambda k=keys: set(held_where(node, k)) == {"l3"})
                engine.reset_prefix_cache()
            on = plain if mode in ("cold", "vllm_prefix") else engine
            # Quiet first: the other engine's OpenMP threads spin for 200 ms after their last work
            # (KMP_BLOCKTIME) on the same cores, and the node may still be writing a save to L3.
            time.sleep(QUIET_S)
            ms, texts[mode] = ttft_ms(on, tokens)
            if rep:
                samples[mode].append(ms)
        # The same engine, computing the prompt itself and loading it (vLLM alone is another process).
        for mode, text in texts.items():
            differing[mode] += (
                text != texts["cold_with_connector" if mode.startswith("cachemesh") else "cold"]
            )
    load = load_gbps(node, keys)
    med = {m: statistics.median(v) for m, v in samples.items() if m in MODES}
    connector_miss = statistics.median(samples["cold_with_connector"])
    per_block = {
        "recompute_ms": (med["cold"] - med["vllm_prefix"]) / blocks,
        "load_l2_ms": (med["cachemesh_l2"] - med["vllm_prefix"]) / blocks,
        "load_l3_ms": (med["cachemesh_l3"] - med["vllm_prefix"]) / blocks,
    }
    return {
        "prefix_tokens": prefix_tokens,
        "model": engine.model,
        "blocks": blocks,
        "ttft_ms": med,
        "ttft_ms_all": samples,
        "ttft_ms_cold_with_connector": connector_miss,
        "ratio": {
            "l2_vs_cold": med["cachemesh_l2"] / med["cold"],
            "l2_vs_vllm_prefix": med["cachemesh_l2"] / med["vllm_prefix"],
            "l3_vs_cold": med["cachemesh_l3"] / med["cold"],
        },
        "l2_load_gbps": load["load_gbps"],
        "l2_load_gbps_http": load["http_load_gbps"],
        "l2_fetch_gbps": load["fetch_gbps"],
        "bytes_per_block": load["bytes"] // blocks,
        "per_block_ms": per_block,
        # greedy outputs differing from the cold output of the same engine, by mode
        "outputs_differing": differing,
    }


def faults(engine: VllmServer, node: TierNode, runs: int, rng: random.Random) -> dict[str, Any]:
    """SIGKILL the tier node while a request loads a 2,048-token prefix; restart it; repeat. Each run is
    classed by the engine's counters: the kill came before the lookup (nothing loaded, no error), during
    the load (load errors: vLLM recomputed from the first block missing), or after it."""
    failed = wrong = 0
    kill_after_ms = []
    landed = {"before_lookup": 0, "mid_load": 0, "after_load": 0}
    per_run: list[tuple[float, str]] = []
    for _ in range(runs):
        prefix = [rng.randrange(*VOCAB) for _ in range(2048)]
        tokens = prefix + [rng.randrange(*VOCAB) for _ in range(SUFFIX)]
        _, cold = ttft_ms(engine, tokens)
        keys = block_keys(prefix, model=engine.model, block_size=BLOCK_SIZE)
        wait_for("saved", lambda keys=keys: len(held_where(node, keys)) == len(keys))
        engine.reset_prefix_cache()
        # The load runs ~35-65 ms after the request is sent (measured with a 0-120 ms sweep here:
        # earlier kills fell before the lookup, later ones after the load); `kill_landed` says where
        # each one fell.
        delay = rng.uniform(0.035, 0.065)
        kill_after_ms.append(delay * 1000)
        outcome: dict[str, Any] = {}

        def request(outcome: dict[str, Any] = outcome, tokens: list[int] = tokens) -> None:
            try:
                outcome["text"] = ttft_ms(engine, tokens)[1]
            except Exception as exc:
                outcome["error"] = repr(exc)

        counters = engine.metrics()
        t = threading.Thread(target=request)
        t.start()
        time.sleep(delay)
        node.kill()
        t.join()
        after = engine.metrics()
        errors = after.get(LOAD_ERRORS, 0) - counters.get(LOAD_ERRORS, 0)
        loaded = after.get(EXTERNAL_HITS, 0) - counters.get(EXTERNAL_HITS, 0)
        where = "mid_load" if errors else "after_load" if loaded else "before_lookup"
        landed[where] += 1
        per_run.append((round(delay * 1000, 1), where))
        if "error" in outcome:
            failed += 1
        elif outcome["text"] != cold:
            wrong += 1
        node.start()
    return {
        "runs": runs,
        "failed_requests": failed,
        "wrong_outputs": wrong,
        "kill_landed": landed,
        "kill_after_ms": kill_after_ms,
        "runs_by_delay": per_run,
    }


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.2
    xs = range(len(results))
    for i, mode in enumerate(MODES):
        ax.bar([x + (i - 1.5) * width for x in xs], [r["ttft_ms"][mode] for r in results], width, label=mode)
    ax.set_xticks(list(xs), [f"{r['prefix_tokens']} tokens" for r in results])
    ax.set_ylabel("TTFT, median (ms)")
    ax.set_title(f"vLLM ({SMALL.name}, CPU) with cachemesh as its KV tier")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(
    prefixes: Annotated[
        str, typer.Option(help="Prefix lengths in tokens, comma-separated")
    ] = "512,1024,2048",
    reps: Annotated[int, typer.Option(help="Measured requests per mode and prefix length")] = 7,
    fault_runs: Annotated[int, typer.Option("--faults", help="Runs that kill the node mid-load")] = 0,
    seed: int = 0,
) -> None:
    lengths = [int(p) for p in prefixes.split(",")]
    rng = random.Random(seed)
    console = Console(width=160)
    namespace = f"bench{uuid.uuid4().hex[:6]}."
    with (
        broker_from_env() as broker,
        postgres_from_env() as pg,
        tempfile.TemporaryDirectory(prefix="bench-engine-") as tmp,
    ):
        asyncio.run(ensure_topics(broker.bootstrap, namespace))
        node = TierNode(broker.bootstrap, pg.dsn, namespace, Path(tmp))
        node.start()
        plain = VllmServer(SMALL, kv_blocks=1024, max_model_len=4096, events=False)
        engine = VllmServer(
            SMALL,
            kv_blocks=1024,
            max_model_len=4096,
            events=False,
            connector=connector_config(node.url, model=SMALL.name, timeout_ms=3000),
        )
        with _stopping(node), _stopping(plain), _stopping(engine):
            console.print("starting two vLLM engines, one with cachemesh's connector (about 80 s) ...")
            plain.start()
            engine.start()
            evictor = Evictor(broker.bootstrap, namespace)
            results = []
            with Progress(console=console) as progress:
                task = progress.add_task("prefix lengths", total=len(lengths))
                for n in lengths:
                    results.append(measure(plain, engine, node, evictor, n, reps, rng))
                    progress.advance(task)
            fault = None
            if fault_runs:
                # The fault runs load over HTTP: from the shared segment a load is a copy out of memory
                # that outlives the node, and only the ~1 ms lookup-to-locate window could be hit.
                plain.stop()
                over_http = VllmServer(
                    SMALL,
                    kv_blocks=1024,
                    max_model_len=4096,
                    events=False,
                    connector=connector_config(
                        node.url, model=SMALL.name, timeout_ms=3000, extra={"shared_memory": False}
                    ),
                )
                with _stopping(over_http):
                    console.print("starting vLLM with the connector over HTTP for the fault runs ...")
                    over_http.start()
                    fault = faults(over_http, node, fault_runs, rng)
    table = Table(title=f"TTFT (ms, median of {reps}) on vLLM {SMALL.name}, CPU; cachemesh as the KV tier")
    for col in (
        "prefix",
        *MODES,
        "L2/cold",
        "L2/vLLM",
        "L3/cold",
        "L2 load GB/s",
        "load/recompute per block",
    ):
        table.add_column(col, justify="right")
    for r in results:
        t, pb = r["ttft_ms"], r["per_block_ms"]
        table.add_row(
            str(r["prefix_tokens"]),
            *(f"{t[m]:.1f}" for m in MODES),
            f"{r['ratio']['l2_vs_cold']:.2f}",
            f"{r['ratio']['l2_vs_vllm_prefix']:.2f}",
            f"{r['ratio']['l3_vs_cold']:.2f}",
            f"{r['l2_load_gbps']:.2f} / {r['l2_load_gbps_http']:.2f}",
            f"{pb['load_l2_ms']:.3f} / {pb['recompute_ms']:.3f} ms",
        )
    console.print(table)
    for r in results:
        console.print(
            f"{r['prefix_tokens']} tokens, greedy outputs differing from the same engine's cold one: "
            f"{r['outputs_differing']}"
        )
    if fault is not None:
        console.print(
            f"faults: {fault['runs']} runs, node SIGKILLed mid-load: {fault['failed_requests']} failed "
            f"requests, {fault['wrong_outputs']} outputs differing from cold; the kill landed "
            + ", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in fault["kill_landed"].items())
        )
    RESULTS.mkdir(exist_ok=True)
    # One object per prefix length (medians); the fault runs in a file of their own.
    (RESULTS / "engine.json").write_text(json.dumps(results, indent=2) + "\n")
    if fault is not None:
        (RESULTS / "engine_faults.json").write_text(json.dumps(fault, indent=2) + "\n")
    plot(results, RESULTS / "engine.png")
    console.print(f"wrote {RESULTS / 'engine.json'} and engine.png")


@contextlib.contextmanager
def _stopping(server: Any) -> Iterator[None]:
    try:
        yield
    finally:
        server.stop()


if __name__ == "__main__":
    typer.run(main)
