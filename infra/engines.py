"""Local vLLM instances for `cachemesh up --vllm N`: the whole stack on one machine, on this CPU.

Each instance is `vllm serve` of the project's small random-weight model (infra/vllm_env.py; `make
setup` builds its venv and the model), with prefix caching, KV events and cachemesh's connector to the
tier node, so its blocks go to and come from cachemesh's tiers. `wiring` gives the services what they
need to find them: the gateway routes among them by their KV (UPSTREAMS, the model's tokenizer and
block size), and the bridge publishes their KV events (PUBLISHERS). The answers are random words (the
weights are random): what the stack shows is serving, caching, routing and warming, not the text.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from infra.vllm_env import SMALL
from infra.vllm_server import BLOCK_SIZE, VllmServer, connector_config


def engines(count: int, tiers_url: str) -> list[VllmServer]:
    """`count` instances, each computing on a core of its own where there are enough (otherwise they
    take turns on one and spreading load gains nothing); ports are chosen now, started later."""
    cores = sorted(os.sched_getaffinity(0))
    return [
        VllmServer(
            SMALL,
            kv_blocks=512,
            max_model_len=2048,
            connector=connector_config(tiers_url, model=SMALL.name),
            env={"VLLM_CPU_OMP_THREADS_BIND": str(cores[i % len(cores)])},
        )
        for i in range(count)
    ]


def engine_id(index: int) -> str:
    return f"vllm-{index}"


def wiring(urls: Sequence[str], events: Sequence[tuple[str, str]], tokenizer_dir: str) -> dict[str, str]:
    """The environment that points the gateway and the bridge at instances served at `urls` (their
    base URL, no /v1), whose KV events are `events` ((endpoint, replay endpoint) each)."""
    if len(urls) != len(events) or not urls:
        raise ValueError("one events pair per instance, and at least one instance")
    upstreams = [
        {"name": engine_id(i), "url": f"{url}/v1", "engine_id": engine_id(i)} for i, url in enumerate(urls)
    ]
    publishers = [
        {
            "engine_id": engine_id(i),
            "endpoint": endpoint,
            "replay_endpoint": replay,
            "topic": "kv-events",
            "model": SMALL.name,
        }
        for i, (endpoint, replay) in enumerate(events)
    ]
    return {
        "CACHEMESH_GATEWAY_UPSTREAMS": json.dumps(upstreams),
        "CACHEMESH_GATEWAY_ROUTING_TOKENIZER_DIR": tokenizer_dir,
        "CACHEMESH_GATEWAY_ROUTING_MODEL": SMALL.name,
        "CACHEMESH_GATEWAY_ROUTING_BLOCK_SIZE": str(BLOCK_SIZE),
        "CACHEMESH_BRIDGE_PUBLISHERS": json.dumps(publishers),
        "CACHEMESH_BRIDGE_REPLAY_HISTORY_ON_FIRST_START": "false",
    }


def wiring_for(servers: Sequence[VllmServer]) -> dict[str, str]:
    return wiring(
        [s.url for s in servers],
        [(s.events_endpoint, s.replay_endpoint) for s in servers],
        str(servers[0].model_dir),
    )
