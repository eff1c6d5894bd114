"""A real `vllm serve` process (the venv and models of infra/vllm_env.py) on free loopback ports, with
prefix caching, KV events on ZMQ (and their replay socket), a bounded KV pool and, optionally, a KV
connector; ready only once a real completion came back."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from infra.paths import LOOPBACK, free_port
from infra.process import ManagedServer, ServerProcess, make_temp_dir
from infra.vllm_env import TINY, ModelShape, ensure_model, ensure_vllm

_CLIENT_DIR = Path(__file__).resolve().parent.parent / "client"
BLOCK_SIZE = 32  # the CPU attention backend takes multiples of 32 only


def connector_config(
    url: str,
    *,
    model: str,
    token: str | None = None,
    timeout_ms: int | None = None,
    lookup_timeout_ms: int | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """`--kv-transfer-config` for cachemesh's connector (client/cachemesh_client/vllm.py): a load that
    fails is recomputed, never an error to the user."""
    config: dict[str, Any] = {"url": url, "model": model}
    if token is not None:
        config["token"] = token
    if timeout_ms is not None:
        config["load_timeout_ms"] = timeout_ms
    if lookup_timeout_ms is not None:
        config["lookup_timeout_ms"] = lookup_timeout_ms
    config.update(extra or {})
    return {
        "kv_connector": "CachemeshConnector",
        "kv_connector_module_path": "cachemesh_client.vllm",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": config,
    }


class VllmServer(ManagedServer):
    """One vLLM OpenAI server. `kv_blocks` bounds its KV pool (to force evictions); `connector` is a
    `--kv-transfer-config` (see `connector_config`); the checkout's client package is on its path."""

    name = "vllm"
    temp_prefix = "cachemesh-vllm-"
    start_timeout_s = 240.0
    stop_timeout_s = 20.0

    def __init__(
        self,
        shape: ModelShape = TINY,
        *,
        port: int | None = None,
        kv_blocks: int | None = 512,
        max_model_len: int = 2048,
        connector: Mapping[str, Any] | None = None,
        events: bool = True,
        prefix_caching: bool = True,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(port)
        self.shape = shape
        self.kv_blocks = kv_blocks
        # vLLM refuses a pool that cannot hold one longest sequence (and one block is its null block)
        self.max_model_len = (
            max_model_len if kv_blocks is None else min(max_model_len, (kv_blocks - 1) * BLOCK_SIZE)
        )
        self.connector = dict(connector) if connector is not None else None
        self.events = events
        self.prefix_caching = prefix_caching
        self.extra_args = tuple(extra_args)
        self.extra_env = dict(env or {})
        # vLLM binds its PUB socket only to wildcard and ipc endpoints (it connects to the others, and a
        # bridge bound there heard nothing from `vllm serve` in our trials): a socket file keeps it local.
        self._events_dir = make_temp_dir("cachemesh-vllm-events-") if events else None
        self.replay_port = free_port() if events else None
        self._model_dir: Path | None = None

    @property
    def model(self) -> str:
        """The name it serves (requests' `model`; the model identity in block keys)."""
        return self.shape.name

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def events_endpoint(self) -> str:
        assert self._events_dir is not None, "started without KV events"
        return f"ipc://{self._events_dir / 'kv-events.sock'}"

    @property
    def replay_endpoint(self) -> str:
        return f"tcp://{LOOPBACK}:{self.replay_port}"

    @property
    def model_dir(self) -> Path:
        if self._model_dir is None:
            self._model_dir = ensure_model(self.shape)
        return self._model_dir

    def _prepare(self) -> None:
        ensure_vllm()
        _ = self.model_dir

    def command(self) -> list[str]:
        python = ensure_vllm()
        args = [
            str(python), "-m", "vllm.entrypoints.cli.main", "serve", str(self.model_dir),
            "--served-model-name", self.model,
            # float32, not bfloat16: on a CPU that lists AMX, vLLM's bf16 attention takes its AMX kernel,
            # which dies of SIGILL on grouped-query models here (seen on a VM listing amx_tile/amx_bf16).
            "--dtype", "float32",
            "--enable-prefix-caching" if self.prefix_caching else "--no-enable-prefix-caching",
            "--block-size", str(BLOCK_SIZE),
            "--max-model-len", str(self.max_model_len),
            "--host", LOOPBACK, "--port", str(self.port),
            "--disable-uvicorn-access-log",
            "--enable-prompt-tokens-details",  # usage says how much of the prompt was cached
            "-O0",
        ]  # fmt: skip
        if self.kv_blocks is not None:
            args += ["--num-gpu-blocks-override", str(self.kv_blocks)]
        if self.events:
            args += [
                "--kv-events-config",
                json.dumps(
                    {
                        "enable_kv_cache_events": True,
                        "publisher": "zmq",
                        "endpoint": self.events_endpoint,
                        "replay_endpoint": f"tcp://{LOOPBACK}:{self.replay_port}",
                        "topic": "kv-events",
                    }
                ),
            ]
        if self.connector is not None:
            args += ["--kv-transfer-config", json.dumps(self.connector)]
        return args + list(self.extra_args)

    def environment(self) -> dict[str, str]:
        path = os.pathsep.join(p for p in (str(_CLIENT_DIR), os.environ.get("PYTHONPATH", "")) if p)
        return {
            **{k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONHOME"))},
            "PYTHONPATH": path,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            # Every engine computes on the same core(s): vLLM's automatic binding gives the first engine
            # one core and a second both, and a different thread count sums bf16 in another order
            # (random weights: greedy tokens can flip between engines).
            "VLLM_CPU_OMP_THREADS_BIND": str(max(os.sched_getaffinity(0))),
            "VLLM_SERVER_DEV_MODE": "1",  # POST /reset_prefix_cache
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_LOGGING_LEVEL": "INFO",
            **self.extra_env,
        }

    def _launch(self, deadline: float) -> ServerProcess:
        log_dir = make_temp_dir("cachemesh-vllm-log-")
        return ServerProcess(
            self.command(), log_path=log_dir / "vllm.log", env=self.environment(), cwd=log_dir
        )

    def _probe(self) -> bool:
        # /v1/models can answer before the engine is up (and another process may hold a port we
        # thought free): only a completion counts.
        try:
            response = httpx.post(
                f"{self.url}/v1/completions",
                json={"model": self.model, "prompt": [1, 2, 3], "max_tokens": 1, "temperature": 0},
                timeout=10.0,
            )
        except httpx.HTTPError as exc:
            raise OSError(f"vLLM not answering yet: {exc!r}") from None
        return response.status_code == 200

    # --- what tests ask of a running engine ------------------------------------------------------

    def complete(self, prompt: Sequence[int] | str, *, max_tokens: int = 8, **kw: Any) -> dict[str, Any]:
        """One greedy completion (token ids or text); the whole response body."""
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **kw}
        response = httpx.post(f"{self.url}/v1/completions", json=body, timeout=120.0)
        response.raise_for_status()
        out: dict[str, Any] = response.json()
        return out

    def reset_prefix_cache(self) -> None:
        httpx.post(f"{self.url}/reset_prefix_cache", timeout=30.0).raise_for_status()

    def metrics(self) -> dict[str, float]:
        """The engine's Prometheus counters and gauges, summed over labels (`vllm:...` names)."""
        text = httpx.get(f"{self.url}/metrics", timeout=10.0).text
        out: dict[str, float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            name_labels, _, value = line.rpartition(" ")
            name = name_labels.split("{", 1)[0]
            try:
                out[name] = out.get(name, 0.0) + float(value)
            except ValueError:
                continue
        return out
